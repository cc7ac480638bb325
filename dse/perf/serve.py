"""Serving metrics of an instance under continuous batching: latency, throughput, memory, cost.

An instance is ``tp * pp * dp`` chips holding one copy of the model. With ``pp`` stages the
``concurrency`` sequences are split into ``pp`` micro-batches that keep every stage busy, so each
sequence gets one token per ``pp`` stage steps: pipelining saves weight capacity, not time.

Steady state (phase 0): every step carries one decode token per sequence and, on average,
``concurrency * isl_new / osl`` prefill tokens (chunked prefill), so throughput counts the
prefill work and the TPOT is the mixed step. TTFT is the wait for the running step to end plus
the steps that carry this request's prefill chunks. The steps themselves (decode-only,
prompt-carrying, the TTFT chunk step) and TTFT are ``dse.perf.phases``; this module adds the
memory fit, feasibility, throughput, cost, the fleet and the disaggregated and queueing
compositions.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from dse.perf import arch, frontend, kvtier, lengths, quality, queueing, spec
from dse.perf.batch import Batch
from dse.perf.phases import (
    Breakdown,
    PromptLoad,
    add,
    front_end_s,
    new_tokens,
    prompt_load,
    sequences,
    steps,
    times,
    prompt_service_s,
    ttft,
    ttft_closed_loop,
)
from dse.perf.step import OPS, Coefficients, StepTimes

BOUNDS = ("compute", "memory", "network", "capacity")
KNEE_FRACTION = 0.97    # a batch within 3% of the memory-limited maximum fills the HBM


def decode_bound(shares, bits, concurrency, max_sequences, max_batch):
    """What bounds a design's decoding, as an index of ``BOUNDS`` (the one definition: every
    command, ``predict`` and ``eval`` included, reports this).

    capacity (3): the KV cache of the requested batch does not fit in HBM (reason bit 16), or
    the batch fills the HBM (at least ``KNEE_FRACTION`` of the memory-limited maximum
    ``max_sequences``, which is below the runtime's cap ``max_batch``) while the decode step is
    not compute-bound: more HBM capacity would serve more sequences. Otherwise the resource
    that bounds the largest share of the decode step's op time (``shares``: the op time of the
    compute-, memory- and network-bound ops, ``step.bound_shares``; each op's bound is
    ``step.op_bound``): compute (0), memory (1) or network (2); ties go to memory, then
    compute. A step whose ops are mostly compute-bound is compute-bound, whatever the sum of
    one memory-heavy op's bytes.
    """
    sc, sm, sn = shares
    # op_bound on the shares, in bytes (widened once: 3 = 0b11, so "capacity" is an or over any
    # roof)
    net = np.asarray((sn > sc) & (sn > sm))
    mem = np.asarray((sm > sc) & (sm >= sn))
    roof = net.view(np.uint8) << np.uint8(1)
    roof |= mem.view(np.uint8)
    fills = (bits == 0) & (concurrency >= KNEE_FRACTION * max_sequences) \
        & (max_sequences < max_batch) & (net | mem)
    cap = ((bits & 16) != 0) | fills
    return (roof | cap.view(np.uint8) * np.uint8(3)).astype(np.int64)
# bit -> reason an infeasible row carries
REASONS = {
    1: "tp does not divide num_attention_heads",
    2: "ep must divide tp*dp, be at most num_experts, and be 1 for a dense model",
    4: "pp exceeds num_hidden_layers",
    8: "weights and runtime do not fit in HBM",
    16: "KV cache of the requested concurrency does not fit in HBM",
    32: "concurrency exceeds the runtime's max_batch_size per attention data-parallel rank",
    64: "invalid value (non-positive size, bandwidth or length)",
    128: "request rate exceeds the instance's saturation rate (the most it serves within its "
         "memory and batch caps with a stable prefill queue)",
    256: "serving.moe_backend has no fitted MoE kernels for this serving.runtime",
}
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


def _weights(b: Batch):
    """Per-chip weight bytes (the drafter's too): no concurrency in them, so ``_memory``
    computes them once per batch (dse.perf.queueing scores a batch at many concurrencies)."""
    tp, dp, pp = b.tp, b.dp, b.pp
    ffn_g = tp * dp
    moe = b.n_moe_layers * (arch.expert_slots(b) * arch.expert_params(b) + b.hidden * b.n_experts)
    # the shared experts sit where the dense MLP does (split over tp*dp, or tp per DP rank)
    shared = b.n_moe_layers * arch.shared_params_per_layer(b) / arch.shared_group(b)
    emb_tables = (2.0 - b.tied) / np.minimum(pp, 2.0)
    weights = (b.n_layers * arch.attn_params_per_layer(b) / tp
               + b.n_dense_layers * arch.dense_mlp_params(b) / arch.dense_group(b)
               + moe / ffn_g + shared) / pp \
        + emb_tables * b.vocab * b.hidden / tp
    weights = weights * b.weight_bytes
    if b.has_on("attn_weight_bytes") or b.has_on("expert_weight_bytes"):   # hook: per-op dtypes
        weights = weights + (b.n_layers * arch.attn_params_per_layer(b) / tp
                             * (b.attn_weight_bytes - b.weight_bytes)
                             + b.n_moe_layers * arch.expert_slots(b) * arch.expert_params(b)
                             / ffn_g * (b.expert_weight_bytes - b.weight_bytes)) / pp
    if b.has_on("spec_tokens"):          # hook: the drafter's weights (dse.perf.spec)
        weights = weights + spec.extra_weights_bytes(b)
    return weights


def _memory(b: Batch):
    """Per-chip weights, KV per sequence, activations, and the largest concurrency that fits."""
    tp, dp, pp = b.tp, b.dp, b.pp
    weights = b.memo("weights_bytes_per_chip", lambda: _weights(b))
    both, pre_only, dec_only = arch.phases(b)
    ctx = b.isl + times(1.0 - pre_only, b.osl)
    if lengths.on(b):                    # hook: length distributions (dse.perf.lengths)
        ctx = lengths.fit_context_tokens(b, 1.0 - pre_only, np.maximum(b.concurrency, 1.0))
    tiers = kvtier.on(b)
    if tiers:                            # hook: a shared prefix is stored once (dse.perf.kvtier)
        ctx = ctx - kvtier.shared_prefix_tokens(b)
    kv_seq = (arch.context_layers(b, ctx) / pp * arch.kv_elems_per_token_layer(b)
              * arch.kv_shard_fraction(b) * b.kv_bytes)
    if b.has_on("spec_tokens"):          # hook: the drafter's KV (dse.perf.spec)
        kv_seq = kv_seq + spec.extra_kv_seq_bytes(b, ctx)
    # activations scale with a scheduler's (dp rank's) tokens per step, up to max_num_tokens
    # (what has no concurrency in it: once per batch)
    tokens_per_seq = b.memo("act_tokens_per_seq",
                            lambda: arch.blend(pre_only, b.isl, 1.0 + b.isl / b.osl) / dp)
    act_per_token = b.memo("act_bytes_per_token",
                           lambda: b.hidden * 2.0 * 8.0 + b.vocab / tp * 4.0)
    c = sequences(b)
    act = np.minimum(b.max_num_tokens, c * tokens_per_seq) * act_per_token

    def kv_room():
        room = b.hbm_capacity_bytes - b.runtime_reserve_bytes - weights
        if tiers:                        # hook: the shared prefix's one copy (dse.perf.kvtier)
            room = room - kvtier.shared_prefix_bytes(b) / b.kv_memory_fraction
        return room
    room = b.memo("kv_room_bytes", kv_room)
    # the largest concurrency whose KV plus activations fit (both grow with it)
    kv_cost = kv_seq / dp / b.kv_memory_fraction            # HBM per sequence for its KV
    knee = b.max_num_tokens / tokens_per_seq                 # where activations stop growing
    below = room / (kv_cost + tokens_per_seq * act_per_token)
    above = (room - b.max_num_tokens * act_per_token) / kv_cost
    max_c = np.floor(np.maximum(arch.blend(arch.flag(below <= knee, room), below, above), 0.0))
    return weights, kv_seq, act, max_c


def _indivisible(a: np.ndarray, d: np.ndarray) -> np.ndarray:
    """``a`` is not a multiple of ``d`` (whole numbers; ``d = 0`` counts as not dividing):
    ``np.fmod(a, d) != 0`` without its slow libm call."""
    return a != np.floor(a / d) * d


def _invalid_bits(b: Batch, weights, act, max_c) -> np.ndarray:
    ffn_g = b.tp * b.dp
    moe = b.n_experts > 0
    bad_ep = _indivisible(ffn_g, b.ep) | (moe & (b.ep > b.n_experts)) | (~moe & (b.ep != 1))
    positive = (b.hbm_bw_bytes_per_s > 0) & (b.matmul_flops_per_s > 0) & (b.hbm_capacity_bytes > 0) \
        & (b.scaleup_bw_bytes_per_s > 0) & (b.scaleout_bw_bytes_per_s > 0) & (b.isl > 0) \
        & (b.osl > 0) & (b.concurrency >= 1) & (b.tp >= 1) & (b.pp >= 1) & (b.dp >= 1) & (b.ep >= 1)
    # a model structure no combination of parameters may produce (the space validation checks
    # combinations up to a size; the scorer never turns one into a negative time or cost)
    positive &= (b.n_layers >= 1) & (b.hidden > 0) & (b.n_heads > 0) & (b.n_kv_heads > 0) \
        & (b.n_dense_layers >= 0) & (b.n_moe_layers >= 0) & (b.vocab > 0) \
        & ((b.n_experts <= 0) | ((b.top_k >= 1) & (b.top_k <= b.n_experts) & (b.ffn_expert > 0)))
    # 2D weight-stationary tp splits the heads over tp / tp_x chips (dse.perf.tp2d)
    bad_tp = _indivisible(b.n_heads, b.tp / b.tp_x) | _indivisible(b.tp, b.tp_x) \
        if b.has_on("tp_x") else _indivisible(b.n_heads, b.tp)
    conds = ((bad_tp, 1), (bad_ep, 2), (b.pp > b.n_layers, 4),
             (weights + act + b.runtime_reserve_bytes > b.hbm_capacity_bytes, 8),
             (b.concurrency > max_c, 16), (b.concurrency > b.max_batch_size * b.dp, 32),
             (~positive, 64))
    # (the bits fit a byte: shifted byte views of the conditions, or-ed, widened once at the
    # end; a masked int64 or per condition is several times slower)
    bits = np.zeros(len(b), dtype=np.uint8)
    for cond, bit in conds:
        c = np.broadcast_to(cond, bits.shape).view(np.uint8)
        bits |= c << np.uint8(bit.bit_length() - 1) if bit > 1 else c
    out = bits.astype(np.int64)
    if b.has_on("moe_kernel_missing"):   # a named MoE backend the runtime has no kernels for
        out |= np.where((b.moe_kernel_missing > 0) & moe, 256, 0)
    return out


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
    k = Coefficients(b) if k is None else k
    cap = _queue_cap(b)
    return queueing.serve(
        b, lambda c, bd: _instance(_at_concurrency(b, c), bd, k, queue=True), breakdown,
        _queue_probe(b, k, np.float32), cap, _queue_probe(b, k, None))


def _at_concurrency(b: Batch, c) -> Batch:
    """``b`` at concurrency ``c``, with ``b``'s concurrency-free memos (the weights, the KV
    room, the architecture's counts: ~10 ms of a 20,000-design float64 batch, computed once)."""
    bc = b.replace(concurrency=c)
    _share_memos(b, bc)
    return bc


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
    weights, kv_seq, act, max_c = _memory(b)
    bits = _invalid_bits(b, weights, act, max_c)
    b0, tier = b, None
    b, run = _running(b, c, max_c)       # the sequences the runtime runs at once
    if kvtier.cache_on(b):               # hook: the prefix cache in HBM and the tier (dse.perf.kvtier)
        b, tier = _tier_split(b, weights, kv_seq, act, run)
    # hook: speculative decoding / MTP (dse.perf.spec): verification steps of k+1 tokens per
    # sequence plus the k draft steps, yielding tok_step tokens per sequence on average
    on_spec = b.has_on("spec_tokens")
    tok_step = spec.tokens_per_step(b) if on_spec else 1.0
    load = prompt_load(b, tok_step if on_spec else None)
    st, (tc, tm, tn, shares), draft = steps(b, breakdown, load, k,
                                            b.spec_tokens + 1.0 if on_spec else None)
    t_decode, t_mixed, t_prefill = _mean_steps(st, load, draft)
    ttft_extra = 0.0
    if tier is not None:                 # hook: prefix hits held in the tier (dse.perf.kvtier)
        t_mixed, ttft_extra, tier = _tier_fetch(b, tier, load, t_mixed, t_prefill)
    service = prompt_service_s(b, t_decode, t_prefill, load)    # S: a prompt's hold on the budget
    metrics = _rates(b, run, tok_step, load, t_decode, t_mixed, t_prefill, ttft_extra, service,
                     None if run is c else c)
    metrics.update(_fit_metrics(b, c, weights, kv_seq, act, max_c, bits))
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


def _running(b: Batch, c, max_c):
    """The batch an instance runs and its sequences: a closed loop keeps ``concurrency``
    requests in flight, of which a runtime runs at most ``max_concurrent_sequences`` at once
    (the memory fit, which reserves each sequence's whole prompt and answer -- TensorRT-LLM's
    GUARANTEED_NO_EVICT admission -- and the runtime's max_batch_size per scheduler:
    dse/catalog/serving.toml); the others wait for a slot
    (dse.perf.phases.admission_wait_s). Such a row stays infeasible (reasons 16, 32: the
    design cannot run its concurrency), its metrics those of the queue. Only continuous
    batching queues so, and only where one sequence fits (else nothing runs: the row is
    scored at its concurrency); ``b``, ``c`` themselves where every row runs all its
    requests."""
    cap = np.minimum(max_c, b.max_batch_size * b.dp)
    batching = arch.phases(b)[0] == 1.0
    over = (c > cap) & (cap >= 1.0) & batching
    if not np.any(over):
        return b, c
    if batching is True and bool(np.all(cap >= 1.0)):   # (over is then concurrency > cap)
        run = b.replace(concurrency=np.minimum(b.concurrency, cap))
    else:
        run = b.replace(concurrency=np.where(over, cap, b.concurrency))
    return run, sequences(run)


def _queue_cap(b: Batch):
    """``max_concurrent_sequences`` of the instance at its concurrency (dse.perf.queueing)."""
    bc = _at_concurrency(b, np.maximum(b.concurrency, 1.0))
    cap = np.minimum(_memory(bc)[3], b.max_batch_size * b.dp)
    _share_memos(bc, b)                  # (its concurrency-free memos, for the later passes)
    return cap


def _queue_probe(b: Batch, k: Coefficients, dtype):
    """``at(rows)``: ``_queue_times`` of rows ``rows`` (None: all) as a function of their
    concurrency, in ``dtype`` (float32: dse.perf.queueing's root finding; None: the batch's
    own, for what it reports), the concurrency-free memos of the batch kept between calls."""
    b32 = b if dtype is None else b.astype(dtype)
    k32 = k if all(v.dtype == b32.n_layers.dtype for v in b.columns.values()) \
        else Coefficients(b32)
    n = len(b32)
    # the rows whose KV tier recomputed at some point so far: a batch of rows taken later holds
    # a twin of each of them without the tier, scored in the same pass as the rows
    # (``_queue_times``' ``twins``) instead of a pass of its own (~2 ms of Python a pass)
    recomputed = np.zeros(n, dtype=bool)

    def at(rows):
        twin = np.zeros(0, dtype=np.int64) if rows is None else \
            np.flatnonzero(recomputed[rows])
        held = n if rows is None else len(rows)
        taken = None if rows is None else np.concatenate([rows, rows[twin]])
        sub = b32 if rows is None else b32.take_lazy(taken)
        if len(twin):
            tier = np.array(np.broadcast_to(sub.tier_bytes, (len(sub),)))
            tier[held:] = 0.0
            sub = sub.replace(tier_bytes=tier)
        ks = k32 if rows is None else k32.gather(taken, sub)
        memo = sub.__dict__["_memo"]
        if rows is not None:             # the batch's per-row memos, those rows of them
            memo.update({key: v.take(taken) for key, v in b32.__dict__["_memo"].items()
                         if isinstance(v, np.ndarray) and v.shape == (n,)})

        def times(c):
            if len(twin):
                c = np.concatenate([c, np.asarray(c)[..., twin]], axis=-1)
            bc = sub.replace(concurrency=c)
            bc.__dict__["_memo"].update(memo)
            out = _queue_times(bc, ks, (held, twin) if len(twin) else None)
            memo.update(bc.__dict__["_memo"])
            memo.pop("sequences", None)          # (the one memo that depends on concurrency)
            if "tier_recomputing" in memo:
                got = memo["tier_recomputing"][0]
                recomputed[got if rows is None else taken[got]] = True
            if not len(twin):
                return out
            return tuple(np.broadcast_to(v, np.broadcast_shapes(np.shape(v), (len(sub),)))
                         [..., :held] for v in out)
        return times
    return at


def _queue_times(b: Batch, k: Coefficients, twins=None):
    """hook: what dse.perf.queueing's root finding reads of ``_instance(b, queue=True)``, the
    same numbers: ``(ttft_unloaded_s, tpot_s, _prefill_service_s)``, none of the fit, cost or
    bound metrics (it runs ~10 times per design). ``twins``: ``(held, rows)``, the last rows
    of ``b`` from ``held`` on are the rows ``rows`` without their KV tier (``_queue_probe``):
    where those rows recompute their tier's hits, their twins' numbers."""
    c = sequences(b)
    weights, kv_seq, act, max_c = _memory(b)
    b0, tier = b, None
    b, c = _running(b, c, max_c)         # as _instance: the sequences the runtime runs at once
    if b is not b0:
        _share_memos(b0, b)
    if kvtier.cache_on(b):               # hook: as _instance (dse.perf.kvtier)
        b, tier = _tier_split(b, weights, kv_seq, act, c)
        _share_memos(b0, b)
    on_spec = b.has_on("spec_tokens")
    tok_step = spec.tokens_per_step(b) if on_spec else 1.0
    load = prompt_load(b, tok_step if on_spec else None)
    st, _, draft = steps(b, False, load, k, b.spec_tokens + 1.0 if on_spec else None,
                         sums=False)
    t_decode, t_mixed, t_prefill = _mean_steps(st, load, draft)
    ttft_extra = 0.0
    if tier is not None:
        t_mixed, ttft_extra, tier = _tier_fetch(b, tier, load, t_mixed, t_prefill)
    pass_s = b.pp * t_mixed
    out = (ttft(b, pass_s, t_prefill, load, ttft_extra, tail=False)[0],
           frontend.streamed_tpot(b, pass_s / tok_step, c),
           frontend.serial_service_s(b, prompt_service_s(b, t_decode, t_prefill, load)))
    if b is not b0:                      # (and back: the probe keeps b0's for its next pass)
        _share_memos(b, b0)
    if tier is None:
        return out
    keep = tier.fetched | (tier.tokens <= 0)
    if twins is not None:                # (as _tier_recomputed, from the twins)
        held, rows = twins
        keep = np.array(np.broadcast_to(keep, np.broadcast_shapes(np.shape(keep), (len(b0),))))
        out = tuple(_from_twins(v, keep, held, rows) for v in out)
        keep[..., rows] = True
    if not np.all(keep):                 # as _tier_recomputed
        rows, sub, ks = _recomputing(b0, keep, k)
        alt = _queue_times(sub, ks)
        b0.__dict__["_memo"]["tier_recomputing"][3].update(
            {key: v for key, v in sub.__dict__["_memo"].items() if key not in _POINT_MEMOS})
        out = tuple(_scatter(v, keep, rows, a) for v, a in zip(out, alt))
    return out


# the memos that read the concurrency (where the runtime runs fewer sequences than asked) or
# the prefix hits (the tier's split recomputes the evicted ones): the sequences and the
# uncached tokens; every other memo of a batch holds for its runner and tier-split batches too
_POINT_MEMOS = frozenset(("sequences", "new_tokens", "has_on:concurrency",
                          "has_on:prefix_hit_fraction"))


def _from_twins(v, keep, held, rows):
    """``v`` with the twins' numbers (``v``'s columns from ``held`` on) at the rows ``rows``
    where ``keep`` is false."""
    out = np.array(np.broadcast_to(v, keep.shape))
    out[..., rows] = np.where(keep[..., rows], out[..., rows], out[..., held:])
    return out


def _share_memos(src: Batch, dst: Batch) -> None:
    """``src``'s memos into ``dst`` (batches of the same rows at other concurrencies or prefix
    hits: ``_queue_times`` computes a concurrency-free term once, not once per pass)."""
    dst.__dict__["_memo"].update({key: v for key, v in src.__dict__["_memo"].items()
                                  if key not in _POINT_MEMOS})


def _recomputing(b0: Batch, keep, k):
    """The rows (the last axis) where some point recomputes its tier's hits (``keep`` false),
    the batch of those rows without the tier and their coefficients (``k``'s rows; None: None):
    a row's numbers depend on its own values only, so only those rows are scored again (~0.1%
    of dse.bench's rows with its KV tier on, where scoring every row again cost half of each of
    the root finding's passes). The rows' columns but the concurrency and their coefficients
    are kept in ``b0``'s memos (the queue probe carries them from pass to pass) while the rows
    stay the same."""
    n = len(b0)
    rows = np.flatnonzero(~np.all(np.reshape(np.broadcast_to(keep, np.broadcast_shapes(
        np.shape(keep), (n,))), (-1, n)), axis=0))
    memo = b0.__dict__["_memo"]
    got = memo.get("tier_recomputing")
    c = b0.concurrency[..., rows] if np.shape(b0.concurrency)[-1] == n else b0.concurrency
    if got is not None and np.array_equal(got[0], rows):
        sub = Batch({**got[1], "concurrency": c})
        sub.__dict__["_memo"].update(got[3])     # (its concurrency-free memos: _queue_times)
        return rows, sub, got[2]
    cols = {key: (v[..., rows] if np.shape(v)[-1] == n else v)
            for key, v in b0.columns.items() if key != "concurrency"}
    cols["tier_bytes"] = np.zeros(len(rows), dtype=b0.tier_bytes.dtype)
    sub = Batch({**cols, "concurrency": c})
    memo["tier_recomputing"] = rows, cols, None if k is None else k.gather(rows, sub), {}
    return rows, sub, memo["tier_recomputing"][2]


def _scatter(v, keep, rows, alt):
    """``v`` with ``alt`` (the rows ``rows`` scored again) where ``keep`` is false."""
    out = np.array(np.broadcast_to(v, np.broadcast_shapes(np.shape(v), np.shape(keep))))
    kr = np.broadcast_to(keep, out.shape)[..., rows]
    out[..., rows] = np.where(kr, out[..., rows], alt)
    return out


def _mean_steps(st: Breakdown, load: PromptLoad, draft):
    """The decode-only step, the mean step (steps that carry prompt tokens and steps that only
    decode, in proportion) and the TTFT chunk step, each with its draft steps (dse.perf.spec)."""
    t_decode = st.total("decode")
    t_mixed = load.share * st.total("mixed") + (1.0 - load.share) * t_decode
    t_prefill = st.total("prefill")
    if draft is not None:
        t_decode = t_decode + draft
        t_mixed = t_mixed + draft
        t_prefill = t_prefill + draft
    return t_decode, t_mixed, t_prefill


def _rates(b: Batch, c, tok_step, load: PromptLoad, t_decode, t_mixed, t_prefill,
           ttft_extra, service, clients=None) -> dict:
    """Throughput, latency and cost: a pass (pp mean steps) gives every sequence ``tok_step``
    tokens; what a phase does not produce is NaN, never a number that looks real (the masks
    are applied only where some row has such a phase: most batches have none). ``c``: the
    sequences running; ``clients``: the requests in flight where more wait (``_running``)."""
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


def _fit_metrics(b: Batch, c, weights, kv_seq, act, max_c, bits) -> dict:
    """What the memory fit and the model give (``_memory``, ``_invalid_bits``)."""
    return {
        "max_concurrent_sequences": np.minimum(max_c, b.max_batch_size * b.dp),
        "weights_bytes_per_chip": weights,
        "kv_bytes_per_chip": kv_seq * c / b.dp,
        "hbm_used_fraction": (weights + act + b.runtime_reserve_bytes + kv_seq * c / b.dp)
        / b.hbm_capacity_bytes,
        "kv_bytes_per_token": arch.kv_bytes_per_token(b),
        "kv_bytes_per_element": b.kv_bytes,
        "total_params": arch.total_params(b),
        "active_params": arch.active_params(b),
        "dense_equivalent_params": quality.dense_equivalent_params(b),
        "concurrency": c,
        "feasible": bits == 0,
        "reason": bits,
    }


@dataclass(frozen=True)
class _Tier:
    """The prefix cache's split (dse.perf.kvtier): shares of the waiting conversations'
    reusable prefixes in HBM and in the tier, the tier's hit tokens, and (after
    ``_tier_fetch``) where fetching them beats recomputing."""

    in_hbm: np.ndarray
    in_tier: np.ndarray
    tokens: np.ndarray
    fetched: np.ndarray | None = None


def _tier_split(b: Batch, weights, kv_seq, act, c):
    """hook: the batch whose prompts recompute the evicted hits, and the split."""
    in_hbm, in_tier = kvtier.cache_split(b, kvtier.free_kv_bytes(b, weights, kv_seq, act, c))
    tier = _Tier(in_hbm, in_tier, kvtier.hit_tokens(b) * in_tier)
    # evicted: recomputed
    return b.replace(prefix_hit_fraction=b.prefix_hit_fraction * (in_hbm + in_tier)), tier


def _tier_fetch(b: Batch, tier: _Tier, load: PromptLoad, t_mixed, t_prefill):
    """hook: prefix hits held in the tier: the mean step with the fetches of the requests one
    step admits (under the step where the fetch overlaps), the TTFT's fetch steps."""
    hit, fetched = kvtier.tier_hit(b, tier.tokens, t_prefill / np.maximum(load.chunk, 1.0))
    per_step = load.avg / np.maximum(new_tokens(b), 1.0) * hit      # the requests one step admits
    t_mixed = np.where(fetched, np.maximum(t_mixed, per_step), t_mixed + per_step)
    return t_mixed, b.pp * hit, _Tier(tier.in_hbm, tier.in_tier, tier.tokens, fetched)


def _tier_recomputed(b0: Batch, tier: _Tier, metrics, st, breakdown, k, queue):
    """hook: where recomputing beats the link, the runtime does not keep hits in the tier: those
    rows score as without it (their tier's hits evicted and recomputed as prompt tokens)."""
    n = len(b0)
    keep = np.broadcast_to(tier.fetched | (tier.tokens <= 0), (n,))
    if not breakdown:                    # (those rows alone: _recomputing)
        rows, sub, ks = _recomputing(b0, keep, k)
        alt_m = _instance(sub, False, ks, queue)
        return {key: _scatter(v, keep, rows, alt_m[key]) for key, v in metrics.items()}
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


def reason_text(bits: int, max_sequences: float | None = None) -> str:
    """Human-readable reasons for a reason bitmask (empty when feasible); with
    ``max_sequences`` (the ``max_concurrent_sequences`` metric) a concurrency that does not fit
    says how many sequences do."""
    parts = []
    for bit, text in REASONS.items():
        if int(bits) & bit:
            if bit in (16, 32) and max_sequences is not None and np.isfinite(max_sequences):
                text += f" (at most {int(max_sequences):,} sequences fit this design)"
            parts.append(text)
    return "; ".join(parts)


__all__ = ["BOUNDS", "KNEE_FRACTION", "Breakdown", "decode_bound", "instances_per_rack", "METRICS", "OPS", "REASONS", "reason_text", "score",
           "score_chunked"]
