"""The shapes of a training layer's GEMMs, hand-worked at pure roofline on the small designs of
test_train_physics (a GEMM of ``2 m n k`` FLOPs takes ``2 m n k / peak``), where the mutation
check found them unpinned (issue 25, point 7): a gated dense MLP's up projection (gate and up,
``(E - 1) f`` wide), the shared experts and the router of an MoE layer, each split over tp."""

from __future__ import annotations

import pytest
from test_train_physics import DENSE, MOE, PEAK, batch

from dse.perf.train_time import layer_gemms_s, moe_layer_s


@pytest.mark.parametrize("tp", [1, 2])
def test_gated_dense_mlp_gemms(tp):
    # SwiGLU, f = 4096: up + gate 2048 x 1024 -> 2 x 4096, down 2048 x 4096 -> 1024, split tp
    b = batch({**DENSE, "mlp_mats": 3}, tp=tp)
    fwd, bwd = layer_gemms_s(b)["dense_mlp"]
    flops = 2 * 2048 * 1024 * (2 * 4096 + 4096) / tp
    assert float(fwd) * PEAK == pytest.approx(flops, rel=1e-12)
    assert float(bwd) == pytest.approx(2 * float(fwd), rel=1e-12)
    # non-gated (E = 2): one up projection
    fwd2, _ = layer_gemms_s(b.replace(mlp_mats=2))["dense_mlp"]
    assert float(fwd2) * PEAK == pytest.approx(2 * 2048 * 1024 * 2 * 4096 / tp, rel=1e-12)


def test_moe_layer_shared_experts_and_router():
    """tp = ep = 2, 2048 tokens a chip: the routed experts run the ep group's 4096 tokens,
    top-2 of 8 experts, 4096 rows on the chip's 4 experts (2 x 3 x 4096 x 512 x 1024 FLOPs);
    the shared expert (SwiGLU, 1024 wide) is split tp ways (2 x 2048 x 3 x 512 x 1024); the
    router (1024 -> 8) is not split."""
    b = batch({**MOE, "shared_ffn": 1024}, tp=2, ep=2)
    fwd, bwd = moe_layer_s(b, 2048.0)
    experts = 2 * 3 * 4096 * 512 * 1024
    shared = 2 * 2048 * 3 * 512 * 1024
    router = 2 * 2048 * 8 * 1024
    assert float(fwd) * PEAK == pytest.approx(experts + shared + router, rel=1e-12)
    assert float(bwd) * PEAK == pytest.approx(2 * (experts + shared + router), rel=1e-12)
    # without shared experts only the routed experts and the router remain
    none, _ = moe_layer_s(b.replace(shared_ffn=0), 2048.0)
    assert float(none) * PEAK == pytest.approx(experts + router, rel=1e-12)
    # a dense layer's batch (no MoE layers) pays nothing here
    assert float(moe_layer_s(b.replace(moe_layers=0), 2048.0)[0]) == 0.0


# ------------------------------------------------------------------- HBM-bound passes

@pytest.mark.parametrize("sp", [0, 1])
def test_elementwise_traffic_of_an_moe_layer_with_shared_experts(sp):
    """Per token: norms and residual adds 20h, RoPE 4 (q + kv), the MLP activation 2 E f with
    f = top-k x expert width + shared width = 2 x 512 + 256; tp = 2 splits the inside of the
    tensor-parallel region, sequence parallelism also the outside; at 0.8 of 2 TB/s."""
    from dse.perf.train_time import elementwise_s
    b = batch({**MOE, "shared_ffn": 256}, tp=2, sequence_parallel=sp, hbm_fraction=0.8)
    outside = 20 * 1024
    inside = 4 * (1024 + 256) + 2 * 3 * (2 * 512 + 256)
    per_token = (outside / 2 if sp else outside) + inside / 2
    assert float(elementwise_s(b)) == pytest.approx(2048 * per_token / (2e12 * 0.8), rel=1e-12)


def test_loss_and_chunk_sort_at_the_fitted_hbm_fraction():
    # the loss: 2048 tokens x 32000 / tp 2 logits x 16 bytes at 0.8 x 2 TB/s
    from dse.perf.train_time import loss_s, moe_sort_s
    b = batch(tp=2, hbm_fraction=0.8)
    assert float(loss_s(b)) == pytest.approx(2048 * 16000 * 16 / (2e12 * 0.8), rel=1e-12)
    # the permutation passes with sequence parallelism: each tp rank permutes, sorts, sorts
    # back and unpermutes its 1024 tokens x top-2 rows (4 passes x 2 x 2 bytes x 1024)
    m = batch(MOE, tp=2, ep=4, sequence_parallel=1, hbm_fraction=0.8)
    assert float(moe_sort_s(m)) == pytest.approx(2048 * 4 * 2 * 2 * 1024 / (2e12 * 0.8),
                                                 rel=1e-12)


def test_elementwise_traffic_of_a_dense_layer():
    # MHA, GELU MLP f = 4h: 20h + 4 (q + kv) + 2 x 2 x 4h per token, tp 1
    from dse.perf.train_time import elementwise_s
    per_token = 20 * 1024 + 4 * 2048 + 2 * 2 * 4096
    assert float(elementwise_s(batch())) == pytest.approx(2048 * per_token / 2e12, rel=1e-12)


@pytest.mark.parametrize("q_lora", [512, 0])
def test_mla_projections_split_over_tp(q_lora):
    """MLA at tp = 2: the down projections (h -> r_kv + d_rope, h -> r_q) are replicated, the
    up projections (r_kv -> n_h (d_nope + d_v), r_q -> n_h (d_nope + d_rope)) and the output
    (n_h d_v -> h) split their heads; without a query LoRA the query is h -> n_h (d_nope +
    d_rope), split."""
    from test_train_terms_memory import MLA
    b = batch({**MLA, "q_lora_rank": q_lora}, tp=2)
    h, nh, rkv, dqk, dv = 1024, 16, 256, 192, 128
    per_token = h * (rkv + 64) + rkv * nh * (128 + dv) / 2 + nh * dv / 2 * h
    per_token += h * q_lora + q_lora * nh * dqk / 2 if q_lora else h * nh * dqk / 2
    fwd, bwd = layer_gemms_s(b)["attn"]
    assert float(fwd) * PEAK == pytest.approx(2 * 2048 * per_token, rel=1e-12)
    assert float(bwd) == pytest.approx(2 * float(fwd), rel=1e-12)


def test_a_batch_mixing_gqa_and_mla_rows_scores_each_as_alone():
    """``dse predict --train`` scores every case in one batch: a GQA row next to an MLA row
    keeps its GQA projections and attention core (the MLA terms apply where kv_lora_rank > 0)."""
    import numpy as np
    from test_train_terms_memory import MLA

    from dse.perf.train_time import attention_core_s
    # row 0 the dense GQA model (no MLA fields: 0), row 1 the MLA MoE model
    both = batch({k: np.array([DENSE.get(k, 0), MLA[k]], float) for k in MLA})
    gqa, mla = batch(DENSE), batch(MLA)
    g = layer_gemms_s(both)["attn"][0]
    assert float(g[0]) == pytest.approx(float(layer_gemms_s(gqa)["attn"][0]), rel=1e-12)
    assert float(g[1]) == pytest.approx(float(layer_gemms_s(mla)["attn"][0]), rel=1e-12)
    a = attention_core_s(both)
    assert float(a[0]) == pytest.approx(float(attention_core_s(gqa)), rel=1e-12)
    assert float(a[1]) == pytest.approx(float(attention_core_s(mla)), rel=1e-12)


def test_expert_dispatch_and_sort_without_sequence_parallelism():
    """Without sequence parallelism every tp rank dispatches and sorts the micro-batch's whole
    2048 tokens; with it, its 1024: the permutation passes move 2048 x top-2 rows of
    4 x 2 x 2 x 1024 bytes, the all-to-all (every token to every rank: top-k = experts = 16, ep = 8 inside the
    domain) 7 copies of each token each way."""
    from dse.perf.train_time import ep_comm_s, moe_sort_s
    b = batch(MOE, tp=2, ep=4, dp=2, sequence_parallel=0)
    assert float(moe_sort_s(b)) == pytest.approx(4096 * 4 * 2 * 2 * 1024 / 2e12, rel=1e-12)
    assert float(moe_sort_s(b.replace(sequence_parallel=1))) == pytest.approx(
        float(moe_sort_s(b)) / 2, rel=1e-12)
    a2a = batch({**MOE, "experts": 16, "topk": 16}, tp=2, ep=8, dp=4, global_batch_seqs=8)
    row = 2048 * 1024 * 2
    assert float(ep_comm_s(a2a)) == pytest.approx(2 * 7 * row / 400e9, rel=1e-12)
    assert float(ep_comm_s(a2a.replace(sequence_parallel=1))) == pytest.approx(
        7 * row / 400e9, rel=1e-12)
