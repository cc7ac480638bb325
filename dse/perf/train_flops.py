"""FLOPs of one training step in the one convention of contracts/train-cases.md: Megatron-LM's
``num_floating_point_operations`` (forward + backward = 3x the forward's matmuls, 2 FLOPs per
multiply-add, causal attention halved, MoE counts the ``top_k`` routed and the shared experts,
no recompute), and the FLOPs a recompute policy reruns (for HFU).

With ``B`` sequences of ``s`` tokens, ``h`` hidden, ``L`` layers (``L_moe`` MoE), ``V`` vocab,
``E`` weight matrices per MLP (3 gated, 2 not), ``m`` MTP layers::

    F = 6 B s [ h (E f L_dense + (E f_e k + E f_sh) L_moe) + (L + m) A
                + m (3 h + 2 h^2) + h V (1 + m) ]
    A (GQA) = h (q + 2 kv) + q s + q h                       q = n_h d_h, kv = n_kv d_h
    A (MLA) = Q + r_kv (h + n_h (d_nope + d_v) + 1) + h d_rope + n_h d_v h
              + s n_h (d_nope + d_rope) / 2 + s n_h d_v / 2

Hand-worked (Llama-3.1-8B, B = 1, s = 8192: h 4096, L 32, f 14336, q 4096, kv 1024, V 128256):
A = 4096 * 6144 + 4096 * 8192 + 4096^2 = 75.50e6; MLP 4096 * 3 * 14336 * 32 = 5.637e9; attention
32 * 75.50e6 = 2.416e9; logits 4096 * 128256 = 0.525e9; F = 6 * 8192 * 8.578e9 = 4.216e14.
"""

from __future__ import annotations

import numpy as np

from dse.perf.train_batch import TrainBatch


def attention_width(b: TrainBatch, s) -> np.ndarray:
    """``A`` of the contract: attention FLOPs per token per layer over 2 (weights + causal
    scores), GQA/MHA or MLA by the row's ``kv_lora_rank``."""
    h, nh = b.hidden_size, b.heads
    q = nh * b.head_dim
    kv = b.kv_heads * b.head_dim
    gqa = h * (q + 2.0 * kv) + q * s + q * h
    nope, rope, dv, rq, rkv = (b.qk_nope_head_dim, b.qk_rope_head_dim, b.v_head_dim,
                               b.q_lora_rank, b.kv_lora_rank)
    qproj = np.where(rq > 0, rq * (h + nh * (nope + rope) + 1.0), h * nh * (nope + rope))
    mla = (qproj + rkv * (h + nh * (nope + dv) + 1.0) + h * rope + nh * dv * h
           + s * nh * (nope + rope) / 2.0 + s * nh * dv / 2.0)
    return np.where(rkv > 0, mla, gqa)


def moe_mtp(b: TrainBatch) -> np.ndarray:
    """1 where the MTP layers count as MoE layers (the last transformer layer is MoE)."""
    return (b.moe_layers > 0).astype(float)


def megatron_flops(b: TrainBatch) -> np.ndarray:
    """``F`` (FLOPs) of one optimizer step, the whole job (contracts/train-cases.md)."""
    s = b.seq_len
    h = b.hidden_size
    m = b.mtp_layers
    e = b.mlp_mats
    moe = b.moe_layers + m * moe_mtp(b)
    dense = b.num_layers - b.moe_layers + m * (1.0 - moe_mtp(b))
    mlp = h * (e * b.ffn * dense + (e * b.expert_ffn * b.topk + e * b.shared_ffn) * moe)
    per_token = (mlp + (b.num_layers + m) * attention_width(b, s)
                 + m * (3.0 * h + 2.0 * h * h) + h * b.vocab * (1.0 + m))
    return 6.0 * b.global_batch_seqs * s * per_token


def logits_flops(b: TrainBatch) -> np.ndarray:
    """The logits layer's share of ``F`` (FLOPs)."""
    return 6.0 * b.global_batch_seqs * b.seq_len * b.hidden_size * b.vocab * (1.0 + b.mtp_layers)


def recompute_flops(b: TrainBatch, flops=None) -> np.ndarray:
    """``F_recompute`` (FLOPs): full reruns every transformer layer's forward, ``(F - logits)
    / 3`` (times the share of layers recomputed); selective reruns the core attention's forward, ``2 * 2 B s (n_h d_h) s / 2`` per
    layer; none: 0. ``flops``: ``megatron_flops(b)`` where the caller has it."""
    flops = megatron_flops(b) if flops is None else flops
    full = (flops - logits_flops(b)) / 3.0 * b.recompute_layer_fraction
    sel = (b.num_layers * 2.0 * 2.0 * b.global_batch_seqs * b.seq_len * b.heads * b.head_dim
           * b.seq_len / 2.0)
    r = b.recompute
    return np.where(r == 2, full, np.where(r == 1, sel, 0.0))
