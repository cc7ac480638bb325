"""Time of one pipeline-stage step, op by op: compute, memory and network time per op class.

A step carries ``dec`` decode tokens and ``pre`` prefill tokens per pipeline micro-batch (whole
instance), decode tokens attending to ``ctx_dec`` context and prefill tokens arriving in requests
of ``new`` uncached tokens after ``prior`` cached ones. Ops (rows of the breakdown):

attn_proj  q/k/v/o (or MLA) projections, plus the tp all-reduce of the attention output
attn_core  scores and values against the KV cache (decode reads it, prefill writes it)
mlp_dense  dense MLP of the dense layers, plus its tp*dp all-reduce
moe_routed routed experts (only the experts the step's tokens touch are read), dispatch+combine
moe_shared shared experts
router     the MoE router
logits     embedding lookup and the output head
pipeline   the activation hand-off to the next pipeline stage
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dse.perf import arch
from dse.perf.batch import Batch
from dse.perf.network import allreduce_s, alltoall_s, p2p_s

OPS = ("attn_proj", "attn_core", "mlp_dense", "moe_routed", "moe_shared", "router", "logits",
       "pipeline")


@dataclass(frozen=True)
class StepTimes:
    """Per-op times, each an array of shape (len(OPS), n)."""

    compute_s: np.ndarray
    memory_s: np.ndarray
    network_s: np.ndarray
    op_s: np.ndarray
    overhead_s: np.ndarray   # fixed per-layer and per-step time, shape (n,)
    total_s: np.ndarray      # one stage step, shape (n,)


def _matmul_s(b: Batch, flops, rows) -> np.ndarray:
    """Matmul time: ``rows`` below ``matmul_half_rows`` are padded up by tile quantization."""
    eff = b.matmul_fraction * rows / (rows + b.matmul_half_rows)
    return np.where(flops > 0, flops / (b.matmul_flops_per_s * np.maximum(eff, 1e-12)), 0.0)


def step(b: Batch, dec, pre, ctx_dec, new, prior, logits_rows) -> StepTimes:
    """One stage step of one micro-batch (tokens are per micro-batch, whole instance)."""
    tp, dp, pp = b.tp, b.dp, b.pp
    ffn_g = tp * dp
    tok = dec + pre
    stage = 1.0 / pp
    wb = b.weight_bytes
    hbm = b.hbm_bw_bytes_per_s * b.hbm_fraction
    d = b.hidden

    # attention projections: tp-sharded, each dp rank handles its own tokens
    p_attn = arch.attn_params_per_layer(b) * b.n_layers * stage
    c_proj = _matmul_s(b, 2.0 * tok / dp * p_attn / tp, tok / dp)
    m_proj = p_attn * wb / tp / hbm
    n_proj = b.n_layers * stage * allreduce_s(b, tok / dp * d * b.act_bytes, tp, b.tp_bw_fraction)

    # attention core against the KV cache
    heads = b.n_heads / tp
    kv_chip = arch.kv_elems_per_token_layer(b) * arch.kv_shard_fraction(b) * b.kv_bytes
    dec_ctx = arch.context_layers(b, ctx_dec) * stage
    pairs = arch.prefill_pairs_layers(b, new, prior) * stage
    reqs = np.where(new > 0, pre / np.maximum(new, 1.0), 0.0)
    attn_flops = (2.0 * heads * arch.attn_dims(b, True) * dec / dp * dec_ctx
                  + 2.0 * heads * arch.attn_dims(b, False) * reqs / dp * pairs)
    c_core = attn_flops / (b.attn_flops_per_s * b.attention_fraction)
    kv_read = dec / dp * dec_ctx * kv_chip
    kv_write = tok / dp * b.n_layers * stage * kv_chip
    prefix_read = reqs / dp * prior * b.n_layers * stage * kv_chip
    m_core = (kv_read + kv_write + prefix_read) / hbm

    # dense MLP: sharded over the whole tp*dp group, every chip sees all tokens
    p_dense = arch.dense_mlp_params(b) * b.n_dense_layers * stage
    c_dense = _matmul_s(b, 2.0 * tok * p_dense / ffn_g, tok)
    m_dense = p_dense * wb / ffn_g / hbm
    ffn_ar = allreduce_s(b, tok * d * b.act_bytes, ffn_g, b.ffn_bw_fraction)
    n_dense = b.n_dense_layers * stage * ffn_ar

    # routed experts: spread over ep ranks, each expert tp*dp/ep-way sharded
    moe_layers = b.n_moe_layers * stage
    e = np.maximum(b.n_experts, 1.0)
    k = np.minimum(b.top_k, e)
    touched = 1.0 - np.power(1.0 - k / e, tok)          # expected share of experts hit per layer
    p_exp = arch.expert_params(b)
    rows_per_expert = tok * k / e
    c_moe = _matmul_s(b, 2.0 * tok * k * p_exp * moe_layers / ffn_g, rows_per_expert)
    m_moe = touched * arch.expert_slots(b) * p_exp * moe_layers * wb / ffn_g / hbm
    ep = b.ep
    dest = ep * (1.0 - np.power(1.0 - 1.0 / ep, k))      # distinct ep ranks a token visits
    sent = tok / ffn_g * dest * (ep - 1.0) / ep * d
    a2a = (alltoall_s(b, sent * b.dispatch_bytes, ffn_g, b.a2a_bw_fraction)
           + alltoall_s(b, sent * b.act_bytes, ffn_g, b.a2a_bw_fraction))
    moe_tp = ffn_g / ep
    moe_ar = allreduce_s(b, tok * np.minimum(dest, ep) / ep * d * b.act_bytes, moe_tp,
                         b.tp_bw_fraction)
    n_moe = np.where(b.n_experts > 0, moe_layers * (np.where(ep > 1, a2a, 0.0) + moe_ar), 0.0)

    # shared experts and router
    p_sh = arch.shared_params_per_layer(b) * moe_layers
    c_sh = _matmul_s(b, 2.0 * tok * p_sh / ffn_g, tok)
    m_sh = p_sh * wb / ffn_g / hbm
    p_router = d * b.n_experts * moe_layers
    c_router = _matmul_s(b, 2.0 * tok * p_router / ffn_g, tok)
    m_router = p_router * wb / ffn_g / hbm

    # embeddings and output head (vocab-parallel over tp); the last stage carries it
    p_head = b.vocab * d
    c_head = _matmul_s(b, 2.0 * logits_rows / dp * p_head / tp, logits_rows / dp)
    m_head = (p_head * wb / tp + tok / dp * d * b.act_bytes) / hbm

    # hand-off to the next stage
    crosses = tp * dp * pp > b.domain_chips
    n_pipe = np.where(pp > 1, p2p_s(b, tok / dp * d * b.act_bytes / tp, crosses), 0.0)

    zero = np.zeros_like(tok)
    compute = np.stack([c_proj, c_core, c_dense, c_moe, c_sh, c_router, c_head, zero])
    memory = np.stack([m_proj, m_core, m_dense, m_moe, m_sh, m_router, m_head, zero])
    network = np.stack([n_proj, zero, n_dense, n_moe, zero, zero, zero, n_pipe])
    busy = np.maximum(compute, memory)
    phi = b.network_overlap_fraction
    op = (1.0 - phi) * (busy + network) + phi * np.maximum(busy, network)
    overhead = b.n_layers * stage * b.layer_overhead_s + b.step_overhead_s
    total = op.sum(axis=0) + overhead
    return StepTimes(compute, memory, network, op, overhead, total)
