"""The attention core's backward in training: 2.5 times the forward's FLOPs (FlashAttention-2,
Dao 2023: 5 matmuls vs 2) at 0.867 of its rate (FlashAttention-3, Shah et al. 2024,
arXiv:2407.08608: backward over forward TFLOP/s on H100 SXM5, head dim 128, 16k tokens, no
causal mask; FA2 322 / 370, cuDNN 516 / 595, FA3 561 / 648), so 2.88 forward times."""

from __future__ import annotations

import pytest
from test_train_physics import DENSE, batch

from dse.catalog import training as tcat
from dse.perf.train_step import score_train

FIGURE = {"FlashAttention-2": (322.0, 370.0), "cuDNN": (516.0, 595.0),
          "FlashAttention-3": (561.0, 648.0)}     # (backward, forward) TFLOP/s


def test_the_backward_rate_ratio_is_the_same_for_the_three_kernels():
    ratios = [bwd / fwd for bwd, fwd in FIGURE.values()]
    assert ratios == pytest.approx([0.8703, 0.8672, 0.8657], abs=1e-4)
    assert max(ratios) - min(ratios) < 0.005


def test_the_catalog_prior_is_the_flop_ratio_over_the_rate_ratio():
    rate = sum(bwd / fwd for bwd, fwd in FIGURE.values()) / len(FIGURE)      # 0.8677
    assert 2.5 / rate == pytest.approx(2.881, abs=1e-3)
    assert tcat.train_parameters()["attention_bwd_ratio"] == pytest.approx(2.5 / rate, rel=0.01)


def test_a_long_sequence_pays_the_backward_at_the_prior_by_hand():
    # the dense test model at roofline (1 PFLOP/s), one sequence of 65,536 tokens, 8 layers:
    # causal pairs 65536 * 65537 / 2 = 2.1475e9; forward 2 * 16 heads * (64 + 64) * pairs =
    # 8.796e12 FLOPs = 8.796 ms a layer; the backward adds 2.88 of it: 8 * 2.88 * 8.796 ms
    r = tcat.train_parameters()["attention_bwd_ratio"]
    long = {"seq_len": 65536, "global_batch_seqs": 1}
    with_bwd = score_train(batch(DENSE, attention_bwd_ratio=r, **long))["compute_s"]
    without = score_train(batch(DENSE, attention_bwd_ratio=0.0, **long))["compute_s"]
    fwd_s = 2 * 16 * 128 * 65536 * 65537 / 2 / 1e15
    assert fwd_s == pytest.approx(8.796e-3, rel=1e-3)
    assert float(with_bwd - without) == pytest.approx(8 * 2.88 * fwd_s, rel=0.01)
    assert float(with_bwd - without) == pytest.approx(0.2027, rel=0.01)
