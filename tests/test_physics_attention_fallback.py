"""The decode attention's per-query-head fallback as the step uses it, worked by hand.

Query groups wider than ``attn_decode_group_max_heads`` (heads per KV head) leave the grouped
kernel: each (sequence, query head) is one work item whose dot products run at
``attn_decode_fallback_fraction`` of the attention peak, with no padding of the group to the
MMA's rows (``dse.perf.kernel_attention.decode_attention_s``). Pins as in
``tests/test_physics_kernels.py`` (round numbers, none a fitted value), so changing either
parameter by 20% fails here (``tests/mutation.py``).
"""

from __future__ import annotations

import pytest
from helpers import batch, design
from test_physics_kernels import ATTN_PIN, CORE

from dse.perf import score


def _decode(**pin):
    d = design(model="llama-3.1-8b", **{
        "layout.tp": 1, "workload.isl": 1000, "workload.osl": 2000, "workload.concurrency": 64,
        "workload.phase": "decode"})
    return score(batch(d, ideal=True).replace(**dict(ATTN_PIN, **pin)), breakdown=True)[1].decode


def test_a_group_wider_than_the_kernel_takes_falls_back_per_query_head_by_hand():
    """Llama-3.1-8B's groups of 4 query heads per KV head, with a kernel that takes groups of
    at most 3.5: the fallback. 64 sequences at a mean context of 2,000 tokens, 32 layers:
    2 x 32 query heads (no padding to 8 rows) x (128 + 128) FLOPs per (sequence, context token,
    layer) at 500 TFLOP/s x 0.05; the KV stream (and each token's query and output) beside it;
    the fixed time counts one work item per query head:
    32 layers x (5 us + 64 x (0.1 us + 32 x 0.02 us))."""
    dec = _decode(attn_decode_group_max_heads=3.5, attn_decode_fallback_fraction=0.05)
    ctx = 32 * 2000
    compute = 2 * 32 * 256 / (5e14 * 0.05) * 64 * ctx
    kv_tok = 2 * 8 * 128 * 2
    # + each sequence's query read and output written per layer: 32 heads x (128 + 128) bf16
    qo = 32 * 32 * 256 * 2 / (4e12 * 0.8) * 64
    memory = kv_tok / (4e12 * 0.8) * 64 * ctx + kv_tok / (4e12 * 0.7) * 64 * 32 + qo
    fixed = 32 * (5e-6 + 64 * (1e-7 + 32 * 2e-8))
    assert dec.compute_s[CORE][0] == pytest.approx(compute, rel=1e-9)
    assert dec.op_s[CORE][0] == pytest.approx(max(compute, memory) + fixed, rel=1e-9)


def test_a_group_the_kernel_takes_stays_on_the_grouped_kernel():
    """The same decode with groups of up to 4.5 heads taken: the grouped kernel, each group of
    4 padded to 8 MMA rows (x 2) at 500 TFLOP/s x 0.5, the fallback fraction unused."""
    dec = _decode(attn_decode_group_max_heads=4.5, attn_decode_fallback_fraction=0.05)
    compute = 2 * 32 * 2 * 256 / (5e14 * 0.5) * 64 * 32 * 2000
    assert dec.compute_s[CORE][0] == pytest.approx(compute, rel=1e-9)


def _oss_decode(**pin):
    d = design("h100-sxm", "gpt-oss-120b", **{
        "model.kv_dtype": "bf16", "layout.tp": 1, "workload.isl": 1000, "workload.osl": 2000,
        "workload.concurrency": 64, "workload.phase": "decode"})
    return score(batch(d, ideal=True).replace(**dict(ATTN_PIN, **pin)), breakdown=True)[1].decode


def test_windowed_layers_fall_back_per_query_head_by_hand():
    """gpt-oss-120b (18 global layers, 18 local ones with a 128-token window; 64 query heads
    in 8 KV groups of 8, head dim 64), 64 sequences at a mean context of 2,000 tokens, with a
    kernel that keeps windowed query groups of at most 7.5 heads grouped (FlashAttention-2's
    windowed decode keeps none: 1; 7.5 so that 20% more, 9, keeps gpt-oss's 8 grouped and
    fails here): the global layers stay grouped, 64 query rows (8
    groups of 8, no padding past 8) x (64 + 64) FLOPs per context token at 500 TFLOP/s x 0.5;
    the local ones run 64 per-query-head items at x 0.05 over their 128 tokens. The fixed time
    counts 8 work items per sequence on a global layer and 64 on a local one:
    36 x 5 us + 64 x (36 x 0.1 us + (18 x 8 + 18 x 64) x 0.02 us)."""
    pin = dict(attn_decode_window_group_max_heads=7.5, attn_decode_fallback_fraction=0.05)
    dec = _oss_decode(**pin)
    per_tok = 2 * 64 * 128                       # FLOPs per (sequence, context token, layer)
    compute = 64 * per_tok * (18 * 2000 / (5e14 * 0.5) + 18 * 128 / (5e14 * 0.05))
    assert dec.compute_s[CORE][0] == pytest.approx(compute, rel=1e-9)
    kv_tok = 2 * 8 * 64 * 2
    qo = 36 * 64 * 128 * 2 / (4e12 * 0.8) * 64
    memory = (kv_tok / (4e12 * 0.8) * 64 * (18 * 2000 + 18 * 128)
              + kv_tok / (4e12 * 0.7) * 64 * 36 + qo)
    fixed = 36 * 5e-6 + 64 * (36 * 1e-7 + (18 * 8 + 18 * 64) * 2e-8)
    assert dec.op_s[CORE][0] == pytest.approx(max(compute, memory) + fixed, rel=1e-9)
    # the default (windows as unwindowed layers): every layer grouped at x 0.5
    base = _oss_decode()
    assert base.compute_s[CORE][0] == pytest.approx(
        64 * per_tok * (18 * 2000 + 18 * 128) / (5e14 * 0.5), rel=1e-9)
    # a windowed limit at least the group (8) keeps the local layers grouped
    assert _oss_decode(**dict(pin, attn_decode_window_group_max_heads=8.0)).compute_s[CORE][0] \
        == pytest.approx(base.compute_s[CORE][0], rel=1e-12)
