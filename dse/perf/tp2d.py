"""2D weight-stationary tensor parallelism and the KV cache split by sequence: the layouts
Pope et al. 2022 ("Efficiently Scaling Transformer Inference", https://arxiv.org/abs/2211.05102,
sections 3.2.2 and 3.3) measured PaLM on TPU v4 with.

1D weight-stationary tp (``layout.tp_x = 1``, the default: Megatron-style) splits every weight
matrix over the tp group along one dimension and all-reduces each block's output over tp: the
runtime's fitted all-reduce kernels (``dse.perf.network.kernel_allreduce``), a volume of
``2 rows d (tp - 1) / tp`` activation elements per chip per block, constant in tp.

2D weight-stationary (``layout.tp_x = X > 1``) arranges the tp chips as an X x YZ mesh
(YZ = tp / X) and splits every matrix over both axes: d_model over X, the inner dimension (the
heads, or d_ff) over YZ. A block of input width ``w_in`` and output width ``w_out`` (elements of
the inner dimension per token, whole model: the gated MLP's up and gate projections
``w_in = 2 d_ff``, its down projection ``w_out = d_ff``) runs, per layer:

    all-gather over YZ of its input        rows x d / X     (YZ - 1) / YZ  elements sent per chip
    reduce-scatter over X of the partial   rows x w_in / YZ  (X - 1) / X
      sums of the first matmul
    all-gather over X of the inner         rows x w_out / YZ (X - 1) / X
      activations
    reduce-scatter over YZ of the output   rows x d / X     (YZ - 1) / YZ

so ``2 rows d / X (YZ - 1) / YZ + rows (w_in + w_out) / YZ (X - 1) / X`` elements per chip per
block (``block_bytes_per_row``): the paper's ``2 B L E / X + 2 B L F / YZ`` for a non-gated
MLP (w_in = w_out = F) with its ring factors, falling as 1 / sqrt(tp) at the optimum
``X = sqrt(tp d / F)``. Each axis group runs its collectives on its own links of the torus:
the bytes over the scale-up bandwidth times the group's share of it on the topology graph
(``tp_x_bw_fraction``, ``tp_yz_bw_fraction``: a 4-chip ring along one axis of a 3D torus has 2
of a chip's 6 links) times the achieved fraction ``scaleup_fraction``, plus one ring's latency
(``tp_*_latency_s``: about twice the group's mean hops times the hop latency) per collective.
The matmuls are unchanged: every chip holds 1 / tp of each matrix and runs every row.

A topology whose collectives run on the links themselves (``topology.link_collectives``: the
TPU's ICI, where a collective is a ring of DMAs per torus axis, not a kernel) takes the same
link model for 1D rows too: X = 1, YZ = tp, the ring all-reduce's ``2 d (tp - 1) / tp``
elements per row over the tp group's links, two ring latencies per block; elsewhere 1D rows
keep the collective kernels fitted on GPUs (NCCL and custom all-reduce).

The KV cache split by sequence (``layout.kv_sharding = "batch"``, the paper's multiquery
layout): each chip of the tp group holds every KV head of 1 / tp of the sequences and runs their
attention, so a model with fewer KV heads than tp (multiquery attention) stores and reads its KV
once per instance instead of once per chip; the queries go to the chip that holds the
sequence and the attention outputs come back, an all-to-all over tp of ``heads (d_qk + d_v)``
elements per row, of which a chip sends ``(tp - 1) / tp^2`` (``kv_alltoall_bytes_per_row``),
over the tp group's all-to-all share of the topology.

Pure numpy over designs; the layout enters only through the Batch's columns.
"""

from __future__ import annotations

import numpy as np

from dse.perf.arch import flag
from dse.perf.batch import Batch


def on(b: Batch) -> bool:
    """Some row runs 2D weight-stationary tp (``tp_x > 1``) or has its tp group's collectives
    on the links (``link_collectives``)."""
    return b.has_on("tp_x") or b.has_on("link_collectives")


def kv_on(b: Batch) -> bool:
    """Some row splits the KV cache by sequence."""
    return b.has_on("kv_batch")


def mesh(b: Batch):
    """``(X, YZ)``: the 2D mesh's axes (X = 1, YZ = tp on 1D rows)."""
    x = np.maximum(b.tp_x, 1.0)
    return x, np.maximum(b.tp / x, 1.0)


def block_bytes_per_row(d, w_in, w_out, x, yz, act_bytes):
    """Bytes one chip sends per row (token) in one block's four collectives of one layer:
    ``(over the YZ axis, over the X axis)`` (module docstring). ``d``: model width,
    ``w_in``/``w_out``: the block's inner widths in and out (elements, whole model), ``x``/``yz``:
    the mesh, ``act_bytes``: bytes per activation element."""
    yz_bytes = 2.0 * d * act_bytes / x * (yz - 1.0) / yz
    x_bytes = (w_in + w_out) * act_bytes / yz * (x - 1.0) / x
    return yz_bytes, x_bytes


def links_on(b: Batch, x, where=1.0):
    """1.0 where a block's tp collectives are modelled from the links: 2D rows, and 1D rows
    whose topology runs collectives on the links (``where``: 0 where the block's group is not
    the tp group: a dense MLP split over tp x dp keeps the kernels' all-reduce)."""
    return np.maximum(flag(x > 1.0, x), b.link_collectives * where)


def block_form(b: Batch, layers, d, w_in, w_out, where=1.0):
    """A block's tp collectives from the links over ``layers`` layers as ``(latency_s,
    seconds_per_row)``: time ``latency_s + seconds_per_row x rows``; 0 on rows whose
    all-reduce is the kernels' (1D rows off the links; ``links_on``). A 1D row (X = 1) on the
    links all-gathers and reduce-scatters over its tp group alone: the ring all-reduce,
    ``2 d (tp - 1) / tp`` elements per row."""
    x, yz = mesh(b)
    on2 = links_on(b, x, where)
    yz_bytes, x_bytes = block_bytes_per_row(d, w_in, w_out, x, yz, b.act_bytes)
    bw_s = b.scaleup_bw_bytes_per_s * b.scaleup_fraction
    s_per_row = on2 * layers * (yz_bytes / (bw_s * b.tp_yz_bw_fraction)
                                + x_bytes / (bw_s * b.tp_x_bw_fraction))
    lat_s = on2 * layers * 2.0 * (b.tp_yz_latency_s * flag(yz > 1.0, x)
                                  + b.tp_x_latency_s)
    return lat_s, s_per_row


def block_terms(b: Batch, layers, d, w_in, w_out, where=1.0):
    """A tp-sharded block's collectives from the links as a step term ``(seconds_per_row,
    latency_s)`` (None where no row has them: ``on``), 1.0 where the block all-reduces with
    the kernels instead, and the link collectives' bytes per row over ``layers`` (the work
    table). ``where``: see ``links_on``."""
    if not on(b):
        return None, 1.0, 0.0
    x, yz = mesh(b)
    one_d = 1.0 - links_on(b, x, where)
    yz_bytes, x_bytes = block_bytes_per_row(d, w_in, w_out, x, yz, b.act_bytes)
    lat_s, s_per_row = block_form(b, layers, d, w_in, w_out, where)
    return (s_per_row, lat_s), one_d, (1.0 - one_d) * layers * (yz_bytes + x_bytes)


def kv_alltoall_bytes_per_row(heads, dims, tp, act_bytes):
    """Bytes one chip sends per row (token) per layer when the KV cache is split by sequence:
    the row's queries to the chip holding its sequence and the attention output back,
    ``heads x dims`` elements (``dims = d_qk + d_v``), a chip holding 1 / tp of them and keeping
    1 / tp of those."""
    return heads * dims * act_bytes * (tp - 1.0) / (tp * tp)


def kv_alltoall_form(b: Batch, layers, dims):
    """The KV-by-sequence all-to-all over ``layers`` layers as ``(latency_s, seconds_per_row)``
    (two all-to-alls per layer: queries out, outputs back); 0 where the KV is split by heads."""
    kvb = b.kv_batch
    nbytes = kv_alltoall_bytes_per_row(b.n_heads, dims, b.tp, b.act_bytes)
    bw_s = b.scaleup_bw_bytes_per_s * b.scaleup_fraction * b.tp_a2a_bw_fraction
    many = flag(b.tp > 1.0, b.tp) * kvb
    lat_s = many * layers * 2.0 * (b.tp_yz_latency_s + b.tp_x_latency_s)
    return lat_s, many * layers * nbytes / bw_s
