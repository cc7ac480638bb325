"""A resolved design table held as numpy columns, for gathering rows at numpy speed.

``dse.build.designs.resolve`` returns a pandas DataFrame (validated, one column per settable path);
a search space resolves its grid of catalog combinations once and then gathers rows of it for
every chunk of designs. ``Resolved`` keeps that table as float64 arrays (numeric columns) and
integer codes into each column's distinct values (the others), notes once which columns are
the same on every row, and builds the scorer's compact columns (``compact``): a column that is
the same on every design stays length-1, a numeric one is gathered, a string one becomes a
pandas Categorical (codes only), which ``dse.build.designs.to_batch`` reads without touching strings.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


class Resolved:
    """The columns of a resolved design table (``Resolved(frame)``), or some of its rows
    (``take``). The numeric columns are one float64 matrix (a row per column, so each column is
    contiguous) gathered in one call; the others codes into their distinct values."""

    def __init__(self, frame: pd.DataFrame | dict):
        self.order = list(frame.keys())
        numeric, self.dtypes = [], {}
        self.coded: dict[str, tuple[np.ndarray, pd.CategoricalDtype, np.ndarray]] = {}
        n = 0
        for c in self.order:
            v = frame[c].to_numpy() if isinstance(frame, pd.DataFrame) else frame[c]
            n = len(v)
            if v.dtype.kind in "fiub":
                numeric.append(c)
                self.dtypes[c] = v.dtype
            else:
                raw = np.asarray(v, dtype=object)
                codes, cats = pd.factorize(raw, use_na_sentinel=True)
                self.coded[c] = (codes, pd.CategoricalDtype(cats), raw)
        self.slot = {c: i for i, c in enumerate(numeric)}
        # float64 holds every int and bool column exactly; each keeps its own dtype on the way out
        self.matrix = np.empty((len(numeric), n))
        for c, i in self.slot.items():
            self.matrix[i] = frame[c].to_numpy() if isinstance(frame, pd.DataFrame) else frame[c]
        self.rows: np.ndarray | None = None
        self.n = n

    def column(self, c: str) -> np.ndarray:
        """Every row's value of column ``c`` (the whole table, not ``take``'s rows)."""
        if c in self.slot:
            return self.matrix[self.slot[c]].astype(self.dtypes[c])
        return self.coded[c][2]

    @classmethod
    def stack(cls, parts: list["Resolved"]) -> "Resolved":
        """The rows of whole tables with the same columns, one after the other."""
        return cls({c: np.concatenate([p.column(c) for p in parts]) for c in parts[0].order})

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
        rows are all the same (NaN equal to NaN), else gathered (strings as Categoricals)."""
        rows = self.rows if self.rows is not None else np.arange(self.n)
        full = None
        if len(inverse) and 2 * len(rows) >= len(inverse):
            # about as many designs as rows (every design distinct): one gather, not two (the
            # designs use every row, so a column is the same on the rows iff on the designs)
            sub = full = self.matrix[:, rows[inverse]]
        else:
            sub = self.matrix[:, rows]
        first = sub[:, :1]
        same = np.all((sub == first) | (np.isnan(sub) & np.isnan(first)), axis=1)
        if full is None and not same.all():
            full = sub[:, inverse]
        table = {}
        for c in self.order:
            i = self.slot.get(c)
            if i is not None:
                v = first[i] if same[i] else full[i]
                table[c] = v if self.dtypes[c] == np.float64 else v.astype(self.dtypes[c])
                continue
            codes, dtype, raw = self.coded[c]
            k = codes[rows]
            table[c] = raw[rows[:1]] if len(k) <= 1 or bool(np.all(k == k[0])) else \
                pd.Categorical.from_codes(k[inverse], dtype=dtype)
        return table


__all__ = ["Resolved"]
