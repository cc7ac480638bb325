"""Processes sharing one local run folder and its journal (``dse run``/``--resume`` and any number
of ``dse worker DIR``), on the protocol of ``dse.search.locks``.

Under the run's claim lock, before each batch, a process:

- follows the study segment the manifest names (another process may have rotated it);
- reads the batches others stored since it last looked (their trials count, their designs are
  known: not proposed again);
- recovers the trials no live process holds (a dead one's): told from their stored batch, or
  failed (then asked again, as new trials);
- counts the run's trials: those stored, plus those other live processes hold running; asks
  at most the total minus that, and records what it asked in its live token.

So N processes started at any moment finish exactly the run's total, and none fails a trial
another live process is scoring. Trials a live process holds are never touched; a process that
finds nothing left to ask while others still score waits for them (their trials may yet die
and come back).
"""

from __future__ import annotations

import json
from pathlib import Path

from dse.search import files, locks, tables
from dse.search.optuna import strategy as o
from dse.search.optuna.study import set_constraints

WINDOW_SEGMENTS = 3     # segments looked at for running trials: the newest and the two before


def sync(run) -> bool:
    """Batches stored since ``run`` last looked, read into its ``told`` and ``known``; True
    when any was new (another process's, or one from before this process opened the run)."""
    new = False
    for tf in sorted((Path(run.d) / "scores").glob("batch-*.trials.json")):
        if tf.name in run.read_batches or \
                not tf.with_name(tf.name.replace(".trials.json", ".parquet")).is_file():
            continue
        segment = int(tf.name.split("-")[1])
        for k, r in tables.read_trials(tf).items():
            run.told[segment, int(k)] = r
            if r.get("key") is not None:
                run.known[int(r["key"])] = r
        run.read_batches.add(tf.name)
        new = True
    return new


def follow_segment(run) -> None:
    """The study segment the manifest names, when another process rotated the run's study."""
    import optuna
    try:
        disk = json.loads(files.manifest_file(run.d).read_text())
    except (OSError, ValueError):
        return
    k = int(disk.get("segment", 0))
    if k > run.segment:
        run.manifest.update(segment=k, failed_before=int(disk.get("failed_before", 0)))
        run.segment = k
        run.study = optuna.create_study(study_name=o.segment_name(run.manifest, k),
                                        storage=run.storage, sampler=run.sampler_for(k),
                                        directions=run.directions, load_if_exists=True)


def window(run) -> list:
    """(segment, study) of the segments where a live process may still hold trials."""
    import optuna
    out = [(run.segment, run.study)]
    for k in range(max(0, run.segment - WINDOW_SEGMENTS + 1), run.segment):
        if k not in run.old_studies:
            try:
                run.old_studies[k] = optuna.load_study(
                    study_name=o.segment_name(run.manifest, k), storage=run.storage,
                    sampler=optuna.samplers.RandomSampler(seed=k))
            except KeyError:            # a segment whose journal was quarantined
                run.old_studies[k] = None
        if run.old_studies[k] is not None:
            out.append((k, run.old_studies[k]))
    return out


def recover(run, others: dict) -> int:
    """Trials running in the study that no live process holds (a dead one's): told from their
    stored batch, else failed. Returns how many (call under the claim lock)."""
    from optuna.trial import Trial, TrialState
    held = {tuple(t) for r in others.values() for t in (*r.get("trials", ()),
                                                         *r.get("echoes", ()))}
    n = 0
    for k, study in window(run):
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if (k, t.number) in held:
                continue
            if (k, t.number) in run.told:
                r = run.told[k, t.number]
                set_constraints(run.storage, run.ids(study.study_name, t.number), r["constraints"])
                study.tell(Trial(study, run.ids(study.study_name, t.number)), r["values"])
            else:
                study.tell(t.number, state=TrialState.FAIL)
            n += 1
    return n


def left(run) -> tuple[int, int]:
    """(trials the run may still ask, trials other live processes hold running), after
    following the segment, reading others' batches and recovering dead processes' trials
    (call under the claim lock)."""
    others = locks.others(run.d)
    follow_segment(run)
    if sync(run):
        run.foreign = True
    recover(run, others)
    running = {tuple(t) for r in others.values() for t in r.get("trials", ())} - set(run.told)
    if run.spent:
        return 0, len(running)
    return run.total - len(run.told) - len(running), len(running)


def alone(run) -> bool:
    """No other process works on the run folder now (call under the claim lock)."""
    return not locks.others(run.d)
