"""Exhaustive runs on several machines: the space's chunks as trials of one shared study.

``dse run SPACE --strategy exhaustive --storage URL`` creates an Optuna study (RDB storage,
PostgreSQL) with one enqueued trial per chunk (param ``chunk``: an index range of the space);
the run and every ``dse worker`` pull waiting chunks until none is left. A worker scores a chunk
with ``exhaustive.score_chunk``, writes its Parquet score table in its local run folder, stores
the chunk's front in the trial (user attr ``front``: design ids and objective values) and tells
the trial complete. Any machine can then assemble the run's front, the Pareto set of the chunks'
fronts, from the storage alone.

A chunk whose worker died keeps no heartbeat: it is failed and enqueued again (Optuna's
heartbeat and retry callback); one that failed more often than the retry callback allows is
enqueued again once nothing is left waiting or running. A chunk completed twice (a retried chunk
whose first worker was only slow) counts once, by chunk index.
"""

from __future__ import annotations

import json
import random
import threading
import time
import warnings
from pathlib import Path

import pandas as pd

from dse import pareto
from dse.search import exhaustive, files, store, tables
from dse.search.loop import WAIT, Strategy, drive
from dse.search.optuna import segments
from dse.search.optuna.segments import Silent, state_counts
from dse.search.optuna.study import (
    HEARTBEAT_S,
    TrialIds,
    finished_elsewhere,
    front_payload,
    payload_frame,
    storage_for,
    told_already,
    with_retry,
)

ENQUEUED = "chunks_enqueued"     # study user attr: every chunk has had a trial enqueued


def _designs(space, chunk: int, i: int) -> int:
    return min((i + 1) * chunk, space.size) - i * chunk


def _chunk_of(t) -> int | None:
    c = t.params.get("chunk", (t.system_attrs.get("fixed_params") or {}).get("chunk"))
    return None if c is None else int(c)


def _pop_waiting(storage, study) -> int | None:
    """A waiting trial of the study set RUNNING by this worker (None: none is waiting). One
    query for a few candidates (not a load of every waiting trial), taken in random order so
    that workers seldom race for the same one. Public storage API only: the candidates come
    from the RDB's ``trials`` table (Optuna's schema), or from ``get_all_trials``."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState
    sid = storage.get_study_id_from_name(study.study_name)
    engine = getattr(storage, "engine", None)
    if engine is None:
        ids = [storage.get_trial_id_from_study_id_trial_number(sid, t.number)
               for t in storage.get_all_trials(sid, deepcopy=False, states=(TrialState.WAITING,))]
    else:
        import sqlalchemy as sa
        trials = segments.TRIALS
        q = (sa.select(trials.c.trial_id).where(trials.c.study_id == sid,
                                                trials.c.state == TrialState.WAITING.name)
             .order_by(trials.c.trial_id).limit(16))
        with engine.connect() as c:
            ids = [r[0] for r in c.execute(q)]
    random.shuffle(ids)
    for tid in ids:
        try:
            if storage.set_trial_state_values(tid, state=TrialState.RUNNING):
                return tid
        except UpdateFinishedTrialError:
            continue
    return None


class _Heartbeat:
    """Records a running trial's heartbeat every HEARTBEAT_S while its chunk is scored."""

    def __init__(self, storage, trial_id: int):
        self.storage, self.trial_id, self.done = storage, trial_id, threading.Event()
        storage.record_heartbeat(trial_id)
        self.thread = threading.Thread(target=self._beat, daemon=True)
        self.thread.start()

    def _beat(self):
        while not self.done.wait(HEARTBEAT_S):
            try:
                self.storage.record_heartbeat(self.trial_id)
            except Exception:     # a lost connection: the main thread's retry reports it
                pass

    def stop(self):
        self.done.set()
        self.thread.join()


def fresh_trials(storage, study_name: str, states) -> list:
    """The study's trials in ``states`` read from the database itself, never from an Optuna
    study's trial cache. That cache reads only trials numbered above the last finished one it
    saw (and those it saw unfinished): a trial another process created whose commit landed
    after a later-numbered trial had finished (two processes creating trials at once on
    PostgreSQL: a stale chunk's retry beside a lost chunk's enqueue) is never read by it, so a
    run could stop, or count its chunks, without one that is complete."""
    sid = storage.get_study_id_from_name(study_name)
    return sorted(storage.get_all_trials(sid, deepcopy=False, states=states),
                  key=lambda t: t.number)


def completed_chunks(trials) -> dict[int, object]:
    """{chunk index: its first completed trial with its front} of ``trials`` (a list, or a study:
    its COMPLETE trials): a chunk completed twice counts once."""
    from optuna.trial import TrialState
    if hasattr(trials, "get_trials"):
        trials = trials.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    out = {}
    for t in sorted(trials, key=lambda t: t.number):
        c = _chunk_of(t)
        if c is not None and c not in out and t.state == TrialState.COMPLETE and \
                "front" in t.user_attrs:
            out[c] = t
    return out


def front_from_shards(study, space) -> pd.DataFrame:
    """The run's front from the storage alone: the Pareto set of every chunk's front
    (``study``: a study, or the list of its trials)."""
    frames = [payload_frame(t.user_attrs["front"], space)
              for _, t in sorted(completed_chunks(study).items())]
    front = pareto.front_of([f for f in frames if len(f)], space.objectives)
    if len(front):
        for p, v in space.values_at(front["design_id"].to_numpy()).items():
            front[p] = v
    return front


def _missing(storage, study, n_chunks: int) -> list[int]:
    """Chunks no trial stands for: none running or waiting, none completed with its front
    (``completed_chunks``: the count the run's end reports). Read from the database itself
    (``fresh_trials``), so the run stops only when every chunk is complete there."""
    from optuna.trial import TrialState
    trials = fresh_trials(storage, study.study_name,
                          (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING))
    have = set(completed_chunks(trials)) | {
        _chunk_of(t) for t in trials if t.state != TrialState.COMPLETE}
    return [i for i in range(n_chunks) if i not in have]


def _enqueue(study, chunks) -> None:
    for i in chunks:
        with_retry(study.enqueue_trial, {"chunk": int(i)})


class Shards(Strategy):
    """Pull chunks of the shared study until none is left (or this process's budget is spent).
    ``joining``: a worker; the run's own process (``dse run``, ``--resume``) first makes sure
    every chunk has a trial."""

    unit = "chunk"
    wait_s = HEARTBEAT_S / 2

    def open(self) -> None:
        import optuna
        optuna.logging.set_verbosity(optuna.logging.ERROR)   # its warnings: dse says its own
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        space, d, m = self.space, self.d, self.manifest
        self.chunk = int(m.get("chunk_designs", exhaustive.CHUNK_DESIGNS))
        self.n_chunks = -(-space.size // self.chunk)
        self.storage = storage_for(d, self.storage_url, known=True)
        self.ids = TrialIds(self.storage)
        self.study = with_retry(optuna.create_study, study_name=m["study_name"],
                                storage=self.storage, sampler=optuna.samplers.RandomSampler(),
                                load_if_exists=True)
        study = self.study
        if not self.joining:
            if "space_toml" not in with_retry(lambda: study.user_attrs):
                with_retry(study.set_user_attr, "space_toml", Path(space.file).read_text())
                with_retry(study.set_user_attr, "inputs", store.inputs_payload(d, m))
                with_retry(study.set_user_attr, "manifest", json.dumps(m, default=str))
            if not with_retry(lambda: study.user_attrs.get(ENQUEUED)):
                _enqueue(study, with_retry(_missing, self.storage, study, self.n_chunks))  # a resume
                with_retry(study.set_user_attr, ENQUEUED, True)
        files.remove_stale_tmp(d)      # a killed process's: the pid is in the name (workers share)
        self.front = pareto.front_of([tables.read_table(f) for f in store.score_tables(d, "chunk")],
                                     space.objectives)
        self.silent = Silent()
        self.counts = {"COMPLETE": 0, "FAIL": 0}
        self.mine = 0
        self.final = None

    def bar(self) -> dict:
        return {"total": self.n_chunks, "unit": "chunk", "desc": "exhaustive shards"}

    def counters(self) -> dict:
        done = self.counts["COMPLETE"] if self.final is None else self.final[0]
        designs = (min(done * self.chunk, self.space.size) if self.final is None
                   else self.final[1])
        return {"trials_completed": done, "trials_failed": self.counts["FAIL"],
                "trials_total": self.n_chunks, "designs_scored": designs}

    def save(self, state: str, **extra) -> None:
        super().save(state, storage_study=self.manifest["study_name"], **extra)

    def propose(self):
        import optuna
        storage, study = self.storage, self.study
        if self.max_trials is not None and self.mine >= self.max_trials:
            return None
        sid = with_retry(storage.get_study_id_from_name, study.study_name)
        self.counts = with_retry(state_counts, storage, {0: sid})[0]
        if self.counts["RUNNING"]:      # dead workers' chunks (also before a first heartbeat)
            with_retry(self.silent.adopt, storage, study)
            with_retry(optuna.storages.fail_stale_trials, study)
            self.counts = with_retry(state_counts, storage, {0: sid})[0]
        tid = with_retry(_pop_waiting, storage, study) if self.counts["WAITING"] else None
        if tid is not None:
            return tid
        if self.counts["RUNNING"]:
            return WAIT                      # they may die and come back
        if not with_retry(lambda: study.user_attrs.get(ENQUEUED)):
            self.study = with_retry(optuna.load_study, study_name=study.study_name,
                                    storage=storage)
            return WAIT                      # the run is still enqueueing
        lost = with_retry(_missing, storage, study, self.n_chunks)   # failed past the retries
        if lost:       # look again: a stale chunk's retry may be on its way
            time.sleep(HEARTBEAT_S)
            lost = with_retry(_missing, storage, study, self.n_chunks)
        if not lost:
            return None
        _enqueue(study, lost)
        return WAIT

    def score(self, tid):
        import optuna
        trial = optuna.Trial(self.study, tid)
        beat = _Heartbeat(self.storage, tid)
        try:
            # the chunk from the storage itself, not through the study's trial cache: a worker
            # pops trials by id (``_pop_waiting``), and one enqueued after the cache last read
            # the study is unknown to it (``trial.suggest_int`` raised ``KeyError: <trial id>``)
            i = with_retry(lambda: _chunk_of(self.storage.get_trial(tid)))
            with_retry(self.storage.set_trial_param, tid, "chunk", float(i),
                       optuna.distributions.IntDistribution(0, self.n_chunks - 1))
            table, n = exhaustive.score_chunk(self.space, i, self.chunk)
        finally:
            beat.stop()
        return trial, i, table, n

    def store(self, tid, scored) -> None:
        _, i, table, _ = scored
        tables.save_table(store.chunk_file(self.d, i), table, self.manifest)

    def tell(self, tid, scored) -> int:
        trial, i, table, n = scored
        metrics = [o.metric for o in self.space.objectives]
        try:
            with_retry(trial.set_user_attr, "front", front_payload(
                table["design_id"].to_numpy(), {m: table[m] for m in metrics}))
            with_retry(self.study.tell, trial, n)
        except Exception as e:
            if not (told_already(e) or finished_elsewhere(e)):
                raise
            if not told_already(e):
                return 0   # failed as stale meanwhile (an outage): retried elsewhere
        self.mine += 1
        self.counts["COMPLETE"] += 1
        self.front = pareto.front_of([self.front, table], self.space.objectives)
        store.fix_reference(self.manifest, self.d,
                           pareto.objective_matrix(self.front, self.space.objectives)
                           if len(self.front) else [])
        return 1

    def finish(self) -> None:
        from optuna.trial import TrialState
        name = self.study.study_name
        # the run's front and counts from the database itself: every worker's chunks, each once
        trials = with_retry(fresh_trials, self.storage, name,
                            (TrialState.COMPLETE, TrialState.FAIL))
        done = completed_chunks(trials)
        self.counts["FAIL"] = sum(t.state == TrialState.FAIL for t in trials)
        self.front = front_from_shards(trials, self.space)
        if len(self.front):
            store.fix_reference(self.manifest, self.d,
                               pareto.objective_matrix(self.front, self.space.objectives))
        self.final = (len(done), sum(_designs(self.space, self.chunk, i) for i in done))
        self.save("finished" if len(done) == self.n_chunks else "stopped")


def run(space, d: Path, manifest: dict, *, max_trials: int | None, budget_s: float | None,
        storage_url: str, progress: bool = True, joining: bool = False) -> dict:
    """Drive a sharded exhaustive run (or join it as a worker)."""
    return drive(Shards(space, d, manifest, max_trials=max_trials, budget_s=budget_s,
                        storage_url=storage_url, joining=joining), progress)
