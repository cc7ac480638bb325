"""Speculative decoding and multi-token prediction (MTP): verification steps of k+1 tokens.

Each step, a drafter proposes ``k = spec_tokens`` tokens per sequence; the model verifies them
in one step that carries ``k + 1`` tokens per sequence (the weights and each sequence's KV are
read once, the FLOPs, logits and routed tokens are ``k + 1`` times a decode step's). With a
per-token acceptance probability ``a`` (each draft token accepted given the previous ones), the
step yields the accepted prefix plus the verifier's own token:

    E[tokens per step] = sum_{i=0..k} a^i = (1 - a^(k+1)) / (1 - a)      (k + 1 when a = 1)

(Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding", eq. 1,
https://arxiv.org/abs/2211.17192). The drafter runs ``k`` sequential draft steps per pass:

- ``spec_draft = 0`` (MTP, ``serving.spec_method = "mtp"``): the model's own next-token
  prediction module(s) (Hugging Face ``num_nextn_predict_layers``; DeepSeek-V3 has one), reused
  autoregressively for the k drafts. A draft step costs one layer of the decode step (the
  stage's mean layer) plus the output head; the module's weights are one layer's and its KV one
  layer's per token.
- ``spec_draft = 1`` (``"draft"``, ``serving.spec_draft_model``): a separate small model,
  replicated on every attention-DP rank and tensor-parallel within it; a draft step is its
  roofline (weights and KV streamed at the GEMM kernels' HBM share, FLOPs at their peak share)
  plus its layers' fixed times. Its weights and KV take HBM.

Pure numpy, one row per design; ``dse.perf.serve`` calls these where ``spec_tokens > 0``.
"""

from __future__ import annotations

import numpy as np

from dse.perf import arch
from dse.perf.batch import Batch, as_floating


def expected_tokens(acceptance, k) -> np.ndarray:
    """Expected tokens a verification step yields per sequence: (1 - a^(k+1)) / (1 - a)."""
    a = np.clip(as_floating(acceptance), 0.0, 1.0)
    k = np.maximum(as_floating(k), 0.0)
    safe = np.where(a < 1.0, a, 0.5)
    geo = (1.0 - np.power(safe, k + 1.0)) / (1.0 - safe)
    return np.where(a < 1.0, geo, k + 1.0)


def tokens_per_step(b: Batch) -> np.ndarray:
    """Tokens per sequence per step: 1 without speculation, else the expected accepted tokens
    (once per batch: the request-rate path scores a batch at many concurrencies)."""
    return b.memo("spec_tokens_per_step", lambda: np.where(
        b.spec_tokens > 0, expected_tokens(b.spec_acceptance, b.spec_tokens), 1.0))


def head_s(k, rows) -> np.ndarray:
    """The output head of ``rows`` tokens (whole instance) on one chip (the draft's logits)."""
    head = k.head
    c = head.c * (rows / k.dp + k.h) + head.w
    return np.maximum(c, head.mem_s + head.embed_s * rows)


def draft_s(b: Batch, k, rows, decode_s, ctx) -> np.ndarray:
    """Time of the k draft steps of one pass, per pipeline stage step.

    ``rows``: sequences per micro-batch (whole instance); ``decode_s``: the decode-only stage
    step at one token per sequence (MTP prices a draft step as its mean layer); ``ctx``: the
    mean context a draft token attends to."""
    n = np.maximum(b.spec_tokens, 0.0)
    # MTP: one module (a layer of the model) per draft step plus the output head
    head = head_s(k, rows)
    layer = np.maximum(decode_s - k.overhead - head, 0.0) / np.maximum(k.layers_stage, 1.0)
    mtp = layer + b.layer_overhead_s + head
    if not b.has_on("spec_draft"):      # no row has a draft model: MTP alone
        return n * mtp * arch.flag(n > 0, decode_s)
    # a draft model: its roofline on each attention-DP rank's tp group
    seqs = rows / b.dp
    flops = 2.0 * b.draft_params * seqs / b.tp
    byts = (b.draft_params * b.weight_bytes + seqs * ctx * b.draft_kv_bytes_per_token) / b.tp
    model = np.maximum(flops / (b.matmul_flops_per_s * b.gemm_fraction),
                       byts / (b.hbm_bw_bytes_per_s * b.gemm_hbm_fraction)) \
        + b.draft_layers * b.layer_overhead_s
    one = arch.blend(arch.flag(b.spec_draft > 0, decode_s), model, mtp)
    return n * one * arch.flag(n > 0, decode_s)


def extra_weights_bytes(b: Batch) -> np.ndarray:
    """HBM per chip for the drafter's weights: the MTP module(s) (one MoE or dense layer and
    the 2d x d projection, sharded like the model's layers, its shared experts like theirs
    (``arch.shared_group``), on the last stage) or the draft model (tp-sharded, one copy per
    attention-DP rank)."""
    ffn_g = b.tp * b.dp
    moe = arch.flag(b.n_experts > 0, b.hidden)
    ffn = arch.blend(moe, (arch.expert_slots(b) * arch.expert_params(b)
                           + b.hidden * b.n_experts) / ffn_g
                     + arch.shared_params_per_layer(b) / arch.shared_group(b),
                     arch.dense_mlp_params(b) / arch.dense_group(b))
    layer = arch.attn_params_per_layer(b) / b.tp + ffn + 2.0 * b.hidden * b.hidden / b.tp
    mtp = b.spec_mtp_layers * layer * b.weight_bytes
    model = b.draft_params * b.weight_bytes / b.tp
    on = arch.flag(b.spec_tokens > 0, b.hidden)
    return on * arch.blend(arch.flag(b.spec_draft > 0, b.hidden), model, mtp)


def extra_kv_seq_bytes(b: Batch, ctx) -> np.ndarray:
    """KV bytes per sequence per chip the drafter adds at context ``ctx`` (the MTP layers' own
    cache, or the draft model's, tp-sharded)."""
    mtp = (b.spec_mtp_layers * ctx * arch.kv_elems_per_token_layer(b) * arch.kv_shard_fraction(b)
           * b.kv_bytes)
    model = ctx * b.draft_kv_bytes_per_token / b.tp
    on = arch.flag(b.spec_tokens > 0, b.hidden)
    return on * arch.blend(arch.flag(b.spec_draft > 0, b.hidden), model, mtp)
