"""The request-rate path's root finding (dse.perf.queueing): per row, the largest concurrency at
which an increasing quantity stays at or under a target, found as ``bisect_increasing`` finds it
but in a few evaluations instead of 24.

``largest_ok`` is a bracketed secant on log C (Dekker's method): each step interpolates the
residual (``log(quantity / target)``, nearly linear in log C: step times are affine in the
batch between their kinks) through the last two points, falls back to the bracket's midpoint
where that lands outside the bracket or shrinks less than a bisection would, and keeps at least
half the bisection's resolution from either end, so the last step closes the bracket. The side
of every point is the predicate the bisection tests (``ok``), so the answer is the bracket's
lower end, a point that passes, within the bisection's resolution ``(log hi - log lo) / 2^24``
of the largest such point: the same concurrency as the bisection where the quantity is
increasing (at a jump of the quantity, e.g. one more prefill chunk, both land just below it).

``Probe`` evaluates the rows still being solved on a batch of only those rows once they are
fewer than half the rows it holds (taking the rows costs about as much as two evaluations).
"""

from __future__ import annotations

import numpy as np

RESOLUTION = 2.0 ** -24        # the bisection's: 24 halvings of the log C range
MAX_STEPS = 60                 # a bound only: a bisection step at least every other step
SHRINK = 0.5                   # take the rows still solved once fewer than this share of those held


class Probe:
    """``at(rows)`` (``rows`` None: every row) -> a function of the concurrency of those rows,
    returning a tuple of arrays; called with sorted rows ``idx`` and their concurrency ``c``.
    It evaluates on a batch of the rows asked about once they are fewer than ``SHRINK`` of the
    rows it holds (or not among them)."""

    def __init__(self, at, n: int):
        self.at, self.n = at, n
        self.every = at(None)
        self.rows, self.fn = None, self.every

    def __call__(self, idx: np.ndarray, c: np.ndarray) -> tuple:
        pos = idx
        if self.rows is not None:
            pos = np.minimum(np.searchsorted(self.rows, idx), len(self.rows) - 1)
            if not np.array_equal(self.rows[pos], idx):       # not among the rows held
                self.rows, self.fn, pos = None, self.every, idx
        held = self.n if self.rows is None else len(self.rows)
        if len(idx) < SHRINK * held:
            self.rows, self.fn, held, pos = idx, self.at(idx), len(idx), None
        if len(idx) == held:
            return self.fn(c)
        cc = np.ones(held)                 # (the rows not asked about: any concurrency)
        cc[pos] = c
        return tuple(v[pos] for v in self.fn(cc))


def _pick(ok, yes: dict, no: dict) -> dict:
    return {k: np.where(ok, yes[k], no[k]) for k in no}


def largest_ok(fn, lo, hi, lo_out, hi_out):
    """Per row, the largest C in ``[lo, hi]`` that passes, as ``queueing.bisect_increasing``
    finds it: ``lo`` where ``lo`` fails, ``hi`` less the resolution where ``hi`` passes.

    ``fn(idx, c)`` -> ``(residual, ok, out)`` for the rows ``idx`` at ``c``: ``ok`` the
    predicate (NaN fails, as in the bisection), ``residual`` increasing in C and about 0 at the
    root (inf or NaN: no slope, a bisection step), ``out`` a dict of arrays; ``lo_out``,
    ``hi_out`` the same triple at ``lo`` and ``hi``. Returns C and ``out`` at C (at ``hi`` where
    ``hi`` passes)."""
    a0, b0 = np.log(lo), np.log(np.maximum(hi, lo))
    tol = (b0 - a0) * RESOLUTION
    fails_lo = ~lo_out[1]
    ok_hi = hi_out[1] & ~fails_lo
    c = np.where(fails_lo, lo, np.exp(b0 - tol))
    out = _pick(fails_lo, lo_out[2], hi_out[2])
    idx = np.flatnonzero(~fails_lo & ~ok_hi & (b0 - a0 > tol))
    a, b, tol = a0[idx], b0[idx], tol[idx]
    x1, f1, x2, f2 = a, lo_out[0][idx], b, hi_out[0][idx]
    at_a = {k: v[idx] for k, v in lo_out[2].items()}
    last = prev = 2.0 * (b - a)            # the last two steps (the first secant step is free)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for _ in range(MAX_STEPS):
            if len(idx) == 0:
                break
            s = x2 - f2 * (x2 - x1) / (f2 - f1)
            bad = ~np.isfinite(s) | (s <= a) | (s >= b) | (np.abs(s - x2) > 0.5 * prev)
            s = np.where(bad, 0.5 * (a + b), s)
            s = np.minimum(np.maximum(s, a + 0.5 * tol), b - 0.5 * tol)
            last, prev = np.where(bad, b - a, np.abs(s - x2)), last
            f, ok, got = fn(idx, np.exp(s))
            a, b = np.where(ok, s, a), np.where(ok, b, s)
            at_a = _pick(ok, got, at_a)
            x1, f1, x2, f2 = x2, f2, s, f
            done = b - a <= tol
            if np.any(done):
                c[idx[done]] = np.exp(a[done])
                for k, v in at_a.items():
                    out[k][idx[done]] = v[done]
                keep = ~done
                idx, a, b, tol, x1, f1, x2, f2, last, prev = (v[keep] for v in (
                    idx, a, b, tol, x1, f1, x2, f2, last, prev))
                at_a = {k: v[keep] for k, v in at_a.items()}
    if len(idx):                           # (not reached: MAX_STEPS bounds a bisection)
        c[idx] = np.exp(a)
        for k, v in at_a.items():
            out[k][idx] = v
    return c, out
