"""The request-rate path's probes: what dse.perf.queueing's root finding reads of an instance.

``queue_times``: the three numbers the queue reads (``ttft_unloaded_s``, ``tpot_s``,
``_prefill_service_s``), the same as the serving scorer's ``_instance(b, queue=True)`` without
its fit, cost or bound metrics (it runs ~10 times per design); ``probe``: ``queue_times`` of
some rows as a function of their concurrency, the batch's concurrency-free memos carried from
pass to pass (``share_memos``, ``at_concurrency``; ``POINT_MEMOS`` are the memos that do not
carry), rows that recompute their KV tier's hits scored by their tier-off twins; ``queue_cap``:
the instance's ``max_concurrent_sequences`` at its concurrency.

Used by the serving scorer (``dse.perf.serve._served``); ``dse.perf.roots`` documents the
probe's costs.
"""

from __future__ import annotations

import numpy as np

from dse.perf import frontend, kvtier, memory_fit, spec, tier_split
from dse.perf.batch import Batch
from dse.perf.phases import (
    mean_steps,
    prompt_load,
    prompt_service_s,
    sequences,
    steps,
    ttft,
)
from dse.perf.step import Coefficients

# the memos that read the concurrency (where the runtime runs fewer sequences than asked) or
# the prefix hits (the tier's split recomputes the evicted ones): the sequences and the
# uncached tokens; every other memo of a batch holds for its runner and tier-split batches too
POINT_MEMOS = frozenset(("sequences", "new_tokens", "has_on:concurrency",
                         "has_on:prefix_hit_fraction"))


def share_memos(src: Batch, dst: Batch) -> None:
    """``src``'s memos into ``dst`` (batches of the same rows at other concurrencies or prefix
    hits: ``queue_times`` computes a concurrency-free term once, not once per pass)."""
    dst.__dict__["_memo"].update({key: v for key, v in src.__dict__["_memo"].items()
                                  if key not in POINT_MEMOS})


def at_concurrency(b: Batch, c) -> Batch:
    """``b`` at concurrency ``c``, with ``b``'s concurrency-free memos (the weights, the KV
    room, the architecture's counts: ~10 ms of a 20,000-design float64 batch, computed once)."""
    bc = b.replace(concurrency=c)
    share_memos(b, bc)
    return bc


def queue_cap(b: Batch):
    """``max_concurrent_sequences`` of the instance at its concurrency (dse.perf.queueing)."""
    bc = at_concurrency(b, np.maximum(b.concurrency, 1.0))
    cap = np.minimum(memory_fit.memory(bc)[3], b.max_batch_size * b.dp)
    share_memos(bc, b)                   # (its concurrency-free memos, for the later passes)
    return cap


def probe(b: Batch, k: Coefficients, dtype):
    """``at(rows)``: ``queue_times`` of rows ``rows`` (None: all) as a function of their
    concurrency, in ``dtype`` (float32: dse.perf.queueing's root finding; None: the batch's
    own, for what it reports), the concurrency-free memos of the batch kept between calls."""
    b32 = b if dtype is None else b.astype(dtype)
    # (a lazily converted batch's columns are all of its dtype: not converted to be checked)
    k32 = k if getattr(b.columns, "dtype", None) == b32.n_layers.dtype or all(
        v.dtype == b32.n_layers.dtype for v in b.columns.values()) else Coefficients(b32)
    n = len(b32)
    # the rows whose KV tier recomputed at some point so far: a batch of rows taken later holds
    # a twin of each of them without the tier, scored in the same pass as the rows
    # (``queue_times``' ``twins``) instead of a pass of its own (~1-2 ms of Python a pass);
    # a batch taken before one of its rows first recomputed is taken again after that pass
    recomputed = np.zeros(n, dtype=bool)

    def held_batch(rows):
        """The batch of ``rows`` (None: all), with tier-off twins of those recomputed so far."""
        twin = np.zeros(0, dtype=np.int64) if rows is None else \
            np.flatnonzero(recomputed[rows])
        held = n if rows is None else len(rows)
        taken = None if rows is None else np.concatenate([rows, rows[twin]])
        sub = b32 if rows is None else b32.take_lazy(taken)
        if len(twin):
            tier = np.array(np.broadcast_to(sub.tier_bytes, (len(sub),)))
            tier[held:] = 0.0
            sub = sub.replace(tier_bytes=tier)
        ks = k32 if rows is None else k32.gather(taken, sub)
        memo = sub.__dict__["_memo"]
        if rows is not None:             # the batch's per-row memos, those rows of them
            # (and a field off on every row is off on these: not tested, nor taken, again)
            memo.update({key: (v if v is False else v.take(taken))
                         for key, v in b32.__dict__["_memo"].items()
                         if (isinstance(v, np.ndarray) and v.shape == (n,)) or (
                             v is False and key.startswith("has_on:")
                             and key not in POINT_MEMOS)})
        return twin, held, taken, sub, ks, memo

    def at(rows):
        st = [held_batch(rows)]

        def times(c):
            twin, held, taken, sub, ks, memo = st[0]
            out = _times(c, twin, held, taken, sub, ks, memo)
            # a row of a taken batch that recomputed this pass without its twin would run a
            # sub-pass of its own every later pass (~1 ms each): the batch again, with it
            if rows is not None and np.count_nonzero(recomputed[rows]) > len(twin):
                st[0] = held_batch(rows)
            return out
        return times

    def _times(c, twin, held, taken, sub, ks, memo):
        if len(twin):
            c = np.concatenate([c, np.asarray(c)[..., twin]], axis=-1)
        bc = sub.replace(concurrency=c)
        bc.__dict__["_memo"].update(memo)
        out = queue_times(bc, ks, (held, twin) if len(twin) else None)
        memo.update(bc.__dict__["_memo"])
        memo.pop("sequences", None)          # (the one memo that depends on concurrency)
        if "tier_recomputing" in memo:
            got = memo["tier_recomputing"][0]
            recomputed[got if taken is None else taken[got]] = True
        if not len(twin):
            return out
        return tuple(np.broadcast_to(v, np.broadcast_shapes(np.shape(v), (len(sub),)))
                     [..., :held] for v in out)
    return at


def queue_times(b: Batch, k: Coefficients, twins=None):
    """hook: what dse.perf.queueing's root finding reads of ``serve._instance(b, queue=True)``,
    the same numbers: ``(ttft_unloaded_s, tpot_s, _prefill_service_s)``, none of the fit, cost
    or bound metrics (it runs ~10 times per design). ``twins``: ``(held, rows)``, the last rows
    of ``b`` from ``held`` on are the rows ``rows`` without their KV tier (``probe``): where
    those rows recompute their tier's hits, their twins' numbers."""
    c = sequences(b)
    weights, kv_seq, act, max_c = memory_fit.memory(b)
    b0, tier = b, None
    # as serve._instance: the sequences the runtime runs at once
    b, c = memory_fit.running(b, c, max_c)
    if b is not b0:
        share_memos(b0, b)
    if kvtier.cache_on(b):               # hook: as serve._instance (dse.perf.kvtier)
        b, tier = tier_split.split(b, weights, kv_seq, act, c)
        share_memos(b0, b)
    on_spec = b.has_on("spec_tokens")
    tok_step = spec.tokens_per_step(b) if on_spec else 1.0
    load = prompt_load(b, tok_step if on_spec else None)
    st, _, draft = steps(b, False, load, k, b.spec_tokens + 1.0 if on_spec else None,
                         sums=False)
    t_decode, t_mixed, t_prefill = mean_steps(st, load, draft)
    ttft_extra = 0.0
    if tier is not None:
        t_mixed, ttft_extra, tier = tier_split.fetch(b, tier, load, t_mixed, t_prefill)
    pass_s = b.pp * t_mixed
    out = (ttft(b, pass_s, t_prefill, load, ttft_extra, tail=False)[0],
           frontend.streamed_tpot(b, pass_s / tok_step, c),
           frontend.serial_service_s(b, prompt_service_s(b, t_decode, t_prefill, load)))
    if b is not b0:                      # (and back: the probe keeps b0's for its next pass)
        share_memos(b, b0)
    if tier is None:
        return out
    keep = tier.fetched | (tier.tokens <= 0)
    if twins is not None:                # (as serve._tier_recomputed, from the twins)
        held, rows = twins
        keep = np.array(np.broadcast_to(keep, np.broadcast_shapes(np.shape(keep), (len(b0),))))
        out = tuple(_from_twins(v, keep, held, rows) for v in out)
        keep[..., rows] = True
    if not np.all(keep):                 # as serve._tier_recomputed
        rows, sub, ks = tier_split.recomputing(b0, keep, k)
        alt = queue_times(sub, ks)
        b0.__dict__["_memo"]["tier_recomputing"][3].update(
            {key: v for key, v in sub.__dict__["_memo"].items() if key not in POINT_MEMOS})
        out = tuple(tier_split.scatter(v, keep, rows, a) for v, a in zip(out, alt))
    return out


def _from_twins(v, keep, held, rows):
    """``v`` with the twins' numbers (``v``'s columns from ``held`` on) at the rows ``rows``
    where ``keep`` is false."""
    out = np.array(np.broadcast_to(v, keep.shape))
    out[..., rows] = np.where(keep[..., rows], out[..., rows], out[..., held:])
    return out
