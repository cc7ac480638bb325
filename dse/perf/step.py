"""Time of one pipeline-stage step, op by op: compute, memory and network time per op class.

A step carries ``dec`` decode tokens and ``pre`` prefill tokens per pipeline micro-batch (whole
instance); decode tokens attend to the KV cache, prefill tokens arrive in requests of ``new``
uncached tokens after ``prior`` cached ones. Ops (rows of the breakdown):

attn_proj  q/k/v/o (or MLA) projections, plus the tp all-reduce of the attention output
attn_core  scores and values against the KV cache (decode reads it, prefill writes it)
mlp_dense  dense MLP of the dense layers, plus its tp*dp all-reduce
moe_routed routed experts (only the experts the step's tokens touch are read), dispatch+combine
moe_shared shared experts
router     the MoE router
logits     embedding lookup and the output head, plus the tp all-gather of its logits
pipeline   the activation hand-off to the next pipeline stage

Almost every time is affine in the step's tokens (a matmul pads small row counts up by
``gemm_half_rows``; a collective has a latency and a per-byte cost), so ``coefficients``
computes the per-design constants once and ``step`` evaluates any token mix cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dse.perf import arch, imbalance, kernel_comm
from dse.perf.batch import Batch
from dse.perf.network import kernel_allreduce, kernel_alltoall, p2p_coef

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


def _gemm_coef(b: Batch, gemms, layers, inv_eff):
    """An op made of dense GEMMs ``[(n, k), ...]`` per chip per layer over ``layers`` layers:
    ``(a, w)`` with compute time ``a * (rows + gemm_half_rows) + w`` (dse.perf.kernel_gemm's
    form summed exactly over the GEMMs: shape factor per GEMM, one wave of tiles each).
    ``n`` and ``k`` are at least 1 (``_floor1``); ``inv_eff = 2 / (peak * gemm_fraction)``,
    computed once for the ops that share a peak.

    Per GEMM ``k * shape = k (1 + n_half / n) + k_half``; the factors every GEMM shares (2,
    the wave, layers over the efficiency) are applied once to the sums."""
    a = s = None
    for n, k in gemms:
        ks = (b.gemm_n_half / n + 1.0) * k + b.gemm_k_half       # k * shape
        s = ks if s is None else s + ks
        a = ks * n if a is None else a + ks * n
    r = layers * inv_eff
    return a * r, s * (r * b.gemm_wave_elements)


def _floor1(x):
    return np.maximum(x, 1.0)


def _log1m(x):
    """``log(1 - x)`` for ``0 <= x < 1``, accurate for small ``x`` like ``np.log1p(-x)`` but with
    numpy's vectorised ``log`` (log1p has no SIMD loop: ~6x slower): Goldberg's
    ``log(u) * x / (1 - u)`` with ``u = 1 - x`` (rounding of ``u`` cancels); ``x = 0`` gives 0."""
    u = 1.0 - x
    den = np.maximum(1.0 - u, np.finfo(u.dtype).tiny if hasattr(u, "dtype") else 1e-300)
    return np.log(u) * (x / den)


class Coefficients:
    """Per-design constants of the step model (one stage, one micro-batch).

    Each op's compute and memory times follow the fitted kernel models (dse/catalog/kernels,
    ``python -m dse.kernels``): dense GEMMs (``kernel_gemm.gemm_s``), the routed experts'
    grouped GEMMs (``kernel_gemm.grouped_gemm_s``), attention (``kernel_attention``) and the
    collectives (``kernel_comm``); ``extra`` terms are additive times (kernel latencies,
    per-sequence and per-routed-token costs)."""

    def __init__(self, b: Batch):
        tp, dp, pp = b.tp, b.dp, b.pp
        self.dp = dp
        ffn_g = tp * dp
        stage = 1.0 / pp
        wb = b.weight_bytes
        hbm = b.hbm_bw_bytes_per_s * b.hbm_fraction           # other HBM traffic (embeddings)
        g_hbm = b.hbm_bw_bytes_per_s * b.gemm_hbm_fraction     # GEMM weight streams
        peak = b.matmul_flops_per_s
        d = b.hidden
        ab = b.act_bytes
        mla = arch.is_mla(b)
        self.h = b.gemm_half_rows
        self.layers_stage = L = b.n_layers * stage
        # attention projections: tp-sharded, each dp rank handles its own tokens; q/k/v (or the
        # MLA down/up projections) read the hidden state, o writes it
        p_attn = arch.attn_params_per_layer(b) / tp
        o_k = b.n_heads * arch.blend(mla, b.v_head, b.head_dim) / tp
        p_in = np.maximum(p_attn - o_k * d, 0.0)
        # (per-op precision: the projections' and the experts' own dtypes, dse.mechanisms)
        d1 = _floor1(d)
        inv_eff = 2.0 / (peak * b.gemm_fraction)
        attn_peak = b.attn_matmul_flops_per_s
        inv_attn = inv_eff if attn_peak is peak else 2.0 / (attn_peak * b.gemm_fraction)
        self.c_proj, self.w_proj = _gemm_coef(b, ((_floor1(p_in / d), d1), (d1, _floor1(o_k))),
                                              L, inv_attn)
        self.m_proj = p_attn * L * b.attn_weight_bytes / g_hbm
        n_gemm = L * arch.blend(mla, 4.0, 2.0)                 # GEMMs per step, for latencies
        # tp all-reduce of the attention output, per layer: the runtime's fastest kernel
        # (min over NCCL and custom branches) for the busiest rank's rows
        allreduce = _AllReduces(b)
        a = allreduce(tp, b.tp_bw_rel)
        self.n_proj = _per_unit(a, self.layers_stage, self.layers_stage, d * ab)
        # attention core (dse.perf.kernel_attention): decode pads each KV head's query group
        # to group_min_heads rows; prefill efficiency rises with the prompt's tokens
        heads = b.n_heads / tp
        kv_heads = arch.blend(mla, 1.0, np.maximum(b.n_kv_heads / tp, 1.0))
        dec_dims = arch.attn_dims(b, True)
        per_token = 2.0 * heads * dec_dims / dp * stage

        def dec_core(group_max):
            """Decode compute per (sequence, context token) and work items per sequence of a
            kernel taking query groups up to ``group_max``: wider ones fall back to one item
            per query head, off the MMAs; narrower ones pad to group_min_heads rows."""
            fallback = heads > kv_heads * group_max
            q_pad = np.where(fallback, 1.0,
                             np.maximum(heads, kv_heads * b.attn_decode_group_min_heads) / heads)
            eff = b.attn_flops_per_s * np.where(fallback, b.attn_decode_fallback_fraction,
                                                b.attn_decode_compute_fraction)
            return per_token * q_pad / eff, np.where(fallback, heads, kv_heads)

        self.c_core_dec, items = dec_core(b.attn_decode_group_max_heads)
        # sliding-window (local) layers take query groups of at most
        # attn_decode_window_group_max_heads (FlashAttention-2 packs a decode's query group
        # into the tile's rows only without a window: 1, per query head): the step adds their
        # compute's difference, c_core_dec_win, on the local layers' context
        self.dec_win_on = False
        if bool(np.any(b.n_local_layers > 0)):
            c_w, items_w = dec_core(np.minimum(b.attn_decode_group_max_heads,
                                               b.attn_decode_window_group_max_heads))
            self.c_core_dec_win = c_w - self.c_core_dec
            self.dec_win_on = bool(np.any((self.c_core_dec_win != 0.0)
                                          & (b.n_local_layers > 0)))
        # prefill attention runs on the rank that holds the prompt: per rank, not split over dp
        d_qk = arch.blend(mla, b.qk_nope + b.qk_rope, b.head_dim)
        self.c_core_pre = (2.0 * heads * arch.attn_dims(b, False)
                           * (1.0 + b.attn_prefill_dim_half / np.maximum(d_qk, 1.0))
                           / (b.attn_flops_per_s * b.attn_prefill_fraction) * stage)
        # per prompt and per (prompt, query head) time of each prefill attention call
        self.x_core_pre_seq = L * (b.attn_prefill_per_seq_s + heads * b.attn_prefill_per_seq_head_s)
        # (half_tokens: keys per query row; summed over the layers, half_tokens per new token)
        self.pre_half_tokens = b.attn_prefill_half_tokens * b.n_layers
        self.pre_half_rows = b.attn_prefill_half_rows / heads
        kv_tok = arch.kv_elems_per_token_layer(b) * arch.kv_shard_fraction(b) * b.kv_bytes
        self.kv_dec = kv_tok / (b.hbm_bw_bytes_per_s * b.attn_decode_hbm_fraction)
        self.kv_pre = kv_tok / (b.hbm_bw_bytes_per_s * b.attn_prefill_hbm_fraction)
        # each decode query token's query read and output written once per layer
        # (kernel_attention's qo_bytes_per_elem), on the KV's stream
        self.qo_dec = (L * heads * dec_dims * ab
                       / (b.hbm_bw_bytes_per_s * b.attn_decode_hbm_fraction))
        # few (sequence, KV head) items per call stream the KV below its rate: as many more
        # sequences' worth of reads per call as half_items / kv_heads
        self.dec_half = b.attn_decode_half_items / kv_heads
        self.dec_half_on = bool(np.any(self.dec_half))
        # ... fading as split-KV splits a longer context over more CTAs: 1 + ctx / split_tokens
        # per layer (dec_ctx sums the layers' contexts: their mean, split_tokens x n_layers)
        self.dec_split_layers = b.attn_decode_split_tokens * b.n_layers
        self.x_core_seq = L * (b.attn_decode_per_seq_s + items * b.attn_decode_per_seq_kv_head_s)
        if self.dec_win_on:                                  # local layers' own work items
            self.x_core_seq = self.x_core_seq + (b.n_local_layers * stage * (items_w - items)
                                                 * b.attn_decode_per_seq_kv_head_s)
        self.x_core_dec = L * b.attn_decode_latency_s
        self.x_core_pre = L * b.attn_prefill_latency_s
        # dense MLP over a group of g chips: the tp*dp group (every chip sees all tokens) or,
        # replicated, each attention-dp rank's tp group (its own tokens); compute per chip is
        # the same, the weights read and the all-reduce differ
        # (a batch without dense layers, without MoE layers or with tp = 1 everywhere skips
        # those terms: the hot path of many spaces)
        self.dense = bool(np.any(b.n_dense_layers > 0))
        self.moe = bool(np.any(b.n_experts > 0))
        self.tp_ar = bool(np.any(tp > 1))
        rep = b.dense_replicated
        g = ffn_g + rep * (tp - ffn_g)
        if self.dense:
            dense_layers = b.n_dense_layers * stage
            f_chip = b.ffn_dense / g
            self.c_dense, self.w_dense = _gemm_coef(
                b, ((_floor1((b.mlp_mats - 1.0) * f_chip), d1), (d1, _floor1(f_chip))),
                dense_layers, inv_eff)
            self.dense_rows = g / ffn_g                  # rows per chip per step token
            self.m_dense = arch.dense_mlp_params(b) * dense_layers * wb / g / g_hbm
            n_gemm = n_gemm + 2.0 * dense_layers
            # (a row without dense layers takes the tp group's, which is then often shared)
            some_dense = arch.flag(b.n_dense_layers > 0, d)
            f = allreduce(arch.blend(some_dense, g, tp), arch.blend(
                some_dense, b.ffn_bw_rel + rep * (b.tp_bw_rel - b.ffn_bw_rel), b.tp_bw_rel))
            self.n_dense = _per_unit(f, dense_layers, dense_layers, d * ab * g / ffn_g)
        self.tbo = 0.0
        self.a2a_overlap = b.alltoall_overlap_fraction
        if self.moe:
            # routed experts over ep ranks, each expert tp*dp/ep-way sharded
            moe_layers = b.n_moe_layers * stage
            e = np.maximum(b.n_experts, 1.0)
            k = np.minimum(b.top_k, e)
            # per-token chance to miss one expert
            self.log_miss = _log1m(np.minimum(k / e, 1.0 - 1e-12))
            ep = b.ep
            # grouped GEMMs (kernel_gemm.grouped_gemm_s): rows tok*k/ep per chip, moe_half_rows
            # padded per touched expert, expert width inter/moe_tp with its edge waste
            width = np.maximum(b.ffn_expert * ep / ffn_g, 1.0)
            self.expert_pad = b.moe_half_rows * e / np.maximum(k, 1e-12) * arch.flag(k > 0, k)
            # one wave of tiles per call (wave_elements of output, in routed-row units of
            # c_moe: rows per chip = tok k / ep), and the entries routed to other chips that a
            # kernel run over every entry still computes (remote_fraction of a local row's)
            self.expert_wave = (b.moe_wave_elements / width * ep / np.maximum(k, 1e-12)
                                * arch.flag(k > 0, k))
            self.remote_rows = b.moe_remote_fraction * np.maximum(ep - 1.0, 0.0)
            p_exp = arch.expert_params(b)
            self.c_moe = (2.0 * k * p_exp * moe_layers / ffn_g
                          * (1.0 + b.moe_width_half / width + b.moe_hidden_half / d)
                          / (b.expert_matmul_flops_per_s * b.moe_fraction))
            self.m_moe = (arch.expert_slots(b) * p_exp * moe_layers * b.expert_weight_bytes
                          / ffn_g / (b.hbm_bw_bytes_per_s * b.moe_hbm_fraction))
            # non-gated (2-matrix) experts run another kernel: its time factor on both terms
            slow = 1.0 + arch.flag(b.mlp_mats < 2.5, d) * (b.moe_nongated_slowdown - 1.0)
            self.c_moe = self.c_moe * slow
            self.m_moe = self.m_moe * slow
            # distinct ep ranks a token visits: ep (1 - (1 - 1/ep)^k), via one log and one exp
            # (1 where ep = 1 everywhere: every token stays on its rank)
            self.a2a_on = bool(np.any(ep > 1.0))
            if self.a2a_on:
                x = np.minimum(np.maximum(1.0 / ep, 0.0), 0.5)      # (ep <= 1: blended out)
                dest = arch.blend(arch.flag(ep > 1.0, ep), ep * (1.0 - np.exp(k * _log1m(x))),
                                  arch.flag(k > 0, k))
            else:
                dest = arch.flag(k > 0, k)
            # permute/unpermute bytes per routed row, layer in/out bytes per token on the chip
            self.x_moe_tok = moe_layers * d / b.hbm_bw_bytes_per_s * (
                k / ep * b.moe_token_bytes
                + np.minimum(dest, ep) / ep * (b.moe_batch_bytes + k * b.moe_route_bytes))
            self.x_moe = moe_layers * b.moe_latency_s * arch.flag(b.n_experts > 0, d)
            # EP dispatch (fp8 with fp8/fp4 weights, else bf16) and combine (bf16) of the tokens
            # a chip holds (tok / (tp*dp)), with the fitted low-latency and normal kernels
            # (per-rank and per-node deduplication in the normal ones); the step picks the kind.
            # A dispatch below 16 bits carries one fp32 scale per 128 elements on top of its
            # dispatch_bytes (fp8: 1 + 4/128 B)
            disp = b.dispatch_bytes + arch.flag(b.dispatch_bytes < 2.0, d) \
                * (kernel_comm.FP8_ELEM_BYTES - 1.0)
            is_moe = arch.flag(b.n_experts > 0, moe_layers) * moe_layers
            # (no row with ep > 1: no all-to-all, the step skips it)
            self.a2a = {kind: (is_moe * lat, is_moe * spt / ffn_g) for kind, (lat, spt) in
                        kernel_alltoall(b, ep, disp, kernel_comm.BF16_ELEM_BYTES).items()} \
                if self.a2a_on else None
            mode = b.a2a_mode                       # 0 auto, 1 low-latency, 2 normal
            self.ll_decode = arch.flag(mode < 1.5, mode)
            self.ll_mixed = arch.flag(np.abs(mode - 1.0) < 0.5, mode)
            self.tbo = b.two_batch_overlap * arch.flag(b.n_experts > 0, d)
            self.a2a_overlap = b.alltoall_overlap_fraction
            moe_tp = arch.blend(arch.flag(b.n_experts > 0, d), ffn_g / ep, tp)   # (as above)
            r = allreduce(moe_tp, b.tp_bw_rel)
            self.n_moe_ar = _per_unit(r, is_moe, is_moe, np.minimum(dest, ep) / ep * d * ab)
            # shared experts and router
            sh_chip = b.n_shared * b.ffn_shared / ffn_g
            has_sh = arch.flag(b.n_shared > 0, d)
            # (a model without shared experts runs no shared-expert GEMM: without the flag the
            # width-0 GEMMs, clamped to width 1, cost one GEMM's shape penalty per layer)
            c_sh, w_sh = _gemm_coef(
                b, ((_floor1((b.mlp_mats - 1.0) * sh_chip), d1), (d1, _floor1(sh_chip))),
                moe_layers, inv_eff)
            self.c_sh, self.w_sh = has_sh * c_sh, has_sh * w_sh
            p_sh = arch.shared_params_per_layer(b) * moe_layers
            self.m_sh = p_sh * wb / ffn_g / g_hbm
            # the router GEMM [tokens, hidden] x [hidden, experts] is far narrower than a tile
            # (experts <= 256): measured GEMMs of width 1-16 take the same few us as width 1
            # (aiconfigurator-core B300 tables, k = 4096, m <= 2048: 4-10 us), so it pays its
            # FLOPs at the large-GEMM rate and its launch (x_gemm), not the width-edge and
            # one-wave penalties of a wide GEMM (which grow as 1 / width: 70 us per layer for
            # Mixtral's width 8 on H200 FP8)
            self.c_router = moe_layers * d * b.n_experts * inv_eff / ffn_g
            self.w_router = 0.0 * d                  # each chip routes its share of the tokens
            p_router = d * b.n_experts * moe_layers
            self.m_router = p_router * wb / ffn_g / g_hbm
            n_gemm = n_gemm + moe_layers * arch.flag(b.n_experts > 0, d) \
                * (1.0 + 2.0 * has_sh)
        # embeddings and output head, vocab-parallel over tp (the last stage carries it)
        p_head = b.vocab * d
        self.c_head, self.w_head = _gemm_coef(b, ((_floor1(b.vocab / tp), d1),), 1.0, inv_eff)
        self.m_head = p_head * wb / tp / g_hbm
        self.m_embed = d * ab / dp / hbm
        # the vocab-parallel head gathers its logits over tp every step (TensorRT-LLM's lm_head
        # is a ColumnLinear with gather_output=True, in the model dtype: NVIDIA/TensorRT-LLM
        # tensorrt_llm/models/llama/model.py): a ring all-gather moves (g-1)/g of the buffer,
        # half an all-reduce's 2(g-1)/g (nccl-tests doc/PERFORMANCE.md), on NCCL's branches
        # (no custom all-gather); one call per step
        h0, h1 = allreduce(tp, b.tp_bw_rel)[:2]
        self.n_head = _per_unit((h0[:2], h1[:2]), 1.0, 0.5, b.vocab * ab)
        self.x_gemm = (n_gemm + 1.0) * b.gemm_latency_s
        # hand-off to the next stage
        crosses = tp * dp * pp > b.domain_chips
        q0, q1 = p2p_coef(b, crosses)
        has_pp = arch.flag(pp > 1, pp)
        self.pipelined = bool(np.any(pp > 1))
        self.n_pipe = (has_pp * q0, has_pp * q1 * d * ab / dp / tp)
        self.overlap = b.network_overlap_fraction
        self.overhead = self.layers_stage * b.layer_overhead_s + b.step_overhead_s
        # what the step needs in its own form: the KV terms per stage and rank, and which terms
        # no row of the batch has (overlap, two-batch overlap: the step skips their arithmetic)
        self.kv_dec_stage = self.kv_dec / dp / pp
        self.qo_dec_rank = self.qo_dec / dp
        self.kv_pre_stage = self.kv_pre * b.n_layers / pp
        self.x_core_seq_rank = self.x_core_seq / dp
        self.overlap_on = bool(np.any(self.overlap != 0.0))
        self.tbo_on = bool(np.any(self.tbo != 0.0))
        # the GEMM ops' compute time as slope x tokens + intercept (the padding rows folded in
        # once per design, not per step; with two-batch overlap the step pads twice and uses
        # the forms above)
        h = self.h
        self.aff_proj = (self.c_proj, self.c_proj * h + self.w_proj)
        self.aff_head = (self.c_head / dp, self.c_head * h + self.w_head)
        if self.dense:
            self.aff_dense = (self.c_dense * self.dense_rows, self.c_dense * h + self.w_dense)
        if self.moe:
            self.aff_sh = (self.c_sh, self.c_sh * h + self.w_sh)
            self.aff_router = (self.c_router, self.c_router * h + self.w_router)
        self.batch = b

    def gather(self, rows: np.ndarray, batch: Batch) -> "Coefficients":
        """The coefficients of ``batch``, whose designs are this one's rows ``rows`` (they do
        not depend on the batch, lengths or runtime caps: computed once per distinct design)."""
        out = object.__new__(Coefficients)
        for name, v in self.__dict__.items():
            out.__dict__[name] = _take(v, rows)
        out.batch = batch
        return out


class _AllReduces:
    """``network.kernel_allreduce`` of one batch for several (group, bandwidth share) pairs,
    each distinct pair computed once (a step has up to three all-reduces, often over the same
    group)."""

    def __init__(self, b: Batch):
        self.b = b
        self.done = []

    def __call__(self, g, bw_rel):
        for g_, bw_, out in self.done:
            if np.array_equal(g, g_) and np.array_equal(bw_rel, bw_):
                return out
        out = kernel_allreduce(self.b, g, bw_rel)
        self.done.append((g, bw_rel, out))
        return out


def _take(v, rows):
    if v is None or isinstance(v, (bool, int, float)):
        return v
    if isinstance(v, tuple):
        return tuple(_take(x, rows) for x in v)
    if isinstance(v, dict):
        return {k: _take(x, rows) for k, x in v.items()}
    if isinstance(v, Batch):
        return v
    a = np.asarray(v)
    if a.ndim == 2:                    # (branch, design)
        return a if a.shape[1] == 1 else a[:, rows]
    return a if a.ndim == 0 or len(a) == 1 else a[rows]


def _iadd(a, x):
    """``a + x``, in place when ``a`` (a fresh array) already has the broadcast shape (a compact
    batch's length-1 terms may not)."""
    if type(a) is np.ndarray:
        sx = np.shape(x)
        # (the usual cases first: np.broadcast_shapes costs more than a chunk's addition)
        if sx == a.shape or (len(sx) <= a.ndim and all(d == 1 for d in sx)) \
                or a.shape == np.broadcast_shapes(a.shape, sx):
            a += x
            return a
    return a + x


def _affine(form, x):
    """``slope * x + intercept`` for ``form = (slope, intercept)`` (in place on the product)."""
    return _iadd(form[0] * x, form[1])


def _per_unit(branches, n_lat, n_spb, bytes_per_unit):
    """A collective's kernel branches ``(latency_s, seconds_per_byte[, below_bytes, penalty_s])``
    as a step term in units of the step's tokens or rows: ``n_lat`` latencies (calls per step),
    ``n_spb * bytes_per_unit`` per-byte costs per unit, and a runtime's one-shot threshold in
    units (one call's message is ``bytes_per_unit`` per unit)."""
    out = (n_lat * branches[0], branches[1] * (n_spb * bytes_per_unit))
    if len(branches) == 2:
        return out
    return out + (branches[2] / np.maximum(bytes_per_unit, 1e-30),) + tuple(branches[3:])


def _fastest(branches, x):
    """``min_i latency[i] + per_unit[i] * x`` over a collective's kernel branches (row by row:
    contiguous arrays are faster than a broadcast over the branch axis). With a runtime's
    selection rule ``(below, penalty)`` (network.kernel_allreduce): on the rule's rows
    (``penalty`` 1e30, two-shot already off) one-shot below ``below`` units and NCCL's faster
    protocol from there on; elsewhere (``penalty`` 0) the fastest of the four. With the rule on
    every row, ``(lat, per, below)`` of the three branches NCCL LL, Simple and one-shot: the same
    selection without the penalty and the two-shot branch (never selected under the rule)."""
    lat, per = branches[:2]
    t = lat[0] + per[0] * x
    u = np.empty_like(t)
    if len(branches) == 3:                 # the rule on every row: (NCCL LL, Simple, one-shot)
        np.multiply(per[1], x, out=u)
        u += lat[1]
        np.minimum(t, u, out=t)            # NCCL
        np.multiply(per[2], x, out=u)
        u += lat[2]
        return np.where(x < branches[2], u, t)
    if len(branches) == 4:                 # (NCCL LL, NCCL Simple, one-shot, two-shot)
        below, penalty = branches[2:]
        np.multiply(per[1], x, out=u)
        u += lat[1]
        np.minimum(t, u, out=t)            # NCCL
        one = lat[2] + per[2] * x
        one = np.where(x < below, np.minimum(one, t + penalty), t)
        np.multiply(per[3], x, out=u)
        u += lat[3]
        return np.minimum(one, u, out=one)
    for i in range(1, len(lat)):
        np.multiply(per[i], x, out=u)
        u += lat[i]
        np.minimum(t, u, out=t)
    return t


ROUTED = OPS.index("moe_routed")


def op_bound(c, m, n):
    """What bounds an op, as an index of ``dse.perf.BOUNDS`` (the one definition: the per-op
    breakdowns and the decode bound both use it): network (2) when its network time exceeds
    both its compute and memory times, else memory (1) when its memory time exceeds its compute
    time (ties with the network go to memory), else compute (0)."""
    return (2 * ((n > c) & (n > m)) + ((m > c) & (m >= n))).astype(np.int64)


def _share(shares: list, c, m, n, t) -> None:
    """Add an op's time ``t`` to the share of the resource that bounds it (``op_bound``, spelt
    out per kind of op: this is the hot path)."""
    if c is None:                                  # a network-only op
        shares[2] = shares[2] + t
        return
    if n is None:                                  # no network term: compute or memory
        mem = m > c
        shares[1] = shares[1] + t * mem
        shares[0] = shares[0] + t * ~mem
        return
    net = (n > c) & (n > m)
    mem = (m > c) & (m >= n)
    shares[2] = shares[2] + t * net
    shares[1] = shares[1] + t * mem
    shares[0] = shares[0] + t * ~(net | mem)


def bound_shares(st: "StepTimes") -> tuple:
    """A step's op time split by what bounds each op (``op_bound``): compute, memory, network."""
    cls = op_bound(st.compute_s, st.memory_s, st.network_s)
    return tuple((st.op_s * (cls == j)).sum(0) for j in range(3))


def step(k: Coefficients, dec, pre, dec_ctx, new, prior, pairs, logits_rows,
         breakdown: bool = False, sums: bool = False, pre_rank=None, decode_step: bool = False,
         seq_tokens=None, dec_local=None):
    """One stage step of one micro-batch (tokens are per micro-batch, whole instance).

    ``dec_ctx`` is ``arch.context_layers`` of the decode context and ``pairs`` is
    ``arch.prefill_pairs_layers(new, prior)`` per request: the caller computes them once for
    several steps. ``pre_rank``: prefill tokens on the busiest attention data-parallel rank
    (default ``pre / dp``, an even spread): a prompt lives on one rank, so its attention and
    projections run there while the other ranks wait at the next collective.
    ``decode_step``: a decode-only step (``serving.a2a_kernel = "auto"`` runs the low-latency
    EP kernels there and the normal ones in steps that carry prompt tokens, as DeepEP does).
    ``seq_tokens``: decode tokens per sequence (speculative verification, dse.perf.spec): the
    KV cache and per-sequence attention costs count ``dec / seq_tokens`` sequences.
    ``dec_local``: ``arch.local_context_layers`` of the same context (the local layers' share
    of ``dec_ctx``), needed where ``k.dec_win_on`` (their decode runs another kernel form).

    Returns the step time; with ``sums`` also the compute, memory and network time summed over
    ops and the op time split by what bounds each op (``bound_shares``); with ``breakdown`` the
    full per-op StepTimes.
    """
    b = k.batch
    tok = dec + pre
    # tokens on every row (the usual case): no masking of the per-token terms
    some = None if bool(np.all(tok > 0)) else arch.flag(tok > 0, tok)
    masked = (lambda v: v) if some is None else (lambda v: v * some)  # noqa: E731
    # two-batch overlap (serving.ep_overlap = "tbo"): the step runs as two micro-batches, so
    # every weight is read, every GEMM padded and every kernel launched twice, while one
    # micro-batch's all-to-all runs under the other's compute
    two = 1.0 + k.tbo
    twice = (lambda v: v * two) if k.tbo_on else (lambda v: v)  # noqa: E731
    h = twice(k.h)
    dp = k.dp
    # (a decode-only step has no prefill terms)
    has_pre = bool(np.any(pre)) or (pre_rank is not None and bool(np.any(pre_rank)))
    pre_rank = pre / dp if pre_rank is None else pre_rank
    rows = dec / dp
    if has_pre:
        rows = rows + pre_rank                     # the busiest attention rank's rows
    tbo = k.tbo_on
    c_proj = masked(k.c_proj * (rows + h) + k.w_proj if tbo else _affine(k.aff_proj, rows))
    n_proj = _fastest(k.n_proj, rows) if k.tp_ar else None
    seqs = dec if seq_tokens is None else dec / seq_tokens     # hook: dse.perf.spec
    ctx = k.__dict__.get("_ctx")
    if ctx is None or ctx[0] is not dec_ctx:       # per design: once for the steps of a call
        kv = k.kv_dec_stage * dec_ctx
        ramp = kv / (1.0 + dec_ctx / k.dec_split_layers) if k.dec_half_on else None
        core = k.c_core_dec * dec_ctx
        if k.dec_win_on and dec_local is not None:
            core = core + k.c_core_dec_win * dec_local
        ctx = (dec_ctx, core, kv, ramp)
        k.__dict__["_ctx"] = ctx
    c_core = ctx[1] * dec
    m_core = ctx[2] * seqs
    m_core = _iadd(m_core, k.qo_dec_rank * dec)    # every query token's Q and O
    m_core = _iadd(m_core, k.kv_pre_stage * rows)
    x_core = k.x_core_seq_rank * seqs
    on_dec = arch.flag(dec > 0, tok)
    if k.dec_half_on:                              # the KV stream's ramp in work items per call
        m_core = _iadd(m_core, ctx[3] * (dp * k.dec_half) * on_dec * two)
    lat_core = k.x_core_dec * on_dec
    if has_pre:
        new1 = np.maximum(new, 1.0)
        reqs = pre_rank / new1                     # prompts (or their share) on that rank
        # prefill attention: efficiency rises with the keys each query row attends to
        # (pairs / new: each query tile's fixed work over its key loop) and with the call's
        # rows (batch x heads)
        pre_eff = 1.0 + k.pre_half_rows / np.maximum(reqs * new, 1.0)
        c_core = _iadd(c_core, k.c_core_pre * reqs * (pairs + k.pre_half_tokens * new1)
                       * pre_eff)
        m_core = _iadd(m_core, k.kv_pre_stage * (reqs * prior))
        x_core = _iadd(x_core, k.x_core_pre_seq * reqs)
        lat_core = _iadd(lat_core, k.x_core_pre * arch.flag(pre > 0, tok))
    x_core = _iadd(x_core, twice(lat_core))
    none = (None, None, None, None)
    if k.dense:
        c_dense = masked(k.c_dense * (tok * k.dense_rows + h) + k.w_dense if tbo
                         else _affine(k.aff_dense, tok))
        n_dense = _fastest(k.n_dense, tok)
        dense = (c_dense, twice(k.m_dense), n_dense, None)
    else:
        dense = none
    a2a = None
    if k.moe:
        touched = np.exp(tok * k.log_miss)
        np.subtract(1.0, touched, out=touched)
        imb = imbalance.factor(b)            # hook: the busiest EP rank's routed tokens
        rt = tok if imb is None else tok * imb
        c_moe = masked(k.c_moe * (rt + tok * k.remote_rows               # tiles per expert used
                                  + twice(k.expert_pad * touched + k.expert_wave)))
        m_moe = twice(k.m_moe * touched)
        x_moe = masked(k.x_moe_tok * rt + twice(k.x_moe))
        if k.a2a is not None:                # (None: ep = 1 on every row, no all-to-all)
            ll, nm = k.a2a["ll"], k.a2a["normal"]
            a2a = arch.blend(k.ll_decode if decode_step else k.ll_mixed,
                             twice(ll[0]) + ll[1] * rt, twice(nm[0]) + nm[1] * rt)
        n_moe = _fastest(k.n_moe_ar, tok)
        c_sh = masked(k.c_sh * (tok + h) + k.w_sh if tbo else _affine(k.aff_sh, tok))
        c_router = masked(k.c_router * (tok + h) + k.w_router if tbo
                          else _affine(k.aff_router, tok))
        moe = ((c_moe, m_moe, n_moe, x_moe), (c_sh, twice(k.m_sh), None, None),
               (c_router, twice(k.m_router), None, None))
    else:
        moe = (none, none, none)
    c_head = k.c_head * (logits_rows / dp + h) + k.w_head if tbo \
        else _affine(k.aff_head, logits_rows)
    n_head = _fastest(k.n_head, logits_rows / dp) if k.tp_ar else None
    m_head = k.m_head + k.m_embed * tok
    if k.tbo_on:
        m_head = m_head + k.m_head * k.tbo
    n_pipe = k.n_pipe[0] + k.n_pipe[1] * tok if k.pipelined else None
    phi = k.overlap if k.overlap_on else None
    # (compute, memory, network, additive time) per op, None where an op has no such term
    # (the loop below skips its arithmetic: this is the hot path); the GEMMs' launch latencies
    # are fixed time of the step (overhead)
    parts = ((c_proj, twice(k.m_proj), n_proj, None), (c_core, m_core, None, x_core), dense,
             *moe, (c_head, m_head, n_head, None), (None, None, n_pipe, None))
    overhead = k.overhead + masked(twice(k.x_gemm))
    total = overhead
    ops = []
    sc = sm = sn = 0.0
    shares = [0.0, 0.0, 0.0]                       # op time by bounding resource (op_bound)
    routed = None
    busy_all = 0.0 if a2a is not None else None    # (only the all-to-all's overlap needs it)
    for i, (c, m, n, x) in enumerate(parts):
        if c is None and n is None:                # an op the batch does not have
            if breakdown:
                ops.append([0.0, 0.0, 0.0, 0.0])
            continue
        if c is None:                              # a network-only op (the pipeline hand-off)
            busy, t = 0.0, n
        else:
            busy = np.maximum(c, m)
            if x is not None:
                busy = _iadd(busy, x)
            if busy_all is not None:
                busy_all = busy_all + busy
            if n is None:
                t = busy
            elif phi is None:                      # serialised: busy + n
                if breakdown or sums:
                    t = busy + n
                else:
                    t = None
                    total = total + n
            else:
                # (1-phi)*(busy+n) + phi*max(busy, n)
                t = busy + n - phi * np.minimum(busy, n)
        total = total + (busy if t is None else t)
        if breakdown:
            ops.append([0.0 if v is None else v for v in (c, m, n)] + [t])
        elif sums:
            if c is not None:
                sc, sm = sc + c, sm + m
            if n is not None:
                sn = sn + n
            if i == ROUTED and a2a is not None:    # attributed once its all-to-all is known
                routed = (c, m, n, t)
            else:
                _share(shares, c, m, n, t)
    # the EP all-to-all: a share (serving.alltoall_overlap_fraction, all of it with two-batch
    # overlap) hides under the rest of the step's compute and memory time
    if a2a is not None:
        psi = np.maximum(k.a2a_overlap, k.tbo)
        a2a_seen = a2a - psi * np.minimum(a2a, busy_all)
        total = total + a2a_seen
        if breakdown:
            moe = ops[OPS.index("moe_routed")]
            moe[2], moe[3] = moe[2] + a2a, moe[3] + a2a_seen
        elif sums:
            sn = sn + a2a
            c, m, n, t = routed if routed is not None else (None, None, None, 0.0)
            _share(shares, c, m, a2a if n is None else n + a2a, t + a2a_seen)
    if sums and not breakdown:
        return total, sc, sm, sn, tuple(shares)
    if not breakdown:
        return total
    shape = np.shape(total)
    stack = [np.stack([np.broadcast_to(np.asarray(o[i], float), shape) for o in ops])
             for i in range(4)]
    return StepTimes(*stack, np.broadcast_to(overhead, shape), total)
