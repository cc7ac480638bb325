"""``resolve`` and ``to_batch`` once per distinct design of a table, gathered back to its rows.

A case file's rows repeat a few hundred catalog combinations and layouts with other lengths
and concurrencies: 200,000 benchmark cases are 12,960 distinct designs once ``workload.isl``,
``workload.osl`` and ``workload.concurrency`` are set aside. Those three (``PER_ROW``) are
settable paths that are one scorer field each and feed nothing else (``designs.DIRECT_FIELDS``;
no derived column, default or consistency rule reads them): they are parsed and range-checked
on every row, as ``resolve`` checks them, and written into the gathered batch. Every other
column is resolved on the first row of each distinct combination, so its messages name that
row: the first row of the file with that value. A file read in chunks keeps its distinct
designs in a ``Memo``: a later chunk resolves only those it adds (its 50,000 benchmark cases
add a few hundred to the first chunk's 12,684).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse.build.designs import DEFAULTS, DIRECT_FIELDS, resolve, to_batch
from dse.build.space import distinct_codes
from dse.errors import RowNames
from dse.perf import Batch
from dse.perf.batch import OPTIONAL
from dse.spec import validate

PER_ROW = ("workload.isl", "workload.osl", "workload.concurrency")
# past this share of distinct rows, gathering them back costs more than it saves
MAX_DISTINCT_SHARE = 0.5


def distinct_rows(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray] | None:
    """(first row of each distinct row, in the order they first appear; each row's distinct
    row), or None where a column mixes types (factorize would take True, 1 and 1.0 for one
    value). Floats compare by their bits: -0.0 and 0.0 stay apart."""
    codes, dims = [], []
    for c in frame.columns:
        col = frame[c]
        if pd.api.types.is_bool_dtype(col):
            values = col.to_numpy()
        elif pd.api.types.is_float_dtype(col) and col.dtype.kind == "f":
            values = np.ascontiguousarray(col.to_numpy(dtype=np.float64)).view(np.int64)
        elif pd.api.types.is_integer_dtype(col) and col.dtype.kind in "iu":
            values = col.to_numpy()
        elif isinstance(col.dtype, pd.StringDtype) or (
                col.dtype == object and pd.api.types.infer_dtype(col, skipna=True)
                in ("string", "empty")):
            values = col
        else:
            return None
        k, u = pd.factorize(values, use_na_sentinel=False)
        codes.append(k)
        dims.append(max(len(u), 1))
    n = len(frame)
    if not codes or n == 0:
        return (np.zeros(min(n, 1), np.int64), np.zeros(n, np.int64))
    first, inverse = distinct_codes(codes, dims)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return first[order], rank[inverse]


class Memo:
    """The distinct designs a file's earlier chunks resolved: a later chunk resolves only the
    designs it adds (a chunk that would take it past ``MEMO_ROWS`` empties it first, and
    holds its own). Their resolved rows and full-length batch columns, found by the design's
    values."""

    def __init__(self):
        self.key: list[str] | None = None
        self.clear()

    def clear(self) -> None:
        self.rows: dict[tuple, int] = {}
        self.resolved: pd.DataFrame | None = None
        self.columns: dict[str, np.ndarray] = {}

    def add(self, keys: list[tuple], resolved: pd.DataFrame, batch: Batch) -> None:
        full = {k: np.broadcast_to(v, (len(batch),)) for k, v in batch.columns.items()}
        if self.resolved is None:
            self.resolved, self.columns = resolved, full
        else:
            old, n0, n1 = self.columns, len(self.rows), len(keys)
            self.resolved = pd.concat([self.resolved, resolved], ignore_index=True)
            self.columns = {k: np.concatenate([_field(old, k, n0), _field(full, k, n1)])
                            for k in (*old, *(k for k in full if k not in old))}
        self.rows.update(zip(keys, range(len(self.rows), len(self.rows) + len(keys))))


# distinct designs a file's memo holds at most (~4 KB each: the resolved row and its batch row)
MEMO_ROWS = 20_000


def _field(columns: dict, k: str, n: int) -> np.ndarray:
    """Batch field ``k`` of some rows' ``columns``, its "off" value where they lack it
    (``Batch.from_columns`` drops an optional field that is off on every row)."""
    if k in columns:
        return columns[k]
    off = OPTIONAL[k]
    return columns[off] if isinstance(off, str) else np.full(n, off, dtype=np.float64)


def _keys(frame: pd.DataFrame) -> list[tuple]:
    """Each row's values as a hashable key: floats by their bits, any blank as one value."""
    cols = []
    for c in frame.columns:
        col = frame[c]
        if col.dtype.kind == "f":
            cols.append(np.ascontiguousarray(col.to_numpy(dtype=np.float64)).view(np.int64)
                        .tolist())
        elif col.dtype.kind in "iub":
            cols.append(col.to_numpy().tolist())
        else:
            v = col.to_numpy(dtype=object).copy()
            v[pd.isna(v)] = _BLANK
            cols.append(v.tolist())
    return list(zip(*cols))


class _Blank:
    """A blank cell in a key (NaN is not equal to itself; a string could be "<blank>")."""

    def __repr__(self) -> str:
        return "<blank>"


_BLANK = _Blank()


def resolve_batch(table: pd.DataFrame, *, file=None, row_names=None,
                  aliases: dict | None = None, memo: Memo | None = None
                  ) -> tuple[pd.DataFrame, Batch]:
    """``resolve(table)`` and its ``to_batch``, the same tables and batch: built on the
    distinct rows when they are few (``distinct_rows`` of the columns other than ``PER_ROW``;
    ``row_names``, the rows' names for messages, is then needed), and only on those that
    ``memo`` (the file's earlier chunks) does not hold."""
    aliases = aliases or {}
    per_row = [c for c in PER_ROW if c in table.columns]
    key = [c for c in table.columns if c not in per_row]
    d = distinct_rows(table[key]) if len(table) > 1 and row_names is not None else None
    if d is None or len(d[0]) > MAX_DISTINCT_SHARE * len(table):
        resolved = resolve(table, file=file, row_names=row_names, aliases=aliases)
        return resolved, to_batch(resolved)
    first, inverse = d
    names = row_names
    sub = table[key].iloc[first].reset_index(drop=True)
    memo = memo if memo is not None else Memo()
    if memo.key != key:
        memo.clear()
        memo.key = key
    keys = _keys(sub)
    new = np.array([k not in memo.rows for k in keys], dtype=bool)
    if new.any() and len(memo.rows) + int(new.sum()) > MEMO_ROWS:
        memo.clear()                         # (then this chunk's designs are all new)
        new[:] = True
    if new.any():
        at = np.flatnonzero(new)
        res = resolve(sub.iloc[at].reset_index(drop=True), file=file, aliases=aliases,
                      row_names=RowNames(len(at), lambda j: names[int(first[at[j]])]))
        memo.add([keys[i] for i in at], res, to_batch(res))
    values = {}
    for c in per_row:        # as resolve's merge: parsed, a blank the default, then in range
        v = validate.parse_column(c, table[c], file=file, names=names,
                                  name=aliases.get(c, c)).to_numpy(dtype=float)
        values[c] = np.where(np.isnan(v), float(DEFAULTS[c]), v)
    validate.check_table(values, file=file, names=names, alias=aliases, rules=False)
    rows = np.array([memo.rows[k] for k in keys], dtype=np.int64)[inverse]
    batch = Batch.from_columns({k: v.take(rows) for k, v in memo.columns.items()}).replace(
        **{DIRECT_FIELDS[c]: v for c, v in values.items()})
    resolved = memo.resolved.take(rows).reset_index(drop=True)
    for c, v in values.items():
        resolved[c] = v
    return resolved, batch
