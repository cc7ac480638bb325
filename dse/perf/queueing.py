"""Request-rate serving: concurrency from the rate, queueing percentiles, goodput under SLOs.

Requests arrive as a Poisson stream of ``request_rate_per_s`` at one instance. The model:

- **Concurrency from the rate** (Little's law on the model's own step times): a request stays
  ``R(C) = ttft(C) + osl * tpot(C)`` in the batch, so an instance at concurrency ``C`` serves
  ``lambda(C) = C / R(C)`` requests/s. ``lambda(C)`` rises with ``C`` (batching amortizes the
  weights), so the ``C`` of a rate is a root (below); the most the instance serves,
  ``lambda(C_max)`` at the largest concurrency that fits (memory, max_batch_size), is its
  saturation rate. A rate above it is infeasible.
- **Queueing for the prefill**: prompts go FIFO through the steps' prompt-token budget (chunked
  prefill); one prompt holds it ``S = pp * (new tokens / chunk) * t_prefill_step``. That is an
  M/D/1 queue at load ``rho = lambda * S``: Pollaczek-Khinchine mean wait
  ``W = rho S / (2 (1 - rho))``, and a tail ``P(wait > t) = c exp(-theta t)`` with the exact
  decay rate of M/D/1 (``rho (e^x - 1) = x``, ``x = theta S``: Cramer-Lundberg) and the
  prefactor ``c = W theta`` that gives the PK mean. p-quantile: ``ln(c / (1 - p)) / theta``
  (0 when ``c <= 1 - p``). tests/test_queueing.py checks it against a discrete-event
  simulation (within 6% at p99 for rho >= 0.5). ``rho >= 1`` is saturation.
- **TPOT percentile**: the number of requests in an infinite-server system with Poisson
  arrivals is Poisson (M/G/inf, any service time), so the batch a token sees has p90
  ``C + 1.2816 sqrt(C)``; ``tpot_p90_s`` is the TPOT at that batch (capped at C_max), a
  per-step (conservative) percentile of what a request's mean TPOT sees.
- **Goodput**: the highest rate at which p90 TTFT <= ``ttft_slo_s`` and p90 TPOT <=
  ``tpot_slo_s`` (an SLO of 0 is no constraint), a root in ``C`` (both percentiles rise with
  it), never above the saturation rate.

Pure numpy; ``evaluate(C)`` (dse.perf.serve) scores the instance at concurrency ``C``.

**How the roots are found.** ``serve_bisection`` is the definition: 24 bisection steps on log C
for each of the three roots (saturation, the rate's concurrency, goodput), every step the whole
model (~130 evaluations a design). ``serve`` finds the same roots (dse.perf.roots: a bracketed
secant, the same predicates) on the three quantities the queue reads (``queue_probe.queue_times``:
the unloaded TTFT, the TPOT and S, in float32, several concurrencies in one pass), and scores
the whole model once, at the concurrency found (in the batch's precision). Of goodput's two
bounds only the smaller is read: once a row's brackets show which, the other settles where it
stands (``_prune_goodput``). On dse.bench's 20,000 designs at a rate with both SLOs that is
~16.7 points of the queue's quantities asked a design (2 at C = 1 and the cap, ~6.9 saturation,
~3.2 the rate's concurrency, ~2.3 and ~1.1 goodput's TTFT and TPOT bounds, ~1.1 the finish;
~23.4 scored, the shared probe's grid as deep as the row that asks most) in 31 passes (the
rate's and goodput's roots ask one probe together). Where a quantity rises with C the answers agree to the bisection's resolution
(the roots' tolerance, dse.perf.roots' sixth pass: 1e-4 in log C, the rate's own 2e-5, so
every metric within ~1e-3, most within 1e-4); where it does not (a KV tier's
fetch-or-recompute switch, one more prefill chunk: ~0.5% of random catalog designs, 1.3% of
dse.bench's with its KV tier on) the bisection's answer is whichever crossing its midpoints
reach, and ``serve``'s may be another (tests/test_queueing_roots.py,
tests/test_queueing_vs_bisection.py). What the points cost, and what was tried to make them
cheaper: dse.perf.roots.
"""

from __future__ import annotations

import numpy as np

from dse.perf.phases import front_end_s
from dse.perf.roots import Probe, Root, solve

Z90 = 1.2815515655446004        # standard normal 90% quantile
ITERS = 24                      # bisection steps on log C: relative precision ~ 1e-6 of the range


def md1_mean_wait_s(rho, service_s) -> np.ndarray:
    """Pollaczek-Khinchine mean wait of an M/D/1 queue: rho S / (2 (1 - rho))."""
    rho = np.asarray(rho, dtype=float)
    ok = rho < 1.0
    r = np.where(ok, rho, 0.5)
    return np.where(ok, r * service_s / (2.0 * (1.0 - r)), np.inf)


def md1_decay(rho) -> np.ndarray:
    """x = theta * S, the root > 0 of rho (e^x - 1) = x (the M/D/1 wait's exponential tail)."""
    r = np.clip(np.asarray(rho, dtype=float), 1e-9, 1.0 - 1e-9)
    # both starts lie right of the root (f >= 0; e^x >= 1 + x + x^2/2 bounds the first, and
    # x = L + 2 ln(1 + L) + 1, L = ln(1/rho), has rho e^x = e (1 + L)^2 > 1 + x), where f is
    # convex and increasing; Halley's steps (f'' = rho e^x: one exp more than Newton's) reach
    # it in ~5 steps instead of Newton's ~10; expm1 keeps f exact as rho -> 1 (``_expm1``:
    # numpy's only below x = 0.5, where exp - 1 would lose it)
    big = np.log(1.0 / r)
    x = np.minimum(2.0 * (1.0 - r) / r, big + 2.0 * np.log1p(big) + 1.0)
    shape = x.shape
    x, r = x.ravel(), r.ravel()
    xi, ri, live = x, r, None
    for _ in range(40):
        ex = np.exp(xi)
        e = ri * ex
        f, d1 = ri * _expm1(xi, ex) - xi, e - 1.0
        step = f / (d1 - 0.5 * f * e / d1)
        xi = xi - step
        # (a row stops once its step changes x by less than 1e-12 of it, ~5 steps: its
        # answer depends on its own rho only, never on the rows it is solved with; the steps
        # go on with the rows still moving alone)
        keep = np.abs(step) > 1e-12 * np.abs(xi)
        if live is None:
            x = xi
            if keep.all():
                continue
            live = np.flatnonzero(keep)
        else:
            x[live] = xi
            live = live[keep]
        if not live.size:
            break
        xi, ri = x[live], r[live]
    return x.reshape(shape)


def _expm1(x, ex):
    """``expm1(x)`` from ``ex = exp(x)``: ``ex - 1`` where ``x >= 0.5`` (within a few ulps
    there), numpy's expm1 below (it has no SIMD loop: ~20 ns an element in float64, the
    largest part of a Halley step; ~half of dse.bench's queueing loads are below)."""
    out = ex - 1.0
    small = np.flatnonzero(x < 0.5)
    if small.size:
        out[small] = np.expm1(x[small])
    return out


def md1_wait_quantile_s(p, rho, service_s) -> np.ndarray:
    """p-quantile of the M/D/1 wait: ln(c / (1 - p)) / theta with c = W theta (PK mean W)."""
    return md1_wait_quantiles_s((p,), rho, service_s)[0]


def md1_wait_quantiles_s(ps, rho, service_s) -> tuple:
    """``md1_wait_quantile_s`` at each of the quantiles ``ps``, the decay solved once (the
    same numbers: ``md1_decay`` is most of a quantile's time)."""
    rho = np.asarray(rho, dtype=float)
    ok = rho < 1.0
    theta = md1_decay(rho) / np.maximum(service_s, 1e-300)
    c = np.minimum(md1_mean_wait_s(np.where(ok, rho, 0.5), service_s) * theta, 1.0)
    out = []
    for p in ps:
        q = np.where(c > 1.0 - p, np.log(np.maximum(c, 1e-300) / (1.0 - p)) / theta, 0.0)
        out.append(np.where(ok, np.where(rho > 0, q, 0.0), np.inf))
    return tuple(out)


def bisect_increasing(fn, target, lo, hi, iters: int = ITERS):
    """Per row, the largest ``C`` in [lo, hi] (bisection on log C) with ``fn(C) <= target``,
    ``fn`` increasing in ``C``; ``lo`` where even ``lo`` fails."""
    a, b = np.log(lo), np.log(np.maximum(hi, lo))
    for _ in range(iters):
        m = 0.5 * (a + b)
        ok = fn(np.exp(m)) <= target
        a, b = np.where(ok, m, a), np.where(ok, b, m)
    return np.exp(a)


def poisson_p90(c) -> np.ndarray:
    """p90 of the number in an M/G/inf system of mean ``c`` (normal approximation)."""
    return c + Z90 * np.sqrt(c)


def _serve_rate(m: dict, by_rate, out_tokens_per_s) -> None:
    """Rows served at a request rate deliver ``out_tokens_per_s`` (lambda x osl) instead of
    the instance's saturated output: scale the rates up and the per-token costs down by it."""
    f = np.where(by_rate, out_tokens_per_s / m["output_tokens_per_s_per_instance"], 1.0)
    for k in ("output_tokens_per_s_per_chip", "input_tokens_per_s_per_chip",
              "output_tokens_per_s_per_instance", "output_tokens_per_s_per_rack"):
        m[k] = m[k] * f
    for k in ("usd_per_mtok_output", "usd_per_mtok_input", "joules_per_output_token"):
        m[k] = m[k] / f


def serve_bisection(b, evaluate, breakdown: bool = False):
    """The instance at its request rate (rows with ``request_rate_per_s > 0``; the others at
    their concurrency), with percentiles and goodput. ``evaluate(C, breakdown)`` scores the
    instance at concurrency ``C`` (its metrics carry ``_prefill_service_s``, S above).

    Only aggregated continuous batching (phase "both") queues; other rows get NaN."""
    n = len(b)
    osl = b.osl
    base = evaluate(np.maximum(b.concurrency, 1.0), False)
    cap = np.maximum(base["max_concurrent_sequences"], 1.0)

    def rate(m, c):       # (the request's own TTFT: the queue wait is what is solved for)
        return c / (m["ttft_unloaded_s"] + osl * m["tpot_s"])

    def rho(c):
        m = evaluate(c, False)
        return rate(m, c) * m["_prefill_service_s"]

    # saturation: the largest concurrency that fits and keeps the prefill queue stable
    c_sat = bisect_increasing(rho, 1.0 - 1e-6, np.ones(n), cap)
    lam_sat = rate(evaluate(c_sat, False), c_sat)
    lam = np.broadcast_to(b.request_rate_per_s, (n,))
    queue = np.broadcast_to((b.phase == 0) & (b.disaggregated == 0), (n,))
    by_rate = (lam > 0) & queue
    c_op = np.where(by_rate, bisect_increasing(lambda c: rate(evaluate(c, False), c), lam,
                                                np.ones(n), c_sat), b.concurrency)
    c_op = np.broadcast_to(c_op, (n,))

    def percentiles(c, lam_c):
        m = evaluate(c, False)
        r = lam_c * m["_prefill_service_s"]
        s = m["_prefill_service_s"]
        tp = evaluate(np.minimum(poisson_p90(c), c_sat), False)["tpot_s"]
        return m, *md1_wait_quantiles_s((0.9, 0.99), r, s), \
            md1_mean_wait_s(r, s), tp

    res = evaluate(c_op, breakdown)
    m = dict(res[0] if breakdown else res)
    lam_op = np.where(by_rate, lam, rate(m, c_op))
    _, w90, w99, wmean, tp90 = percentiles(c_op, lam_op)
    # everything that arrives is served: lambda x osl output tokens/s (the steady-state model
    # counts a token per sequence per step, also for those still in their prefill)
    _queue_metrics(m, by_rate, lam * osl, (wmean, w90, w99, tp90), (lam, lam_op, lam_sat, queue))
    slo_t, slo_p = b.ttft_slo_s, b.tpot_slo_s

    def worst(c):
        mc, q90, _, _, tpc = percentiles(c, rate(evaluate(c, False), c))
        return np.maximum(_over_slo(mc["ttft_unloaded_s"] + q90, slo_t), _over_slo(tpc, slo_p))

    _goodput(m, n, slo_t, slo_p, worst, lambda c: rate(evaluate(c, False), c), c_sat, lam_sat)
    nan = np.full(n, np.nan)
    for k in NEW_METRICS:
        m[k] = np.where(queue, np.broadcast_to(m.get(k, nan), (n,)), nan)
    m["concurrency"] = np.where(queue, c_op, m["concurrency"])
    m.pop("_prefill_service_s", None)
    return (m, res[1]) if breakdown else m


SATURATED = 1.0 - 1e-6          # the prefill queue's load at saturation
# the rate's root (the operating point every reported metric is scored at) to 2e-5 in log C:
# its queue waits near saturation move ~50 times its C (1 / (1 - rho)); the other roots feed
# well-conditioned numbers (the saturation rate, goodput) and take roots.NOISE (1e-4)
RATE_NOISE = 2e-5


def serve(b, evaluate, breakdown: bool = False, times=None, cap=None):
    """``serve_bisection``'s numbers (to its resolution; dse.perf.roots says where a quantity
    that is not monotone may give another crossing), its bisections found by
    ``roots.solve`` on the queue's quantities alone: ``times(rows)`` (``rows`` None: all) gives
    a function of those rows' concurrency returning ``(ttft_unloaded_s, tpot_s,
    _prefill_service_s)`` as ``evaluate`` gives them (dse.perf.serve: in float32), ``cap`` the
    ``max_concurrent_sequences`` of ``evaluate(max(concurrency, 1))``; ``evaluate`` scores the
    instance once, at the concurrency found (the p90 TPOT and the goodput at the TPOT's bound
    are ``times``' too: float32, ~1e-7 relative, dse.perf.roots' sixth pass). Without
    ``times``: ``serve_bisection``."""
    if times is None:
        return serve_bisection(b, evaluate, breakdown)
    n = len(b)
    lam = np.broadcast_to(b.request_rate_per_s, (n,))
    queue = np.broadcast_to((b.phase == 0) & (b.disaggregated == 0), (n,))
    by_rate = (lam > 0) & queue
    osl = np.broadcast_to(b.osl, (n,)).astype(np.float64)
    probe, rows, ones = Probe(times, n), np.arange(n), np.ones(n)
    cap = np.maximum(np.broadcast_to(cap, (n,)), 1.0)
    one, top = (_point(osl, rows, c, v) for c, v in zip(
        (ones, cap), probe([(rows, ones), (rows, cap)])))
    # saturation: the largest concurrency that fits and keeps the prefill queue stable
    sat = Root(probe, _test(osl, "rho", SATURATED), ones, cap, _at(one, "rho", SATURATED),
               _at(top, "rho", SATURATED), queue, _guesses(one["rho"], top["rho"], cap, SATURATED),
               keep=_POINT)
    solve([sat])
    # (the queue's other quantities there from these, as the probe's test computed them)
    c_sat, at_sat = sat.c, _point(osl, rows, sat.out["c"], [sat.out[k] for k in _POINT[1:]])
    lam_sat = at_sat["rate"]
    shared = Probe(times, n)          # (the three roots' points: one pass a step)
    op = Root(shared, _test(osl, "rate", lam), ones, c_sat, _at(one, "rate", lam),
              _at(at_sat, "rate", lam), by_rate, _guesses(one["rate"], at_sat["rate"], c_sat, lam),
              keep=(), noise=RATE_NOISE)   # (its concurrency alone is read)
    good = _goodput_roots(b, shared, osl, queue, one, c_sat, at_sat)
    solve([op] + good, (lambda: _prune_goodput(*good, c_sat)) if good else None)
    c_op = np.where(by_rate, op.c, b.concurrency)
    res = evaluate(c_op, breakdown)
    m = dict(res[0] if breakdown else res)
    lam_op = np.where(by_rate, lam, _rate(m, c_op, osl))
    s_op = m["_prefill_service_s"]
    r_op = lam_op * s_op
    tp90 = np.array(m["tpot_s"], dtype=np.float64)
    at_p = _finish_goodput(m, b, Probe(times, n), good, by_rate, c_op, c_sat, tp90,
                           osl, lam_sat)
    w90, w99 = md1_wait_quantiles_s((0.9, 0.99), r_op, s_op)
    wmean = md1_mean_wait_s(r_op, s_op)
    _queue_metrics(m, by_rate, lam * osl, (wmean, w90, w99, tp90), (lam, lam_op, lam_sat, queue))
    if at_p is not None:
        m["goodput_requests_per_s_per_chip"] = at_p / m["num_chips"]
    nan = np.full(n, np.nan)
    for k in NEW_METRICS:
        m[k] = np.where(queue, np.broadcast_to(m.get(k, nan), (n,)), nan)
    m["concurrency"] = np.where(queue, c_op, m["concurrency"])
    m.pop("_prefill_service_s", None)
    return (m, res[1]) if breakdown else m


def _guesses(at_one, at_top, top, target):
    """Two first points for a root of ``v(C) = target`` from ``v`` at 1 and at ``top``: where
    it would be were ``v`` proportional to C (below the root where ``v`` grows less than C)
    and where a power law through both ends puts it (above it where ``v`` flattens)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        power = np.log(at_top / at_one) / np.log(top)
        return target / at_one, np.exp(np.log(target / at_one) / power)


def _rate(m, c, osl):
    """Little's law: the requests/s an instance at concurrency ``c`` serves (the request's own
    TTFT: the queue's wait is what is solved for)."""
    return c / (m["ttft_unloaded_s"] + osl * m["tpot_s"])


_POINT = ("c", "ttft", "tpot", "s")     # what ``_point`` computes the others from


def _point(osl, idx, c, vals) -> dict:
    """The queue's quantities of rows ``idx`` at concurrency ``c`` from the probe's values."""
    ttft, tpot, s = (np.asarray(v, dtype=np.float64) for v in vals)
    r = ttft + osl[idx] * tpot                      # the time a request stays in the batch
    rate = c / r
    return {"c": c, "r": r, "ttft": ttft, "tpot": tpot, "s": s, "rate": rate, "rho": rate * s}


def _at(p, key, target):
    """``(residual, passes, p)`` of the test ``p[key] <= target`` at the points ``p``; the
    residual about affine in C: ``c S - target R`` for the load, ``c - target R`` for the
    rate (``R`` the time a request stays, ``S`` its prefill service time), ``tpot - target``
    for the TPOT."""
    if key == "rho":
        r = p["c"] * p["s"] - target * p["r"]
    elif key == "rate":
        r = p["c"] - target * p["r"]
    else:
        r = p[key] - target
    return r, p[key] <= target, p


def _test(osl, key, target):
    """``Root``'s test ``point[key] <= target``."""
    target = np.asarray(target)
    return lambda idx, c, vals: _at(_point(osl, idx, c, vals), key,
                                    target[idx] if target.ndim else target)


def _goodput_roots(b, probe, osl, queue, one, c_sat, sat) -> list:
    """Goodput's two bounds where an SLO is given, as ``_goodput``'s bisection on both p90s
    finds their smaller: the batch ``x`` whose TPOT meets the TPOT SLO (the p90 TPOT is the
    TPOT at the batch's Poisson p90, at most ``c_sat``) and the concurrency whose p90 TTFT
    (the request's own and its prefill queue's p90 wait) meets the TTFT SLO, up to ``c_sat``
    (``one``, ``sat``: the queue's quantities at C = 1 and at ``c_sat``)."""
    n = len(c_sat)
    slo_t = np.broadcast_to(b.ttft_slo_s, (n,))
    slo_p = np.broadcast_to(b.tpot_slo_s, (n,))
    has_slo = ((slo_t > 0) | (slo_p > 0)) & queue
    if not np.any(has_slo):
        return []
    on_t, on_p = has_slo & (slo_t > 0), has_slo & (slo_p > 0)
    st = np.where(on_t, slo_t, 1.0)

    def at(idx, p):
        over = (p["ttft"] + md1_wait_quantile_s(0.9, p["rho"], p["s"])) / st[idx]
        ok = over <= 1.0
        with np.errstate(invalid="ignore"):
            # (times 1 - rho: finite as the queue saturates)
            g = np.where(p["rho"] < 1.0, (over - 1.0) * (1.0 - p["rho"]), np.inf)
        return g, ok, {"rate": p["rate"], "ok": ok}
    ones, rows = np.ones(n), np.arange(n)
    # (its residual, the p90 wait's overshoot times 1 - rho, is nearer affine in log C: its
    # secant there asked 47k points on dse.bench's queueing designs, 72k in C)
    ttft = Root(probe, lambda idx, c, vals: at(idx, _point(osl, idx, c, vals)), ones, c_sat,
                at(rows, one), at(rows, sat), on_t, log_secant=True)
    tpot = Root(probe, _test(osl, "tpot", slo_p), ones, c_sat, _at(one, "tpot", slo_p),
                _at(sat, "tpot", slo_p), on_p, keep=())
    ttft.has_slo, ttft.on, tpot.binds = has_slo, on_t, on_p & ~(sat["tpot"] <= slo_p)
    ttft.sat_rate = sat["rate"]
    return [ttft, tpot]


def _prune_goodput(ttft, tpot, c_sat) -> None:
    """Settle the goodput bound that no longer matters (``_finish_goodput`` reads the smaller of
    the two; each open row's answer lies in its bracket ``[a, b)``): the TTFT's where the
    TPOT's concurrency is below its bracket (or its goodput is 0 there), the TPOT's where it is
    above the TTFT's (or at least ``c_sat``) and at least 1. The numbers are those of solving
    both (the settled root's value is not read)."""
    if not (ttft.active() or tpot.active()):
        return
    # where the TPOT's bound lies (concurrency): [lo_p, hi_p]; the TTFT's [lo_t, hi_t] (each
    # at the other's open rows only, both before either settles)
    if tpot.active():
        i = tpot.idx
        lo_p = poisson_p90_inverse(tpot.a)
        hi_t = _at_rows(i, ttft.idx, ttft.b, lambda r: np.where(ttft.on[r], ttft.c[r], np.inf))
        gone_t = _at_rows(i, ttft.idx, np.zeros(len(ttft.idx), bool),
                          lambda r: ttft.on[r] & ~np.asarray(ttft.out["ok"][r], bool))
        done_p = (((lo_p > hi_t) | (lo_p >= c_sat[i])) & (lo_p >= 1.0)) | gone_t
    if ttft.active():
        hi_p = poisson_p90_inverse(_at_rows(ttft.idx, tpot.idx, tpot.b, lambda r: np.where(
            tpot.binds[r], tpot.c[r], np.inf)))
        ttft.settle((hi_p < ttft.a) | (hi_p < 1.0))  # (no goodput: the TPOT fails at C = 1)
    if tpot.active():
        tpot.settle(done_p)


def _at_rows(rows, open_rows, at_open, settled):
    """Per row of ``rows``: ``at_open`` where the row is one of ``open_rows``, else
    ``settled(those rows)``."""
    out = settled(rows)
    if len(open_rows):
        pos = np.full(max(int(rows.max(initial=-1)), int(open_rows.max())) + 1, -1)
        pos[open_rows] = np.arange(len(open_rows))
        at = pos[rows]
        hit = at >= 0
        if np.any(hit):
            out = np.array(out)
            out[hit] = at_open[at[hit]]
    return out


def _finish_goodput(m, b, probe, good, by_rate, c_op, c_sat, tp90, osl, lam_sat):
    """The p90 TPOT at the operating point (into ``tp90``) and the goodput (requests/s per
    instance, NaN without an SLO; None: no row has one) from ``_goodput_roots``' bounds: the
    smaller of the TTFT's and the concurrency whose p90 batch is the TPOT's, at its own rate."""
    op = np.flatnonzero(by_rate)
    asks = [(op, np.minimum(poisson_p90(c_op[op]), c_sat[op]))]
    if good:
        ttft, tpot = good
        on_t = ttft.on
        c_t = np.where(on_t, ttft.c, np.inf)
        ok_t = np.where(on_t, ttft.out["ok"], True)
        rate_t = np.where(on_t, ttft.out["rate"], ttft.sat_rate)
        c_p = np.where(tpot.binds, poisson_p90_inverse(tpot.c), np.inf)
        ok = ttft.has_slo & ok_t & (c_p >= 1.0)
        at_p = np.flatnonzero(ok & (c_p < np.minimum(c_t, c_sat)))
        asks.append((at_p, c_p[at_p]))
    # one pass per ask (each on its own rows: the operating points are most rows, the TPOT's
    # bounds a few, and a pass of both on every row costs two of the model in float64)
    got = [probe([a])[0] if len(a[0]) else None for a in asks]
    if len(op):
        tp90[op] = np.asarray(got[0][1], dtype=np.float64)
    if not good:
        return None
    rate = rate_t.copy()
    if len(at_p):
        rate[at_p] = _point(osl, at_p, c_p[at_p], got[1])["rate"]
    return np.where(ttft.has_slo, np.minimum(np.where(ok, rate, 0.0), lam_sat), np.nan)


def poisson_p90_inverse(x) -> np.ndarray:
    """The mean ``c`` whose ``poisson_p90`` is ``x``: ``sqrt(c) = (sqrt(z^2 + 4 x) - z) / 2``."""
    r = 0.5 * (np.sqrt(Z90 * Z90 + 4.0 * np.asarray(x, dtype=float)) - Z90)
    return r * r


def _over_slo(value, slo):
    """``value / slo`` where an SLO is given, else 0."""
    return np.where(slo > 0, value / np.where(slo > 0, slo, 1.0), 0.0)


def _queue_metrics(m: dict, by_rate, out_tokens_per_s, waits, rates) -> None:
    """The served rate and the TTFT/TPOT metrics of the operating point (in place): at a rate
    the request's own TTFT plus the Poisson queue's wait (``waits`` = mean, p90, p99 wait and
    the p90 TPOT); at a fixed concurrency the closed loop's mean
    (dse.perf.phases.ttft_closed_loop) and its unloaded TTFT as the tails. ``rates``: the
    arguments of ``_rate_metrics`` after ``by_rate``."""
    wmean, w90, w99, tp90 = waits
    _serve_rate(m, by_rate, out_tokens_per_s)
    own, loop = m["ttft_unloaded_s"], m["ttft_s"]
    m["ttft_s"] = np.where(by_rate, own + wmean, loop)
    m["ttft_queue_wait_s"] = np.where(by_rate, wmean, loop - own)
    m["ttft_p90_s"] = np.where(by_rate, own + w90, loop)
    m["ttft_p99_s"] = np.where(by_rate, own + w99, loop)
    m["tpot_p90_s"] = np.where(by_rate, tp90, m["tpot_s"])
    _rate_metrics(m, by_rate, *rates)


def _rate_metrics(m: dict, by_rate, lam, lam_op, lam_sat, queue) -> None:
    """The request rate served and the saturation rate; a rate above saturation is infeasible
    (reason 128) on the rows that queue."""
    m["requests_per_s_per_instance"] = lam_op
    m["saturation_requests_per_s_per_instance"] = lam_sat
    over = by_rate & (lam > lam_sat * (1.0 + 1e-6))
    m["reason"] = m["reason"] | np.where(over & queue, 128, 0)
    m["feasible"] = m["reason"] == 0


def _goodput(m: dict, n: int, slo_t, slo_p, worst, rate_at, c_max, lam_sat) -> None:
    """Goodput where an SLO is given: the largest concurrency (up to ``c_max``) whose p90s meet
    the SLOs (``worst(c) <= 1``), at its own rate ``rate_at(c)``, at most the saturation rate,
    per chip."""
    has_slo = (slo_t > 0) | (slo_p > 0)
    if not np.any(has_slo):
        return
    c_good = bisect_increasing(worst, 1.0, np.ones(n), c_max)
    good = np.where(worst(c_good) <= 1.0, rate_at(c_good), 0.0)
    m["goodput_requests_per_s_per_chip"] = np.where(has_slo, np.minimum(good, lam_sat),
                                                    np.nan) / m["num_chips"]


NEW_METRICS = ("ttft_queue_wait_s", "ttft_p90_s", "ttft_p99_s", "tpot_p90_s", "requests_per_s_per_instance",
               "saturation_requests_per_s_per_instance", "goodput_requests_per_s_per_chip")


def _prefill_ratio(b, evaluate, cap):
    """Prefill chips per decode chip: as given, or (blank) the ratio that keeps the decodes fed
    at the decode pool's saturation ``cap``."""
    given = np.broadcast_to(b.prefill_chip_ratio, (len(b),))
    if not np.any(given <= 0):
        return given
    sat = evaluate(cap, given, False)
    chips_d = b.tp * b.pp * b.dp
    return np.where(given > 0, given, sat["num_chips"] / chips_d - 1.0)


def serve_disaggregated(b, evaluate, breakdown: bool = False):
    """Disaggregated rows at their request rate: the decode pool and the prefill pool are each a
    queue. ``evaluate(C, ratio, breakdown)`` scores the decode instance at concurrency ``C`` with
    ``ratio`` prefill chips per decode chip (dse.perf.serve._disaggregated; its metrics carry
    ``_prefill_pass_s``, ``_kv_transfer_s``, ``_prefill_instances``).

    - **Decode pool** (Little's law): a sequence holds the decode instance for ``osl * tpot(C)``,
      so it takes ``C / (osl tpot(C))`` requests/s; the ``C`` of a rate by bisection, saturation
      at the largest ``C`` that fits. A blank ``prefill_chip_ratio`` sizes the prefill pool to
      keep the decodes fed at that saturation.
    - **Prefill pool**: ``m`` prefill instances, each prefilling ``B`` prompts per pass of ``T``
      seconds, taken as one FIFO server of per-request service ``S = T / (B m)`` (an M/D/1
      queue at load ``rho = lambda S``: the PK mean and the M/D/1 tail as above); a request's
      TTFT = its wait + its own prefill pass + moving its KV to the decode instance.
    - Saturation: the smaller of the decode pool's and the prefill pool's rates; above it a row
      is infeasible (reason 128). ``tpot_p90_s`` is the TPOT at the Poisson p90 of the decode
      batch; goodput as for aggregated rows, by bisection on the decode concurrency.
    """
    n = len(b)
    osl = b.osl
    lam = np.broadcast_to(b.request_rate_per_s, (n,))
    base = evaluate(np.maximum(b.concurrency, 1.0), b.prefill_chip_ratio, False)
    cap = np.maximum(base["max_concurrent_sequences"], 1.0)
    ratio = _prefill_ratio(b, evaluate, cap)

    def dec_rate(m, c):
        return c / (osl * m["tpot_s"])

    def prefill_queue(m, lam_c):
        s = m["_prefill_pass_s"] / (np.maximum(b.prefill_concurrency, 1.0)
                                    * np.maximum(m["_prefill_instances"], 1e-30))
        return lam_c * s, s

    top = evaluate(cap, ratio, False)
    lam_sat = np.minimum(dec_rate(top, cap), 1.0 / prefill_queue(top, 1.0)[1])
    by_rate = lam > 0
    c_op = np.where(by_rate, bisect_increasing(lambda c: dec_rate(evaluate(c, ratio, False), c),
                                               lam, np.ones(n), cap), b.concurrency)
    res = evaluate(c_op, ratio, breakdown)
    m = dict(res[0] if breakdown else res)
    lam_op = np.where(by_rate, lam, dec_rate(m, c_op))

    ro = front_end_s(b)

    def percentiles(mc, c, lam_c):
        r, s = prefill_queue(mc, lam_c)
        own = mc["_prefill_pass_s"] + mc["_kv_transfer_s"] + ro
        tp = evaluate(np.minimum(poisson_p90(c), cap), ratio, False)["tpot_s"]
        w90, w99 = md1_wait_quantiles_s((0.9, 0.99), r, s)
        return own + md1_mean_wait_s(r, s), own + w90, own + w99, md1_mean_wait_s(r, s), tp

    ttft, p90, p99, wmean, tp90 = percentiles(m, c_op, lam_op)
    _serve_rate(m, by_rate, lam * osl)
    m["ttft_s"] = np.where(by_rate, ttft, m["ttft_s"])
    m["ttft_queue_wait_s"] = np.where(by_rate, wmean, np.nan)
    m["ttft_p90_s"] = np.where(by_rate, p90, np.nan)
    m["ttft_p99_s"] = np.where(by_rate, p99, np.nan)
    m["tpot_p90_s"] = np.where(by_rate, tp90, np.nan)
    _rate_metrics(m, by_rate, lam, lam_op, lam_sat, True)
    slo_t, slo_p = b.ttft_slo_s, b.tpot_slo_s

    def worst(c):
        mc = evaluate(c, ratio, False)
        _, q90, _, _, tpc = percentiles(mc, c, dec_rate(mc, c))
        return np.maximum(_over_slo(q90, slo_t), _over_slo(tpc, slo_p))

    _goodput(m, n, slo_t, slo_p, worst, lambda c: dec_rate(evaluate(c, ratio, False), c), cap,
             lam_sat)
    m["concurrency"] = np.where(by_rate, c_op, m["concurrency"])
    for k in ("_prefill_pass_s", "_kv_transfer_s", "_prefill_instances"):
        m.pop(k, None)
    return (m, res[1]) if breakdown else m
