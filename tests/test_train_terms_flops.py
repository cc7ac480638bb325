"""Megatron's FLOP count (dse/perf/train_flops.py, contracts/train-cases.md) for the terms the
mutation check found unpinned (issue 25, point 7): MLA attention and the MTP modules,
hand-worked on the small designs of test_train_physics."""

from __future__ import annotations

import pytest
from test_train_physics import DENSE, MOE, batch
from test_train_terms_memory import MLA

from dse.perf.train_flops import attention_width, megatron_flops


def test_mla_attention_width_by_hand():
    """A (MLA) = r_q (h + n_h (d_nope + d_rope) + 1) + r_kv (h + n_h (d_nope + d_v) + 1)
    + h d_rope + n_h d_v h + s n_h (d_nope + d_rope) / 2 + s n_h d_v / 2 (the +1: the LoRA
    norms), with h 1024, n_h 16, r_q 512, r_kv 256, d_nope 128, d_rope 64, d_v 128, s 2048."""
    b = batch(MLA)
    q = 512 * (1024 + 16 * 192 + 1)
    kv = 256 * (1024 + 16 * 256 + 1)
    a = q + kv + 1024 * 64 + 16 * 128 * 1024 + 2048 * 16 * 192 / 2 + 2048 * 16 * 128 / 2
    # 2,097,664 + 1,310,976 + 65,536 + 2,097,152 + 3,145,728 + 2,097,152
    assert a == 10_814_208
    assert float(attention_width(b, 2048.0)) == pytest.approx(a, rel=1e-12)
    # without a query LoRA: one h x n_h (d_nope + d_rope) projection
    nolora = batch({**MLA, "q_lora_rank": 0})
    assert float(attention_width(nolora, 2048.0)) == pytest.approx(a - q + 1024 * 16 * 192,
                                                                  rel=1e-12)


def test_mtp_modules_in_the_flop_count():
    """Each MTP module adds one transformer layer (MoE when the model's layers are), its
    projection 2h -> h with two norms (3h + 2h^2) and a logits layer h V."""
    h, s, B, V = 1024, 2048, 8, 32000
    d = batch(DENSE)
    layer = 2 * h * 4096 + 4 * h * h + 1024 * s              # MLP E f h + A (MHA)
    extra = layer + 3 * h + 2 * h * h + h * V
    assert float(megatron_flops(d.replace(mtp_layers=1)) - megatron_flops(d)) == pytest.approx(
        6 * B * s * extra, rel=1e-12)
    m = batch(MOE)
    a = h * (1024 + 2 * 256) + 1024 * s + 1024 * h
    moe_layer = h * 3 * 512 * 2 + a                          # top-2 routed experts
    extra = moe_layer + 3 * h + 2 * h * h + h * V
    assert float(megatron_flops(m.replace(mtp_layers=1)) - megatron_flops(m)) == pytest.approx(
        6 * B * s * extra, rel=1e-12)


def test_mtp_module_of_a_model_with_dense_and_moe_layers_is_moe():
    # 4 MoE layers of 8, the dense ones 2048 wide: the MTP layer counts the routed experts,
    # not the dense MLP
    h, s, B, V = 1024, 2048, 8, 32000
    m = batch({**MOE, "moe_layers": 4, "ffn": 2048})
    a = h * (1024 + 2 * 256) + 1024 * s + 1024 * h
    extra = h * 3 * 512 * 2 + a + 3 * h + 2 * h * h + h * V
    assert float(megatron_flops(m.replace(mtp_layers=1)) - megatron_flops(m)) == pytest.approx(
        6 * B * s * extra, rel=1e-12)


def test_full_recompute_reruns_every_layer_but_no_logits_layer():
    # F_recompute (full) = (F - 6 B s h V (1 + m)) / 3: every transformer layer's forward
    from dse.perf.train_flops import recompute_flops
    h, s, B, V = 1024, 2048, 8, 32000
    b = batch(DENSE, mtp_layers=1, recompute=2)
    f = float(megatron_flops(b))
    assert float(recompute_flops(b)) == pytest.approx((f - 6 * B * s * h * V * 2) / 3, rel=1e-12)


def test_hfu_counts_the_recomputed_flops():
    """MFU = F / (step x chips x peak); HFU adds the FLOPs the recompute policy reruns."""
    from test_train_physics import PEAK

    from dse.perf.train_flops import recompute_flops
    from dse.perf.train_step import score_train
    b = batch(DENSE, dp=2, recompute=2)
    s = score_train(b)
    f, r = float(megatron_flops(b)), float(recompute_flops(b))
    assert r > 0
    step = float(s["step_time_s"])
    assert float(s["mfu"]) == pytest.approx(f / step / 2 / PEAK, rel=1e-12)
    assert float(s["hfu"]) == pytest.approx((f + r) / step / 2 / PEAK, rel=1e-12)
