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
NOISE = 4e-6                   # and at least this (log C): float32 times place a root to ~1e-6
PREFIX = int(__import__("os").environ.get("DSE_PREFIX", "4"))                     # bisection steps first (where the predicate is not monotone)
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


def _put(out: dict, idx, got: dict, sel=None) -> None:
    for k, v in got.items():
        out[k][idx] = v if sel is None else v[sel]


def largest_ok(fn, lo, hi, lo_out, hi_out, on):
    """Per row (``on``; the others: ``lo``), the largest C in ``[lo, hi]`` that passes, as
    ``queueing.bisect_increasing`` finds it: its first ``PREFIX`` bisection steps (the same
    points: where the predicate is not monotone, the same crossing), then a bracketed secant
    in the bracket they leave; ``lo`` where that bracket's lower end is ``lo`` and ``lo``
    fails, ``hi`` less the bisection's resolution where its upper end is ``hi`` and passes.

    ``fn(idx, c)`` -> ``(residual, ok, out)`` for the rows ``idx`` at ``c``: ``ok`` the
    predicate (NaN fails, as in the bisection), ``residual`` increasing in C, about affine and
    0 at the root (inf or NaN: no slope, a bisection step), ``out`` a dict of arrays;
    ``lo_out``, ``hi_out`` the same triple at ``lo`` and ``hi``. Returns C and ``out`` at C."""
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.maximum(hi, lo)
    a, b = np.log(lo), np.log(hi)
    res = (b - a) * RESOLUTION
    f_a, f_b = lo_out[0].copy(), hi_out[0].copy()
    ok_a, ok_b = ~lo_out[1], hi_out[1].copy()       # (lo "passes" once a point above it does)
    at_a, at_b = ({k: v.copy() for k, v in o[2].items()} for o in (lo_out, hi_out))
    idx = np.flatnonzero(on & (res > 0))
    for _ in range(PREFIX):                          # the bisection's own first steps
        m = 0.5 * (a[idx] + b[idx])
        f, ok, got = fn(idx, np.exp(m))
        up, dn = idx[ok], idx[~ok]
        a[up], f_a[up], ok_a[up] = m[ok], f[ok], False
        b[dn], f_b[dn], ok_b[dn] = m[~ok], f[~ok], False
        _put(at_a, up, got, ok)
        _put(at_b, dn, got, ~ok)
    # the bracket's ends that are still lo (failing) or hi (passing) settle the row
    at_lo = ~on | (res <= 0) | ok_a
    at_hi = ~at_lo & ok_b
    c = np.where(at_lo, lo, np.where(at_hi, hi * np.exp(-res), np.exp(a)))
    out = _pick(at_hi, at_b, at_a)
    idx = np.flatnonzero(~at_lo & ~at_hi)
    _secant(fn, idx, np.exp(a[idx]), np.exp(b[idx]), f_a[idx], f_b[idx],
            np.maximum(res[idx], NOISE), c, out)
    return c, out


def _secant(fn, idx, a, b, f_a, f_b, tol, c, out) -> None:
    """Dekker's method in the brackets ``[a, b]`` (``a`` passes, ``b`` fails) of the rows
    ``idx`` to ``log(b / a) <= tol``: ``c[idx]`` = the lower end, ``out`` the values there."""
    x1, f1, x2, f2 = a, f_a, b, f_b
    at_a = {k: v[idx] for k, v in out.items()}
    last = prev = 2.0 * (b - a)            # the last two steps (the first secant step is free)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for _ in range(MAX_STEPS):
            if len(idx) == 0:
                return
            s = x2 - f2 * (x2 - x1) / (f2 - f1)
            bad = ~np.isfinite(s) | (s <= a) | (s >= b) | (np.abs(s - x2) > 0.5 * prev)
            s = np.where(bad, np.sqrt(a * b), s)
            # converged (a step under the tolerance): a step of half of it past the last point,
            # to the other side, closes the bracket
            step = x2 * (0.5 * tol)
            close = np.abs(s - x2) < step
            s = np.where(close, np.where(x2 == a, x2 + step, x2 - step), s)
            s = np.minimum(np.maximum(s, a * np.exp(0.5 * tol)), b * np.exp(-0.5 * tol))
            last, prev = np.where(bad, b - a, np.abs(s - x2)), last
            f, ok, got = fn(idx, s)
            a, b = np.where(ok, s, a), np.where(ok, b, s)
            at_a = _pick(ok, got, at_a)
            x1, f1, x2, f2 = x2, f2, s, f
            done = np.log(b / a) <= tol
            if np.any(done):
                c[idx[done]] = a[done]
                _put(out, idx[done], at_a, done)
                keep = ~done
                idx, a, b, tol, x1, f1, x2, f2, last, prev = (v[keep] for v in (
                    idx, a, b, tol, x1, f1, x2, f2, last, prev))
                at_a = {k: v[keep] for k, v in at_a.items()}
    c[idx] = a                             # (not reached: MAX_STEPS bounds a bisection)
    _put(out, idx, at_a)
