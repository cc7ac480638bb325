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
