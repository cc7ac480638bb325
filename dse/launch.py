"""Starting a search: the one code path of ``dse run SPACE`` and ``dse.run(space)``.

``start`` creates the run folder (its manifest and its own copy of the space file) with the
strategy's defaults and searches it; ``search`` dispatches a created (or resumed) run to its
strategy. The search driver's rewrite (``dse.search.driver.run_space``) takes this place.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dse.errors import InputError

EXHAUSTIVE_MAX = 10**8     # spaces up to this size are searched exhaustively by default


def search(space, d: Path, m: dict, *, trials: int | None, budget_s: float | None,
           progress: bool) -> dict:
    """Search the run folder ``d`` (manifest ``m``) with its strategy; its status at the end."""
    from dse.search import exhaustive, optuna_strategy, shards
    if m["strategy"] in ("optuna", "nested"):
        return optuna_strategy.run(space, d, m, max_trials=trials, budget_s=budget_s,
                                   storage_url=m.get("storage"), progress=progress)
    if m.get("storage"):
        return shards.run(space, d, m, max_trials=trials, budget_s=budget_s,
                          storage_url=m["storage"], progress=progress)
    return exhaustive.run(space, d, m, max_trials=trials, budget_s=budget_s, progress=progress)


def start(space_file: str, *, strategy: str | None = None, sampler: str | None = None,
          population: int | None = None, storage: str | None = None, trials: int | None = None,
          budget_s: float | None = None, seed: int = 0, out: str | None = None,
          chunk_designs: int | None = None, segment_trials: int | None = None,
          progress: bool = False):
    """Create a run of the space file and search it: (run folder, status, the run's space).

    ``strategy`` None: exhaustive up to ``EXHAUSTIVE_MAX`` designs, else optuna. A start that
    fails before anything is computed leaves no run folder behind (nor empties ``out``)."""
    from dse import runs
    from dse.search import exhaustive, optuna_strategy
    from dse.space import load_space
    if trials is not None and trials < 1:
        raise InputError(f"--trials {trials} must be >= 1")
    space = load_space(space_file)
    strategy = strategy or ("exhaustive" if space.size <= EXHAUSTIVE_MAX else "optuna")
    if strategy not in ("exhaustive", "optuna", "nested"):
        raise InputError(f"unknown strategy {strategy!r}", hint="exhaustive, optuna or nested")
    if strategy in ("optuna", "nested"):
        sampler = sampler or ("tpe" if strategy == "nested" else "nsga2")
        population = population or (4 if strategy == "nested" else 32)
        optuna_strategy.make_sampler(sampler, seed, population)  # fail early
    if chunk_designs is not None and chunk_designs < 1:
        raise InputError(f"--chunk-designs {chunk_designs} must be >= 1")
    existed = bool(out) and Path(out).is_dir()
    d = runs.new_run_dir(space.name, out)
    extra = {"chunk_designs": chunk_designs or exhaustive.CHUNK_DESIGNS}
    if strategy == "exhaustive" and storage:   # chunks as trials of a shared study
        extra.update(storage=storage, study_name=d.name)
    if strategy in ("optuna", "nested"):
        outer, _ = optuna_strategy.split_parameters(space, strategy == "nested")
        points = int(np.prod([space.shape[i] for i in outer])) if outer else 1
        extra.update(sampler=sampler, population=population, study_name=d.name,
                     trials=trials or min(points, 10_000), storage=storage,
                     segment_trials=segment_trials or optuna_strategy.SEGMENT_TRIALS)
        trials = None
    try:
        m = runs.create(d, space, strategy, seed, extra)
        space = load_space(str(runs.space_snapshot(d, m)))   # the run reads its own copy
        return d, search(space, d, m, trials=trials, budget_s=budget_s, progress=progress), space
    except runs.Interrupted:
        raise                        # stopped: resumable
    except BaseException:
        runs.discard(d, existed)     # a start that failed before computing anything
        raise
