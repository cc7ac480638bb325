"""The KV offload tier's hooks in a serving instance (the formulas are ``dse.perf.kvtier``).

Where the waiting conversations' reusable prefixes are (``split``: in HBM, in the tier, or
evicted and recomputed as prompt tokens), the mean step and TTFT with the tier's fetches
(``fetch``), and the rows where recomputing beats the link, scored again without the tier
(``recomputing``: those rows alone; ``scatter``: their numbers back into the batch's).

Used by the serving scorer (``dse.perf.serve``: ``_instance`` and ``_tier_recomputed``) and the
request-rate path's probes (``dse.perf.queue_probe.queue_times``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dse.perf import kvtier
from dse.perf.batch import Batch, LazyColumns, lazy
from dse.perf.phases import PromptLoad, new_tokens


@dataclass(frozen=True)
class Tier:
    """The prefix cache's split (dse.perf.kvtier): shares of the waiting conversations'
    reusable prefixes in HBM and in the tier, the tier's hit tokens, and (after
    ``fetch``) where fetching them beats recomputing."""

    in_hbm: np.ndarray
    in_tier: np.ndarray
    tokens: np.ndarray
    fetched: np.ndarray | None = None


def split(b: Batch, weights, kv_seq, act, c):
    """hook: the batch whose prompts recompute the evicted hits, and the split."""
    in_hbm, in_tier = kvtier.cache_split(b, kvtier.free_kv_bytes(b, weights, kv_seq, act, c))
    tier = Tier(in_hbm, in_tier, kvtier.hit_tokens(b) * in_tier)
    # evicted: recomputed
    return b.replace(prefix_hit_fraction=b.prefix_hit_fraction * (in_hbm + in_tier)), tier


def fetch(b: Batch, tier: Tier, load: PromptLoad, t_mixed, t_prefill):
    """hook: prefix hits held in the tier: the mean step with the fetches of the requests one
    step admits (under the step where the fetch overlaps), the TTFT's fetch steps."""
    hit, fetched = kvtier.tier_hit(b, tier.tokens, t_prefill / np.maximum(load.chunk, 1.0))
    per_step = load.avg / np.maximum(new_tokens(b), 1.0) * hit      # the requests one step admits
    t_mixed = np.where(fetched, np.maximum(t_mixed, per_step), t_mixed + per_step)
    return t_mixed, b.pp * hit, Tier(tier.in_hbm, tier.in_tier, tier.tokens, fetched)


def recomputing(b0: Batch, keep, k):
    """The rows (the last axis) where some point recomputes its tier's hits (``keep`` false),
    the batch of those rows without the tier and their coefficients (``k``'s rows; None: None):
    a row's numbers depend on its own values only, so only those rows are scored again (~0.1%
    of dse.bench's rows with its KV tier on, where scoring every row again cost half of each of
    the root finding's passes). The rows' columns but the concurrency and their coefficients
    are kept in ``b0``'s memos (the queue probe carries them from pass to pass) while the rows
    stay the same."""
    n = len(b0)
    rows = np.flatnonzero(~np.all(np.reshape(np.broadcast_to(keep, np.broadcast_shapes(
        np.shape(keep), (n,))), (-1, n)), axis=0))
    memo = b0.__dict__["_memo"]
    got = memo.get("tier_recomputing")
    c = b0.concurrency[..., rows] if np.shape(b0.concurrency)[-1] == n else b0.concurrency
    # (the rows' columns taken as read, ``Batch.take_lazy``: a lazy batch's others are never
    # taken or converted)
    if got is not None and np.array_equal(got[0], rows):
        sub = _with_concurrency(got[1], c, len(rows))
        sub.__dict__["_memo"].update(got[3])     # (its concurrency-free memos: queue_times)
        return rows, sub, got[2]
    cols = LazyColumns(b0.columns, rows, n,
                  {"tier_bytes": np.zeros(len(rows), dtype=b0.tier_bytes.dtype)})
    sub = _with_concurrency(cols, c, len(rows))
    memo["tier_recomputing"] = rows, cols, None if k is None else k.gather(rows, sub), {}
    return rows, sub, memo["tier_recomputing"][2]


def _with_concurrency(cols: LazyColumns, c, m: int) -> Batch:
    """A batch of the rows ``cols`` (``m`` of them) at concurrency ``c``."""
    cols = cols.copy()
    dict.__setitem__(cols, "concurrency", c)
    return lazy(cols, max(m, np.shape(c)[-1]) if np.ndim(c) else m)


def scatter(v, keep, rows, alt):
    """``v`` with ``alt`` (the rows ``rows`` scored again) where ``keep`` is false."""
    out = np.array(np.broadcast_to(v, np.broadcast_shapes(np.shape(v), np.shape(keep))))
    kr = np.broadcast_to(keep, out.shape)[..., rows]
    out[..., rows] = np.where(kr, out[..., rows], alt)
    return out
