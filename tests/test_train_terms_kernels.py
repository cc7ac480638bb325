"""The training model's kernel terms, hand-worked (issue 25, point 7): each fitted kernel
constant a training GEMM, attention core, expert layer or collective reads, set to a round
number on the small designs of test_train_physics (whose other constants are pure roofline),
changes the time as the serving kernel model's formula says. The formulas are written out here,
not called, so a constant the training model passes to the wrong slot, or drops, fails."""

from __future__ import annotations

import pytest
from test_train_physics import HBM, MOE, PEAK, batch

from dse.perf.train_step import dp_comm_s
from dse.perf.train_time import (
    attention_core_s,
    ep_comm_s,
    linear_s,
    moe_experts_s,
    pp_comm_s,
    tp_comm_s,
)

# ------------------------------------------------------------------------------------ GEMMs

GEMM = {"gemm_fraction": 0.8, "gemm_half_rows": 128.0, "gemm_n_half": 256.0,
        "gemm_k_half": 512.0, "gemm_wave_elements": 2.0 ** 20, "gemm_hbm_fraction": 1e9,
        "gemm_latency_s": 5e-6}


def gemm_by_hand(m, n, k, fraction=0.8 * 0.9):
    """kernel_gemm.gemm_s, compute-bound: latency + 2 ((m + half_rows) n + wave) k over the
    peak times the fraction times the shape factor 1 / (1 + n_half / n + k_half / k)."""
    shape = 1.0 / (1.0 + 256.0 / n + 512.0 / k)
    return 5e-6 + 2.0 * ((m + 128.0) * n + 2.0 ** 20) * k / (PEAK * fraction * shape)


def test_linear_layer_forward_and_both_backward_gemms_by_hand():
    # Y[2048, 1024] = X[2048, 4096] W[4096, 1024]: forward (m, n, k), data gradient (m, k, n),
    # weight gradient (k, n, m); the training fit's compute_fraction_scale 0.9 on the fraction
    b = batch(kernel=GEMM, compute_fraction_scale=0.9)
    fwd, bwd = linear_s(b, 2048.0, 1024.0, 4096.0)
    assert float(fwd) == pytest.approx(gemm_by_hand(2048, 1024, 4096), rel=1e-12)
    assert float(bwd) == pytest.approx(gemm_by_hand(2048, 4096, 1024)
                                       + gemm_by_hand(4096, 1024, 2048), rel=1e-12)
    # e.g. the forward: shape 1 / (1 + 0.25 + 0.125) = 0.7273; 2 (2176 x 1024 + 2^20) x 4096
    # = 2.6844e10 FLOPs at 0.72 x 0.7273 PFLOP/s = 51.26 us, + 5 us
    assert float(fwd) == pytest.approx(56.26e-6, rel=1e-3)


def test_a_thin_gemm_streams_its_weights_at_the_fitted_hbm_fraction():
    # 16 rows through a 4096 x 4096 bf16 weight: 2^24 x 2 bytes of weights + 2 (16 x 4096 x 2)
    # of activations at 2 TB/s x 0.5 = 33.82 us, more than the 8 us of compute
    b = batch(kernel={**GEMM, "gemm_hbm_fraction": 0.5})
    fwd, _ = linear_s(b, 16.0, 4096.0, 4096.0)
    nbytes = 4096 * 4096 * 2 + (16 * 4096 + 16 * 4096) * 2
    assert float(fwd) == pytest.approx(5e-6 + nbytes / (HBM * 0.5), rel=1e-12)
    assert float(fwd) > gemm_by_hand(16, 4096, 4096, fraction=0.8)


# --------------------------------------------------------------------------- attention core

ATTN = {"attn_prefill_fraction": 0.5, "attn_prefill_half_tokens": 64.0,
        "attn_prefill_half_rows": 4096.0, "attn_prefill_latency_s": 10e-6,
        "attn_prefill_hbm_fraction": 1e9, "attn_prefill_dim_half": 16.0,
        "attn_prefill_per_seq_s": 3e-6, "attn_prefill_per_seq_head_s": 1e-6}


def test_attention_core_by_hand():
    """kernel_attention.prefill_attention_s over the whole causal sequence (2 sequences of
    2048, 16 heads of 64 split tp = 2 ways), split cp = 2 ways."""
    b = batch(micro_batch_seqs=2, tp=2, cp=2, kernel=ATTN, compute_fraction_scale=0.8)
    B, s, heads, d = 2, 2048, 8, 64
    pairs = s * (s + 1) / 2                                   # causal, the diagonal included
    flops = 2 * B * heads * (d + d) * pairs
    slow = (1 + 64 * s / pairs) * (1 + 4096 / (B * heads * s)) * (1 + 16 / d)
    t = 10e-6 + B * (3e-6 + heads * 1e-6) + flops / (PEAK * 0.5 * 0.8) * slow
    assert float(attention_core_s(b)) == pytest.approx(t / 2, rel=1e-12)
    # 8.594e9 FLOPs at 0.4 PFLOP/s = 21.49 us, x 1.0625 x 1.125 x 1.25 = 32.10 us; + 10 us +
    # 2 x (3 + 8 x 1) us = 64.10 us, / 2
    assert float(attention_core_s(b)) == pytest.approx(32.05e-6, rel=1e-3)


def test_mla_attention_core_by_hand():
    """MLA: every query head has its own K and V (no grouping), of the nope + rope width for
    the scores and v_head_dim for the values: 16 heads x (128 + 64 + 128) per pair."""
    mla = {**MOE, "heads": 16, "kv_heads": 16, "head_dim": 192, "q_lora_rank": 512,
           "kv_lora_rank": 256, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
           "v_head_dim": 128}
    b = batch(mla)
    pairs = 2048 * 2049 / 2
    assert float(attention_core_s(b)) * PEAK == pytest.approx(2 * 16 * (192 + 128) * pairs,
                                                              rel=1e-12)
    # memory-bound: Q and K at 192, V and O at 128, for 16 heads each (bf16)
    slow = b.replace(kernel={**b.kernel, "attn_prefill_hbm_fraction": 1e-4})
    nbytes = 2 * 2048 * (16 * 320 + 16 * 320)
    assert float(attention_core_s(slow)) == pytest.approx(nbytes / (HBM * 1e-4), rel=1e-12)


def test_attention_core_memory_bound_at_a_low_hbm_fraction():
    # Q, K, V, O of 2 x 2048 tokens x 8 heads x (64 + 64) bf16 at 2 TB/s x 1e-4
    b = batch(micro_batch_seqs=2, tp=2, kernel={**ATTN, "attn_prefill_hbm_fraction": 1e-4})
    nbytes = 2 * 2 * (2048 * 8 * 128 + 2048 * 8 * 128)
    t = 10e-6 + 2 * (3e-6 + 8 * 1e-6) + nbytes / (HBM * 1e-4)
    assert float(attention_core_s(b)) == pytest.approx(t, rel=1e-12)


# --------------------------------------------------------------------------- routed experts

EXPERTS = {"moe_fraction": 0.9, "moe_half_rows": 64.0, "moe_width_half": 128.0,
           "moe_hidden_half": 256.0, "moe_wave_elements": 1e5, "moe_remote_fraction": 0.1,
           "moe_token_bytes": 6.0, "moe_batch_bytes": 4.0, "moe_route_bytes": 2.0,
           "moe_latency_s": 20e-6, "moe_hbm_fraction": 1e9, "moe_nongated_slowdown": 1.5}


def test_routed_experts_by_hand():
    """kernel_gemm.grouped_gemm_s on the rows the all-to-all dispatcher hands the chip:
    2048 tokens x top-2 = 4096 rows (ep 4: each rank's share of the group's 8192 x 2 routed
    entries); its 2 local experts are both touched. The serving runtimes' whole-batch terms
    (remote_fraction, batch_bytes, route_bytes) and the token term are not paid: no rank scans
    another rank's tokens (Megatron-Core's MoEAlltoAllTokenDispatcher)."""
    b = batch(MOE, dp=4, ep=4, global_batch_seqs=8, kernel=EXPERTS, compute_fraction_scale=0.8)
    rows, touched, h, w = 4096, 2, 1024, 512
    shape = 1 / (1 + 128 / w + 256 / h)                          # 1 / 1.5
    compute = 2 * 3 * ((rows + 64 * touched) * w + 1e5) * h / (PEAK * 0.9 * 0.8 * shape)
    assert float(moe_experts_s(b)) == pytest.approx(20e-6 + compute, rel=1e-9)
    # 2 x 3 x ((4096 + 128) x 512 + 1e5) x 1024 x 1.5 / (0.9 x 0.8) = 28.96 us of GEMMs + 20 us
    assert float(moe_experts_s(b)) == pytest.approx(48.96e-6, rel=1e-3)
    # sequence parallelism: each tp rank dispatches its 1/tp of the tokens
    sp = b.replace(tp=2, sequence_parallel=1)
    half = 2 * 3 * ((2048 + 64 * 2) * w + 1e5) * h / (PEAK * 0.9 * 0.8 * shape)
    assert float(moe_experts_s(sp)) == pytest.approx(20e-6 + half, rel=1e-9)
    # a routing skew: the busiest rank's rows, 1 + z(4) x 0.3 x sqrt(4 / 8) = 1.2226 x the mean
    skew = b.replace(expert_load_cv=0.3)
    busy = 2 * 3 * ((rows * 1.2226 + 64 * touched) * w + 1e5) * h / (PEAK * 0.9 * 0.8 * shape)
    assert float(moe_experts_s(skew)) == pytest.approx(20e-6 + busy, rel=1e-4)


def test_routed_experts_weight_bound_and_non_gated():
    """At a low HBM fraction the layer streams its touched experts' weights (2 experts x 3
    matrices x 1024 x 512 bf16); a non-gated MLP (2 matrices) runs nongated_slowdown slower."""
    slow = {**EXPERTS, "moe_hbm_fraction": 1e-3}
    b = batch(MOE, dp=4, ep=4, global_batch_seqs=8, kernel=slow)
    weights = 2 * 3 * 1024 * 512 * 2
    assert float(moe_experts_s(b)) == pytest.approx(20e-6 + weights / (HBM * 1e-3), rel=1e-9)
    two = b.replace(mlp_mats=2)
    assert float(moe_experts_s(two)) == pytest.approx(
        20e-6 + 1.5 * 2 * 1024 * 512 * 2 * 2 / (HBM * 1e-3), rel=1e-9)


DSV3_MOE = {"hidden_size": 7168, "num_layers": 8, "moe_layers": 8, "heads": 128, "kv_heads": 128,
            "head_dim": 128, "ffn": 0, "mlp_mats": 3, "vocab": 32000, "experts": 256,
            "topk": 8, "expert_ffn": 2048, "shared_ffn": 0}


def test_routed_experts_per_rank_independent_of_ep():
    """DeepSeek-V3's experts (256 of width 2048, top-8, h 7168), 4096 tokens a chip (one
    sequence of 4096), the same global tokens at ep 8 and ep 64: each rank receives 4096 x 8 =
    32768 rows whatever ep (the dispatcher sends it only the rows of its local experts), so
    with no per-expert padding the expert GEMMs take the same time:
    2 x 3 x 32768 x 2048 x 7168 / (1e15 x 0.9 x shape) with shape 1 / (1 + 128 / 2048 +
    256 / 7168). With a tile of 64 rows padded per touched expert, ep 64's 4 local experts
    pad less than ep 8's 32; nothing grows with ep (the serving terms that scanned every EP
    rank's tokens made ep 64 1.6x slower)."""
    flat = {**EXPERTS, "moe_half_rows": 0.0, "moe_wave_elements": 0.0, "moe_latency_s": 0.0}
    ep8 = batch(DSV3_MOE, seq_len=4096, dp=64, ep=8, global_batch_seqs=64, kernel=flat)
    ep64 = ep8.replace(ep=64)
    shape = 1 / (1 + 128 / 2048 + 256 / 7168)
    t = 2 * 3 * 32768 * 2048 * 7168 / (PEAK * 0.9 * shape)
    assert float(moe_experts_s(ep8)) == pytest.approx(t, rel=1e-9)
    assert float(moe_experts_s(ep64)) == pytest.approx(t, rel=1e-9)
    assert t == pytest.approx(3.522e-3, rel=1e-3)
    # with padding: 64 rows x every local expert (all touched at 32768 x ep rows)
    pad = {**flat, "moe_half_rows": 64.0}
    e8 = float(moe_experts_s(ep8.replace(kernel={**ep8.kernel, **pad})))
    e64 = float(moe_experts_s(ep64.replace(kernel={**ep64.kernel, **pad})))
    per_expert = 2 * 3 * 64 * 2048 * 7168 / (PEAK * 0.9 * shape)
    assert e8 == pytest.approx(t + 32 * per_expert, rel=1e-6)
    assert e64 == pytest.approx(t + 4 * per_expert, rel=1e-6)


# ------------------------------------------------------------------------------ collectives

NCCL = {"ar_nccl_latency_s": 8e-6, "ar_nccl_latency_per_log2_s": 2e-6,
        "ar_nccl_bulk_latency_s": 30e-6, "ar_nccl_ll_fraction": 0.25, "ar_nccl_fraction": 0.9,
        "ar_nccl_fraction_per_doubling": 1.0, "a2a_scaleout_latency_s": 10e-6,
        "a2a_scaleout_fraction": 0.8}


def ring_by_hand(msg, g, bw=400e9):
    """NCCL ring all-reduce inside one domain: the faster of the LL branch (latency + per-log2
    latency, ll_fraction of the bandwidth) and the Simple one (bulk latency, fraction)."""
    base = 2 * (g - 1) / g / bw
    lg = {2: 1, 4: 2, 8: 3}[g]
    return min(8e-6 + 2e-6 * lg + base / 0.25 * msg, 30e-6 + 2e-6 * lg + base / 0.9 * msg)


def test_tensor_parallel_all_reduce_latency_and_protocols_by_hand():
    # two all-reduces of the layer's activations forward; tp = 4 inside the domain of 8.
    # 64 tokens (128 kB): LL wins, 12 us + 1.97 us; 8192 tokens (16.8 MB): Simple, 34 us + 70 us
    small = batch(tp=4, seq_len=64, kernel=NCCL)
    msg = 64 * 1024 * 2
    assert float(tp_comm_s(small)) == pytest.approx(2 * ring_by_hand(msg, 4), rel=1e-12)
    assert ring_by_hand(msg, 4) == pytest.approx(12e-6 + 1.5 / 400e9 / 0.25 * msg)
    large = batch(tp=4, seq_len=8192, kernel=NCCL)
    msg = 8192 * 1024 * 2
    assert float(tp_comm_s(large)) == pytest.approx(2 * ring_by_hand(msg, 4), rel=1e-12)
    assert ring_by_hand(msg, 4) == pytest.approx(34e-6 + 1.5 / 400e9 / 0.9 * msg)


def test_tensor_parallel_over_the_whole_domain_stays_on_its_links():
    # tp = 8 fills the domain of 8: a ring of 8 on the scale-up links, no scale-out latency
    b = batch(tp=8, kernel=NCCL)
    msg = 2048 * 1024 * 2
    assert float(tp_comm_s(b)) == pytest.approx(2 * ring_by_hand(msg, 8), rel=1e-12)


def test_strided_data_parallel_group_spans_domains():
    """tp = 2, dp = 8: the data-parallel group's ranks are 2 chips apart, so 4 of them share a
    domain of 8 and the group spans 2 domains: a ring of 4 inside, log2 8 - log2 4 = 1 scale-out
    latency twice, and 2 (2 - 1) / 2 / 4 of the buffer per byte on the NICs."""
    n = 1e9
    step, _ = dp_comm_s(batch(tp=2, dp=8, zero_stage=1, kernel=NCCL), n)
    base = 2 * 3 / 4 / 400e9
    across = 2 * 1 / 2 / 4 / (50e9 * 0.8)
    expect = 30e-6 + 2 * 2e-6 + 2 * 10e-6 + (base / 0.9 + across) * 2 * n
    assert float(step) == pytest.approx(expect, rel=1e-12)


def test_data_parallel_all_reduce_across_two_domains_by_hand():
    """dp = 16 over two domains of 8: every branch adds 2 (log2 16 - log2 8) scale-out
    latencies and the inter-domain all-reduce of the 1/8 of the buffer each chip holds,
    2 (2 - 1) / 2 / 8 of it per byte at 50 GB/s x 0.8."""
    n = 1e9                                               # parameters: 2 GB of bf16 gradients
    step, _ = dp_comm_s(batch(dp=16, zero_stage=1, kernel=NCCL), n)
    added = 2 * (4 - 3) * 10e-6
    across = 2 * 1 / 2 / 8 / (50e9 * 0.8)
    base = 2 * 7 / 8 / 400e9
    expect = min(8e-6 + 3 * 2e-6 + added + (base / 0.25 + across) * 2 * n,
                 30e-6 + 3 * 2e-6 + added + (base / 0.9 + across) * 2 * n)
    assert float(step) == pytest.approx(expect, rel=1e-12)


def test_pipeline_send_pays_the_p2p_latency():
    # activations out and gradients back, once per virtual stage: 2 x 3 x (4 MB / (400 GB/s x
    # 0.9) + 8 us)
    b = batch(pp=4, vp=3, schedule=1, global_batch_seqs=8, kernel=NCCL)
    msg = 2048 * 1024 * 2
    assert float(pp_comm_s(b)) == pytest.approx(2 * 3 * (msg / (400e9 * 0.9) + 8e-6),
                                                 rel=1e-12)


def test_pipeline_send_spans_tp_cp_dp_and_pp_chips():
    """The pipeline's neighbours are tp x cp x dp chips apart: tp = cp = 2 with pp = 4 spans
    16 chips, so its sends ride the NIC; sequence parallelism sends each rank's 1/tp of the
    activations."""
    b = batch(tp=2, cp=2, pp=4, global_batch_seqs=4, kernel=NCCL)
    msg = 1024 * 1024 * 2                                 # 1024 tokens a chip (cp 2)
    assert float(pp_comm_s(b)) == pytest.approx(2 * (msg / (50e9 * 0.9) + 8e-6), rel=1e-12)
    sp = b.replace(sequence_parallel=1)
    assert float(pp_comm_s(sp)) == pytest.approx(2 * (msg / 2 / (50e9 * 0.9) + 8e-6),
                                                 rel=1e-12)


def test_expert_all_to_all_latencies_inside_and_across_the_domain():
    """Dispatch and combine each pay their fitted latency, and the scale-out one when the
    group leaves the domain (every token to every rank: experts = top-k = 16)."""
    k = {"a2a_normal_dispatch_latency_s": 20e-6, "a2a_normal_combine_latency_s": 15e-6,
         "a2a_scaleout_latency_s": 10e-6}
    b = batch({**MOE, "experts": 16, "topk": 16}, ep=8, dp=8, global_batch_seqs=8, kernel=k)
    row = 2048 * 1024 * 2
    assert float(ep_comm_s(b)) == pytest.approx(20e-6 + 15e-6 + 2 * 7 * row / 400e9,
                                                rel=1e-12)
    wide = b.replace(ep=16, dp=16, global_batch_seqs=16)
    assert float(ep_comm_s(wide)) == pytest.approx(
        20e-6 + 15e-6 + 2 * 10e-6 + 2 * max(7 * row / 400e9, row / 50e9), rel=1e-12)
