"""The memory fit of a serving instance and what it decides: feasibility and the decode bound.

Per-chip weights (``weights_bytes``), the KV cache per sequence, the activations and the largest
concurrency that fits in HBM (``memory``); the reason bits of an infeasible row
(``invalid_bits``, ``REASONS``, ``reason_text``); what bounds decoding (``decode_bound``,
``BOUNDS``); the fit's metrics (``fit_metrics``); and the batch the runtime runs at once when
fewer sequences fit than are in flight (``running``).

Used by the serving scorer (``dse.perf.serve``: one instance, ``_instance``) and the
request-rate path's probes (``dse.perf.queue_probe``); ``REASONS``, ``reason_text``, ``BOUNDS``
and ``decode_bound`` are the public names every command reports with (also importable from
``dse.perf.serve`` and ``dse.perf``).
"""

from __future__ import annotations

import numpy as np

from dse.perf import arch, kvtier, lengths, quality, spec
from dse.perf.batch import Batch
from dse.perf.phases import sequences, times

BOUNDS = ("compute", "memory", "network", "capacity")
KNEE_FRACTION = 0.97    # a batch within 3% of the memory-limited maximum fills the HBM
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


def weights_bytes(b: Batch):
    """Per-chip weight bytes (the drafter's too): no concurrency in them, so ``memory``
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


def memory(b: Batch):
    """Per-chip weights, KV per sequence, activations, and the largest concurrency that fits."""
    tp, dp, pp = b.tp, b.dp, b.pp
    weights = b.memo("weights_bytes_per_chip", lambda: weights_bytes(b))
    pre_only = arch.phases(b)[1]
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


def invalid_bits(b: Batch, weights, act, max_c) -> np.ndarray:
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


def fit_metrics(b: Batch, c, weights, kv_seq, act, max_c, bits) -> dict:
    """What the memory fit and the model give (``memory``, ``invalid_bits``)."""
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


def running(b: Batch, c, max_c):
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
