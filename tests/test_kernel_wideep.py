"""The wide-EP comparison and fit (dse.calibration.kernels.wideep) on hand-made table rows: the
benchmark's routing worked by hand, the comparison's kernel time equal to the scorer's own op,
and the written catalog entries (no kernel tables needed)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers import batch, design

from dse.calibration.kernels import wideep
from dse.catalog import kernel_params
from dse.perf import OPS, score

MOE = OPS.index("moe_routed")


def _rows(phase, tokens, eps, **extra):
    n = len(tokens)
    return pd.DataFrame({"chip": "h100-sxm", "runtime": "sglang", "phase": phase,
                         "moe_dtype": "fp8_block", "num_tokens": tokens, "hidden_size": 7168,
                         "inter_size": 2048, "topk": 8, "num_experts": 256, "moe_tp_size": 1,
                         "moe_ep_size": eps, "latency_s": np.full(n, 1e-4), **extra})


def test_benchmark_routing_by_hand():
    """Generation (DeepEP low-latency layout): 4 tokens over ep 4 are 8 rows, one on each of
    the first 8 of the rank's 64 experts; 512 tokens are 1024 rows, 16 on each of its 64. The
    received tokens as the scorer counts them: 512 x (1 - (3/4)^8) = 461.6. Context (normal
    layout): the benchmark hands the rank all 512 tokens."""
    recv, rows, touched = wideep._benchmark_routing(_rows("generation", [4, 512], [4, 4]))
    np.testing.assert_allclose(rows, [8, 1024])
    np.testing.assert_allclose(touched, [8, 64])
    assert recv[1] == pytest.approx(512 * (1 - 0.75 ** 8), rel=1e-12)
    recv, rows, touched = wideep._benchmark_routing(_rows("context", [512], [4]))
    assert (recv[0], rows[0], touched[0]) == (512, 1024, 64)


def test_comparison_is_the_scorers_own_routed_expert_op():
    """``model_s`` of a generation row is the scorer's routed-expert busy time per MoE layer
    (the op's time without its network) of the same design: DeepSeek-V3 on H100 under SGLang,
    tp 1, dp = ep = 32, the row's 4096 tokens in one decode step."""
    ep, tok = 32, 4096
    got = wideep.model_s("h100-sxm", "sglang", _rows("generation", [tok], [ep]))[0]
    d = design("h100-sxm", "deepseek-v3", **{
        "model.weight_dtype": "fp8", "serving.runtime": "sglang", "layout.tp": 1,
        "layout.dp": ep, "layout.ep": ep, "serving.expert_imbalance": 1.0,
        "serving.alltoall_overlap_fraction": 0.0, "serving.ep_overlap": "none",
        "workload.concurrency": tok, "workload.phase": "decode", "workload.isl": 1,
        "workload.osl": 2})
    dec = score(batch(d), breakdown=True)[1].decode
    assert got == pytest.approx((dec.op_s[MOE] - dec.network_s[MOE])[0] / 58, rel=1e-6)


def test_the_deepgemm_entries_say_what_they_were_fitted_on():
    """moe_wideep.toml: SGLang's DeepGEMM entries for the six chips with SGLang's wide-EP
    tables, fp8_block keys only, each naming its tables and what was not fitted."""
    kp = kernel_params()
    chips = sorted(c for (c, rt), e in kp.items() if rt == "sglang" and "kernel_base" not in e
                   and "moe_wideep" in e.get("backend", {}).get("deepgemm", {}).get("fitted_on", {}))
    assert chips == ["b200", "b300", "gb200", "gb300", "h100-sxm", "h200-sxm"]
    for c in chips:
        e = kp[(c, "sglang")]["backend"]["deepgemm"]
        assert all(k.startswith("moe_fp8_block_") for k in e if k != "fitted_on")
        note = e["fitted_on"]["moe_wideep"]
        assert "wideep_{generation,context}_moe_perf" in note and "floors" in note
        assert 0.3 < e["moe_fp8_block_fraction"] <= 1.0
        assert e["moe_fp8_block_remote_fraction"] <= 1e-4


def _trt_rows(tokens, eps, rank0, **extra):
    n = len(tokens)
    return pd.DataFrame({"chip": "h200-sxm", "runtime": "trtllm", "phase": "mixed",
                         "moe_dtype": "fp8_block", "num_tokens": tokens, "hidden_size": 7168,
                         "inter_size": 2048, "topk": 8, "num_experts": 256, "moe_tp_size": 1,
                         "moe_ep_size": eps, "rank0_num_tokens": rank0,
                         "latency_s": np.full(n, 1e-4), **extra})


def test_trtllm_routing_by_hand():
    """TensorRT-LLM's rank 0 at ep 256 (one expert), 4096 tokens of the group, 900 of them
    visiting it: a visiting token carries 8 / dest of its entries there, dest = 256 (1 -
    (255/256)^8) = 7.8915 ranks, so 912.4 rows; the expert is touched with probability
    1 - (1 - 8/256)^4096."""
    recv, rows, touched = wideep._trtllm_routing(_trt_rows([4096], [256], [900]))
    dest = 256 * (1 - (255 / 256) ** 8)
    assert dest == pytest.approx(7.8915, abs=1e-4)
    assert (recv[0], rows[0]) == (900, pytest.approx(900 * 8 / dest, rel=1e-12))
    assert touched[0] == pytest.approx(1 - (1 - 8 / 256) ** 4096, rel=1e-12)


def test_trtllm_wideep_kernel_is_the_scorers_op_with_that_backend():
    """The fit's kernel time (``_trtllm_kernel_s`` with the catalog's ``wideep`` entry) is the
    scorer's routed-expert busy time per MoE layer of the design that names that backend:
    DeepSeek-V3 on H200 under TensorRT-LLM, tp 1, dp = ep = 64, 4096 tokens in one decode
    step, balanced routing (rank 0's tokens its share: 4096 (1 - (63/64)^8))."""
    ep, tok = 64, 4096
    rank0 = tok * (1 - (1 - 1 / ep) ** 8)
    vals = {k[len("moe_fp8_block_"):]: v for k, v in
            kernel_params()[("h200-sxm", "trtllm")]["backend"]["wideep"].items()
            if k.startswith("moe_fp8_block_")}
    from dse.catalog import accelerators
    got = wideep._trtllm_kernel_s(_trt_rows([tok], [ep], [rank0]), "fp8_block",
                                  accelerators()["h200-sxm"], vals)[0]
    d = design("h200-sxm", "deepseek-v3", **{
        "model.weight_dtype": "fp8", "serving.runtime": "trtllm", "layout.tp": 1,
        "layout.dp": ep, "layout.ep": ep, "serving.expert_imbalance": 1.0,
        "serving.moe_backend": "wideep", "serving.alltoall_overlap_fraction": 0.0,
        "serving.ep_overlap": "none", "workload.concurrency": tok, "workload.phase": "decode",
        "workload.isl": 1, "workload.osl": 2})
    dec = score(batch(d), breakdown=True)[1].decode
    assert got == pytest.approx((dec.op_s[MOE] - dec.network_s[MOE])[0] / 58, rel=1e-6)


def test_the_trtllm_wideep_entries_say_what_they_were_fitted_on():
    """moe_wideep.toml: TensorRT-LLM's WideEP entries for the six chips with its wide-EP table,
    the table's family only (fp8_block on Hopper, fp4 on Blackwell), each better on that table
    than the chip's auto entry (the note's two errors), with a wave floor above the auto
    entry's (one wave of tiles per call: a rank with one or two experts and few rows still
    pays it)."""
    import re
    kp = kernel_params()
    chips = sorted(c for (c, rt), e in kp.items() if rt == "trtllm" and "kernel_base" not in e
                   and "moe_wideep" in e.get("backend", {}).get("wideep", {}).get("fitted_on", {}))
    assert chips == ["b200", "b300", "gb200", "gb300", "h100-sxm", "h200-sxm"]
    for c in chips:
        e = kp[(c, "trtllm")]["backend"]["wideep"]
        fam = "fp8_block" if c.startswith("h") else "fp4"
        assert all(k.startswith(f"moe_{fam}_") for k in e if k != "fitted_on")
        note = e["fitted_on"]["moe_wideep"]
        fit_err, auto_err = map(float, re.findall(r"error (\d\.\d+) \(the chip's auto entry: "
                                                  r"(\d\.\d+)\)", note)[0])
        assert fit_err < auto_err
        assert e[f"moe_{fam}_wave_elements"] > kp[(c, "trtllm")][f"moe_{fam}_wave_elements"]
