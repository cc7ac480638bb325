"""The optuna/nested strategy as steps of the driver loop (``optuna_strategy`` has the pieces).

open: the study (the run folder's journal, or a shared RDB study and its segments), what the
score tables hold (every design scored and its values), trials a killed process left running;
propose: a batch of asked trials, each a design (a nested point) not scored before; score: one
vectorized call; store: the batch's score table, then its trials file (the batch is complete);
tell: the values and constraints told to Optuna; after: progress, and a new study segment once
the study holds ``segment_trials`` trials.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from dse import pareto
from dse.perf import score_chunked
from dse.scoring import train_space
from dse.search import files, locks, store, tables
from dse.search.loop import WAIT, Strategy
from dse.search.optuna import folder, segments, surrogate
from dse.search.optuna import strategy as o
from dse.search.optuna.enqueue import (
    enqueue_designs,
    enqueue_neighbours,
    requeue_lost,
    unscored_points,
)
from dse.search.optuna.study import (
    HEARTBEAT_S,
    Heartbeat,
    TrialIds,
    coords_of,
    describe,
    distributions,
    finished_elsewhere,
    front_from_payloads,
    front_from_study,
    front_payload,
    params_of,
    point_key,
    set_constraints,
    set_real_values,
    storage_for,
    told_already,
    with_retry,
)


class OptunaRun(Strategy):
    wait_s = HEARTBEAT_S / 2

    # --- open ------------------------------------------------------------------------------
    def open(self) -> None:
        """The study and what the run folder holds. A local run's processes (its owner and its
        workers) share the folder on ``folder``'s protocol: each holds a live token."""
        self.live, self.read_batches, self.old_studies, self.foreign = None, set(), {}, False
        if self.storage_url is None:
            self.live = locks.Live(self.d)
            self.wait_s = 0.2
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.live is not None:
            self.live.close()
            self.live = None

    def _open(self) -> None:
        import optuna
        optuna.logging.set_verbosity(optuna.logging.ERROR)   # its warnings: dse says its own
        # heartbeats and stale-trial recovery are driven by hand here (ask and tell, not optimize)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed")
        m, space, d = self.manifest, self.space, self.d
        self.nested = m["strategy"] == "nested"
        self.sampler_name = m.get("sampler", o.DEFAULT_SAMPLER[m["strategy"]])
        self.population = int(m.get("population", o.DEFAULT_POPULATION[m["strategy"]]))
        self.directions = ["maximize"] if self.nested else [ob.direction for ob in space.objectives]
        self.storage = storage_for(d, self.storage_url, known=True)
        self.ids = TrialIds(self.storage)
        self.shared = self.storage_url is not None
        self.segment = 0 if self.shared else int(m.get("segment", 0))
        self.cons_names = o.constraint_names(space, self.nested)
        self.outer, self.inner = o.split_parameters(space, self.nested)
        self.outer_shape = tuple(space.shape[i] for i in self.outer)
        self.dists = distributions(space, self.outer)
        self.inner_grid = (np.array(np.unravel_index(
            np.arange(int(np.prod([space.shape[i] for i in self.inner]))),
            [space.shape[i] for i in self.inner])).T if self.inner else np.zeros((1, 0), np.int64))
        self.per_trial = len(self.inner_grid)          # designs scored per trial
        self.study = self._open_study()
        if m.get("warm_start") and self.segment == 0 and not self.study.get_trials(deepcopy=False):
            # a new study warm-started from given designs (dse whatif --reoptimize: the base run's
            # front), enqueued as its first trials; a resume finds them in the study
            enqueue_designs_(self.study, m["warm_start"], space, self.outer)
        if m.get("designs_per_trial") != self.per_trial and not self.joining:
            store.update_manifest(d, m, designs_per_trial=self.per_trial)
        self.seg_cap = int(m.get("segment_trials", o.SEGMENT_TRIALS))
        self.total = int(m.get("trials", 1000))
        self.segs = self._segments() if self.shared else None
        if self.shared:
            self.study, self.segment = self.segs.study(), self.segs.newest
        if self.shared:
            stored, self.told = store.complete_batches(d, clean=False)
            self.known = {int(r["key"]): r for r in self.told.values() if "key" in r}
        else:
            with locks.claim(d):
                # a process alone on the folder clears what dead ones left (a batch stored
                # without its trials file); with others at work, their files are left alone
                alone = folder.alone(self)
                stored, _ = store.complete_batches(d, clean=alone)
                self.told, self.known = {}, {}
                folder.sync(self)
                folder.recover(self, locks.others(d))
                self.spent = False
        admissible = stored[stored["_admissible"]] if len(stored) else stored
        self.front = (pareto.front_of([admissible], space.objectives) if len(admissible)
                      else pd.DataFrame())
        if not self.shared and alone and not self.joining:
            requeue_lost_(self)
        self.done_trials = len(self.told)            # counters from the durable score tables
        self.target = (self.total if self.max_trials is None
                       else min(self.total, self.done_trials + self.max_trials))
        self.designs = self.done_trials * self.per_trial
        self.spent = False                           # every design (point) scored
        self.rng = np.random.default_rng(int(m.get("seed", 0)) + self.done_trials)

    def sampler_for(self, k: int = 0):
        return o.make_sampler(self.sampler_name, self.manifest.get("seed", 0) + k, self.population,
                              self.nested, int(self.manifest.get("trials", 1000)))

    def _open_study(self):
        import optuna
        m = self.manifest
        try:
            study = with_retry(optuna.create_study, study_name=o.segment_name(m, self.segment),
                               storage=self.storage, sampler=self.sampler_for(self.segment),
                               directions=self.directions, load_if_exists=True)
        except (ValueError, KeyError, TypeError) as e:
            if self.shared:
                raise
            raise files.corrupt(store.journal_file(self.d), "journal", e) from None
        if not self.joining:
            describe(study, self.space, self.nested, self.cons_names)
        if self.shared and "space_toml" not in with_retry(lambda: study.user_attrs):
            with_retry(study.set_user_attr, "space_toml", Path(self.space.file).read_text())
            with_retry(study.set_user_attr, "inputs", store.inputs_payload(self.d, m))
            with_retry(study.set_user_attr, "manifest", json.dumps(m, default=str))
        return study

    def _segments(self):
        import optuna
        m = self.manifest

        def load(k, newest):
            smp = (self.sampler_for(k) if newest
                   else optuna.samplers.RandomSampler(seed=m.get("seed", 0) + k))
            return optuna.load_study(study_name=o.segment_name(m, k), storage=self.storage,
                                     sampler=smp)

        def warm(new, previous):     # at most the trials the run has left: none left waiting
            describe(new, self.space, self.nested, self.cons_names)
            best = self.front if self.nested else pareto.front_of(
                [self.front, front_from_study(previous, self.space)], self.space.objectives)
            left = self.total - self.segs.total("COMPLETE") - self.segs.total("RUNNING")
            k = min(2 * self.population, max(left, 0))
            if len(best) and k:
                enqueue_designs_(new, best["design_id"].to_numpy()[:k], self.space, self.outer)

        return with_retry(segments.Segments, self.storage, m["study_name"], self.seg_cap, load,
                          warm)

    # --- counters and the bar --------------------------------------------------------------
    def key(self, params: dict) -> int | None:
        """A trial's design (optuna) or point (nested) as one flat index of the outer grid."""
        return point_key(self.space, params, self.outer)

    def counters(self) -> dict:
        from optuna.trial import TrialState
        if self.segs is not None:      # over every worker and segment of the shared study
            completed, failed = self.segs.total("COMPLETE"), self.segs.total("FAIL")
            designs = completed * self.per_trial
        else:     # what every process sharing the folder stored (its batches read so far)
            completed = len(self.told)
            designs = completed * self.per_trial
            failed = int(self.manifest.get("failed_before", 0)) + len(
                self.study.get_trials(deepcopy=False, states=(TrialState.FAIL,)))
        return {"trials_completed": completed, "trials_failed": failed,
                "trials_total": self.total, "designs_scored": designs}

    def bar(self) -> dict:
        return {"total": self.total, "initial": self.done_trials, "unit": "trial",
                "desc": f"{self.manifest['strategy']} {self.sampler_name}"}

    # --- propose ---------------------------------------------------------------------------
    def _left(self) -> tuple[int, int]:
        """(trials still to start, trials running elsewhere), over every worker of the shared
        study (a local run's: ``folder.left``).

        A trial is never lost: one a dead worker left running is failed once its heartbeat is
        stale and asked again (WAITING), so a worker waits while others' trials are running;
        workers asking at the same moment are admitted up to the total (``o.admit``).
        """
        segs = self.segs
        with_retry(segs.refresh)       # others' new segments; dead workers' trials: retried
        left = self.total - segs.total("COMPLETE") - segs.total("RUNNING")
        if left > 0 and segs.full():
            with_retry(segs.rotate)
        return max(left, segs.total("WAITING")), segs.total("RUNNING")

    def propose(self):
        if self.done_trials >= self.target:
            return None
        if self.shared:
            return self._propose(*self._left())
        with locks.claim(self.d):       # counted, asked and recorded as one step
            item = self._propose(*folder.left(self))
            if isinstance(item, dict):
                self.live.hold([(item["segment"], t.number) for t in item["trials"]],
                               [(item["segment"], t.number) for t, _ in item["echoes"]])
            return item

    def _propose(self, left: int, running: int):
        if left <= 0:
            return None if running == 0 else WAIT     # others' trials may die and come back
        n = min(self.population, self.target - self.done_trials, left)
        ask = self.study
        if self.shared:
            self.study, self.segment = self.segs.study(), self.segs.newest
            old = self.segs.waiting_elsewhere()      # retried trials of an older segment first
            ask = self.study
            if old is not None:
                ask, self.segment = self.segs.study(old), old
                n = min(n, self.segs.counts[old]["WAITING"])
        after = int(self.manifest.get("local_after", 0))
        # a warm start's designs wait in the queue as the first trials: nothing is enqueued
        # before they are asked, or the proposals pile up behind them and come out later as
        # repeats of what was scored meanwhile (a what-if's re-optimized short run asked one
        # surrogate pick four times over)
        warm = len(self.manifest.get("warm_start") or ()) if self.segment == 0 else 0
        if self.done_trials < warm:
            after = max(after, warm)
        if self.manifest.get("local_start") == "pairs" and not self.nested and ask is self.study \
                and warm <= self.done_trials < after:
            enqueue_start_(self, min(n, after - self.done_trials))
        share = float(self.manifest.get("local_share", o.DEFAULT_LOCAL_SHARE[self.manifest["strategy"]]))
        if share > 0 and len(self.front) and ask is self.study and self.done_trials >= after:
            # local search: a share of the trials go to untried grid neighbours of the
            # designs (points) on the front, the sampler proposes the rest
            k = int(np.floor(n * share + (self.done_trials * share) % 1 + 1e-9))
            if self.manifest.get("local_model") == "additive" and not self.nested:
                enqueue_modelled_(self, k)
            else:
                enqueue_neighbours_(self, k)
        trials, echoes = self._ask(ask, n)
        beat = None
        if self.shared and trials:   # heartbeats while the batch is scored; no overshoot
            beat = Heartbeat(self.storage, [with_retry(self.ids, ask.study_name, t.number)
                                            for t in trials])
            trials = o.admit(trials, ask, self.segs, self.segment, self.total, self.storage)
        if not trials:
            if beat is not None:
                beat.stop()
            return WAIT if self.shared else None
        return {"trials": trials, "echoes": echoes, "ask": ask, "beat": beat,
                "segment": self.segment}

    def _ask(self, study, n: int):
        """``n`` trials, each a design (point) not scored before. A proposal already scored is
        told its stored values (no cost) and another is asked, ``REPEATS_PER_TRIAL`` times per
        trial at most; then unscored ones are drawn at random (enqueued). A proposal repeated
        within the batch is told with the batch (``echoes``). A shared study's workers only
        know what their own run folder holds: there a repeat is scored again."""
        trials, keys, echoes, repeats = [], {}, [], 0
        while len(trials) < n:
            t = with_retry(study.ask, self.dists)
            k = self.key(t.params)
            if self.shared or k is None or (k not in self.known and k not in keys):
                trials.append(t)
                keys[k] = t
                continue
            if k in self.known:
                self._tell_one(study, t, self.known[k])
            else:
                echoes.append((t, k))
            repeats += 1
            if repeats >= o.REPEATS_PER_TRIAL * n:
                free = unscored_points(self.outer_shape, set(self.known) | set(keys),
                                       n - len(trials), self.rng)
                if not free:
                    self.spent = True
                    break
                for c in free:
                    study.enqueue_trial(params_of(self.space, c, self.outer))
                repeats = -len(free) * o.REPEATS_PER_TRIAL   # the enqueued come out next
        return trials, echoes

    def _tell_one(self, study, t, result) -> None:
        """A proposal of a design (point) already scored: not a trial of the run. It is told
        PRUNED, the state every counter leaves out (the run's, ``dse status``, a worker's, and
        optuna-dashboard's COMPLETE count agree), with the stored values as its user attrs
        ``repeat_values`` (and the constraints where the samplers read them): TPE puts it among
        the trials not to imitate, so it steers away from what is known; NSGA-II and GP skip it."""
        from optuna.trial import TrialState
        set_real_values(t, self.space)
        set_constraints(self.storage, self.ids(study.study_name, t.number), result["constraints"])
        t.set_user_attr("repeat_values", [float(v) for v in result["values"]])
        study.tell(t, state=TrialState.PRUNED)

    # --- score, store, tell ----------------------------------------------------------------
    def score(self, item):
        space, trials = self.space, item["trials"]
        n, grid = len(trials), self.inner_grid
        coords = np.zeros((n * len(grid), len(space.parameters)), np.int64)
        owner = np.repeat(np.arange(n), len(grid))
        point = np.array([coords_of(space, t.params, self.outer) for t in trials],
                         dtype=np.int64).reshape(n, len(self.outer))
        for j, i in enumerate(self.outer):
            coords[:, i] = np.repeat(point[:, j], len(grid))
        for j, i in enumerate(self.inner):
            coords[:, i] = np.tile(grid[:, j], n)
        ids = (np.ravel_multi_index(tuple(coords.T), space.shape) if space.parameters
               else np.zeros(len(coords), np.int64))
        if space.task == "train":
            s = train_space.score_index(space, ids)
        else:
            batch, _ = space.batch_from_values(space.values_at(ids), dtype=np.float32)
            s = score_chunked(batch, dtype=np.float32)
        ok = pareto.admissible(s, space.objectives, space.constraints)
        F = pareto.objective_matrix(s, space.objectives)
        ref = self.manifest.get("reference")
        if ok.any():
            ref = store.fix_reference(self.manifest, self.d, F[ok][pareto.nondominated(F[ok])])
        keep, results = np.zeros(len(ids), bool), {}
        if self.nested:
            for k, t in enumerate(trials):
                rows = np.flatnonzero((owner == k) & ok)
                mine = rows[pareto.nondominated(F[rows])] if len(rows) else rows
                keep[mine] = True
                val = (pareto.hypervolume(F[mine], np.array(ref["point"]), np.array(ref["scale"]))
                       if len(mine) else 0.0)
                results[t.number] = {"values": [val], "constraints": [0.0 if len(mine) else 1.0]}
                if self.shared:     # the point's front travels with the trial (other workers)
                    results[t.number]["front"] = front_payload(
                        ids[mine], {ob.metric: s[ob.metric][mine] for ob in space.objectives})
        else:
            values = np.where(np.isfinite(F), F, o.BIG) * np.array(
                [1.0 if ob.direction == "minimize" else -1.0 for ob in space.objectives])
            cons = o.violations(s, space)
            keep[:] = True
            for k, t in enumerate(trials):
                results[t.number] = {"values": [float(x) for x in values[k]],
                                     "constraints": [float(x) for x in cons[k]]}
        for t in trials:
            results[t.number]["key"] = self.key(t.params)
            results[t.number]["worker"] = store.worker_name()   # per-worker counts (dse status)
        table = pd.DataFrame({"trial": [trials[k].number for k in owner[keep]],
                              "design_id": ids[keep]})
        for p, v in space.values_at(ids[keep]).items():
            table[p] = v
        metrics = ({ob.metric for ob in space.objectives} | {c.metric for c in space.constraints}
                   | set(store.keep_metrics(space)))
        for m in sorted(metrics):
            v = s[m][keep]
            table[m] = v.astype(np.float64) if v.dtype.kind == "f" else v
        table["_admissible"] = ok[keep]
        return {"table": table, "results": results, "designs": len(ids)}

    def store(self, item, scored) -> None:
        designs_f, trials_f = store.batch_files(self.d, item["segment"], item["trials"][0].number)
        table, results = scored["table"], scored["results"]
        self.read_batches.add(trials_f.name)        # its trials are told by this process
        tables.save_table(designs_f, table, self.manifest)
        files.atomic_save(trials_f, lambda p: p.write_text(json.dumps(results)))  # batch complete

    def tell(self, item, scored) -> int:
        if item["beat"] is not None:
            item["beat"].stop()
        ask, results, lost = item["ask"], scored["results"], 0
        for t in item["trials"]:
            r = results[t.number]
            try:
                if "front" in r:
                    with_retry(t.set_user_attr, "front", r["front"])
                with_retry(set_real_values, t, self.space)
                with_retry(set_constraints, self.storage,
                           with_retry(self.ids, ask.study_name, t.number), r["constraints"])
                with_retry(ask.tell, t, r["values"])
            except Exception as e:
                if self.shared and told_already(e):
                    continue
                if not (self.shared and finished_elsewhere(e)):
                    raise
                lost += 1   # failed as stale meanwhile (an outage): its retry is elsewhere
            self.told[item["segment"], t.number] = r
            if r.get("key") is not None:
                self.known[r["key"]] = r
        for t, k in item["echoes"]:       # proposed twice in the batch: told once scored
            self._tell_one(ask, t, self.known[k])
        n = len(item["trials"]) - lost
        self.done_trials += n
        self.designs += scored["designs"]
        self.merge(scored["table"])
        return n

    def after(self) -> None:
        self.save("running")
        if not self.shared and len(self.study.get_trials(deepcopy=False)) >= self.seg_cap:
            with locks.claim(self.d):
                folder.follow_segment(self)      # another process may have rotated it
                if len(self.study.get_trials(deepcopy=False)) >= self.seg_cap:
                    self.rotate()

    def rotate(self) -> None:
        """Start the next study segment, warm-started with the front's designs, so that samplers
        that scan the whole history (NSGA-II) keep their speed over long runs."""
        import optuna
        from optuna.trial import TrialState
        m = self.manifest
        disk = json.loads(files.manifest_file(self.d).read_text())
        self.segment += 1
        store.update_manifest(self.d, m, segment=self.segment, failed_before=int(
            disk.get("failed_before", 0)) + len(self.study.get_trials(
                deepcopy=False, states=(TrialState.FAIL,))))
        self.study = optuna.create_study(study_name=o.segment_name(m, self.segment),
                                         storage=self.storage, sampler=self.sampler_for(self.segment),
                                         directions=self.directions, load_if_exists=True)
        describe(self.study, self.space, self.nested, self.cons_names)
        if len(self.front):
            enqueue_designs_(self.study, self.front["design_id"].to_numpy()[: 2 * self.population],
                             self.space, self.outer)

    def finish(self) -> None:
        if self.shared:           # the run's front and counts: every worker's, every segment's
            with_retry(self.segs.refresh)
            studies = with_retry(self.segs.all_studies)
            self.front = with_retry(lambda: front_from_payloads(studies, self.space) if self.nested
                                    else front_from_study(studies, self.space))
            self.done_trials = self.segs.total("COMPLETE")
        else:
            with locks.claim(self.d):
                self.foreign |= folder.sync(self)
            if self.foreign or self.joining:
                # others stored batches in the run folder: the front of all they stored
                self.front = store.front_from_tables(self.d, self.manifest)
            self.done_trials = len(self.told)
        if self.spent and not self.shared and self.done_trials < self.total:
            # every design (point) is scored: the run is done with fewer trials than asked
            store.update_manifest(self.d, self.manifest, trials=self.done_trials, spent=True)
            self.total = self.done_trials
        self.save("finished" if self.done_trials >= self.total else "stopped")


def enqueue_designs_(study, ids, space, outer) -> int:
    return enqueue_designs(study, ids, space, outer)


def enqueue_neighbours_(run: OptunaRun, k: int) -> int:
    return enqueue_neighbours(run.study, run.space, run.outer, run.front, k,
                                run.manifest.get("reference"), seed=run.done_trials,
                                adjacent=bool(run.manifest.get("local_adjacent", False)),
                                margin=run.manifest.get("local_margin"),
                                diagonal=bool(run.manifest.get("local_diagonal", False)),
                                known=[tuple(int(c) for c in np.unravel_index(key, run.outer_shape))
                                       for key in run.known] if run.outer else ())


def enqueue_start_(run: OptunaRun, k: int) -> int:
    """A short run's next ``k`` start designs not yet scored (``surrogate.start_designs`` of the
    run's seed: the same on resume, so a killed run picks up where it stopped). Trials already
    waiting (a what-if's warm start, a start design enqueued before a kill) come out first and
    count towards the start."""
    from optuna.trial import TrialState

    if with_retry(run.study.get_trials, deepcopy=False, states=(TrialState.WAITING,)):
        return 0
    start = surrogate.start_points(run.space, run.outer, int(run.manifest.get("local_after", 0)),
                                   seed=int(run.manifest.get("seed", 0)))
    todo = [c for c in start if int(np.ravel_multi_index(c, run.outer_shape)) not in run.known]
    for c in todo[:k]:
        run.study.enqueue_trial(params_of(run.space, c, run.outer))
    return len(todo[:k])


def enqueue_modelled_(run: OptunaRun, k: int) -> int:
    """A short run's next ``k`` trials from the additive surrogate of what it scored."""
    if not run.known or k <= 0:
        return 0
    keys = list(run.known)
    points = surrogate.propose(run.space, run.outer, keys,
                               [run.known[q]["values"] for q in keys],
                               [run.known[q]["constraints"] for q in keys], k,
                               seed=int(run.manifest.get("seed", 0)) + run.done_trials)
    for c in points:
        run.study.enqueue_trial(params_of(run.space, c, run.outer))
    return len(points)


def requeue_lost_(run: OptunaRun) -> None:
    requeue_lost(run.study, run.segment, run.told, run.front, run.space, run.outer,
                   run.population, set(run.known), run.key)
