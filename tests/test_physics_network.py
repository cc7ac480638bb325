"""Network terms worked by hand through the scorer: the pipeline hand-off on each tier, the
overlap of a collective with compute, a topology's latency beyond the measured system's, the
dense MLP's all-reduce over the tp*dp group.

Each test pins the parameters it covers to round numbers (``Batch.replace``) on top of the
speed-of-light efficiencies (``helpers.IDEAL``), so a refit of the catalog does not move the
expected values, and changing any one covered term by 20% fails it (``tests/mutation.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch, design

from dse.perf import OPS, score

PIPE, PROJ, DENSE, MOE, LOGITS = (OPS.index(o) for o in ("pipeline", "attn_proj", "mlp_dense",
                                                         "moe_routed", "logits"))
DECODE = {"workload.isl": 1, "workload.osl": 2, "workload.phase": "decode"}


def _decode(d, rows=1, **pins):
    b = batch([d] * rows, ideal=True).replace(**pins)
    return score(b, breakdown=True)[1].decode


def test_pipeline_handoff_inside_the_domain_by_hand():
    """Llama-3.1-70B on one 8-GPU domain, tp=4, pp=2, 256 sequences decoding: each stage step
    carries one micro-batch of 256/2 = 128 tokens, whose hidden states (8192 x 2 B, sharded
    over tp=4) go to the next stage in one point-to-point on the scale-up tier:
    128 x 8192 x 2 / 4 = 524,288 B per chip at 450 GB/s x scaleup_fraction 0.8 x the tp
    group's share 0.5 = 180 GB/s -> 2.9127 us, plus the 5 us scale-up latency."""
    d = design(**DECODE, **{"layout.tp": 4, "layout.pp": 2, "workload.concurrency": 256})
    dec = _decode(d, domain_chips=8.0, scaleup_bw_bytes_per_s=450e9, scaleup_fraction=0.8,
                  tp_bw_fraction=0.5, scaleup_latency_s=5e-6)
    assert dec.network_s[PIPE][0] == pytest.approx(5e-6 + 524288 / 180e9, rel=1e-9)


def test_pipeline_handoff_across_domains_pays_the_scale_out_tier():
    """The same model at tp=8, pp=2 on 8-chip domains: the 16 chips span two domains, so the
    hand-off of 128 x 8192 x 2 / 8 = 262,144 B per chip crosses the NICs: 50 GB/s x
    scaleout_fraction 0.5 = 25 GB/s -> 10.486 us, plus the 10 us scale-out latency."""
    d = design(**DECODE, **{"layout.tp": 8, "layout.pp": 2, "workload.concurrency": 256})
    dec = _decode(d, domain_chips=8.0, scaleout_bw_bytes_per_s=50e9, scaleout_fraction=0.5,
                  scaleout_latency_s=10e-6)
    assert dec.network_s[PIPE][0] == pytest.approx(10e-6 + 262144 / 25e9, rel=1e-9)


def test_network_overlap_fraction_hides_that_share_of_a_collective():
    """An op's time is (1 - phi) (busy + net) + phi max(busy, net) = busy + net - phi
    min(busy, net), with busy = max(compute, memory): at phi = 0.5 the tp all-reduce of the
    attention projections of Llama-3.1-70B at tp=8 hides half of the smaller of the two."""
    d = design(**DECODE, **{"layout.tp": 8, "workload.concurrency": 64})
    dec = _decode(d, network_overlap_fraction=0.5)
    c, m, n = dec.compute_s[PROJ][0], dec.memory_s[PROJ][0], dec.network_s[PROJ][0]
    busy = max(c, m)
    assert n > 0 and busy > 0
    assert dec.op_s[PROJ][0] == pytest.approx(busy + n - 0.5 * min(busy, n), rel=1e-9)


def test_topology_latency_beyond_the_measured_system_adds_per_log2_of_the_group():
    """A topology slower than the one the collective kernels were measured on adds its extra
    latency per collective step, twice per log2 of the ranks in the domain (reduce-scatter
    and all-gather): Llama-3.1-70B at tp=8 pays 2 x log2(8) = 6 steps x 2 us = 12 us more on
    each of its 80 layers' attention all-reduces and as much on the dense MLP's: 0.96 ms each."""
    d = design(**DECODE, **{"layout.tp": 8, "workload.concurrency": 64})
    dec = _decode(d, rows=2, scaleup_extra_latency_s=np.array([0.0, 2e-6]))
    for op in (PROJ, DENSE):
        assert dec.network_s[op][1] - dec.network_s[op][0] == pytest.approx(80 * 6 * 2e-6,
                                                                            rel=1e-6)


def test_topology_latency_beyond_the_measured_system_adds_once_per_alltoall_phase():
    """An EP all-to-all pays the topology's extra latency once per phase (dispatch, combine):
    DeepSeek-V3 at ep=8 on 8 GB200 pays 2 x 2 us on each of its 58 MoE layers = 0.232 ms."""
    d = design("gb200", "deepseek-v3", **DECODE, **{
        "model.weight_dtype": "fp8", "layout.tp": 1, "layout.dp": 8, "layout.ep": 8,
        "workload.concurrency": 512, "topology.id": "nvl72"})
    dec = _decode(d, rows=2, scaleup_extra_latency_s=np.array([0.0, 2e-6]))
    assert dec.network_s[MOE][1] - dec.network_s[MOE][0] == pytest.approx(58 * 2 * 2e-6,
                                                                          rel=1e-6)


def test_dense_mlp_split_over_tp_dp_all_reduces_at_that_groups_bandwidth_share():
    """Llama-3.1-70B at tp=2, dp=4 with its dense MLP split over the whole tp*dp group of 8:
    every chip sees all 64 decode tokens, and each of the 80 layers all-reduces their hidden
    states, 64 x 8192 x 2 B = 1 MiB, over 8 ranks (NCCL ring: 2 x 7/8 of the bytes) at the
    group's share of the link relative to the measured system's (ffn_bw_rel 0.5 of 450 GB/s):
    80 x 1.75 x 1,048,576 / 225e9 = 0.6524 ms."""
    d = design(**DECODE, **{"layout.tp": 2, "layout.dp": 4, "layout.dense_mlp": "split",
                            "workload.concurrency": 64})
    dec = _decode(d, scaleup_bw_bytes_per_s=450e9, ffn_bw_rel=0.5, domain_chips=8.0)
    assert dec.network_s[DENSE][0] == pytest.approx(80 * 1.75 * 1048576 / 225e9, rel=1e-9)


def test_an_expert_rank_alone_pays_no_alltoall_beside_one_that_sends():
    """DeepSeek-V3 with attention DP 8, scored in one batch with ep = 8 and ep = 1: the ep = 1
    row keeps every expert on its rank, so its dispatch and combine cost nothing, 0 s of
    latency and 0 s per token, for either kernel kind (the ep = 8 row's are > 0)."""
    from dse.perf.network import kernel_alltoall
    d = design(acc="gb200", model="deepseek-v3", **{
        "model.weight_dtype": "fp8", "layout.dp": 8, **DECODE})
    b = batch([{**d, "layout.ep": 8}, {**d, "layout.ep": 1}])
    out = kernel_alltoall(b, b.ep, 1.0, 2.0)
    for kind in ("ll", "normal"):
        lat, spt = (np.broadcast_to(v, (2,)) for v in out[kind])
        assert lat[0] > 0 and spt[0] > 0
        assert lat[1] == 0.0 and spt[1] == 0.0


def test_dense_mlp_replicated_per_rank_all_reduces_at_the_tp_groups_bandwidth_share():
    """The same design with its dense MLP replicated per attention-DP rank: each rank's tp
    group of 2 runs its own 16 tokens, and each of the 80 layers all-reduces 16 x 8192 x 2 B
    = 256 KiB over 2 ranks (2 x 1/2 of the bytes) at the tp group's share of the link
    (tp_bw_rel 0.8 of 450 GB/s, not the tp*dp group's 0.5): 80 x 262,144 / 360e9 = 58.25 us."""
    d = design(**DECODE, **{"layout.tp": 2, "layout.dp": 4, "layout.dense_mlp": "replicated",
                            "workload.concurrency": 64})
    dec = _decode(d, scaleup_bw_bytes_per_s=450e9, ffn_bw_rel=0.5, tp_bw_rel=0.8,
                  domain_chips=8.0)
    assert dec.network_s[DENSE][0] == pytest.approx(80 * 262144 / 360e9, rel=1e-9)


def test_pipeline_handoff_of_attention_dp_ranks_across_domains_by_hand():
    """tp=2, dp=4, pp=2 on 8-chip domains: a stage's 8 chips fill a domain, the 16 span two,
    so the hand-off crosses the NICs. A stage step carries 128 of the 256 tokens, their hidden
    states split over the stage's tp x dp = 8 chips: 128 x 8192 x 2 / 8 = 262,144 B per chip
    at 50 GB/s x 0.5 -> 10.486 us, plus the 10 us scale-out latency."""
    d = design(**DECODE, **{"layout.tp": 2, "layout.dp": 4, "layout.pp": 2,
                            "workload.concurrency": 256})
    b = batch(d, ideal=True).replace(domain_chips=8.0, scaleout_bw_bytes_per_s=50e9,
                                     scaleout_fraction=0.5, scaleout_latency_s=10e-6)
    dec = score(b, breakdown=True)[1].decode
    assert dec.net_bytes[PIPE][0] == pytest.approx(262144, rel=1e-9)
    assert dec.network_s[PIPE][0] == pytest.approx(10e-6 + 262144 / 25e9, rel=1e-9)


def test_two_batch_overlap_reads_the_head_twice_only_where_it_is_on():
    """Mixtral-8x7B (vocab 32000, hidden 4096, bf16) on tp=1, dp=ep=8, 256 sequences, two rows
    in one batch: the output head's 32000 x 4096 x 2 B at 4 TB/s is 65.5 us, and each of the
    chip's 256 / 8 embedding rows 8 KiB more; with two-batch overlap each micro-batch reads the
    head once (twice in all), without it the head is read once."""
    d = design(model="mixtral-8x7b", **DECODE, **{
        "model.weight_dtype": "bf16", "layout.tp": 1, "layout.dp": 8, "layout.ep": 8,
        "workload.concurrency": 256})
    b = batch([d, d], ideal=True).replace(two_batch_overlap=np.array([1.0, 0.0]),
                                          hbm_bw_bytes_per_s=4e12)
    dec = score(b, breakdown=True)[1].decode
    head, embed = 32000 * 4096 * 2 / 4e12, 256 / 8 * 4096 * 2 / 4e12
    assert dec.memory_s[LOGITS][0] == pytest.approx(2 * head + embed, rel=1e-9)
    assert dec.memory_s[LOGITS][1] == pytest.approx(head + embed, rel=1e-9)
