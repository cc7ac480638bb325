"""Per-design selections of the builder, on integer codes: the compute dtype and the kernel
family it picks, the fitted kernel parameters of that family, and the reduced topology numbers.

Categorical fields arrive as strings, pandas Categoricals or length-1 arrays; ``encode`` turns
them into codes through their distinct values only, and everything after is numpy on codes
(``table[codes]``, ``np.where``). The Python loops here run over kernel families, dtypes and
distinct topology configurations, never over designs.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse import catalog
from dse.catalog import topology
from dse.catalog.specs import COMPUTE_FALLBACK, DTYPE_BYTES, DTYPES

KERNEL = "accelerator.kernel."   # prefix of the fitted per-op kernel parameters


def encode(values, choices) -> np.ndarray:
    """The position of every value in ``choices`` (int64, at least 1-d), -1 for a missing or
    unknown value. Works through the distinct values only: instant on a pandas Categorical or a
    length-1 column, one hash pass otherwise."""
    if isinstance(values, pd.Series):
        values = values.array if isinstance(values.dtype, pd.CategoricalDtype) else values
    if isinstance(values, pd.Categorical):
        codes, uniques = values.codes, list(values.categories)
    else:
        if not isinstance(values, pd.Series):
            values = np.atleast_1d(np.asarray(values, dtype=object))
            if values.size == 1:                    # one value: no hashing pass
                v = values.reshape(-1)[0]
                code = -1 if v is None or (isinstance(v, float) and v != v) else \
                    dict(zip(choices, range(len(choices)))).get(v, -1)
                return np.array([code], dtype=np.int64)
        codes, uniques = pd.factorize(values, use_na_sentinel=True)
        uniques = list(uniques)
    pos = {c: i for i, c in enumerate(choices)}
    table = np.array([pos.get(u, -1) for u in uniques] + [-1], dtype=np.int64)
    return table[np.asarray(codes)]     # code -1 (missing) picks the trailing -1


def lookup(values, mapping: dict, default=np.nan) -> np.ndarray:
    """``mapping[v]`` for every value; missing or unknown values give ``default``."""
    keys = list(mapping)
    table = np.array([mapping[k] for k in keys] + [default])
    return table[encode(values, keys)]


def _f(out, c) -> np.ndarray:
    return np.asarray(out[c], dtype=float)


def squeeze(v: np.ndarray) -> np.ndarray:
    """``v`` as one value when every entry is the same one (NaN never is), else ``v``."""
    v = np.atleast_1d(v)
    return v[:1] if v.size > 1 and bool(np.all(v == v[0])) else v


def _present(codes: np.ndarray, n_names: int) -> list[int]:
    """The codes that occur in ``codes`` (values in [0, n_names))."""
    if codes.size == 1:
        return [int(codes.reshape(-1)[0])]
    return [int(c) for c in np.flatnonzero(np.bincount(codes.reshape(-1), minlength=n_names))]


W = {d: i for i, d in enumerate(DTYPES)}
BYTES = np.array([DTYPE_BYTES[d] for d in DTYPES] + [np.nan])
assert tuple(COMPUTE_FALLBACK) == DTYPES
GEMM_FAMILIES = ("bf16", "fp8", "fp8_block", "fp4")     # family codes 0..3
# the grouped GEMMs' families: the GEMM ones, int4 weight-only experts (W4A16, code 4) and fp4
# experts on a chip without fp4 tensor cores (W4A16 MXFP4, code 5)
MOE_FAMILIES = GEMM_FAMILIES + ("int4", "mxfp4")
MOE_INT4 = MOE_FAMILIES.index("int4")
MOE_MXFP4 = MOE_FAMILIES.index("mxfp4")


def dtype_columns(out):
    """Per design: matmul and attention peak FLOP/s, weight and KV bytes, whether the weights
    are 8 bits or fewer, the GEMM family code (GEMM_FAMILIES), whether the KV cache is fp8, and
    the chip's peak per dtype."""
    w = encode(out["model.weight_dtype"], DTYPES)
    kv = encode(out["model.kv_dtype"], DTYPES)
    low_bits = (w == W["fp8"]) | (w == W["fp4"])
    kvbytes = BYTES[kv]
    blank_kv = np.isnan(kvbytes)                 # blank: fp8 for fp8/fp4 weights, else bf16
    kvbytes = np.where(blank_kv, np.where(low_bits, 1.0, 2.0), kvbytes)
    kv_fp8 = (kv == W["fp8"]) | (blank_kv & low_bits)
    peak = {d: _f(out, f"accelerator.peak_flops_per_s.{d}") for d in DTYPES}
    matmul, fam = compute_peak(w, peak)
    attn = np.where(kv_fp8 & ~np.isnan(peak["fp8"]), peak["fp8"], peak["bf16"])
    wbytes = BYTES[w]
    return matmul, attn, wbytes, kvbytes, low_bits, fam, kv_fp8, peak


def compute_peak(w: np.ndarray, peak: dict) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the peak FLOP/s weights of dtype codes ``w`` (positions in DTYPES, -1 blank)
    compute at (the first dtype of its fallback chain the chip has, else bf16) and the GEMM
    kernel family code (GEMM_FAMILIES) that selects (fp8: per-tensor scaled)."""
    matmul = np.full(len(w), np.nan)
    present = set(_present(np.where(w < 0, len(DTYPES), w), len(DTYPES) + 1))
    for i, chain in enumerate(COMPUTE_FALLBACK.values()):
        if i not in present:
            continue
        sel = (w == i) & np.isnan(matmul)
        for d in chain:
            take = sel & np.isnan(matmul) & ~np.isnan(peak[d])
            matmul = np.where(take, peak[d], matmul)
    matmul = np.where(np.isnan(matmul), peak["bf16"], matmul)
    fam = np.where(matmul == peak["fp4"], 3, np.where(matmul == peak["fp8"], 1, 0))
    fam = np.where(np.isnan(peak["fp8"]) & (fam == 1), 0, fam)
    return matmul, fam


# the kernel parameters the scorer reads, per op: Batch field -> catalog key suffix
GEMM_KEYS = ("fraction", "half_rows", "n_half", "k_half", "wave_elements", "hbm_fraction",
             "latency_s")
MOE_KEYS = ("fraction", "half_rows", "width_half", "hbm_fraction", "token_bytes", "latency_s",
            "hidden_half", "batch_bytes", "route_bytes", "nongated_slowdown",
            "wave_elements", "remote_fraction")
# absent from a catalog: no such term (0), the gated kernel's speed for non-gated experts (1)
MOE_DEFAULT = {"hidden_half": 0.0, "batch_bytes": 0.0, "route_bytes": 0.0,
               "nongated_slowdown": 1.0, "wave_elements": 0.0, "remote_fraction": 0.0}
ATTN_PREFILL_KEYS = ("fraction", "half_tokens", "half_rows", "latency_s", "hbm_fraction",
                     "per_seq_s", "per_seq_head_s", "dim_half", "window_pad_tokens")
# absent: no term
ATTN_PREFILL_ZERO_DEFAULT = ("per_seq_s", "per_seq_head_s", "dim_half", "window_pad_tokens")
ATTN_DECODE_KEYS = ("hbm_fraction", "compute_fraction", "group_min_heads", "latency_s",
                    "per_seq_s", "per_seq_kv_head_s", "group_max_heads", "fallback_fraction",
                    "window_group_max_heads",
                    "half_items", "split_tokens")
# absent from a catalog: no fallback, no split (batch.OPTIONAL's "off" values); other keys: 0
ATTN_DECODE_DEFAULT = {"group_max_heads": 1e4, "fallback_fraction": 1.0, "split_tokens": 1e12,
                       "window_group_max_heads": 1e4}
# attention kernel families: prefill code 3 * mla + (0 bf16, 1 fp8 compute, 2 fp8 KV cache),
# decode code 2 * mla + (0 bf16, 1 fp8 KV cache)
PREFILL = tuple(f"{k}_prefill{v}" for k in ("attn", "mla") for v in ("", "_fp8", "_kv_fp8"))
DECODE = tuple(f"{k}_decode{v}" for k in ("attn", "mla") for v in ("", "_kv_fp8"))


def _kernel(out, codes: np.ndarray, names, key: str,
            fallback: np.ndarray | None = None) -> np.ndarray:
    """Per row, the kernel column ``accelerator.kernel.<names[code]>_<key>``; rows whose family
    has no such column (a dtype the chip lacks) take ``fallback``."""
    codes = np.atleast_1d(codes)
    cols = {c: _f(out, f"{KERNEL}{names[c]}_{key}") for c in _present(codes, len(names))
            if f"{KERNEL}{names[c]}_{key}" in out}
    shape = np.broadcast_shapes(codes.shape, *(v.shape for v in cols.values()))
    if len(cols) == 1 and len(_present(codes, len(names))) == 1:
        vals = np.broadcast_to(next(iter(cols.values())), shape).astype(float)
    else:
        # one gather over the present families' stacked columns instead of a masked copy each
        present = _present(codes, len(names))
        slot = np.zeros(len(names), np.int64)
        slot[present] = np.arange(len(present))
        stack = np.stack([np.broadcast_to(cols.get(c, np.nan), shape) for c in present])
        vals = np.take_along_axis(stack, np.broadcast_to(slot[codes], shape)[None], 0)[0]
        vals = vals.astype(float, copy=False)
    if fallback is not None:
        vals = np.where(np.isnan(vals), fallback, vals)
    return vals


def kernel_fields(out, fam, kv_fp8, peak, is_mla, moe_fam=None) -> dict[str, np.ndarray]:
    """The fitted kernel parameters of each design's dtype and attention kind as scorer
    fields: GEMM and MoE of the compute dtype's family (fp8: per-tensor or block-scaled kernels
    by ``model.fp8_scaling``), attention of the model's kind (GQA/MHA or MLA) and KV dtype; a
    family the chip lacks falls back to bf16. ``moe_fam``: the family code (MOE_FAMILIES) of the
    experts' own dtype (per-op precision; int4 experts: MOE_INT4), None where the experts run
    the weights' GEMM family."""
    cols = {}
    scaling = encode(out["model.fp8_scaling"], ("auto", "tensor", "block"))
    moe_model = _f(out, "model.num_experts") > 0
    block = (scaling == 2) | ((scaling == 0) & moe_model)
    fam = squeeze(np.where((fam == 1) & block, 2, fam))
    # hook: per-op precision (issue 11): the experts' grouped GEMMs of their own dtype
    moe_fam = fam if moe_fam is None else squeeze(np.where((moe_fam == 1) & block, 2, moe_fam))
    bf16 = np.zeros(1, np.int64)
    gemm = tuple("gemm_" + x for x in GEMM_FAMILIES)
    moe = tuple("moe_" + x for x in MOE_FAMILIES)
    for k in GEMM_KEYS:
        cols[f"gemm_{k}"] = _kernel(out, fam, gemm, k, _kernel(out, bf16, gemm, k))
    for k in MOE_KEYS:
        cols[f"moe_{k}"] = _kernel(out, moe_fam, moe, k, _kernel(
            out, bf16, moe, k, MOE_DEFAULT.get(k)))
    mla = np.asarray(is_mla, dtype=np.int64)
    fp8_peak = kv_fp8 & ~np.isnan(peak["fp8"])
    variant = np.where(fp8_peak & ~is_mla, 1, np.where(kv_fp8, 2, 0))
    pre, pre0 = squeeze(3 * mla + variant), squeeze(3 * mla)
    dec, dec0 = squeeze(2 * mla + np.asarray(kv_fp8, dtype=np.int64)), squeeze(2 * mla)
    for k in ATTN_PREFILL_KEYS:
        cols[f"attn_prefill_{k}"] = _kernel(out, pre, PREFILL, k, _kernel(
            out, pre0, PREFILL, k, 0.0 if k in ATTN_PREFILL_ZERO_DEFAULT else None))
    for k in ATTN_DECODE_KEYS:
        cols[f"attn_decode_{k}"] = _kernel(out, dec, DECODE, k, _kernel(
            out, dec0, DECODE, k, ATTN_DECODE_DEFAULT.get(k, 0.0)))
    # MLA with an fp8 cache prefills at the bf16 peak (the kv_fp8 fits are bf16 compute), and
    # decode compute fractions are of the bf16 peak: rescale to the attention peak used
    attn_peak = np.where(fp8_peak, peak["fp8"], peak["bf16"])
    pre_bf16 = variant != 1
    cols["attn_prefill_fraction"] = np.where(pre_bf16, peak["bf16"] / attn_peak, 1.0) \
        * cols["attn_prefill_fraction"]
    for k in ("compute_fraction", "fallback_fraction"):
        cols[f"attn_decode_{k}"] = peak["bf16"] / attn_peak * cols[f"attn_decode_{k}"]
    return cols


def _distinct(columns: list[np.ndarray], n: int) -> tuple[list[np.ndarray], np.ndarray]:
    """The distinct rows of columns broadcast to length ``n`` (length-1 columns stay
    constant), and each row's position among them."""
    columns = [squeeze(c) for c in columns]
    varying = [c for c in columns if c.size > 1]
    if not varying:
        return [c.reshape(-1)[:1] for c in columns], np.zeros(n, np.int64)
    codes, sizes = [], []
    for c in varying:
        k, u = pd.factorize(c)
        codes.append(k)
        sizes.append(len(u))
    if np.prod(sizes, dtype=float) < 2**62:
        key = np.ravel_multi_index(codes, sizes)
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    else:   # pragma: no cover - more distinct combinations than int64 keys
        _, first, inverse = np.unique(np.stack(codes, axis=1), axis=0, return_index=True,
                                      return_inverse=True)
    return [c.reshape(-1)[:1] if c.size == 1 else c[first] for c in columns], inverse.reshape(-1)


def _group_at(topo, dd, g: np.ndarray, which: str) -> np.ndarray:
    """A reduced-graph number of each group size in ``g`` (within a domain of ``dd`` chips), each
    from the reduction up to that size itself (cached per size): a design's numbers never depend
    on the other designs scored with it (a larger group in the batch would otherwise have moved
    the interpolation of a size between powers of two, or a batch of single chips the hops of
    a pipeline's two-chip hand-off)."""
    out = np.empty(len(g))
    for v in np.unique(g):
        at = g == v
        out[at] = topology.reduce(topo, int(dd), int(min(max(v, 1.0), dd))).at(g[at], which)
    return out


def topology_columns(out) -> dict[str, np.ndarray]:
    """Group bandwidth fractions and latency from the reduced topology graph of each row. The
    graph numbers are computed on the distinct (topology, domain, measured system, group sizes)
    rows and gathered; the reductions (cached) per (topology, domain, group size)."""
    topos = catalog.topologies()
    names = list(topos)
    tp = _f(out, "layout.tp")
    ffn = tp * _f(out, "layout.dp")
    # 2D weight-stationary tp (layout.tp_x): its X and tp / X axes' own groups (1: 1D)
    tpx = _f(out, "layout.tp_x") if "layout.tp_x" in out else np.ones(1)
    dom = _f(out, "topology.scaleup.domain_chips")
    tid = encode(out["topology.id"], names)
    # the system the collective kernels were measured on: the accelerator's default topology
    ref = encode(out["accelerator.default_topology"] if "accelerator.default_topology" in out
                 else out["topology.id"], names)
    base_lat = _f(out, "topology.scaleup_base_latency_s")
    hop_lat = _f(out, "topology.scaleup_hop_latency_s")
    n = int(np.broadcast_shapes(tp.shape, ffn.shape, dom.shape, tid.shape, ref.shape,
                                base_lat.shape, hop_lat.shape, tpx.shape)[0])
    (t, d, r, tp_u, ffn_u, x_u), inv = _distinct([tid, dom, ref, tp, ffn, tpx], n)
    m = max(len(a) for a in (t, d, r, tp_u, ffn_u, x_u))
    t, d, r, tp_u, ffn_u, x_u = (np.broadcast_to(a, (m,)) for a in (t, d, r, tp_u, ffn_u, x_u))
    yz_u = np.maximum(tp_u / np.maximum(x_u, 1.0), 1.0)
    num = {k: np.ones(m) for k in ("tp", "ffn", "a2a", "tp_rel", "ffn_rel", "a2a_rel",
                                   "tp_x", "tp_yz", "tp_a2a")}
    num["hops"] = np.zeros(m)
    for k in ("tp_x_hops", "tp_yz_hops"):
        num[k] = np.zeros(m)
    _, tdr = np.unique(np.stack([t, d, r]), axis=1, return_inverse=True)
    tdr = tdr.reshape(-1)
    for k in range(int(tdr.max()) + 1):
        idx = np.flatnonzero(tdr == k)
        tt, dd, rr_ = int(t[idx[0]]), d[idx[0]], int(r[idx[0]])
        g_tp, g_ffn = np.minimum(tp_u[idx], dd), np.minimum(ffn_u[idx], dd)
        topo = topos[names[tt]]
        num["tp"][idx] = _group_at(topo, dd, g_tp, "ar_fraction")
        num["ffn"][idx] = _group_at(topo, dd, g_ffn, "ar_fraction")
        num["a2a"][idx] = _group_at(topo, dd, g_ffn, "a2a_fraction")
        num["hops"][idx] = _group_at(topo, dd, np.minimum(np.maximum(g_ffn, 2.0), dd), "hops")
        # the absolute shares (no measured kernels stand behind the 2D layout's collectives)
        num["tp_a2a"][idx] = _group_at(topo, dd, g_tp, "a2a_fraction")
        for axis, size in (("tp_x", x_u[idx]), ("tp_yz", yz_u[idx])):
            size = np.minimum(size, dd)
            num[axis][idx] = _group_at(topo, dd, size, "ar_fraction")
            num[axis + "_hops"][idx] = np.where(
                size > 1, _group_at(topo, dd, np.minimum(np.maximum(size, 2.0), dd), "hops"), 0.0)
        # the fitted collective kernels already carry the bandwidth share of the system they
        # were measured on: they see this topology's share relative to that one's
        if rr_ >= 0 and rr_ != tt:
            ref_topo = topos[names[rr_]]
            num["tp_rel"][idx] = num["tp"][idx] / _group_at(ref_topo, dd, g_tp, "ar_fraction")
            num["ffn_rel"][idx] = num["ffn"][idx] / _group_at(ref_topo, dd, g_ffn, "ar_fraction")
            num["a2a_rel"][idx] = num["a2a"][idx] / _group_at(ref_topo, dd, g_ffn,
                                                               "a2a_fraction")
    cols = {k: v[inv] for k, v in num.items() if k != "hops"}
    hops = num["hops"][inv]
    cols["latency"] = base_lat + hop_lat * hops
    # one ring collective over an axis group: about twice its mean hops of steps (a
    # bidirectional ring over N chips of one axis takes N / 2: topologies.md section 3)
    for axis in ("tp_x", "tp_yz"):
        h = cols.pop(axis + "_hops")
        cols[axis + "_latency"] = np.where(h > 0, base_lat + 2.0 * hop_lat * h, 0.0)
    # -1 (no such topology) indexes the last entry, as the scorer always has
    ref_base = np.array([topos[x].scaleup_base_latency_s for x in names])[ref]
    ref_hop = np.array([topos[x].scaleup_hop_latency_s for x in names])[ref]
    cols["extra_latency"] = cols["latency"] - (ref_base + ref_hop * hops)
    return {k: np.broadcast_to(v, (n,)) if v.shape != (n,) else v for k, v in cols.items()}


__all__ = ["ATTN_DECODE_KEYS", "ATTN_PREFILL_KEYS", "BYTES", "GEMM_KEYS", "KERNEL", "MOE_KEYS",
           "compute_peak", "dtype_columns", "encode", "kernel_fields", "lookup", "topology_columns"]
