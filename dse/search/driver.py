"""One search driver: every run, whatever its strategy, is created, resumed or joined here and
driven by one loop: propose -> score -> store -> tell.

    run_space(space, run_dir, strategy=..., trials=..., budget_s=..., ...) -> the run folder

is the one entry point (``dse run``, ``dse worker``, ``dse whatif --reoptimize``, ``dse answer``,
the benchmarks and the Python API all call it); the loop itself and the ``Strategy`` a strategy
implements are ``dse.search.loop``. The strategies: ``exhaustive`` (chunks of the space; ``shards``: the same chunks as trials of a
shared RDB study, pulled by many workers), ``optuna`` (Optuna's samplers propose whole designs,
asked and told in batches, a design already scored is told back at no cost) and ``nested``
(Optuna proposes hardware/model points, every layout and batch under each is enumerated); long
optuna runs rotate their study into segments (``optuna/segments.py``, ``OptunaRun.rotate``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from dse.build.space import Space, load_space
from dse.errors import EnvironmentFault, InputError, StorageError, StorageUnavailable
from dse.search import exhaustive, files, locks, shards, store, working
from dse.search.loop import drive
from dse.search.optuna import strategy as optuna_strategy
from dse.search.optuna.run import OptunaRun
from dse.search.optuna.study import storage_for, with_retry

EXHAUSTIVE_MAX = 10**8     # default strategy: exhaustive up to this many designs
DEFAULT_TRIALS = 10_000    # optuna/nested trials when neither --trials nor --budget is given
STRATEGY_NAMES = ("exhaustive", "optuna", "nested")


def strategy_class(manifest: dict):
    if manifest["strategy"] == "exhaustive":
        return shards.Shards if manifest.get("storage") else exhaustive.Exhaustive
    if manifest["strategy"] in ("optuna", "nested"):
        return OptunaRun
    raise InputError(f"unknown strategy {manifest['strategy']!r} in the manifest",
                     hint="one of " + ", ".join(STRATEGY_NAMES))


def search(space, d: Path, manifest: dict, *, max_trials=None, budget_s=None, storage_url=None,
           progress=True, joining=False) -> dict:
    """Drive a run folder that exists (its manifest written) with its strategy."""
    cls = strategy_class(manifest)
    s = cls(space, d, manifest, max_trials=max_trials, budget_s=budget_s,
            storage_url=storage_url if storage_url is not None else manifest.get("storage"),
            joining=joining)
    return drive(s, progress)


# --- creating, resuming and joining runs -----------------------------------------------------

def points(space, strategy: str) -> int:
    """What one trial of the strategy proposes, counted: designs (optuna), hardware/model
    points (nested)."""
    outer, _ = optuna_strategy.split_parameters(space, strategy == "nested")
    return int(np.prod([space.shape[i] for i in outer])) if outer else 1


LOCAL_KEYS = ("local_share", "local_after", "local_adjacent", "local_margin", "local_diagonal",
              "local_model", "local_start", "polish_share")


def plan(space, strategy: str | None, trials: int | None, budget_s: float | None,
         sampler: str | None, population: int | None, storage: str | None) -> dict:
    """The strategy and its settings for a new run. A run whose trials cover the space (every
    design, or every point of a nested run) enumerates it: the exact front at a fraction of the
    cost of asking Optuna for each design. With a budget and no trials, a run goes on until the
    budget or the space is spent."""
    strategy = strategy or ("exhaustive" if space.size <= EXHAUSTIVE_MAX else "optuna")
    if strategy not in STRATEGY_NAMES:
        raise InputError(f"unknown strategy {strategy!r}", hint="one of " + ", ".join(STRATEGY_NAMES))
    out = {"strategy": strategy}
    if strategy == "exhaustive":
        return out
    n = points(space, strategy)
    if trials is not None and trials >= n and storage is None:
        out.update(strategy="exhaustive", enumerated=f"--trials {trials:,} cover the {n:,} "
                   f"{'points' if strategy == 'nested' else 'designs'} of the space")
        return out
    total = trials if trials is not None else (n if budget_s is not None else min(n, DEFAULT_TRIALS))
    long = strategy == "optuna" and total > optuna_strategy.TPE_MAX_TRIALS and sampler is None
    polish = sampler is None
    if strategy == "optuna" and sampler is None and population is None and \
            total <= optuna_strategy.SHORT_RUN_TRIALS:
        # a short run: a pairs-covering start, then the surrogate's proposals (measured)
        out.update(optuna_strategy.SHORT_RUN, trials=int(total))
        return out
    sampler = sampler or (optuna_strategy.LONG_RUN[0] if long
                          else optuna_strategy.DEFAULT_SAMPLER[strategy])
    population = population or (optuna_strategy.LONG_RUN[1] if long and sampler == "nsga2"
                                else optuna_strategy.DEFAULT_POPULATION[strategy])
    optuna_strategy.make_sampler(sampler, 0, population)    # fail early (e.g. gp without torch)
    if strategy == "optuna" and polish and trials is not None:
        # the sampler for most of the trials, then a local search of the front (measured)
        out.update(optuna_strategy.polish(int(total)))
    out.update(sampler=sampler, population=population, trials=int(total))
    return out


def _resume(d: Path):
    """A stopped run taken over (its owner lock is held: no other run, resume or repair works
    on it; workers that are at work go on beside it)."""
    m = store.load_manifest(d)
    store.check_version(m, d)
    store.status(d)            # refuses corrupt durable files; rebuilds derived ones
    snap = store.space_snapshot(d, m)
    space = store.space_of(d, m)
    if space.digest != m["space_digest"]:
        raise InputError("the run's copy of its space file changed since the run started",
                         file=space.file, hint="start a new run for the new space")
    orig = Path(m["space_file"])
    if orig != snap and orig.is_file():
        import hashlib
        if hashlib.sha256(orig.read_bytes()).hexdigest()[:16] != m["space_digest"]:
            print(f"dse: warning: {orig} changed since the run started; the run continues "
                  f"with its copy {snap}", file=sys.stderr)
    return space, m


def _join(d: Path):
    m = store.load_manifest(d)
    store.check_version(m, d)
    if m["strategy"] == "exhaustive" and not m.get("storage"):
        raise InputError("exhaustive runs without --storage take no workers", file=str(d),
                         hint="workers join optuna and nested runs, and exhaustive runs "
                              "started with --storage URL")
    return store.space_of(d, m), m


def _spawn_workers(d: Path, n: int) -> list:
    """``n`` local ``dse worker`` processes joining the run (optuna, nested, shards)."""
    return [subprocess.Popen([sys.executable, "-m", "dse", "worker", str(d), "--quiet"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(n)]


def run_space(space=None, run_dir=None, *, strategy: str | None = None, trials: int | None = None,
              budget_s: float | None = None, workers: int = 1, seed: int = 0,
              storage: str | None = None, population: int | None = None,
              sampler: str | None = None, progress: bool = True, warm_start=None,
              chunk_designs: int | None = None, segment_trials: int | None = None,
              resume: bool = False, join: bool = False, storage_url: str | None = None,
              extra: dict | None = None, own_copy: bool = False) -> Path:
    """Create (or ``resume``, or ``join`` as a worker) a run and drive it; returns its folder.

    ``space``: a Space or a space file (new runs); ``run_dir``: the run folder (default
    ``runs/<time>-<name>``; required to resume or join). ``trials``: a new optuna/nested run's
    trials (default: the space's designs or points with a budget, else at most 10,000; when they
    cover the space, the run enumerates it), exhaustive chunks to do now, trials to add on
    resume, or this worker's trials when joining. ``budget_s``: wall-time budget of this call.
    ``workers``: processes working on the run together (optuna, nested; exhaustive with
    ``storage``), this one included. ``warm_start``: design ids enqueued as a new optuna/nested
    run's first trials. ``extra``: more manifest entries. ``storage_url``: a joining worker's
    RDB when the run folder is only its local copy. ``own_copy``: the run's snapshot of its
    space file is its space file (the given one is temporary: ``dse whatif --reoptimize``).
    """
    if trials is not None and trials < 1:
        raise InputError(f"--trials {trials} must be >= 1")
    if workers < 1:
        raise InputError(f"--workers {workers} must be >= 1")
    for flag, n in (("--population", population), ("--segment-trials", segment_trials)):
        if n is not None and n < 1:
            raise InputError(f"{flag} {n} must be >= 1", hint=f"leave {flag} out for the default")
    if budget_s is not None and not (np.isfinite(budget_s) and budget_s >= 0):
        raise InputError(f"--budget {budget_s} is not a duration", hint="e.g. 90s, 8h")
    if resume or join:
        if run_dir is None:
            raise InputError("give the run folder to resume or join")
        d = Path(run_dir)
        if not join:
            if not files.manifest_file(d).is_file():
                store.load_manifest(d)           # refused: not a run folder
            locks.acquire_owner(d)               # before anything of the folder is read
        procs = []
        try:
            space, m = _join(d) if join else _resume(d)
            procs = _spawn_workers(d, workers - 1) if workers > 1 else []
            search(space, d, m, max_trials=trials, budget_s=budget_s,
                   storage_url=storage_url or m.get("storage"), progress=progress, joining=join)
        except (StorageError, StorageUnavailable) as e:
            raise _resumable(e, d, join) from None
        finally:
            _reap(procs)
            if not join:
                locks.release_owner(d)
        return d
    if space is None:
        raise InputError("give a space file, or --resume DIR")
    if not isinstance(space, Space):
        space = load_space(str(space))
    if chunk_designs is not None and chunk_designs < 1:
        raise InputError(f"--chunk-designs {chunk_designs} must be >= 1")
    p = plan(space, strategy, trials, budget_s, sampler, population, storage)
    if "enumerated" in p and progress:
        print(f"dse: {p['enumerated']}: enumerating it exhaustively (the exact front)",
              file=sys.stderr)
    if storage:
        # the RDB's schema is made before the manifest exists: workers that join as soon as
        # they see it never race the run to create Optuna's tables
        storage_for(None, storage)
    existed = run_dir is not None and Path(run_dir).is_dir()
    d = store.new_run_dir(space.name, None if run_dir is None else str(run_dir))
    try:
        locks.acquire_owner(d)     # two runs started on one --out at once: one is refused
    except EnvironmentFault:       # taken, but its text could not be written (a full disk)
        store.discard(d, existed)
        raise
    ext = {"chunk_designs": chunk_designs or exhaustive.CHUNK_DESIGNS, **(extra or {})}
    if p["strategy"] == "exhaustive":
        if storage:               # chunks as trials of a shared study
            ext.update(storage=storage, study_name=d.name)
        if "enumerated" in p:
            ext["enumerated"] = p["enumerated"]
        max_trials = trials if "enumerated" not in p else None
    else:
        ext.update({k: p[k] for k in LOCAL_KEYS if k in p})
        ext.update(sampler=p["sampler"], population=p["population"], study_name=d.name,
                   trials=p["trials"], storage=storage,
                   segment_trials=segment_trials or optuna_strategy.SEGMENT_TRIALS)
        if workers > 1:
            ext["workers"] = workers
        if warm_start is not None:
            ext["warm_start"] = [int(i) for i in warm_start]
        max_trials = None
    try:
        m = store.create(d, space, p["strategy"], seed, ext)
        if own_copy:
            m["space_file"] = str(store.space_snapshot(d, m))
            store.write_manifest(d, m)
        space = store.space_of(d, m)      # the run reads its own copy
    except BaseException:
        store.discard(d, existed)
        locks.release_owner(d)
        raise
    procs = []
    try:
        if workers > 1:
            if p["strategy"] == "exhaustive" and not storage:
                raise InputError("several workers on an exhaustive run need --storage URL",
                                 hint="or one worker: exhaustive chunks are scored vectorized")
            procs = _spawn_workers(d, workers - 1)
        search(space, d, m, max_trials=max_trials, budget_s=budget_s, storage_url=storage,
               progress=progress)
    except working.Interrupted:
        raise                        # stopped: resumable
    except BaseException as e:
        store.discard(d, existed)     # a start that failed before computing anything
        if isinstance(e, (StorageError, StorageUnavailable)) and (d / "manifest.json").is_file():
            raise _resumable(e, d, False) from None
        raise
    finally:
        _reap(procs)
        locks.release_owner(d)
    return d


def _resumable(e, d: Path, join: bool):
    """A storage error of a run whose folder is kept, saying how to pick it up again."""
    again = f"dse worker {d}" if join else f"dse run --resume {d}"
    return e.resumable(f"the run folder is kept: {again} once the storage is back")


def _reap(procs) -> None:
    """Wait for the workers this call started (they stop once the run's work is done), then
    settle the run's derived files on what all of them stored."""
    for pr in procs:
        try:
            pr.wait(timeout=600)
        except subprocess.TimeoutExpired:
            pr.terminate()
            pr.wait()
    if procs:
        d = Path(procs[0].args[-2])
        m = store.load_manifest(d)
        if not m.get("storage"):
            store.write_front(d, store.front_from_tables(d, m), m["objectives"], m["parameters"])
            store.status(d)             # progress.json rebuilt from the durable files


def worker_folder(storage_url: str, study_name: str, out: str | Path | None) -> Path:
    """A worker's local run folder for a study in a shared storage: the run's inputs and
    manifest, as the run stored them in the study."""
    import optuna  # (start-up: optuna only when a worker joins a shared study)

    storage = storage_for(None, storage_url)
    try:
        study = with_retry(optuna.load_study, study_name=study_name, storage=storage)
    except KeyError:
        raise InputError(f"no study {study_name!r} in the storage", file=storage_url,
                         hint="the study name is the run folder's name") from None
    attrs = with_retry(lambda: study.user_attrs)
    if "manifest" not in attrs:
        raise InputError(f"the study {study_name!r} is not a dse run", file=storage_url,
                         hint="the study name is the run folder's name")
    m = json.loads(attrs["manifest"])
    d = Path(out) if out else Path("runs") / study_name
    existed = d.is_dir()
    try:
        store.make_folders(d)
        space_path = store.space_snapshot(d, m)
        if "inputs" in attrs:       # the run's snapshot: space file and objectives file
            store.write_inputs(d, attrs["inputs"])
        else:
            space_path.write_text(attrs["space_toml"])
        m["space_file"] = str(space_path)
        store.write_manifest(d, m)
        load_space(str(space_path))
    except BaseException:
        if not existed:
            store.discard(d)
        raise
    return d
