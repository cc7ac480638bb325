"""Cases worked by hand: the model must reproduce the blackboard math."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch, design, one

from dse.perf import arch, score
from dse.perf.step import Coefficients, step


def test_llama3_70b_int8_kv_is_160_kib_per_token():
    # 2 (K and V) x 8 KV heads x 128 head dim x 80 layers x 1 byte = 163,840 B (scaling book)
    b = batch(design(**{"model.kv_dtype": "int8"}))
    assert arch.kv_bytes_per_token(b)[0] == 2 * 8 * 128 * 80 * 1 == 163840


def test_deepseek_v3_mla_kv_is_the_latent():
    # MLA caches kv_lora_rank + qk_rope_head_dim = 512 + 64 elements per layer: 61 layers, bf16
    b = batch(design(model="deepseek-v3"))
    assert arch.kv_bytes_per_token(b)[0] == (512 + 64) * 61 * 2


@pytest.mark.parametrize("model,published_total,published_active", [
    ("llama-3.1-8b", 8.03e9, 8.03e9), ("llama-3.1-70b", 70.6e9, 70.6e9),
    ("mixtral-8x7b", 46.7e9, 12.9e9), ("deepseek-v3", 671e9, 37e9),
    ("qwen3-235b-a22b", 235e9, 22e9),
])
def test_parameter_counts_from_the_architecture(model, published_total, published_active):
    b = batch(design(model=model))
    assert arch.total_params(b)[0] == pytest.approx(published_total, rel=0.02)
    assert arch.active_params(b)[0] == pytest.approx(published_active, rel=0.03)


def test_decode_at_batch_one_is_weight_streaming():
    # one sequence, tiny context, speed-of-light efficiencies: the step reads every weight once
    d = design(**{"model.weight_dtype": "bf16", "workload.isl": 1, "workload.osl": 2,
                  "workload.concurrency": 1, "workload.phase": "decode"})
    m = one(d, ideal=True)
    # every weight but the input embedding table (only the looked-up row is read)
    w_bytes = (m["total_params"] - 128256 * 8192) * 2.0
    assert m["tpot_s"] == pytest.approx(w_bytes / 3.35e12, rel=0.005)


def test_h100_critical_batch_is_flops_over_bandwidth():
    # weight fetch equals compute at B = (FLOP/s / 2) x bytes_per_weight / HBM B/s = 989e12/3.35e12
    # for bf16 (~295 on H100), with KV negligible: find the batch where decode compute = memory
    cs = np.arange(200, 400, dtype=float)
    rows = [design(**{"workload.isl": 1, "workload.osl": 2, "workload.concurrency": c,
                      "workload.phase": "decode"}) for c in cs]
    b = batch(rows, ideal=True)
    s = score(b)
    # memory includes a little KV and the logits; compute includes attention: compare the
    # matmul-dominated terms through the decode sums
    diff = s["decode_compute_s"] - s["decode_memory_s"]
    crossing = cs[np.argmax(diff > 0)]
    assert crossing == pytest.approx(989e12 / 3.35e12, rel=0.05)


def test_moe_critical_batch_scales_with_total_over_active():
    # DeepSeek-V3 on H100 in bf16: the balance point moves by total/active (~18x) to thousands
    cs = np.arange(2000, 12000, 50, dtype=float)
    rows = [design(model="deepseek-v3", **{"workload.isl": 1, "workload.osl": 2,
                                           "workload.concurrency": c, "workload.phase": "decode",
                                           "layout.tp": 8, "layout.ep": 8})
            for c in cs]
    s = score(batch(rows, ideal=True))
    crossing = cs[np.argmax(s["decode_compute_s"] > s["decode_memory_s"])]
    expected = 989e12 / 3.35e12 * s["total_params"][0] / s["active_params"][0]
    assert crossing == pytest.approx(expected, rel=0.15)
    assert crossing > 2000


def test_prefill_is_compute_bound_and_costs_two_flops_per_param_per_token():
    # one 8k prompt on one H100 at speed of light: time = 2 N tokens / FLOP/s + causal attention
    isl = 8192
    d = design(model="llama-3.1-8b", **{"workload.isl": isl, "workload.osl": 1,
                                        "workload.concurrency": 1, "workload.phase": "prefill",
                                        "serving.max_num_tokens": 16384})
    m = one(d, ideal=True)
    b = batch(d)
    matmul = 2 * (arch.total_params(b)[0] - 128256 * 4096 * 2) * isl \
        + 2 * 128256 * 4096  # the output head runs for the last token only
    attn = 2 * 32 * (2 * 128) * 32 * (isl * (isl + 1) / 2)
    assert m["ttft_s"] == pytest.approx((matmul + attn) / 989e12, rel=0.02)


def test_weights_divide_across_tensor_parallel_ranks():
    m1 = one(design(**{"layout.tp": 1, "model.weight_dtype": "fp8"}))
    m4 = one(design(**{"layout.tp": 4, "model.weight_dtype": "fp8"}))
    assert m4["weights_bytes_per_chip"] == pytest.approx(m1["weights_bytes_per_chip"] / 4, rel=1e-9)
    assert m1["weights_bytes_per_chip"] == pytest.approx(m1["total_params"] * 1.0, rel=1e-9)


def test_tp_allreduce_is_two_per_layer_over_the_ring():
    # 8 x H100, tp=8: each layer all-reduces the attention and MLP outputs. With the fitted
    # kernels pinned to known values (NCCL Simple at 80% of the link, 20 us + 5 us per log2 g,
    # no LL or custom kernel), the network time is worked by hand:
    # 2 x 80 layers x (20 us + 3 x 5 us + 2 (g-1)/g x tokens x hidden x 2 bytes / (450 GB/s x 0.8))
    tok = 1000.0
    pinned = {"ar_nccl_bulk_latency_s": 20e-6, "ar_nccl_latency_per_log2_s": 5e-6,
              "ar_nccl_fraction": 0.8, "ar_nccl_fraction_per_doubling": 1.0,
              "ar_nccl_latency_s": 1.0, "ar_custom_latency_s": 1.0}   # LL and custom: never
    b = batch(design(**{"layout.tp": 8, "workload.concurrency": tok, "workload.isl": 1,
                        "workload.osl": 2, "workload.phase": "decode"}), ideal=True)
    b = b.replace(**pinned)
    k = Coefficients(b)
    t = step(k, np.array([tok]), np.array([0.0]), np.array([1.0]), np.array([1.0]),
             np.array([0.0]), np.array([0.0]), np.array([tok]), breakdown=True)
    net = t.network_s.sum(0)[0]
    per = 20e-6 + 3 * 5e-6 + 2 * 7 / 8 * tok * 8192 * 2 / (450e9 * 0.8)
    # plus the vocab-parallel head's logits all-gather once per step, on NCCL: half an
    # all-reduce's bytes, (g-1)/g x tokens x vocab 128,256 x 2 bytes
    head = 20e-6 + 3 * 5e-6 + 7 / 8 * tok * 128256 * 2 / (450e9 * 0.8)
    assert net == pytest.approx(2 * 80 * per + head, rel=1e-6)
    # a small message takes the custom one-shot kernel when it is the faster
    b2 = b.replace(ar_custom_latency_s=3e-6, ar_custom_latency_per_log2_s=0.0,
                   ar_custom_fraction=0.5)
    t2 = step(Coefficients(b2), np.array([1.0]), np.array([0.0]), np.array([1.0]),
              np.array([1.0]), np.array([0.0]), np.array([0.0]), np.array([1.0]), breakdown=True)
    one_shot = 3e-6 + 7 * 8192 * 2 / (450e9 * 0.5)
    head2 = 20e-6 + 3 * 5e-6 + 7 / 8 * 128256 * 2 / (450e9 * 0.8)
    assert t2.network_s.sum(0)[0] == pytest.approx(2 * 80 * one_shot + head2, rel=1e-6)


def test_cost_per_token_is_chip_hours_over_tokens():
    m = one(design(**{"cost.mode": "rental", "workload.phase": "decode",
                      "workload.concurrency": 64, "layout.tp": 2}))
    usd_per_s = m["usd_per_chip_hour"] * 2 / 3600
    assert m["usd_per_mtok_output"] == pytest.approx(
        usd_per_s / m["output_tokens_per_s_per_instance"] * 1e6, rel=1e-9)


def test_ownership_cost_is_capex_plus_power():
    m = one(design(**{"cost.mode": "ownership", "cost.amortization_years": 4.0, "cost.pue": 1.3,
                      "cost.electricity_usd_per_kwh": 0.1}))
    from dse import catalog
    a = catalog.accelerators()["h100-sxm"]
    expected = a.price.capex_usd / (4 * 8766) + a.price.all_in_power_w * 1.3 * 0.1 / 1000
    assert m["usd_per_chip_hour"] == pytest.approx(expected, rel=1e-9)


def test_pipeline_parallelism_saves_capacity_not_weight_streaming_time():
    # two stages: weights per chip halve, but every token still streams all weights through a
    # chain of stages, so the batch-1 latency floor does not move (podcast: PP is neutral)
    base = {"workload.concurrency": 1, "workload.isl": 1, "workload.osl": 2,
            "workload.phase": "decode", "layout.tp": 4}
    m1 = one(design(**base), ideal=True)
    m2 = one(design(**base, **{"layout.pp": 2}), ideal=True)
    assert m2["weights_bytes_per_chip"] < 0.55 * m1["weights_bytes_per_chip"]
    assert m2["tpot_s"] == pytest.approx(m1["tpot_s"], rel=0.03)
    # and at a real batch the extra chips do not serve more per chip
    base["workload.concurrency"] = 256
    assert one(design(**base, **{"layout.pp": 2}), ideal=True)["output_tokens_per_s_per_chip"] \
        <= one(design(**base), ideal=True)["output_tokens_per_s_per_chip"]


def test_quality_proxy_reproduces_clark_64_experts_at_370m():
    # reference/moe_scaling.md: 64 experts at 370M active ~ dense 1.37B (S-BASE coefficients),
    # log10 loss 0.348 (L = 2.228)
    from dse.perf import quality
    x = np.log10(370e6)
    le, le1 = quality._log_ehat(np.array([64.0])), quality._log_ehat(np.array([1.0]))
    t = quality.A * x + quality.B * le + quality.C * x * le + quality.D
    n_eq = 10 ** ((t - quality.D - quality.B * le1) / (quality.A + quality.C * le1))
    assert n_eq[0] == pytest.approx(1.37e9, rel=0.01)
    assert 10 ** t[0] == pytest.approx(2.228, abs=0.002)


def test_quality_proxy_dense_is_itself_and_experts_help():
    from dse.perf.quality import dense_equivalent_params
    b = batch(design(model="llama-3.1-8b"))
    own = arch.active_params(b)[0] - arch.embedding_params(b)[0]
    assert dense_equivalent_params(b)[0] == pytest.approx(own, rel=1e-9)
    assert dense_equivalent_params(b.replace(n_experts=64))[0] > 1.5 * own
    m = batch(design(model="deepseek-v3"))
    assert dense_equivalent_params(m)[0] > 2 * (arch.active_params(m)[0] - arch.embedding_params(m)[0])


def test_fleet_for_a_demand_in_whole_instances_and_racks():
    """10^8 output tokens/s: whole instances (ceil), whole instances per rack (floor), $/hour of
    their chips; an instance bigger than a rack takes whole racks; no demand gives NaN."""
    import math
    d = design("gb200", "deepseek-v3", **{"topology.id": "nvl72", "model.weight_dtype": "fp8",
                                          "layout.ep": 32, "layout.dp": 32, "workload.concurrency": 2048,
                                          "workload.demand_output_tokens_per_s": 1e8})
    m = one(d)
    inst = math.ceil(1e8 / m["output_tokens_per_s_per_instance"])
    assert m["instances_for_demand"] == inst
    assert m["racks_for_demand"] == math.ceil(inst / (72 // 32))
    assert m["usd_per_hour_for_demand"] == pytest.approx(inst * 32 * m["usd_per_chip_hour"])
    big = one({**d, "layout.ep": 128, "layout.dp": 128, "workload.concurrency": 8192})
    assert big["racks_for_demand"] == big["instances_for_demand"] * 2      # 128 chips: 2 racks
    none = one({**d, "workload.demand_output_tokens_per_s": 0})
    assert math.isnan(none["racks_for_demand"]) and math.isnan(none["usd_per_hour_for_demand"])
    # ... also next to a row that has one (the batch computes the fleet for both)
    both = score(batch([d, {**d, "workload.demand_output_tokens_per_s": 0}]))
    assert both["instances_for_demand"][0] == inst
    assert all(math.isnan(both[k][1]) for k in ("instances_for_demand", "racks_for_demand",
                                                 "usd_per_hour_for_demand"))


def test_dense_mlp_replicated_per_attention_dp_rank():
    """DeepSeek-V3's 3 dense MLP layers on 64 chips (tp=1, dp=64): split over the 64 chips they
    need an all-reduce of every token over the group; replicated on each rank they need none,
    and each chip holds and reads all their weights instead of 1/64 (and the 58 MoE layers'
    shared experts, which sit where the dense MLP does)."""
    from dse.perf import OPS, score
    j = OPS.index("mlp_dense")
    base = {"topology.id": "nvl72", "model.weight_dtype": "fp8", "layout.ep": 64,
            "layout.dp": 64, "workload.concurrency": 4096}
    split = batch(design("gb200", "deepseek-v3", **base, **{"layout.dense_mlp": "split"}))
    rep = batch(design("gb200", "deepseek-v3", **base, **{"layout.dense_mlp": "replicated"}))
    (ms, ss), (mr, sr) = score(split, breakdown=True), score(rep, breakdown=True)
    p_dense = 3 * 3 * 7168 * 18432 * 1.0                       # 3 layers, gated, fp8 bytes
    p_shared = 58 * 3 * 7168 * 2048 * 1.0                      # one shared expert a MoE layer
    assert mr["weights_bytes_per_chip"][0] - ms["weights_bytes_per_chip"][0] == \
        pytest.approx((p_dense + p_shared) * (1 - 1 / 64), rel=1e-9)
    assert sr.decode.network_s[j, 0] == 0.0 < ss.decode.network_s[j, 0]
    hbm = split.hbm_bw_bytes_per_s[0] * split.gemm_hbm_fraction[0]   # the GEMM weight stream
    assert sr.decode.memory_s[j, 0] == pytest.approx(p_dense / hbm, rel=1e-9)
    assert ss.decode.memory_s[j, 0] == pytest.approx(p_dense / 64 / hbm, rel=1e-9)


def test_dense_mlp_replicated_is_split_when_there_is_no_attention_dp():
    d = design("h100-sxm", "llama-3.1-70b", **{"layout.tp": 8, "workload.concurrency": 64})
    a, b = one(d), one({**d, "layout.dense_mlp": "replicated"})
    for k in a:
        np.testing.assert_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize("runtime,expected", [("trtllm", "replicated"), ("sglang", "split"),
                                              ("vllm", "replicated")])
def test_dense_mlp_auto_follows_the_runtime(runtime, expected):
    import pandas as pd

    from dse.build.designs import resolve
    base = {"accelerator.id": "gb200", "model.id": "deepseek-v3", "layout.dp": 8, "layout.ep": 8,
            "serving.runtime": runtime}
    r = resolve(pd.DataFrame([base]))
    assert r["layout.dense_mlp"].iloc[0] == expected
    caps = {"trtllm": 2048, "sglang": 4096, "vllm": 1024}   # serving.toml [runtimes], sourced
    assert r["serving.max_batch_size"].iloc[0] == caps[runtime]
    assert resolve(pd.DataFrame([{**base, "serving.max_batch_size": 64}]))[
        "serving.max_batch_size"].iloc[0] == 64


def test_layouts_the_experts_cannot_take_are_infeasible():
    """Reason 2 (expert parallelism): ep must divide tp x dp (3 does not divide 8), be at most
    the experts (Mixtral has 8: ep = 16 over tp 8 x dp 2 is too many) and be 1 for a dense model
    (Llama, ep = 2); each condition alone makes a row infeasible. The smallest valid layout,
    one chip serving one sequence, is feasible."""
    rows = [design(model="mixtral-8x7b", **{"layout.tp": 8, "layout.ep": 8}),
            design(model="mixtral-8x7b", **{"layout.tp": 8, "layout.ep": 8}),
            design(model="mixtral-8x7b", **{"layout.tp": 8, "layout.dp": 2, "layout.ep": 16}),
            design(model="llama-3.1-8b", **{"layout.tp": 2}),
            design(model="llama-3.1-8b", **{"workload.concurrency": 1})]
    b = batch(rows)
    b = b.replace(ep=np.array([8.0, 3.0, 16.0, 2.0, 1.0]))
    m = score(b)
    assert [int(r) & 2 for r in m["reason"]] == [0, 2, 2, 2, 0]
    assert int(m["reason"][0]) == 0 and int(m["reason"][4]) == 0


def test_mla_attention_parameters_per_layer_by_hand():
    """DeepSeek-V3's MLA projections per layer (config.json: hidden 7168, 128 heads,
    q_lora_rank 1536, kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128): the query down
    and up projections 7168 x 1536 + 1536 x 128 x 192 = 48,758,784, the joint KV down projection
    with the rope key 7168 x (512 + 64) = 4,128,768, the KV up projections 512 x 128 x (128 +
    128) = 16,777,216 and the output 128 x 128 x 7168 = 117,440,512: 187,105,280 (the low-rank
    norms' 2048 weights not counted)."""
    b = batch(design(model="deepseek-v3"))
    q = 7168 * 1536 + 1536 * 128 * (128 + 64)
    assert q == 48_758_784
    want = q + 7168 * (512 + 64) + 512 * 128 * (128 + 128) + 128 * 128 * 7168
    assert want == 187_105_280
    assert arch.attn_params_per_layer(b)[0] == want
