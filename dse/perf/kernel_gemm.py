"""Closed-form time of a dense GEMM and of one MoE layer's grouped GEMMs on one chip.

Pure numpy, vectorized over designs (every argument broadcasts), no per-hardware branches: the
hardware enters only through its peak FLOP/s, HBM bandwidth and the fitted per-chip, per-runtime,
per-dtype constants of ``dse/catalog/kernels/{gemm,moe}.toml`` (fitted by ``python -m
dse.calibration.kernels --fit --write`` on aiconfigurator-core's measured kernel tables).

Dense GEMM ``Y[m, n] = X[m, k] @ W[k, n]`` (m = rows = tokens, n = output features, k = input
features)::

    shape     = 1 / (1 + n_half / n + k_half / k)               # edge quantization in n, K-loop prologue
    compute_s = 2 ((m + half_rows) n + wave_elements) k / (peak * fraction * shape)
    memory_s  = (n k weight_bytes + (m k + m n) * 2) / (hbm_bw * hbm_fraction)
    t_s       = latency_s + max(compute_s, memory_s)

MoE layer (gated MLP: w1 and w3 fused [hidden -> 2 w], then w2 [w -> hidden], w = inter / moe_tp;
``matrices`` = 3; a non-gated MLP such as Nemotron-3's relu2 experts: up [hidden -> w], down, 2),
balanced routing of ``tokens`` tokens to ``topk`` of ``experts`` experts, experts split over
``moe_ep`` chips (``tokens``: those the chip's kernel is handed, the whole batch on a single-GPU
benchmark or under TP+EP, the tokens dispatched to the chip under wide EP with attention DP,
whose remote entries and bytes are then the received tokens'; ``dse.perf.op_mlp``)::

    local     = experts / moe_ep                                 # experts on this chip
    rows      = tokens * topk / moe_ep                           # routed rows on this chip
    touched   = local * (1 - (1 - topk / experts) ** tokens)     # distinct local experts hit
    shape     = 1 / (1 + width_half / w + hidden_half / hidden)  # narrow experts: tile edge waste
    remote    = remote_fraction (tokens * topk - rows)           # other chips' entries run over
    compute_s = 2 matrices ((rows + remote + half_rows * touched) w + wave_elements) hidden
                / (peak * fraction * shape)
    memory_s  = touched * matrices hidden w weight_bytes / (hbm_bw * hbm_fraction)
    token_s   = (rows token_bytes + tokens (batch_bytes + topk route_bytes)) hidden / hbm_bw
                  # permute, unpermute, quantize; the whole batch's in/out; every routed entry
                  # of the whole batch scanned and gathered, whichever chip holds its expert
    t_s       = latency_s + max(compute_s, memory_s) + token_s

Everything but the shape columns is a per-design constant, so the scorer can precompute
``peak * fraction`` and ``hbm_bw * hbm_fraction`` once per design.

Warm cache (kernel benchmarks only, ``warm_l2_factor``): a microbenchmark re-running one call
on the same buffers finds a weight set smaller than the chip's L2 in the cache, so its memory
term runs ``l2_speedup`` times faster there (GEMM: all of ``memory_s``; MoE: the expert weights'
``memory_s``). Serving runs every other layer between two calls of one layer: the scorer's
cache is cold, it never passes ``l2_bytes``, and the fits' ``hbm_fraction`` is that cold rate
(at most the DRAM peak).
"""

from __future__ import annotations

import numpy as np

ACTIVATION_BYTES = 2.0   # bf16 activations in and out of every GEMM (bytes per element)


def warm_l2_factor(nbytes, l2_bytes, l2_speedup):
    """Time factor of a memory stream of ``nbytes`` (bytes) that a benchmark re-running one call
    finds in a warm last-level cache of ``l2_bytes`` (bytes; 0: cold, factor 1):
    ``1 - hit + hit / l2_speedup``, ``hit = 1 / (1 + (nbytes / l2_bytes)^4)`` (about all of it
    below the capacity, a sixth at 1.5x it); ``l2_speedup``: how much faster the stream runs
    from the cache than from HBM (dimensionless, >= 1)."""
    l2 = np.asarray(l2_bytes, float)
    if not np.any(l2 > 0):
        return 1.0
    hit = np.where(l2 > 0, 1.0 / (1.0 + (np.asarray(nbytes, float)
                                         / np.where(l2 > 0, l2, 1.0)) ** 4), 0.0)
    return 1.0 - hit + hit / np.asarray(l2_speedup, float)


def _floating(x) -> np.ndarray:
    """``x`` as a floating array: float32 stays float32 (the training search scores float32
    chunks), anything else becomes float64 (= ``dse.perf.batch.as_floating``)."""
    x = np.asarray(x)
    return x if x.dtype.kind == "f" else x.astype(np.float64)


def gemm_shape_factor(n, k, n_half, k_half):
    """Fraction of the tile-level throughput a GEMM of output width ``n`` and depth ``k``
    (elements) keeps: ``1 / (1 + n_half / n + k_half / k)``. ``n_half`` (elements): output
    width at which edge quantization halves throughput; ``k_half`` (elements): depth at
    which the K-loop prologue/epilogue costs as much as the loop."""
    n = _floating(n)
    k = _floating(k)
    return 1.0 / (1.0 + n_half / n + k_half / k)


def gemm_s(m, n, k, weight_bytes, peak_flops_per_s, hbm_bw_bytes_per_s, fraction, half_rows,
           n_half, k_half, wave_elements, hbm_fraction, latency_s, l2_bytes=0.0,
           l2_speedup=1.0):
    """Time (s) of one dense GEMM ``[m, k] x [k, n]`` on one chip.

    m, n, k: rows (tokens), output features, input features (elements).
    weight_bytes: bytes per weight element (2 bf16, 1 fp8, ~0.5625 NVFP4 incl. scales).
    peak_flops_per_s: the chip's dense peak at the GEMM's dtype (FLOP/s).
    hbm_bw_bytes_per_s: the chip's HBM bandwidth (bytes/s).
    fraction: achieved fraction of the peak by a large GEMM (dimensionless).
    half_rows: rows of padding every GEMM pays (rows; tile quantization in m: at m = half_rows
        a compute-bound GEMM runs at half its large-m rate).
    n_half, k_half: see ``gemm_shape_factor`` (elements).
    wave_elements: output elements (rows x columns) of one wave of tiles over all SMs: a GEMM
        smaller than one wave still takes about a wave's time (elements).
    hbm_fraction: achieved fraction of the HBM bandwidth when streaming weights (dimensionless).
    latency_s: fixed time per GEMM (launch, prologue, tail) (s).
    l2_bytes, l2_speedup: a benchmark's warm L2 (``warm_l2_factor``; 0: cold, the scorer's).
    """
    m = _floating(m)
    n = _floating(n)
    k = _floating(k)
    shape = gemm_shape_factor(n, k, n_half, k_half)
    compute = (2.0 * ((m + half_rows) * n + wave_elements) * k
               / (peak_flops_per_s * fraction * shape))
    nbytes = n * k * weight_bytes + (m * k + m * n) * ACTIVATION_BYTES
    memory = (nbytes / (hbm_bw_bytes_per_s * hbm_fraction)
              * warm_l2_factor(nbytes, l2_bytes, l2_speedup))
    return latency_s + np.maximum(compute, memory)


def touched_experts(tokens, topk, experts, moe_ep=1):
    """Expected distinct experts (of the ``experts / moe_ep`` on one chip) that ``tokens``
    tokens, each routed uniformly to ``topk`` of ``experts``, touch: ``(E/ep)(1-(1-k/E)^T)``."""
    tokens = np.asarray(tokens, float)
    experts = np.asarray(experts, float)
    p = np.clip(np.asarray(topk, float) / experts, 0.0, 1.0)
    return experts / moe_ep * -np.expm1(tokens * np.log1p(-np.minimum(p, 1 - 1e-12)))


def grouped_gemm_s(tokens, hidden, inter, topk, experts, moe_tp, moe_ep, weight_bytes,
                   peak_flops_per_s, hbm_bw_bytes_per_s, fraction, half_rows, width_half,
                   hbm_fraction, token_bytes, latency_s, rows=None, touched=None,
                   hidden_half=0.0, batch_bytes=0.0, matrices=3.0,
                   route_bytes=0.0, nongated_slowdown=1.0, wave_elements=0.0,
                   remote_fraction=0.0, l2_bytes=0.0, l2_speedup=1.0):
    """Time (s) of one MoE layer's expert GEMMs on one chip (balanced routing).

    tokens: tokens entering the chip's kernel: the whole batch where every chip runs every
        token (a single-GPU benchmark, TP+EP), the tokens the all-to-all dispatches to the
        chip under attention data parallelism (wide EP: each with its top-k list, so
        ``tokens topk - rows`` are then its received tokens' remote entries, not the batch's;
        ``touched`` must then be passed, as it follows the whole batch's routing).
    hidden: model width (elements); inter: one expert's intermediate width (elements), split
        ``moe_tp`` ways, so the local expert width is ``w = inter / moe_tp``.
    topk: experts per token; experts: routed experts in the layer; moe_ep: chips the experts
        are split over.
    weight_bytes: bytes per expert weight element (2 bf16, 1 fp8, ~0.5625 NVFP4).
    peak_flops_per_s (FLOP/s), hbm_bw_bytes_per_s (bytes/s): the chip's peaks.
    fraction: achieved fraction of the peak by large per-expert GEMMs (dimensionless).
    half_rows: rows each touched expert pads to (rows; tile quantization: at few tokens per
        expert every expert still costs a tile of ``half_rows`` rows).
    width_half: local expert width at which tile-edge waste halves throughput (elements).
    hbm_fraction: achieved fraction of HBM bandwidth reading touched experts' weights.
    token_bytes: HBM bytes moved per routed row per hidden element by permute, unpermute,
        activation quantization and the intermediate activation (bytes).
    latency_s: fixed time of the layer (routing, sort, launches) (s).
    hidden_half: model width at which the K-loop of the up projection and the N edge of the
        down projection halve throughput (elements; 0 = no such waste).
    batch_bytes: HBM bytes per token per hidden element of the whole batch, whatever share of
        the experts the chip holds: the input read, the output written and the routing over
        every token (a runtime that gathers all tokens onto every EP rank) (bytes; 0 = none).
    rows, touched: the chip's routed rows and distinct experts hit, when the routing is known
        (a benchmark's deterministic routing); default: uniform random routing
        (``tokens topk / moe_ep`` and ``touched_experts``).
    matrices: weight matrices per expert: 3 for a gated MLP (gate, up, down; the default), 2
        for a non-gated one (up, down: Nemotron-3's relu2 experts); FLOPs and weight bytes
        scale with it (the scorer's ``mlp_mats``).
    route_bytes: HBM bytes per routed entry (token x topk) of the whole batch per hidden
        element, on every EP rank: the routing scan, sort and gather over all ``tokens topk``
        entries before each rank keeps its own (0 = none). Unlike ``batch_bytes`` it grows with
        topk; at a given rows per chip it grows with ep.
    nongated_slowdown: time factor on the expert GEMMs (the max of compute and weight reads) of
        a non-gated layer (``matrices`` 2), relative to the gated kernel's efficiency: the
        relu2 path is another kernel (TensorRT-LLM's non-gated CUTLASS MoE; SGLang on Hopper
        runs Nemotron-3's experts on FlashInfer's CUTLASS MoE, not its Triton fused MoE)
        (dimensionless; 1 = the gated kernel's efficiency).
    wave_elements: output elements (rows x local width) of one wave of tiles over all SMs,
        paid once per expert GEMM whatever the chip's share of the rows: a layer whose routed
        rows on the chip fill less than a wave (few tokens per chip at a wide expert
        parallelism) still takes about a wave's time, as a dense GEMM does (``gemm_s``)
        (elements; 0 = no such floor).
    remote_fraction: share of a local routed row's compute that a routed entry held by
        another chip still costs this one: a kernel that runs over every entry of the batch
        with an expert map (remote experts' tiles launched and skipped or zero-filled, as a
        Triton fused MoE with expert parallelism does) rather than over the chip's own rows
        (dimensionless; 0 = remote entries cost nothing).
    l2_bytes, l2_speedup: a benchmark's warm L2 on the expert weights' reads
        (``warm_l2_factor``; 0: cold, the scorer's).
    """
    tokens = np.asarray(tokens, float)
    hidden = np.asarray(hidden, float)
    w = np.asarray(inter, float) / moe_tp
    if rows is None:
        rows = tokens * np.asarray(topk, float) / moe_ep
    if touched is None:
        touched = touched_experts(tokens, topk, experts, moe_ep)
    shape = 1.0 / (1.0 + width_half / w + hidden_half / hidden)
    mats = np.asarray(matrices, float)
    remote = np.maximum(tokens * np.asarray(topk, float) - rows, 0.0) * remote_fraction
    compute = (2.0 * mats * ((rows + remote + half_rows * touched) * w + wave_elements) * hidden
               / (peak_flops_per_s * fraction * shape))
    wbytes = touched * mats * hidden * w * weight_bytes
    memory = (wbytes / (hbm_bw_bytes_per_s * hbm_fraction)
              * warm_l2_factor(wbytes, l2_bytes, l2_speedup))
    token = ((rows * token_bytes + tokens * (batch_bytes + np.asarray(topk, float) * route_bytes))
             * hidden / hbm_bw_bytes_per_s)
    kind = np.where(mats == 2.0, nongated_slowdown, 1.0)
    return latency_s + np.maximum(compute, memory) * kind + token
