"""Times of one micro-batch on one chip of the slowest pipeline stage: the forward and backward
GEMMs, the attention core, the HBM-bound elementwise work, and the collectives.

Every linear layer ``Y[m, n] = X[m, k] W[k, n]`` costs three GEMMs of the serving kernel model
(``kernel_gemm.gemm_s``, the chip's fitted constants for the precision's family): forward
``(m, n, k)``, data gradient ``(m, k, n)`` and weight gradient ``(k, n, m)``; the training fit
scales the fitted large-GEMM fraction by ``compute_fraction_scale``. Routed experts run the
serving grouped-GEMM model (``kernel_gemm.grouped_gemm_s``, the fitted ``moe_*`` constants)
over the rows the all-to-all dispatcher hands the chip, backward twice the forward. The attention core is the
prefill kernel (``kernel_attention.prefill_attention_s``, bf16) over the whole causal sequence,
split ``cp`` ways; its backward costs ``attention_bwd_ratio`` forwards.

Elementwise HBM traffic per token and layer (bytes, forward; the backward moves twice it):
norms 8h, residual adds 12h, RoPE 4(q + kv), the MLP activation 2(E f) (read E - 1 inputs of
width f, write one), and with fp8/fp4 GEMMs 1 byte per GEMM-input element (the transposed
fp8 copy the weight-gradient GEMM reads; the cast itself is fused in the norm or activation that
produces the input; an MoE layer's routed GEMMs read ``topk`` rows of h per token, cast after
the dispatcher's permutation) -- sharded by ``tp`` inside the tensor-parallel region and, with sequence
parallelism, outside it too. A selective recompute of the norms or of the MoE activation
(Megatron-Core's ``recompute_modules`` "layernorm", "moe_act") reruns their forward traffic
once more (``recompute_elementwise_s``).
"""


from __future__ import annotations

import numpy as np

from dse.perf.kernel_attention import prefill_attention_s
from dse.perf.kernel_comm import allreduce_s, alltoall_s
from dse.perf.kernel_gemm import gemm_s, grouped_gemm_s
from dse.perf.train_batch import TrainBatch

ACT_BYTES = 2.0          # bf16 activations, attention and communication
LOSS_BYTES = 16.0        # HBM bytes per logit element, forward + backward (``loss_s``)
CAST_BYTES = 1.0         # HBM bytes per GEMM-input element of an fp8/fp4 cast (module docstring)
GEMM_KEYS = ("fraction", "half_rows", "n_half", "k_half", "wave_elements", "hbm_fraction",
             "latency_s")
MOE_KEYS = ("fraction", "half_rows", "width_half", "hbm_fraction", "latency_s", "hidden_half",
            "nongated_slowdown", "wave_elements")
AR_KEYS = ("ar_nccl_latency_s", "ar_nccl_latency_per_log2_s", "ar_nccl_ll_fraction",
           "ar_nccl_bulk_latency_s", "ar_nccl_fraction", "ar_nccl_fraction_per_doubling")


def linear_s(b: TrainBatch, m, n, k) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of one linear layer ``[m, k] x [k, n]`` on one chip."""
    kp = b.kernel
    p = {key: kp["gemm_" + key] for key in GEMM_KEYS}
    p["fraction"] = p["fraction"] * b.compute_fraction_scale
    wb = b.operand_bytes
    peak, bw = b.peak_flops_per_s, b.hbm_bw_bytes_per_s
    fwd = gemm_s(m, n, k, wb, peak, bw, **p)
    bwd = gemm_s(m, k, n, wb, peak, bw, **p) + gemm_s(k, n, m, wb, peak, bw, **p)
    return fwd, bwd


def tokens_per_chip(b: TrainBatch) -> np.ndarray:
    """Tokens of one micro-batch on one chip (the sequence split ``cp`` ways)."""
    return b.micro_batch_seqs * b.seq_len / b.cp


def layer_gemms_s(b: TrainBatch) -> dict:
    """(forward, backward) seconds of one dense and one MoE layer's GEMMs, and the logits'."""
    t = tokens_per_chip(b)
    h, tp = b.hidden_size, b.tp
    attn = attention_gemms_s(b, t)
    # (a term no row needs is skipped whole: a batch of dense GQA models pays no MLA or MoE)
    moe = (0.0, 0.0)
    if np.any(b.moe_layers > 0):
        moe = moe_layer_s(b, t)
    f = np.maximum(b.ffn, 1.0)
    up = linear_s(b, t, (b.mlp_mats - 1.0) * f / tp, h)
    down = linear_s(b, t, h, f / tp)
    logits = linear_s(b, t, b.vocab / tp, h)
    return {"attn": attn, "dense_mlp": (up[0] + down[0], up[1] + down[1]), "moe_mlp": moe,
            "logits": logits}


def moe_layer_s(b: TrainBatch, t) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of one MoE layer's GEMMs on one chip: the routed experts
    (expert tensor parallelism 1: the serving grouped-GEMM model of the chip's experts over
    the rows dispatched to them, backward twice the forward; the permutation passes are
    ``moe_sort_s``'s), the shared experts (split ``tp`` ways) and the router."""
    h, tp = b.hidden_size, b.tp
    e_fwd = moe_experts_s(b)
    f_sh = np.maximum(b.shared_ffn, 1.0)
    sh_up = linear_s(b, t, (b.mlp_mats - 1.0) * f_sh / tp, h)
    sh_down = linear_s(b, t, h, f_sh / tp)
    has_moe = b.moe_layers > 0
    has_sh = b.shared_ffn > 0
    router = linear_s(b, t, np.maximum(b.experts, 1.0), h)
    return tuple(has_moe * (e_fwd * (1.0 + i) + has_sh * (sh_up[i] + sh_down[i]) + router[i])
                 for i in (0, 1))


def attention_gemms_s(b: TrainBatch, t) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of one layer's attention projections on one chip.

    GQA/MHA: the fused QKV projection ``h -> (q + 2 kv) / tp`` and the output ``q / tp -> h``.
    MLA: the down projections (replicated over tp) ``h -> r_q`` and ``h -> r_kv + d_rope``,
    the up projections ``r_q -> n_h (d_nope + d_rope)`` and ``r_kv -> n_h (d_nope + d_v)`` and
    the output ``n_h d_v -> h`` (heads split ``tp`` ways); without ``q_lora_rank`` the query
    is one ``h -> n_h (d_nope + d_rope)`` projection. A row runs its own architecture's
    shapes in five GEMM slots (QKV | KV down, output, KV up, Q down | Q whole, Q up; a slot
    the row lacks costs 0), so a batch that mixes GQA and MLA pays five linears, not eight."""
    h, tp, nh = b.hidden_size, b.tp, b.heads
    q = b.heads * b.head_dim
    kv = b.kv_heads * b.head_dim
    mla = b.kv_lora_rank > 0
    if not np.any(mla):
        qkv = linear_s(b, t, (q + 2.0 * kv) / tp, h)
        out = linear_s(b, t, h, q / tp)
        return qkv[0] + out[0], qkv[1] + out[1]
    rq = np.maximum(b.q_lora_rank, 1.0)
    rkv = np.maximum(b.kv_lora_rank, 1.0)
    dqk = np.maximum(b.qk_nope_head_dim + b.qk_rope_head_dim, 1.0)
    dv = np.maximum(b.v_head_dim, 1.0)
    lora = mla & (b.q_lora_rank > 0)
    slots = [(np.where(mla, rkv + b.qk_rope_head_dim, (q + 2.0 * kv) / tp), h, 1.0),
             (h, np.where(mla, nh * dv / tp, q / tp), 1.0),
             (nh * (b.qk_nope_head_dim + dv) / tp, rkv, mla),
             (np.where(lora, rq, nh * dqk / tp), h, mla),
             (nh * dqk / tp, rq, lora)]
    fwd = bwd = 0.0
    for n, k, on in slots:
        f, w = linear_s(b, t, n, k)
        fwd, bwd = fwd + on * f, bwd + on * w
    return fwd, bwd


def attention_core_s(b: TrainBatch) -> np.ndarray:
    """Forward seconds of one layer's attention core on one chip (bf16 flash attention over the
    causal sequence; context parallelism splits the work ``cp`` ways, load-balanced), averaged
    over the stage's layers: ``local_layers`` of ``num_layers`` attend to a sliding window of
    ``sliding_window`` keys (gpt-oss: 18 of 36 at 128)."""
    kp = b.kernel
    names = ("fraction", "half_tokens", "half_rows", "latency_s", "hbm_fraction", "dim_half",
             "per_seq_s", "per_seq_head_s")
    p = {n: kp["attn_prefill_" + n] for n in names}
    p["fraction"] = p["fraction"] * b.compute_fraction_scale
    d_qk = np.where(b.kv_lora_rank > 0, b.qk_nope_head_dim + b.qk_rope_head_dim, b.head_dim)
    d_v = np.where(b.kv_lora_rank > 0, b.v_head_dim, b.head_dim)
    kvh = np.where(b.kv_lora_rank > 0, b.heads, b.kv_heads)
    args = (b.micro_batch_seqs, b.seq_len, 0.0, b.heads / b.tp, np.maximum(kvh / b.tp, 1.0),
            d_qk, d_v)
    full = prefill_attention_s(*args, 0.0, ACT_BYTES, b.peak_bf16_flops_per_s,
                               b.hbm_bw_bytes_per_s, **p)
    # the local (sliding-window) layers attend to ``sliding_window`` keys (plus the kernel's
    # window padding), the serving prefill model's windowed pairs
    local = prefill_attention_s(*args, b.sliding_window, ACT_BYTES, b.peak_bf16_flops_per_s,
                                b.hbm_bw_bytes_per_s,
                                window_pad_tokens=kp.get("attn_prefill_window_pad_tokens", 0.0),
                                **p)
    share = np.where(b.sliding_window > 0, b.local_layers / np.maximum(b.num_layers, 1.0), 0.0)
    return ((1.0 - share) * full + share * local) / b.cp


# HBM bytes per attention-score element of Megatron's unfused core attention (fp16/bf16 scores,
# a 1-byte dropout mask), outside its batched GEMMs: forward softmax read + write (4), dropout
# read + write + mask write (5); backward dropout read + mask read + write (5), softmax read of
# its output and the gradient + write (6)
UNFUSED_FWD_BYTES = 9.0
UNFUSED_BWD_BYTES = 11.0


def unfused_attention_s(b: TrainBatch) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of one layer's attention core on one chip as Megatron-LM ran
    it before FlashAttention (megatron/model/transformer.py at 152aab304d and 2e90a342f5:
    ``torch.baddbmm`` of Q K^T into a full ``[b * heads, s, s]`` score tensor, the fused scale +
    causal mask + softmax, ``torch.nn.Dropout``, ``torch.bmm`` with V). The four batched GEMMs
    run the job's GEMM fit over every score (no causal skipping): forward ``Q K^T`` (n = s,
    k = d) and ``P V`` (n = d, k = s); backward ``dO V^T`` (n = s, k = d) and ``P^T dO``,
    ``dS K``, ``dS^T Q`` (n = d, k = s); their HBM term holds the scores they write or read.
    The softmax and dropout passes stream ``UNFUSED_*_BYTES`` per score at the HBM rate."""
    kp = b.kernel
    p = {key: kp["gemm_" + key] for key in GEMM_KEYS}
    p["fraction"] = p["fraction"] * b.compute_fraction_scale
    heads = b.heads / b.tp
    d = b.head_dim
    # (a chip's seq_len / cp queries against all seq_len keys: the work splits cp ways, as
    # attention_core_s's)
    keys = b.seq_len
    rows = b.micro_batch_seqs * heads * keys / b.cp
    peak, bw = b.peak_bf16_flops_per_s, b.hbm_bw_bytes_per_s
    scores = gemm_s(rows, keys, d, ACT_BYTES, peak, bw, **p)
    mix = gemm_s(rows, d, keys, ACT_BYTES, peak, bw, **p)
    elements = rows * keys
    stream = elements / (bw * b.hbm_fraction)
    return (scores + mix + UNFUSED_FWD_BYTES * stream,
            scores + 3.0 * mix + UNFUSED_BWD_BYTES * stream)


def elementwise_s(b: TrainBatch) -> np.ndarray:
    """Forward seconds of one layer's HBM-bound elementwise work on one chip (module
    docstring); the backward takes twice it."""
    h = b.hidden_size
    q = b.heads * b.head_dim
    kv = b.kv_heads * b.head_dim
    f = np.where(b.moe_layers > 0, b.expert_ffn * b.topk + b.shared_ffn, b.ffn)
    outside = 20.0 * h                                  # norms and residual adds
    inside = 4.0 * (q + kv) + 2.0 * b.mlp_mats * f
    low = b.operand_bytes < 2.0
    # the MLP's first GEMMs read h per token, an MoE layer's topk routed rows of h (and the
    # shared experts' h): Transformer Engine's GroupedLinear casts the permuted rows
    mlp_in = np.where(b.moe_layers > 0, b.topk * h + (b.shared_ffn > 0) * h, h)
    cast = CAST_BYTES * (h + mlp_in + q + f) * low
    sp = b.sequence_parallel > 0
    per_token = np.where(sp, outside / b.tp, outside) + (inside + cast) / b.tp
    return tokens_per_chip(b) * per_token / (b.hbm_bw_bytes_per_s * b.hbm_fraction)


def recompute_elementwise_s(b: TrainBatch) -> np.ndarray:
    """Seconds of one layer's elementwise recompute on one chip (per layer of the stage, averaged
    over its dense and MoE layers): Megatron-Core's ``recompute_modules`` "layernorm"
    (``recompute_norms``: the backward reruns the two pre-norms' forward, ``elementwise_s``'s
    8h bytes a token, sharded by ``tp`` with sequence parallelism) and "moe_act"
    (``recompute_moe_act``: the routed experts' activation, 2 (E f_e) bytes a routed row,
    ``topk`` rows a token, sharded by ``tp``; MoE layers only), at the HBM rate. Not paid by
    the layers a full recompute reruns whole (``elementwise_s`` counts their rerun)."""
    h = b.hidden_size
    norms = 4.0 * ACT_BYTES * h * b.recompute_norms
    norms = np.where(b.sequence_parallel > 0, norms / b.tp, norms)
    moe_share = b.moe_layers / np.maximum(b.num_layers, 1.0)
    act = (ACT_BYTES * b.mlp_mats * b.expert_ffn * b.topk * b.recompute_moe_act * moe_share
           / b.tp)
    return (tokens_per_chip(b) * (norms + act) * (1.0 - b.full_share)
            / (b.hbm_bw_bytes_per_s * b.hbm_fraction))


# The fitted fixed time (``layer_overhead_s``: launches and host gaps, per layer and micro-batch) is
# paid per linear layer a transformer layer runs, each a set of GEMMs with their casts and
# launches: ``layer_overhead_s`` is that of a dense GQA/MHA layer's DENSE_LAYER_LINEARS (fused
# QKV, output projection, MLP fc1 and fc2; every dense row it is fitted on is one). A routed
# expert is a linear layer of its own: Megatron-Core's TEGroupedMLP runs Transformer Engine's
# GroupedLinear, and TE 2.9 (the Megatron-Bridge 25.11 pin) runs it as one cuBLAS GEMM per local
# expert (te_general_grouped_gemm -> nvte_multi_tensor_gemm -> multi_stream_cublas_gemm, a loop
# over the experts; the CUTLASS grouped GEMM only with NVTE_USE_CUTLASS_GROUPED_GEMM on Hopper),
# each with its own casts in FP8. Software that runs each grouped linear layer as one kernel
# (``moe_grouped_gemm`` "single", train_batch.MOE_GROUPED_GEMM: TE's opt-in grouped kernels,
# NVTE_USE_CUTLASS_GROUPED_GEMM on Hopper, NVTE_GROUPED_LINEAR_USE_FUSED_GROUPED_GEMM's cuBLASLt
# grouped GEMM from TE 2.17, NVTE_CUTEDSL_FUSED_GROUPED_MLP on Blackwell from TE 2.14; none on by
# default through TE 2.18) pays fc1 and fc2 once each, as a dense MLP does.
DENSE_LAYER_LINEARS = 4.0


def layer_linears(b: TrainBatch) -> np.ndarray:
    """Linear layers one transformer layer of the stage runs, averaged over its dense and MoE
    layers: the attention's (GQA/MHA: QKV and output, 2; MLA: KV down and up, output and the
    query's one or two, 4 or 5), and the MLP's: dense fc1 and fc2 (2); MoE the router, the shared
    experts' fc1 and fc2 (where there are shared experts) and each local expert's fc1 and fc2
    (``experts / ep`` of them, expert tensor parallelism 1), or with ``moe_grouped_gemm``
    "single" (code 1) one grouped fc1 and fc2 whatever the local experts. Hand-worked: a dense
    GQA layer 4; Qwen3-30B-A3B at ep 8, 16 local experts, 2 + 1 + 32 = 35; "single" 2 + 1 + 2
    = 5."""
    mla = b.kv_lora_rank > 0
    attn = np.where(mla, 4.0 + (b.q_lora_rank > 0), 2.0)
    local = np.where(b.moe_grouped_gemm == 1, 1.0,
                     np.maximum(b.experts, 1.0) / np.maximum(b.ep, 1.0))
    moe = 1.0 + 2.0 * (b.shared_ffn > 0) + 2.0 * local
    share = b.moe_layers / np.maximum(b.num_layers, 1.0)
    return attn + share * moe + (1.0 - share) * 2.0


def layer_overhead_s(b: TrainBatch) -> np.ndarray:
    """Fixed seconds of one layer and micro-batch (launches and host gaps, forward and
    backward): ``layer_overhead_s`` per ``DENSE_LAYER_LINEARS`` linear layers, times the stage's
    ``layer_linears`` (a dense GQA layer pays ``layer_overhead_s``; a Qwen3-30B-A3B layer at
    ep 8 35 / 4 = 8.75 times it)."""
    return b.layer_overhead_s * layer_linears(b) / DENSE_LAYER_LINEARS


def loss_s(b: TrainBatch) -> np.ndarray:
    """Seconds of one micro-batch's cross-entropy on the last stage, forward and backward: an
    HBM-bound pass over the chip's logits (``tokens x vocab / tp`` elements), ``LOSS_BYTES``
    per element (Megatron's vocab-parallel cross-entropy: the bf16 logits read and upcast, the
    fp32 softmax written for the backward and read back, the bf16 gradient written)."""
    return (tokens_per_chip(b) * b.vocab / b.tp * LOSS_BYTES
            / (b.hbm_bw_bytes_per_s * b.hbm_fraction))


# Megatron-Core's all-to-all token dispatcher (megatron/core/transformer/moe/token_dispatcher.py,
# MoEAlltoAllTokenDispatcher; the flex/DeepEP dispatcher moves the same rows): ``dispatch_preprocess``
# permutes the rank's own tokens into its routed rows (``moe_utils.permute``), ``dispatch_all_to_all``
# sends each EP rank only the rows routed to its local experts, ``dispatch_postprocess`` sorts the
# received rows from (source rank, expert) to (expert, source rank) (``sort_chunks_by_idxs``, with
# more than one local expert), the grouped GEMM runs over those rows only, and the combine undoes
# both (``combine_preprocess``'s sort back, ``combine_postprocess``'s ``unpermute``). No rank scans
# another rank's tokens.


def moe_rows(b: TrainBatch) -> np.ndarray:
    """Routed rows one chip sends and, routing balanced, receives per MoE layer: its tokens
    (``1 / tp`` of them with sequence parallelism) times ``topk``."""
    return tokens_per_chip(b) / np.where(b.sequence_parallel > 0, b.tp, 1.0) * b.topk


def expert_imbalance(b: TrainBatch) -> np.ndarray:
    """Routed rows on the busiest EP rank over the mean: the serving routing model
    (``dse.perf.imbalance.published_imbalance``, ``1 + z(ep) cv sqrt(ep / E)``, ``cv`` =
    ``expert_load_cv``); 1 at ep = 1, for dense models and at cv 0. Every rank waits for the
    busiest at the combine, so its grouped GEMM, its received rows' sort and its share of the
    all-to-all set the layer's pace."""
    return b.ep_imbalance


def moe_sort_s(b: TrainBatch) -> np.ndarray:
    """Forward seconds of one MoE layer's permutation passes on one chip (the backward moves
    the same bytes), each reading and writing every routed row, ``2 x ACT_BYTES x h`` bytes
    per row and pass, at the HBM rate: the permute before the dispatch and the unpermute
    after the combine (every MoE layer), and with expert parallelism and more than one local
    expert the chunk sort after the dispatch and back before the combine
    (``sort_chunks_by_idxs``; the dispatcher comment above) over the busiest rank's received
    rows (``expert_imbalance`` times the mean)."""
    local = np.maximum(b.experts, 1.0) / np.maximum(b.ep, 1.0)
    sort = (b.ep > 1) & (local > 1)
    passes = 2.0 + 2.0 * sort * expert_imbalance(b)
    return np.where(b.moe_layers > 0, moe_rows(b) * passes * 2.0 * ACT_BYTES * b.hidden_size
                    / (b.hbm_bw_bytes_per_s * b.hbm_fraction), 0.0)


def moe_experts_s(b: TrainBatch) -> np.ndarray:
    """Forward seconds of one MoE layer's routed experts on one chip:
    ``kernel_gemm.grouped_gemm_s`` (the chip's fitted grouped-GEMM constants for the
    precision's family, ``moe_*``; the large-GEMM fraction times ``compute_fraction_scale``)
    over the rows the busiest chip receives (``moe_rows`` x ``expert_imbalance``), its touched local experts
    those the ``ep`` ranks' tokens hit. The serving runtimes' whole-batch terms
    (``moe_batch_bytes``, ``moe_route_bytes``, ``moe_remote_fraction``: a kernel that scans
    every EP rank's tokens) and the token term (``moe_token_bytes``) are not paid: the
    dispatcher hands the kernel the chip's own rows, and its permutation passes are
    ``moe_sort_s``'s (the activation between the expert GEMMs is ``elementwise_s``'s)."""
    kp = b.kernel
    p = {k: kp["moe_" + k] for k in MOE_KEYS}
    p["fraction"] = p["fraction"] * b.compute_fraction_scale
    p.update(token_bytes=0.0, batch_bytes=0.0, route_bytes=0.0, remote_fraction=0.0)
    group = tokens_per_chip(b) / np.where(b.sequence_parallel > 0, b.tp, 1.0) * b.ep
    out = grouped_gemm_s(group, b.hidden_size, np.maximum(b.expert_ffn, 1.0), b.topk,
                         np.maximum(b.experts, 1.0), 1.0, b.ep, b.operand_bytes,
                         b.peak_flops_per_s, b.hbm_bw_bytes_per_s,
                         rows=moe_rows(b) * expert_imbalance(b),
                         matrices=b.mlp_mats, **p)
    return np.where(b.moe_layers > 0, out, 0.0)


def group_tier(b: TrainBatch, stride) -> tuple[np.ndarray, np.ndarray]:
    """(ranks of a group with rank stride ``stride`` inside one scale-up domain, bandwidth per
    chip of the links the group's ring crosses): the scale-up links while the whole group fits
    in the domain, else the scale-out NIC."""
    inside = np.maximum(np.floor(b.domain_chips / np.maximum(stride, 1.0)), 1.0)
    return inside, b.scaleup_bw_bytes_per_s


def allreduce_time_s(b: TrainBatch, message_bytes, group, stride) -> np.ndarray:
    """One NCCL all-reduce of ``message_bytes`` over ``group`` ranks at rank stride ``stride``
    (a group wider than its ranks in one domain pays the scale-out NICs for the rest)."""
    inside, bw = group_tier(b, stride)
    kp = b.kernel
    p = {k: kp[k] for k in AR_KEYS}
    return allreduce_s(message_bytes, group, bw, domain_chips=inside,
                       scaleout_bw_bytes_per_s=b.scaleout_bw_bytes_per_s, custom=False,
                       a2a_scaleout_latency_s=kp["a2a_scaleout_latency_s"],
                       a2a_scaleout_fraction=kp["a2a_scaleout_fraction"], **p)


def tp_comm_s(b: TrainBatch) -> np.ndarray:
    """Seconds of one layer's tensor-parallel collectives, forward (two all-reduces of the
    layer's activations; with sequence parallelism two all-gathers and two reduce-scatters,
    the same bytes). Zero at tp = 1."""
    msg = tokens_per_chip(b) * b.hidden_size * ACT_BYTES
    return np.where(b.tp > 1, 2.0 * allreduce_time_s(b, msg, b.tp, 1.0), 0.0)


def ep_comm_s(b: TrainBatch) -> np.ndarray:
    """Seconds of one MoE layer's expert-parallel dispatch + combine, forward (bf16 tokens;
    the group's ranks are consecutive chips, so it leaves the domain beyond ``domain_chips``),
    paced by the busiest rank (``expert_imbalance`` times the mean rank's rows)."""
    kp = b.kernel
    tokens = (tokens_per_chip(b) / np.where(b.sequence_parallel > 0, b.tp, 1.0)
              * expert_imbalance(b))
    rpn = np.minimum(b.domain_chips, b.ep)
    out = 0.0
    for phase in ("dispatch", "combine"):
        out = out + alltoall_s(tokens, b.hidden_size, b.topk, np.maximum(b.experts, 1.0), b.ep,
                               rpn, ACT_BYTES, b.scaleup_bw_bytes_per_s,
                               b.scaleout_bw_bytes_per_s,
                               latency_s=kp[f"a2a_normal_{phase}_latency_s"],
                               fraction=kp[f"a2a_normal_{phase}_fraction"],
                               a2a_scaleout_latency_s=kp["a2a_scaleout_latency_s"],
                               a2a_scaleout_fraction=kp["a2a_scaleout_fraction"])
    return np.where((b.ep > 1) & (b.moe_layers > 0), out, 0.0)


def p2p_s(b: TrainBatch, message_bytes, span) -> np.ndarray:
    """One point-to-point send of ``message_bytes`` between neighbours of a ring or pipeline
    that spans ``span`` chips: on the scale-up link while it fits in one domain, else the NIC
    (its slowest hop sets the pace)."""
    bw = np.where(span <= b.domain_chips, b.scaleup_bw_bytes_per_s, b.scaleout_bw_bytes_per_s)
    return message_bytes / (bw * b.kernel["ar_nccl_fraction"]) + b.kernel["ar_nccl_latency_s"]


def cp_peers_s(b: TrainBatch, per_peer_bytes) -> np.ndarray:
    """One collective of the context-parallel group in which every chip sends
    ``per_peer_bytes`` to each other rank (an all-to-all, or an all-gather / reduce-scatter of
    ``per_peer_bytes`` chunks). The group's ranks sit ``tp`` apart (Megatron's rank order
    tp-cp-ep-dp-pp), ``floor(domain_chips / tp)`` of them in one scale-up domain: the bytes to
    peers in the domain cross the scale-up links, the rest the scale-out NIC; the slower sets
    the pace."""
    kp = b.kernel
    inside = np.minimum(np.maximum(np.floor(b.domain_chips / b.tp), 1.0), b.cp)
    up = per_peer_bytes * (inside - 1.0) / b.scaleup_bw_bytes_per_s
    out = per_peer_bytes * (b.cp - inside) / b.scaleout_bw_bytes_per_s
    return np.maximum(up, out) / kp["ar_nccl_fraction"] + kp["ar_nccl_latency_s"]


def cp_tensors_bytes(b: TrainBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bytes of one chip's Q, K (= V's with GQA/MHA; MLA's K carries the rope part) and O of
    one layer: its ``seq_len / cp`` tokens x its ``1 / tp`` of the heads, bf16 (the head
    dimensions ``attention_core_s``'s)."""
    t = tokens_per_chip(b) * ACT_BYTES
    mla = b.kv_lora_rank > 0
    d_qk = np.where(mla, b.qk_nope_head_dim + b.qk_rope_head_dim, b.head_dim)
    d_v = np.where(mla, b.v_head_dim, b.head_dim)
    kvh = np.maximum(np.where(mla, b.heads, b.kv_heads) / b.tp, 1.0)
    q = t * b.heads / b.tp * d_qk
    return q, t * kvh * (d_qk + d_v) / 2.0, t * b.heads / b.tp * d_v


def cp_comm_s(b: TrainBatch) -> np.ndarray:
    """Seconds of one layer's context-parallel exchange, forward, by the job's
    ``cp_comm_type`` (``CP_COMM_TYPES``, Megatron-Core's ``TransformerConfig.cp_comm_type``,
    megatron/core/transformer/transformer_config.py; run by Transformer Engine's
    context-parallel attention): ``p2p`` ring attention, ``cp - 1`` hops of the chip's K and V
    chunk; ``a2a`` DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv:2309.14509): one all-to-all
    each of Q, K and V in (every chip leaves with the whole sequence of ``1 / cp`` of its
    heads) and of the output O back, each chip sending ``1 / cp`` of each tensor to every
    other rank; ``all_gather``: an all-gather of K and V, each rank receiving every other
    rank's chunk. Zero at cp = 1."""
    msg = tokens_per_chip(b) * 2.0 * b.kv_heads * b.head_dim / b.tp * ACT_BYTES
    ring = (b.cp - 1.0) * p2p_s(b, msg, b.tp * b.cp)
    out = ring
    if np.any(b.cp_comm_type > 0):
        q, kv, o = cp_tensors_bytes(b)
        a2a = (cp_peers_s(b, q / b.cp) + 2.0 * cp_peers_s(b, kv / b.cp)
               + cp_peers_s(b, o / b.cp))
        gather = 2.0 * cp_peers_s(b, kv)
        out = np.where(b.cp_comm_type == 1, a2a, np.where(b.cp_comm_type == 2, gather, ring))
    return np.where(b.cp > 1, out, 0.0)


def cp_layer_s(b: TrainBatch) -> tuple[np.ndarray, np.ndarray]:
    """(seconds that may run under the attention core, seconds that block it) of one layer's
    context-parallel exchange, forward and backward. ``p2p``: the ring's asynchronous sends
    overlap the attention blocks; its backward also returns the K/V gradients, and the whole
    is priced ``1 + attention_bwd_ratio`` forwards. ``a2a``: blocking; the backward
    (Transformer Engine's ``AttnFuncWithCPAndQKVOA2A.backward``) sends O and dO in and dQ,
    dK, dV back: the forward's bytes plus one more O. ``all_gather``: blocking ("not async,
    and cannot be overlapped", the cp_comm_type docstring); the backward gathers K and V
    again and reduce-scatters dK and dV (``AttnFuncWithCPAndKVAllGather.backward``): twice the
    forward."""
    fwd = cp_comm_s(b)
    ring = np.where(b.cp_comm_type == 0, fwd * (1.0 + b.attention_bwd_ratio), 0.0)
    blocking = 0.0
    if np.any(b.cp_comm_type > 0):
        o = cp_peers_s(b, cp_tensors_bytes(b)[2] / b.cp)
        a2a = 2.0 * fwd + o
        blocking = np.where(b.cp > 1, np.where(b.cp_comm_type == 1, a2a,
                                               np.where(b.cp_comm_type == 2, 3.0 * fwd, 0.0)),
                            0.0)
    return ring, blocking


def pp_comm_s(b: TrainBatch) -> np.ndarray:
    """Seconds of one micro-batch's pipeline sends on one stage: the activations out in the
    forward and their gradient back, once per virtual stage. Each tensor-parallel rank sends
    its ``1 / tp`` share where sequence parallelism shards the activations or the job
    scatters them (``p2p_scatter_gather``: Megatron-LM's scatter/gather optimization,
    Narayanan et al. 2021 section 4.1), else the whole activation."""
    share = (b.sequence_parallel > 0) | (b.p2p_scatter_gather > 0)
    msg = tokens_per_chip(b) * b.hidden_size * ACT_BYTES / np.where(share, b.tp, 1.0)
    span = b.tp * b.cp * b.dp * b.pp
    return np.where(b.pp > 1, 2.0 * b.vp * p2p_s(b, msg, span), 0.0)
