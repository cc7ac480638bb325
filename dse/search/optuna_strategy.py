"""The optuna and nested strategies: Optuna's samplers propose designs, asked and told in batches.

optuna: the sampler proposes every parameter; each trial is one design.
nested: the sampler proposes the hardware/topology/model point; every layout and batch size under
it is enumerated and scored in the same call, the point's non-dominated designs are kept, and
the trial's value is their hypervolume (against the run's fixed reference point).


The numpy model is the engine and Optuna the driver and bookkeeper: a batch of trials (a
population) is asked, scored in one vectorized call, written to a Parquet score table, then told
back with its objective values and constraint violations (Optuna's constraint API: a trial is
feasible when every value is <= 0). The study lives in the run folder (an Optuna journal file)
unless ``--storage`` names an RDB URL.

Resume: trials a killed process left RUNNING are told from the score table when their batch was
written (nothing is lost), else failed so the sampler asks again (nothing counted twice).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

from dse import pareto, runs
from dse.errors import InputError, StorageUnavailable
from dse.perf import score_chunked
from dse.search import segments

SAMPLERS = ("nsga2", "nsga3", "tpe", "random", "qmc", "gp")
KEEP_METRICS = ("ttft_s", "tpot_s", "output_tokens_per_s_per_chip", "output_tokens_per_s_per_rack",
                "usd_per_mtok_output", "usd_per_mtok_input", "num_chips", "bound", "feasible")
BIG = 1e30


def make_sampler(name: str, seed: int, population: int, nested: bool = False):
    """An Optuna sampler. Nested runs ask few, costly trials: TPE starts modelling after 5."""
    import optuna
    s = optuna.samplers
    if name == "nsga2":
        return s.NSGAIISampler(population_size=population, seed=seed)
    if name == "nsga3":
        return s.NSGAIIISampler(population_size=population, seed=seed)
    if name == "tpe":
        return s.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                            n_startup_trials=5 if nested else 10)
    if name == "random":
        return s.RandomSampler(seed=seed)
    if name == "qmc":
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return s.QMCSampler(seed=seed, warn_independent_sampling=False)
    if name == "gp":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise InputError("--sampler gp needs PyTorch", hint="pip install torch, or use nsga2") from None
        return s.GPSampler(seed=seed)
    raise InputError(f"unknown sampler {name!r}", hint="one of " + ", ".join(SAMPLERS))


def _ordered(p) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in p.values)


def distributions(space) -> dict:
    """Optuna searches the same grid as the exhaustive strategy: an ordered numeric parameter
    is sampled as an index into its sorted values (so samplers see the order), any other as a
    category. Designs therefore have the same ids whatever strategy scored them."""
    from optuna.distributions import CategoricalDistribution, IntDistribution
    out = {}
    for p in space.parameters:
        if _ordered(p) and len(p.values) > 1:
            out[p.path] = IntDistribution(0, len(p.values) - 1)
        else:
            out[p.path] = CategoricalDistribution(list(range(len(p.values))))
    return out


def grid_index(space, trials) -> np.ndarray:
    """Per trial, the index into each parameter's values (columns in parameter order)."""
    return np.array([[t.params[p.path] for p in space.parameters] for t in trials], dtype=np.int64)


HEARTBEAT_S = 2      # a worker records each running trial's heartbeat this often
GRACE_S = segments.GRACE_S   # a trial silent this long belongs to a dead worker: failed, retried


def storage_for(d: Path | None, url: str | None):
    """The run's Optuna storage: the RDB at ``url`` (reached with retries), else the run
    folder's journal (absolute path, owner-recording lock: see ``runs.open_journal``)."""
    if url:
        import optuna

        def connect():
            return optuna.storages.RDBStorage(
                url, engine_kwargs={"pool_pre_ping": True}, heartbeat_interval=HEARTBEAT_S,
                grace_period=GRACE_S,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                    max_retry=3))
        return with_retry(connect)
    return runs.open_journal(d)


def _violations(s: dict, space) -> np.ndarray:
    """Constraint values per row (<= 0 feasible): infeasible designs and each bound."""
    cols = [np.where(np.asarray(s["feasible"], bool), 0.0, 1.0)]
    for c in space.constraints:
        v = np.asarray(s[c.metric], dtype=np.float64)
        v = np.where(np.isfinite(v), v, BIG)
        if c.max is not None:
            cols.append((v - c.max) / max(abs(c.max), 1e-30))
        if c.min is not None:
            cols.append((c.min - v) / max(abs(c.min), 1e-30))
    return np.column_stack(cols)


def _retry_window() -> float:
    text = os.environ.get("DSE_STORAGE_RETRY", "")
    if not text:
        return 300.0
    from dse.cli import parse_duration
    return parse_duration(text, "DSE_STORAGE_RETRY")


STORAGE_RETRY_S: float | None = None   # set by --storage-retry; else DSE_STORAGE_RETRY, else 300 s


def set_storage_retry(seconds: float | None) -> None:
    global STORAGE_RETRY_S
    STORAGE_RETRY_S = seconds


def _transient(e: BaseException) -> bool:
    import sqlalchemy.exc
    from optuna.exceptions import StorageInternalError
    if isinstance(e, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError,
                      StorageInternalError, ConnectionError)):
        return True
    return isinstance(e, sqlalchemy.exc.DBAPIError) and bool(e.connection_invalidated)


def with_retry(fn, *args, **kw):
    """Call a storage operation, retrying with backoff (0.5 s doubling to 15 s) while the
    database is unreachable (a server restart, a network blip), for the storage retry window
    (``--storage-retry``, ``DSE_STORAGE_RETRY``; default 300 s); a warning when it starts and
    every 30 s, then ``StorageUnavailable`` once the window is spent."""
    import sys
    window = STORAGE_RETRY_S if STORAGE_RETRY_S is not None else _retry_window()
    t0, delay, said = time.monotonic(), 0.5, -1e9
    while True:
        try:
            return fn(*args, **kw)
        except Exception as e:
            if not _transient(e):
                raise
            waited = time.monotonic() - t0
            msg = " ".join(str(e).split())[:120]
            if waited + delay > window:
                raise StorageUnavailable(f"the storage has been unreachable for {waited:.0f} s "
                                         f"({msg}); the run is resumable once it is back "
                                         "(--storage-retry sets how long to wait)") from None
            if waited - said >= 30:
                print(f"dse: warning: storage unreachable ({msg}); retrying for up to "
                      f"{window:.0f} s", file=sys.stderr)
                said = waited
            time.sleep(delay)
            delay = min(delay * 2, 15.0)


def told_already(e: BaseException) -> bool:
    """A tell whose commit reached the database before the connection dropped: retried, it
    finds the trial complete (our own result, stored once)."""
    return isinstance(e, ValueError) and "Cannot tell a COMPLETE trial" in str(e)


def finished_elsewhere(e: BaseException) -> bool:
    """A write to a trial another process has finished: a worker's trial failed as stale (its
    heartbeat stopped, e.g. during a database outage) and retried elsewhere."""
    from optuna.exceptions import UpdateFinishedTrialError
    return isinstance(e, UpdateFinishedTrialError) or (
        isinstance(e, RuntimeError) and "finished" in str(e).lower()) or (
        isinstance(e, ValueError) and "Cannot tell a " in str(e) and not told_already(e))


class Heartbeat:
    """Records the heartbeat of a batch of running trials every HEARTBEAT_S while they are
    scored (a batch may take longer than the grace period)."""

    def __init__(self, storage, trial_ids: list[int]):
        import threading
        self.storage, self.ids, self.done = storage, list(trial_ids), threading.Event()
        self._beat_once()
        self.thread = threading.Thread(target=self._beat, daemon=True)
        self.thread.start()

    def _beat_once(self):
        for tid in self.ids:
            try:
                self.storage.record_heartbeat(tid)
            except Exception:     # a lost connection: the main thread's retries report it
                return

    def _beat(self):
        while not self.done.wait(HEARTBEAT_S):
            self._beat_once()

    def stop(self):
        self.done.set()
        self.thread.join()


def _constraint_names(space) -> list[str]:
    names = ["feasible"]
    for c in space.constraints:
        if c.max is not None:
            names.append(f"{c.metric}<={c.max}")
        if c.min is not None:
            names.append(f"{c.metric}>={c.min}")
    return names


def _set_constraints(trial, values, space, nested: bool = False, already=()) -> None:
    names = ["has_admissible_design"] if nested else _constraint_names(space)
    for name, v in zip(names, values):
        if name not in already:    # set before the process died: the same value
            trial.set_constraint(name, float(v))


INNER_PREFIXES = ("layout.", "workload.concurrency")


def split_parameters(space, nested: bool):
    """(outer, inner) parameter positions: nested enumerates layouts and batch sizes under each
    proposed hardware/topology/model point; flat lets the sampler propose everything."""
    idx = range(len(space.parameters))
    if not nested:
        return list(idx), []
    inner = [i for i in idx if space.parameters[i].path.startswith(INNER_PREFIXES)]
    return [i for i in idx if i not in inner], inner


SEGMENT_TRIALS = 10_000   # a study's history is capped: then a new one, warm-started from the front


def _files(d: Path, segment: int, first: int) -> tuple[Path, Path]:
    stem = d / "scores" / f"batch-{segment:03d}-{first:09d}"
    return stem.with_suffix(".parquet"), stem.with_suffix(".trials.json")


def _segment_name(manifest: dict, segment: int) -> str:
    return manifest["study_name"] if segment == 0 else f"{manifest['study_name']}-s{segment}"


def _complete_batches(d: Path, clean: bool = True) -> tuple[pd.DataFrame, dict]:
    """Designs and per-trial results of every complete batch; a batch whose trial file is missing
    (the process died while writing it) is removed, its trials are asked again. ``clean=False``
    (a worker joining a run folder others may be writing): incomplete batches are only skipped."""
    frames, told = [], {}
    for f in sorted((d / "scores").glob("batch-*.parquet")):
        tf = f.with_suffix(".trials.json")
        if not tf.is_file():
            if clean:
                f.unlink()
            continue
        frames.append(runs.read_table(f))     # a corrupt table or trials file: refused, named
        segment = int(f.stem.split("-")[1])
        told.update({(segment, int(k)): v for k, v in runs.read_trials(tf).items()})
    if clean:
        runs.remove_stale_tmp(d)
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()), told


def _atomic(path: Path, write) -> None:
    runs.atomic_save(path, write)


def _rotate(study, segment, manifest, d, storage, sampler_name, population, directions, front,
            space, outer):
    """Start the next study segment, warm-started with the front's designs, so that samplers
    that scan the whole history (NSGA-II) keep their speed over long runs."""
    import optuna
    from optuna.trial import TrialState
    manifest["failed_before"] = int(manifest.get("failed_before", 0)) + len(
        study.get_trials(deepcopy=False, states=(TrialState.FAIL,)))
    segment += 1
    manifest["segment"] = segment
    runs.write_json(Path(d) / "manifest.json", manifest)
    new = optuna.create_study(study_name=_segment_name(manifest, segment), storage=storage,
                              sampler=make_sampler(sampler_name, manifest.get("seed", 0) + segment,
                                                   population, manifest["strategy"] == "nested"),
                              directions=directions, load_if_exists=True)
    if len(front):
        enqueue_designs(new, front["design_id"].to_numpy()[: 2 * population], space, outer)
    return new, segment


def enqueue_designs(study, ids, space, outer) -> int:
    """Enqueue the designs ``ids`` (flat grid indices of ``space``) as the study's next trials:
    their points on the sampled (``outer``) parameters, each distinct point once. Returns how
    many trials were enqueued."""
    coords = np.unravel_index(np.asarray(ids, dtype=np.int64), space.shape)
    points = list(dict.fromkeys(zip(*[coords[i].tolist() for i in outer])))
    for row in points:
        study.enqueue_trial({space.parameters[i].path: int(c) for i, c in zip(outer, row)})
    return len(points)


LOCAL_SHARE = 2 / 3   # nested: share of trials spent next to the front's points (the rest: sampler)


def enqueue_neighbours(study, space, outer, front: pd.DataFrame, k: int, ref: dict | None,
                       seed: int = 0) -> int:
    """Enqueue up to ``k`` untried outer points next to the front's (one grid step along one
    ordered parameter, or another value of a categorical one), neighbours of the points that
    add the most hypervolume to the front first."""
    if k <= 0 or not outer or not len(front):
        return 0
    coords = np.array(np.unravel_index(front["design_id"].to_numpy(np.int64), space.shape)).T
    coords = coords[:, outer]
    points, owner = np.unique(coords, axis=0, return_inverse=True)
    owner = owner.reshape(-1)
    gain = np.zeros(len(points))
    if ref is not None and len(points) > 1:
        F = pareto.objective_matrix(front, space.objectives)
        r, sc = np.array(ref["point"]), np.array(ref["scale"])
        total = pareto.hypervolume(F, r, sc)
        gain = np.array([total - pareto.hypervolume(F[owner != j], r, sc)
                         for j in range(len(points))])
    seen = set()
    for t in study.get_trials(deepcopy=False):    # tried, running, or enqueued (fixed params)
        params = t.params or t.system_attrs.get("fixed_params") or {}
        seen.add(tuple(params.get(space.parameters[i].path) for i in outer))
    rng = np.random.default_rng(seed)
    cand = {}
    for j in np.lexsort((rng.random(len(points)), -gain)):    # biggest contribution first
        point = tuple(int(c) for c in points[j])
        moves = []
        for d, i in enumerate(outer):
            p = space.parameters[i]
            steps = (-1, 1) if _ordered(p) else range(-len(p.values) + 1, len(p.values))
            moves += [point[:d] + (point[d] + s,) + point[d + 1:] for s in steps
                      if s and 0 <= point[d] + s < len(p.values)]
        for q in rng.permutation(len(moves)):
            if moves[q] not in seen:
                cand.setdefault(moves[q], None)
        if len(cand) >= k:
            break
    for q in list(cand)[:k]:
        study.enqueue_trial({space.parameters[o].path: c for o, c in zip(outer, q)})
    return min(k, len(cand))


def front_payload(ids: np.ndarray, values: dict) -> str:
    """A trial's front as a small JSON payload: design ids and objective values (row-major)."""
    F = np.column_stack([np.asarray(v, dtype=np.float64) for v in values.values()]) \
        if len(ids) else np.zeros((0, len(values)))
    return json.dumps({"ids": [int(i) for i in ids], "F": F.ravel().tolist()},
                      separators=(",", ":"))


def payload_frame(payload: str, space) -> pd.DataFrame:
    """A ``front_payload`` back as a table of design_id and objective values."""
    f = json.loads(payload)
    metrics = [o.metric for o in space.objectives]
    df = pd.DataFrame(np.asarray(f["F"], dtype=np.float64).reshape(len(f["ids"]), len(metrics)),
                      columns=metrics)
    df.insert(0, "design_id", np.asarray(f["ids"], dtype=np.int64))
    return df


def front_from_payloads(studies, space) -> pd.DataFrame:
    """The Pareto set of the fronts stored with the completed trials of a shared nested run
    (every worker's, every segment's), with the parameters of each design."""
    from optuna.trial import TrialState
    frames = [payload_frame(t.user_attrs["front"], space)
              for s in studies for t in s.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
              if "front" in t.user_attrs]
    front = pareto.front_of([f for f in frames if len(f)], space.objectives)
    if len(front):
        for p, v in space.values_at(front["design_id"].to_numpy()).items():
            front[p] = v
    return front


def front_from_study(study, space) -> pd.DataFrame:
    """The Pareto set of every completed, feasible trial of a (shared) study, or of a list of
    studies (its segments): objective values are the trial values, parameters follow from the
    trial's grid indices."""
    from optuna.trial import TrialState
    rows = []
    studies = study if isinstance(study, (list, tuple)) else [study]
    trials = [t for s in studies for t in s.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    for t in trials:
        cons = t.constraints or {}
        if any(v > 0 for v in (cons.values() if isinstance(cons, dict) else cons)):
            continue
        coords = [t.params[p.path] for p in space.parameters]
        rows.append({"design_id": int(np.ravel_multi_index(coords, space.shape)) if coords else 0,
                     **{o.metric: v for o, v in zip(space.objectives, t.values)}})
    if not rows:
        return pd.DataFrame()
    df = pd.DataFrame(rows)
    for p, v in space.values_at(df["design_id"].to_numpy()).items():
        df[p] = v
    return pareto.front_of([df], space.objectives)


def _admit(trials, ask, segs, segment, total, storage):
    """The asked trials within the run's total; any beyond it (workers asking at the same
    moment) are pruned unscored, so a shared run completes exactly ``total`` trials. Trials are
    ranked by the moment they started running (then segment and number) among every running
    and completed trial of every segment: a trial admitted once stays admitted (those before
    it can only leave, by failing), so the admitted never exceed the total."""
    from optuna.trial import TrialState
    counts = with_retry(segments.state_counts, storage, segs.ids)
    if sum(c["COMPLETE"] + c["RUNNING"] for c in counts.values()) <= total:
        return trials
    order = []
    for k in sorted(segs.ids):
        st = with_retry(segs.study, k)
        order += [(t.datetime_start, k, t.number) for t in with_retry(
            st.get_trials, deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
            if t.datetime_start is not None]
    rank = {(k, n): i for i, (_, k, n) in enumerate(sorted(order))}
    keep = []
    for t in trials:
        if rank.get((segment, t.number), total) < total:
            keep.append(t)
        else:
            try:
                with_retry(ask.tell, t, state=TrialState.PRUNED)
            except Exception as e:
                if not finished_elsewhere(e):
                    raise
    return keep


def _requeue_lost(study, segment, told, front, space, outer, population) -> None:
    """A local run's study after ``dse repair``: trials the journal holds as complete whose
    score table was quarantined are enqueued again (once); a fresh segment (its journal
    quarantined) is warm-started from the front."""
    from optuna.trial import TrialState
    trials = study.get_trials(deepcopy=False)
    again = {t.user_attrs.get("requeue_of") for t in trials}
    for t in trials:
        if t.state == TrialState.COMPLETE and (segment, t.number) not in told and \
                t.number not in again and t.params:
            study.enqueue_trial(t.params, user_attrs={"requeue_of": t.number})
    if segment > 0 and not trials and len(front):
        enqueue_designs(study, front["design_id"].to_numpy()[: 2 * population], space, outer)


def run(space, d: Path, manifest: dict, *, max_trials: int | None, budget_s: float | None,
        storage_url: str | None = None, progress: bool = True, joining: bool = False) -> dict:
    """Ask, score and tell batches until the run's trials are done (or the budget is spent).

    ``joining``: this process is a worker joining a study others may be working on, so it
    never fails trials it finds running (dead workers' trials are failed by heartbeat instead).
    """
    import warnings

    import optuna
    from optuna.trial import Trial, TrialState
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # heartbeats and stale-trial recovery are driven by hand here (ask and tell, not optimize)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed")
    # a retried trial carries the constraints its dead worker had set: the same design's values
    warnings.filterwarnings("ignore", message="The constraint value is ignored")
    nested = manifest["strategy"] == "nested"
    sampler_name = manifest.get("sampler", "nsga2")
    population = int(manifest.get("population", 32))
    sampler = make_sampler(sampler_name, manifest.get("seed", 0), population, nested)
    directions = ["maximize"] if nested else [o.direction for o in space.objectives]
    storage = storage_for(d, storage_url)
    shared = storage_url is not None
    segment = 0 if shared else int(manifest.get("segment", 0))
    try:
        study = with_retry(optuna.create_study, study_name=_segment_name(manifest, segment),
                           storage=storage, sampler=sampler, directions=directions,
                           load_if_exists=True)
    except (ValueError, KeyError, TypeError) as e:
        if shared:
            raise
        raise runs.corrupt(Path(d).resolve() / "optuna.journal", "journal", e) from None
    outer, inner = split_parameters(space, nested)
    if manifest.get("warm_start") and segment == 0 and not study.get_trials(deepcopy=False):
        # a new study warm-started from given designs (dse whatif --reoptimize: the base run's
        # front), enqueued as its first trials; a resume finds them in the study
        enqueue_designs(study, manifest["warm_start"], space, outer)
    all_dists = distributions(space)
    dists = {space.parameters[i].path: all_dists[space.parameters[i].path] for i in outer}
    inner_grid = (np.array(np.unravel_index(np.arange(int(np.prod([space.shape[i] for i in inner]))),
                                            [space.shape[i] for i in inner])).T
                  if inner else np.zeros((1, 0), np.int64))
    metrics = [o.metric for o in space.objectives]

    per_trial = len(inner_grid)          # designs scored per trial
    if manifest.get("designs_per_trial") != per_trial and not joining:
        manifest["designs_per_trial"] = per_trial
        runs.write_json(Path(d) / "manifest.json", manifest)
    if storage_url and "space_toml" not in with_retry(lambda: study.user_attrs):
        with_retry(study.set_user_attr, "space_toml", Path(space.file).read_text())
        with_retry(study.set_user_attr, "inputs", runs.inputs_payload(d, manifest))
        with_retry(study.set_user_attr, "manifest", json.dumps(manifest, default=str))
    seg_cap = int(manifest.get("segment_trials", SEGMENT_TRIALS))
    segs = None
    if shared:
        def load(k, newest):
            smp = (make_sampler(sampler_name, manifest.get("seed", 0) + k, population, nested)
                   if newest else optuna.samplers.RandomSampler(seed=manifest.get("seed", 0) + k))
            return optuna.load_study(study_name=_segment_name(manifest, k), storage=storage,
                                     sampler=smp)

        def warm(new, previous):     # at most the trials the run has left: none left waiting
            best = front if nested else pareto.front_of(
                [front, front_from_study(previous, space)], space.objectives)
            k = min(2 * population, max(total - segs.total("COMPLETE") - segs.total("RUNNING"), 0))
            if len(best) and k:
                enqueue_designs(new, best["design_id"].to_numpy()[:k], space, outer)

        segs = with_retry(segments.Segments, storage, manifest["study_name"], seg_cap, load, warm)
        study, segment = segs.study(), segs.newest
    stored, told = _complete_batches(d, clean=not joining)
    # trials a killed process left running: tell them from a complete batch, or fail them
    # (a joining worker leaves that to heartbeats: the RUNNING trials may be another worker's)
    for t in ([] if joining or storage_url else
              study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))):
        if (segment, t.number) in told:
            trial = Trial(study, segments.trial_id(storage, study.study_name, t.number))
            _set_constraints(trial, told[segment, t.number]["constraints"], space, nested,
                             already=t.constraints or {})
            study.tell(trial, told[segment, t.number]["values"])
        else:
            study.tell(t.number, state=TrialState.FAIL)

    admissible = stored[stored["_admissible"]] if len(stored) else stored
    front = pareto.front_of([admissible], space.objectives) if len(admissible) else pd.DataFrame()
    if not joining and not storage_url:
        _requeue_lost(study, segment, told, front, space, outer, population)
    prev = runs.read_progress(d)
    elapsed0 = float(prev.get("elapsed_s", 0.0))
    total = int(manifest.get("trials", 1000))
    done_trials = len(told)            # counters from the durable score tables
    target = total if max_trials is None else min(total, done_trials + max_trials)
    designs = done_trials * per_trial
    ref = manifest.get("reference")
    t0 = time.monotonic()
    hv = None

    def save(state):
        nonlocal hv
        if ref is not None and len(front):
            hv = pareto.hypervolume(pareto.objective_matrix(front, space.objectives),
                                    np.array(ref["point"]), np.array(ref["scale"]))
        runs.write_front(d, front, space.objectives, [p.path for p in space.parameters])
        if segs is not None:      # over every worker and segment of the shared study
            completed, failed = segs.total("COMPLETE"), segs.total("FAIL")
        else:
            completed = done_trials
            failed = int(manifest.get("failed_before", 0)) + len(
                study.get_trials(deepcopy=False, states=(TrialState.FAIL,)))
        designs_now = completed * per_trial if segs is not None else designs
        runs.write_json(d / "progress.json", {
            "state": state, "trials_completed": completed, "trials_failed": failed,
            "trials_total": total, "designs_scored": designs_now,
            "elapsed_s": elapsed0 + time.monotonic() - t0, "front_size": len(front),
            "hypervolume": hv})

    def study_left() -> tuple[int, int]:
        """(trials still to start, trials running elsewhere), over every worker of the study.

        Workers may overshoot the total by up to one batch each when they ask at the same time;
        a trial is never lost: one a dead worker left running is failed once its heartbeat is
        stale and asked again (WAITING), so a worker waits while others' trials are running.
        """
        if not shared:
            return target - done_trials, 0
        with_retry(segs.refresh)       # others' new segments; dead workers' trials: retried
        left = total - segs.total("COMPLETE") - segs.total("RUNNING")
        if left > 0 and segs.full():
            with_retry(segs.rotate)
        return max(left, segs.total("WAITING")), segs.total("RUNNING")

    work = runs.Working(d, progress, total=total, initial=done_trials, unit="trial",
                        desc=f"{manifest['strategy']} {sampler_name}")
    work.__enter__()
    try:
        save("running")
        while done_trials < target and not work.stop:
            if budget_s is not None and time.monotonic() - t0 >= budget_s:
                break
            left, running = study_left()
            if left <= 0:
                if running == 0:
                    break
                time.sleep(HEARTBEAT_S / 2)       # others' trials may die and come back
                continue
            n = min(population, target - done_trials, left)
            ask = study
            if shared:
                study, segment = segs.study(), segs.newest
                old = segs.waiting_elsewhere()      # retried trials of an older segment first
                if old is not None:
                    ask, segment = segs.study(old), old
                    n = min(n, segs.counts[old]["WAITING"])
                else:
                    ask = study
            if nested and len(front) and ask is study:
                # local search: LOCAL_SHARE of the trials go to untried grid neighbours of the
                # points on the front (the sampler proposes the rest)
                k = int(np.floor(n * LOCAL_SHARE + (done_trials * LOCAL_SHARE) % 1 + 1e-9))
                enqueue_neighbours(study, space, outer, front, k, manifest.get("reference"),
                                   seed=done_trials)
            trials = [with_retry(ask.ask, dists) for _ in range(n)]
            beat = None
            if shared:     # heartbeats while the batch is scored; then no overshoot of the total
                ids_ = [with_retry(segments.trial_id, storage, ask.study_name, t.number)
                        for t in trials]
                beat = Heartbeat(storage, ids_)
                trials = _admit(trials, ask, segs, segment, total, storage)
                if not trials:
                    beat.stop()
                    continue
                n = len(trials)
            # every design of the batch: each trial's point, times every inner combination
            coords = np.zeros((n * len(inner_grid), len(space.parameters)), np.int64)
            owner = np.repeat(np.arange(n), len(inner_grid))
            for j, i in enumerate(outer):
                coords[:, i] = np.repeat([t.params[space.parameters[i].path] for t in trials],
                                         len(inner_grid))
            for j, i in enumerate(inner):
                coords[:, i] = np.tile(inner_grid[:, j], n)
            ids = (np.ravel_multi_index(tuple(coords.T), space.shape) if space.parameters
                   else np.zeros(len(coords), np.int64))
            batch, _ = space.batch_from_values(space.values_at(ids))
            s = score_chunked(batch, dtype=np.float32)
            ok = pareto.admissible(s, space.objectives, space.constraints)
            F = pareto.objective_matrix(s, space.objectives)
            if ok.any():
                ref = runs.fix_reference(manifest, d, F[ok][pareto.nondominated(F[ok])])
            keep = np.zeros(len(ids), bool)
            results = {}
            if nested:
                for k, t in enumerate(trials):
                    rows = np.flatnonzero((owner == k) & ok)
                    mine = rows[pareto.nondominated(F[rows])] if len(rows) else rows
                    keep[mine] = True
                    val = (pareto.hypervolume(F[mine], np.array(ref["point"]), np.array(ref["scale"]))
                           if len(mine) else 0.0)
                    cons = [0.0 if len(mine) else 1.0]
                    results[t.number] = {"values": [val], "constraints": cons}
                    if shared:     # the point's front travels with the trial (other workers)
                        results[t.number]["front"] = front_payload(
                            ids[mine], {o.metric: s[o.metric][mine] for o in space.objectives})
            else:
                values = np.where(np.isfinite(F), F, BIG) * np.array(
                    [1.0 if o.direction == "minimize" else -1.0 for o in space.objectives])
                cons = _violations(s, space)
                keep[:] = True
                for k, t in enumerate(trials):
                    results[t.number] = {"values": [float(x) for x in values[k]],
                                         "constraints": [float(x) for x in cons[k]]}
            table = pd.DataFrame({"trial": [trials[k].number for k in owner[keep]],
                                  "design_id": ids[keep]})
            for p, v in space.values_at(ids[keep]).items():
                table[p] = v
            for m in sorted(set(metrics) | {c.metric for c in space.constraints} | set(KEEP_METRICS)):
                v = s[m][keep]
                table[m] = v.astype(np.float64) if v.dtype.kind == "f" else v
            table["_admissible"] = ok[keep]
            designs_f, trials_f = _files(d, segment, trials[0].number)
            _atomic(designs_f, lambda p: table.to_parquet(p, index=False))
            _atomic(trials_f, lambda p: p.write_text(json.dumps(results)))   # batch complete
            if beat is not None:
                beat.stop()
            lost = 0
            for t in trials:
                try:
                    if "front" in results[t.number]:
                        with_retry(t.set_user_attr, "front", results[t.number]["front"])
                    with_retry(_set_constraints, t, results[t.number]["constraints"], space,
                               nested)
                    with_retry(ask.tell, t, results[t.number]["values"])
                except Exception as e:
                    if shared and told_already(e):
                        continue
                    if not (shared and finished_elsewhere(e)):
                        raise
                    lost += 1   # failed as stale meanwhile (an outage): its retry is elsewhere
            done_trials += n - lost
            designs += len(ids)
            if ok[keep].any():
                front = pareto.front_of([front, table[table["_admissible"]]], space.objectives)
            save("running")
            work.update(n, len(front), hv)
            if not shared and len(study.get_trials(deepcopy=False)) >= seg_cap:
                study, segment = _rotate(study, segment, manifest, d, storage, sampler_name,
                                         population, directions, front, space, outer)
        if shared:           # the run's front and counts: every worker's, every segment's
            with_retry(segs.refresh)
            studies = with_retry(segs.all_studies)
            front = with_retry(lambda: front_from_payloads(studies, space) if nested
                               else front_from_study(studies, space))
            done_trials = segs.total("COMPLETE")
        save("finished" if done_trials >= total else "stopped")
    except BaseException:
        save("failed" if not work.stop else "stopped")
        raise
    finally:
        work.__exit__(None, None, None)
    return runs.status(d)
