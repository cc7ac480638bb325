"""The fitted fixed time per layer paid per linear layer (dse/perf/train_time.py,
``layer_linears`` and ``layer_overhead_s``): ``layer_overhead_s`` is a dense GQA layer's (4 linear
layers: QKV, output, fc1, fc2); an MoE layer runs its router, its shared experts' fc1 and fc2 and
each local expert's fc1 and fc2 (Transformer Engine 2.9's GroupedLinear: one cuBLAS GEMM per
local expert), an MLA attention 4 or 5 projections. Hand-worked::

    dense GQA                      2 + 2                  = 4     -> 1 x layer_overhead_s
    MoE, 8 experts, ep 1           2 + 1 + 2 x 8          = 19    -> 4.75 x
    MoE, 8 experts, ep 2           2 + 1 + 2 x 4          = 11    -> 2.75 x
    Qwen3-30B-A3B shape, ep 8      2 + 1 + 2 x 128 / 8    = 35    -> 8.75 x
    + shared experts               35 + 2                 = 37
    MLA with a query LoRA, dense   5 + 2                  = 7
    half the layers MoE (ep 2)     2 + (11 - 2) / 2 + 2 / 2 ... = 2 + 4.5 + 1 = 7.5

With ``training.moe_grouped_gemm = "single"`` (one grouped kernel per fc1 and fc2: TE's opt-in
grouped GEMMs) an MoE layer counts its grouped fc1 and fc2 once, whatever its local experts::

    dense GQA                      2 + 2                  = 4     (no experts: unchanged)
    MoE, 8 experts, ep 1 or 2      2 + 1 + 2              = 5     -> 1.25 x
    Qwen3-30B-A3B shape, ep 8      2 + 1 + 2              = 5
    + shared experts               5 + 2                  = 7
    half the layers MoE (ep 2)     2 + (5 - 2) / 2 + 2 / 2 = 4.5
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_train_physics import DENSE, MOE, batch

from dse.calibration import train_fit
from dse.catalog import training as tcat
from dse.errors import InputError
from dse.perf.train_batch import MOE_GROUPED_GEMM
from dse.perf.train_step import micro_batch_parts
from dse.perf.train_time import DENSE_LAYER_LINEARS, layer_linears, layer_overhead_s
from dse.scoring.train_predict import predict_train_frame
from dse.spec import train_fields

QWEN3_30B = {**MOE, "experts": 128, "topk": 8}


def test_a_dense_layer_pays_the_fitted_time_once():
    b = batch(DENSE, layer_overhead_s=1e-3)
    assert DENSE_LAYER_LINEARS == 4.0
    assert float(layer_linears(b)) == 4.0
    assert float(layer_overhead_s(b)) == pytest.approx(1e-3, rel=1e-12)
    # 8 layers, one micro-batch: 8 ms, what it was before the linear count
    assert float(micro_batch_parts(b)["overhead_s"]) == pytest.approx(8e-3, rel=1e-12)


@pytest.mark.parametrize("model,ep,linears", [
    (MOE, 1, 19.0), (MOE, 2, 11.0), (QWEN3_30B, 8, 35.0),
    ({**QWEN3_30B, "shared_ffn": 512}, 8, 37.0)])
def test_an_moe_layer_pays_per_local_expert(model, ep, linears):
    b = batch(model, ep=ep, layer_overhead_s=1e-3)
    assert float(layer_linears(b)) == pytest.approx(linears, rel=1e-12)
    assert float(layer_overhead_s(b)) == pytest.approx(linears / 4.0 * 1e-3, rel=1e-12)


def test_mla_counts_its_projections():
    mla = {**DENSE, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
           "qk_rope_head_dim": 64, "v_head_dim": 128}
    b = batch(mla)
    assert float(layer_linears(b)) == 7.0
    assert float(layer_linears(b.replace(q_lora_rank=np.array(0.0)))) == 6.0


def test_the_stage_averages_its_dense_and_moe_layers():
    # 4 MoE layers of 8 at ep 2: 2 + 1/2 x 9 + 1/2 x 2 = 7.5 linears; 8 layers x 7.5 / 4 x 0.1 ms
    b = batch({**MOE, "moe_layers": 4, "ffn": 2048}, ep=2, layer_overhead_s=1e-4)
    assert float(layer_linears(b)) == pytest.approx(7.5, rel=1e-12)
    assert float(micro_batch_parts(b)["overhead_s"]) == pytest.approx(8 * 7.5 / 4 * 1e-4,
                                                                      rel=1e-12)


def test_qwen3_30b_layer_at_the_catalog_scale():
    # 16 local experts: a layer and micro-batch pays 8.75 dense layers' fixed time; at 2 ms a
    # dense layer, 17.5 ms (the Megatron-Bridge 25.11 H100 row runs 24 such layers a stage)
    b = batch(QWEN3_30B, ep=8, layer_overhead_s=2e-3)
    assert float(layer_overhead_s(b)) == pytest.approx(17.5e-3, rel=1e-12)


# ---------------------------------------------------------------- training.moe_grouped_gemm

SINGLE = 1.0     # MOE_GROUPED_GEMM.index("single")


@pytest.mark.parametrize("model,ep,linears", [
    (DENSE, 1, 4.0), (MOE, 1, 5.0), (MOE, 2, 5.0), (QWEN3_30B, 8, 5.0),
    ({**QWEN3_30B, "shared_ffn": 512}, 8, 7.0)])
def test_one_grouped_kernel_counts_fc1_and_fc2_once(model, ep, linears):
    b = batch(model, ep=ep, layer_overhead_s=1e-3, moe_grouped_gemm=SINGLE)
    assert float(layer_linears(b)) == pytest.approx(linears, rel=1e-12)
    assert float(layer_overhead_s(b)) == pytest.approx(linears / 4.0 * 1e-3, rel=1e-12)


def test_single_in_a_stage_of_dense_and_moe_layers():
    # 4 MoE layers of 8: 2 + 1/2 x 3 + 1/2 x 2 = 4.5 linears; 8 layers x 4.5 / 4 x 0.1 ms
    b = batch({**MOE, "moe_layers": 4, "ffn": 2048}, ep=2, layer_overhead_s=1e-4,
              moe_grouped_gemm=SINGLE)
    assert float(layer_linears(b)) == pytest.approx(4.5, rel=1e-12)
    assert float(micro_batch_parts(b)["overhead_s"]) == pytest.approx(8 * 4.5 / 4 * 1e-4,
                                                                      rel=1e-12)
    # per expert (the default, code 0) the same stage pays 7.5
    assert float(layer_linears(b.replace(moe_grouped_gemm=0.0))) == pytest.approx(7.5)


ROW = {"case_id": "a", "model": "qwen3-30b-a3b", "hardware": "h100-sxm", "num_chips": 8,
       "tp": 1, "pp": 1, "ep": 8, "global_batch_seqs": 64, "seq_len": 4096,
       "precision": "bf16", "micro_batch_seqs": 1}


def test_the_case_column_and_the_field():
    """Qwen3-30B-A3B (48 MoE layers, 128 experts, GQA) at ep 8 on 8 H100s: blank = per_expert,
    35 linear layers a layer; single, 5. 8 micro-batches x 48 layers x layer_overhead_s x 35/4
    and x 5/4."""
    assert MOE_GROUPED_GEMM == train_fields.MOE_GROUPED_GEMM == ("per_expert", "single")
    assert train_fields.REGISTRY["training.moe_grouped_gemm"].default == "per_expert"
    cases = pd.DataFrame([ROW] + [{**ROW, "case_id": k, "training.moe_grouped_gemm": k}
                                  for k in MOE_GROUPED_GEMM])
    o = predict_train_frame(cases).set_index("case_id")["overhead_s"]
    fixed = 8 * 48 * float(tcat.train_parameters()["layer_overhead_s"])
    assert o["a"] == pytest.approx(fixed * 35 / 4, rel=1e-9)
    assert o["per_expert"] == pytest.approx(o["a"], rel=1e-12)
    assert o["single"] == pytest.approx(fixed * 5 / 4, rel=1e-9)
    with pytest.raises(InputError, match="training.moe_grouped_gemm"):
        predict_train_frame(pd.DataFrame([{**ROW, "training.moe_grouped_gemm": "grouped"}]))


def test_the_fit_pins_megatron_bridge_25_11_per_expert():
    """TE 2.9 (Megatron-Bridge 25.11's pin) runs one cuBLAS GEMM per local expert: the rule
    sets the MB2511 rows per_expert where blank and keeps a value a case gives."""
    c = pd.DataFrame({"source": ["MB2511", "MB2511", "NEMO2407"],
                      "citation": ["Megatron-Bridge @ commit 0a25f911b2ed"] * 2 + [""],
                      "model": ["qwen3-30b-a3b"] * 3,
                      "training.moe_grouped_gemm": [None, "single", None]})
    out = train_fit.apply_grouped_gemm_rules(c)["training.moe_grouped_gemm"].tolist()
    assert out[0] == "per_expert" and out[1] == "single" and pd.isna(out[2])
