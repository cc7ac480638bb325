"""Request lengths that a case's benchmark harness drew around its stated ``isl`` and ``osl``.

The predict contract's ``isl`` and ``osl`` are every request's lengths. A case file may also say
how its benchmark drew them, in the ``length_dist`` column (an annotation the contract's
converters write). dse reads one form of it: ``uniform[aL,bL]``, lengths drawn uniformly between
``a`` and ``b`` times the stated ``L`` (a blank bound is 1). The case is then scored at the mean
lengths ``(a + b) / 2 x L`` (rounded to whole tokens) with their spread as the coefficients of
variation ``isl_cv``/``osl_cv`` (dse.perf.lengths, where the case leaves them blank):
``(b - a) / (sqrt(3) (a + b))``, the uniform's standard deviation over its mean.

InferenceX's rows ran benchmark_serving with ``--random-range-ratio 0.8``; its random dataset
draws input and output lengths alike as ``np.random.randint(int(L * range_ratio), L + 1)``
(SemiAnalysisAI/InferenceX utils/bench_serving/benchmark_serving.py, ``sample_random_requests``,
at 1cb92d21d; the same in the kimbochen/bench_serving port it cloned before): a mean of 0.9 L
and a coefficient of variation of 0.064. Any other ``length_dist`` (aiperf's fixed lengths,
blank) leaves the case as it is.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse.errors import InputError

COLUMN = "length_dist"
UNIFORM = r"uniform\[([0-9.]*)L,\s*([0-9.]*)L\]"
FORM = "uniform[aL,bL] with 0 < a <= b (a blank bound is 1), e.g. uniform[0.8L,L]"


def spread(dist: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per case: the mean length as a share of the stated one, the lengths' coefficient of
    variation (1 and 0 where ``dist`` names no ``uniform[aL,bL]``), and whether the text starts
    as a ``uniform[`` that does not parse to ``0 < a <= b`` (a malformed distribution)."""
    text = dist.fillna("").astype(str)
    got = text.str.extract(UNIFORM)
    a = pd.to_numeric(got[0].replace("", "1"), errors="coerce").to_numpy(float)
    b = pd.to_numeric(got[1].replace("", "1"), errors="coerce").to_numpy(float)
    ok = np.isfinite(a) & np.isfinite(b) & (a > 0) & (b >= a)
    share, cv = np.ones(len(dist)), np.zeros(len(dist))
    share[ok] = 0.5 * (a[ok] + b[ok])
    cv[ok] = (b[ok] - a[ok]) / (np.sqrt(3.0) * (a[ok] + b[ok]))
    bad = text.str.lstrip().str.startswith("uniform[").to_numpy(bool) & ~ok
    return share, cv, bad


def apply_lengths(cases: pd.DataFrame, file: str = "cases", where=None) -> pd.DataFrame:
    """``cases`` at the mean lengths their ``length_dist`` names and with its spread in
    ``isl_cv``/``osl_cv`` where blank (``spread``); unchanged (the same frame) when no case
    names one. A malformed ``uniform[...]`` is refused (``InputError`` naming ``file`` and the
    case, ``where(i)``: "row N" by default)."""
    if COLUMN not in cases:
        return cases
    share, cv, bad = spread(cases[COLUMN])
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(f"{COLUMN} = {cases[COLUMN].iloc[i]!r} is not a length distribution",
                         file=file, where=(where(i) if where else f"row {i + 2}")
                         + f", column {COLUMN}", hint=FORM)
    on = (share != 1.0) | (cv > 0.0)     # a spread about the stated length counts too
    if not on.any():
        return cases
    cases = cases.copy()
    for col in ("isl", "osl"):
        stated = pd.to_numeric(cases[col], errors="coerce").to_numpy(float)
        mean = np.maximum(np.round(stated * share), 1.0)
        cases[col] = cases[col].astype(object)
        cases.loc[on, col] = mean[on].astype(int)
        cv_col = f"{col}_cv"
        given = pd.to_numeric(cases[cv_col], errors="coerce").to_numpy(float) \
            if cv_col in cases else np.full(len(cases), np.nan)
        cases[cv_col] = np.where(on & np.isnan(given), cv, given)
    return cases
