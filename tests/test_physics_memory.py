"""Memory terms worked by hand through the scorer: how many sequences fit in HBM, and the HBM
bandwidth share of the embedding lookups.

Llama-3.1-8B (config.json): 32 layers, hidden 4096, 32 heads and 8 KV heads of dim 128, MLP
width 14336 (gated), vocab 128256, untied embeddings. Every input the expected values use is
set by the test (capacity, reserve, KV share, caps) or is the published architecture, so a
refit of the catalog does not move them; changing ``hbm_capacity_bytes`` or ``hbm_fraction`` by
20% fails a test here (``tests/mutation.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch, design

from dse.perf import OPS, score

LOGITS = OPS.index("logits")
ATTN = 4096 * 32 * 128 * 2 + 4096 * 8 * 128 * 2     # q, o + k, v per layer: 41,943,040
MLP = 3 * 4096 * 14336                              # 176,160,768
EMB = 2 * 128256 * 4096                             # input table + output head
WEIGHTS_B = (32 * (ATTN + MLP) + EMB) * 2           # bf16: 16,059,990,016 B


def _llama8b(**kw):
    return design(model="llama-3.1-8b", **{
        "model.weight_dtype": "bf16", "model.kv_dtype": "bf16", "layout.tp": 1,
        "accelerator.hbm_capacity_bytes": 80e9, "serving.runtime_reserve_bytes": 2e9,
        "serving.kv_memory_fraction": 0.9, "serving.max_num_tokens": 8192,
        "serving.max_batch_size": 100000, "workload.isl": 1024, "workload.osl": 1024, **kw})


def test_max_concurrent_sequences_from_hbm_capacity_by_hand():
    """80 GB of HBM - 2 GB runtime reserve - 16.06 GB of bf16 weights leaves 61.94 GB. A
    sequence at full context (1024 + 1024 tokens) holds 32 layers x 2 x 8 x 128 x 2 B x 2048
    = 268.4 MB of KV, of which the runtime gives the cache 0.9 of the free HBM (298.3 MB of
    HBM per sequence), plus activations for its (1 + 1024/1024) = 2 tokens per step of
    (4096 x 2 x 8 + 128256 / 1 x 4) = 578,560 B each (below the 8192-token cap):
    floor(61.94e9 / (298.3e6 + 1.157e6)) = 206 sequences."""
    m = score(batch(_llama8b(**{"workload.concurrency": 8})))
    room = 80e9 - 2e9 - WEIGHTS_B
    kv_seq = 32 * 2 * 8 * 128 * 2 * 2048
    act = 2 * (4096 * 16 + 128256 * 4)
    expected = np.floor(room / (kv_seq / 0.9 + act))
    assert expected == 206
    assert m["weights_bytes_per_chip"][0] == WEIGHTS_B
    assert m["max_concurrent_sequences"][0] == expected


def test_a_concurrency_beyond_the_hbm_is_infeasible_with_the_kv_reason():
    """207 sequences do not fit the 80 GB chip above (206 do): reason bit 16."""
    m = score(batch([_llama8b(**{"workload.concurrency": c}) for c in (206, 207)]))
    assert list(m["feasible"]) == [True, False]
    assert int(m["reason"][1]) & 16


def test_embedding_lookups_read_at_the_hbm_fraction():
    """The logits op reads the output head once per step (a GEMM weight stream) and looks up
    one embedding row per token, hidden x 2 B = 8 KiB, at hbm_bw x hbm_fraction: 1536 more
    decode tokens (2048 vs 512 sequences) read 1536 x 8192 B = 12.58 MB more at
    3 TB/s x 0.5 -> 8.389 us more, whatever the head costs."""
    rows = [_llama8b(**{"workload.isl": 1, "workload.osl": 2, "workload.phase": "decode",
                        "workload.concurrency": c}) for c in (512, 2048)]
    b = batch(rows, ideal=True).replace(hbm_bw_bytes_per_s=3e12, hbm_fraction=0.5,
                                        gemm_hbm_fraction=0.8)
    dec = score(b, breakdown=True)[1].decode
    head = 128256 * 4096 * 2 / (3e12 * 0.8)
    assert dec.memory_s[LOGITS][0] == pytest.approx(head + 512 * 8192 / 1.5e12, rel=1e-9)
    assert dec.memory_s[LOGITS][1] - dec.memory_s[LOGITS][0] == pytest.approx(
        1536 * 8192 / 1.5e12, rel=1e-6)


def test_an_offload_tier_holds_the_prefix_cache_not_running_sequences():
    """The same chip with 10 GB of host memory for KV (serving.kv_offload = "host"): running
    sequences' KV stays in HBM (still 206 at most), and the tier holds the prefix cache of the
    conversations waiting between turns once HBM's free KV pool is full. 10,000 waiting
    conversations with a 50% prefix hit on 1024-token prompts cache 512 tokens each:
    32 layers x 2 x 8 x 128 x 2 B x 512 = 67.1 MB, 671 GB in all, far more than HBM's free pool
    (< 62 GB) plus the tier, so the tier holds 10e9 / 671.1e9 = 1.49% of it."""
    b = batch(_llama8b(**{"workload.concurrency": 8, "serving.kv_offload": "host",
                          "workload.prefix_hit_fraction": 0.5,
                          "workload.cached_conversations": 10000}))
    m = score(b.replace(tier_bytes=10e9))
    per_conv = 32 * 2 * 8 * 128 * 2 * 512
    assert m["max_concurrent_sequences"][0] == 206
    assert m["kv_offloaded_fraction"][0] == pytest.approx(10e9 / (10000 * per_conv), rel=1e-9)
