"""The request-rate path's fast root finding (dse/perf/roots.py, queueing.serve) against the
bisection it replaces (queueing.serve_bisection, the definition), and the lean times it runs on
(queue_probe.queue_times) against the full instance.

Tolerance: where the quantity a bisection tests is monotone, the same concurrency to the
bisection's resolution or 1e-6 (log C; the roots run on float32 times), so every metric within
1e-4 relative. Where it is not monotone (a KV tier's fetch-or-recompute switch, one more
prefill chunk) the bisection's answer is whichever crossing its midpoints lead to, and the
secant may land on another: about 0.5% of random catalog designs at a request rate.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch

from dse.perf import queue_probe, queueing, roots, score
from dse.perf import serve as serve_mod
from dse.perf.batch import Batch
from dse.perf.step import Coefficients

L70 = {"accelerator.id": "h100-sxm", "model.id": "llama-3.1-70b", "model.weight_dtype": "fp8",
       "layout.tp": 4, "workload.isl": 2048, "workload.osl": 256}
DESIGNS = [
    L70,
    {**L70, "accelerator.id": "h200-sxm", "workload.isl": 8192, "workload.osl": 1024},
    {**L70, "layout.tp": 8, "layout.pp": 2, "workload.isl": 1024, "workload.osl": 2048},
    {"accelerator.id": "gb200", "model.id": "deepseek-v3", "model.weight_dtype": "fp8",
     "layout.dp": 8, "layout.ep": 8, "workload.isl": 2048, "workload.osl": 1024},
    {"accelerator.id": "b200", "model.id": "mixtral-8x7b", "layout.tp": 2, "layout.ep": 2,
     "workload.isl": 4096, "workload.osl": 512},
    {"accelerator.id": "mi300x", "model.id": "llama-3.1-8b", "workload.isl": 16384,
     "workload.osl": 128},
]
RATE_SLOS = [(0.5, 2.0, 0.05), (4.0, 1.0, 0.03), (20.0, 10.0, 0.2), (2.0, 2.0, 0.0),
             (1.0, 0.0, 0.05), (1e4, 2.0, 0.05), (0.0, 2.0, 0.05)]


# the serving mechanisms (as dse.bench switches them on): the lean times must follow each hook
MECHANISMS = {"spec_tokens": 2.0, "spec_acceptance": 0.8, "spec_mtp_layers": 1.0,
              "expert_imbalance": 1.3, "redundant_experts": 8.0, "isl_cv": 0.5, "osl_cv": 1.0,
              "tier_bytes": 250e9, "tier_bw_bytes_per_s": 64e9, "prefix_tokens": 64.0,
              "prefix_hit_fraction": 0.5, "cached_conversations": 256.0}


def _rows():
    return [{**d, "workload.request_rate_per_s": r, "workload.ttft_slo_s": t,
             "workload.tpot_slo_s": p} for d in DESIGNS for r, t, p in RATE_SLOS]


def _both(b):
    fast = score(b)
    orig = queueing.serve
    queueing.serve = lambda bb, ev, bd=False, *fast: \
        queueing.serve_bisection(bb, ev, bd)
    try:
        ref = score(b)
    finally:
        queueing.serve = orig
    return fast, ref


@pytest.mark.parametrize("mechanisms", [{}, MECHANISMS])
def test_fast_roots_give_the_bisections_numbers(mechanisms):
    b = batch(_rows()).replace(**mechanisms)
    fast, ref = _both(b)
    assert sorted(fast) == sorted(ref)
    # roots.py: where the time per request is not monotone in the concurrency (here a decode
    # all-reduce that steps up 31% between C = 20.25 and 20.5 on an h200 llama-3.1-70b row at
    # 2 requests/s with a KV tier), the rate's equation C = R x time(C) has more than one root
    # and the bisection's midpoints may lead to another one. Such a row may differ, at most
    # one, and only as another root of the same equation: its residual is the bisection's.
    c_f, c_r = np.asarray(fast["concurrency"], float), np.asarray(ref["concurrency"], float)
    other = ~np.isclose(c_f, c_r, rtol=1e-4) & (np.isfinite(c_f) & np.isfinite(c_r))
    # (at most two, was one: with the roots' tolerance of roots.py's sixth pass the secant's
    # path differs, and both of this sample's rows at that step, 10 and 17, land on another
    # root of the rate's equation, 7% and 1.3% from the bisection's)
    assert other.sum() <= 2, np.flatnonzero(other)
    rate, osl = np.asarray(b.request_rate_per_s, float), np.asarray(b.osl, float)
    res_f, res_r = (np.asarray(o["concurrency"], float) - rate * (
        np.asarray(o["ttft_s"], float) + (osl - 1) * np.asarray(o["tpot_s"], float))
        for o in (fast, ref))
    for i in np.flatnonzero(other):
        assert rate[i] > 0, i
        assert res_f[i] == pytest.approx(res_r[i], abs=1e-2 * c_r[i]), i
    same = ~other
    for k in ref:
        a, f = np.asarray(ref[k], float), np.asarray(fast[k], float)
        assert np.array_equal(np.isnan(a), np.isnan(f)), k
        ok = ~np.isnan(a) & same
        # (1e-3, was 1e-4: the roots' tolerance is 1e-4 in log C (the rate's 2e-5) since
        # roots.py's sixth pass, and a queue wait near saturation moves up to ~50 times C)
        np.testing.assert_allclose(f[ok], a[ok], rtol=1e-3, atol=1e-12, err_msg=k)


def test_lean_times_are_the_instances_own():
    # queue_probe.queue_times must stay serve._instance(queue=True)'s numbers (the roots run
    # on them)
    b = batch(_rows()).replace(**MECHANISMS)
    c = np.linspace(1.0, 300.0, len(b))
    for dtype in (np.float64, np.float32):
        bd = b.astype(dtype).replace(concurrency=c)
        k = Coefficients(bd)
        full = serve_mod._instance(bd, False, k, queue=True)
        lean = queue_probe.queue_times(bd, k)
        for key, v in zip(("ttft_unloaded_s", "tpot_s", "_prefill_service_s"), lean):
            np.testing.assert_array_equal(np.broadcast_to(v, (len(b),)), full[key], err_msg=key)


def test_several_concurrencies_in_one_pass_are_each_ones_own():
    b = batch(_rows()).astype(np.float32)
    k = Coefficients(b)
    cs = np.array([[1.0], [7.5], [300.0]]) * np.ones(len(b))
    both = queue_probe.queue_times(Batch({**b.columns, "concurrency": cs.astype(np.float32)}), k)
    for i, c in enumerate(cs):
        one = queue_probe.queue_times(b.replace(concurrency=c), k)
        for v2, v1 in zip(both, one):
            np.testing.assert_array_equal(np.broadcast_to(v2, cs.shape)[i], v1)


def _solve_like_bisection(fn, lo, hi, log_secant=False):
    n = len(lo)
    probe = roots.Probe(lambda rows: (lambda c: (fn(c, rows),)), n)

    def test(idx, c, vals):
        v = vals[0]
        return v, v <= 0.0, {"v": v}

    def at(c):
        v = fn(c, None)
        return v, v <= 0.0, {"v": v}
    r = roots.Root(probe, test, lo, hi, at(lo), at(hi), np.ones(n, bool), log_secant=log_secant)
    roots.solve([r])
    return r.c


@pytest.mark.parametrize("log_secant", [False, True])
def test_root_matches_bisection_on_smooth_kinked_and_jumping_functions(log_secant):
    rng = np.random.default_rng(0)
    n = 2000
    root = np.exp(rng.uniform(0.0, 8.0, n))
    lo, hi = np.ones(n), np.full(n, np.exp(8.5))
    kind = np.arange(n) % 3

    def fn(c, rows):
        r = root if rows is None else root[rows]
        k = kind if rows is None else kind[rows]
        smooth = np.log(c / r) * (1.0 + 0.3 * np.sin(c))
        kinked = np.maximum(c - r, 0.2 * (c - r)) / r
        jump = np.where(c < r, -1.0 + 0.01 * c / r, 1.0 + c / r)
        return np.where(k == 0, smooth, np.where(k == 1, kinked, jump))
    got = _solve_like_bisection(fn, lo, hi, log_secant)
    want = queueing.bisect_increasing(lambda c: fn(c, None), 0.0, lo, hi)
    assert np.all(fn(got, None) <= 0.0)                       # a point that passes
    # (the roots' tolerance, roots.NOISE: 1e-4 in log C since its sixth pass, 2e-6 before)
    np.testing.assert_allclose(got, want, rtol=1.01 * roots.NOISE)


def test_a_probe_packs_its_asks_by_row_and_each_gets_its_own_numbers():
    # asks on overlapping and disjoint rows share the points axis (a row's asks fill its slots
    # in turn): 3 asks over rows {0..5}, {3..8}, {6..9} are 2 points a row, not 3, and each ask
    # gets exactly what it would alone
    calls = []

    def at(rows):
        def fn(c):
            calls.append(np.shape(c))
            r = np.arange(10.0) if rows is None else np.asarray(rows, float)
            return (c * 10.0 + r, c - r)
        return fn
    asks = [(np.arange(0, 6), np.full(6, 2.0)), (np.arange(3, 9), np.full(6, 3.0)),
            (np.arange(6, 10), np.full(4, 5.0))]
    got = roots.Probe(at, 10)(asks)
    assert calls == [(2, 10)]
    for (idx, c), vals in zip(asks, got):
        np.testing.assert_array_equal(vals[0], c * 10.0 + idx)
        np.testing.assert_array_equal(vals[1], c - idx)


def test_a_probe_reads_a_value_the_same_at_every_point_of_a_row_and_a_taken_rows_own():
    # an output with one value a row (shape (rows,) or (1, rows): no concurrency in it) gives
    # each ask its rows' values, and a probe that took its rows (few asked of many) places
    # and reads them by their positions: rows 3, 7, 8 of 5,000 asked at 2 points each
    def at(rows):
        r = np.arange(5000.0) if rows is None else np.asarray(rows, float)

        def fn(c):
            return (c * 10.0 + r, 100.0 + r, (r * 2.0)[None, :])
        return fn
    idx = np.array([3, 7, 8])
    asks = [(idx, np.array([1.0, 2.0, 4.0])), (idx, np.array([8.0, 16.0, 32.0]))]
    probe = roots.Probe(at, 5000)
    got = probe(asks)
    np.testing.assert_array_equal(probe.rows, idx)           # (taken: 2 x 4,997 in vain)
    np.testing.assert_array_equal(got[0][0], [13.0, 27.0, 48.0])
    np.testing.assert_array_equal(got[1][0], [83.0, 167.0, 328.0])
    for vals in got:
        np.testing.assert_array_equal(vals[1], [103.0, 107.0, 108.0])
        np.testing.assert_array_equal(vals[2], [6.0, 14.0, 16.0])


def test_a_closed_bracket_is_the_logs_test_at_its_edge():
    # Root._closed decides log(b / a) <= tol by b / a against exp(tol), the log only within
    # 1e-9 of it: brackets a hair either side of the edge decide as the log does
    rng = np.random.default_rng(1)
    n = 4000
    on = np.ones(n, bool)
    lo, hi = np.ones(n), np.full(n, 1e4)
    at = (np.zeros(n), on, {}), (np.ones(n), ~on, {})
    r = roots.Root(roots.Probe(lambda rows: None, n), None, lo, hi, at[0], at[1], on)
    a = np.exp(rng.uniform(0.0, 8.0, n))
    edge = a * np.exp(r.tol)
    r.a, r.b = a, edge * (1.0 + rng.choice([-1e-8, -3e-16, 0.0, 2e-16, 1e-8], n))
    np.testing.assert_array_equal(r._closed(), np.log(r.b / r.a) <= r.tol)
    assert 0 < r._closed().sum() < n


def test_queue_times_carry_only_concurrency_free_memos():
    # the probe carries a batch's memos from pass to pass (weights, the KV pool's room, the
    # length distributions' factors...): a pass after others at other concurrencies gives the
    # numbers of a fresh batch at its own
    b = batch(_rows()).replace(**MECHANISMS).astype(np.float32)
    k = Coefficients(b)
    times = queue_probe.probe(b, k, np.float32)(None)
    for c in (3.0, 40.0, 700.0):
        times(np.full(len(b), c, np.float32))
    c = np.linspace(1.0, 300.0, len(b)).astype(np.float32)
    fresh = queue_probe.queue_times(b.replace(concurrency=c), Coefficients(b))
    for v, w in zip(times(c), fresh):
        np.testing.assert_array_equal(np.broadcast_to(v, (len(b),)), np.broadcast_to(w, (len(b),)))
