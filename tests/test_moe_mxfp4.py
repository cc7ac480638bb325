"""Fp4 routed experts on a chip without fp4 tensor cores (Hopper) run a W4A16 MXFP4 kernel:
their own grouped-GEMM family (``moe_mxfp4_*``, fitted on aiconfigurator-core's
``w4a16_mxfp4`` tables) at the bf16 peak, not the fp8 block-scaled kernel the fp8 fallback of
their compute peak would pick; a chip with an fp4 peak keeps the fp4 family. The scorer's
terms worked by hand on gpt-oss-120b (fp4 experts, TensorRT-LLM, H200, tp 8)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch, check_w4a16_decode_by_hand

from dse.catalog import accelerators, kernel_params
from dse.perf import OPS, score

MOE = OPS.index("moe_routed")
GPT_OSS = {"accelerator.id": "h200-sxm", "model.id": "gpt-oss-120b", "model.weight_dtype": "fp4",
           "serving.runtime": "trtllm", "layout.tp": 8, "layout.ep": 1, "layout.dp": 1,
           "workload.isl": 1024, "workload.osl": 1024, "workload.concurrency": 16}
# gpt-oss-120b: 128 experts of width 2880, top-4, hidden 2880, 36 MoE layers
E, K, D, W, LAYERS, TP = 128, 4, 2880, 2880, 36, 8


def _params(chip: str, prefix: str) -> dict:
    p = kernel_params()[(chip, "trtllm")]
    return {k[len(prefix):]: v for k, v in p.items() if k.startswith(prefix)}


def test_fp4_experts_on_hopper_take_the_mxfp4_parameters_and_the_bf16_peak():
    b = batch([GPT_OSS, {**GPT_OSS, "accelerator.id": "b200"}])
    mx, fp4 = _params("h200-sxm", "moe_mxfp4_"), _params("b200", "moe_fp4_")
    acc = accelerators()
    for field in ("half_rows", "fraction", "hbm_fraction", "latency_s", "width_half"):
        got = np.asarray(getattr(b, f"moe_{field}"))
        assert got[0] == pytest.approx(mx[field], rel=1e-12), field
        assert got[1] == pytest.approx(fp4[field], rel=1e-12), field
    peak = np.asarray(b.expert_matmul_flops_per_s)
    assert peak[0] == pytest.approx(acc["h200-sxm"].peak_flops_per_s.bf16, rel=1e-12)
    assert peak[1] == pytest.approx(acc["b200"].peak_flops_per_s.fp4, rel=1e-12)
    # the W4A16 kernel's fixed time per layer is several times the CUTLASS fp8 kernel's
    # (the table: 72-80 us at 1-4 tokens whatever the ep, against ~25 us)
    assert mx["latency_s"] > 2.0 * _params("h200-sxm", "moe_fp8_block_")["latency_s"]


def test_mxfp4_decode_terms_by_hand():
    """Decode step at 16 sequences: the touched experts' fp4 weights (0.5625 B) at the mxfp4
    family's HBM fraction; compute at the bf16 peak with the family's tile padding, wave and
    edge terms; the family's fixed time per layer."""
    c = 16.0
    _, st = score(batch(GPT_OSS), breakdown=True)
    p = _params("h200-sxm", "moe_mxfp4_")
    acc = accelerators()["h200-sxm"]
    check_w4a16_decode_by_hand(st, MOE, p, acc, c, E, K, D, W / TP, LAYERS, 0.5625)


def test_mxfp4_family_fitted_on_the_w4a16_mxfp4_tables():
    pytest.importorskip("aiconfigurator_core")
    from dse.calibration.kernels import common, moe
    d = moe.load(chips=["h200-sxm"], runtimes=["trtllm"])
    g = d[(d["family"] == "mxfp4") & d["held_out"]]
    assert len(g) > 50 and set(g["moe_dtype"]) == {"w4a16_mxfp4"}
    vals = {f"moe_mxfp4_{k}": v for k, v in _params("h200-sxm", "moe_mxfp4_").items()}
    pred = moe.predict(g, "mxfp4", accelerators()["h200-sxm"], vals)
    assert common.error_factor(pred, g["latency_s"]) < 1.2
    # a chip with fp4 tensor cores does not run (or fit) the W4A16 family
    assert not moe.supported(accelerators()["b200"], "mxfp4")
    assert moe.supported(accelerators()["h200-sxm"], "mxfp4")
