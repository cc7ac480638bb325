"""Serving metrics of an instance under continuous batching: latency, throughput, memory, cost.

An instance is ``tp * pp * dp`` chips holding one copy of the model. With ``pp`` stages the
``concurrency`` sequences are split into ``pp`` micro-batches that keep every stage busy, so each
sequence gets one token per ``pp`` stage steps: pipelining saves weight capacity, not time.

Steady state (phase 0): every step carries one decode token per sequence and, on average,
``concurrency * isl_new / osl`` prefill tokens (chunked prefill), so throughput counts the
prefill work and the TPOT is the mixed step. TTFT is the wait for the running step to end plus
the steps that carry this request's prefill chunks. The steps themselves (decode-only,
prompt-carrying, the TTFT chunk step) and TTFT are ``dse.perf.phases``; the memory fit and
feasibility ``dse.perf.memory_fit``; the KV tier's split and fetches ``dse.perf.tier_split``; the
request-rate path's probes ``dse.perf.queue_probe``. This module composes them into an
instance (``_instance``) and adds throughput, cost, the fleet and the disaggregated and queueing
compositions.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from dse.perf import (
    arch,
    frontend,
    kvtier,
    memory_fit,
    queue_probe,
    queueing,
    spec,
    tier_split,
)
from dse.perf.batch import Batch
from dse.perf.memory_fit import (
    BOUNDS,
    KNEE_FRACTION,
    REASONS,
    decode_bound,
    reason_text,
)
from dse.perf.phases import (
    Breakdown,
    PromptLoad,
    add,
    front_end_s,
    mean_steps,
    prompt_load,
    prompt_service_s,
    sequences,
    steps,
    times,
    ttft,
    ttft_closed_loop,
)
from dse.perf.step import OPS, Coefficients, StepTimes

METRICS = (
    "ttft_s", "ttft_unloaded_s", "tpot_s", "step_s", "output_tokens_per_s_per_user",
    "output_tokens_per_s_per_chip", "input_tokens_per_s_per_chip", "output_tokens_per_s_per_instance",
    "output_tokens_per_s_per_rack", "usd_per_chip_hour", "usd_per_mtok_output", "usd_per_mtok_input",
    "joules_per_output_token", "max_concurrent_sequences", "weights_bytes_per_chip",
    "kv_bytes_per_chip", "hbm_used_fraction", "kv_bytes_per_token", "total_params", "active_params",
    "dense_equivalent_params",
    "num_chips", "concurrency", "decode_compute_s", "decode_memory_s", "decode_network_s",
    "instances_per_rack", "instances_for_demand", "racks_for_demand", "usd_per_hour_for_demand",
    "bound", "feasible", "reason",
    # request-rate serving (dse.perf.queueing); NaN unless a rate or an SLO is given
    *queueing.NEW_METRICS,
    # speculative decoding (dse.perf.spec): output tokens per sequence per step
    "spec_expected_tokens",
    # length distributions (dse.perf.lengths): TTFT of a prompt at the 90th length percentile
    "ttft_p90_length_s",
    # the KV cache's element size (its dtype, stated rather than following the weights)
    "kv_bytes_per_element",
    # prefix cache and offload tier (dse.perf.kvtier): shares of the waiting conversations'
    # reusable prefixes held in the tier, and evicted (their hits recomputed)
    "kv_offloaded_fraction", "prefix_cache_evicted_fraction",
)

HOURS_PER_YEAR = 8766.0


def score(b: Batch, breakdown: bool = False, coefficients: Coefficients | None = None):
    """Score every row. Returns a dict of metric arrays (and the Breakdown when asked).

    Rows with ``disaggregated = 1`` are a decode instance (decode-only steps) fed by a pool of
    prefill instances with their own layout: see ``_disaggregated``. ``coefficients``: the
    step model's per-design constants of ``b``, when already known (``score_chunked``)."""
    dis = b.disaggregated > 0
    if not np.any(dis):
        return _fleet(b, _served(b, breakdown, coefficients), breakdown)
    out = _served_disaggregated(b, breakdown)
    if np.all(dis):
        return _fleet(b, out, breakdown)
    agg = _served(b, breakdown, coefficients)
    # a metric one kind of row lacks (the request-rate metrics of aggregated rows) is NaN there
    pick = lambda o, a: {k: np.where(dis, o.get(k, np.nan), a.get(k, np.nan))  # noqa: E731
                         for k in {**a, **o}}
    if not breakdown:
        return _fleet(b, pick(out, agg), False)
    m = pick(out[0], agg[0])
    return _fleet(b, (m, Breakdown(*(_pick(dis, getattr(out[1], f), getattr(agg[1], f))
                                     for f in ("decode", "mixed", "prefill")))), True)


def instances_per_rack(num_chips, rack_chips):
    """What "per rack" means, everywhere (the one definition): the whole instances of
    ``num_chips`` chips a rack of ``rack_chips`` holds, ``floor(rack_chips / num_chips)``; an
    instance that spans ``k = ceil(num_chips / rack_chips)`` racks counts ``1 / k`` per rack.
    ``output_tokens_per_s_per_rack`` is this times an instance's tokens/s."""
    whole = np.floor(rack_chips / num_chips)
    return np.where(whole >= 1, whole, 1.0 / np.ceil(num_chips / rack_chips))


def _full(v, n: int) -> np.ndarray:
    """``v``, a fresh array of this function's own computation, at full length ``n`` (copied
    only when it is shorter: a compact batch's length-1 terms)."""
    return v if np.shape(v) == (n,) else np.broadcast_to(v, (n,)).copy()


def _fleet(b: Batch, res, breakdown: bool):
    """What a demand of ``demand_output_tokens_per_s`` needs: whole instances, racks (whole
    instances per rack, or whole racks per instance when it spans several: ``instances_per_rack``),
    and their $/hour; and the output tokens/s of a rack of whole instances. NaN without a
    demand."""
    m = res[0] if breakdown else res
    n = len(b)
    # (in the batch's precision: a float32 run's NaN metrics are float32 too, half the memory
    # of the output's largest part, the metrics of mechanisms that are off)
    nan = np.full(n, np.nan, dtype=np.result_type(m["num_chips"], np.float32))
    chips = m["num_chips"]
    per_rack = instances_per_rack(chips, b.rack_chips)
    m["instances_per_rack"] = _full(per_rack, n)
    m["output_tokens_per_s_per_rack"] = _full(m["output_tokens_per_s_per_chip"] * chips * per_rack,
                                              n)
    if not np.any(b.demand_output_tokens_per_s > 0):     # no demand given: NaN, nothing to do
        for k in ("instances_for_demand", "racks_for_demand", "usd_per_hour_for_demand"):
            m[k] = nan
        m = {k: (m[k] if k in m else nan) for k in METRICS}
        return (m, res[1]) if breakdown else m
    demand = np.where(b.demand_output_tokens_per_s > 0, b.demand_output_tokens_per_s, np.nan)
    inst = np.ceil(demand / m["output_tokens_per_s_per_instance"])
    racks = np.where(per_rack >= 1, np.ceil(inst / per_rack), inst * np.ceil(chips / b.rack_chips))
    m["instances_for_demand"] = np.broadcast_to(inst, (n,)).copy()
    m["racks_for_demand"] = np.broadcast_to(racks, (n,)).copy()
    m["usd_per_hour_for_demand"] = np.broadcast_to(inst * chips * m["usd_per_chip_hour"],
                                                   (n,)).copy()
    m = {k: (m[k] if k in m else nan) for k in METRICS}     # a mechanism's metrics when off
    return (m, res[1]) if breakdown else m


def _served(b: Batch, breakdown: bool, k: Coefficients | None):
    """hook: request-rate serving (dse.perf.queueing) where a rate or an SLO is given."""
    if not (b.has_on("request_rate_per_s") or b.has_on("ttft_slo_s") or b.has_on("tpot_slo_s")):
        return _instance(b, breakdown, k)
    # the probe's float32 batch and coefficients; a float64 batch's rows at a rate take theirs
    # rounded from these (the per-design constants to ~6e-8: dse.perf.roots, a sixth pass),
    # not computed again in float64; its other rows (a fixed concurrency, an SLO only) keep
    # their float64 ones, the numbers they have scored without a rate beside them
    b32 = b.astype_lazy(np.float32)    # (its columns converted as read: ~half are)
    k32 = Coefficients(b32) if k is None else k.astype(b32)
    if b.n_layers.dtype != np.float32:
        n = len(b)
        rate = np.broadcast_to((b.request_rate_per_s > 0) & (b.phase == 0)
                               & (b.disaggregated == 0), (n,))
        up = k32.astype(b)
        if not np.all(rate):
            k = k.blend(up, ~rate) if k is not None else Coefficients(b).blend(up, ~rate)
        else:
            k = up
    else:
        k = k32
    cap = queue_probe.queue_cap(b)
    return queueing.serve(
        b, lambda c, bd: _instance(queue_probe.at_concurrency(b, c), bd, k, queue=True),
        breakdown, queue_probe.probe(b32, k32, None), cap)


def _served_disaggregated(b: Batch, breakdown: bool):
    """hook: the prefill and decode pools as queues (dse.perf.queueing) where a rate is given."""
    if not (b.has_on("request_rate_per_s") or b.has_on("ttft_slo_s") or b.has_on("tpot_slo_s")):
        return _disaggregated(b, breakdown)
    return queueing.serve_disaggregated(b, lambda c, r, bd: _disaggregated(
        b.replace(concurrency=c, prefill_chip_ratio=r), bd, queue=True), breakdown)


def _pick(mask, a, b):
    if isinstance(a, StepTimes):
        return StepTimes(*(np.where(mask, getattr(a, f.name), getattr(b, f.name))
                           for f in fields(StepTimes)))
    return np.where(mask, a, b)


def _disaggregated(b: Batch, breakdown: bool, queue: bool = False):
    """A decode instance (``tp, pp, ep, dp``; ``concurrency`` sequences; decode steps only) and
    its share of a prefill pool (instances of ``prefill_tp, ...`` chips that prefill
    ``prefill_concurrency`` prompts per step), ``prefill_chip_ratio`` prefill chips per decode
    chip (0: the ratio at which the prefill pool exactly keeps the decodes fed).

    The system serves the smaller of the two pools' request rates; the decode instance keeps its
    ``concurrency`` (its TPOT is the decode-only step at that batch: an upper bound when prefill is
    the bottleneck). TTFT = half a prefill pass of waiting + the prefill pass + moving the prompt's
    KV cache to the decode instance (over the scale-up domain when both instances fit in one,
    else over scale-out). Output tokens pay for the decode pool, input tokens for the prefill pool.
    """
    dec = _instance(b.replace(phase=2.0), breakdown)
    pre_b = b.replace(phase=1.0, tp=b.prefill_tp, pp=b.prefill_pp, ep=b.prefill_ep,
                      dp=b.prefill_dp, concurrency=b.prefill_concurrency)
    pre = _instance(pre_b, breakdown)
    (dm, dsteps), (pm, psteps) = (dec, pre) if breakdown else ((dec, None), (pre, None))
    chips_d = b.tp * b.pp * b.dp
    chips_p = b.prefill_tp * b.prefill_pp * b.prefill_dp
    osl = b.osl
    need = dm["output_tokens_per_s_per_chip"] / osl          # requests/s a decode chip takes
    give = pm["output_tokens_per_s_per_chip"]                # requests/s a prefill chip prefills
    balanced = need / np.maximum(give, 1e-30)
    ratio = np.where(b.prefill_chip_ratio > 0, b.prefill_chip_ratio, balanced)
    req = np.minimum(need, ratio * give)                     # per decode chip
    per_chip = 1.0 / (1.0 + ratio)
    out_chip = req * osl * per_chip
    in_chip = req * b.isl * per_chip
    # the prompt's KV moves to the decode instance, every chip sending its shard in parallel
    one_domain = chips_d + chips_p <= b.domain_chips
    link = np.where(one_domain, b.scaleup_bw_bytes_per_s * b.scaleup_fraction,
                    b.scaleout_bw_bytes_per_s * b.scaleout_fraction)
    lat = np.where(one_domain, b.scaleup_latency_s, b.scaleout_latency_s)
    kv_s = lat + arch.kv_bytes_per_token(b) * b.isl / (link * np.minimum(chips_d, chips_p))
    # the prompt waits half a prefill pass, runs one and moves its KV; the front end once
    ro = front_end_s(b)
    ttft = 1.5 * (pm["ttft_unloaded_s"] - ro) + kv_s + ro
    usd_s = dm["usd_per_chip_hour"] / 3600.0
    bits = dm["reason"] | pm["reason"]
    m = dict(dm)
    m.update({
        "ttft_s": ttft, "ttft_unloaded_s": ttft,
        "output_tokens_per_s_per_chip": out_chip,
        "input_tokens_per_s_per_chip": in_chip,
        "output_tokens_per_s_per_instance": req * osl * chips_d,
        "output_tokens_per_s_per_rack": out_chip * b.rack_chips,   # whole instances: _fleet
        "usd_per_mtok_output": usd_s / (req * osl) * 1e6,
        "usd_per_mtok_input": usd_s * ratio / (req * b.isl) * 1e6,
        "joules_per_output_token": b.power_w * b.pue / (req * osl),
        "num_chips": chips_d * (1.0 + ratio),
        "feasible": bits == 0,
        "reason": bits,
    })
    if queue:                            # hook: dse.perf.queueing (the prefill pool's queue)
        m.update({"_prefill_pass_s": pm["ttft_unloaded_s"] - ro, "_kv_transfer_s": kv_s,
                  "_prefill_instances": ratio * chips_d / chips_p})
    if not breakdown:
        return m
    return m, Breakdown(dsteps.decode, dsteps.mixed, psteps.prefill)


def _instance(b: Batch, breakdown: bool = False, k: Coefficients | None = None,
              queue: bool = False):
    """One instance under continuous batching (or a prefill-only / decode-only instance): its
    memory fit, its steps (``dse.perf.phases``), throughput, TTFT and TPOT, and cost.
    ``queue``: also the time one prompt holds the prefill budget (dse.perf.queueing)."""
    c = sequences(b)
    weights, kv_seq, act, max_c = memory_fit.memory(b)
    bits = memory_fit.invalid_bits(b, weights, act, max_c)
    b0, tier = b, None
    b, run = memory_fit.running(b, c, max_c)     # the sequences the runtime runs at once
    if kvtier.cache_on(b):               # hook: the prefix cache in HBM and the tier (dse.perf.kvtier)
        b, tier = tier_split.split(b, weights, kv_seq, act, run)
    # hook: speculative decoding / MTP (dse.perf.spec): verification steps of k+1 tokens per
    # sequence plus the k draft steps, yielding tok_step tokens per sequence on average
    on_spec = b.has_on("spec_tokens")
    tok_step = spec.tokens_per_step(b) if on_spec else 1.0
    load = prompt_load(b, tok_step if on_spec else None)
    st, (tc, tm, tn, shares), draft = steps(b, breakdown, load, k,
                                            b.spec_tokens + 1.0 if on_spec else None)
    t_decode, t_mixed, t_prefill = mean_steps(st, load, draft)
    ttft_extra = 0.0
    if tier is not None:                 # hook: prefix hits held in the tier (dse.perf.kvtier)
        t_mixed, ttft_extra, tier = tier_split.fetch(b, tier, load, t_mixed, t_prefill)
    service = prompt_service_s(b, t_decode, t_prefill, load)    # S: a prompt's hold on the budget
    metrics = _rates(b, run, tok_step, load, t_decode, t_mixed, t_prefill, ttft_extra, service,
                     None if run is c else c)
    metrics.update(memory_fit.fit_metrics(b, c, weights, kv_seq, act, max_c, bits))
    metrics.update({"decode_compute_s": tc, "decode_memory_s": tm, "decode_network_s": tn,
                    "bound": decode_bound(shares, bits, c, max_c, b.max_batch_size * b.dp)})
    if tier is not None:                 # where the waiting conversations' prefixes are
        metrics["kv_offloaded_fraction"] = tier.in_tier
        metrics["prefix_cache_evicted_fraction"] = np.maximum(1.0 - tier.in_hbm - tier.in_tier,
                                                              0.0)
    if queue:                            # hook: dse.perf.queueing (S of the M/D/1 prefill queue,
        # or of the front end where it is the busier serial server: dse.perf.frontend)
        metrics["_prefill_service_s"] = frontend.serial_service_s(b, service)
    n = len(b)
    for key, v in metrics.items():   # a compact batch's shared columns give length-1 metrics
        if np.shape(v) != (n,):
            metrics[key] = np.broadcast_to(v, (n,)).copy()
    if tier is not None and np.any(~tier.fetched & (tier.tokens > 0)):
        return _tier_recomputed(b0, tier, metrics, st, breakdown, k, queue)
    return (metrics, st) if breakdown else metrics


def _rates(b: Batch, c, tok_step, load: PromptLoad, t_decode, t_mixed, t_prefill,
           ttft_extra, service, clients=None) -> dict:
    """Throughput, latency and cost: a pass (pp mean steps) gives every sequence ``tok_step``
    tokens; what a phase does not produce is NaN, never a number that looks real (the masks
    are applied only where some row has such a phase: most batches have none). ``c``: the
    sequences running; ``clients``: the requests in flight where more wait
    (``memory_fit.running``)."""
    both, pre_only, dec_only = arch.phases(b)
    chips = b.tp * b.pp * b.dp
    pass_s = b.pp * t_mixed                     # one token for every sequence
    # the TPOT a client sees: the engine's, or the serial front end's streaming of the c
    # answers where it is slower (dse.perf.frontend); the instance delivers at that pace
    tpot = frontend.streamed_tpot(b, pass_s / tok_step, c)
    # tokens/s of the instance (first tokens when prefill)
    out_inst = c / tpot if frontend.on(b) else c * tok_step / pass_s
    in_inst = times(1.0 - dec_only, out_inst) * arch.blend(pre_only, b.isl, b.isl / b.osl)
    t_first, t_first_long = ttft(b, pass_s, t_prefill, load, ttft_extra)
    t_loop = ttft_closed_loop(b, t_first, service,
                              t_first + np.maximum(b.osl - 1.0, 0.0) * tpot, clients)
    usd_chip_h, usd_mtok_out, usd_mtok_in, joules_out = _cost(b, chips, t_decode, t_mixed,
                                                              out_inst, in_inst)
    no_decode = b.phase == 1
    if np.any(no_decode):
        tpot, usd_mtok_out, joules_out = (np.where(no_decode, np.nan, v) for v in
                                          (tpot, usd_mtok_out, joules_out))
    no_prefill = b.phase == 2
    if np.any(no_prefill):
        t_first, t_loop, usd_mtok_in = (np.where(no_prefill, np.nan, v)
                                        for v in (t_first, t_loop, usd_mtok_in))
    per_chip_out = out_inst / chips
    m = {"ttft_s": t_loop, "ttft_unloaded_s": t_first, "tpot_s": tpot, "step_s": t_mixed,
         "output_tokens_per_s_per_user": 1.0 / tpot,
         "output_tokens_per_s_per_chip": per_chip_out,
         "input_tokens_per_s_per_chip": in_inst / chips,
         "output_tokens_per_s_per_instance": out_inst,
         "output_tokens_per_s_per_rack": per_chip_out * b.rack_chips,   # whole instances: _fleet
         "usd_per_chip_hour": usd_chip_h, "usd_per_mtok_output": usd_mtok_out,
         "usd_per_mtok_input": usd_mtok_in, "joules_per_output_token": joules_out,
         "num_chips": chips}
    if b.has_on("spec_tokens"):
        m["spec_expected_tokens"] = tok_step
    if t_first_long is not None:         # the same queue, the longer prompt's own extra steps
        m["ttft_p90_length_s"] = np.where(b.phase == 2, np.nan, t_first_long - t_first + t_loop)
    return m


def _cost(b: Batch, chips, t_decode, t_mixed, out_inst, in_inst):
    """Ownership (capex written off + power) or rental per chip-hour, split between output
    and input tokens by the decode-only step's share of the mean step; energy per output
    token: ``(usd_per_chip_hour, usd_per_mtok_output, usd_per_mtok_input, joules)``."""
    both, pre_only, dec_only = arch.phases(b)
    own = b.capex_usd / (b.amortization_years * HOURS_PER_YEAR) \
        + b.power_w * b.pue * b.electricity_usd_per_kwh / 1000.0
    usd_chip_h = arch.blend(arch.flag(b.use_rental > 0, own), b.rental_usd_per_hour, own)
    usd_inst_s = usd_chip_h * chips / 3600.0
    decode_share = add(dec_only, times(both, np.minimum(t_decode / t_mixed, 1.0)))
    usd_mtok_out = usd_inst_s * decode_share / out_inst * 1e6
    usd_mtok_in = usd_inst_s * (1.0 - decode_share) / np.maximum(in_inst, 1e-30) * 1e6
    joules_out = b.power_w * b.pue * chips * decode_share / out_inst
    return usd_chip_h, usd_mtok_out, usd_mtok_in, joules_out


def _tier_recomputed(b0: Batch, tier: tier_split.Tier, metrics, st, breakdown, k, queue):
    """hook: where recomputing beats the link, the runtime does not keep hits in the tier: those
    rows score as without it (their tier's hits evicted and recomputed as prompt tokens)."""
    n = len(b0)
    keep = np.broadcast_to(tier.fetched | (tier.tokens <= 0), (n,))
    if not breakdown:                    # (those rows alone: tier_split.recomputing)
        rows, sub, ks = tier_split.recomputing(b0, keep, k)
        alt_m = _instance(sub, False, ks, queue)
        return {key: tier_split.scatter(v, keep, rows, alt_m[key]) for key, v in metrics.items()}
    alt = _instance(b0.replace(tier_bytes=np.where(keep, b0.tier_bytes, 0.0)), breakdown, k,
                    queue)
    alt_m = alt[0] if breakdown else alt
    metrics = {key: np.where(keep, v, alt_m[key]) for key, v in metrics.items()}
    if not breakdown:
        return metrics
    return metrics, Breakdown(*(_pick(keep, getattr(st, f), getattr(alt[1], f))
                                for f in ("decode", "mixed", "prefill")))


def score_chunked(b: Batch, chunk_rows: int = 32768, dtype=np.float64,
                  metrics: tuple | None = None, rows: np.ndarray | None = None,
                  direct: dict | None = None) -> dict:
    """``score`` in chunks of rows: the same numbers, bounded memory, better cache use.

    ``dtype=np.float32`` scores in single precision (relative error ~1e-6, about 1.6x faster),
    which is what the search strategies use. ``metrics``: keep only these (default: all).
    ``rows``/``direct``: ``b`` holds distinct rows and the designs are ``b.gather(rows,
    direct)`` (``Space.batch_parts``), gathered chunk by chunk.
    """
    if rows is not None:
        b = b.astype(dtype)
        kd = Coefficients(b)           # per distinct design, gathered with the rows

        def parts(sl):
            sub = b.gather(rows, direct, sl, dtype)
            return sub, kd.gather(rows[sl], sub)
        n = len(rows)
    else:
        n = len(b)

        def parts(sl):
            return b.take(sl).astype(dtype), None
    keep = METRICS if metrics is None else tuple(metrics)
    if n <= chunk_rows:
        sub, k = parts(slice(None))
        s = score(sub, coefficients=k)
        return {m: s[m] for m in keep}
    out = {}
    nan_only = {}        # metric -> dtype: NaN on every row so far (a mechanism that is off)
    for i in range(0, n, chunk_rows):
        sub, k = parts(slice(i, i + chunk_rows))
        part = score(sub, coefficients=k)
        for m in keep:
            v = part[m]
            if m not in out:
                if v.dtype.kind == "f" and np.isnan(v[0]) and bool(np.all(np.isnan(v))):
                    nan_only.setdefault(m, v.dtype)
                    continue
                out[m] = np.empty(n, dtype=v.dtype)
                if m in nan_only:
                    out[m][:i] = np.nan
                    del nan_only[m]
            out[m][i:i + len(v)] = v
    # the metrics that are NaN on every row share one array, as a single chunk's do (``_fleet``):
    # fresh output memory is a large part of the scorer's time
    shared = {}
    for m, dt in nan_only.items():
        if dt not in shared:
            shared[dt] = np.full(n, np.nan, dtype=dt)
        out[m] = shared[dt]
    return {m: out[m] for m in keep}


__all__ = ["BOUNDS", "KNEE_FRACTION", "Breakdown", "decode_bound", "instances_per_rack", "METRICS", "OPS", "REASONS", "reason_text", "score",
           "score_chunked"]
