"""Attention-core kernel models: closed forms fitted on measured kernel tables.

One attention layer on one chip (heads already divided by tensor parallelism). Every function is
elementwise numpy over arrays (or scalars) and has no per-hardware branch: a chip enters only
through its peaks (``peak_flops_per_s``, ``hbm_bw_bytes_per_s``) and its fitted parameters
(``dse/catalog/kernels/attention.toml``, written by ``python -m dse.calibration.kernels --fit --write
--only attention``).

Prefill (context) attention, GQA/MHA or expanded MLA::

    pairs    = new * prior + new * (new + 1) / 2          (causal (query, key) pairs per sequence)
    pairs    = min(pairs, new * (window + window_pad))    (sliding window, when window > 0: the
                                                           query tile's span and the partly
                                                           masked key tiles at both window edges
                                                           add window_pad keys per query)
    keys     = pairs / new                                (keys one query row attends to: the
                                                           length of the kernel's inner loop)
    flops    = 2 * batch * heads * (d_qk + d_v) * pairs
    t_flops  = flops / (peak * fraction) * (1 + half_tokens / keys) * (1 + half_rows / (batch * heads * new))
               * (1 + dim_half / d_qk)

    ``half_tokens``: keys per query row at which the rate halves: each query tile pays a fixed
    prologue/epilogue (Q load, softmax rescale, O store) that a long key loop amortizes, so a
    chunk that follows a long cached prefix, or a short-window layer, runs at its own rate.
    bytes    = elem_bytes * batch * (new * heads * (d_qk + d_v) + (new + prior_w) * kv_heads * (d_qk + d_v))
    t        = latency_s + batch (per_seq_s + heads per_seq_head_s)
               + max(t_flops, bytes / (hbm_bw * hbm_fraction))

Decode (generation) attention, one new token per sequence over ``context`` cached tokens
(GQA/MHA, or MLA in the absorbed form: one latent "KV head" of ``kv_lora + rope`` elements)::

    ctx      = min(context, window)                       (window > 0)
    bytes    = batch * ctx * kv_elems_per_token * kv_bytes_per_elem
    q_rows   = kv_heads * max(heads / kv_heads, group_min_heads)   (the MMA pads each KV head's
                                                                    query group to a tile)
    flops    = 2 * batch * ctx * q_rows * (d_qk + d_v)
    splits   = 1 + ctx / split_tokens                     (CTAs the kernel splits one
                                                           (sequence, KV head)'s context over)
    t        = latency_s + batch * (per_seq_s + kv_heads * per_seq_kv_head_s)
               + max(bytes / (hbm_bw * hbm_fraction) * (1 + half_items / (batch * kv_heads * splits)),
                     flops / (peak * compute_fraction))

    ``half_items``: (sequence, KV head) work items at which the KV stream reaches half its rate:
    a call with few items leaves SMs idle, unless the kernel splits each item's context over
    several CTAs (flash-decoding's split-KV): about one more split per ``split_tokens`` of
    context, so a long context fills the chip with few sequences and a short one cannot
    (half_items 0: no ramp; split_tokens inf: no split).

    Query groups wider than ``group_max_heads`` (heads / kv_heads > group_max_heads: the
    grouped-query kernel's largest supported group, e.g. TensorRT-LLM's XQA at 32) fall back to a
    kernel with one work item per (sequence, query head), whose dot products run off the
    tensor cores (``fallback_fraction`` of the peak) and whose KV head is re-read per query
    head from L2::

    t        = latency_s + batch * (per_seq_s + heads * per_seq_kv_head_s)
               + max(bytes / (hbm_bw * hbm_fraction) * (1 + half_items / (batch * kv_heads * splits)),
                     2 * batch * ctx * heads * (d_qk + d_v) / (peak * fallback_fraction))

    (``group_max_heads`` = inf, the default: no fallback, the form above.)

    A sliding-window call (``window > 0``) takes query groups of at most
    ``min(group_max_heads, window_group_max_heads)``: FlashAttention-2 packs a decode's query
    group into the tile's rows (``seqlenq_ngroups_swapped``) only without a window, so a
    windowed decode runs one work item per query head (``window_group_max_heads`` 1; inf, the
    default: windows change nothing).

    Warm cache (kernel benchmarks only): a microbenchmark that re-runs one call on the same
    buffers finds a working set smaller than the chip's L2 (``l2_bytes``) in the cache, and
    the KV stream runs ``l2_speedup`` times faster there::

    hit      = 1 / (1 + (bytes / l2_bytes)^4)             (about all of it below the capacity,
                                                           little of it at 1.5x the capacity)
    t_mem    = t_mem * (1 - hit + hit / l2_speedup)

    In the measured tables this is the L40S's (96 MB L2, 864 GB/s GDDR6) decode attention over
    8-96 MB of KV running 1.6-2.7x faster than its bandwidth allows, and not above 128 MB.
    Serving runs every other layer's weights and KV between two calls of one layer, so the
    cache is cold there: the scorer never passes ``l2_bytes`` (0: no such term), and the fit's
    ``hbm_fraction`` is the cold-cache rate it needs.

Both are affine in the batch (decode) or, for a fixed chunk shape, closed forms whose per-design
constants can be precomputed by the scorer.
"""

from __future__ import annotations

import numpy as np

from dse.perf.kernel_gemm import warm_l2_factor

# DeepSeek-V3 MLA dimensions (elements)
MLA_KV_LORA = 512
MLA_QK_ROPE = 64
MLA_QK_NOPE = 128
MLA_V_HEAD = 128


def causal_pairs(new_tokens, prior_tokens, window_tokens=0.0):
    """Causal (query, key) pairs of one sequence when ``new_tokens`` follow ``prior_tokens``
    cached ones: ``new * prior + new (new + 1) / 2``, capped at ``new * window_tokens`` when
    ``window_tokens > 0`` (0 or inf: full attention)."""
    new = np.asarray(new_tokens, float)
    prior = np.asarray(prior_tokens, float)
    w = np.asarray(window_tokens, float)
    full = new * prior + 0.5 * new * (new + 1.0)
    return np.where(w > 0, np.minimum(full, new * np.where(w > 0, w, 1.0)), full)


def prefill_attention_s(batch, new_tokens, prior_tokens, heads, kv_heads, d_qk, d_v,
                        window_tokens, elem_bytes, peak_flops_per_s, hbm_bw_bytes_per_s, *,
                        fraction, half_tokens, half_rows, latency_s, hbm_fraction=0.8,
                        dim_half=0.0, per_seq_s=0.0, per_seq_head_s=0.0,
                        window_pad_tokens=0.0):
    """Seconds of one prefill (context) attention layer on one chip.

    batch: sequences in the call; new_tokens: new (query) tokens per sequence; prior_tokens:
    tokens already cached per sequence; heads, kv_heads: query and KV heads on this chip;
    d_qk, d_v: query/key and value head dims (elements); window_tokens: sliding window (tokens,
    0 = full); elem_bytes: bytes per Q/K/V/O element; peak_flops_per_s: the chip's dense matmul
    peak for the compute dtype; hbm_bw_bytes_per_s: its HBM bandwidth.
    fraction: fraction of the peak reached by long, wide prefills; half_tokens: keys per query
    row (pairs / new tokens) at which the rate is halved (per-query-tile prologue and epilogue
    over the key loop); half_rows: query rows
    (batch x heads x new) at which the rate is halved (too few CTAs to fill the chip);
    latency_s: fixed time per call; hbm_fraction: achieved fraction of HBM bandwidth;
    dim_half: head dim (d_qk, elements) at which the MMAs' short K (scores) and N (values)
    halve the rate (0: none); per_seq_s: time per sequence in the call (varlen bookkeeping,
    one tile row per sequence at least) (s; 0: none); per_seq_head_s: time per (sequence,
    query head) work item: each pads its queries to a tile and loads its K/V tiles, however
    few its new tokens (s; 0: none); window_pad_tokens: keys per query row a sliding window
    computes beyond its width (tile span, masked edge tiles) (0: none).
    """
    batch = np.asarray(batch, float)
    new = np.maximum(np.asarray(new_tokens, float), 1.0)
    prior = np.asarray(prior_tokens, float)
    heads = np.asarray(heads, float)
    kv_heads = np.asarray(kv_heads, float)
    dsum = np.asarray(d_qk, float) + np.asarray(d_v, float)
    w = np.asarray(window_tokens, float)
    pairs = causal_pairs(new, prior, np.where(w > 0, w + window_pad_tokens, 0.0))
    flops = 2.0 * batch * heads * dsum * pairs
    slow = ((1.0 + half_tokens * new / pairs) * (1.0 + half_rows / (batch * heads * new))
            * (1.0 + dim_half / np.asarray(d_qk, float)))
    t_flops = flops / (np.asarray(peak_flops_per_s, float) * fraction) * slow
    prior_w = np.where(w > 0, np.minimum(prior, np.where(w > 0, w, 1.0)), prior)
    nbytes = elem_bytes * batch * (new * heads * dsum + (new + prior_w) * kv_heads * dsum)
    t_mem = nbytes / (np.asarray(hbm_bw_bytes_per_s, float) * hbm_fraction)
    return latency_s + batch * (per_seq_s + heads * per_seq_head_s) + np.maximum(t_flops, t_mem)


def decode_attention_s(batch, context_tokens, heads, kv_heads, d_qk, d_v, kv_elems_per_token,
                       kv_bytes_per_elem, window_tokens, peak_flops_per_s, hbm_bw_bytes_per_s,
                       *, hbm_fraction, compute_fraction, group_min_heads, latency_s,
                       per_seq_s, per_seq_kv_head_s=0.0, group_max_heads=np.inf,
                       fallback_fraction=1.0, half_items=0.0, split_tokens=np.inf,
                       qo_bytes_per_elem=0.0, l2_bytes=0.0, l2_speedup=1.0,
                       window_group_max_heads=np.inf):
    """Seconds of one decode (generation) attention layer on one chip: one new token for each of
    ``batch`` sequences, each attending to ``context_tokens`` tokens (cached + the new one).

    heads, kv_heads: query and KV heads on this chip (MLA absorbed: heads, 1); d_qk, d_v: the
    dims the kernel multiplies (GQA: head_dim, head_dim; MLA absorbed: kv_lora + rope, kv_lora);
    kv_elems_per_token: KV-cache elements read per token (GQA: 2 kv_heads head_dim; MLA:
    kv_lora + rope); kv_bytes_per_elem: KV-cache bytes per element (2 bf16, 1 fp8);
    window_tokens: sliding window (0 = full); peak_flops_per_s, hbm_bw_bytes_per_s: the chip's.
    hbm_fraction: achieved fraction of HBM bandwidth on the KV stream; compute_fraction: achieved
    fraction of the peak on the score/value MMAs; group_min_heads: query heads per KV head the
    MMA tile pads to (rows); latency_s: fixed time per call; per_seq_s: time per sequence;
    per_seq_kv_head_s: time per (sequence, KV head) work item (CTA setup, split-K reduction);
    group_max_heads: the widest query group (heads per KV head) the grouped kernel takes, wider
    groups run the per-query-head fallback (inf: never); fallback_fraction: the fallback's
    achieved fraction of the peak; half_items: (sequence, KV head) items per call at which
    the KV stream runs at half its rate (0: none); split_tokens: context tokens per extra
    split-KV CTA of one item (inf: the kernel never splits); qo_bytes_per_elem: bytes per
    query and output element (2 for bf16 activations; 0: not counted): each sequence's query
    (``heads x d_qk``) is read and its output (``heads x d_v``) written once per call, on the
    same HBM stream as the KV (an MLA decode with 128 heads moves 278 kB per sequence, the KV
    of 480 fp8 tokens); l2_bytes: the chip's L2 capacity when the call's bytes may be in a
    warm cache (a benchmark re-running it; bytes; 0: cold, the default and the scorer's);
    l2_speedup: how much faster the KV stream runs from the warm cache than from HBM;
    window_group_max_heads: the widest query group a sliding-window call keeps on the grouped
    kernel (1: every windowed call falls back per query head; inf: as unwindowed).
    """
    batch = np.asarray(batch, float)
    ctx = np.asarray(context_tokens, float)
    w = np.asarray(window_tokens, float)
    ctx = np.where(w > 0, np.minimum(ctx, np.where(w > 0, w, 1.0)), ctx)
    heads = np.asarray(heads, float)
    kv_heads = np.asarray(kv_heads, float)
    nbytes = (batch * ctx * np.asarray(kv_elems_per_token, float) * kv_bytes_per_elem
              + batch * heads * (np.asarray(d_qk, float) + np.asarray(d_v, float))
              * qo_bytes_per_elem)
    gmax = np.where(w > 0, np.minimum(group_max_heads, window_group_max_heads), group_max_heads)
    fallback = heads > kv_heads * gmax
    q_rows = np.where(fallback, heads, kv_heads * np.maximum(heads / kv_heads, group_min_heads))
    items = np.where(fallback, heads, kv_heads)
    flops = 2.0 * batch * ctx * q_rows * (np.asarray(d_qk, float) + np.asarray(d_v, float))
    t_mem = (nbytes / (np.asarray(hbm_bw_bytes_per_s, float) * hbm_fraction)
             * (1.0 + half_items / (batch * kv_heads * (1.0 + ctx / split_tokens))))
    t_mem = t_mem * warm_l2_factor(nbytes, l2_bytes, l2_speedup)
    t_flops = flops / (np.asarray(peak_flops_per_s, float)
                       * np.where(fallback, fallback_fraction, compute_fraction))
    return (latency_s + batch * (per_seq_s + items * per_seq_kv_head_s)
            + np.maximum(t_mem, t_flops))


def gqa_decode_attention_s(batch, context_tokens, heads, kv_heads, head_dim, kv_bytes_per_elem,
                           window_tokens, peak_flops_per_s, hbm_bw_bytes_per_s, **params):
    """GQA/MHA decode: K and V of ``kv_heads`` heads of ``head_dim`` elements per token."""
    kv_heads = np.asarray(kv_heads, float)
    return decode_attention_s(batch, context_tokens, heads, kv_heads, head_dim, head_dim,
                              2.0 * kv_heads * np.asarray(head_dim, float), kv_bytes_per_elem,
                              window_tokens, peak_flops_per_s, hbm_bw_bytes_per_s, **params)


def mla_decode_attention_s(batch, context_tokens, heads, kv_bytes_per_elem, peak_flops_per_s,
                           hbm_bw_bytes_per_s, *, kv_lora=MLA_KV_LORA, qk_rope=MLA_QK_ROPE,
                           **params):
    """MLA decode in the absorbed form: every query head attends over the shared latent
    (``kv_lora + qk_rope`` elements per token, read once), scores over ``kv_lora + qk_rope``
    and values over ``kv_lora``."""
    lat = kv_lora + qk_rope
    return decode_attention_s(batch, context_tokens, heads, 1.0, lat, kv_lora, lat,
                              kv_bytes_per_elem, 0.0, peak_flops_per_s, hbm_bw_bytes_per_s,
                              **params)


def mla_prefill_attention_s(batch, new_tokens, prior_tokens, heads, elem_bytes,
                            peak_flops_per_s, hbm_bw_bytes_per_s, *, qk_nope=MLA_QK_NOPE,
                            qk_rope=MLA_QK_ROPE, v_head=MLA_V_HEAD, **params):
    """MLA prefill in the expanded form: ``heads`` query and key heads of ``qk_nope + qk_rope``
    and value heads of ``v_head`` elements (the latent decompressed per head)."""
    return prefill_attention_s(batch, new_tokens, prior_tokens, heads, heads, qk_nope + qk_rope,
                               v_head, 0.0, elem_bytes, peak_flops_per_s, hbm_bw_bytes_per_s,
                               **params)
