"""The training model's physics, hand-worked (dse/perf/train_*): Megatron's FLOP count, the
pipeline bubbles, Korthikanti et al.'s activation memory, model state per ZeRO stage, and the
step time of a small dense and a small MoE design at pure roofline (every kernel constant set
so a GEMM runs at the peak and an elementwise op at the HBM bandwidth)."""

from __future__ import annotations

import numpy as np
import pytest

from dse.perf.train_batch import TrainBatch
from dse.perf.train_flops import megatron_flops, recompute_flops
from dse.perf.train_memory import layer_activation_bytes, memory_bytes, state_bytes
from dse.perf.train_step import score_train
from dse.perf.train_time import elementwise_s, layer_gemms_s, loss_s

PEAK = 1e15
HBM = 2e12
ROOFLINE = {"gemm_fraction": 1.0, "gemm_half_rows": 0.0, "gemm_n_half": 0.0, "gemm_k_half": 0.0,
            "gemm_wave_elements": 0.0, "gemm_hbm_fraction": 1e9, "gemm_latency_s": 0.0,
            "attn_prefill_fraction": 1.0, "attn_prefill_half_tokens": 0.0,
            "attn_prefill_half_rows": 0.0, "attn_prefill_latency_s": 0.0,
            "attn_prefill_hbm_fraction": 1e9, "attn_prefill_dim_half": 0.0,
            "attn_prefill_per_seq_s": 0.0, "attn_prefill_per_seq_head_s": 0.0,
            "ar_nccl_latency_s": 0.0, "ar_nccl_latency_per_log2_s": 0.0,
            "ar_nccl_ll_fraction": 1.0, "ar_nccl_bulk_latency_s": 0.0, "ar_nccl_fraction": 1.0,
            "ar_nccl_fraction_per_doubling": 1.0, "a2a_normal_dispatch_latency_s": 0.0,
            "a2a_normal_dispatch_fraction": 1.0, "a2a_normal_combine_latency_s": 0.0,
            "a2a_normal_combine_fraction": 1.0, "a2a_scaleout_latency_s": 0.0,
            "a2a_scaleout_fraction": 1.0, "moe_fraction": 1.0, "moe_half_rows": 0.0,
            "moe_width_half": 0.0, "moe_hbm_fraction": 1e9, "moe_token_bytes": 0.0,
            "moe_latency_s": 0.0, "moe_hidden_half": 0.0, "moe_batch_bytes": 0.0,
            "moe_route_bytes": 0.0, "moe_nongated_slowdown": 1.0, "moe_wave_elements": 0.0,
            "moe_remote_fraction": 0.0}

# a small GPT-like dense model (MHA, GELU MLP 4h, untied) and a small MoE (GQA, SwiGLU experts)
DENSE = {"hidden_size": 1024, "num_layers": 8, "moe_layers": 0, "heads": 16, "kv_heads": 16, "head_dim": 64,
             "ffn": 4096, "mlp_mats": 2, "vocab": 32000, "experts": 0, "topk": 0, "expert_ffn": 0, "shared_ffn": 0}
MOE = {"hidden_size": 1024, "num_layers": 8, "moe_layers": 8, "heads": 16, "kv_heads": 4, "head_dim": 64,
           "ffn": 0, "mlp_mats": 3, "vocab": 32000, "experts": 8, "topk": 2, "expert_ffn": 512, "shared_ffn": 0}


def batch(model=DENSE, **over) -> TrainBatch:
    f = {"q_lora_rank": 0, "kv_lora_rank": 0, "qk_nope_head_dim": 0, "qk_rope_head_dim": 0,
             "v_head_dim": 0, "mtp_layers": 0, "tied": 0, "peak_flops_per_s": PEAK, "precision_native": 1,
             "peak_bf16_flops_per_s": PEAK, "hbm_bw_bytes_per_s": HBM, "hbm_capacity_bytes": 80e9,
             "scaleup_bw_bytes_per_s": 400e9, "scaleout_bw_bytes_per_s": 50e9, "domain_chips": 8,
             "hbm_fraction": 1.0, "usd_per_hour": 2.0, "all_in_power_w": 1500.0, "tp": 1, "pp": 1, "dp": 1, "ep": 1, "cp": 1, "vp": 1, "micro_batch_seqs": 1,
             "zero_stage": 0, "recompute": 0, "recompute_layer_fraction": 1.0, "schedule": 0, "sequence_parallel": 0, "global_batch_seqs": 8,
             "seq_len": 2048, "precision": 0, "compute_fraction_scale": 1.0, "overlap_fraction": 1.0,
             "layer_overhead_s": 0.0, "reserve_bytes": 0.0, "fragmentation_fraction": 0.0,
             "attention_bwd_ratio": 2.0}
    f.update(model)
    kernel = dict(ROOFLINE)
    kernel.update(over.pop("kernel", {}))
    f.update(over)
    return TrainBatch.of(kernel=kernel, **f)


# ------------------------------------------------------------------------------------ FLOPs

def test_megatron_flops_llama_8b_by_hand():
    # Llama-3.1-8B, one sequence of 8192 tokens (the train_flops docstring's arithmetic)
    b = batch({"hidden_size": 4096, "num_layers": 32, "moe_layers": 0, "heads": 32, "kv_heads": 8,
                   "head_dim": 128, "ffn": 14336, "mlp_mats": 3, "vocab": 128256, "experts": 0, "topk": 0,
                   "expert_ffn": 0, "shared_ffn": 0}, global_batch_seqs=1, seq_len=8192)
    h, s, q, kv = 4096, 8192, 4096, 1024
    a = h * (q + 2 * kv) + q * s + q * h
    per_token = h * 3 * 14336 * 32 + 32 * a + h * 128256
    assert megatron_flops(b) == pytest.approx(6 * s * per_token, rel=1e-12)
    assert megatron_flops(b) == pytest.approx(4.216e14, rel=1e-3)
    # the published Megatron-Bridge figure: 14451 tokens/s/GPU is 744 model TFLOP/s/GPU
    assert megatron_flops(b) / s * 14451 / 1e12 == pytest.approx(744, rel=2e-3)


def test_megatron_flops_moe_counts_topk_and_shared_experts():
    b = batch(MOE, shared_ffn=256)
    h, s, B = 1024, 2048, 8
    a = h * (1024 + 2 * 256) + 1024 * s + 1024 * h
    per_token = h * (3 * 512 * 2 + 3 * 256) * 8 + 8 * a + h * 32000
    assert megatron_flops(b) == pytest.approx(6 * B * s * per_token, rel=1e-12)


def test_recompute_flops_full_and_selective():
    b = batch()
    f, logits = megatron_flops(b), 6 * 8 * 2048 * 1024 * 32000
    assert recompute_flops(b.replace(recompute=2)) == pytest.approx((f - logits) / 3)
    assert recompute_flops(b.replace(recompute=1)) == pytest.approx(
        8 * 2 * 2 * 8 * 2048 * 1024 * 2048 / 2)
    assert recompute_flops(b) == 0


# ---------------------------------------------------------------------------------- bubbles

@pytest.mark.parametrize("schedule,v,expect", [
    (0, 1, lambda p, m, v: (p - 1) / (m + p - 1)),             # 1F1B
    (1, 3, lambda p, m, v: (p - 1) / (v * m + p - 1)),         # interleaved
    (2, 1, lambda p, m, v: (p - 1) / 3 / (m + (p - 1) / 3)),   # zero bubble (ZB-H1)
    (3, 1, lambda p, m, v: (p / 2 - 1) * 2 / 3 / (m + (p / 2 - 1) * 2 / 3)),   # DualPipe
])
def test_pipeline_bubble_fraction(schedule, v, expect):
    p, m = 4, 16
    s = score_train(batch(pp=p, vp=v, schedule=schedule, global_batch_seqs=m))
    busy = s["step_time_s"] - s["optimizer_s"]
    assert s["bubble_s"] / busy == pytest.approx(expect(p, m, v), rel=1e-9)


# ------------------------------------------------------------------- activations (Korthikanti)

@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_activation_memory(t):
    """Equations (1)-(4) of Korthikanti et al. 2022 for the GPT block (MHA, f = 4h): bytes
    per layer of one micro-batch, 2022 attention kernels (the score matrix stored)."""
    b = batch(tp=t, micro_batch_seqs=2)
    s, bb, h, a = 2048, 2, 1024, 16
    sbh = s * bb * h
    act = lambda **kw: float(layer_activation_bytes(b.replace(**kw), flash=0.0))
    assert act() == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))        # eq. 2
    assert act(sequence_parallel=1) == pytest.approx(sbh * (34 / t + 5 * a * s / (h * t)))
    assert act(sequence_parallel=1, recompute=1) == pytest.approx(sbh * 34 / t)     # eq. 6
    assert act(sequence_parallel=0, recompute=1) == pytest.approx(sbh * (10 + 24 / t))
    assert act(sequence_parallel=1, recompute=2) == pytest.approx(2 * sbh / t)
    assert act(sequence_parallel=0, recompute=2) == pytest.approx(2 * sbh)
    # flash attention keeps no score matrix
    assert float(layer_activation_bytes(b)) == pytest.approx(sbh * (10 + 24 / t))


def test_first_stage_holds_p_micro_batches_interleaving_more():
    b = batch(pp=4, global_batch_seqs=16, sequence_parallel=1, vocab=1000)
    one = float(layer_activation_bytes(b)) * 8 / 4
    m1 = memory_bytes(b)["activations_bytes"]
    m2 = memory_bytes(b.replace(schedule=1, vp=2))["activations_bytes"]
    assert m1 == pytest.approx(4 * one)
    assert m2 == pytest.approx(4 * one * (1 + 3 / (4 * 2)))


# -------------------------------------------------------------------------------- ZeRO state

def test_model_state_per_zero_stage():
    d = 8
    b = batch(dp=d)
    n = float(state_bytes(b)["params_per_chip"])
    h, L, f, V = 1024, 8, 4096, 32000
    assert n == pytest.approx(L * (4 * h * h + 2 * h + 2 * h * f) + 2 * V * h)
    per = {z: state_bytes(b.replace(zero_stage=z)) for z in range(4)}
    assert per[0]["weights_bytes"] == pytest.approx(2 * n)
    assert per[0]["grads_bytes"] == pytest.approx(2 * n)
    assert per[0]["optimizer_bytes"] == pytest.approx(12 * n)
    assert per[1]["optimizer_bytes"] == pytest.approx(12 * n / d)
    assert per[1]["grads_bytes"] == pytest.approx(2 * n)
    assert per[2]["grads_bytes"] == pytest.approx(2 * n / d)
    assert per[2]["weights_bytes"] == pytest.approx(2 * n)
    gathered = 2 * n / L                           # two layers' weights in flight
    assert per[3]["weights_bytes"] == pytest.approx(2 * n / d + 2 * gathered)
    # fp8 GEMMs add a one-byte copy of each weight
    assert state_bytes(b.replace(precision=2))["weights_bytes"] == pytest.approx(3 * n)


def test_experts_shard_over_ep_and_their_data_parallel_group():
    b = batch(MOE, dp=8, ep=4, zero_stage=1)
    h, L, E, fe = 1024, 8, 8, 512
    expert = E * 3 * h * fe * L
    dense = L * (h * (1024 + 512) + 1024 * h + 2 * h + h * E) + 2 * 32000 * h
    st = state_bytes(b)
    assert st["params_per_chip"] == pytest.approx(dense + expert / 4)
    assert st["optimizer_bytes"] == pytest.approx(12 * (dense / 8 + expert / 4 / 2))


# -------------------------------------------------------------------- step time at roofline

def test_dense_step_at_roofline_is_flops_over_peak():
    """At pure roofline the GEMMs and attention of a step take F / peak (attention backward
    2 forwards, no recompute); causal pairs count the diagonal: s (s + 1) / 2."""
    b = batch(dp=2, global_batch_seqs=8, tp=1)
    s = score_train(b)
    seq, q, L = 2048, 1024, 8
    diag = 8 / 2 * 3 * L * 2 * 2 * q * seq / 2                  # the diagonal's extra pairs
    assert s["compute_s"] * PEAK == pytest.approx(megatron_flops(b) / 2 + diag, rel=1e-9)


def test_moe_step_at_roofline_is_flops_over_peak():
    """Routed experts: the chip's experts on its routed rows (top-k of its tokens), plus the
    router GEMM Megatron's count leaves out."""
    b = batch(MOE, dp=4, ep=4, global_batch_seqs=8)
    s = score_train(b)
    seq, q, L, E, h = 2048, 1024, 8, 8, 1024
    tokens = 8 / 4 * seq
    diag = 8 / 4 * 3 * L * 2 * 2 * q * seq / 2
    router = 3 * 2 * tokens * E * h * L
    assert s["compute_s"] * PEAK == pytest.approx(megatron_flops(b) / 4 + diag + router,
                                                  rel=1e-9)


def test_elementwise_traffic_by_hand():
    b = batch(MOE)
    h, q, kv, fe, k = 1024, 1024, 256, 512, 2
    per_token = 20 * h + 4 * (q + kv) + 2 * 3 * fe * k
    assert float(elementwise_s(b)) == pytest.approx(2048 * per_token / HBM)
    # fp8 adds the transposed one-byte copy of every GEMM input: the QKV projection's h, the
    # output projection's q, the routed experts' top-2 rows of h and their second GEMM's
    # 2 x 512
    fp8 = float(elementwise_s(b.replace(precision=2)))
    assert fp8 == pytest.approx(2048 * (per_token + h + k * h + q + fe * k) / HBM)
    # a shared expert adds its own input's h
    sh = float(elementwise_s(b.replace(precision=2, shared_ffn=256)))
    assert sh == pytest.approx(2048 * (per_token + 2 * 3 * 256 + h + k * h + h + q + fe * k
                                       + 256) / HBM)


def test_step_composition_by_hand():
    """Step = micro-batches x (compute + 3 x elementwise + the loss) + optimizer (30 bytes a
    parameter) when nothing communicates (one chip)."""
    b = batch(global_batch_seqs=4)
    s = score_train(b)
    n = float(state_bytes(b)["params_per_chip"])
    elem = 8 * 3 * float(elementwise_s(b)) + float(loss_s(b))
    assert s["optimizer_s"] == pytest.approx(30 * n / HBM)
    assert s["step_time_s"] == pytest.approx(s["compute_s"] + 4 * elem + 30 * n / HBM)
    assert s["network_exposed_s"] == 0 and s["bubble_s"] == 0
    g = layer_gemms_s(b)
    assert g["attn"][1] == pytest.approx(2 * g["attn"][0])     # dgrad + wgrad = 2 forwards


def test_tensor_parallel_all_reduces_sized_and_hidden_by_overlap():
    """Two all-reduces of the layer's activations per layer forward, two backward (ring:
    2 (t - 1) / t of the message), at the scale-up bandwidth; exposed whole without overlap,
    only what exceeds the layer's GEMM time with full overlap."""
    b = batch(tp=4, global_batch_seqs=1, overlap_fraction=0.0)
    msg = 2048 * 1024 * 2
    ring = 2 * 3 / 4 * msg / 400e9
    assert score_train(b)["network_exposed_s"] == pytest.approx(8 * 4 * ring, rel=1e-9)
    g = layer_gemms_s(b.replace(overlap_fraction=1.0))
    window = g["attn"][0] + g["attn"][1] + g["dense_mlp"][0] + g["dense_mlp"][1]
    hidden = score_train(b.replace(overlap_fraction=1.0))["network_exposed_s"]
    assert hidden == pytest.approx(8 * max(4 * ring - window, 0.0), abs=1e-15)


def test_data_parallel_reduction_hides_under_backward():
    b = batch(dp=8, overlap_fraction=0.0)
    exposed = score_train(b)["network_exposed_s"]
    assert exposed > 0
    assert score_train(b.replace(overlap_fraction=1.0))["network_exposed_s"] < exposed


def test_memory_infeasible_and_precision_flags():
    s = score_train(batch(hbm_capacity_bytes=1e9))
    assert not s["feasible"][()] if np.ndim(s["feasible"]) == 0 else not s["feasible"][0]
    s = score_train(batch(precision_native=0))
    assert int(np.ravel(s["reason"])[0]) == 2
    assert np.isnan(s["mfu"]) and np.isfinite(s["step_time_s"])


def test_full_recompute_on_a_share_of_the_layers_interpolates():
    """Megatron's block method: ``recompute_layer_fraction`` of the layers keep only their
    input and rerun their forward; the rest keep everything."""
    b = batch(recompute=2, recompute_layer_fraction=0.5, sequence_parallel=1)
    none, full = b.replace(recompute=0), b.replace(recompute_layer_fraction=1.0)
    assert float(layer_activation_bytes(b)) == pytest.approx(
        0.5 * float(layer_activation_bytes(none)) + 0.5 * float(layer_activation_bytes(full)))
    t = {k: score_train(x)["compute_s"] for k, x in (("h", b), ("0", none), ("1", full))}
    assert t["h"] == pytest.approx(0.5 * (t["0"] + t["1"]))
    assert recompute_flops(b) == pytest.approx(0.5 * recompute_flops(full))


def test_cost_and_energy_per_token():
    s = score_train(batch(dp=8))
    tps = s["tokens_per_s_per_chip"]
    assert s["chip_hours_per_trillion_tokens"] == pytest.approx(1e12 / tps / 3600)
    assert s["usd_per_trillion_tokens"] == pytest.approx(2.0 * 1e12 / tps / 3600)
    assert s["energy_j_per_token"] == pytest.approx(1500.0 / tps)


def test_mtp_modules_add_a_layer_and_a_logits_layer_each():
    b = batch(global_batch_seqs=1)
    g = layer_gemms_s(b)
    base = score_train(b)["compute_s"]
    one = score_train(b.replace(mtp_layers=1))["compute_s"]
    from dse.perf.train_time import attention_core_s
    layer = g["attn"][0] + g["attn"][1] + g["dense_mlp"][0] + g["dense_mlp"][1] \
        + 3 * attention_core_s(b)
    assert one - base == pytest.approx(layer + g["logits"][0] + g["logits"][1])


def test_mla_projections_at_roofline_match_the_mla_flop_count():
    """DeepSeek-style MLA: the projections' FLOPs at roofline are the weight part of the
    contract's A (MLA), i.e. everything but the score terms (and the +1 norm columns)."""
    mla = {**MOE, "heads": 16, "kv_heads": 16, "head_dim": 192, "q_lora_rank": 512,
           "kv_lora_rank": 256, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
           "v_head_dim": 128}
    b = batch(mla, global_batch_seqs=1)
    g = layer_gemms_s(b)
    h, nh, rq, rkv = 1024, 16, 512, 256
    flops = 2 * 2048 * (rq * (h + nh * 192) + rkv * (h + nh * 256) + h * 64 + nh * 128 * h)
    assert g["attn"][0] * PEAK == pytest.approx(flops)
    assert g["attn"][1] == pytest.approx(2 * g["attn"][0])


def test_ring_attention_hops_inside_and_across_the_domain():
    """cp - 1 hops of the chip's K and V chunk; NVLink while tp x cp fits in the domain, the
    NIC beyond it; pipeline sends likewise by the chips the pipeline spans."""
    from dse.perf.train_time import cp_comm_s, pp_comm_s
    b = batch(cp=4, tp=2, global_batch_seqs=1)
    chunk = 2048 / 4 * 2 * 16 * 64 / 2 * 2                    # tokens x 2 kv x bf16, tp 2
    assert float(cp_comm_s(b)) == pytest.approx(3 * chunk / 400e9)
    assert float(cp_comm_s(b.replace(tp=4))) == pytest.approx(3 * 2 * chunk / 4 / 50e9)
    p = b.replace(cp=1, tp=1, pp=4, dp=2)                     # spans 8 chips: inside
    msg = 2048 * 1024 * 2
    assert float(pp_comm_s(p)) == pytest.approx(2 * msg / 400e9)
    assert float(pp_comm_s(p.replace(dp=4))) == pytest.approx(2 * msg / 50e9)


def test_expert_all_to_all_inside_and_across_the_domain():
    """Dispatch + combine of the chip's tokens (bf16), every token to every rank when top-k =
    experts: inside one domain of 8, 7 copies at the scale-up bandwidth; over two domains the
    copy to the other domain (deduplicated per node) rides the NIC, which sets the pace."""
    from dse.perf.train_time import ep_comm_s
    b = batch({**MOE, "experts": 16, "topk": 16}, ep=8, dp=8, global_batch_seqs=8)
    row = 2048 * 1024 * 2
    assert float(ep_comm_s(b)) == pytest.approx(2 * 7 * row / 400e9)
    wide = b.replace(ep=16, dp=16, global_batch_seqs=16)
    assert float(ep_comm_s(wide)) == pytest.approx(2 * max(7 * row / 400e9, row / 50e9))


def test_data_parallel_collectives_per_zero_stage():
    """ZeRO 0-2: one gradient all-reduce (or reduce-scatter + all-gather, the same bytes) of
    the chip's bf16 gradients per step; ZeRO-3: two parameter all-gathers and one gradient
    reduce-scatter per micro-batch (1.5 all-reduces); over 2 domains the NIC carries
    2 (n - 1) / n / 8 of the buffer per chip."""
    from dse.perf.train_step import dp_comm_s
    n = 1e9
    ar = 2 * 7 / 8 * 2 * n / 400e9
    step, per_mb = dp_comm_s(batch(dp=8, zero_stage=1), n)
    assert float(step) == pytest.approx(ar) and float(per_mb) == 0
    step, per_mb = dp_comm_s(batch(dp=8, zero_stage=3), n)
    assert float(step) == 0 and float(per_mb) == pytest.approx(1.5 * ar)
    step, _ = dp_comm_s(batch(dp=16, zero_stage=0), n)
    assert float(step) == pytest.approx(ar + 2 * 1 / 2 / 8 * 2 * n / 50e9)
