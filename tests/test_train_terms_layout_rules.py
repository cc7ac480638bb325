"""The layout rules of train_layout.layout_bits, one rule at a time and on its boundaries, by
hand: each design below breaks exactly the rules named (or none), so its bits are exactly their
sum (tests/MUTATION_TRAIN_OPERATORS.md: a rule's bit, its boundary or its inputs changed fails
one of these). The dense model of test_train_physics: 8 layers, 16 heads (MHA, 16 key/value
heads); the MoE one: 8 layers, 16 heads, 4 key/value heads, 8 experts; seq_len 2048, 8
sequences a step."""

from __future__ import annotations

import pytest
from test_train_physics import MOE, batch

from dse.perf.train_layout import LAYOUT_REASONS, a2a_splits, layout_bits, layout_text


def bits(model=None, **over) -> int:
    b = batch(**over) if model is None else batch(model, **over)
    return int(layout_bits(b))


def test_a_valid_layout_has_no_bits():
    assert bits() == 0
    assert bits(MOE, ep=8, dp=8) == 0


@pytest.mark.parametrize("model,over,expect", [
    # 16 heads over tp 3: 16 mod 3 = 1
    (None, {"tp": 3}, 1),
    # 8 experts over ep 3; a dense model with ep 2
    (MOE, {"ep": 3, "dp": 3, "global_batch_seqs": 9}, 2),
    (None, {"ep": 2, "dp": 2}, 2),
    # ep 4 carved from tp x cp x dp = 1 x 1 x 2 = 2: 2 mod 4 != 0
    (MOE, {"ep": 4, "dp": 2}, 2),
    # pp 9 > 8 layers (pp vp = 9 > 8 too, but that bit is only for pp <= the layers)
    (None, {"pp": 9}, 4),
    # 9 sequences over dp 1 x micro-batch 2: 4.5 micro-batches
    (None, {"global_batch_seqs": 9, "micro_batch_seqs": 2}, 1024),
    # 2 cp = 4 does not divide 2050 tokens
    (None, {"cp": 2, "seq_len": 2050}, 2048),
    # vp 2 under 1F1B; the interleaved schedule with vp 1
    (None, {"pp": 2, "vp": 2}, 4096),
    (None, {"pp": 2, "schedule": 1}, 4096),
    # dp 1.5: not whole (3 sequences over 1.5 x 2 = 3: the micro-batches are whole)
    (None, {"dp": 1.5, "global_batch_seqs": 3, "micro_batch_seqs": 2}, 8192),
    # pp 8 = the layers (allowed), vp 2: 16 virtual stages of 8 layers
    (None, {"pp": 8, "vp": 2, "schedule": 1}, 16384),
    # DualPipe, pp 2, 4 sequences over dp 1 x micro-batch 2: 2 micro-batches < 2 pp = 4
    (None, {"pp": 2, "schedule": 3, "global_batch_seqs": 4, "micro_batch_seqs": 2}, 32768),
    # DualPipe, pp 3 (odd), 6 micro-batches
    (None, {"pp": 3, "schedule": 3, "global_batch_seqs": 6}, 32768),
    # DualPipe, pp 2, 5 micro-batches (odd)
    (None, {"pp": 2, "schedule": 3, "global_batch_seqs": 5}, 32768),
    # a2a, tp 2, cp 4: the MoE model's 4 key/value heads are 2 a tp rank, not a multiple of 4
    (MOE, {"tp": 2, "cp": 4, "cp_comm_type": 1}, 65536),
])
def test_each_rule_alone_sets_its_bit(model, over, expect):
    assert bits(model, **over) == expect


@pytest.mark.parametrize("model,over", [
    # ep 4 from tp x cp x dp = 1 x 2 x 2 = 4 (cp counts)
    (MOE, {"ep": 4, "cp": 2, "dp": 2}),
    # cp 1: the load-balanced split needs nothing of an odd sequence
    (None, {"seq_len": 2047}),
    # DualPipe, pp 2, 8 sequences over micro-batches of 2: 4 micro-batches = 2 pp
    (None, {"pp": 2, "schedule": 3, "global_batch_seqs": 8, "micro_batch_seqs": 2}),
    # pp = the layers, vp 1
    (None, {"pp": 8}),
    # a2a, tp 2, cp 4, MHA: 8 key/value heads a tp rank split 4 ways, 16 heads over 8
    (None, {"tp": 2, "cp": 4, "cp_comm_type": 1}),
    # the MoE model's unsplittable heads under p2p (ring) and all_gather: no a2a rule
    (MOE, {"tp": 2, "cp": 4, "cp_comm_type": 0}),
    (MOE, {"tp": 2, "cp": 4, "cp_comm_type": 2}),
])
def test_layouts_on_a_rule_boundary_are_valid(model, over):
    assert bits(model, **over) == 0


def test_a2a_at_cp_1_splits_nothing():
    """a2a with cp 1 is no exchange: only the heads rule (16 heads over tp 3) applies, although
    4 / 3 key/value heads a rank would not split."""
    assert bits(MOE, tp=3, cp=1, cp_comm_type=1) == 1


def test_several_rules_add_their_bits():
    # tp 3 (1), ep 3 on 8 experts (2), pp 9 (4), 9 sequences over dp 3 x mb 2 (1024)
    assert bits(MOE, tp=3, ep=3, dp=3, pp=9, global_batch_seqs=9, micro_batch_seqs=2) \
        == 1 + 2 + 4 + 1024
    assert layout_text(1 + 4) == LAYOUT_REASONS[1] + "; " + LAYOUT_REASONS[4]
    assert layout_text(0) == ""


@pytest.mark.parametrize("heads,kv_heads,kv_lora,tp,cp,ok", [
    (16, 4, 0, 1, 4, True),      # 4 kv heads over cp 4
    (16, 4, 0, 2, 4, False),     # 2 a tp rank over cp 4
    (16, 4, 0, 4, 2, False),     # 1 a tp rank over cp 2
    (16, 4, 0, 8, 2, False),     # tp x cp = 16, but half a kv head a rank
    (16, 16, 0, 4, 4, True),     # MHA: 4 a tp rank over 4
    (128, 1, 512, 8, 4, True),   # MLA: its key/value heads are its 128 heads, 16 a rank
    (12, 12, 0, 8, 1, False),    # 12 heads over tp 8
    (12, 6, 0, 4, 1, False),     # 1.5 kv heads a tp rank
])
def test_a2a_head_split_by_hand(heads, kv_heads, kv_lora, tp, cp, ok):
    assert bool(a2a_splits(heads, kv_heads, kv_lora, tp, cp)) is ok
