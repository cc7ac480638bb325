"""Sliding-window (local) attention worked by hand through the scorer: the KV cache a sequence
holds and the prefill attention FLOPs.

gpt-oss-120b (config.json): 36 layers alternating a 128-token sliding window and full
attention (18 local + 18 global), 64 query heads and 8 KV heads of dim 64. A local layer keeps
and attends to at most 128 tokens; changing ``window_tokens`` or ``n_local_layers`` by 20%
fails a test here (``tests/mutation.py``).
"""

from __future__ import annotations

import pytest
from helpers import batch, design

from dse.perf import OPS, score

CORE = OPS.index("attn_core")


def test_local_layers_cache_only_their_window():
    """One sequence at 4000 + 96 = 4096 tokens of context, bf16 KV, tp=1: the 18 global layers
    hold 4096 tokens and the 18 local ones 128, of 2 x 8 x 64 = 1024 elements x 2 B each:
    (18 x 4096 + 18 x 128) x 2048 B = 155.7 MB (a model without windows: 302.0 MB)."""
    d = design("h100-sxm", "gpt-oss-120b", **{
        "model.kv_dtype": "bf16", "layout.tp": 1, "workload.isl": 4000, "workload.osl": 96,
        "workload.concurrency": 1})
    m = score(batch(d))
    assert m["kv_bytes_per_chip"][0] == (18 * 4096 + 18 * 128) * 1024 * 2


def test_local_layers_attend_within_their_window_in_prefill():
    """One 4096-token prompt, prefill only: a global layer scores 4096 x 4097 / 2 causal
    (query, key) pairs, a local one at most 4096 x 128; each pair costs 2 x (64 + 64) FLOPs per
    query head, 64 heads, at the pinned 1 PFLOP/s attention peak (speed-of-light efficiency):
    2 x 64 x 128 x (18 x 8,390,656 + 18 x 524,288) / 1e15 = 2.629 ms."""
    d = design("h100-sxm", "gpt-oss-120b", **{
        "layout.tp": 1, "workload.isl": 4096, "workload.osl": 1, "workload.concurrency": 1,
        "workload.phase": "prefill", "serving.max_num_tokens": 8192})
    b = batch(d, ideal=True).replace(attn_flops_per_s=1e15, attn_prefill_window_pad_tokens=0.0)
    pre = score(b, breakdown=True)[1].prefill
    pairs = 18 * 4096 * 4097 / 2 + 18 * 4096 * 128
    assert pre.compute_s[CORE][0] == pytest.approx(2 * 64 * 128 * pairs / 1e15, rel=1e-9)
