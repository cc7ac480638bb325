"""The training model's memory terms the mutation check found unpinned (issue 25, point 7),
hand-worked on the small designs of test_train_physics: MLA's parameter count, and the model
state and activations of the stage that holds the most."""

from __future__ import annotations

import pytest
from test_train_physics import MOE, batch

from dse.perf.train_memory import layer_params

MLA = {**MOE, "heads": 16, "kv_heads": 16, "head_dim": 192, "q_lora_rank": 512,
       "kv_lora_rank": 256, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}


def test_mla_parameters_by_hand():
    """DeepSeek-style MLA, per layer: the query down and up projections r_q (h + n_h (d_nope +
    d_rope)) = 512 x (1024 + 16 x 192); the KV down projection r_kv h + its RoPE key h d_rope
    and up projection r_kv n_h (d_nope + d_v) = 256 x (1024 + 16 x 256) + 1024 x 64; the
    output n_h d_v h = 16 x 128 x 1024; two norms 2h. MoE: 8 experts x 3 x 1024 x 512 and a
    router 1024 x 8 per layer."""
    attn = 512 * (1024 + 16 * 192) + 256 * (1024 + 16 * 256) + 1024 * 64 + 16 * 128 * 1024 \
        + 2 * 1024
    assert attn == 5_572_608
    dense, expert = layer_params(batch(MLA))
    assert float(dense) == pytest.approx(8 * (attn + 1024 * 8), rel=1e-12)
    assert float(expert) == pytest.approx(8 * 8 * 3 * 1024 * 512, rel=1e-12)
    # without a query LoRA the query is one h x n_h (d_nope + d_rope) projection
    dense, _ = layer_params(batch({**MLA, "q_lora_rank": 0}))
    assert float(dense) == pytest.approx(
        8 * (attn - 512 * (1024 + 16 * 192) + 1024 * 16 * 192 + 1024 * 8), rel=1e-12)


def test_mixed_dense_and_moe_layers_parameters():
    """4 MoE layers of 8, the others dense (f = 2048, SwiGLU); each MoE layer has a shared
    expert (SwiGLU, 256 wide) and a router; GQA attention h (q + 2 kv) + q h + 2h."""
    h = 1024
    b = batch({**MOE, "moe_layers": 4, "ffn": 2048, "shared_ffn": 256})
    attn = h * (1024 + 2 * 256) + 1024 * h + 2 * h
    dense, expert = layer_params(b)
    assert float(dense) == pytest.approx(8 * attn + 4 * 3 * h * 2048 + 4 * (3 * h * 256 + h * 8),
                                         rel=1e-12)
    assert float(expert) == pytest.approx(4 * 8 * 3 * h * 512, rel=1e-12)


def test_embeddings_sit_on_the_end_stages_and_mtp_on_the_last():
    """The most loaded stage's parameters: with pp = 1 the embedding and the output layer
    (once when tied); with pp > 1 one of them (the first stage's embedding, the last's output);
    an MTP module is one more layer on the last stage (a dense layer's parameters for a dense
    model; for an MoE model it shards with the experts, over ep)."""
    from dse.perf.train_memory import state_bytes
    h, V = 1024, 32000
    layer = 4 * h * h + 2 * h + 2 * h * 4096
    def n(b):
        return float(state_bytes(b)["params_per_chip"])
    assert n(batch()) == pytest.approx(8 * layer + 2 * V * h)
    assert n(batch(tied=1)) == pytest.approx(8 * layer + V * h)
    assert n(batch(pp=2)) == pytest.approx(4 * layer + V * h)
    assert n(batch(pp=2, tied=1)) == pytest.approx(4 * layer + V * h)
    assert n(batch(pp=2, mtp_layers=1)) == pytest.approx(5 * layer + V * h)
    assert n(batch(pp=2, tp=2, mtp_layers=1)) == pytest.approx((5 * layer + V * h) / 2)
    m = batch(MOE, pp=2, ep=4, mtp_layers=1)
    dense, expert = (float(x) for x in layer_params(m))
    assert n(m) == pytest.approx(dense / 2 + V * h + (expert / 2 + (dense + expert) / 8) / 4)


def test_expert_state_per_zero_stage_and_context_parallel_sharding():
    """ZeRO shards the dense parameters' state over dp x cp and the experts' over their own
    data-parallel group, tp x cp x dp / ep (here 2 x 2 x 4 / 4 = 4): stage 1 the optimizer,
    2 also the gradients, 3 also the weights, plus two layers' gathered weights in flight."""
    from dse.perf.train_memory import state_bytes
    b = batch(MOE, tp=2, cp=2, dp=4, ep=4, pp=2)
    dense, expert = (float(x) for x in layer_params(b))
    d = (dense / 2 + 32000 * 1024) / 2               # a stage's dense share, split tp ways
    e = expert / 2 / 4                               # a stage's experts, split ep ways
    zd, ze = 2 * 4, 2 * 2 * 4 / 4                    # dp x cp; tp x cp x dp / ep
    per = {z: state_bytes(b.replace(zero_stage=z)) for z in range(4)}
    for z, st in per.items():
        def shard(lvl, z=z):
            return d / (zd if z >= lvl else 1) + e / (ze if z >= lvl else 1)
        gathered = 2 * (d + e) / 4 if z == 3 else 0.0          # 2 of the stage's 4 layers
        assert float(st["optimizer_bytes"]) == pytest.approx(12 * shard(1), rel=1e-12)
        assert float(st["grads_bytes"]) == pytest.approx(2 * shard(2), rel=1e-12)
        assert float(st["weights_bytes"]) == pytest.approx(2 * shard(3) + 2 * gathered,
                                                           rel=1e-12)


def test_moe_layer_activations_by_hand():
    """Korthikanti's per-token bytes generalised (train_memory docstring): 10h kept whole
    without sequence parallelism; split tp ways: 2q + 4kv + 2q + 2 f (E - 1) + 2f with f =
    top-k x expert width + shared width = 2 x 512 + 256 (GQA: q 1024, kv 256, SwiGLU E = 3);
    2 sequences of 2048 split cp = 2 ways."""
    from dse.perf.train_memory import layer_activation_bytes
    b = batch({**MOE, "shared_ffn": 256}, tp=2, cp=2, micro_batch_seqs=2)
    f = 2 * 512 + 256
    split = 2 * 1024 + 4 * 256 + 2 * 1024 + 2 * f * 2 + 2 * f
    assert split == 12800
    tokens = 2 * 2048 / 2
    assert float(layer_activation_bytes(b)) == pytest.approx(tokens * (10 * 1024 + split / 2),
                                                             rel=1e-12)
    sp = b.replace(sequence_parallel=1)
    assert float(layer_activation_bytes(sp)) == pytest.approx(tokens * (10 * 1024 + split) / 2,
                                                              rel=1e-12)


def test_score_matrix_of_2022_kernels_splits_with_context_parallelism():
    # the paper's 5 a s^2 b / t per layer; a cp rank scores its s / cp queries against one
    # s / cp chunk of keys at a time (ring attention): 5 x 16 heads x 1024 x 1024 / tp 2
    from dse.perf.train_memory import layer_activation_bytes
    b = batch(cp=2, tp=2, sequence_parallel=1)
    tokens = 1024
    with_scores = float(layer_activation_bytes(b, flash=0.0))
    assert with_scores - float(layer_activation_bytes(b)) == pytest.approx(
        tokens * 5 * 16 * 1024 / 2, rel=1e-12)


def activations(**over):
    from dse.perf.train_memory import layer_activation_bytes, memory_bytes
    b = batch(tp=2, sequence_parallel=1, **over)
    return float(layer_activation_bytes(b)), float(memory_bytes(b)["activations_bytes"])


def test_in_flight_micro_batches_by_schedule():
    """The first stage of pp = 4 holds min(p, m) micro-batches' activations under 1F1B and zero
    bubble, DualPipe min(p + 1, 2m) (its two directions; DeepSeek-V3 Table 2: PP + 1)."""
    v = 1000                                        # a small vocabulary: the first stage peaks
    one, m16 = activations(pp=4, global_batch_seqs=16, vocab=v)
    assert m16 == pytest.approx(one * 2 * 4, rel=1e-12)           # 2 layers a stage x 4
    _, m2 = activations(pp=4, global_batch_seqs=2, vocab=v)
    assert m2 == pytest.approx(one * 2 * 2, rel=1e-12)
    _, dual = activations(pp=4, global_batch_seqs=16, vocab=v, schedule=3)
    assert dual == pytest.approx(one * 2 * 5, rel=1e-12)
    _, dual2 = activations(pp=4, global_batch_seqs=2, vocab=v, schedule=3)
    assert dual2 == pytest.approx(one * 2 * 4, rel=1e-12)
    _, zb = activations(pp=4, global_batch_seqs=16, vocab=v, schedule=2)
    assert zb == pytest.approx(one * 2 * 4, rel=1e-12)


def test_the_last_stage_adds_the_fp32_logits_and_their_gradient():
    """The last stage holds one micro-batch in flight but also its logits and their gradient in
    fp32 (4 + 4 bytes x 2048 tokens x 32000 / tp 2 = 262 MB): with pp = 1 always, with pp = 4
    when they outweigh the first stage's extra micro-batches."""
    one, act = activations()
    logits = 2 * 4 * 2048 * 32000 / 2
    assert act == pytest.approx(8 * one + logits, rel=1e-12)
    one, act = activations(pp=4, global_batch_seqs=16)
    assert logits > 2 * 3 * one                          # the last stage is the peak here
    assert act == pytest.approx(2 * one + logits, rel=1e-12)
    _, act = activations(pp=4, global_batch_seqs=16, cp=2)
    assert act == pytest.approx(2 * one / 2 + logits / 2, rel=1e-12)
    two, act = activations(pp=4, global_batch_seqs=16, micro_batch_seqs=2)
    assert act == pytest.approx(2 * two + 2 * logits, rel=1e-12)


def test_full_recompute_holds_one_layer_being_recomputed():
    """Full recompute keeps each layer's input (2 sbh / t) and, while one layer's forward is
    rerun, that layer's whole activations."""
    v = 1000
    whole, _ = activations(pp=4, global_batch_seqs=16, vocab=v)
    kept, act = activations(pp=4, global_batch_seqs=16, vocab=v, recompute=2)
    assert kept == pytest.approx(2048 * 2 * 1024 / 2, rel=1e-12)
    assert act == pytest.approx(kept * 2 * 4 + whole, rel=1e-12)
    # pp = 1: the last stage, with its logits, holds the working layer too
    whole, _ = activations()
    kept, act = activations(recompute=2)
    assert act == pytest.approx(kept * 8 + whole + 2 * 4 * 2048 * 32000 / 2, rel=1e-12)
