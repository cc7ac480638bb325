"""KV-cache memory tiers and prefix caching: HBM, then host memory (Grace LPDDR over
NVLink-C2C, host DRAM over PCIe) or local NVMe.

- **Shared prefix** (``prefix_tokens`` P > 0): the first P prompt tokens are the same for every
  request (a system prompt) and the prefix cache keeps one copy of their KV per attention-DP
  rank instead of one per sequence (attention still reads them for every sequence).
- **Offload tier** (``serving.kv_offload = "host" | "ssd"``: ``tier_bytes`` of it per chip at
  ``tier_bw_bytes_per_s`` per direction): sequences beyond what HBM holds keep their KV in the
  tier, so the concurrency that fits grows by ``tier_bytes / (KV per sequence per chip)``. Every
  decode step reads every sequence's KV, so the offloaded share ``f = (C - C_hbm) / C`` of the
  step's KV read comes over the link; layer-by-layer prefetch overlaps it with the step (as
  FlexGen and LMCache pipeline it), so a step lasts ``max(step, link time)``.
- **Prefix hits** (``prefix_hit_fraction``) need the hit tokens' KV: while HBM holds every
  sequence (f = 0) the cached prefixes sit in HBM as well (dse's model without tiers: a hit is
  free); once the design offloads, returning conversations' prefixes live in the tier and a hit
  costs ``min(fetch over the link, recomputing the hit tokens)``, per request in its TTFT and in
  the steps' load.

With no tier a design whose KV fits in HBM is unchanged, and a tier never slows a design that
fits in HBM (f = 0: no link time, hits as before). Pure numpy.
"""

from __future__ import annotations

import numpy as np

from dse.perf import arch
from dse.perf.batch import Batch


def on(b: Batch) -> bool:
    return b.has_on("tier_bytes") or b.has_on("prefix_tokens")


def kv_token_layers_bytes(b: Batch) -> np.ndarray:
    """KV bytes one token adds to one chip per layer of the model (its tp shard)."""
    return arch.kv_elems_per_token_layer(b) * arch.kv_shard_fraction(b) * b.kv_bytes


def shared_prefix_tokens(b: Batch) -> np.ndarray:
    """The shared prefix, at most the prompt less its last token (a prefix cache recomputes the
    last prompt token for its logits, so every sequence holds the KV of at least one token)."""
    return np.minimum(np.maximum(b.prefix_tokens, 0.0), np.maximum(b.isl - 1.0, 0.0))


def shared_prefix_bytes(b: Batch) -> np.ndarray:
    """HBM per chip for the one copy of the shared prefix's KV (its stage's layers)."""
    p = shared_prefix_tokens(b)
    return arch.context_layers(b, p) / b.pp * kv_token_layers_bytes(b)


def tier_sequences(b: Batch, kv_seq) -> np.ndarray:
    """Sequences the offload tier holds beyond HBM (``kv_seq / dp`` per sequence per chip)."""
    per = np.maximum(kv_seq / b.dp, 1e-30)
    return np.floor(b.tier_bytes / per) * (b.tier_bytes > 0)


def offloaded_fraction(c, c_hbm) -> np.ndarray:
    """Share of the running sequences whose KV lives in the tier."""
    return np.maximum(c - c_hbm, 0.0) / np.maximum(c, 1.0)


def link_s(b: Batch, frac, seqs, dec_ctx) -> np.ndarray:
    """Time to bring the offloaded share of one stage step's KV read over the tier's link:
    ``seqs`` sequences per micro-batch (whole instance), ``dec_ctx`` = arch.context_layers of
    their context."""
    byts = frac * seqs / b.dp * dec_ctx / b.pp * kv_token_layers_bytes(b)
    return _over_link(b, byts)


def _over_link(b: Batch, byts) -> np.ndarray:
    """Seconds to move ``byts`` over the tier's link; 0 where a row has no tier (no inf x 0)."""
    bw = b.tier_bw_bytes_per_s
    ok = (b.tier_bytes > 0) & (bw > 0)
    return np.where(ok, byts / np.where(ok, bw, 1.0), 0.0)


def hit_s(b: Batch, frac, hit_tokens, recompute_per_token_s) -> np.ndarray:
    """Per request, bringing its prefix hit's KV (all its stage's layers) once offloading:
    the cheaper of the link fetch and recomputing the tokens; 0 while nothing is offloaded."""
    byts = arch.context_layers(b, hit_tokens) / b.pp * kv_token_layers_bytes(b)
    fetch = np.where(b.tier_bw_bytes_per_s > 0, _over_link(b, byts), np.inf)
    return np.where(frac > 0, np.minimum(fetch, hit_tokens * recompute_per_token_s), 0.0)
