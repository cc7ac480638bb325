"""The fitted collective kernels as the step uses them, worked by hand: each all-reduce branch
(NCCL LL and Simple, the runtime's custom one-shot and two-shot) winning on its own, and an EP
all-to-all whose group spans two scale-up domains.

Every kernel parameter is pinned to a round number (none is a fitted value); a branch is kept
out of a row by a 1 s latency. So a refit does not move the expected values, and changing any
one parameter by 20% fails a test here (``tests/mutation.py``). The formulas are those of
``dse.perf.kernel_comm``.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch, design

from dse.perf import OPS, forms, score
from dse.perf.kernel_comm import BF16_ELEM_BYTES, FP8_ELEM_BYTES

PROJ, MOE = OPS.index("attn_proj"), OPS.index("moe_routed")
W = 450e9            # pinned scale-up bandwidth per chip and direction
OFF = 1.0            # a latency that keeps a branch from winning


def test_each_allreduce_branch_by_hand():
    """Llama-3.1-70B at tp=8 (log2 8 = 3), 80 layers, one all-reduce of the attention output
    per layer: 64 decode tokens -> B = 64 x 8192 x 2 = 1 MiB (4 tokens: 64 KiB).
    - NCCL LL: 10 us + 3 x 2 us + 2 x 7/8 B / (W x 0.3 x 0.9^(3-1));
    - NCCL Simple: 20 us + 3 x 2 us + 2 x 7/8 B / (W x 0.8 x 0.81);
    - custom two-shot (1 MiB): 2 x (4 us + 3 x 1 us) + 2 x 7/8 B / (W x 0.7) = 19.83 us, below
      the one-shot's 7 us + 7 B / (W x 0.7) = 30.30 us;
    - custom one-shot (64 KiB): 7 us + 7 x 65536 / (W x 0.7) = 8.456 us."""
    rows = [design(**{"layout.tp": 8, "workload.isl": 1, "workload.osl": 2,
                      "workload.phase": "decode", "workload.concurrency": c})
            for c in (64, 64, 64, 4)]
    a = np.array
    b = batch(rows, ideal=True).replace(
        scaleup_bw_bytes_per_s=W, tp_bw_rel=1.0, scaleup_extra_latency_s=0.0,
        ar_nccl_latency_s=a([10e-6, OFF, OFF, OFF]),
        ar_nccl_bulk_latency_s=a([OFF, 20e-6, OFF, OFF]),
        ar_nccl_latency_per_log2_s=2e-6, ar_nccl_ll_fraction=0.3, ar_nccl_fraction=0.8,
        ar_nccl_fraction_per_doubling=0.9, ar_custom_latency_s=a([OFF, OFF, 4e-6, 4e-6]),
        ar_custom_latency_per_log2_s=1e-6, ar_custom_fraction=0.7,
        # no selection rule: the fastest branch (test_runtime_allreduce_rule_by_hand has one)
        ar_oneshot_below_2_bytes=0.0, ar_oneshot_below_4_bytes=0.0, ar_oneshot_below_bytes=0.0)
    net = score(b, breakdown=True)[1].decode.network_s[PROJ]
    big, small = 64 * 8192 * 2, 4 * 8192 * 2
    ring = 2 * 7 / 8
    expected = [16e-6 + ring * big / (W * 0.3 * 0.81), 26e-6 + ring * big / (W * 0.8 * 0.81),
                14e-6 + ring * big / (W * 0.7), 7e-6 + 7 * small / (W * 0.7)]
    assert 7e-6 + 7 * big / (W * 0.7) > expected[2]          # two-shot wins at 1 MiB
    assert net == pytest.approx(80 * np.array(expected), rel=1e-9)


def _rule_rows(tp, concurrency):
    rows = [design(**{"layout.tp": t, "workload.isl": 1, "workload.osl": 2,
                      "workload.phase": "decode", "workload.concurrency": c})
            for t, c in zip(tp, concurrency)]
    cat = batch(rows)              # the runtime's rule as serving.toml gives it (ideal: none)
    rule = {f: getattr(cat, f) for f in ("ar_oneshot_below_2_bytes", "ar_oneshot_below_4_bytes",
                                         "ar_oneshot_below_bytes")}
    return batch(rows, ideal=True).replace(
        **rule, scaleup_bw_bytes_per_s=W, tp_bw_rel=1.0, scaleup_extra_latency_s=0.0,
        ar_nccl_latency_s=10e-6, ar_nccl_bulk_latency_s=20e-6, ar_nccl_latency_per_log2_s=2e-6,
        ar_nccl_ll_fraction=0.3, ar_nccl_fraction=0.8, ar_nccl_fraction_per_doubling=0.9,
        ar_custom_latency_s=4e-6, ar_custom_latency_per_log2_s=1e-6, ar_custom_fraction=0.7)


def test_runtime_allreduce_rule_by_hand():
    """TensorRT-LLM's AUTO rule (serving.toml: one-shot below 16 MB / 1 MB / 500 kB on 2 / 3-4 /
    more ranks, NCCL above, never two-shot), Llama-3.1-70B decode, 80 layers, one all-reduce of
    the attention output per layer, kernels pinned as in the test above:
    - tp 8, 64 tokens, B = 1 MiB >= 500 kB: NCCL, the faster of LL (16 us + 1.75 B /
      (W 0.3 0.81) = 33.26 us) and Simple (26 us + 1.75 B / (W 0.8 0.81) = 32.47 us), although
      two-shot (19.83 us) is faster;
    - tp 8, 16 tokens, B = 256 KiB < 500 kB: one-shot, 7 us + 7 B / (W 0.7), although Simple
      is not far;
    - tp 2, 256 tokens, B = 4 MiB < 16 MB: one-shot, 5 us + B / (W 0.7) = 18.32 us (two-shot
      would be 2 x 5 us + B / (W 0.7) too, NCCL Simple 22 us + B / (W 0.8 / 0.9));
    - tp 4, 64 tokens, B = 1 MiB >= 1 MB: NCCL, LL 14 us + 1.5 B / (W 0.3 0.9) = 26.94 us
      (Simple: 24 us + 1.5 B / (W 0.8 0.9) = 28.85 us; one-shot 6 us + 3 B / (W 0.7) = 15.99 us
      is not allowed)."""
    b = _rule_rows((8, 8, 2, 4), (64, 16, 256, 64))
    assert b.ar_oneshot_below_bytes[0] == 5e5 and b.ar_oneshot_below_2_bytes[0] == 16e6
    net = score(b, breakdown=True)[1].decode.network_s[PROJ]
    mib = 8192 * 2 * np.array([64, 16, 256, 64])
    ll8 = 16e-6 + 1.75 * mib[0] / (W * 0.3 * 0.81)
    simple8 = 26e-6 + 1.75 * mib[0] / (W * 0.8 * 0.81)
    expected = [min(ll8, simple8), 7e-6 + 7 * mib[1] / (W * 0.7),
                5e-6 + mib[2] / (W * 0.7), 14e-6 + 1.5 * mib[3] / (W * 0.3 * 0.9)]
    assert 14e-6 + 1.75 * mib[0] / (W * 0.7) < expected[0]      # two-shot would win
    assert net == pytest.approx(80 * np.array(expected), rel=1e-9)
    # the same rows without a rule take the fastest branch: two-shot at tp 8, 1 MiB
    free = b.replace(ar_oneshot_below_2_bytes=0.0, ar_oneshot_below_4_bytes=0.0,
                     ar_oneshot_below_bytes=0.0)
    net_free = score(free, breakdown=True)[1].decode.network_s[PROJ]
    assert net_free[0] == pytest.approx(80 * (14e-6 + 1.75 * mib[0] / (W * 0.7)), rel=1e-9)


def test_logits_allgather_over_tp_by_hand():
    """The vocab-parallel head gathers its logits over tp once per step on NCCL's branches, half
    an all-reduce's bytes: Llama-3.1-70B (vocab 128256) at tp 8, 64 decode rows, bf16 logits
    B = 64 x 128256 x 2 B = 16.4 MB: Simple, 26 us + 7/8 B / (W 0.8 0.81) (LL: 16 us +
    7/8 B / (W 0.3 0.81) is slower); at tp 1: none."""
    b = _rule_rows((8, 1), (64, 64))
    net = score(b, breakdown=True)[1].decode.network_s[OPS.index("logits")]
    B = 64 * 128256 * 2
    assert net[0] == pytest.approx(26e-6 + 7 / 8 * B / (W * 0.8 * 0.81), rel=1e-9)
    assert net[1] == 0.0


def _two_domain_normal_net(message_s):
    """DeepSeek-V3 fp8, ep = dp = 144 over two NVL72 domains, 64 tokens per chip decoding,
    normal kernels pinned (10 / 20 us latency, half the link), NICs at 0.5 x 50 GB/s: the MoE
    layers' network time of a decode step, with ``message_s(phase)`` per token message."""
    d = design("gb200", "deepseek-v3", **{
        "model.weight_dtype": "fp8", "layout.tp": 1, "layout.dp": 144, "layout.ep": 144,
        "workload.isl": 1, "workload.osl": 2, "workload.concurrency": 144 * 64,
        "workload.phase": "decode", "topology.id": "nvl72", "serving.a2a_kernel": "normal",
        "serving.expert_imbalance": 1.0})
    pins = {f"a2a_normal_{p}_{w}": v for p in ("dispatch", "combine")
            for w, v in (("latency_s", 10e-6 if p == "dispatch" else 20e-6), ("fraction", 0.5),
                         ("message_s", message_s(p)))}
    b = batch(d, ideal=True).replace(
        **pins, domain_chips=72.0, scaleup_bw_bytes_per_s=900e9, a2a_bw_rel=1.0,
        scaleout_bw_bytes_per_s=50e9, a2a_scaleout_fraction=0.5, a2a_scaleout_latency_s=20e-6,
        scaleup_extra_latency_s=0.0)
    return score(b, breakdown=True)[1].decode.network_s[MOE][0]


def test_alltoall_across_two_domains_pays_the_nics_by_hand():
    """DeepSeek-V3 fp8, ep = dp = 144 over two 72-chip domains, normal (deduplicating) kernels,
    64 tokens per chip, 58 MoE layers, balanced experts. A token reaches the other domain with probability
    p_node = 1 - prod_{i<8} (128 - i)/(256 - i) and each of the 71 other ranks of its own with
    p_rank = 1 - prod_{i<8} (256 - 256/144 - i)/(256 - i); the NIC share (50 GB/s x 0.5) is
    the slower one: per layer 2 x 20 us of scale-out latency + the kernels' 10 + 20 us +
    64 x 7168 x (1.03125 + 2) B x p_node / 25e9."""
    net = _two_domain_normal_net(lambda p: 0.0)
    p_node = 1 - np.prod([(128 - i) / (256 - i) for i in range(8)])
    p_rank = 1 - np.prod([(256 - 256 / 144 - i) / (256 - i) for i in range(8)])
    row = 7168 * (FP8_ELEM_BYTES + BF16_ELEM_BYTES)
    up, out = row * 71 * p_rank / (900e9 * 0.5), row * p_node / (50e9 * 0.5)
    assert out > up                                   # the NICs bound it
    assert net == pytest.approx(58 * (2 * 20e-6 + 30e-6 + 64 * out), rel=1e-9)


def test_normal_kernels_pay_per_message_by_hand():
    """The same two-domain case with a fixed cost per token message in the normal kernels
    (10 ns dispatch, 30 ns combine): each of the 64 tokens sends 1 + 71 p_rank + 1 p_node
    messages (the local copy, the ranks of its own domain, the other domain once), per layer
    64 x (1 + 71 p_rank + p_node) x 40 ns on top of the previous test's time."""
    net = _two_domain_normal_net(lambda p: 10e-9 if p == "dispatch" else 30e-9)
    p_node = 1 - np.prod([(128 - i) / (256 - i) for i in range(8)])
    p_rank = 1 - np.prod([(256 - 256 / 144 - i) / (256 - i) for i in range(8)])
    row = 7168 * (FP8_ELEM_BYTES + BF16_ELEM_BYTES)
    out = row * p_node / (50e9 * 0.5)
    msgs = 1 + 71 * p_rank + p_node
    assert net == pytest.approx(58 * (2 * 20e-6 + 30e-6 + 64 * (out + msgs * 40e-9)), rel=1e-9)


def test_runtime_allreduce_threshold_is_where_the_rule_says():
    """Either side of TensorRT-LLM's 500 kB threshold on 8 ranks (kernels pinned as above):
    28 tokens (B = 458,752 B) run one-shot, 7 us + 7 B / (W 0.7); 33 tokens (540,672 B) run NCCL,
    the faster of LL and Simple (a threshold 20% lower or higher moves one of the two rows)."""
    b = _rule_rows((8, 8), (28, 33))
    net = score(b, breakdown=True)[1].decode.network_s[PROJ]
    b28, b33 = 28 * 8192 * 2, 33 * 8192 * 2
    nccl = min(16e-6 + 1.75 * b33 / (W * 0.3 * 0.81), 26e-6 + 1.75 * b33 / (W * 0.8 * 0.81))
    assert net == pytest.approx(80 * np.array([7e-6 + 7 * b28 / (W * 0.7), nccl]), rel=1e-9)


def test_the_four_all_reduce_branches_and_a_runtimes_rule_by_hand():
    # (latency, s per unit) of NCCL LL (1, 1), NCCL Simple (2, 0.5), one-shot (0.5, 2) and
    # two-shot (3, 0.25; off, inf, on a rule's rows), with the rule's (below, penalty)
    inf = np.inf
    lat = (np.array([1.0, 1.0, 1.0]), np.array([2.0, 2.0, 2.0]), np.array([0.5, 0.5, 0.5]),
           np.array([3.0, inf, inf]))
    per = tuple(np.full(3, p) for p in (1.0, 0.5, 2.0, 0.25))
    below, penalty = np.array([1e30, 5.0, 5.0]), np.array([0.0, 1e30, 1e30])
    x = np.array([10.0, 1.0, 10.0])
    t = forms.fastest((lat, per, below, penalty), x)
    # no rule, 10 units: LL 11, Simple 7, one-shot 20.5, two-shot 3 + 2.5 = 5.5, the fastest
    # the rule, 1 unit (< 5): one-shot 0.5 + 2 = 2.5, though LL would take 2
    # the rule, 10 units: NCCL's faster protocol, Simple 2 + 5 = 7
    assert t.tolist() == [5.5, 2.5, 7.0]
