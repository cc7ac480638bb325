"""The one rule for the CSV files dse writes (predictions, fronts, what-ifs, question tables):
no text cell that a spreadsheet would evaluate as a formula (CSV injection)."""

from __future__ import annotations

import pandas as pd

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
        text = col.where(col.map(lambda x: isinstance(x, str)), None).astype(object)
        risky = text.str.contains(FORMULA_START, regex=True, na=False) & \
            ~text.str.contains(PLAIN_NUMBER, regex=True, na=False)
        if risky.any():
            out = out.copy() if out is frame else out
            fixed = col.astype(object).copy()
            fixed[risky.to_numpy()] = "'" + text[risky]
            out.isetitem(i, fixed)
    return out
