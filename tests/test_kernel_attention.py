"""Attention-core kernel models (dse.perf.kernel_attention) and their fitted catalog."""

import tomllib

import numpy as np
import pytest

from dse.calibration.kernels import common
from dse.perf import kernel_attention as ka

H200_PEAK = 989e12
H200_BW = 4.8e12

DEC = dict(hbm_fraction=0.8, compute_fraction=0.07, group_min_heads=16.0, latency_s=1e-5,
           per_seq_s=2e-8, per_seq_kv_head_s=1e-8)
PRE = dict(fraction=0.6, half_tokens=64.0, half_rows=2e4, latency_s=1e-5, hbm_fraction=0.7,
           per_seq_s=2e-7, per_seq_head_s=2e-8, dim_half=32.0)


def test_long_context_decode_is_kv_bandwidth_bound():
    b, ctx, h, hk, d = 64, 32768, 32, 8, 128
    p = dict(DEC, compute_fraction=0.3, per_seq_s=0.0, per_seq_kv_head_s=0.0)
    t = ka.gqa_decode_attention_s(b, ctx, h, hk, d, 2.0, 0.0, H200_PEAK, H200_BW, **p)
    kv_bytes = b * ctx * 2 * hk * d * 2
    assert t == pytest.approx(kv_bytes / (H200_BW * 0.8) + 1e-5, rel=1e-12)
    # and the FLOPs side is smaller: 2 * b * ctx * (hk * max(4, 16)) * 2d at 30% of peak
    flops = 2 * b * ctx * hk * 16 * 2 * d
    assert flops / (H200_PEAK * 0.3) < kv_bytes / (H200_BW * 0.8)


def test_decode_per_sequence_terms():
    p = dict(DEC, latency_s=0.0, compute_fraction=1.0)
    t = ka.gqa_decode_attention_s(1024, 1, 32, 8, 128, 2.0, 0.0, H200_PEAK, H200_BW, **p)
    kv = 1024 * 1 * 2 * 8 * 128 * 2 / (H200_BW * 0.8)
    assert t == pytest.approx(1024 * (2e-8 + 8 * 1e-8) + kv, rel=1e-9)


def test_decode_fallback_of_wide_query_groups_by_hand():
    """64 query heads on 1 KV head with a 32-head limit: one work item per query head, the dot
    products at fallback_fraction of the peak; 32:1 stays on the grouped kernel."""
    b, ctx, d = 8, 4096, 128
    p = dict(DEC, latency_s=0.0, group_max_heads=32.0, fallback_fraction=0.01)
    t = ka.gqa_decode_attention_s(b, ctx, 64, 1, d, 2.0, 0.0, H200_PEAK, H200_BW, **p)
    kv = b * ctx * 2 * d * 2 / (H200_BW * 0.8)                 # 16.8 MB: 4.4 us
    flops = 2 * b * ctx * 64 * 2 * d / (H200_PEAK * 0.01)      # 1.07 GFLOP at 9.89 TF: 109 us
    assert flops > kv
    assert t == pytest.approx(b * (2e-8 + 64 * 1e-8) + flops, rel=1e-12)
    t32 = ka.gqa_decode_attention_s(b, ctx, 32, 1, d, 2.0, 0.0, H200_PEAK, H200_BW, **p)
    grouped = 2 * b * ctx * 32 * 2 * d / (H200_PEAK * 0.07)
    assert t32 == pytest.approx(b * (2e-8 + 1e-8) + max(kv, grouped), rel=1e-12)
    # the default (no group_max_heads): the grouped kernel at any ratio
    t0 = ka.gqa_decode_attention_s(b, ctx, 64, 1, d, 2.0, 0.0, H200_PEAK, H200_BW, **DEC)
    g64 = 2 * b * ctx * 64 * 2 * d / (H200_PEAK * 0.07)
    assert t0 == pytest.approx(1e-5 + b * (2e-8 + 1e-8) + max(kv, g64), rel=1e-12)


def test_decode_few_items_stream_the_kv_slower_by_hand():
    """One sequence on one KV head (MLA's latent) with half_items = 8: the KV stream runs at
    1 / (1 + 8) of its rate; 64 sequences x 8 KV heads: at 1 / (1 + 8 / 512)."""
    p = dict(DEC, latency_s=0.0, per_seq_s=0.0, per_seq_kv_head_s=0.0, compute_fraction=1.0,
             half_items=8.0)
    t = ka.mla_decode_attention_s(1, 65536, 16, 2.0, H200_PEAK, H200_BW, **p)
    kv = 65536 * 576 * 2 / (H200_BW * 0.8)                     # 75.5 MB: 19.7 us
    assert t == pytest.approx(kv * 9.0, rel=1e-12)
    t = ka.gqa_decode_attention_s(64, 8192, 32, 8, 128, 2.0, 0.0, H200_PEAK, H200_BW, **p)
    kv = 64 * 8192 * 2 * 8 * 128 * 2 / (H200_BW * 0.8)
    assert t == pytest.approx(kv * (1.0 + 8.0 / 512.0), rel=1e-12)
    # split-KV: 1 + 8192 / 1024 = 9 CTAs per (sequence, KV head), the ramp / 9; a 1024-token
    # context splits in 2
    ps = dict(p, split_tokens=1024.0)
    t = ka.gqa_decode_attention_s(64, 8192, 32, 8, 128, 2.0, 0.0, H200_PEAK, H200_BW, **ps)
    assert t == pytest.approx(kv * (1.0 + 8.0 / (512.0 * 9.0)), rel=1e-12)
    t = ka.gqa_decode_attention_s(1, 1024, 32, 8, 128, 2.0, 0.0, H200_PEAK, H200_BW, **ps)
    kv1 = 1024 * 2 * 8 * 128 * 2 / (H200_BW * 0.8)
    assert t == pytest.approx(kv1 * (1.0 + 8.0 / (8.0 * 2.0)), rel=1e-12)


def test_decode_warm_l2_by_hand():
    """The benchmark's warm cache (kernel fits only): an L40S-like chip (96 MB L2, 864 GB/s)
    with l2_speedup 4. A call whose KV is exactly the L2's size hits half of it:
    t_mem x (1 - 0.5 + 0.5 / 4) = 0.625; at a quarter of the capacity the hit is
    1 / (1 + 1/256); at 4x the capacity 1 / 257; l2_bytes 0 (the scorer's cold cache) or
    l2_speedup 1: no change."""
    bw, peak = 864e9, 362e12
    p = dict(DEC, latency_s=0.0, per_seq_s=0.0, per_seq_kv_head_s=0.0, compute_fraction=1.0)
    kv_tok = 2 * 8 * 128 * 2                                   # bytes per token, 8 KV heads
    for ratio in (1.0, 0.25, 4.0):
        ctx = 96e6 * ratio / (64 * kv_tok)
        cold = ka.gqa_decode_attention_s(64, ctx, 32, 8, 128, 2.0, 0.0, peak, bw, **p)
        assert cold == pytest.approx(96e6 * ratio / (bw * 0.8), rel=1e-12)
        warm = ka.gqa_decode_attention_s(64, ctx, 32, 8, 128, 2.0, 0.0, peak, bw,
                                         l2_bytes=96e6, l2_speedup=4.0, **p)
        hit = 1.0 / (1.0 + ratio ** 4)
        assert warm == pytest.approx(cold * (1.0 - hit + hit / 4.0), rel=1e-12)
    ctx = 96e6 / (64 * kv_tok)
    cold = ka.gqa_decode_attention_s(64, ctx, 32, 8, 128, 2.0, 0.0, peak, bw, **p)
    half = ka.gqa_decode_attention_s(64, ctx, 32, 8, 128, 2.0, 0.0, peak, bw, l2_bytes=96e6,
                                     l2_speedup=4.0, **p)
    assert half / cold == pytest.approx(0.625, rel=1e-12)
    for kw in (dict(l2_bytes=0.0, l2_speedup=4.0), dict(l2_bytes=96e6, l2_speedup=1.0)):
        t = ka.gqa_decode_attention_s(64, ctx, 32, 8, 128, 2.0, 0.0, peak, bw, **kw, **p)
        assert t == pytest.approx(96e6 / (bw * 0.8), rel=1e-12)
    # MLA: the latent's bytes against the same capacity
    ctx = 48e6 / (8 * 576 * 2)
    cold = ka.mla_decode_attention_s(8, ctx, 16, 2.0, peak, bw, **p)
    warm = ka.mla_decode_attention_s(8, ctx, 16, 2.0, peak, bw, l2_bytes=96e6, l2_speedup=4.0,
                                     **p)
    hit = 1.0 / (1.0 + 0.5 ** 4)
    assert warm == pytest.approx(cold * (1.0 - hit + hit / 4.0), rel=1e-12)


def test_decode_fits_see_the_warm_cache():
    """The fitted catalog: the big-L2 GDDR chips' decode kernels run well above their DRAM
    rate from a warm cache (L40S SGLang and TensorRT-LLM bf16 fit 7.9 and 9.3x), and every fitted
    group has a warm-cache factor >= 1."""
    doc = tomllib.loads((common.CATALOG_DIR / "attention.toml").read_text())
    assert doc["l40s"]["sglang"]["attn_decode_l2_speedup"] > 4.0
    assert doc["l40s"]["trtllm"]["attn_decode_l2_speedup"] > 4.0
    for chip, rts in doc.items():
        for rt, e in rts.items():
            assert e["attn_decode_l2_speedup"] >= 1.0, (chip, rt)
            assert e["mla_decode_l2_speedup"] >= 1.0, (chip, rt)


def test_prefill_flops_of_a_known_shape():
    b, s, h, d = 2, 1024, 32, 128
    p = dict(fraction=0.5, half_tokens=0.0, half_rows=0.0, latency_s=0.0, hbm_fraction=1.0)
    t = ka.prefill_attention_s(b, s, 0, h, 8, d, d, 0.0, 2.0, H200_PEAK, H200_BW, **p)
    flops = 2 * b * h * (d + d) * (s * (s + 1) / 2)   # 17.2 GFLOP
    assert flops == pytest.approx(17.196646e9, rel=1e-6)
    assert t == pytest.approx(flops / (H200_PEAK * 0.5), rel=1e-12)
    # the few-keys-per-row and few-rows slowdowns multiply the FLOP time: a causal prompt's
    # query row attends to (s + 1) / 2 keys on average
    p2 = dict(p, half_tokens=(s + 1) / 2, half_rows=b * h * s)
    t2 = ka.prefill_attention_s(b, s, 0, h, 8, d, d, 0.0, 2.0, H200_PEAK, H200_BW, **p2)
    assert t2 == pytest.approx(4 * t, rel=1e-12)


def test_prefill_key_loop_and_window_pad_by_hand():
    # half_tokens counts the keys per query row, not the new tokens: a 512-token chunk after
    # 7680 cached tokens attends to 7680 + 256.5 keys per row and runs near the long-prompt rate
    p = dict(fraction=0.5, half_tokens=1000.0, half_rows=0.0, latency_s=0.0, hbm_fraction=1e9)
    t = ka.prefill_attention_s(1, 512, 7680, 32, 8, 128, 128, 0.0, 2.0, H200_PEAK, H200_BW, **p)
    pairs = 512 * 7680 + 512 * 513 / 2
    base = 2 * 32 * 256 * pairs / (H200_PEAK * 0.5)
    assert t == pytest.approx(base * (1 + 1000.0 / (pairs / 512)), rel=1e-12)   # x1.126
    # (the same chunk as a fresh prompt: 256.5 keys per row, x4.9)
    t0 = ka.prefill_attention_s(1, 512, 0, 32, 8, 128, 128, 0.0, 2.0, H200_PEAK, H200_BW, **p)
    assert t0 / (2 * 32 * 256 * 512 * 513 / 2 / (H200_PEAK * 0.5)) == pytest.approx(
        1 + 1000.0 / 256.5, rel=1e-12)
    # a 128-token window computes window + window_pad keys per query row: 8192 x (128 + 64)
    pw = dict(p, half_tokens=0.0, window_pad_tokens=64.0)
    tw = ka.prefill_attention_s(1, 8192, 0, 32, 8, 128, 128, 128.0, 2.0, H200_PEAK, H200_BW, **pw)
    assert tw == pytest.approx(2 * 32 * 256 * 8192 * 192 / (H200_PEAK * 0.5), rel=1e-12)
    # the pad never makes a window cost more than full attention
    ts = ka.prefill_attention_s(1, 100, 0, 32, 8, 128, 128, 128.0, 2.0, H200_PEAK, H200_BW, **pw)
    assert ts == pytest.approx(2 * 32 * 256 * 100 * 101 / 2 / (H200_PEAK * 0.5), rel=1e-12)


def test_window_caps_pairs():
    assert ka.causal_pairs(1000, 0, 128) == 1000 * 128
    assert ka.causal_pairs(1000, 0, 0) == 1000 * 1001 / 2
    assert ka.causal_pairs(100, 50, 0) == 100 * 50 + 100 * 101 / 2
    assert ka.causal_pairs(100, 0, 4096) == 100 * 101 / 2     # window longer than the sequence
    full = ka.prefill_attention_s(1, 8192, 0, 32, 8, 128, 128, 0.0, 2.0, H200_PEAK, H200_BW, **PRE)
    win = ka.prefill_attention_s(1, 8192, 0, 32, 8, 128, 128, 512.0, 2.0, H200_PEAK, H200_BW,
                                 **PRE)
    assert win < full / 5
    # decode: context beyond the window is not read
    a = ka.gqa_decode_attention_s(8, 100000, 32, 8, 128, 2.0, 1024.0, H200_PEAK, H200_BW, **DEC)
    b = ka.gqa_decode_attention_s(8, 1024, 32, 8, 128, 2.0, 0.0, H200_PEAK, H200_BW, **DEC)
    assert a == pytest.approx(b)


def test_mla_decode_reads_only_the_latent():
    p = dict(DEC, compute_fraction=1.0, group_min_heads=1.0, per_seq_s=0.0,
             per_seq_kv_head_s=0.0)
    b, ctx = 32, 65536
    t = ka.mla_decode_attention_s(b, ctx, 16, 2.0, H200_PEAK, H200_BW, **p)
    latent_bytes = b * ctx * (512 + 64) * 2
    assert t == pytest.approx(latent_bytes / (H200_BW * 0.8) + 1e-5, rel=1e-12)
    # the latent is shared by the heads: with the memory term binding, heads do not matter
    t8 = ka.mla_decode_attention_s(b, ctx, 8, 2.0, H200_PEAK, H200_BW, **p)
    assert t8 == pytest.approx(t)
    # fp8 KV halves the bytes
    t_fp8 = ka.mla_decode_attention_s(b, ctx, 8, 1.0, H200_PEAK, H200_BW, **p)
    assert t_fp8 - 1e-5 == pytest.approx((t - 1e-5) / 2)


def test_mla_prefill_is_expanded_mha():
    t = ka.mla_prefill_attention_s(4, 4096, 0, 16, 2.0, H200_PEAK, H200_BW, **PRE)
    ref = ka.prefill_attention_s(4, 4096, 0, 16, 16, 192, 128, 0.0, 2.0, H200_PEAK, H200_BW, **PRE)
    assert t == ref


def test_monotone_in_context_and_batch():
    ctx = np.array([1, 16, 256, 4096, 65536, 131072], float)
    t = ka.gqa_decode_attention_s(16, ctx, 32, 8, 128, 2.0, 0.0, H200_PEAK, H200_BW, **DEC)
    assert np.all(np.diff(t) > 0)
    bs = np.array([1, 2, 8, 64, 512, 2048], float)
    t = ka.gqa_decode_attention_s(bs, 2048, 32, 8, 128, 2.0, 0.0, H200_PEAK, H200_BW, **DEC)
    assert np.all(np.diff(t) > 0)
    t = ka.mla_decode_attention_s(bs, 2048, 16, 2.0, H200_PEAK, H200_BW, **DEC)
    assert np.all(np.diff(t) > 0)
    s = np.array([16, 128, 1024, 8192], float)
    t = ka.prefill_attention_s(2, s, 0, 32, 8, 128, 128, 0.0, 2.0, H200_PEAK, H200_BW, **PRE)
    assert np.all(np.diff(t) > 0)
    t = ka.prefill_attention_s(bs, 1024, 0, 32, 8, 128, 128, 0.0, 2.0, H200_PEAK, H200_BW, **PRE)
    assert np.all(np.diff(t) > 0)
    t = ka.prefill_attention_s(1, 1024, s, 32, 8, 128, 128, 0.0, 2.0, H200_PEAK, H200_BW, **PRE)
    assert np.all(np.diff(t) > 0)


def _decode_grid():
    g = np.array(np.meshgrid([1, 4, 32, 256, 2048], [1, 64, 1024, 16384, 131072],
                             [0, 1, 2, 3], [1.0, 2.0], indexing="ij")).reshape(4, -1)
    hh = np.array([8, 32, 64, 128])[g[2].astype(int)]
    kv = np.array([8, 8, 1, 128])[g[2].astype(int)]
    return g[0], g[1], hh.astype(float), kv.astype(float), g[3]


def _prefill_grid():
    g = np.array(np.meshgrid([1, 4, 32, 256], [1, 16, 128, 1024, 16384], [1, 8, 64],
                             [64, 128, 256], indexing="ij")).reshape(4, -1).astype(float)
    return g[0], g[1], g[2], g[3]


def test_prefill_per_sequence_head_and_head_dim_terms_by_hand():
    b, s, h, d = 4, 2048, 16, 64
    p = dict(fraction=0.5, half_tokens=0.0, half_rows=0.0, latency_s=0.0, hbm_fraction=1e9)
    base = ka.prefill_attention_s(b, s, 0, h, h, d, d, 0.0, 2.0, H200_PEAK, H200_BW, **p)
    flops = 2 * b * h * 2 * d * (s * (s + 1) / 2)
    assert base == pytest.approx(flops / (H200_PEAK * 0.5), rel=1e-9)
    # head dim 64 with dim_half 32: the FLOP time x (1 + 32/64)
    t = ka.prefill_attention_s(b, s, 0, h, h, d, d, 0.0, 2.0, H200_PEAK, H200_BW,
                               **dict(p, dim_half=32.0))
    assert t == pytest.approx(1.5 * base, rel=1e-9)
    # per sequence and per (sequence, head): b (per_seq + h per_seq_head) added
    t = ka.prefill_attention_s(b, s, 0, h, h, d, d, 0.0, 2.0, H200_PEAK, H200_BW,
                               **dict(p, per_seq_s=1e-6, per_seq_head_s=1e-7))
    assert t - base == pytest.approx(4 * (1e-6 + 16 * 1e-7), rel=1e-9)


def test_every_parameter_matters():
    b, ctx, h, kv, kvb = _decode_grid()
    f = lambda p: ka.gqa_decode_attention_s(b, ctx, h, kv, 128, kvb, 0.0, H200_PEAK, H200_BW, **p)
    # the grid's 64:1 falls back; half_items: few-item calls stream the KV slower
    dec = dict(DEC, group_max_heads=60.0, fallback_fraction=0.01, half_items=4.0,
               split_tokens=2048.0)
    base = f(dec)
    for name in dec:
        assert np.max(np.abs(f(dict(dec, **{name: dec[name] * 1.2})) / base - 1)) > 1e-3, name
    b, s, h, d = _prefill_grid()
    f = lambda p: ka.prefill_attention_s(b, s, 0, h, h, d, d, 0.0, 2.0, H200_PEAK, H200_BW,
                                         **p)
    base = f(PRE)
    for name in PRE:
        assert np.max(np.abs(f(dict(PRE, **{name: PRE[name] * 1.2})) / base - 1)) > 1e-3, name
    # the window pad: a 20% change moves a 128-token-window prefill by > 1e-3
    f = lambda p: ka.prefill_attention_s(b, s, 0, h, h, d, d, 128.0, 2.0, H200_PEAK, H200_BW,
                                         **p)
    pre = dict(PRE, window_pad_tokens=64.0)
    base = f(pre)
    assert np.max(np.abs(f(dict(pre, window_pad_tokens=76.8)) / base - 1)) > 1e-3


def _started_at(params, truth, factor):
    """The parameters with starting values ``factor`` x the truth (alternating up and down)."""
    return tuple(common.Param(p.name, truth[p.name] * (factor if i % 2 else 1 / factor), p.lo,
                              p.hi, p.kind) for i, p in enumerate(params))


def test_fit_recovers_known_parameters():
    pytest.importorskip("scipy")
    from dse.calibration.kernels import attention
    # decode from 1.2x: from 1.4-1.6x the grid has a local minimum (group_min_heads at its
    # bound, hbm_fraction 0.6-0.76) that a CPU's rounding may or may not fall into
    DECODE_PARAMS = _started_at([p for p in attention.DECODE_PARAMS if p.name in DEC], DEC, 1.2)
    PREFILL_PARAMS = _started_at([p for p in attention.PREFILL_PARAMS if p.name in PRE], PRE,
                                 1.4)
    b, ctx, h, kv, kvb = _decode_grid()
    f = lambda p: ka.gqa_decode_attention_s(b, ctx, h, kv, 128, kvb, 0.0, H200_PEAK, H200_BW, **p)
    fit = common.least_squares_fit(f, tuple(p for p in DECODE_PARAMS if p.name in DEC), f(DEC))
    for name, v in DEC.items():
        assert fit.values[name] == pytest.approx(v, rel=0.03), name
    b, s, h, d = _prefill_grid()
    f = lambda p: ka.prefill_attention_s(b, s, 0, h, h, d, d, 0.0, 2.0, H200_PEAK, H200_BW,
                                         **p)
    fit = common.least_squares_fit(f, PREFILL_PARAMS, f(PRE), max_nfev=400)
    for name, v in PRE.items():
        assert fit.values[name] == pytest.approx(v, rel=0.03), name


def test_catalog_has_every_accelerator_and_runtime():
    from dse.calibration.kernels.attention import PARAMS, key
    from dse.catalog import accelerators, kernel_chip
    path = common.CATALOG_DIR / "attention.toml"
    doc = tomllib.loads(path.read_text())
    for chip in accelerators():
        for rt in ("trtllm", "sglang", "vllm"):
            e = doc[kernel_chip(chip)][rt]     # a variant part reads its base
            assert e["fitted_on"], (chip, rt)
            for op, params in PARAMS.items():
                for p in params:
                    v = e[key(op, "bf16", p.name)]
                    assert np.isfinite(v) and p.lo <= v <= p.hi, (chip, rt, op, p.name)


def test_catalog_parameters_predict_a_measured_table():
    pytest.importorskip("aiconfigurator_core")
    import pandas as pd

    from dse.calibration.kernels import attention, data
    from dse.catalog import accelerators
    doc = tomllib.loads((common.CATALOG_DIR / "attention.toml").read_text())
    d = data.load("mla", "generation_mla_perf", chips=["h200-sxm"], runtimes=["trtllm"])
    d = d[d["kv_cache_dtype"].map(data.dtype) == "bf16"].copy()
    d["dtype"] = "bf16"
    e = doc["h200-sxm"]["trtllm"]
    vals = {p.name: e[key] for p, key in
            ((p, attention.key("mla_decode", "bf16", p.name)) for p in attention.MLA_DECODE_PARAMS)}
    pred = attention.predictor("mla_decode", d, accelerators())(vals)
    assert isinstance(d, pd.DataFrame)
    assert common.error_factor(pred, d["latency_s"]) < 1.5


def test_multistart_fit_recovers_from_the_seeded_starts():
    """The seeded starts (default, compute-leaning, memory-leaning) recover the truth from the
    production x0 and bounds, and the best in-sample start is the one kept."""
    pytest.importorskip("scipy")
    from dse.calibration.kernels import attention
    assert len(attention.starts("attn_decode")) == 3
    for params in attention.starts("attn_prefill"):
        assert [p.name for p in params] == [p.name for p in attention.PREFILL_PARAMS]
        assert all(p.lo <= p.x0 <= p.hi for p in params)
    b, ctx, h, kv, kvb = _decode_grid()
    f = lambda p: ka.gqa_decode_attention_s(b, ctx, h, kv, 128, kvb, 0.0, H200_PEAK, H200_BW, **p)
    truth = f(dict(DEC, compute_fraction=0.3, half_items=2.0))   # KV-bound rows: half_items seen
    best = attention.fit_starts("attn_decode", f, truth, max_nfev=200)
    one = [common.least_squares_fit(lambda v: f(dict(v, group_max_heads=g)),
                                    tuple(p for p in ps if p.kind != "threshold"), truth,
                                    max_nfev=200, loss=attention.LOSS, f_scale=attention.F_SCALE)
           for ps in attention.starts("attn_decode") for g in attention.GROUP_MAX_CANDIDATES]
    assert best.score == pytest.approx(min(x.score for x in one))
    assert best.rms_log < 1e-3
    # the truth has no fallback: the grid keeps a threshold above every ratio of the grid (<= 64)
    assert best.values["group_max_heads"] >= 64.0
    assert best.log_cov.shape == (len(attention.DECODE_PARAMS),) * 2


def test_fast_held_out_matches_the_common_rule():
    import pandas as pd

    from dse.calibration.kernels import attention
    rng = np.random.default_rng(0)
    d = pd.DataFrame({"batch_size": rng.integers(1, 512, 500), "isl": rng.integers(1, 9000, 500),
                      "window_size": rng.choice([0.0, 128.0], 500),
                      "kv_cache_dtype": rng.choice(["bfloat16", "fp8"], 500)})
    cols = list(d.columns)
    assert (attention.held_out(d, cols) == common.held_out(d, cols)).all()


def test_missing_runtime_takes_that_runtimes_chips_first():
    from dse.calibration.kernels import attention
    from dse.catalog import accelerators
    accs = accelerators()
    op, params = "mla_decode", attention.MLA_DECODE_PARAMS
    own = {p.name: p.x0 for p in params}
    other = {p.name: min(p.x0 * 3.0, p.hi) for p in params}
    values = {(op, "h100-sxm", "trtllm", "bf16"): own,
              (op, "h200-sxm", "sglang", "bf16"): other, (op, "b200", "sglang", "bf16"): other}
    # h100 has no sglang table, two chips do: their sglang fit, not h100's trtllm one
    v, note = attention._entry_values(op, "h100-sxm", "sglang", "bf16", values, {}, {}, accs,
                                      "x", "t")
    assert "sglang transferred from" in note
    for p in params:
        if p.kind != "compute":       # compute keys carry the MAMF ratio
            assert v[p.name] == pytest.approx(other[p.name], rel=1e-9), p.name
    # no chip has vllm: the chip's own other runtimes
    v, note = attention._entry_values(op, "h100-sxm", "vllm", "bf16", values, {}, {}, accs,
                                      "x", "t")
    assert "geometric mean of h100-sxm's trtllm" in note
    assert v == pytest.approx(own)


def test_decode_reads_queries_and_writes_outputs_by_hand():
    """MLA absorbed decode, 128 heads, 32 sequences at 1,000 tokens, KV-bound: the KV stream
    (32 x 1000 x 576 x 2 B) plus each sequence's query read and output written, 128 heads x
    (576 + 512) elements at 2 B, at 80% of 4.8 TB/s; without qo bytes only the KV."""
    p = dict(DEC, compute_fraction=1e3, per_seq_s=0.0, per_seq_kv_head_s=0.0)
    kv = 32 * 1000 * 576 * 2
    qo = 32 * 128 * 1088 * 2
    t = ka.mla_decode_attention_s(32, 1000, 128, 2.0, H200_PEAK, H200_BW, qo_bytes_per_elem=2.0,
                                  **p)
    assert t == pytest.approx(1e-5 + (kv + qo) / (H200_BW * 0.8), rel=1e-12)
    t0 = ka.mla_decode_attention_s(32, 1000, 128, 2.0, H200_PEAK, H200_BW, **p)
    assert t0 == pytest.approx(1e-5 + kv / (H200_BW * 0.8), rel=1e-12)
