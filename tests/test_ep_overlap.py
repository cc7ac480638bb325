"""Expert-parallel all-to-all and overlap, worked by hand through the scorer."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch, design

from dse.perf import OPS, score
from dse.perf.kernel_comm import FP8_ELEM_BYTES

MOE = OPS.index("moe_routed")
PIN = {f"a2a_{k}_{p}_{w}": v for k in ("ll", "normal") for p in ("dispatch", "combine")
       for w, v in (("latency_s", 10e-6 if p == "dispatch" else 20e-6), ("fraction", 0.5))}
# the kernels' issue-rate terms off (worked by hand in test_physics_collectives): no cost per
# token message (normal kernels), no per-expert rate limit (low-latency kernels)
PIN.update({f"a2a_normal_{p}_message_s": 0.0 for p in ("dispatch", "combine")})
PIN.update({f"a2a_ll_{p}_expert_bytes_per_s": np.inf for p in ("dispatch", "combine")})


def _decode(d, **upd):
    # worked for balanced experts (the published default imbalance is tested in test_imbalance)
    b = batch(d, ideal=True).replace(**{**PIN, "expert_imbalance": 1.0, **upd})
    m, steps = score(b, breakdown=True)
    return b, m, steps.decode


def test_low_latency_dispatch_and_combine_by_hand():
    # DeepSeek-V3 fp8 on 8 GB200 (one NVL72 domain), tp=1 dp=ep=8, 512 sequences decoding:
    # each chip sends 64 tokens; the low-latency kernels send one copy per (token, expert):
    # top-8 of 256 experts over 8 ranks -> 8 x 7/8 = 7 copies leave the chip, per layer
    # dispatch fp8 (7168 x 1.03125 B) + combine bf16 (7168 x 2 B) at 0.5 x 900 GB/s
    d = design("gb200", "deepseek-v3", **{
        "model.weight_dtype": "fp8", "layout.tp": 1, "layout.dp": 8, "layout.ep": 8,
        "workload.isl": 1, "workload.osl": 2, "workload.concurrency": 512,
        "workload.phase": "decode", "topology.id": "nvl72"})
    b, m, dec = _decode(d)
    per_tok = 7 * 7168 * (FP8_ELEM_BYTES + 2.0) / (900e9 * 0.5)
    per_layer = 10e-6 + 20e-6 + 64 * per_tok
    assert dec.network_s[MOE][0] == pytest.approx(58 * per_layer, rel=1e-6)   # 58 MoE layers


def test_normal_kernels_deduplicate_per_rank():
    # the same step with the normal kernels: a token crosses to a rank once, whatever number of
    # its 8 experts live there: P(hit one rank of 8) = 1 - prod_{i<8} (224 - i)/(256 - i)
    d = design("gb200", "deepseek-v3", **{
        "model.weight_dtype": "fp8", "layout.tp": 1, "layout.dp": 8, "layout.ep": 8,
        "workload.isl": 1, "workload.osl": 2, "workload.concurrency": 512,
        "workload.phase": "decode", "topology.id": "nvl72", "serving.a2a_kernel": "normal"})
    b, m, dec = _decode(d)
    p_hit = 1 - np.prod([(224 - i) / (256 - i) for i in range(8)])
    per_tok = 7 * p_hit * 7168 * (FP8_ELEM_BYTES + 2.0) / (900e9 * 0.5)
    assert dec.network_s[MOE][0] == pytest.approx(58 * (30e-6 + 64 * per_tok), rel=1e-6)
    assert 7 * p_hit < 7 * 0.7          # dedup sends ~2/3 of the low-latency copies


def test_alltoall_hides_under_compute_with_overlap_and_two_batch_overlap_reads_weights_twice():
    d = design("gb200", "deepseek-v3", **{
        "model.weight_dtype": "fp8", "layout.tp": 1, "layout.dp": 8, "layout.ep": 8,
        "workload.isl": 1, "workload.osl": 2, "workload.concurrency": 4096,
        "workload.phase": "decode", "topology.id": "nvl72"})
    b0, m0, dec0 = _decode(d)
    b1, m1, dec1 = _decode(d, alltoall_overlap_fraction=1.0)
    a2a = dec0.network_s[MOE][0]
    busy = np.maximum(dec0.compute_s, dec0.memory_s).sum(0)[0]
    assert busy > a2a > 0
    assert dec1.total_s[0] == pytest.approx(dec0.total_s[0] - a2a, rel=1e-9)
    b2, m2, dec2 = _decode(d, two_batch_overlap=1.0)
    proj = OPS.index("attn_proj")
    assert dec2.memory_s[proj][0] == pytest.approx(2 * dec0.memory_s[proj][0], rel=1e-9)
    # half of the overlap fraction hides half of it
    b3, m3, dec3 = _decode(d, alltoall_overlap_fraction=0.5)
    assert dec3.total_s[0] == pytest.approx(dec0.total_s[0] - 0.5 * a2a, rel=1e-9)


def test_scaleout_oversubscription_slows_an_ep_group_across_domains():
    # ep = 144 over two NVL72 domains: the share of each token's copies that leaves the domain
    # crosses the NICs; doubling the fabric's oversubscription halves their bandwidth
    base = {"model.weight_dtype": "fp8", "layout.tp": 1, "layout.dp": 144, "layout.ep": 144,
            "workload.isl": 1, "workload.osl": 2, "workload.concurrency": 144 * 64,
            "workload.phase": "decode", "topology.id": "nvl72", "serving.a2a_kernel": "normal"}
    nic = {"a2a_scaleout_latency_s": 0.0, "a2a_scaleout_fraction": 1.0}
    _, _, d1 = _decode(design("gb200", "deepseek-v3", **base), **nic)
    _, _, d2 = _decode(design("gb200", "deepseek-v3", **base,
                              **{"topology.scaleout_oversubscription": 2.0}), **nic)
    lat = 58 * 30e-6
    out1, out2 = d1.network_s[MOE][0] - lat, d2.network_s[MOE][0] - lat
    assert out2 == pytest.approx(2 * out1, rel=1e-6)     # the NIC term sets the time


def test_overlap_hides_the_alltoall_only_under_the_steps_own_busy_time():
    """With slow all-to-all kernels (1 ms per dispatch and combine call) the EP all-to-all of 8
    decoding sequences outlasts the step's compute and memory time: full overlap hides only as
    much of it as there is busy time to hide under (the per-op max of compute and memory)."""
    d = design("gb200", "deepseek-v3", **{
        "model.weight_dtype": "fp8", "layout.tp": 1, "layout.dp": 8, "layout.ep": 8,
        "workload.isl": 1, "workload.osl": 2, "workload.concurrency": 8,
        "workload.phase": "decode", "topology.id": "nvl72"})
    slow = {f"a2a_{k}_{p}_latency_s": 1e-3 for k in ("ll", "normal")
            for p in ("dispatch", "combine")}
    b0, m0, dec0 = _decode(d, **slow)
    b1, m1, dec1 = _decode(d, alltoall_overlap_fraction=1.0, **slow)
    busy = np.maximum(dec0.compute_s, dec0.memory_s).sum(0)[0]
    assert dec0.network_s[MOE][0] > busy > 0
    assert dec1.total_s[0] == pytest.approx(dec0.total_s[0] - busy, rel=1e-9)


def test_two_batch_overlap_pads_every_gemm_twice_and_reads_the_head_twice():
    """Two-batch overlap runs the step as two micro-batches: every GEMM pads its rows up by
    gemm_half_rows (64) twice, so each GEMM op's compute rises by exactly one more padding,
    the padding that 64 half rows cost without it (against 0); and the output head's weights,
    129280 x 7168 x 1 B (fp8) on each chip, are read twice, at 8 TB/s."""
    d = design("gb200", "deepseek-v3", **{
        "model.weight_dtype": "fp8", "layout.tp": 1, "layout.dp": 8, "layout.ep": 8,
        "workload.isl": 1, "workload.osl": 2, "workload.concurrency": 512,
        "workload.phase": "decode", "topology.id": "nvl72"})
    pins = {"hbm_bw_bytes_per_s": 8e12}
    _, _, flat = _decode(d, gemm_half_rows=0.0, **pins)
    _, _, pad = _decode(d, gemm_half_rows=64.0, **pins)
    _, _, tbo = _decode(d, gemm_half_rows=64.0, two_batch_overlap=1.0, **pins)
    for op in ("attn_proj", "mlp_dense", "moe_shared", "router", "logits"):
        i = OPS.index(op)
        once = pad.compute_s[i][0] - flat.compute_s[i][0]
        assert once > 0, op
        assert tbo.compute_s[i][0] - pad.compute_s[i][0] == pytest.approx(once, rel=1e-9), op
    head = OPS.index("logits")
    assert tbo.memory_s[head][0] - pad.memory_s[head][0] == pytest.approx(
        129280 * 7168 * 1.0 / 8e12, rel=1e-9)


def test_output_never_pays_more_than_the_instance():
    """With the auto EP kernels a decode-only step runs the low-latency all-to-all and a step
    carrying prompt tokens the normal one. Where the low-latency kernels are the slow ones
    (1 ms a call against 10 us) the decode-only step outlasts the mean step: its share of the
    cost is capped at the whole, so output tokens pay for the instance and input tokens for
    nothing."""
    d = design("gb200", "deepseek-v3", **{
        "model.weight_dtype": "fp8", "layout.tp": 1, "layout.dp": 8, "layout.ep": 8,
        "workload.isl": 128, "workload.osl": 512, "workload.concurrency": 512,
        "topology.id": "nvl72", "cost.mode": "rental"})
    slow_ll = {f"a2a_ll_{p}_latency_s": 1e-3 for p in ("dispatch", "combine")}
    b, m, dec = _decode(d, **slow_ll)
    assert dec.total_s[0] > m["step_s"][0]
    usd_s = m["usd_per_chip_hour"][0] * 8 / 3600.0
    out_rate = m["output_tokens_per_s_per_instance"][0]
    assert m["usd_per_mtok_output"][0] == pytest.approx(usd_s / out_rate * 1e6, rel=1e-12)
    assert m["usd_per_mtok_input"][0] == 0.0
