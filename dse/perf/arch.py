"""Quantities derived from the model architecture: parameter counts, KV bytes, attention dims.

All per row, all numpy. Parameter counts are elements (not bytes).
"""

from __future__ import annotations

import functools

import numpy as np

from dse.perf.batch import Batch


def _memoised(fn):
    """Compute a per-row quantity once per Batch (it is frozen, so the value cannot go stale)."""

    @functools.wraps(fn)
    def wrapper(b: Batch) -> np.ndarray:
        return b.memo(fn.__name__, lambda: fn(b))

    return wrapper


def flag(cond: np.ndarray, like: np.ndarray) -> np.ndarray:
    """A boolean array as 0.0/1.0 in the dtype of ``like`` (blending is faster than np.where)."""
    return cond.astype(like.dtype)


def blend(f: np.ndarray, yes, no):
    """``yes`` where the 0/1 flag ``f`` is 1, else ``no`` (both finite). A flag that is a Python
    number (the same for every row, e.g. ``phases`` of a batch without prefill- or decode-only
    rows) picks one side without arithmetic (the result may then be ``yes`` or ``no`` itself:
    never modify it in place)."""
    if isinstance(f, float):
        if f == 0.0:
            return no
        if f == 1.0:
            return yes
    return no + f * (yes - no)


def phases(b: Batch):
    """0/1 flags: (continuous batching, prefill-only instance, decode-only instance); the
    Python numbers (1.0, 0.0, 0.0) when every row batches continuously (the usual case: the
    callers then skip the other phases' arithmetic)."""
    return b.memo("phases", lambda: _phases(b))


def _phases(b: Batch):
    p = b.phase   # 0, 1 or 2: the flags are exact polynomials in it, no branches
    if not np.any(p):
        return 1.0, 0.0, 0.0
    return (1.0 - p) * (2.0 - p) * 0.5, p * (2.0 - p), p * (p - 1.0) * 0.5


@_memoised
def is_mla(b: Batch) -> np.ndarray:
    """1.0 where the model uses multi-head latent attention."""
    return flag(b.kv_lora > 0, b.kv_lora)


@_memoised
def window_or_inf(b: Batch) -> np.ndarray:
    """The local layers' window, or a huge number when the model has none."""
    return b.window_tokens + flag(b.window_tokens <= 0, b.window_tokens) * 1e30


@_memoised
def attn_params_per_layer(b: Batch) -> np.ndarray:
    """q, k, v, o projections (GQA/MHA/MQA) or the MLA projections, per layer."""
    d, h = b.hidden, b.n_heads
    gqa = d * h * b.head_dim * 2 + d * b.n_kv_heads * b.head_dim * 2
    qk = b.qk_nope + b.qk_rope
    q = blend(flag(b.q_lora > 0, d), d * b.q_lora + b.q_lora * h * qk, d * h * qk)
    mla = q + d * (b.kv_lora + b.qk_rope) + b.kv_lora * h * (b.qk_nope + b.v_head) + h * b.v_head * d
    return blend(is_mla(b), mla, gqa)


@_memoised
def expert_params(b: Batch) -> np.ndarray:
    return b.mlp_mats * b.hidden * b.ffn_expert


@_memoised
def expert_slots(b: Batch) -> np.ndarray:
    """Expert copies held per MoE layer: every ep rank holds ceil((E + redundant)/ep) slots, so
    when ep does not divide E the spare slots carry redundant copies of busy experts (as EPLB
    does); ``redundant_experts`` adds slots (dse.perf.imbalance)."""
    ep = np.maximum(b.ep, 1.0)
    extra = b.redundant_experts * flag(b.n_experts > 0, b.n_experts)
    return np.ceil((b.n_experts + extra) / ep) * ep


@_memoised
def shared_params_per_layer(b: Batch) -> np.ndarray:
    return b.n_shared * b.mlp_mats * b.hidden * b.ffn_shared


@_memoised
def dense_mlp_params(b: Batch) -> np.ndarray:
    return b.mlp_mats * b.hidden * b.ffn_dense


@_memoised
def dense_group(b: Batch) -> np.ndarray:
    """Chips one dense MLP's weights are split over: the tp*dp group (``dense_replicated`` 0:
    every chip runs every token through its slice, as SGLang's default
    ``--moe-dense-tp-size``) or, replicated, each attention-DP rank's tp group (1: each rank
    runs its own tokens, as TensorRT-LLM and vLLM do); tp where dp = 1 either way."""
    ffn_g = b.tp * b.dp
    return ffn_g + b.dense_replicated * (b.tp - ffn_g)


def shared_group(b: Batch) -> np.ndarray:
    """Chips one shared expert's weights are split over: the dense MLP's group
    (``dense_group``). TensorRT-LLM and vLLM replicate the shared experts on every
    attention-DP rank, tensor-parallel over its tp group, as they do the dense MLP
    (TensorRT-LLM ``modeling_deepseekv3.py``: the shared experts' tp size is 1 under attention
    DP; vLLM: every non-expert layer per DP rank); SGLang splits them over the tp*dp group
    like its dense MLP. The runtimes' ``dense_mlp`` defaults (dse/catalog/serving.toml) set
    both."""
    return dense_group(b)


@_memoised
def embedding_params(b: Batch) -> np.ndarray:
    """Input embedding plus output head (one table when tied)."""
    return b.vocab * b.hidden * (2.0 - b.tied)


@_memoised
def _every_token_params(b: Batch) -> np.ndarray:
    """Attention, dense MLPs and embeddings: what every token touches (total and active share it)."""
    return (b.n_layers * attn_params_per_layer(b) + b.n_dense_layers * dense_mlp_params(b)
            + embedding_params(b))


def total_params(b: Batch) -> np.ndarray:
    moe = b.n_moe_layers * (b.n_experts * expert_params(b) + shared_params_per_layer(b)
                            + b.hidden * b.n_experts)
    return _every_token_params(b) + moe


@_memoised
def active_params(b: Batch) -> np.ndarray:
    """Parameters touched per token, embeddings included (the published convention)."""
    moe = b.n_moe_layers * (b.top_k * expert_params(b) + shared_params_per_layer(b)
                            + b.hidden * b.n_experts)
    return _every_token_params(b) + moe


@_memoised
def kv_elems_per_token_layer(b: Batch) -> np.ndarray:
    """KV-cache elements one token adds to one layer (whole model, before sharding)."""
    return blend(is_mla(b), b.kv_lora + b.qk_rope, 2.0 * b.n_kv_heads * b.head_dim)


def kv_bytes_per_token(b: Batch) -> np.ndarray:
    """KV-cache bytes of one token over all layers at full context (e.g. Llama-3 70B int8: 160 kB)."""
    return kv_elems_per_token_layer(b) * b.n_layers * b.kv_bytes


@_memoised
def kv_shard_fraction(b: Batch) -> np.ndarray:
    """Fraction of a layer's KV that one chip of a tp group holds.

    GQA heads split over tp, but a chip always keeps at least one KV head; MLA's latent is
    replicated on every tp rank (that is why MLA models use attention data parallelism). Split
    by sequence (``layout.kv_sharding = "batch"``): 1 / tp, whatever the heads.
    """
    gqa = np.maximum(b.n_kv_heads / b.tp, 1.0) / b.n_kv_heads
    frac = blend(is_mla(b), 1.0, gqa)
    if b.has_on("kv_batch"):    # split by sequence over tp instead (dse.perf.tp2d)
        frac = blend(b.kv_batch, 1.0 / b.tp, frac)
    return frac


def attn_dims(b: Batch, decode: bool) -> np.ndarray:
    """d_qk + d_v per head used by the attention-core FLOPs.

    MLA decodes in the absorbed form (scores against the latent), prefills in the expanded form.
    """
    if decode:
        mla = (b.kv_lora + b.qk_rope) + b.kv_lora
    else:
        mla = (b.qk_nope + b.qk_rope) + b.v_head
    return blend(is_mla(b), mla, 2.0 * b.head_dim)


def context_layers(b: Batch, ctx: np.ndarray) -> np.ndarray:
    """Sum over layers of the context each layer attends to (local layers see at most a window)."""
    return (b.n_layers - b.n_local_layers) * ctx + local_context_layers(b, ctx)


def local_context_layers(b: Batch, ctx: np.ndarray) -> np.ndarray:
    """The local layers' share of ``context_layers``: their number times the context each
    attends to (at most the window)."""
    return b.n_local_layers * np.minimum(ctx, window_or_inf(b))


def prefill_pairs_layers(b: Batch, new: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """Sum over layers of causal (query, key) pairs when ``new`` tokens follow ``prior`` cached ones
    (a local layer's window computes ``attn_prefill_window_pad_tokens`` more keys per query:
    ``dse.perf.kernel_attention.prefill_attention_s``)."""
    full = new * prior + 0.5 * new * (new + 1.0)
    local = np.minimum(full, new * (window_or_inf(b) + b.attn_prefill_window_pad_tokens))
    n_global = b.n_layers - b.n_local_layers
    return n_global * full + b.n_local_layers * local
