"""Hand-worked values of the training terms tests/MUTATION_TRAIN_OPERATORS.md found no test
pinning: the tensor-parallel collectives under ``tp_comm_overlap`` backward, context
parallelism's non-ring exchanges (their links, kernel fraction and latency, what blocks, the
all-gather across domains), the unfused attention core's efficiency and HBM rate, the
elementwise recompute's HBM rate, the fp8 casts of a dense layer, a mixed GQA + MLA batch's
projections, the routed experts' touched experts at few tokens, and DualPipe's two expert
stages. The small models of test_train_physics (pure roofline kernels: fraction 1, no latency;
1e15 FLOP/s, 2 TB/s HBM, 400 GB/s scale-up, 50 GB/s NIC, 8 chips a domain); dense: h 1024, 8
layers, 16 heads of 64 (MHA), ffn 4096 not gated; seq_len 2048."""

from __future__ import annotations

import pytest
from test_train_physics import HBM, MOE, PEAK, batch

from dse.perf.train_memory import layer_params, state_bytes
from dse.perf.train_step import dp_comm_s, micro_batch_parts, tp_exposed_s
from dse.perf.train_time import (
    attention_gemms_s,
    cp_comm_s,
    cp_layer_s,
    elementwise_s,
    moe_experts_s,
    recompute_elementwise_s,
    unfused_attention_s,
)

UP, OUT = 400e9, 50e9


def test_tp_comm_overlap_backward_hides_only_the_backward():
    """``backward``: the forward's collectives (and a recomputed forward's, ``full`` of them)
    are exposed whole; the backward's hide under the backward GEMMs. One collective of 1 s
    under 0.25 s of backward GEMMs at overlap 1: 1 + (1 - 0.25) = 1.75 s; with a full
    recompute 2 + 0.75 = 2.75 s; at overlap 0.5 half the hidden 0.25 s shows: 1.875 s."""
    b = batch(tp_comm_overlap=1)
    assert float(tp_exposed_s(1.0, 10.0, 0.25, 0.0, b)) == pytest.approx(1.75, rel=1e-12)
    assert float(tp_exposed_s(1.0, 10.0, 0.25, 1.0, b)) == pytest.approx(2.75, rel=1e-12)
    half = b.replace(overlap_fraction=0.5)
    assert float(tp_exposed_s(1.0, 10.0, 0.25, 0.0, half)) == pytest.approx(1.875, rel=1e-12)
    # ``all`` hides the three (2 + full) under both windows: 3 - 3 = 0 exposed at 10 s
    assert float(tp_exposed_s(1.0, 10.0, 0.25, 1.0, b.replace(tp_comm_overlap=0))) == 0.0
    assert float(tp_exposed_s(1.0, 10.0, 0.25, 1.0, b.replace(tp_comm_overlap=2))) == 3.0


def test_a2a_on_one_domain_pays_the_kernel_fraction_and_latency():
    """tp 2, cp 4 (one domain): 4 all-to-alls of 3 peers x 131,072 bytes (512 tokens x 8 heads
    x 64 x 2 bytes / 4), at the all-reduce kernel's fraction 0.5 and 10 us latency each."""
    b = batch(cp=4, tp=2, global_batch_seqs=1, cp_comm_type=1,
              kernel={"ar_nccl_fraction": 0.5, "ar_nccl_latency_s": 1e-5})
    per_peer = 512 * 8 * 64 * 2 / 4
    one = 3 * per_peer / (UP * 0.5) + 1e-5
    assert float(cp_comm_s(b)) == pytest.approx(4 * one, rel=1e-12)


def test_cp_peers_in_the_domain_are_only_the_group():
    """tp 1, cp 2: the domain holds 8 chips but the group only 2, so a chip has one peer, over
    the scale-up links: 4 all-to-alls of 1,024 tokens x 16 heads x 64 x 2 bytes / 2."""
    b = batch(cp=2, tp=1, global_batch_seqs=1, cp_comm_type=1)
    per_peer = 1024 * 16 * 64 * 2 / 2
    assert float(cp_comm_s(b)) == pytest.approx(4 * per_peer / UP, rel=1e-12)


def test_all_gather_across_domains_is_paced_by_the_nic():
    """tp 4, cp 4: 2 cp ranks a domain. all_gather: K and V each gathered, 262,144 bytes (512
    tokens x 4 heads x 64 x 2) from 1 peer over the scale-up links and 2 over the NIC, which
    sets the pace: 2 x 2 x 262,144 / 50 GB/s. The ring sends its 524,288-byte K/V chunk 3 hops
    over a span of 16 chips (past the domain: the NIC): 3 x 524,288 / 50 GB/s."""
    b = batch(cp=4, tp=4, global_batch_seqs=1, cp_comm_type=2)
    kv = 512 * 4 * 64 * 2
    assert float(cp_comm_s(b)) == pytest.approx(2 * 2 * kv / OUT, rel=1e-12)
    assert float(cp_comm_s(b.replace(cp_comm_type=0))) == pytest.approx(3 * 2 * kv / OUT,
                                                                       rel=1e-12)


def test_a2a_at_cp_1_costs_nothing_even_with_a_latency():
    b = batch(cp=1, cp_comm_type=1, kernel={"ar_nccl_latency_s": 1e-5})
    ring, blocking = cp_layer_s(b)
    assert float(ring) == 0.0 and float(blocking) == 0.0


def test_a2a_blocking_seconds_count_in_the_network_total():
    """tp 1, cp 4, a2a: per layer 4 all-to-alls of 3 x 262,144 bytes (512 tokens x 16 heads x
    64 x 2 / 4) forward; the backward twice that plus one O: 27 x 262,144 / 400 GB/s a layer,
    nothing under the attention core; 8 layers, no other collective."""
    b = batch(cp=4, tp=1, global_batch_seqs=1, cp_comm_type=1)
    per_peer = 512 * 16 * 64 * 2 / 4
    parts = micro_batch_parts(b)
    assert float(parts["network_total_s"]) == pytest.approx(8 * 27 * per_peer / UP, rel=1e-12)
    assert float(parts["network_exposed_s"]) == pytest.approx(8 * 27 * per_peer / UP,
                                                              rel=1e-12)


def test_unfused_attention_at_the_efficiency_scale_and_hbm_fraction():
    """Megatron's unfused core attention, 16 heads x 2,048 queries x 2,048 keys x 64: Q K^T and
    P V are each 2 x 32,768 x 2,048 x 64 FLOPs at the GEMM fraction (0.8) times
    compute_fraction_scale (0.5); the softmax and dropout stream 9 (forward) and 11
    (backward) bytes a score at the HBM rate times hbm_fraction (0.5); the backward runs 4
    GEMMs."""
    b = batch(compute_fraction_scale=0.5, hbm_fraction=0.5, kernel={"gemm_fraction": 0.8})
    rows, keys, d = 16 * 2048, 2048, 64
    gemm = 2 * rows * keys * d / (PEAK * 0.8 * 0.5)
    stream = rows * keys / (HBM * 0.5)
    fwd, bwd = unfused_attention_s(b)
    assert float(fwd) == pytest.approx(2 * gemm + 9 * stream, rel=1e-9)
    assert float(bwd) == pytest.approx(4 * gemm + 11 * stream, rel=1e-9)


def test_norm_recompute_streams_at_the_hbm_fraction():
    """recompute_norms: the two pre-norms' forward, 8 h bytes a token (2 x 2 bytes in and out
    of a norm), 2,048 tokens, at 2 TB/s x 0.5."""
    b = batch(recompute_norms=1, hbm_fraction=0.5)
    assert float(recompute_elementwise_s(b)) == pytest.approx(
        2048 * 8 * 1024 / (HBM * 0.5), rel=1e-12)


def test_fp8_casts_of_a_dense_layer():
    """fp8 (1-byte operands): every GEMM input is cast, 1 byte an element: the QKV input (h),
    the MLP input (h), the output projection's input (q = 1,024) and the MLP down
    projection's (ffn 4,096) a token, 2,048 tokens at 2 TB/s, on top of bf16's passes."""
    h, q, f = 1024, 1024, 4096
    bf16 = float(elementwise_s(batch()))
    fp8 = float(elementwise_s(batch(precision=2)))
    assert fp8 - bf16 == pytest.approx(2048 * (h + h + q + f) / HBM, rel=1e-9)


def test_a_mixed_gqa_and_mla_batch_keeps_the_gqa_rows_projections():
    """Row 0 the dense MHA model at tp 2 (QKV h -> 3,072 / 2, output 1,024 / 2 -> h), row 1 an
    MLA model: scored together, the MHA row's projections are still 2 t (1,536 x 1,024 +
    1,024 x 512) FLOPs forward, twice that backward, at 1e15 FLOP/s."""
    mla = {"kv_lora_rank": [0, 512], "q_lora_rank": [0, 384], "qk_nope_head_dim": [0, 64],
           "qk_rope_head_dim": [0, 32], "v_head_dim": [0, 64]}
    b = batch(tp=[2, 2], **mla)
    t = 2048
    fwd, bwd = attention_gemms_s(b, t)
    flops = 2 * t * (1536 * 1024 + 1024 * 512)
    assert fwd[0] == pytest.approx(flops / PEAK, rel=1e-12)
    assert bwd[0] == pytest.approx(2 * flops / PEAK, rel=1e-12)


def test_routed_experts_at_few_tokens_read_only_the_touched_experts():
    """64 experts, top 2, ep 8 (8 a chip), 16 tokens a chip, tp 2 with sequence parallelism:
    a chip's 8 tokens dispatched, 64 tokens over the EP group. The experts those 64 tokens
    touch on a chip, 8 (1 - (1 - 2/64)^64), are read whole (3 x 1,024 x 512 bf16 weights each)
    at 2 TB/s; their 16 rows' FLOPs are negligible at 1e15."""
    b = batch(MOE, experts=64, ep=8, dp=8, tp=2, sequence_parallel=1, seq_len=16,
              kernel={"moe_hbm_fraction": 1.0})
    touched = 8 * (1 - (1 - 2 / 64) ** 64)
    weights = touched * 3 * 1024 * 512 * 2 / HBM
    assert float(moe_experts_s(b)) == pytest.approx(weights, rel=1e-9)
    # without sequence parallelism each tp rank dispatches all 16 tokens: 128 over the group
    b = b.replace(sequence_parallel=0)
    touched = 8 * (1 - (1 - 2 / 64) ** 128)
    assert float(moe_experts_s(b)) == pytest.approx(touched * 3 * 1024 * 512 * 2 / HBM,
                                                    rel=1e-9)


def test_dualpipe_holds_two_stages_of_experts():
    """DualPipe, pp 2: each rank holds two stages, so 2 x (8 layers / 2) of the dense part and
    of the 8 x 3 x 1,024 x 512 x 8 expert weights (over ep 2), and rank 0 both ends'
    embeddings (32,000 x 1,024 each)."""
    b = batch(MOE, pp=2, ep=2, dp=2, schedule=3)
    dense, expert = layer_params(b)
    assert float(expert) == 8 * 3 * 1024 * 512 * 8
    emb = 32000 * 1024
    expect = 2 * float(dense) / 2 + 2 * emb + 2 * 8 * 3 * 1024 * 512 * 8 / 2 / 2
    assert float(state_bytes(b)["params_per_chip"]) == pytest.approx(expect, rel=1e-12)



def test_zero3_dualpipe_gathers_one_layer_of_its_two_stages():
    """ZeRO-3 gathers one layer's weights (bf16) before each layer runs, twice buffered: 2 x
    (the chip's parameters) / (the layers it holds). DualPipe, pp 2: 2 stages of 4 layers a
    rank, so 8 layers share the chip's parameters."""
    b = batch(pp=2, dp=2, schedule=3, zero_stage=3)
    s = state_bytes(b)
    params = float(s["params_per_chip"])
    dense, _ = layer_params(b)
    assert params == pytest.approx(2 * float(dense) / 2 + 2 * 32000 * 1024, rel=1e-12)
    sharded = params / 2 * 2.0                    # bf16 weights sharded over dp 2
    assert float(s["weights_bytes"]) == pytest.approx(sharded + 2.0 * 2 * params / 8,
                                                      rel=1e-12)


def test_mla_a2a_moves_its_own_head_dimensions():
    """MLA (16 heads, q/k 64 + 32 rope, v 64), tp 2, cp 2 (one domain): a chip's 1,024 tokens
    x 8 heads carry Q of 96, K of 96 and V of 64 (the K/V tensor the mean, 80), O of 64 a
    head, bf16; a2a sends half of Q, K, V and O to its one peer."""
    mla = {"kv_lora_rank": 512, "q_lora_rank": 384, "qk_nope_head_dim": 64,
           "qk_rope_head_dim": 32, "v_head_dim": 64}
    b = batch(tp=2, cp=2, global_batch_seqs=1, cp_comm_type=1, **mla)
    t = 1024 * 2 * 8
    assert float(cp_comm_s(b)) == pytest.approx(t * (96 + 2 * 80 + 64) / 2 / UP, rel=1e-12)


def test_cp_across_domains_when_tp_fills_the_domain():
    """tp 8 = the domain, cp 2: the cp peer sits in the next domain: 4 all-to-alls of 1,024
    tokens x 2 heads x 64 x 2 bytes / 2 over the NIC."""
    b = batch(tp=8, cp=2, global_batch_seqs=1, cp_comm_type=1)
    per_peer = 1024 * 2 * 64 * 2 / 2
    assert float(cp_comm_s(b)) == pytest.approx(4 * per_peer / OUT, rel=1e-12)


def test_cp_all_gather_with_more_tp_ranks_than_key_value_heads():
    """The MoE model's 4 key/value heads over tp 16: each rank holds one (replicated); tp 16
    spans two domains, so the cp peer is across the NIC: K and V each 1,024 tokens x 1 head x
    64 x 2 bytes, gathered from one peer."""
    b = batch(MOE, tp=16, cp=2, global_batch_seqs=1, cp_comm_type=2)
    kv = 1024 * 1 * 64 * 2
    assert float(cp_comm_s(b)) == pytest.approx(2 * kv / OUT, rel=1e-12)


def test_data_parallel_ranks_farther_apart_than_a_domain_each_sit_alone():
    """tp 16: the data-parallel group's 2 ranks sit 16 chips apart, each alone in its domain of
    8 (one rank a domain, not 0): the all-reduce of the 2 n bytes of bf16 gradients is all
    scale-out, 2 (2 - 1) / 2 of the buffer a byte at 50 GB/s (roofline kernel: no latency)."""
    n = 1e9
    step, _ = dp_comm_s(batch(tp=16, dp=2, zero_stage=1), n)
    assert float(step) == pytest.approx(2 * n / OUT, rel=1e-12)


def test_cp_ranks_in_a_domain_are_whole_tp_groups():
    """A 72-chip domain (NVL72) at tp 16 holds 4 whole tp groups (72 / 16 = 4.5): of cp 8,
    4 ranks share a domain. all_gather of the MoE model's K and V (4 key/value heads over tp
    16: one a rank) of 256 tokens x 64 x 2 bytes: 3 peers over the scale-up links, 4 over the
    NIC, which sets the pace."""
    b = batch(MOE, tp=16, cp=8, global_batch_seqs=1, cp_comm_type=2, domain_chips=72)
    kv = 256 * 1 * 64 * 2
    assert 4 * kv / OUT > 3 * kv / UP
    assert float(cp_comm_s(b)) == pytest.approx(2 * 4 * kv / OUT, rel=1e-12)


def test_data_parallel_ranks_in_a_domain_are_whole():
    """tp 16 on a 72-chip domain (NVL72): the data-parallel ranks sit 16 apart, 4 of them in a
    domain (72 / 16 = 4.5, whole ranks only); dp 8 spans 2 domains: a ring of 4 inside,
    2 x 3 / 4 of the buffer a byte on the scale-up links, and 2 (2 - 1) / 2 / 4 of it on the
    NICs (roofline kernel: no latency, fraction 1)."""
    n = 1e9
    step, _ = dp_comm_s(batch(tp=16, dp=8, zero_stage=1, domain_chips=72), n)
    per_byte = 2 * 3 / 4 / UP + 2 * 1 / 2 / 4 / OUT
    assert float(step) == pytest.approx(per_byte * 2 * n, rel=1e-12)
