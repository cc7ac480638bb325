"""The attention ops of a step: ``attn_proj`` (the projections and their tp all-reduce) and
``attn_core`` (scores and values against the KV cache).

Per chip, one pipeline stage, one micro-batch; a multiply-add is 2 FLOPs. Attention is
tp-sharded by heads and data-parallel (dp) over sequences: each attention-DP rank holds its own
sequences' KV and runs its own tokens, and a prompt lives on one rank, so a step takes as long
as its busiest rank (``Load.rows``).

attn_proj
    FLOPs  2 x (q/k/v/o or MLA projection weights / tp) x layers x rows
    HBM    those weights, once per micro-batch
    net    the all-reduce of the attention output over tp, once per layer: rows x hidden x
           activation bytes a call (ring bytes, ``forms.allreduce_bytes``)
    time   compute ``gemm_form`` (shape factors, padding rows, waves) over the attention
           matmul peak; memory weights / (HBM x gemm_hbm_fraction); network the fitted
           all-reduce kernels (``kernel_comm``), the runtime's fastest branch

attn_core (``dse.perf.kernel_attention``)
    FLOPs  decode: 2 x heads/tp x (d_qk + d_v) per (query token, context token, layer);
           prefill: the same per causal (query, key) pair of the prompt, on its rank
    HBM    decode reads every sequence's KV (context x KV bytes per token and layer on this
           chip) and each query's Q and O; every new token writes its KV; a prompt after a
           cached prefix reads the prefix's KV
    time   compute: FLOPs over the attention peak x a fitted fraction, with the query group
           padded to the MMA's rows (decode) or the efficiency rising with keys per query and
           rows per call (prefill); memory: bytes over HBM x a fitted fraction, plus the
           ramp of a call with few work items (a rate penalty, not bytes: left out of the
           work table); additive: kernel latencies and per-sequence costs
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dse.perf import arch, tp2d
from dse.perf.basis import Basis, Load
from dse.perf.batch import Batch
from dse.perf.forms import (
    AllReduces,
    affine,
    allreduce_bytes,
    fastest,
    floor1,
    gemm_form,
    iadd,
    per_unit,
    work_field,
)


@dataclass(frozen=True)
class AttnProj:
    """The attention projections of one stage (per chip)."""

    c: np.ndarray             # compute s = c (rows + h) + w  (gemm_form)
    w: np.ndarray
    aff: tuple                # the same as (slope, intercept) in rows
    mem_s: np.ndarray         # weight_bytes / GEMM HBM rate
    net: tuple                # tp all-reduce, a per_unit form in rows
    net_on: bool              # tp > 1 on some row
    net2d: tuple | None       # tp collectives on the links (2D weight-stationary, or a
    #                           topology's link_collectives: dse.perf.tp2d): (s per row, s per
    #                           step); None: no row has them
    # the work (``work``; ``work_field``s are left out of ``Coefficients.gather``)
    params: np.ndarray = work_field()        # projection weights per chip per layer (elements)
    layers: np.ndarray = work_field()        # layers on this stage
    weight_bytes: np.ndarray = work_field()  # streamed per micro-batch: params x layers x bytes
    group: np.ndarray = work_field()         # tp
    message: np.ndarray = work_field()       # all-reduce bytes per row per layer: hidden x act
    gemms: np.ndarray = work_field()         # GEMM launches per step
    one_d: np.ndarray = work_field()         # 1.0 where the kernels' all-reduce runs
    bytes2d: np.ndarray = work_field()       # link collectives' bytes per row, stage layers

    def time(self, s: Load):
        c = s.masked(self.c * (s.rows + s.h) + self.w if s.tbo_on else affine(self.aff, s.rows))
        n = fastest(self.net, s.rows) if self.net_on else None
        if self.net2d is not None:          # (no kernel all-reduce on any row: n is None)
            n2 = affine(self.net2d, s.rows)
            n = n2 if n is None else iadd(n, n2)
        return c, s.twice(self.mem_s), n, None

    def work(self, s: Load):
        return (2.0 * self.params * self.layers * s.rows, s.twice(self.weight_bytes),
                allreduce_bytes(self.group, s.rows * self.message) * self.layers * self.one_d
                + self.bytes2d * s.rows)


def attn_proj_terms(b: Batch, c: Basis, allreduce: AllReduces) -> AttnProj:
    """q/k/v/o (or the MLA down/up) projections, tp-sharded; each dp rank handles its own
    tokens: q/k/v read the hidden state, o writes it, and the tp group all-reduces o's output
    every layer (the runtime's fastest kernel for the busiest rank's rows). The projections
    run in their own dtype (``attn_weight_bytes``, ``attn_matmul_flops_per_s``:
    dse.build.mechanisms)."""
    d, L = c.d, c.layers
    p_attn = arch.attn_params_per_layer(b) / c.tp
    o_k = b.n_heads * arch.blend(c.mla, b.v_head, b.head_dim) / c.tp
    p_in = np.maximum(p_attn - o_k * d, 0.0)
    attn_peak = b.attn_matmul_flops_per_s
    inv_attn = c.inv_eff if attn_peak is c.peak else 2.0 / (attn_peak * b.gemm_fraction)
    cp, wp = gemm_form(b, ((floor1(p_in / d), c.d1), (c.d1, floor1(o_k))), L, inv_attn)
    weight_bytes = p_attn * L * b.attn_weight_bytes
    message = d * c.ab
    # tp collectives on the links (dse.perf.tp2d: 2D weight-stationary, or 1D on a topology
    # with link_collectives): the inner widths in (q, k, v) and out (o's input), whole model;
    # the kernels' all-reduce is off there
    net2d, one_d, bytes2d = tp2d.block_terms(b, L, d, p_in * c.tp / c.d1, o_k * c.tp)
    return AttnProj(
        params=p_attn, layers=L, weight_bytes=weight_bytes, c=cp, w=wp, aff=(cp, cp * c.h + wp),
        mem_s=weight_bytes / c.g_hbm,
        net=per_unit(allreduce(c.tp, b.tp_bw_rel), L * one_d, L * one_d, message),
        net_on=c.tp_ar, net2d=net2d, group=c.tp, message=message,
        gemms=L * arch.blend(c.mla, 4.0, 2.0), one_d=one_d, bytes2d=bytes2d)


@dataclass(frozen=True)
class DecodeContext:
    """The decode attention's per-sequence terms at one context (once per design for the
    steps of a call): compute per decode token, KV read time per sequence, and its ramp."""

    ctx: np.ndarray            # the context summed over the layers (the cache key)
    core: np.ndarray           # compute s per decode token
    kv: np.ndarray             # KV read s per sequence
    ramp: np.ndarray | None    # the KV stream's ramp per work item (None: no row has one)


@dataclass(frozen=True)
class AttnCore:
    """Scores and values against the KV cache, one stage (per chip)."""

    # decode compute: c_dec = dec_flops x q_pad / (attention peak x fraction), per (decode
    # token, context token summed over the layers); the local layers' kernel form differs by
    # c_dec_win on their context
    c_dec: np.ndarray
    c_dec_win: np.ndarray | None
    win_on: bool
    # prefill compute: c_pre x pairs, per prompt on the busiest rank
    c_pre: np.ndarray
    pre_half_tokens: np.ndarray
    pre_half_rows: np.ndarray
    # the KV reads and writes and each decode token's Q and O, as times
    kv_dec_stage: np.ndarray   # s per (sequence, context token summed over the layers)
    kv_pre_stage: np.ndarray   # s per token written (or prefix token read), all stage layers
    qo_dec_rank: np.ndarray    # s per decode token of the instance (its Q read, O written)
    dec_half: np.ndarray
    dec_half_on: bool
    dec_split_layers: np.ndarray
    # additive times: per sequence, per prompt, per call
    x_seq_rank: np.ndarray
    x_pre_seq: np.ndarray
    x_dec: np.ndarray
    x_pre: np.ndarray
    # the KV split by sequence (dse.perf.tp2d): the queries' and outputs' all-to-all, (s per
    # row, s per step); None: no row splits it so
    a2a: tuple | None
    # the work (``work``; left out of ``Coefficients.gather``)
    a2a_bytes: np.ndarray | float = work_field()   # its bytes per row, stage layers
    dec_flops: np.ndarray = work_field()   # 2 heads/tp (d_qk + d_v) / dp / pp
    heads: np.ndarray = work_field()       # query heads per chip
    pre_dims: np.ndarray = work_field()    # d_qk + d_v of the prefill form
    stage: np.ndarray = work_field()
    kv_tok: np.ndarray = work_field()      # KV bytes per token and layer on this chip
    n_layers: np.ndarray = work_field()
    dp: np.ndarray = work_field()
    pp: np.ndarray = work_field()
    qo_bytes: np.ndarray = work_field()    # a decode token's Q and O bytes, all stage layers

    def context(self, dec_ctx, dec_local=None) -> DecodeContext:
        """The decode terms at context ``dec_ctx`` (``arch.context_layers``; ``dec_local``: its
        local layers' share, where their kernel form differs)."""
        kv = self.kv_dec_stage * dec_ctx
        ramp = kv / (1.0 + dec_ctx / self.dec_split_layers) if self.dec_half_on else None
        core = self.c_dec * dec_ctx
        if self.win_on and dec_local is not None:
            core = core + self.c_dec_win * dec_local
        return DecodeContext(dec_ctx, core, kv, ramp)

    def time(self, s: Load, ctx: DecodeContext):
        c = ctx.core * s.dec
        m = ctx.kv * s.seqs
        m = iadd(m, self.qo_dec_rank * s.dec)      # every query token's Q and O
        m = iadd(m, self.kv_pre_stage * s.rows)     # every new token's KV written
        x = self.x_seq_rank * s.seqs
        if self.dec_half_on:                        # the KV stream's ramp in work items per call
            ramp = ctx.ramp * (s.dp * self.dec_half)
            m = iadd(m, s.twice(ramp if type(s.on_dec) is float else ramp * s.on_dec))
        lat = self.x_dec * s.on_dec
        if s.has_pre:
            # prefill attention: efficiency rises with the keys each query row attends to
            # (pairs / new: each query tile's fixed work over its key loop) and with the call's
            # rows (batch x heads)
            reqs = s.reqs
            pre_eff = 1.0 + self.pre_half_rows / np.maximum(reqs * s.new, 1.0)
            c = iadd(c, self.c_pre * reqs * (s.pairs + self.pre_half_tokens * s.new1) * pre_eff)
            m = iadd(m, self.kv_pre_stage * (reqs * s.prior))
            x = iadd(x, self.x_pre_seq * reqs)
            lat = iadd(lat, self.x_pre * arch.flag(s.pre > 0, s.tok))
        x = iadd(x, s.twice(lat))
        return c, m, None if self.a2a is None else affine(self.a2a, s.rows), x

    def work(self, s: Load, dec_ctx):
        """Decode: every decode token against its context, its sequence's KV read, its Q and
        O; every new token's KV written; prefill: the causal pairs of the prompts on the
        busiest rank and their cached prefix's KV read."""
        kv_stage = self.kv_tok * self.n_layers / self.pp       # one token's KV, stage layers
        flops = self.dec_flops * dec_ctx * s.dec
        kv_read = self.kv_tok / self.dp / self.pp * dec_ctx * s.seqs
        hbm = kv_read + self.qo_bytes / self.dp * s.dec + kv_stage * s.rows
        if s.has_pre:
            flops = flops + 2.0 * self.heads * self.pre_dims * self.stage * s.reqs * s.pairs
            hbm = hbm + kv_stage * (s.reqs * s.prior)
        return flops, hbm, self.a2a_bytes * s.rows


def attn_core_terms(b: Batch, c: Basis) -> AttnCore:
    """Attention against the KV cache (dse.perf.kernel_attention): decode pads each KV head's
    query group to group_min_heads rows; prefill efficiency rises with the prompt's tokens."""
    heads = b.n_heads / c.tp
    kv_heads = arch.blend(c.mla, 1.0, np.maximum(b.n_kv_heads / c.tp, 1.0))
    dec_dims = arch.attn_dims(b, True)
    dec_flops = 2.0 * heads * dec_dims / c.dp * c.stage
    # the KV split by sequence (dse.perf.tp2d): a chip runs every head of 1 / tp of the
    # sequences, so a sequence's query groups and work items are the model's own
    kvb, seq_share, a2a, a2a_bytes = _kv_batch_terms(b, c, dec_dims)
    heads_q = arch.blend(kvb, b.n_heads, heads)
    kv_q = arch.blend(kvb, arch.blend(c.mla, 1.0, np.maximum(b.n_kv_heads, 1.0)), kv_heads)
    c_dec, items = _decode_core(b, heads_q, kv_q, dec_flops, b.attn_decode_group_max_heads)
    win_on, c_win, x_win = _window_terms(b, c, heads_q, kv_q, dec_flops, c_dec, items)
    kv_tok = arch.kv_elems_per_token_layer(b) * arch.kv_shard_fraction(b) * b.kv_bytes
    dec_rate = b.hbm_bw_bytes_per_s * b.attn_decode_hbm_fraction
    # each decode query token's query read and output written once per layer
    # (kernel_attention's qo_bytes_per_elem), on the KV's stream
    qo_bytes = c.layers * heads * dec_dims * c.ab
    kv_pre = kv_tok / (b.hbm_bw_bytes_per_s * b.attn_prefill_hbm_fraction)
    # few (sequence, KV head) items per call stream the KV below its rate: as many more
    # sequences' worth of reads per call as half_items / kv_heads, fading as split-KV splits a
    # longer context over more CTAs: 1 + ctx / split_tokens per layer (dec_ctx sums the layers'
    # contexts: their mean, split_tokens x n_layers)
    # (split by sequence: in units of a sequence's 1 / tp share of the KV read)
    dec_half = b.attn_decode_half_items / kv_q / seq_share
    x_seq = c.layers * (b.attn_decode_per_seq_s + items * b.attn_decode_per_seq_kv_head_s)
    if win_on:                                       # local layers' own work items
        x_seq = x_seq + x_win
    x_seq = x_seq * seq_share                        # a chip's share of the sequences
    pre = _prefill_core(b, c, heads)
    return AttnCore(
        dec_flops=dec_flops, c_dec=c_dec, c_dec_win=c_win, win_on=win_on, heads=heads,
        stage=c.stage, **pre, kv_tok=kv_tok, n_layers=b.n_layers, dp=c.dp, pp=c.pp,
        kv_dec_stage=kv_tok / dec_rate / c.dp / c.pp, kv_pre_stage=kv_pre * b.n_layers / c.pp,
        qo_bytes=qo_bytes, qo_dec_rank=qo_bytes / dec_rate / c.dp, dec_half=dec_half,
        dec_half_on=bool(np.any(dec_half)),
        dec_split_layers=b.attn_decode_split_tokens * b.n_layers, x_seq_rank=x_seq / c.dp,
        x_dec=c.layers * b.attn_decode_latency_s, x_pre=c.layers * b.attn_prefill_latency_s,
        a2a=a2a, a2a_bytes=a2a_bytes)


def _kv_batch_terms(b: Batch, c: Basis, dims):
    """The KV split by sequence over tp (dse.perf.tp2d): its 0/1 flag, the share of the
    sequences one chip runs (1 / tp there, else 1), the all-to-all as ``(s per row, s per
    step)`` (None: no row splits it so) and its bytes per row over the stage's layers."""
    if not tp2d.kv_on(b):
        return 0.0, 1.0, None, 0.0
    kvb = b.kv_batch
    lat_s, s_per_row = tp2d.kv_alltoall_form(b, c.layers, dims)
    nbytes = tp2d.kv_alltoall_bytes_per_row(b.n_heads, dims, c.tp, c.ab) * c.layers * kvb
    return kvb, arch.blend(kvb, 1.0 / c.tp, 1.0), (s_per_row, lat_s), nbytes


def _decode_core(b: Batch, heads, kv_heads, dec_flops, group_max):
    """Decode compute per (sequence, context token) and work items per sequence of a kernel
    taking query groups up to ``group_max``: wider ones fall back to one item per query head,
    off the MMAs; narrower ones pad to group_min_heads rows."""
    fallback = heads > kv_heads * group_max
    q_pad = np.where(fallback, 1.0,
                     np.maximum(heads, kv_heads * b.attn_decode_group_min_heads) / heads)
    eff = b.attn_flops_per_s * np.where(fallback, b.attn_decode_fallback_fraction,
                                        b.attn_decode_compute_fraction)
    return dec_flops * q_pad / eff, np.where(fallback, heads, kv_heads)


def _window_terms(b: Batch, c: Basis, heads, kv_heads, dec_flops, c_dec, items):
    """Sliding-window (local) layers take query groups of at most
    attn_decode_window_group_max_heads (FlashAttention-2 packs a decode's query group into the
    tile's rows only without a window: 1, per query head): the step adds their compute's
    difference on the local layers' context, and their own work items per sequence.
    ``(on, compute difference, per-sequence time difference)``; off without local layers."""
    if not bool(np.any(b.n_local_layers > 0)):
        return False, None, None
    c_w, items_w = _decode_core(b, heads, kv_heads, dec_flops,
                                np.minimum(b.attn_decode_group_max_heads,
                                           b.attn_decode_window_group_max_heads))
    c_win = c_w - c_dec
    on = bool(np.any((c_win != 0.0) & (b.n_local_layers > 0)))
    if not on:
        return False, c_win, None
    return True, c_win, b.n_local_layers * c.stage * (items_w - items) \
        * b.attn_decode_per_seq_kv_head_s


def _prefill_core(b: Batch, c: Basis, heads) -> dict:
    """Prefill attention, on the rank that holds the prompt (per rank, not split over dp):
    compute per causal pair, its efficiency shapes, and per-prompt costs."""
    d_qk = arch.blend(c.mla, b.qk_nope + b.qk_rope, b.head_dim)
    pre_dims = arch.attn_dims(b, False)
    c_pre = (2.0 * heads * pre_dims * (1.0 + b.attn_prefill_dim_half / np.maximum(d_qk, 1.0))
             / (b.attn_flops_per_s * b.attn_prefill_fraction) * c.stage)
    return dict(
        pre_dims=pre_dims, c_pre=c_pre,
        # (half_tokens: keys per query row; summed over the layers, half_tokens per new token)
        pre_half_tokens=b.attn_prefill_half_tokens * b.n_layers,
        pre_half_rows=b.attn_prefill_half_rows / heads,
        # per prompt and per (prompt, query head) time of each prefill attention call
        x_pre_seq=c.layers * (b.attn_prefill_per_seq_s
                              + heads * b.attn_prefill_per_seq_head_s))
