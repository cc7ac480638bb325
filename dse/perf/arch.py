"""Quantities derived from the model architecture: parameter counts, KV bytes, attention dims.

All per row, all numpy. Parameter counts are elements (not bytes).
"""

from __future__ import annotations

import numpy as np

from dse.perf.batch import Batch


def is_mla(b: Batch) -> np.ndarray:
    return b.kv_lora > 0


def attn_params_per_layer(b: Batch) -> np.ndarray:
    """q, k, v, o projections (GQA/MHA/MQA) or the MLA projections, per layer."""
    d, h = b.hidden, b.n_heads
    gqa = d * h * b.head_dim * 2 + d * b.n_kv_heads * b.head_dim * 2
    qk = b.qk_nope + b.qk_rope
    q = np.where(b.q_lora > 0, d * b.q_lora + b.q_lora * h * qk, d * h * qk)
    mla = q + d * (b.kv_lora + b.qk_rope) + b.kv_lora * h * (b.qk_nope + b.v_head) + h * b.v_head * d
    return np.where(is_mla(b), mla, gqa)


def expert_params(b: Batch) -> np.ndarray:
    return b.mlp_mats * b.hidden * b.ffn_expert


def expert_slots(b: Batch) -> np.ndarray:
    """Expert copies held per MoE layer: every ep rank holds ceil(E/ep) slots, so when ep does
    not divide E the spare slots carry redundant copies of busy experts (as EPLB does)."""
    ep = np.maximum(b.ep, 1.0)
    return np.ceil(b.n_experts / ep) * ep


def shared_params_per_layer(b: Batch) -> np.ndarray:
    return b.n_shared * b.mlp_mats * b.hidden * b.ffn_shared


def dense_mlp_params(b: Batch) -> np.ndarray:
    return b.mlp_mats * b.hidden * b.ffn_dense


def embedding_params(b: Batch) -> np.ndarray:
    """Input embedding plus output head (one table when tied)."""
    return b.vocab * b.hidden * (2.0 - b.tied)


def total_params(b: Batch) -> np.ndarray:
    moe = b.n_moe_layers * (b.n_experts * expert_params(b) + shared_params_per_layer(b)
                            + b.hidden * b.n_experts)
    return (b.n_layers * attn_params_per_layer(b) + b.n_dense_layers * dense_mlp_params(b)
            + moe + embedding_params(b))


def active_params(b: Batch) -> np.ndarray:
    """Parameters touched per token, embeddings included (the published convention)."""
    moe = b.n_moe_layers * (b.top_k * expert_params(b) + shared_params_per_layer(b)
                            + b.hidden * b.n_experts)
    return (b.n_layers * attn_params_per_layer(b) + b.n_dense_layers * dense_mlp_params(b)
            + moe + embedding_params(b))


def kv_elems_per_token_layer(b: Batch) -> np.ndarray:
    """KV-cache elements one token adds to one layer (whole model, before sharding)."""
    return np.where(is_mla(b), b.kv_lora + b.qk_rope, 2.0 * b.n_kv_heads * b.head_dim)


def kv_bytes_per_token(b: Batch) -> np.ndarray:
    """KV-cache bytes of one token over all layers at full context (e.g. Llama-3 70B int8: 160 kB)."""
    return kv_elems_per_token_layer(b) * b.n_layers * b.kv_bytes


def kv_shard_fraction(b: Batch) -> np.ndarray:
    """Fraction of a layer's KV that one chip of a tp group holds.

    GQA heads split over tp, but a chip always keeps at least one KV head; MLA's latent is
    replicated on every tp rank (that is why MLA models use attention data parallelism).
    """
    gqa = np.maximum(b.n_kv_heads / b.tp, 1.0) / b.n_kv_heads
    return np.where(is_mla(b), 1.0, gqa)


def attn_dims(b: Batch, decode: bool) -> np.ndarray:
    """d_qk + d_v per head used by the attention-core FLOPs.

    MLA decodes in the absorbed form (scores against the latent), prefills in the expanded form.
    """
    if decode:
        mla = (b.kv_lora + b.qk_rope) + b.kv_lora
    else:
        mla = (b.qk_nope + b.qk_rope) + b.v_head
    return np.where(is_mla(b), mla, 2.0 * b.head_dim)


def context_layers(b: Batch, ctx: np.ndarray) -> np.ndarray:
    """Sum over layers of the context each layer attends to (local layers see at most a window)."""
    n_global = b.n_layers - b.n_local_layers
    local_ctx = np.where(b.window_tokens > 0, np.minimum(ctx, b.window_tokens), ctx)
    return n_global * ctx + b.n_local_layers * local_ctx


def prefill_pairs_layers(b: Batch, new: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """Sum over layers of causal (query, key) pairs when ``new`` tokens follow ``prior`` cached ones."""
    full = new * prior + 0.5 * new * (new + 1.0)
    w = np.where(b.window_tokens > 0, b.window_tokens, np.inf)
    local = np.minimum(full, new * w)
    n_global = b.n_layers - b.n_local_layers
    return n_global * full + b.n_local_layers * local
