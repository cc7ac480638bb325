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


def test_weights_that_do_not_fit_leave_no_sequences():
    """A 17 GB chip less the 2 GB reserve holds 15 GB, under the 16.06 GB of bf16 weights: no
    room for any KV, 0 sequences (not a negative count) and infeasible (bits 8 and 16); so is
    a chip whose room after the weights is under one sequence's activations (bit 8)."""
    m = score(batch(_llama8b(**{"workload.concurrency": 1,
                                "accelerator.hbm_capacity_bytes": 17e9})))
    assert m["max_concurrent_sequences"][0] == 0.0
    assert int(m["reason"][0]) & 8 and int(m["reason"][0]) & 16
    # the activations count too: 1 MB over the weights and the reserve is less than one
    # sequence's 2 tokens x 578,560 B = 1,157,120 B of activations
    tight = score(batch(_llama8b(**{"workload.concurrency": 1,
                                    "accelerator.hbm_capacity_bytes": WEIGHTS_B + 2e9 + 1e6})))
    assert int(tight["reason"][0]) & 8


def test_a_shared_prefix_costs_each_pipeline_stage_its_own_layers_by_hand():
    """pp = 2: a chip holds 16 of the 32 layers, (16 x (ATTN + MLP) x 2 B) + half the two
    embedding tables (EMB x 2 B / 2) = 8,029,995,008 B of weights. An 8192-token prompt whose
    first 8000 tokens are a shared prefix, 64 output tokens: a sequence holds 8256 - 8000 = 256
    tokens x 16 layers x 4096 B = 16.8 MB of KV on the chip, the prefix's one copy 8000 x 16 x
    4096 B = 524.3 MB (its stage's 16 layers, not 32), taken from the KV share (/ 0.9). Each
    sequence runs 1 + 8192 / 64 = 129 tokens a step, over the 8192-token cap beyond 63.5
    sequences, so activations stop at 8192 x 578,560 B: floor((80e9 - 2e9 - W - 524.3e6 / 0.9
    - 8192 x 578,560) / (16.8e6 / 0.9)) = 3467 sequences (3436 were the copy all 32 layers)."""
    m = score(batch(_llama8b(**{"workload.concurrency": 1, "layout.pp": 2,
                                "workload.isl": 8192, "workload.osl": 64,
                                "workload.prefix_tokens": 8000})))
    w = 16 * (ATTN + MLP) * 2 + EMB * 2 // 2
    assert w == 8_029_995_008
    assert m["weights_bytes_per_chip"][0] == w and m["reason"][0] == 0
    prefix, kv = 8000 * 16 * 4096, 256 * 16 * 4096
    act = 4096 * 16 + 128256 * 4
    expected = np.floor((80e9 - 2e9 - w - prefix / 0.9 - 8192 * act) / (kv / 0.9))
    assert expected == 3467
    assert m["max_concurrent_sequences"][0] == expected


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


# Mixtral-8x7B (config.json): 32 layers, all MoE, hidden 4096, 32 heads and 8 KV heads of dim
# 128, 8 routed experts of width 14336 (gated), no shared expert, vocab 32000, untied
MIX_ATTN = 4096 * 32 * 128 * 2 + 4096 * 8 * 128 * 2    # 41,943,040 per layer
MIX_EXPERT = 3 * 4096 * 14336                          # 176,160,768 per expert
MIX_ROUTER = 4096 * 8                                  # 32,768 per layer


def _mixtral(**kw):
    return design(model="mixtral-8x7b", **{
        "model.weight_dtype": "bf16", "model.kv_dtype": "bf16", "layout.tp": 2, "layout.dp": 2,
        "layout.ep": 4, "layout.pp": 2, "accelerator.hbm_capacity_bytes": 80e9,
        "serving.runtime_reserve_bytes": 2e9, "serving.kv_memory_fraction": 0.9,
        "serving.max_num_tokens": 8192, "serving.max_batch_size": 100000,
        "workload.isl": 1024, "workload.osl": 1024, "workload.concurrency": 64, **kw})


@pytest.mark.parametrize("attn, experts, cap", [("", "", 8192), ("fp8", "fp8", 8192),
                                               ("", "", 256)])
def test_moe_weights_and_sequences_per_chip_with_tp_dp_and_pp_by_hand(attn, experts, cap):
    """Mixtral at tp = 2, dp = 2 (ep = 4), pp = 2 on 8 chips. A chip holds its stage's 16
    layers: the attention projections split over tp (41.9M / 2), the experts and the router
    over the tp x dp = 4 chips of the FFN group ((8 x 176.2M + 32,768) / 4), and one of the two
    embedding tables (the first stage the input one, the last the output head), split over tp:
    32000 x 4096 / 2. With per-op dtypes the projections (``model.attention_dtype``) and the
    routed experts (``model.expert_dtype``) take 1 B per weight instead of 2, the router and
    the embeddings not. Sequences: 80 GB - 2 GB reserve - the weights, over each sequence's
    KV (16 layers x 2048 tokens x K, V of 8 / tp = 4 heads x 128 x 2 B, on one of the dp = 2
    ranks, at 0.9 of the free HBM) plus its activations: (1 + 1024/1024) tokens per step over
    dp = 2 ranks, 4096 x 2 x 8 + 32000 / tp x 4 B each. With a 256-token step cap
    (``max_num_tokens``) the activations stop growing at 256 sequences (one token each per
    rank): past it each sequence costs only its KV, in the room the 256 tokens' activations
    leave."""
    a_b = 1.0 if attn else 2.0
    e_b = 1.0 if experts else 2.0
    m = score(batch(_mixtral(**{"model.attention_dtype": attn, "model.expert_dtype": experts,
                                "serving.max_num_tokens": cap})))
    weights = 16 * (MIX_ATTN / 2 * a_b + 8 * MIX_EXPERT / 4 * e_b + MIX_ROUTER / 4 * 2.0) \
        + 32000 * 4096 / 2 * 2.0
    if not attn:
        assert weights == 12_076_711_936
    assert m["weights_bytes_per_chip"][0] == pytest.approx(weights, rel=1e-12)
    kv_seq = 16 * 2048 * 2 * 4 * 128 * 2                # 67,108,864 B per sequence per stage
    tokens = (1 + 1024 / 1024) / 2
    act = tokens * (4096 * 2 * 8 + 32000 / 2 * 4)
    act_token = 4096 * 2 * 8 + 32000 / 2 * 4          # 129,536 B
    room = 80e9 - 2e9 - weights
    if cap == 256:                                     # past the knee at 256 / 1 sequences
        expected = np.floor((room - 256 * act_token) / (kv_seq / 2 / 0.9))
        assert expected == 1767
    else:
        expected = np.floor(room / (kv_seq / 2 / 0.9 + act))
        if not attn:
            assert expected == 1762
    assert m["max_concurrent_sequences"][0] == expected
    assert m["kv_bytes_per_chip"][0] == pytest.approx(kv_seq * 64 / 2, rel=1e-12)
    # 64 sequences in flight: their activations (64 x 1 token, below the cap) and KV
    used = weights + min(cap, 64 * tokens) * act_token + 2e9 + kv_seq * 64 / 2
    assert m["hbm_used_fraction"][0] == pytest.approx(used / 80e9, rel=1e-12)


def test_tied_embeddings_hold_one_table():
    """Tied input and output embeddings (tied = 1) share one 128256 x 4096 bf16 table: the
    weights are the untied ones less 128256 x 4096 x 2 B = 1.05 GB."""
    b = batch(_llama8b(**{"workload.concurrency": 8})).replace(tied=1.0)
    assert score(b)["weights_bytes_per_chip"][0] == WEIGHTS_B - 128256 * 4096 * 2


def test_activations_capped_at_max_num_tokens_leave_the_rest_to_kv_by_hand():
    """The same chip with max_num_tokens = 256: 2 tokens a sequence a step reach the cap at
    128 sequences, beyond which activations stay at 256 x 578,560 B = 148.1 MB and each more
    sequence costs its KV alone: floor((61.94e9 - 148.1e6) / 298.3e6) = 207 (not the 206 of
    activations that keep growing)."""
    m = score(batch(_llama8b(**{"workload.concurrency": 8, "serving.max_num_tokens": 256})))
    room = 80e9 - 2e9 - WEIGHTS_B
    kv_seq = 32 * 2 * 8 * 128 * 2 * 2048
    expected = np.floor((room - 256 * (4096 * 16 + 128256 * 4)) / (kv_seq / 0.9))
    assert expected == 207
    assert m["max_concurrent_sequences"][0] == expected


def test_weights_and_reserve_beyond_the_hbm_are_infeasible_with_their_reason():
    """A 17 GB chip: 16.06 GB of weights + the 2 GB reserve do not fit (reason bit 8); a 19 GB
    chip holds them (and its 0.94 GB of room some sequences: no reason)."""
    m = score(batch([_llama8b(**{"workload.concurrency": 1,
                                 "accelerator.hbm_capacity_bytes": cap}) for cap in (17e9, 19e9)]))
    assert int(m["reason"][0]) & 8
    assert int(m["reason"][1]) == 0


@pytest.mark.parametrize("prefix", [1023, 1024, 4096])
def test_a_shared_prefix_copy_takes_its_room_from_the_kv_pool_by_hand(prefix):
    """A 1023-token prefix shared by every 1024-token prompt (serving its KV once): a sequence
    holds 1 + 1024 tokens of KV, 32 x 2 x 8 x 128 x 2 B x 1025 = 134.3 MB (149.3 MB of HBM at
    the 0.9 KV share) + 1.157 MB of activations; the one 1023-token copy takes 134.1 MB / 0.9
    = 149.0 MB of the 61.94 GB room: floor((61.94e9 - 149.0e6) / 150.4e6) = 410 sequences. A
    longer prefix (1024, 4096) is the same: a prefix cache recomputes the last prompt token, so
    at most the prompt less one token is shared."""
    m = score(batch(_llama8b(**{"workload.concurrency": 8, "workload.prefix_tokens": prefix})))
    room = 80e9 - 2e9 - WEIGHTS_B
    token = 32 * 2 * 8 * 128 * 2
    act = 2 * (4096 * 16 + 128256 * 4)
    expected = np.floor((room - 1023 * token / 0.9) / (1025 * token / 0.9 + act))
    assert expected == 410
    assert m["max_concurrent_sequences"][0] == expected


def test_a_batch_whose_kv_does_not_fit_is_capacity_bound_whatever_its_roof():
    """Reason bit 16 (the requested batch's KV does not fit) makes the decode capacity-bound
    (3) even where the step's ops are compute-bound (shares 3 : 1 : 0) or network-bound."""
    from dse.perf.memory_fit import decode_bound
    shares = (np.array([3.0, 0.0]), np.array([1.0, 1.0]), np.array([0.0, 2.0]))
    bits = np.array([16, 16], dtype=np.int64)
    one = np.ones(2)
    assert decode_bound(shares, bits, one, one, one).tolist() == [3, 3]
    assert decode_bound(shares, 0 * bits, one, one, one).tolist() == [0, 2]
