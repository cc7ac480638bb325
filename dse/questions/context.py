"""What an analysis of a worked question gets and gives: ``Context`` (the space, the run, the
front, the ``[answer]`` parameters, and the space's designs scored with the one scorer, under a
parameter sample when answering with bands; a training space's by the training model),
``Answer`` (the headline in numbers, details,
figures) and ``Lead`` (the number the answer leads with). An analysis module defines
``answer(ctx: Context) -> Answer``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from dse.perf import score_chunked
from dse.scoring import train_space


@dataclass(frozen=True)
class Lead:
    """The number an answer leads with: its first lines give it with its 90% band, whether the
    ranking or sign it states is resolved, and what would change it (``sampled.leads``).

    ``key``: a flattened key of ``Answer.numbers`` (``"fast.design_id"``); ``unit``: ``x``
    (a multiple), ``%`` (a value already in percent), ``share`` (a fraction shown as percent),
    ``$/Mtok`` or any unit written after the number; ``pick``: the flattened key of the choice
    the number belongs to (a design id, the best domain): the ranking is resolved when the same
    choice wins in the samples; ``versus``: the value whose side the answer states (0 for a
    change, 1 for a ratio): the sign is resolved when the band stays on one side of it."""

    key: str
    label: str
    unit: str = ""
    pick: str = ""
    pick_label: str = "pick"
    versus: float | None = None


@dataclass
class Answer:
    headline: str                                   # Markdown: the answer, in numbers
    details: str = ""                               # Markdown: method, tables, caveats
    numbers: dict = field(default_factory=dict)     # the headline figures (JSON-able)
    figures: list = field(default_factory=list)     # file names written under ctx.out
    lead: tuple = ()                                # Lead(s): the numbers the first lines give


@dataclass
class Context:
    space: object                 # dse.build.space.Space
    run_dir: Path
    out: Path
    params: dict
    front: pd.DataFrame           # the run's front.csv
    sample: object = None         # under bands: the parameter sample it scores with (dse.questions.sampled)

    def values(self, index=None) -> pd.DataFrame:
        """Parameter values of designs of the space (all of them by default), with design_id."""
        idx = np.arange(self.space.size, dtype=np.int64) if index is None else \
            np.asarray(index, dtype=np.int64)
        df = pd.DataFrame(self.space.values_at(idx))
        df.insert(0, "design_id", idx)
        return df

    def score(self, index=None, overrides: dict | None = None, values: dict | None = None) \
            -> pd.DataFrame:
        """Every metric of designs of the space (by flat index, all by default, or by explicit
        parameter ``values``), optionally under ``overrides`` {path: ("set"|"scale", v)}, joined
        to their parameter values. Float64, the same scorer as every command."""
        if values is None:
            df = self.values(index)
            vals = {p.path: df[p.column].to_numpy() for p in self.space.parameters}
        else:
            df = pd.DataFrame(values)
            vals = {k: np.asarray(v) for k, v in values.items()}
        if self.train:
            return self._score_train(df, vals, overrides)
        b, _ = self.space.batch_from_values(vals, overrides)
        s = self.sample.score(self.space, vals, overrides) if self.sample is not None \
            else score_chunked(b)
        for k, v in s.items():
            df[k] = np.broadcast_to(v, len(df)) if np.ndim(v) else v
        df["rack_chips"] = np.broadcast_to(np.asarray(b.rack_chips, dtype=float), len(df))
        return df.reset_index(drop=True)

    @property
    def train(self) -> bool:
        """A training space (``task = "train"``): scored by the training model."""
        return getattr(self.space, "task", "serve") == "train"

    def _score_train(self, df: pd.DataFrame, vals: dict, overrides) -> pd.DataFrame:
        n = len(df)
        vals = {k: (np.broadcast_to(v, n) if np.ndim(v) == 0 else v) for k, v in vals.items()}
        s = self.sample.score(self.space, vals, overrides) if self.sample is not None \
            else train_space.score_values(self.space, vals, overrides, dtype=np.float64)
        for k, v in s.items():
            df[k] = np.broadcast_to(v, n) if np.ndim(v) else v
        return df.reset_index(drop=True)

    def batch(self, values: dict, overrides: dict | None = None):
        """The scorer's Batch (one row per design) of designs given by parameter ``values``,
        under the context's parameter sample when answering with bands (per-op breakdowns)."""
        vals = {k: np.asarray(v) for k, v in values.items()}
        if self.sample is not None:
            return self.sample.batch(self.space, vals, overrides)
        b, _ = self.space.batch_from_values(vals, overrides)
        return b

    def param(self, key: str, default=None):
        return self.params.get(key, default)

    def figure_path(self, name: str) -> Path:
        return self.out / name
