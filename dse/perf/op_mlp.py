"""The MLP ops of a step: ``mlp_dense``, ``moe_routed`` (with the EP all-to-all),
``moe_shared`` and ``router``.

Per chip, one pipeline stage, one micro-batch; a multiply-add is 2 FLOPs; ``tok`` is the step's
tokens (whole instance), ``g`` the group an MLP is split over.

mlp_dense  over the tp*dp group (every chip sees every token) or, replicated, each
           attention-DP rank's tp group (its own tokens)
    FLOPs  2 x (dense MLP weights / g) x dense layers x tok x g / (tp dp)
    HBM    the weights on this chip, once per micro-batch
    net    the all-reduce of the MLP output over g, once per dense layer: tok x g / (tp dp)
           x hidden x activation bytes a call
moe_routed experts over ep ranks, each tp*dp/ep-way sharded (grouped GEMMs,
           ``kernel_gemm.grouped_gemm_s``)
    FLOPs  2 x top_k x expert weights x MoE layers x tok' / (tp dp), ``tok'`` the busiest EP
           rank's routed tokens (tok x ``expert_imbalance``)
    HBM    the touched experts' weights on this chip (1 - (1 - k/E)^tok of them), plus the
           permute, quantize and layer in/out bytes per routed row and per token
    net    with attention DP (dp > 1): EP dispatch (fp8 + scales, or bf16) and combine
           (bf16) of the tokens this chip holds, tok' / (tp dp) x the bytes a token sends to
           other ranks and nodes (``kernel_comm.alltoall_bytes``: low-latency kernels one row
           per (token, expert), normal ones deduplicated per rank and node), once per MoE
           layer; plus the all-reduce over an expert's tp*dp/ep shards of the tokens on the
           chip. dp = 1: every chip holds every token, so no all-to-all; the all-reduce of the
           full output (tok x hidden x activation bytes) over the tp group, as at ep = 1
moe_shared shared experts where the dense MLP runs (``arch.shared_group``: g = tp*dp, or tp
           replicated per attention-DP rank): 2 x weights / (tp dp) x tok FLOPs, their
           weights / g read
router     the [tok, hidden] x [hidden, experts] GEMM, split over tp*dp

Times: compute is each GEMM's FLOPs over the matmul peak x a fitted fraction with its shape
factors (``forms.gemm_form``; the grouped GEMMs' tile padding per touched expert, one wave,
width and hidden edges, remote entries); memory is the weight bytes over HBM x a fitted
fraction; network the fitted collective kernels (``kernel_comm``); the permute bytes and a
fixed time per MoE layer are additive.

Which tokens a chip's grouped GEMM sees (``moe_terms``): the kernel terms were fitted on
single-GPU tables that run every token of the batch through one chip's kernel, the entries of
other chips' experts masked (``moe_remote_fraction`` of a local row each, and
``moe_batch_bytes`` / ``moe_route_bytes`` per token and routed entry of the batch). Under TP+EP
(dp = 1) that is what runs: every chip holds every token. Under attention DP (dp > 1) the
all-to-all hands a chip only the tokens routed to it, each with its top-k list (DeepEP,
TensorRT-LLM's WideEP): tok x dest / ep tokens (``dest`` the ranks a token visits,
ep (1 - (1 - 1/ep)^k)) whose tok x k / ep x dest entries include the chip's own rows. Its
remote entries are then rows x (dest - 1), at most k - 1 per own row, and its per-token and
per-entry bytes those of its dispatched tokens: at a given rows per chip and experts per
chip the kernel time no longer grows with ep (dest tends to k; the whole-batch forms grew as
ep). Checked against aiconfigurator-core's wide-EP MoE tables
(``python -m dse.calibration.kernels.wideep``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dse.perf import arch, kernel_comm, tp2d
from dse.perf.basis import Basis, Load
from dse.perf.batch import Batch
from dse.perf.forms import (
    AllReduces,
    affine,
    allreduce_bytes,
    fastest,
    floor1,
    gemm_form,
    log1m,
    per_unit,
    work_field,
)
from dse.perf.network import kernel_alltoall


@dataclass(frozen=True)
class DenseMlp:
    """The dense layers' MLP of one stage (per chip)."""

    rows_per_token: np.ndarray  # g / (tp dp): rows per chip per step token
    c: np.ndarray               # compute s = c (tok rows_per_token + h) + w
    w: np.ndarray
    aff: tuple                  # the same as (slope, intercept) in tokens
    mem_s: np.ndarray           # weight_bytes / GEMM HBM rate
    net: tuple                  # the all-reduce, a per_unit form in tokens
    net2d: tuple | None         # tp collectives on the links (dse.perf.tp2d): (s per token,
    #                             s per step); None: no row has them
    # the work (``work``; left out of ``Coefficients.gather``)
    params: np.ndarray = work_field()        # dense MLP weights per layer (whole model)
    group: np.ndarray = work_field()         # g: chips one dense MLP is split over
    layers: np.ndarray = work_field()        # dense layers on this stage
    weight_bytes: np.ndarray = work_field()  # params x layers x dtype bytes / g
    net_group: np.ndarray = work_field()     # the all-reduce's group
    message: np.ndarray = work_field()       # its bytes per token per layer
    gemms: np.ndarray = work_field()         # GEMM launches per step
    one_d: np.ndarray = work_field()         # 1.0 where the kernels' all-reduce runs
    bytes2d: np.ndarray = work_field()       # link collectives' bytes per token, stage layers

    def time(self, s: Load):
        c = s.masked(self.c * (s.tok * self.rows_per_token + s.h) + self.w if s.tbo_on
                     else affine(self.aff, s.tok))
        n = fastest(self.net, s.tok)
        if self.net2d is not None:
            n = n + affine(self.net2d, s.tok)
        return c, s.twice(self.mem_s), n, None

    def work(self, s: Load):
        flops = 2.0 * self.params / self.group * self.layers * (s.tok * self.rows_per_token)
        return (flops, s.twice(self.weight_bytes),
                allreduce_bytes(self.net_group, s.tok * self.message) * self.layers * self.one_d
                + self.bytes2d * s.tok)


def dense_mlp_terms(b: Batch, c: Basis, allreduce: AllReduces) -> DenseMlp:
    """Dense MLP over a group of g chips: the tp*dp group (every chip sees all tokens) or,
    replicated, each attention-dp rank's tp group (its own tokens); compute per chip is the
    same, the weights read and the all-reduce differ."""
    rep = b.dense_replicated
    g = arch.dense_group(b)
    layers = b.n_dense_layers * c.stage
    f_chip = b.ffn_dense / g
    cd, wd = gemm_form(b, ((floor1((b.mlp_mats - 1.0) * f_chip), c.d1), (c.d1, floor1(f_chip))),
                       layers, c.inv_eff)
    rows = g / c.ffn_g
    params = arch.dense_mlp_params(b)
    weight_bytes = params * layers * c.wb / g
    # (a row without dense layers takes the tp group's, which is then often shared)
    some_dense = arch.flag(b.n_dense_layers > 0, c.d)
    net_group = arch.blend(some_dense, g, c.tp)
    f = allreduce(net_group, arch.blend(
        some_dense, b.ffn_bw_rel + rep * (b.tp_bw_rel - b.ffn_bw_rel), b.tp_bw_rel))
    message = c.d * c.ab * g / c.ffn_g
    # 2D weight-stationary rows and collectives on the links (dse.perf.tp2d; where the group
    # is the tp group): the gated MLP's up and gate projections in, its down projection out;
    # their all-reduce is off
    net2d, one_d, bytes2d = tp2d.block_terms(b, layers, c.d, (b.mlp_mats - 1.0) * b.ffn_dense,
                                             b.ffn_dense, arch.flag(net_group == c.tp, c.d))
    if net2d is not None:                  # (per row of the tp group: rows per token)
        net2d = (net2d[0] * rows, net2d[1])
    return DenseMlp(params=params, group=g, layers=layers, rows_per_token=rows,
                    weight_bytes=weight_bytes, c=cd, w=wd, aff=(cd * rows, cd * c.h + wd),
                    mem_s=weight_bytes / c.g_hbm,
                    net=per_unit(f, layers * one_d, layers * one_d, message), net2d=net2d,
                    net_group=net_group, message=message, gemms=2.0 * layers, one_d=one_d,
                    bytes2d=bytes2d * rows)


@dataclass(frozen=True)
class MoeRouted:
    """The routed experts of one stage (per chip), their EP all-to-all and all-reduce."""

    log_miss: np.ndarray        # log(1 - k/E): a token's chance to miss one expert
    c: np.ndarray               # compute s per routed token: flops_tok x shape / rate
    expert_pad: np.ndarray      # padded rows per touched expert, in routed-token units
    expert_wave: np.ndarray     # one wave of tiles, in routed-token units
    row_load: np.ndarray        # rows a kernel computes per routed row: 1 + the remote
    #                             entries of the tokens dispatched to it (dp > 1), per own row
    remote_rows: np.ndarray     # remote entries a kernel still computes, per step token (dp = 1)
    m: np.ndarray               # s to read every expert slot on the chip (x the touched share)
    x_tok: np.ndarray           # the permute bytes as s per routed token
    x: np.ndarray               # fixed s per step (per-layer latency)
    a2a: dict | None            # {kind: (latency_s, s per routed token)}; None: no row
    #                             with ep > 1 and dp > 1
    ll_decode: np.ndarray       # 1.0: decode-only steps run the low-latency kernels
    ll_mixed: np.ndarray        # 1.0: prompt-carrying steps run the low-latency kernels
    net: tuple                  # the all-reduce over an expert's shards, per_unit in tokens
    # the work (``work``; left out of ``Coefficients.gather``)
    flops_tok: np.ndarray = work_field()       # 2 k expert weights layers / (tp dp) per token
    layers: np.ndarray = work_field()          # MoE layers on this stage
    ffn_g: np.ndarray = work_field()
    expert_bytes: np.ndarray = work_field()    # every expert slot's weights on this chip
    d: np.ndarray = work_field()
    permute_bytes: np.ndarray = work_field()   # HBM bytes per token per hidden element, layer
    a2a_sent: dict | None = work_field()       # {kind: (scale-up, scale-out) B per token per
    #                                            element byte} (kernel_comm.alltoall_bytes)
    dispatch_bytes: np.ndarray = work_field()  # dispatch element bytes (fp8 + scales, bf16)
    is_moe: np.ndarray = work_field()          # MoE layers on this stage, 0 for a dense model
    a2a_layers: np.ndarray = work_field()      # is_moe where dp > 1 (the all-to-all runs)
    net_group: np.ndarray = work_field()       # the all-reduce's group: tp dp / ep (tp
    #                                            where dp = 1)
    message: np.ndarray = work_field()         # its bytes per token per layer
    # (read once by Coefficients)
    tbo: np.ndarray = work_field()             # two-batch overlap
    a2a_overlap: np.ndarray = work_field()     # share of the all-to-all hidden under compute

    def routed_tokens(self, s: Load, imb):
        """The busiest EP rank's routed tokens, in step tokens (``imb``: dse.perf.imbalance)."""
        return s.tok if imb is None else s.tok * imb

    def touched(self, s: Load):
        """The share of experts the step's tokens touch: 1 - (1 - k/E)^tok."""
        touched = np.exp(s.tok * self.log_miss)
        np.subtract(1.0, touched, out=touched)
        return touched

    def time(self, s: Load, imb):
        """(compute, memory, network, additive) and the all-to-all (None: ep = 1)."""
        touched = self.touched(s)
        rt = self.routed_tokens(s, imb)
        c = s.masked(self.c * (rt * self.row_load + s.tok * self.remote_rows   # tiles per expert used
                               + s.twice(self.expert_pad * touched + self.expert_wave)))
        m = s.twice(self.m * touched)
        x = s.masked(self.x_tok * rt + s.twice(self.x))
        a2a = None
        if self.a2a is not None:
            ll, nm = self.a2a["ll"], self.a2a["normal"]
            a2a = arch.blend(self.ll_decode if s.decode_step else self.ll_mixed,
                             s.twice(ll[0]) + ll[1] * rt, s.twice(nm[0]) + nm[1] * rt)
        return (c, m, fastest(self.net, s.tok), x), a2a

    def work(self, s: Load, imb):
        """The busiest EP rank's routed tokens through their experts, the touched experts'
        weights and the permute bytes, the tokens' dispatch and combine and the all-reduce."""
        rt = self.routed_tokens(s, imb)
        flops = self.flops_tok * rt
        hbm = s.twice(self.expert_bytes * self.touched(s)) \
            + self.layers * self.d * self.permute_bytes * rt
        net = allreduce_bytes(self.net_group, s.tok * self.message) * self.is_moe
        if self.a2a_sent is not None:
            sent = {kind: (up + out) * (self.dispatch_bytes + kernel_comm.BF16_ELEM_BYTES)
                    for kind, (up, out) in self.a2a_sent.items()}
            per_token = arch.blend(self.ll_decode if s.decode_step else self.ll_mixed,
                                   sent["ll"], sent["normal"])
            net = net + rt / self.ffn_g * per_token * self.a2a_layers
        return flops, hbm, net


def moe_ops(b: Batch, c: Basis, allreduce: AllReduces):
    """The MoE layers' ops: ``(routed, shared, router, GEMM launches per step)``."""
    layers = b.n_moe_layers * c.stage
    has_sh = arch.flag(b.n_shared > 0, c.d)
    launches = layers * arch.flag(b.n_experts > 0, c.d) * (1.0 + 2.0 * has_sh)
    return (moe_terms(b, c, allreduce, layers), shared_expert_terms(b, c, layers, has_sh),
            router_terms(b, c, layers), launches)


def moe_terms(b: Batch, c: Basis, allreduce: AllReduces, layers) -> MoeRouted:
    """Routed experts over ep ranks, each expert tp*dp/ep-way sharded: grouped GEMMs
    (kernel_gemm.grouped_gemm_s) of rows tok*k/ep per chip, moe_half_rows padded per touched
    expert, expert width inter/moe_tp with its edge waste; the EP dispatch and combine; the
    all-reduce over an expert's shards. ``layers``: MoE layers on this stage.

    Tokens spread over attention-DP ranks (dp > 1): a chip's kernel sees the tokens routed to
    its rank, which the all-to-all brings, with their remote entries and bytes (module
    docstring), not the whole batch's. dp = 1 (TensorRT-LLM's and vLLM's TP+EP): every chip
    already holds every token after the attention all-reduce, runs its own experts' rows of
    all of them, and one all-reduce of the full output over the tp group replaces the dispatch
    and combine (no all-to-all, as at ep = 1)."""
    e = np.maximum(b.n_experts, 1.0)
    k = np.minimum(b.top_k, e)
    ep = b.ep
    ffn_g, d = c.ffn_g, c.d
    width = np.maximum(b.ffn_expert * ep / ffn_g, 1.0)
    dest = _ranks_visited(k, ep, bool(np.any(ep > 1.0)))
    spread = arch.flag(c.dp > 1.0, d)       # tokens spread over ranks: the all-to-all runs
    # the share of the step's tokens a chip's kernel sees: those that visit its rank, or all
    seen = arch.blend(spread, np.minimum(dest, ep) / ep, arch.flag(k > 0, k))
    gemm = _grouped_gemm(b, c, layers, e, k, ep, width, spread, dest)
    # permute/unpermute bytes per routed row, layer in/out bytes per token on the chip
    permute = k / ep * b.moe_token_bytes + seen * (b.moe_batch_bytes + k * b.moe_route_bytes)
    is_moe = arch.flag(b.n_experts > 0, layers) * layers
    a2a_layers = is_moe * spread
    moe_tp = arch.blend(arch.flag(b.n_experts > 0, d), arch.blend(spread, ffn_g / ep, c.tp), c.tp)
    message = seen * d * c.ab
    mode = b.a2a_mode                       # 0 auto, 1 low-latency, 2 normal
    return MoeRouted(
        layers=layers, ffn_g=ffn_g, log_miss=log1m(np.minimum(k / e, 1.0 - 1e-12)),
        **gemm, d=d, permute_bytes=permute,
        x_tok=layers * d / b.hbm_bw_bytes_per_s * permute,
        x=layers * b.moe_latency_s * arch.flag(b.n_experts > 0, d),
        **_ep_alltoall(b, c, ep, a2a_layers), is_moe=is_moe, a2a_layers=a2a_layers,
        ll_decode=arch.flag(mode < 1.5, mode), ll_mixed=arch.flag(np.abs(mode - 1.0) < 0.5, mode),
        tbo=b.two_batch_overlap * arch.flag(b.n_experts > 0, d),
        a2a_overlap=b.alltoall_overlap_fraction,
        net=per_unit(allreduce(moe_tp, b.tp_bw_rel), is_moe, is_moe, message), net_group=moe_tp,
        message=message)


def _grouped_gemm(b: Batch, c: Basis, layers, e, k, ep, width, spread, dest) -> dict:
    """The routed experts' grouped GEMMs: FLOPs and compute per routed token, padding per
    touched expert and one wave of tiles per call (wave_elements of output, in routed-row units
    of ``c``: rows per chip = tok k / ep), the entries routed to other chips that a kernel run
    over every entry it is handed still computes (remote_fraction of a local row's), and the
    weights. The entries it is handed (module docstring): every token's with dp = 1
    (``remote_rows``: tok k (ep - 1) / ep of them, per step token), the dispatched tokens'
    under attention DP (``spread``; ``row_load``: dest - 1 per own row, ``dest`` the ranks a
    token visits)."""
    p_exp = arch.expert_params(b)
    flops_tok = 2.0 * k * p_exp * layers / c.ffn_g
    cm = (flops_tok * (1.0 + b.moe_width_half / width + b.moe_hidden_half / c.d)
          / (b.expert_matmul_flops_per_s * b.moe_fraction))
    expert_bytes = arch.expert_slots(b) * p_exp * layers * b.expert_weight_bytes / c.ffn_g
    mm = expert_bytes / (b.hbm_bw_bytes_per_s * b.moe_hbm_fraction)
    # non-gated (2-matrix) experts run another kernel: its time factor on both terms
    slow = 1.0 + arch.flag(b.mlp_mats < 2.5, c.d) * (b.moe_nongated_slowdown - 1.0)
    on = arch.flag(k > 0, k)
    return dict(
        flops_tok=flops_tok, c=cm * slow,
        expert_pad=b.moe_half_rows * e / np.maximum(k, 1e-12) * on,
        expert_wave=b.moe_wave_elements / width * ep / np.maximum(k, 1e-12) * on,
        row_load=1.0 + spread * b.moe_remote_fraction * np.maximum(dest - 1.0, 0.0),
        remote_rows=(1.0 - spread) * b.moe_remote_fraction * np.maximum(ep - 1.0, 0.0),
        expert_bytes=expert_bytes, m=mm * slow)


def _ranks_visited(k, ep, routed_on: bool):
    """Distinct ep ranks a token visits: ep (1 - (1 - 1/ep)^k), via one log and one exp (1
    where ep = 1 everywhere, ``routed_on`` False: every token stays on its rank)."""
    if routed_on:
        x = np.minimum(np.maximum(1.0 / ep, 0.0), 0.5)      # (ep <= 1: blended out)
        return arch.blend(arch.flag(ep > 1.0, ep), ep * (1.0 - np.exp(k * log1m(x))),
                          arch.flag(k > 0, k))
    return arch.flag(k > 0, k)


def _ep_alltoall(b: Batch, c: Basis, ep, a2a_layers) -> dict:
    """EP dispatch (fp8 with fp8/fp4 weights, else bf16) and combine (bf16) of the tokens a chip
    holds (tok / (tp*dp)), with the fitted low-latency and normal kernels (per-rank and
    per-node deduplication in the normal ones); the step picks the kind. A dispatch below 16
    bits carries one fp32 scale per 128 elements on top of its dispatch_bytes (fp8: 1 + 4/128
    B). ``a2a_layers``: the all-to-all's calls per step (MoE layers where dp > 1 and ep > 1, 0
    elsewhere). No row with ep > 1 and dp > 1: no all-to-all, the step skips it."""
    disp = b.dispatch_bytes + arch.flag(b.dispatch_bytes < 2.0, c.d) \
        * (kernel_comm.FP8_ELEM_BYTES - 1.0)
    if not bool(np.any((ep > 1.0) & (c.dp > 1.0))):
        return dict(a2a=None, a2a_sent=None, dispatch_bytes=disp)
    sent = {}
    kinds = kernel_alltoall(b, ep, disp, kernel_comm.BF16_ELEM_BYTES, sent=sent)
    a2a = {kind: (a2a_layers * lat, a2a_layers * spt / c.ffn_g)
           for kind, (lat, spt) in kinds.items()}
    return dict(a2a=a2a, a2a_sent=sent, dispatch_bytes=disp)


@dataclass(frozen=True)
class TokenGemm:
    """An op of GEMMs over a group of g chips, its weights split over the group, one stage, per
    chip: the tp*dp group, every chip running every step token (the router, split shared
    experts), or each attention-DP rank's tp group, running the rank's tokens (replicated
    shared experts): ``rows_per_token = g / (tp dp)`` rows per chip per step token."""

    rows_per_token: np.ndarray  # g / (tp dp): rows per chip per step token
    c: np.ndarray               # compute s = c (tok rows_per_token + h) + w
    w: np.ndarray
    aff: tuple                  # the same as (slope, intercept) in tokens
    mem_s: np.ndarray           # weight_bytes / GEMM HBM rate
    # the work (``work``; left out of ``Coefficients.gather``)
    params: np.ndarray = work_field()        # weights of the stage's layers (whole model)
    group: np.ndarray = work_field()         # g
    weight_bytes: np.ndarray = work_field()  # params x dtype bytes / group

    def time(self, s: Load):
        c = s.masked(self.c * (s.tok * self.rows_per_token + s.h) + self.w if s.tbo_on
                     else affine(self.aff, s.tok))
        return c, s.twice(self.mem_s), None, None

    def work(self, s: Load):
        return (2.0 * self.params / self.group * (s.tok * self.rows_per_token),
                s.twice(self.weight_bytes), 0.0)


def _token_gemm(c: Basis, params, cg, wg, g) -> TokenGemm:
    weight_bytes = params * c.wb / g
    rows = g / c.ffn_g
    return TokenGemm(params=params, group=g, rows_per_token=rows, weight_bytes=weight_bytes,
                     c=cg, w=wg, aff=(cg * rows, cg * c.h + wg), mem_s=weight_bytes / c.g_hbm)


def shared_expert_terms(b: Batch, c: Basis, layers, has_sh) -> TokenGemm:
    """The shared experts of the stage's MoE ``layers`` where the dense MLP runs
    (``arch.shared_group``): their width split over the tp*dp group, every chip running every
    token, or replicated on each attention-DP rank, tp-sharded, running the rank's tokens.
    FLOPs per chip are the same either way; the weights read are 1/g of them. (A model
    without shared experts, ``has_sh`` 0, runs no shared-expert GEMM: without the flag the
    width-0 GEMMs, clamped to width 1, cost one GEMM's shape penalty per layer.)"""
    g = arch.shared_group(b)
    sh_chip = b.n_shared * b.ffn_shared / g
    cs, ws = gemm_form(b, ((floor1((b.mlp_mats - 1.0) * sh_chip), c.d1), (c.d1, floor1(sh_chip))),
                       layers, c.inv_eff)
    return _token_gemm(c, arch.shared_params_per_layer(b) * layers, has_sh * cs, has_sh * ws, g)


def router_terms(b: Batch, c: Basis, layers) -> TokenGemm:
    """The router GEMM [tokens, hidden] x [hidden, experts] is far narrower than a tile
    (experts <= 256): measured GEMMs of width 1-16 take the same few us as width 1
    (aiconfigurator-core B300 tables, k = 4096, m <= 2048: 4-10 us), so it pays its FLOPs at
    the large-GEMM rate and its launch (x_gemm), not the width-edge and one-wave penalties of a
    wide GEMM (which grow as 1 / width: 70 us per layer for Mixtral's width 8 on H200 FP8).
    Each chip routes its share of the tokens. ``layers``: MoE layers on this stage."""
    cr = layers * c.d * b.n_experts * c.inv_eff / c.ffn_g
    return _token_gemm(c, c.d * b.n_experts * layers, cr, 0.0 * c.d, c.ffn_g)
