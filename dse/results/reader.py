"""The one run reader: a run folder as a ``Run`` (its manifest, space, front, score tables and
status), what the report, comparisons, what-ifs, the worked questions and the Python API read.

The files themselves are ``dse.search.store``'s (the only module that knows their names); an
old run folder's scale-factor columns are renamed ``<path>.scale`` here, once.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

import pandas as pd

from dse.build.space import Objective, Space
from dse.errors import InputError
from dse.search import driver, store, tables
from dse.search.optuna import study
from dse.spec.fields import legacy_columns
from dse.units import seconds

PathLike = str | Path


class Run:
    """A run folder: its manifest, space, front, score tables and status."""

    def __init__(self, path: PathLike):
        self.path = Path(path)
        self.manifest: dict = store.load_manifest(self.path)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"

    def __fspath__(self) -> str:
        return str(self.path)

    @cached_property
    def space(self) -> Space:
        """The run's space, from its own copy of the space file."""
        return store.space_of(self.path, self.manifest)

    @property
    def objectives(self) -> tuple[Objective, ...]:
        """The run's objectives, as its manifest records them."""
        return tuple(Objective(o["name"], o["direction"]) for o in self.manifest["objectives"])

    @property
    def status(self) -> dict:
        """State and counters: the object ``dse status DIR --json`` prints (a missing or stale
        front.csv/progress.json is rebuilt from the score tables, as the command does)."""
        return json.loads(json.dumps(store.status(self.path)))

    def legacy(self, frame: pd.DataFrame) -> pd.DataFrame:
        """A table of this run with an old run folder's scale-factor columns renamed."""
        return legacy_columns(frame, store.scaled_paths(self.path, self.manifest))

    @property
    def front(self) -> pd.DataFrame:
        """front.csv: objectives, parameter columns (``<path>.scale`` for scale factors) and
        design_id of every design on the run's Pareto front."""
        front = store.read_front(self.path)
        if front is None:
            self.status          # rebuilds a missing or corrupt front.csv from the score tables
            front = store.read_front(self.path)
        if front is None:
            raise InputError("the run has no front.csv yet", file=str(self.path),
                             hint="run or resume it first")
        return self.legacy(front)

    @property
    def scores(self) -> pd.DataFrame:
        """Every stored score table of the run, concatenated: design_id, parameter columns and
        the metrics the run keeps (the designs its strategy scored; corrupt tables refused)."""
        frames = [self.legacy(tables.read_table(f)) for f in store.score_tables(self.path)]
        frames = [f for f in frames if len(f)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def resume(self, *, trials: int | None = None, budget: float | str | None = None,
               workers: int = 1, storage_retry: float | str | None = None,
               progress: bool = False) -> "Run":
        """Continue this run (``dse run --resume DIR``): the run's own settings, its copy of the
        space file, nothing lost and nothing counted twice. ``trials``: exhaustive: chunks to do
        now; optuna/nested: trials to add to the run's total (default: finish the run);
        ``budget``: wall time of this call; ``workers``: processes working together. Returns
        the run, its manifest read again."""
        set_storage_retry(storage_retry)
        driver.run_space(run_dir=str(self.path), resume=True, trials=trials,
                         budget_s=seconds(budget), workers=workers, progress=progress)
        self.manifest = store.load_manifest(self.path)
        self.__dict__.pop("space", None)
        return self


def open_run(path: PathLike | Run) -> Run:
    """A run folder (what ``dse run`` printed last) as a Run."""
    return path if isinstance(path, Run) else Run(path)


def set_storage_retry(storage_retry: float | str | None) -> None:
    """How long storage calls are retried while the database is unreachable (``--storage-retry``;
    None keeps ``$DSE_STORAGE_RETRY``, else 300 s)."""
    if storage_retry is not None:
        study.set_storage_retry(seconds(storage_retry, "storage_retry"))
