"""A resolved design table held as numpy columns, for gathering rows at numpy speed.

``dse.build.resolve`` returns a pandas DataFrame (validated, one column per settable path);
a search space resolves its grid of catalog combinations once and then gathers rows of it for
every chunk of designs. ``Resolved`` keeps that table as float64 arrays (numeric columns) and
integer codes into each column's distinct values (the others), notes once which columns are
the same on every row, and builds the scorer's compact columns (``compact``): a column that is
the same on every design stays length-1, a numeric one is gathered, a string one becomes a
pandas Categorical (codes only), which ``dse.build.to_batch`` reads without touching strings.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def _same(v: np.ndarray) -> bool:
    """Every value equal to the first (NaN equal to NaN)."""
    if len(v) <= 1:
        return True
    if v.dtype.kind == "f":
        return bool(np.all(v == v[0])) or bool(np.isnan(v[0]) and np.all(np.isnan(v)))
    return bool(np.all(v == v[0]))


class Resolved:
    """The columns of a resolved design table (``Resolved(frame)``), or some of its rows
    (``take``)."""

    def __init__(self, frame: pd.DataFrame):
        self.numeric: dict[str, np.ndarray] = {}
        self.coded: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.order = list(frame.columns)
        for c in self.order:
            v = frame[c].to_numpy()
            if v.dtype.kind in "fiub":
                self.numeric[c] = v
            else:
                raw = np.asarray(v, dtype=object)
                codes, cats = pd.factorize(raw, use_na_sentinel=True)
                self.coded[c] = (codes, np.asarray(cats, dtype=object), raw)
        # the columns that are the same on every row of the whole table
        self.constant = {c for c, v in self.numeric.items() if _same(v)} | \
            {c for c, (k, _, _) in self.coded.items() if _same(k)}
        self.rows: np.ndarray | None = None
        self.n = len(frame)

    def take(self, rows: np.ndarray) -> "Resolved":
        """The same table restricted to ``rows`` (gathered lazily, in ``compact``)."""
        out = object.__new__(Resolved)
        out.__dict__.update(self.__dict__)
        rows = np.asarray(rows, dtype=np.int64)
        out.rows = rows if self.rows is None else self.rows[rows]
        out.n = len(rows)
        return out

    def __len__(self) -> int:
        return self.n

    def compact(self, inverse: np.ndarray) -> dict:
        """The columns of the designs whose rows are ``inverse``: length-1 where the table's
        rows are all the same, else gathered (strings as Categoricals)."""
        rows = self.rows if self.rows is not None else np.arange(self.n)
        table = {}
        for c in self.order:
            if c in self.numeric:
                v = self.numeric[c]
                if c in self.constant or len(rows) == 1:
                    table[c] = v[rows[:1]]
                    continue
                v = v[rows]
                table[c] = v[:1] if _same(v) else v[inverse]
            else:
                codes, cats, raw = self.coded[c]
                if c in self.constant or len(rows) == 1:
                    table[c] = raw[rows[:1]]
                    continue
                k = codes[rows]
                table[c] = raw[rows[:1]] if _same(k) else \
                    pd.Categorical.from_codes(k[inverse], categories=cats)
        return table


__all__ = ["Resolved"]
