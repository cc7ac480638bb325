"""Serving inputs worked by hand through the scorer: the runtime's batch and token caps, the
prefix cache and the rental price.

Llama-3.1-8B (config.json): 32 layers, 32 heads and 8 KV heads of dim 128. Every number the
expected values use is set by the test or is the published architecture; changing
``max_batch_size``, ``max_num_tokens``, ``prefix_hit_fraction`` or ``rental_usd_per_hour`` by
20% fails a test here (``tests/mutation.py``).
"""

from __future__ import annotations

import pytest
from helpers import batch, design

from dse.perf import OPS, score

CORE = OPS.index("attn_core")
KV_TOKEN_LAYER = 2 * 8 * 128 * 2                 # bf16 K and V of one token in one layer


def _llama8b(**kw):
    return design(model="llama-3.1-8b", **{"model.weight_dtype": "bf16", "model.kv_dtype": "bf16",
                                           "layout.tp": 1, **kw})


def test_the_runtime_batch_cap_bounds_the_sequences_per_rank():
    """max_batch_size 100 on one rank, with room in HBM for about 200 short sequences: 100
    run, 101 are infeasible (reason bit 32), and at most 100 are served concurrently."""
    rows = [_llama8b(**{"serving.max_batch_size": 100, "workload.isl": 1024,
                        "workload.osl": 1024, "workload.concurrency": c}) for c in (100, 101)]
    m = score(batch(rows))
    assert list(m["feasible"]) == [True, False]
    assert int(m["reason"][1]) == 32
    assert list(m["max_concurrent_sequences"]) == [100, 100]


def test_a_prompt_is_prefilled_in_chunks_of_max_num_tokens():
    """An 8192-token prompt under a 2048-token step budget is prefilled in 4 chunks; the TTFT
    step carries one chunk that writes its 2048 tokens' KV and reads, on average, the 3072
    earlier tokens of its prompt ((8192 - 2048) / 2): 32 layers x (2048 + 3072) x 4096 B at
    4 TB/s x 0.5."""
    d = _llama8b(**{"serving.max_num_tokens": 2048, "workload.isl": 8192, "workload.osl": 1,
                    "workload.concurrency": 1, "workload.phase": "prefill"})
    b = batch(d, ideal=True).replace(hbm_bw_bytes_per_s=4e12, attn_prefill_hbm_fraction=0.5)
    pre = score(b, breakdown=True)[1].prefill
    assert pre.memory_s[CORE][0] == pytest.approx(32 * (2048 + 3072) * KV_TOKEN_LAYER / 2e12,
                                                  rel=1e-9)


def test_a_prefix_cache_hit_leaves_the_new_tokens_to_attend_to_the_cached_ones():
    """A 4096-token prompt of which half is in the prefix cache: 2048 new tokens each attend
    to the 2048 cached ones and causally to each other: 2048 x 2048 + 2048 x 2049 / 2 pairs
    per layer, 32 layers, 2 x 32 heads x (128 + 128) FLOPs a pair at the pinned 1 PFLOP/s."""
    d = _llama8b(**{"workload.isl": 4096, "workload.osl": 1, "workload.concurrency": 1,
                    "workload.phase": "prefill", "workload.prefix_hit_fraction": 0.5,
                    "serving.max_num_tokens": 8192})
    b = batch(d, ideal=True).replace(attn_flops_per_s=1e15)
    pre = score(b, breakdown=True)[1].prefill
    pairs = 32 * (2048 * 2048 + 2048 * 2049 / 2)
    assert pre.compute_s[CORE][0] == pytest.approx(2 * 32 * 256 * pairs / 1e15, rel=1e-9)


def test_a_rented_chip_costs_its_rental_price():
    """cost.mode = rental: a chip-hour costs the price given, 3.00 $/h."""
    m = score(batch(_llama8b(**{"cost.mode": "rental", "accelerator.price_usd_per_hour": 3.0})))
    assert m["usd_per_chip_hour"][0] == 3.0
