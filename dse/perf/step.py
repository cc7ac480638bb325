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
logits     embedding lookup and the output head
pipeline   the activation hand-off to the next pipeline stage

Almost every time is affine in the step's tokens (a matmul pads small row counts up by
``matmul_half_rows``; a collective has a latency and a per-byte cost), so ``coefficients``
computes the per-design constants once and ``step`` evaluates any token mix cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dse.perf import arch
from dse.perf.batch import Batch
from dse.perf import kernel_comm
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


class Coefficients:
    """Per-design constants of the step model (one stage, one micro-batch)."""

    def __init__(self, b: Batch):
        tp, dp, pp = b.tp, b.dp, b.pp
        self.dp = dp
        ffn_g = tp * dp
        stage = 1.0 / pp
        wb = b.weight_bytes
        hbm = b.hbm_bw_bytes_per_s * b.hbm_fraction
        mm = b.matmul_flops_per_s * b.matmul_fraction
        d = b.hidden
        ab = b.act_bytes
        self.h = b.matmul_half_rows
        self.layers_stage = b.n_layers * stage
        # attention projections: tp-sharded, each dp rank handles its own tokens (rows tok/dp)
        p_attn = arch.attn_params_per_layer(b) * self.layers_stage
        self.c_proj = 2.0 * p_attn / tp / mm
        self.m_proj = p_attn * wb / tp / hbm
        # tp all-reduce of the attention output, per layer: the runtime's fastest kernel
        # (min over NCCL and custom branches) for the busiest rank's rows
        a0, a1 = kernel_allreduce(b, tp, b.tp_bw_fraction)
        self.n_proj = (self.layers_stage * a0, self.layers_stage * a1 * d * ab)
        # attention core
        heads = b.n_heads / tp
        attn = b.attn_flops_per_s * b.attention_fraction
        self.c_core_dec = 2.0 * heads * arch.attn_dims(b, True) / dp / attn * stage
        # prefill attention runs on the rank that holds the prompt: per rank, not split over dp
        self.c_core_pre = 2.0 * heads * arch.attn_dims(b, False) / attn * stage
        self.kv_rank = (arch.kv_elems_per_token_layer(b) * arch.kv_shard_fraction(b) * b.kv_bytes
                        / hbm)
        # dense MLP over a group of g chips: the tp*dp group (every chip sees all tokens) or,
        # replicated, each attention-dp rank's tp group (its own tokens); compute per chip is
        # the same, the weights read and the all-reduce differ
        rep = b.dense_replicated
        g = ffn_g + rep * (tp - ffn_g)
        p_dense = arch.dense_mlp_params(b) * b.n_dense_layers * stage
        self.c_dense = 2.0 * p_dense / ffn_g / mm
        self.dense_pad = self.h * ffn_g / g                     # tile rows padded per group
        self.m_dense = p_dense * wb / g / hbm
        f0, f1 = kernel_allreduce(b, g, b.ffn_bw_fraction + rep * (b.tp_bw_fraction
                                                                   - b.ffn_bw_fraction))
        dense_layers = b.n_dense_layers * stage
        self.n_dense = (dense_layers * f0, dense_layers * f1 * d * ab * g / ffn_g)
        # routed experts over ep ranks, each expert tp*dp/ep-way sharded
        moe_layers = b.n_moe_layers * stage
        e = np.maximum(b.n_experts, 1.0)
        k = np.minimum(b.top_k, e)
        self.log_miss = np.log1p(-np.minimum(k / e, 1.0 - 1e-12))   # per-token chance to miss one
        self.expert_pad = self.h * e / np.maximum(k, 1e-12) * arch.flag(k > 0, k)  # all E used
        p_exp = arch.expert_params(b)
        self.c_moe = 2.0 * k * p_exp * moe_layers / ffn_g / mm
        self.m_moe = arch.expert_slots(b) * p_exp * moe_layers * wb / ffn_g / hbm
        ep = b.ep
        dest = ep * (1.0 - np.power(1.0 - 1.0 / ep, k))        # distinct ep ranks a token visits
        # EP dispatch (fp8 with fp8/fp4 weights, else bf16) and combine (bf16) of the tokens a
        # chip holds (tok / (tp*dp)), with the fitted low-latency and normal kernels (per-rank
        # and per-node deduplication in the normal ones); the step picks the kind
        disp = arch.blend(arch.flag(b.dispatch_bytes < 2.0, d), kernel_comm.FP8_ELEM_BYTES,
                          kernel_comm.BF16_ELEM_BYTES)
        is_moe = arch.flag(b.n_experts > 0, moe_layers) * moe_layers
        self.a2a = {}
        for kind in ("ll", "normal"):
            l0, s0 = kernel_alltoall(b, ep, disp, kind, "dispatch")
            l1, s1 = kernel_alltoall(b, ep, kernel_comm.BF16_ELEM_BYTES, kind, "combine")
            self.a2a[kind] = (is_moe * (l0 + l1), is_moe * (s0 + s1) / ffn_g)
        mode = b.a2a_mode                       # 0 auto, 1 low-latency, 2 normal
        self.ll_decode = arch.flag(mode < 1.5, mode)
        self.ll_mixed = arch.flag(np.abs(mode - 1.0) < 0.5, mode)
        moe_tp = ffn_g / ep
        r0, r1 = kernel_allreduce(b, moe_tp, b.tp_bw_fraction)
        self.n_moe_ar = (is_moe * r0, is_moe * r1 * np.minimum(dest, ep) / ep * d * ab)
        # shared experts and router
        p_sh = arch.shared_params_per_layer(b) * moe_layers
        self.c_sh = 2.0 * p_sh / ffn_g / mm
        self.m_sh = p_sh * wb / ffn_g / hbm
        p_router = d * b.n_experts * moe_layers
        self.c_router = 2.0 * p_router / ffn_g / mm
        self.m_router = p_router * wb / ffn_g / hbm
        # embeddings and output head, vocab-parallel over tp (the last stage carries it)
        p_head = b.vocab * d
        self.c_head = 2.0 * p_head / tp / mm
        self.m_head = p_head * wb / tp / hbm
        self.m_embed = d * ab / dp / hbm
        # hand-off to the next stage
        crosses = tp * dp * pp > b.domain_chips
        q0, q1 = p2p_coef(b, crosses)
        has_pp = arch.flag(pp > 1, pp)
        self.n_pipe = (has_pp * q0, has_pp * q1 * d * ab / dp / tp)
        self.overlap = b.network_overlap_fraction
        self.overhead = self.layers_stage * b.layer_overhead_s + b.step_overhead_s
        self.batch = b

    def gather(self, rows: np.ndarray, batch: Batch) -> "Coefficients":
        """The coefficients of ``batch``, whose designs are this one's rows ``rows`` (they do
        not depend on the batch, lengths or runtime caps: computed once per distinct design)."""
        out = object.__new__(Coefficients)
        for name, v in self.__dict__.items():
            out.__dict__[name] = _take(v, rows)
        out.batch = batch
        return out


def _take(v, rows):
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


def step(k: Coefficients, dec, pre, dec_ctx, new, prior, pairs, logits_rows,
         breakdown: bool = False, sums: bool = False, pre_rank=None, decode_step: bool = False):
    """One stage step of one micro-batch (tokens are per micro-batch, whole instance).

    ``dec_ctx`` is ``arch.context_layers`` of the decode context and ``pairs`` is
    ``arch.prefill_pairs_layers(new, prior)`` per request: the caller computes them once for
    several steps. ``pre_rank``: prefill tokens on the busiest attention data-parallel rank
    (default ``pre / dp``, an even spread): a prompt lives on one rank, so its attention and
    projections run there while the other ranks wait at the next collective.
    ``decode_step``: a decode-only step (``serving.a2a_kernel = "auto"`` runs the low-latency
    EP kernels there and the normal ones in steps that carry prompt tokens, as DeepEP does).

    Returns the step time; with ``sums`` also the compute, memory and network time summed over
    ops; with ``breakdown`` the full per-op StepTimes.
    """
    b = k.batch
    tok = dec + pre
    some = arch.flag(tok > 0, tok)
    h = k.h
    dp = k.dp
    pre_rank = pre / dp if pre_rank is None else pre_rank
    rows = dec / dp + pre_rank                     # the busiest attention rank's rows
    c_proj = k.c_proj * (rows + h) * some
    n_proj = np.min(k.n_proj[0] + k.n_proj[1] * rows, axis=0)
    reqs = pre_rank / np.maximum(new, 1.0)         # prompts (or their share) on that rank
    c_core = k.c_core_dec * dec * dec_ctx + k.c_core_pre * reqs * pairs
    m_core = k.kv_rank * (dec / dp * dec_ctx + (rows + reqs * prior) * b.n_layers) / b.pp
    c_dense = k.c_dense * (tok + k.dense_pad) * some
    n_dense = np.min(k.n_dense[0] + k.n_dense[1] * tok, axis=0)
    touched = 1.0 - np.exp(tok * k.log_miss)
    c_moe = k.c_moe * (tok + k.expert_pad * touched) * some   # tiles padded per expert used
    m_moe = k.m_moe * touched
    ll, nm = k.a2a["ll"], k.a2a["normal"]
    n_moe = arch.blend(k.ll_decode if decode_step else k.ll_mixed, ll[0] + ll[1] * tok,
                       nm[0] + nm[1] * tok) + np.min(k.n_moe_ar[0] + k.n_moe_ar[1] * tok, axis=0)
    c_sh = k.c_sh * (tok + h) * some
    c_router = k.c_router * (tok + h) * some
    c_head = k.c_head * (logits_rows / dp + h)
    m_head = k.m_head + k.m_embed * tok
    n_pipe = k.n_pipe[0] + k.n_pipe[1] * tok
    phi = k.overlap
    parts = ((c_proj, k.m_proj, n_proj), (c_core, m_core, 0.0), (c_dense, k.m_dense, n_dense),
             (c_moe, m_moe, n_moe), (c_sh, k.m_sh, 0.0), (c_router, k.m_router, 0.0),
             (c_head, m_head, 0.0), (0.0, 0.0, n_pipe))
    total = k.overhead
    ops = []
    sc = sm = sn = 0.0
    for c, m, n in parts:
        busy = np.maximum(c, m)
        t = busy + n - phi * np.minimum(busy, n)   # (1-phi)*(busy+n) + phi*max(busy, n)
        total = total + t
        if breakdown:
            ops.append((c, m, n, t))
        elif sums:
            sc, sm, sn = sc + c, sm + m, sn + n
    if sums and not breakdown:
        return total, sc, sm, sn
    if not breakdown:
        return total
    shape = np.shape(total)
    stack = [np.stack([np.broadcast_to(np.asarray(o[i], float), shape) for o in ops])
             for i in range(4)]
    return StepTimes(*stack, np.broadcast_to(k.overhead, shape), total)
