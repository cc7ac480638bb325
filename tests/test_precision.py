"""Per-op precision: routed experts and attention projections in their own dtypes, the KV
dtype stated in every output."""

from __future__ import annotations

import pytest
from helpers import ROOT, batch, one

from dse.perf import OPS, score
from dse.scoring.evaluate import evaluate_file, evaluate_flat

MOE, PROJ = OPS.index("moe_routed"), OPS.index("attn_proj")
DSV3 = {"accelerator.id": "gb200", "model.id": "deepseek-v3", "model.weight_dtype": "fp8",
        "layout.dp": 8, "layout.ep": 8, "workload.isl": 2048, "workload.osl": 1024,
        "workload.concurrency": 512}


def test_fp4_experts_beside_fp8_layers_by_hand():
    off, on = one(DSV3), one({**DSV3, "model.expert_dtype": "fp4"})
    # 58 MoE layers x 256 experts x 3 x 7168 x 2048 weights over 8 chips, from 1 byte (fp8) to
    # 0.5625 (NVFP4: 4 bits + one fp8 scale per 16)
    want = 58 * 256 * 3 * 7168 * 2048 / 8 * (1.0 - 0.5625)
    assert off["weights_bytes_per_chip"] - on["weights_bytes_per_chip"] == pytest.approx(
        want, rel=1e-9)
    # speed of light: the experts' weight read scales by the bytes, their FLOPs by the peaks
    _, st = score(batch([DSV3, {**DSV3, "model.expert_dtype": "fp4"}], ideal=True),
                  breakdown=True)
    d = st.decode
    assert d.memory_s[MOE][1] / d.memory_s[MOE][0] == pytest.approx(0.5625, rel=1e-12)
    b = batch(DSV3)
    assert d.compute_s[MOE][1] / d.compute_s[MOE][0] == pytest.approx(
        float(b.matmul_flops_per_s[0]) / 10e15, rel=1e-9)      # GB200: 10 PFLOP/s dense fp4
    # the other ops keep the weights' dtype
    assert d.op_s[PROJ][1] == d.op_s[PROJ][0]


def test_attention_dtype_moves_only_the_projections():
    _, st = score(batch([DSV3, {**DSV3, "model.attention_dtype": "bf16"}], ideal=True),
                  breakdown=True)
    d = st.decode
    assert d.memory_s[PROJ][1] / d.memory_s[PROJ][0] == pytest.approx(2.0, rel=1e-12)
    assert d.op_s[MOE][1] == d.op_s[MOE][0]


def test_a_dtype_equal_to_the_weights_is_the_same_design():
    a = one(DSV3)
    b = one({**DSV3, "model.expert_dtype": "fp8", "model.attention_dtype": "fp8"})
    for k, v in a.items():
        assert (v == b[k]) or (v != v and b[k] != b[k]), k      # NaN == NaN here


def test_kv_dtype_is_stated_not_implied():
    res = evaluate_file(str(ROOT / "examples" / "llama70b-h100.toml"))
    assert res["design"]["model.kv_dtype"] == "fp8"          # fp8 weights: an fp8 cache
    assert res["metrics"]["kv_bytes_per_element"] == 1.0
    res = evaluate_flat({"accelerator.id": "h100-sxm", "model.id": "llama-3.1-8b",
                         "workload.concurrency": 8})
    assert res["design"]["model.kv_dtype"] == "bf16"
    assert res["design"]["model.expert_dtype"] == "bf16"
    assert res["metrics"]["kv_bytes_per_element"] == 2.0
