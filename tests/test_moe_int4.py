"""Int4 weight-only (W4A16) routed experts run their own grouped-GEMM family (``moe_int4_*``,
fitted on aiconfigurator-core's ``int4_wo`` Marlin MoE tables), not the bf16 kernel their
bf16 compute peak would pick: the scorer's terms worked by hand on Kimi K2 (int4 experts,
vLLM, H200, tp 8)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch, check_w4a16_decode_by_hand

from dse.catalog import accelerators, kernel_params
from dse.perf import OPS, score

MOE = OPS.index("moe_routed")
KIMI = {"accelerator.id": "h200-sxm", "model.id": "kimi-k2", "model.weight_dtype": "int4",
        "serving.runtime": "vllm", "layout.tp": 8, "layout.ep": 1, "layout.dp": 1,
        "workload.isl": 1024, "workload.osl": 1024, "workload.concurrency": 64}
# Kimi K2: 384 experts of width 2048, top-8, hidden 7168, 60 MoE layers (61 - 1 dense)
E, K, D, W, LAYERS, TP = 384, 8, 7168, 2048, 60, 8


def _params(prefix: str) -> dict:
    p = kernel_params()[("h200-sxm", "vllm")]
    return {k[len(prefix):]: v for k, v in p.items() if k.startswith(prefix)}


def test_int4_experts_take_the_int4_kernel_parameters():
    b = batch([KIMI, {**KIMI, "model.weight_dtype": "bf16"},
               {**KIMI, "model.weight_dtype": "bf16", "model.expert_dtype": "int4"}])
    int4, bf16 = _params("moe_int4_"), _params("moe_bf16_")
    for field in ("half_rows", "fraction", "hbm_fraction", "wave_elements", "width_half"):
        got = np.asarray(getattr(b, f"moe_{field}"))
        assert got[0] == pytest.approx(int4[field], rel=1e-12), field
        assert got[1] == pytest.approx(bf16[field], rel=1e-12), field
        assert got[2] == pytest.approx(int4[field], rel=1e-12), field   # per-op precision
    # the families differ where it matters: the bf16 kernel pads each touched expert to
    # several times the Marlin kernel's tile (vLLM fused_marlin_moe: block_size_m 8-64)
    assert bf16["half_rows"] > 2.0 * int4["half_rows"]


def test_int4_decode_terms_by_hand():
    """Decode step at 64 sequences: the touched experts' int4 weights at the int4 family's HBM
    fraction, and grouped_gemm_s's compute at the bf16 peak with the int4 family's tile padding,
    wave and edge terms (W4A16: bf16 MMAs on dequantized weights)."""
    c = 64.0
    _, st = score(batch(KIMI), breakdown=True)
    p = _params("moe_int4_")
    acc = accelerators()["h200-sxm"]
    check_w4a16_decode_by_hand(st, MOE, p, acc, c, E, K, D, W / TP, LAYERS, 0.53)  # int4: 0.53 B


def test_int4_kernel_fit_uses_the_scorer_bytes_and_the_bf16_peak():
    """The fit's model of a table row (moe.predict) is the scorer's: int4 weights at the
    catalog's 0.53 B, compute at the bf16 peak."""
    import pandas as pd

    from dse.calibration.kernels import moe
    from dse.perf.kernel_gemm import grouped_gemm_s
    acc = accelerators()["h200-sxm"]
    vals = {f"moe_int4_{k}": v for k, v in _params("moe_int4_").items()}
    frame = pd.DataFrame({"num_tokens": [64, 4096], "hidden_size": D, "inter_size": W,
                          "topk": K, "num_experts": E, "moe_tp_size": TP, "moe_ep_size": 1})
    p = _params("moe_int4_")
    want = grouped_gemm_s(frame["num_tokens"].to_numpy(), D, W, K, E, TP, 1, 0.53,
                          acc.peak_flops_per_s.bf16, acc.hbm_bw_bytes_per_s, p["fraction"],
                          p["half_rows"], p["width_half"], p["hbm_fraction"], p["token_bytes"],
                          p["latency_s"], *moe.balanced_routing(frame), p["hidden_half"],
                          p["batch_bytes"], route_bytes=p["route_bytes"],
                          wave_elements=p["wave_elements"],
                          remote_fraction=p["remote_fraction"])
    got = moe.predict(frame.assign(_matrices=3.0), "int4", SimpleAcc(acc), vals)
    np.testing.assert_allclose(got, want, rtol=1e-12)


class SimpleAcc:
    """The accelerator without its L2 size (the scorer's cold cache)."""

    def __init__(self, acc):
        self.peak_flops_per_s, self.hbm_bw_bytes_per_s = acc.peak_flops_per_s, acc.hbm_bw_bytes_per_s
        self.l2_cache_bytes = None


def test_int4_family_fitted_on_the_marlin_tables():
    pytest.importorskip("aiconfigurator_core")
    from dse.calibration.kernels import common, moe
    d = moe.load(chips=["h200-sxm"], runtimes=["vllm"])
    g = d[(d["family"] == "int4") & d["held_out"]]
    assert len(g) > 50 and set(g["backend"]) == {"marlin"}
    vals = {f"moe_int4_{k}": v for k, v in _params("moe_int4_").items()}
    pred = moe.predict(g, "int4", accelerators()["h200-sxm"], vals)
    assert common.error_factor(pred, g["latency_s"]) < 1.25
