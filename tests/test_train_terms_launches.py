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
"""

from __future__ import annotations

import numpy as np
import pytest
from test_train_physics import DENSE, MOE, batch

from dse.perf.train_step import micro_batch_parts
from dse.perf.train_time import DENSE_LAYER_LINEARS, layer_linears, layer_overhead_s

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
