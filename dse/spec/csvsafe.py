"""The one rule for the CSV files dse writes (predictions, fronts, what-ifs, question tables):
no text cell that a spreadsheet would evaluate as a formula (CSV injection)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

# a cell starting with one of these is a formula (or starts one) in Excel, LibreOffice, Sheets
FORMULA_START = r"^[=+\-@\t\r]"
# ... unless it is a plain number, which a spreadsheet reads as the number it is
PLAIN_NUMBER = r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$"


def spreadsheet_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with every text cell that starts with ``=``, ``+``, ``-``, ``@``, a tab or a
    carriage return prefixed with a single quote ``'`` (OWASP's advice against CSV injection:
    ``=HYPERLINK(...)`` is written ``'=HYPERLINK(...)``). Numbers are never touched: a numeric
    column, a number in a mixed column and a text cell that is a plain number (``-1``, ``+2.5``)
    stay as they are. Returns the frame itself when no cell needs it, else a copy."""
    out = frame
    for i in range(frame.shape[1]):
        col = frame.iloc[:, i]
        if not (pd.api.types.is_object_dtype(col) or pd.api.types.is_string_dtype(col)):
            continue
        risky = np.zeros(len(col), bool)
        at = _formula_starts(col)        # the cells that may need it (all where unknown)
        if len(at):
            sub = col.iloc[at]
            text = sub.where(sub.map(lambda x: isinstance(x, str)), None).astype(object)
            risky[at] = (text.str.contains(FORMULA_START, regex=True, na=False)
                         & ~text.str.contains(PLAIN_NUMBER, regex=True, na=False)).to_numpy()
        if risky.any():
            out = out.copy() if out is frame else out
            fixed = col.astype(object).copy()
            fixed[risky] = "'" + fixed[risky]        # (text cells only: the others are not risky)
            out.isetitem(i, fixed)
    return out


def _formula_starts(col: pd.Series) -> np.ndarray:
    """Rows of ``col`` whose cell may start a formula: for a column of strings, those whose
    first character is one of ``FORMULA_START``'s (found by Arrow, without a Python call per
    cell: a predictions file has 200,000 case ids); every row for any other column."""
    every = np.arange(len(col))
    if not (isinstance(col.dtype, pd.StringDtype)
            or pd.api.types.infer_dtype(col, skipna=True) in ("string", "empty")):
        return every
    try:
        arr = pa.array(col.to_numpy(dtype=object), type=pa.string(), from_pandas=True)
    except (pa.ArrowException, TypeError, ValueError):
        return every
    hit = pc.match_substring_regex(arr, FORMULA_START).fill_null(False)
    return np.flatnonzero(hit.to_numpy(zero_copy_only=False))
