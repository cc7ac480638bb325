"""``resolve`` and ``to_batch`` once per distinct design of a table, gathered back to its rows.

A case file's rows repeat a few hundred catalog combinations and layouts with other lengths
and concurrencies: 200,000 benchmark cases are 12,960 distinct designs once ``workload.isl``,
``workload.osl`` and ``workload.concurrency`` are set aside. Those three (``PER_ROW``) are
settable paths that are one scorer field each and feed nothing else (``designs.DIRECT_FIELDS``;
no derived column, default or consistency rule reads them): they are parsed and range-checked
on every row, as ``resolve`` checks them, and written into the gathered batch. Every other
column is resolved on the first row of each distinct combination, so its messages name that
row: the first row of the file with that value.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse.build.designs import DEFAULTS, DIRECT_FIELDS, resolve, to_batch
from dse.build.space import distinct_codes
from dse.errors import RowNames
from dse.perf import Batch
from dse.spec import validate

PER_ROW = ("workload.isl", "workload.osl", "workload.concurrency")
# below this share of distinct rows the gathering costs less than it saves
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


def resolve_batch(table: pd.DataFrame, *, file=None, row_names=None,
                  aliases: dict | None = None) -> tuple[pd.DataFrame, Batch]:
    """``resolve(table)`` and its ``to_batch``, the same tables and batch: built on the
    distinct rows when they are few (``distinct_rows`` of the columns other than ``PER_ROW``;
    ``row_names``, the rows' names for messages, is then needed)."""
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
    res = resolve(sub, file=file, aliases=aliases,
                  row_names=RowNames(len(first), lambda j: names[int(first[j])]))
    values = {}
    for c in per_row:        # as resolve's merge: parsed, a blank the default, then in range
        v = validate.parse_column(c, table[c], file=file, names=names,
                                  name=aliases.get(c, c)).to_numpy(dtype=float)
        values[c] = np.where(np.isnan(v), float(DEFAULTS[c]), v)
    validate.check_table(values, file=file, names=names, alias=aliases, rules=False)
    batch = to_batch(res).take(inverse).replace(
        **{DIRECT_FIELDS[c]: v for c, v in values.items()})
    resolved = res.take(inverse).reset_index(drop=True)
    for c, v in values.items():
        resolved[c] = v
    return resolved, batch
