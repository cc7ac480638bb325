"""KV-cache memory tiers and prefix caching: HBM, then host memory (Grace LPDDR over
NVLink-C2C, host DRAM over PCIe) or local NVMe, as a *prefix cache*.

How the serving stacks use a second tier (vLLM's KV offloading connector and LMCache, SGLang's
HiCache, Dynamo's KVBM): the KV of the sequences *running* in the batch stays in HBM, where
attention reads it every step; host memory and NVMe keep the KV of conversations *between
their turns* (evicted from HBM), and a returning request's prefix is brought back once, before
(or layer by layer during) its prefill, instead of being recomputed. None of them streams a
running sequence's KV over the host link every decode step (FlexGen-style offload is an
offline-throughput technique). dse models exactly that:

- **Running sequences** keep their KV in HBM: a tier does not raise the concurrency that fits.
- **Shared prefix** (``prefix_tokens`` P > 0): the first P prompt tokens are the same for every
  request (a system prompt) and the prefix cache keeps one copy of their KV per attention-DP
  rank instead of one per sequence (attention still reads them for every sequence).
- **Prefix cache** (``cached_conversations`` N > 0; ``prefix_hit_fraction`` h): N conversations
  per instance wait between turns, each with a reusable prefix of ``h * isl`` tokens whose KV
  the cache must keep for its next request. The cache uses the HBM the running sequences leave
  free first, then the offload tier (``tier_bytes`` per chip at ``tier_bw_bytes_per_s``); what
  neither holds is evicted, and those hits are recomputed as prompt tokens. A hit held in the
  tier costs the request the cheaper of fetching its KV over the link and recomputing it:
  in its TTFT, and in the steps (a fetch overlaps the steps on the copy engines, so the link
  bounds the step only when it is busier than the step; a recompute adds to the steps' work).
  ``cached_conversations = 0`` is dse's model before issue 11: the hits are always held (free).

A tier never slows a design: it only holds what HBM could not (its hits were recomputed
without it) and a held hit costs at most its recompute. Pure numpy.
"""

from __future__ import annotations

import numpy as np

from dse.perf import arch
from dse.perf.batch import Batch
from dse.perf.forms import select


def on(b: Batch) -> bool:
    return b.has_on("prefix_tokens")


def cache_on(b: Batch) -> bool:
    return b.has_on("cached_conversations")


def kv_token_layers_bytes(b: Batch) -> np.ndarray:
    """KV bytes one token adds to one chip per layer of the model (its tp shard; once per
    batch, as the shared prefix's below: the request-rate path scores a batch at many
    concurrencies)."""
    return b.memo("kv_token_layers_bytes", lambda: arch.kv_elems_per_token_layer(b)
                  * arch.kv_shard_fraction(b) * b.kv_bytes)


def shared_prefix_tokens(b: Batch) -> np.ndarray:
    """The shared prefix, at most the prompt less its last token (a prefix cache recomputes the
    last prompt token for its logits, so every sequence holds the KV of at least one token)."""
    return b.memo("shared_prefix_tokens", lambda: np.minimum(np.maximum(b.prefix_tokens, 0.0),
                                                             np.maximum(b.isl - 1.0, 0.0)))


def shared_prefix_bytes(b: Batch) -> np.ndarray:
    """HBM per chip for the one copy of the shared prefix's KV (its stage's layers)."""
    return b.memo("shared_prefix_bytes", lambda: arch.context_layers(
        b, shared_prefix_tokens(b)) / b.pp * kv_token_layers_bytes(b))


def hit_tokens(b: Batch) -> np.ndarray:
    return b.isl * b.prefix_hit_fraction


def hit_bytes(b: Batch, tokens) -> np.ndarray:
    """Per chip, the KV of ``tokens`` prompt tokens of one sequence (its stage's layers)."""
    return arch.context_layers(b, tokens) / b.pp * kv_token_layers_bytes(b)


def free_kv_bytes(b: Batch, weights, kv_seq, act, c) -> np.ndarray:
    """HBM per chip the KV pool has left at concurrency ``c`` (what the running sequences'
    KV and the shared prefix leave of the KV share of HBM; dse.perf.memory_fit.memory's fit)."""
    pool = (b.hbm_capacity_bytes - b.runtime_reserve_bytes - weights - act) * b.kv_memory_fraction
    if on(b):
        pool = pool - shared_prefix_bytes(b)
    return np.maximum(pool - c * kv_seq / b.dp, 0.0)


def cache_split(b: Batch, free):
    """Shares of the waiting conversations' prefixes held in HBM and in the tier (the rest are
    evicted): the cache fills HBM's free KV pool first, then the tier, per chip."""
    need = np.maximum(b.cached_conversations, 0.0) / b.dp * hit_bytes(b, hit_tokens(b))
    some = need > 0
    fit = np.minimum(free, need)
    if bool(np.all(some)):               # (every row: np.where's numbers without its branches)
        return fit / need, np.minimum(np.maximum(b.tier_bytes, 0.0), need - fit) / need
    safe = np.where(some, need, 1.0)
    in_hbm = np.where(some, fit / safe, 1.0)
    in_tier = np.where(some, np.minimum(np.maximum(b.tier_bytes, 0.0), need - fit) / safe, 0.0)
    return in_hbm, in_tier


def over_link(b: Batch, byts) -> np.ndarray:
    """Seconds to move ``byts`` over the tier's link; inf where a row has no tier (no inf x 0)."""
    bw, none = b.memo("tier_link", lambda: _link(b))
    return byts / bw + none          # (+ 0 or inf: np.where's numbers without its branches)


def _link(b: Batch):
    """The tier's link rate (1 where a row has none) and 0 (inf where it has none), once per
    batch."""
    bw = b.tier_bw_bytes_per_s
    ok = (b.tier_bytes > 0) & (bw > 0)
    return np.where(ok, bw, 1.0), np.where(ok, 0.0, np.inf).astype(bw.dtype)


def tier_hit(b: Batch, tokens, recompute_per_token_s):
    """Per request, bringing back ``tokens`` hit tokens held in the tier (all its stage's layers):
    (seconds, fetched) -- the cheaper of the link fetch and recomputing them; 0 for no tokens."""
    fetch = over_link(b, hit_bytes(b, tokens))
    recompute = tokens * recompute_per_token_s
    fetched = fetch <= recompute
    hit = select(fetched, fetch, recompute)
    some = tokens > 0
    return (hit if np.shape(hit) == np.shape(some) and bool(np.all(some))
            else np.where(some, hit, 0.0)), fetched
