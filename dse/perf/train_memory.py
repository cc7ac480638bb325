"""Peak device memory of one training chip: model state by ZeRO stage, activations by
recompute policy (Korthikanti et al. 2022, arXiv:2205.05198, section 4), buffers.

Model state per parameter held (bytes): bf16 weights 2 (+1 for an fp8 copy when the linear
layers run fp8/fp4), bf16 gradient buffers 2 (Megatron-Core's default: grad_reduce_in_fp32
off), Adam fp32 master weights + two moments 12. ZeRO stage 1 shards the optimizer over the
data-parallel group, 2 also the gradients, 3 also the weights (plus two layers' gathered
weights in flight).

Activations of one layer and micro-batch (bytes, ``sbh`` = micro-batch tokens x hidden; with
tensor parallelism ``t``; generalised from the paper's GPT block to GQA and gated MLPs)::

    attention: 2h (QKV input) + 2q (Q) + 4kv (K, V) + 2q (output-proj input) + h (dropout mask)
               [+ 5 n_h s per token: scores, softmax, dropout, when not flash attention]
    MLP:       2h (input) + 2 f (E - 1) (up outputs) + 2f (down input) + h (dropout mask)
    norms:     4h
    MHA, f = 4h, E = 2: 34 sbh + 5 a s^2 b, as in the paper's equation (1).
    sequence parallel: all of it / t;  no SP: 10 sbh stays whole, the rest / t  (eq. 2 and 4)
    selective recompute: the score term dropped;  full: only the layer input, 2 sbh (/t with SP),
    in the share ``recompute_layer_fraction`` of the layers (the others keep everything)

The first pipeline stage holds ``min(p, micro-batches)`` micro-batches in flight under 1F1B,
times ``1 + (p - 1) / (p v)`` when interleaved (the paper's section 4.2.3).

DualPipe (DeepSeek-V3, arXiv:2412.19437 Table 2 and section 3.2.2: "DualPipe requires keeping
two copies of the model parameters") runs the pipeline from both ends: rank i holds stage i and
stage p - 1 - i, so its parameters, their gradients and their optimizer state are those of two
stages (rank 0 both the embedding and the output layer), and it holds PP + 1 micro-batches'
activations.
"""

from __future__ import annotations

import numpy as np

from dse.perf.train_batch import TrainBatch

WEIGHT_BYTES = 2.0       # bf16 weights
FP8_COPY_BYTES = 1.0     # the low-precision copy of each weight the fp8/fp4 GEMMs read
GRAD_BYTES = 2.0         # bf16 gradient buffers (Megatron-Core DDP: grad_reduce_in_fp32 = False)
OPTIMIZER_BYTES = 12.0   # fp32 master weights + Adam's two moments
LOGITS_BYTES = 4.0       # fp32 logits of the last stage's micro-batch


def layer_params(b: TrainBatch) -> tuple[np.ndarray, np.ndarray]:
    """(dense parameters, expert parameters) of the transformer layers, whole model."""
    h = b.hidden_size
    q = b.heads * b.head_dim
    kv = b.kv_heads * b.head_dim
    nh = b.heads
    gqa = h * (q + 2.0 * kv) + q * h
    rq, rkv = b.q_lora_rank, b.kv_lora_rank
    dqk = b.qk_nope_head_dim + b.qk_rope_head_dim
    qp = np.where(rq > 0, rq * (h + nh * dqk), h * nh * dqk)
    mla = qp + rkv * (h + nh * (b.qk_nope_head_dim + b.v_head_dim)) + h * b.qk_rope_head_dim \
        + nh * b.v_head_dim * h
    attn = np.where(rkv > 0, mla, gqa) + 2.0 * h
    dense_layers = b.num_layers - b.moe_layers
    dense = (attn * b.num_layers + b.mlp_mats * h * b.ffn * dense_layers
             + (b.mlp_mats * h * b.shared_ffn + h * b.experts) * b.moe_layers)
    expert = b.experts * b.mlp_mats * h * b.expert_ffn * b.moe_layers
    return dense, expert


def state_bytes(b: TrainBatch) -> dict:
    """Weights, gradients and optimizer state of the most loaded stage (bytes)."""
    dense, expert = layer_params(b)
    emb = b.vocab * b.hidden_size
    # the first stage holds the embedding, the last the output layer (both when pp = 1,
    # once when tied); MTP modules sit on the last stage
    # DualPipe: two stages a rank (module docstring), the first and last on rank 0
    copies = np.where(b.schedule == 3, 2.0, 1.0)
    ends = np.where((b.pp > 1) & (copies < 2.0), 1.0, 2.0 - b.tied) * emb
    mtp = b.mtp_layers * (dense + expert) / np.maximum(b.num_layers, 1.0)
    dense_chip = (copies * dense / b.pp + ends + mtp * (b.moe_layers == 0)) / b.tp
    expert_chip = (copies * expert / b.pp + mtp * (b.moe_layers > 0)) / b.ep
    dp_dense = b.dp * b.cp
    dp_expert = b.tp * b.cp * b.dp / b.ep
    z = b.zero_stage
    per_w = WEIGHT_BYTES + FP8_COPY_BYTES * (b.operand_bytes < 2.0)
    shard = {k: (dense_chip / np.where(z >= lvl, dp_dense, 1.0)
                 + expert_chip / np.where(z >= lvl, dp_expert, 1.0)) for k, lvl in
             (("weights", 3), ("grads", 2), ("optimizer", 1))}
    gathered = np.where(z >= 3, 2.0 * (dense_chip + expert_chip)
                        / (copies * b.num_layers / b.pp), 0.0)
    return {"weights_bytes": shard["weights"] * per_w + gathered * WEIGHT_BYTES,
            "grads_bytes": shard["grads"] * GRAD_BYTES,
            "optimizer_bytes": shard["optimizer"] * OPTIMIZER_BYTES,
            "params_per_chip": dense_chip + expert_chip}


def layer_activation_bytes(b: TrainBatch, flash=1.0) -> np.ndarray:
    """Stored activations of one layer and one micro-batch on one chip (bytes), by the row's
    recompute policy and sequence parallelism (module docstring); ``flash``: 1 where the core
    attention keeps no score matrix (FlashAttention), 0 for the paper's 2022 kernels."""
    return _layer_activations(b, flash)[0]


def _layer_activations(b: TrainBatch, flash) -> tuple[np.ndarray, np.ndarray]:
    """(``layer_activation_bytes``, the same without recompute)."""
    h = b.hidden_size
    q = b.heads * b.head_dim
    kv = b.kv_heads * b.head_dim
    f = np.where(b.moe_layers > 0, b.expert_ffn * b.topk + b.shared_ffn, b.ffn)
    tokens = b.micro_batch_seqs * b.seq_len / b.cp
    t = b.tp
    whole = 10.0 * h                                   # norms, masks, QKV and MLP inputs
    split = 2.0 * q + 4.0 * kv + 2.0 * q + 2.0 * f * (b.mlp_mats - 1.0) + 2.0 * f   # the other 24h
    scores = 5.0 * b.heads * b.seq_len / b.cp * (1.0 - flash)
    sp = b.sequence_parallel > 0
    per_token = np.where(sp, (whole + split) / t, whole + split / t)
    r = b.recompute
    none = per_token + scores / t
    full = 2.0 * h / np.where(sp, t, 1.0)
    f = b.recompute_layer_fraction
    return (tokens * np.where(r == 2, f * full + (1.0 - f) * none,
                              np.where(r == 1, per_token, none)), tokens * none)


def in_flight(b: TrainBatch) -> np.ndarray:
    """Micro-batches whose activations the first pipeline stage holds at its peak."""
    p = b.pp
    m = b.micro_batches
    base = np.minimum(p, m)
    inter = 1.0 + (p - 1.0) / (p * b.vp)
    return np.where(b.schedule == 1, base * inter,
                    np.where(b.schedule == 3, np.minimum(p + 1.0, 2.0 * m), base))


def memory_bytes(b: TrainBatch, flash=1.0) -> dict:
    """Peak memory per chip and its parts (bytes): the stage with the most model state and
    activations (the first: most micro-batches in flight; the last adds the logits)."""
    st = state_bytes(b)
    layer, full_layer = _layer_activations(b, flash)    # (full_layer: the layer kept whole)
    stage_layers = b.num_layers / b.pp
    work = np.where(b.recompute == 2, full_layer, 0.0)     # the layer being recomputed
    act = layer * stage_layers * in_flight(b) + work
    tokens = b.micro_batch_seqs * b.seq_len / b.cp
    logits = LOGITS_BYTES * 2.0 * tokens * b.vocab / b.tp
    act = np.maximum(act, layer * stage_layers + work + logits)
    model = st["weights_bytes"] + st["grads_bytes"] + st["optimizer_bytes"]
    buffers = b.reserve_bytes + b.fragmentation_fraction * (model + act)
    return {**st, "activations_bytes": act, "buffers_bytes": buffers,
            "memory_per_chip_bytes": model + act + buffers}
