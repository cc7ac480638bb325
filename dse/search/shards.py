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
import os
import random
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

from dse import pareto, runs
from dse.search import exhaustive
from dse.search.optuna_strategy import (HEARTBEAT_S, finished_elsewhere, front_payload,
                                       payload_frame, storage_for, told_already, with_retry)
from dse.search.segments import Silent, state_counts

ENQUEUED = "chunks_enqueued"     # study user attr: every chunk has had a trial enqueued


def _designs(space, chunk: int, i: int) -> int:
    return min((i + 1) * chunk, space.size) - i * chunk


def _chunk_of(t) -> int | None:
    c = t.params.get("chunk", (t.system_attrs.get("fixed_params") or {}).get("chunk"))
    return None if c is None else int(c)


def _pop_waiting(study) -> int | None:
    """A waiting trial of the study set RUNNING by this worker (None: none is waiting). One
    query for a few candidates (not Optuna's load of every waiting trial), taken in random order
    so that workers seldom race for the same one."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState
    storage = study._storage
    engine = getattr(storage, "engine", None)
    if engine is None:
        return study._pop_waiting_trial_id()
    import sqlalchemy as sa
    from optuna.storages._rdb.models import TrialModel
    q = (sa.select(TrialModel.trial_id).where(TrialModel.study_id == study._study_id,
                                              TrialModel.state == TrialState.WAITING)
         .order_by(TrialModel.trial_id).limit(16))
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


def completed_chunks(study) -> dict[int, object]:
    """{chunk index: its first completed trial}: a chunk completed twice counts once."""
    from optuna.trial import TrialState
    out = {}
    for t in sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)),
                    key=lambda t: t.number):
        c = _chunk_of(t)
        if c is not None and c not in out and "front" in t.user_attrs:
            out[c] = t
    return out


def front_from_shards(study, space) -> pd.DataFrame:
    """The run's front from the storage alone: the Pareto set of every chunk's front."""
    frames = [payload_frame(t.user_attrs["front"], space)
              for _, t in sorted(completed_chunks(study).items())]
    front = pareto.front_of([f for f in frames if len(f)], space.objectives)
    if len(front):
        for p, v in space.values_at(front["design_id"].to_numpy()).items():
            front[p] = v
    return front


def _missing(study, n_chunks: int) -> list[int]:
    """Chunks no trial stands for (completed, running or waiting)."""
    from optuna.trial import TrialState
    have = {_chunk_of(t) for t in study.get_trials(
        deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING))}
    return [i for i in range(n_chunks) if i not in have]


def _enqueue(study, chunks) -> None:
    for i in chunks:
        with_retry(study.enqueue_trial, {"chunk": int(i)})


def run(space, d: Path, manifest: dict, *, max_trials: int | None, budget_s: float | None,
        storage_url: str, progress: bool = True, joining: bool = False) -> dict:
    """Pull chunks of the shared study until none is left (or this process's budget is spent).
    ``joining``: a worker; the run's own process (``dse run``, ``--resume``) first makes sure
    every chunk has a trial."""
    import warnings

    import optuna
    from optuna.trial import TrialState
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    chunk = int(manifest.get("chunk_designs", exhaustive.CHUNK_DESIGNS))
    n_chunks = -(-space.size // chunk)
    storage = storage_for(None, storage_url)
    study = with_retry(optuna.create_study, study_name=manifest["study_name"], storage=storage,
                       sampler=optuna.samplers.RandomSampler(), load_if_exists=True)
    if not joining:
        if "space_toml" not in with_retry(lambda: study.user_attrs):
            with_retry(study.set_user_attr, "space_toml", Path(space.file).read_text())
            with_retry(study.set_user_attr, "inputs", runs.inputs_payload(d, manifest))
            with_retry(study.set_user_attr, "manifest", json.dumps(manifest, default=str))
        if not with_retry(lambda: study.user_attrs.get(ENQUEUED)):
            _enqueue(study, with_retry(_missing, study, n_chunks))   # a resume: only the rest
            with_retry(study.set_user_attr, ENQUEUED, True)
    runs.remove_stale_tmp(d)      # a killed process's: the pid is in the name (workers share)
    elapsed0 = float(runs.read_progress(d).get("elapsed_s", 0.0))
    metrics = [o.metric for o in space.objectives]
    front = pareto.front_of([runs.read_table(f) for f in sorted((d / "scores").glob("chunk-*.parquet"))],
                            space.objectives)
    silent = Silent()
    counts = {"COMPLETE": 0, "FAIL": 0}
    mine = 0
    t0 = time.monotonic()
    hv = None

    def save(state, completed=None, designs=None):
        nonlocal hv
        ref = manifest.get("reference")
        if ref is not None and len(front):
            hv = pareto.hypervolume(pareto.objective_matrix(front, space.objectives),
                                    np.array(ref["point"]), np.array(ref["scale"]))
        runs.write_front(d, front, space.objectives, [p.path for p in space.parameters])
        done = counts["COMPLETE"] if completed is None else completed
        runs.write_json(d / "progress.json", {
            "state": state, "trials_completed": done, "trials_failed": counts["FAIL"],
            "trials_total": n_chunks,
            "designs_scored": designs if designs is not None else min(done * chunk, space.size),
            "elapsed_s": elapsed0 + time.monotonic() - t0, "front_size": len(front),
            "hypervolume": hv, "storage_study": manifest["study_name"]})

    with runs.Working(d, progress, total=n_chunks, unit="chunk", desc="exhaustive shards") as work:
        try:
            save("running")
            while not work.stop and (max_trials is None or mine < max_trials):
                if budget_s is not None and time.monotonic() - t0 >= budget_s:
                    break
                sid = with_retry(storage.get_study_id_from_name, study.study_name)
                counts = with_retry(state_counts, storage, {0: sid})[0]
                if counts["RUNNING"]:      # dead workers' chunks (also before a first heartbeat)
                    with_retry(silent.adopt, storage, study)
                    with_retry(optuna.storages.fail_stale_trials, study)
                    counts = with_retry(state_counts, storage, {0: sid})[0]
                tid = with_retry(_pop_waiting, study) if counts["WAITING"] else None
                if tid is None:
                    if counts["RUNNING"]:
                        time.sleep(HEARTBEAT_S / 2)       # they may die and come back
                        continue
                    if not with_retry(lambda: study.user_attrs.get(ENQUEUED)):
                        time.sleep(HEARTBEAT_S / 2)       # the run is still enqueueing
                        study = with_retry(optuna.load_study, study_name=study.study_name,
                                           storage=storage)
                        continue
                    lost = with_retry(_missing, study, n_chunks)   # failed past the retries
                    if lost:       # look again: a stale chunk's retry may be on its way
                        time.sleep(HEARTBEAT_S)
                        lost = with_retry(_missing, study, n_chunks)
                    if not lost:
                        break
                    _enqueue(study, lost)
                    continue
                trial = optuna.Trial(study, tid)
                beat = _Heartbeat(storage, tid)
                try:
                    i = with_retry(trial.suggest_int, "chunk", 0, n_chunks - 1)
                    table, n = exhaustive.score_chunk(space, i, chunk)
                finally:
                    beat.stop()
                out = exhaustive._chunk_file(d, i)
                runs.atomic_save(out, lambda p: table.to_parquet(p, index=False))
                try:
                    with_retry(trial.set_user_attr, "front", front_payload(
                        table["design_id"].to_numpy(), {m: table[m] for m in metrics}))
                    with_retry(study.tell, trial, n)
                except Exception as e:
                    if not (told_already(e) or finished_elsewhere(e)):
                        raise
                    if not told_already(e):
                        continue   # failed as stale meanwhile (an outage): retried elsewhere
                mine += 1
                counts["COMPLETE"] += 1
                front = pareto.front_of([front, table], space.objectives)
                runs.fix_reference(manifest, d, pareto.objective_matrix(front, space.objectives)
                                   if len(front) else [])
                save("running")
                work.update(1, len(front), hv)
            # the run's front and counts from the storage: every worker's chunks, each once
            done = with_retry(completed_chunks, study)
            counts["FAIL"] = len(with_retry(study.get_trials, deepcopy=False,
                                            states=(TrialState.FAIL,)))
            front = with_retry(front_from_shards, study, space)
            if len(front):
                runs.fix_reference(manifest, d, pareto.objective_matrix(front, space.objectives))
            save("finished" if len(done) == n_chunks else "stopped", completed=len(done),
                 designs=sum(_designs(space, chunk, i) for i in done))
        except BaseException:
            save("failed" if not work.stop else "stopped")
            raise
    return runs.status(d)
