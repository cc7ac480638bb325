"""MoE terms worked by hand through the scorer: the shared experts' weights, weight stream and
FLOPs (split over the tp x dp group or replicated per attention-DP rank, as the dense MLP), and
the bytes per element of the EP dispatch.

DeepSeek-V3 (config.json): hidden 7168, 58 MoE layers, 1 shared expert of width 2048 (gated:
3 matrices), 256 routed experts of width 2048, top-8. Efficiencies are pinned to round numbers
on top of the speed-of-light ones (``helpers.IDEAL``), so a refit does not move the expected
values; changing ``n_shared``, ``ffn_shared``, ``dispatch_bytes`` or the shared experts' group
by 20% fails a test here.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch, design

from dse.perf import OPS, score
from dse.perf.kernel_comm import BF16_ELEM_BYTES, FP8_ELEM_BYTES

SHARED, MOE = OPS.index("moe_shared"), OPS.index("moe_routed")
SHARED_PARAMS = 58 * 3 * 7168 * 2048          # every MoE layer's shared expert: 2.554e9
DSV3 = {"layout.tp": 1, "layout.dp": 8, "layout.ep": 8, "workload.isl": 1, "workload.osl": 2,
        "workload.concurrency": 512, "workload.phase": "decode", "topology.id": "nvl72",
        "serving.expert_imbalance": 1.0}           # balanced experts: worked by hand
PIN = {"hbm_bw_bytes_per_s": 8e12, "matmul_flops_per_s": 4e15, "gemm_hbm_fraction": 0.5,
       "gemm_fraction": 0.5}


def _decode(weights="fp8", dense_mlp="auto", **upd):
    b = batch(design("gb200", "deepseek-v3", **{"model.weight_dtype": weights, **DSV3,
                                                "layout.dense_mlp": dense_mlp}),
              ideal=True).replace(**{**PIN, **upd})
    m, steps = score(b, breakdown=True)
    return m, steps.decode


@pytest.mark.parametrize("dense_mlp,group", [("split", 8), ("replicated", 1), ("auto", 1)])
def test_shared_expert_sits_where_the_dense_mlp_does_and_is_read_once_per_step(dense_mlp, group):
    """Split (SGLang's default), each of the 8 chips holds 1/8 of every shared expert: 2.554e9
    params x 1 B (fp8) / 8 = 319.3 MB at 8 TB/s x 0.5 -> 79.82 us, and runs all 512 tokens
    through its slice. Replicated on every attention-DP rank (tp = 1: TensorRT-LLM's, the
    default runtime's, and vLLM's), each chip holds all of it, 2.554 GB -> 638.6 us, and runs
    its rank's 64 tokens. The FLOPs are the same: 2 x 512 x 2.554e9 / 8 = 326.9 GFLOP at
    4 PFLOP/s x 0.5 -> 163.5 us."""
    _, dec = _decode(dense_mlp=dense_mlp)
    assert dec.hbm_bytes[SHARED][0] == pytest.approx(SHARED_PARAMS * 1.0 / group, rel=1e-9)
    assert dec.memory_s[SHARED][0] == pytest.approx(SHARED_PARAMS * 1.0 / group / 4e12,
                                                    rel=1e-9)
    assert dec.flops[SHARED][0] == pytest.approx(2 * 512 * SHARED_PARAMS / 8, rel=1e-9)
    assert dec.compute_s[SHARED][0] == pytest.approx(2 * 512 * SHARED_PARAMS / 8 / 2e15,
                                                     rel=1e-9)


@pytest.mark.parametrize("dense_mlp,group", [("split", 8), ("replicated", 1)])
def test_shared_experts_weigh_on_every_chip(dense_mlp, group):
    """Without the shared expert each chip holds 2.554e9 / 8 x 1 B = 319.3 MB less when it is
    split, all 2.554 GB less when every rank holds a copy. With MTP (one more MoE layer,
    ``spec_mtp_layers`` 1) the drafter's shared expert sits the same way: 59 / 58 of it."""
    d = design("gb200", "deepseek-v3", **{"model.weight_dtype": "fp8", **DSV3,
                                          "layout.dense_mlp": dense_mlp})
    b = batch([d, d, {**d, "serving.spec_tokens": 1}, {**d, "serving.spec_tokens": 1}])
    w = score(b.replace(n_shared=np.array([1.0, 0.0, 1.0, 0.0])))["weights_bytes_per_chip"]
    assert w[0] - w[1] == pytest.approx(SHARED_PARAMS / group, rel=1e-9)
    assert w[2] - w[3] == pytest.approx(SHARED_PARAMS * 59 / 58 / group, rel=1e-9)


# A hand-made MoE: Mixtral 8x7B's shape (hidden 4096, 32 MoE layers, gated experts) with two
# shared experts of width 1024 added, in bf16 on tp = 2, dp = 2, ep = 4: the shared experts
# are 2 x 3 x 4096 x 1024 x 32 = 805.3e6 parameters. 64 sequences decode, 32 per rank.
SMALL_SHARED = 2 * 3 * 4096 * 1024 * 32


@pytest.mark.parametrize("replicated,group", [(0.0, 4), (1.0, 2)])
def test_small_moe_shared_experts_split_or_per_rank_by_hand(replicated, group):
    """Split over tp x dp = 4 chips: 805.3e6 / 4 = 201.3e6 parameters a chip, 402.7 MB in
    bf16, all 64 tokens through them; replicated per rank, tp-sharded over its 2 chips:
    402.7e6 a chip, 805.3 MB, the rank's 32 tokens. FLOPs per chip either way:
    2 x 201.3e6 x 64 = 2 x 402.7e6 x 32 = 25.77 GFLOP -> 12.88 us at 4 PFLOP/s x 0.5; the
    weights at 8 TB/s x 0.5: 100.7 us split, 201.3 us replicated."""
    d = design("h200-sxm", "mixtral-8x7b", **{
        "model.weight_dtype": "bf16", "layout.tp": 2, "layout.dp": 2, "layout.ep": 4,
        "workload.isl": 1, "workload.osl": 2, "workload.concurrency": 64,
        "workload.phase": "decode", "serving.expert_imbalance": 1.0})
    upd = {**PIN, "n_shared": np.array([2.0, 0.0]), "ffn_shared": np.array([1024.0, 1024.0]),
           "dense_replicated": np.array([replicated, replicated])}
    m, st = score(batch([d, d], ideal=True).replace(**upd), breakdown=True)
    dec = st.decode
    weight_bytes = SMALL_SHARED * 2 / group
    assert m["weights_bytes_per_chip"][0] - m["weights_bytes_per_chip"][1] == \
        pytest.approx(weight_bytes, rel=1e-9)
    assert dec.hbm_bytes[SHARED][0] == pytest.approx(weight_bytes, rel=1e-9)
    assert dec.memory_s[SHARED][0] == pytest.approx(weight_bytes / 4e12, rel=1e-9)
    flops = 2 * SMALL_SHARED / group * 64 * group / 4
    assert flops == pytest.approx(2 * SMALL_SHARED / 4 * 64, rel=1e-12)
    assert dec.flops[SHARED][0] == pytest.approx(flops, rel=1e-9)
    assert dec.compute_s[SHARED][0] == pytest.approx(flops / 2e15, rel=1e-9)
    assert dec.flops[SHARED][1] == dec.hbm_bytes[SHARED][1] == 0.0


@pytest.mark.parametrize("weights,elem_bytes",
                         [("fp8", FP8_ELEM_BYTES), ("bf16", BF16_ELEM_BYTES)])
def test_dispatch_carries_the_weights_precision(weights, elem_bytes):
    """Low-latency EP kernels, 8 ranks: each chip's 64 tokens send one copy per (token,
    expert) that leaves the chip, 8 x 7/8 = 7, of 7168 elements: dispatch in fp8 with one fp32
    scale per 128 elements (1.03125 B) when the weights are 8-bit, else bf16 (2 B); combine
    in bf16. At 900 GB/s x 0.5 (pinned kernel fractions, no latency), per MoE layer:
    64 x 7 x 7168 x (dispatch + 2) / 450e9."""
    pins = {f"a2a_ll_{p}_{w}": v for p in ("dispatch", "combine")
            for w, v in (("latency_s", 0.0), ("fraction", 0.5),
                         ("expert_bytes_per_s", np.inf))}
    m, dec = _decode(weights, scaleup_bw_bytes_per_s=900e9, a2a_bw_rel=1.0, **pins)
    per_layer = 64 * 7 * 7168 * (elem_bytes + 2.0) / 450e9
    assert dec.network_s[MOE][0] == pytest.approx(58 * per_layer, rel=1e-9)


def test_low_latency_kernels_issue_rate_per_expert_by_hand():
    """The low-latency kernels run one warp group per expert: on top of the link term every
    (token, expert) row, local ones too (64 x 8 of 7168 elements), moves at 256 experts x
    5 GB/s. Per MoE layer (fp8 dispatch 1.03125 B, bf16 combine): 64 x 7 x 7168 x 3.03125 /
    450e9 + 64 x 8 x 7168 x 3.03125 / (256 x 5e9); with 8 experts it would be 32x the
    second term."""
    pins = {f"a2a_ll_{p}_{w}": v for p in ("dispatch", "combine")
            for w, v in (("latency_s", 0.0), ("fraction", 0.5), ("expert_bytes_per_s", 5e9))}
    m, dec = _decode("fp8", scaleup_bw_bytes_per_s=900e9, a2a_bw_rel=1.0, **pins)
    eb = FP8_ELEM_BYTES + 2.0
    per_layer = 64 * 7 * 7168 * eb / 450e9 + 64 * 8 * 7168 * eb / (256 * 5e9)
    assert dec.network_s[MOE][0] == pytest.approx(58 * per_layer, rel=1e-9)


# Mixtral 8x7B (config.json): hidden 4096, 32 MoE layers, 8 routed experts of width 14336,
# top-2, no shared expert. The GEMM shape terms are set to fitted-like values (not the ideal
# zeros), so a width-0 shared expert or a width-8 router would pay them if the model let it.
ROUTER = OPS.index("router")
MIXTRAL = {"layout.tp": 1, "layout.dp": 1, "layout.ep": 1, "workload.isl": 1, "workload.osl": 2,
           "workload.concurrency": 512, "workload.phase": "decode"}
SHAPE = {"gemm_n_half": 1336.0, "gemm_k_half": 493.0, "gemm_wave_elements": 1e5,
         "gemm_half_rows": 0.0}


def _mixtral_decode(**upd):
    b = batch(design("h200-sxm", "mixtral-8x7b", **{"model.weight_dtype": "fp8", **MIXTRAL}),
              ideal=True).replace(**{**PIN, **SHAPE, **upd})
    return score(b, breakdown=True)[1].decode


def test_a_model_without_shared_experts_runs_no_shared_expert_gemm():
    """No shared expert: the op costs nothing, whatever the GEMM shape terms (before the fix
    the width-0 GEMMs, clamped to width 1, cost 16.6 ms of a 60.8 ms Mixtral step on H200)."""
    dec = _mixtral_decode()
    assert dec.compute_s[SHARED][0] == 0.0
    assert dec.memory_s[SHARED][0] == 0.0
    assert dec.op_s[SHARED][0] == 0.0


def test_router_gemm_pays_its_flops_at_the_large_gemm_rate():
    """The router [512, 4096] x [4096, 8] per layer, 32 layers: 2 x 512 x 4096 x 8 x 32 =
    1.074 GFLOP at 4 PFLOP/s x 0.5 -> 0.537 us, with no width-edge or one-wave penalty (which
    at width 8 would multiply it ~170x). Doubling the experts doubles it."""
    dec = _mixtral_decode()
    flops = 2 * 512 * 4096 * 8 * 32
    assert dec.compute_s[ROUTER][0] == pytest.approx(flops / 2e15, rel=1e-9)
    dec16 = _mixtral_decode(n_experts=np.array([16.0]))
    assert dec16.compute_s[ROUTER][0] == pytest.approx(2 * flops / 2e15, rel=1e-9)
