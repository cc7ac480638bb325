"""Time of one pipeline-stage step, op by op: compute, memory and network time per op class,
and the work behind them.

A step carries ``dec`` decode tokens and ``pre`` prefill tokens per pipeline micro-batch (whole
instance); decode tokens attend to the KV cache, prefill tokens arrive in requests of ``new``
uncached tokens after ``prior`` cached ones. Ops (rows of the breakdown), each built by its own
function from the batch (``Coefficients``) and evaluated per step by its terms' ``time``:

attn_proj  q/k/v/o (or MLA) projections, plus the tp all-reduce of the attention output
           (``op_attention.attn_proj_terms``)
attn_core  scores and values against the KV cache (decode reads it, prefill writes it)
           (``op_attention.attn_core_terms``)
mlp_dense  dense MLP of the dense layers, plus its tp*dp all-reduce (``op_mlp.dense_mlp_terms``)
moe_routed routed experts (only the experts the step's tokens touch are read), dispatch+combine
           (``op_mlp.moe_terms``; ``op_mlp.moe_ops`` builds the MoE layers' three)
moe_shared shared experts (``op_mlp.shared_expert_terms``)
router     the MoE router (``op_mlp.router_terms``)
logits     embedding lookup and the output head, plus the tp all-gather of its logits
           (``op_head.head_terms``)
pipeline   the activation hand-off to the next pipeline stage (``op_head.pipeline_terms``)

An op's time is ``max(compute, memory) + additive``, plus its network time (serialised, or a
``network_overlap_fraction`` of it hidden); the EP all-to-all is the routed experts' network
time, a share of it hidden under the step's compute and memory time; the step adds a fixed
overhead (per-layer and per-step time, GEMM launches, host time per sequence). Almost every
time is affine in the step's tokens (a matmul pads small row counts up by ``gemm_half_rows``; a collective has a
latency and a per-byte cost: ``dse.perf.forms``), so ``Coefficients`` computes the per-design
constants once and ``step`` evaluates any token mix cheaply.

The work table (``step(..., breakdown=True)``: ``StepTimes.flops``, ``hbm_bytes``,
``net_bytes``, each of shape ``(len(OPS), n)`` like the times) counts, per op, **per chip**
(the busiest attention data-parallel rank's chip where ranks differ, the busiest EP rank's
routed tokens), for **one stage step of one micro-batch**:

flops      the op's useful arithmetic, a multiply-add = 2 FLOPs: 2 x weights on this chip x
           rows for a GEMM; 2 x heads on this chip x (d_qk + d_v) per (query, key) pair for
           attention (decode: every decode token against its context; prefill: the causal
           pairs of the prompts on the rank). Padding rows, tile waves, query-group padding,
           edge waste and remote entries are efficiency factors of the time, not FLOPs.
hbm_bytes  what the memory-time terms stream from HBM: weights read (the touched experts'
           share for the routed experts; twice with two-batch overlap), KV read (decode
           context, a prompt's cached prefix) and written (every new token), decode queries
           and outputs, the routed experts' permute bytes and the embedding rows. (A decode
           call's ramp with few work items is a rate penalty: not bytes.)
net_bytes  bytes one chip sends in the op's collectives: all-reduces at the ring's
           ``2 (g - 1) / g`` of the message (nccl-tests' bus bytes), the logits all-gather at
           ``(g - 1) / g`` of the gathered logits, the EP dispatch plus combine of the tokens
           the chip holds (the bytes to other ranks and nodes; with attention DP only: at
           dp = 1 every chip holds every token), the pipeline hand-off of the
           chip's share of the activations. The time takes the fitted kernels (latencies,
           the runtime's branch), not bytes over a link.

Each op's module docstring (``op_attention``, ``op_mlp``, ``op_head``) gives its terms.
Times and work come from the same per-op terms; the work is computed only for a breakdown.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dse.perf import imbalance
from dse.perf.basis import Load, basis, load
from dse.perf.batch import Batch
from dse.perf.forms import AllReduces, blend, cast, iadd, take
from dse.perf.op_attention import attn_core_terms, attn_proj_terms
from dse.perf.op_head import head_terms, pipeline_terms
from dse.perf.op_mlp import dense_mlp_terms, moe_ops

OPS = ("attn_proj", "attn_core", "mlp_dense", "moe_routed", "moe_shared", "router", "logits",
       "pipeline")
ROUTED = OPS.index("moe_routed")


@dataclass(frozen=True)
class StepTimes:
    """Per-op times and work, each an array of shape (len(OPS), n) (module docstring)."""

    compute_s: np.ndarray
    memory_s: np.ndarray
    network_s: np.ndarray
    op_s: np.ndarray
    overhead_s: np.ndarray   # fixed per-layer and per-step time, shape (n,)
    total_s: np.ndarray      # one stage step, shape (n,)
    flops: np.ndarray        # FLOPs per chip (a multiply-add = 2)
    hbm_bytes: np.ndarray    # bytes per chip the memory terms stream
    net_bytes: np.ndarray    # bytes per chip the op's collectives send


class Coefficients:
    """Per-design terms of the step model (one stage, one micro-batch), one attribute per op
    (None where no row of the batch has the op).

    Each op's compute and memory times follow the fitted kernel models (dse/catalog/kernels,
    ``python -m dse.calibration.kernels``): dense GEMMs (``kernel_gemm.gemm_s``), the routed experts'
    grouped GEMMs (``kernel_gemm.grouped_gemm_s``), attention (``kernel_attention``) and the
    collectives (``kernel_comm``); additive terms are kernel latencies, per-sequence and
    per-routed-token costs. (A batch without dense layers, without MoE layers or with tp = 1
    everywhere skips those terms: the hot path of many spaces.)"""

    def __init__(self, b: Batch):
        c = basis(b)
        allreduce = AllReduces(b)
        self.batch, self.dp, self.h, self.layers_stage = b, c.dp, c.h, c.layers
        self.gathered = False                  # (gather: the ops' work fields left out)
        self.attn_proj = attn_proj_terms(b, c, allreduce)
        self.attn_core = attn_core_terms(b, c)
        launches = self.attn_proj.gemms
        self.dense = None
        if bool(np.any(b.n_dense_layers > 0)):
            self.dense = dense_mlp_terms(b, c, allreduce)
            launches = launches + self.dense.gemms
        self.moe = self.shared = self.router = None
        self.tbo, self.a2a_overlap = 0.0, b.alltoall_overlap_fraction
        if bool(np.any(b.n_experts > 0)):
            self.moe, self.shared, self.router, moe_launches = moe_ops(b, c, allreduce)
            self.tbo, self.a2a_overlap = self.moe.tbo, self.moe.a2a_overlap
            launches = launches + moe_launches
        self.head = head_terms(b, c, allreduce)
        self.pipeline = pipeline_terms(b, c)
        # fixed time: every GEMM's launch (and the head's), per layer and per step
        self.x_gemm = (launches + 1.0) * b.gemm_latency_s
        self.overhead = c.layers * b.layer_overhead_s + b.step_overhead_s
        # what no row of the batch has (overlap, two-batch overlap): the step skips it
        self.overlap = b.network_overlap_fraction
        self.overlap_on = bool(np.any(self.overlap != 0.0))
        self.tbo_on = bool(np.any(self.tbo != 0.0))

    def decode_context(self, dec_ctx, dec_local=None):
        """The decode attention's terms at ``dec_ctx`` (once per design for a call's steps)."""
        ctx = self.__dict__.get("_ctx")
        if ctx is None or ctx.ctx is not dec_ctx:
            ctx = self.attn_core.context(dec_ctx, dec_local)
            self.__dict__["_ctx"] = ctx
        return ctx

    def gather(self, rows: np.ndarray, batch: Batch) -> "Coefficients":
        """The coefficients of ``batch``, whose designs are this one's rows ``rows`` (they do
        not depend on the batch, lengths or runtime caps: computed once per distinct design).
        Only the terms the times read are gathered (``forms.work_field``), not the decode
        context's (``decode_context``: the gathered batch's steps compute their own)."""
        return self._each(batch, lambda name, v: take(v, rows))

    def blend(self, other: "Coefficients", mask) -> "Coefficients":
        """These coefficients' rows where ``mask``, ``other``'s elsewhere (both of one batch)."""
        return self._each(self.batch, lambda name, v: blend(v, other.__dict__[name], mask))

    def astype(self, batch: Batch) -> "Coefficients":
        """The coefficients of ``batch``, these rows in another precision (float32 for the
        request-rate probe): these rounded to its dtype (~1 ms, not ~12 ms computed again; the
        times move by the rounding, ~1e-7 relative). Only the terms the times read."""
        dtype = batch.n_layers.dtype.type
        return self._each(batch, lambda name, v: cast(v, dtype))

    def _each(self, batch: Batch, term) -> "Coefficients":
        """The coefficients of ``batch`` whose terms are ``term(name, v)`` of these (the
        gathered kind: ``forms.map_terms`` keeps the time's fields only; no decode context)."""
        out = object.__new__(Coefficients)
        for name, v in self.__dict__.items():
            if name != "_ctx":
                out.__dict__[name] = term(name, v)
        out.batch, out.gathered = batch, True
        return out


_NONE = (None, None, None, None)


def op_times(k: Coefficients, s: Load, dec_ctx, dec_local=None):
    """(compute, memory, network, additive) seconds per op in ``OPS`` order, None where an op
    has no such term (the step skips its arithmetic: this is the hot path), and the EP
    all-to-all's seconds (None: no row has ep > 1)."""
    moe, a2a = (_NONE, _NONE, _NONE), None
    if k.moe is not None:
        routed, a2a = k.moe.time(s, imbalance.factor(k.batch))   # hook: the busiest EP rank
        moe = (routed, k.shared.time(s), k.router.time(s))
    return (k.attn_proj.time(s), k.attn_core.time(s, k.decode_context(dec_ctx, dec_local)),
            _NONE if k.dense is None else k.dense.time(s), *moe, k.head.time(s),
            k.pipeline.time(s)), a2a


def op_work(k: Coefficients, s: Load, dec_ctx):
    """(flops, hbm_bytes, net_bytes) per chip per op in ``OPS`` order (module docstring)."""
    zero = (0.0, 0.0, 0.0)
    moe = (zero, zero, zero)
    if k.moe is not None:
        moe = (k.moe.work(s, imbalance.factor(k.batch)), k.shared.work(s), k.router.work(s))
    return (k.attn_proj.work(s), k.attn_core.work(s, dec_ctx),
            zero if k.dense is None else k.dense.work(s), *moe, k.head.work(s),
            k.pipeline.work(s))


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


def _op_time(c, m, n, x, phi, keep: bool):
    """An op's busy time ``max(compute, memory) + additive`` and its time with its network
    term: serialised ``busy + n``, or with overlap ``phi`` ``(1-phi)(busy+n) + phi max(busy,
    n)``. A network-only op: ``(0, n)``. Serialised without ``keep``: ``(busy, None)`` (the
    caller adds ``n`` and ``busy`` to its total without forming their sum)."""
    if c is None:
        return 0.0, n
    busy = np.maximum(c, m)
    if x is not None:
        busy = iadd(busy, x)
    if n is None:
        return busy, busy
    if phi is None:
        return busy, (busy + n if keep else None)
    return busy, busy + n - phi * np.minimum(busy, n)


def _compose(k: Coefficients, parts, a2a, overhead, breakdown: bool, sums: bool,
             keep: bool = False):
    """The step's total from its ops' terms (``op_times``): ``total``; with ``sums`` also the
    compute, memory and network sums and the bound shares; with ``breakdown`` ``(total, ops)``,
    ``ops`` the per-op ``[compute, memory, network, time]``; ``keep``: the total in the order
    ``sums`` adds it."""
    phi = k.overlap if k.overlap_on else None
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
        busy, t = _op_time(c, m, n, x, phi, breakdown or sums or keep)
        if c is not None and busy_all is not None:
            busy_all = busy_all + busy
        if t is None:
            total = total + n
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
            moe = ops[ROUTED]
            moe[2], moe[3] = moe[2] + a2a, moe[3] + a2a_seen
        elif sums:
            sn = sn + a2a
            c, m, n, t = routed if routed is not None else (None, None, None, 0.0)
            _share(shares, c, m, a2a if n is None else n + a2a, t + a2a_seen)
    if breakdown:
        return total, ops
    return (total, sc, sm, sn, tuple(shares)) if sums else total


def _table(ops, shape) -> list:
    """Per-op entries (arrays or Python zeros) as ``(len(OPS), n)`` float arrays, one per
    column."""
    return [np.stack([np.broadcast_to(np.asarray(v, float), shape) for v in column])
            for column in zip(*ops)]


def step(k: Coefficients, dec, pre, dec_ctx, new, prior, pairs, logits_rows,
         breakdown: bool = False, sums: bool = False, pre_rank=None, decode_step: bool = False,
         seq_tokens=None, dec_local=None, keep: bool = False):
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
    of ``dec_ctx``), needed where ``k.attn_core.win_on`` (their decode runs another kernel
    form). ``keep``: the total summed as with ``sums`` (each op's time whole, then added), the
    same number to the last bit without the sums' arithmetic (dse.perf.queue_probe.queue_times).

    Returns the step time; with ``sums`` also the compute, memory and network time summed over
    ops and the op time split by what bounds each op (``bound_shares``); with ``breakdown`` the
    full per-op StepTimes, the work table included.
    """
    s = load(k, dec, pre, new, prior, pairs, logits_rows, pre_rank, seq_tokens, decode_step)
    parts, a2a = op_times(k, s, dec_ctx, dec_local)
    # the GEMMs' launch latencies are fixed time of the step (overhead)
    overhead = k.overhead + s.masked(s.twice(k.x_gemm))
    b = k.batch
    if decode_step and b.has_on("graph_layer_overhead_s"):
        # a decode-only step replays a CUDA graph: its own fixed time per layer
        overhead = overhead + k.layers_stage * (b.graph_layer_overhead_s - b.layer_overhead_s)
    if b.has_on("seq_overhead_s"):       # the scheduler's host time per running sequence
        overhead = overhead + b.seq_overhead_s * s.seqs / b.dp
    out = _compose(k, parts, a2a, overhead, breakdown, sums, keep)
    if not breakdown:
        return out
    total, ops = out
    shape = np.shape(total)
    work = op_work(Coefficients(k.batch) if k.gathered else k, s, dec_ctx)
    return StepTimes(*_table(ops, shape), np.broadcast_to(overhead, shape), total,
                     *_table(work, shape))
