"""The attention core of a model with sliding-window layers (gpt-oss: 18 of 36 layers attend to
128 keys), hand-worked on the small dense design of test_train_physics at roofline (peak
1e15 FLOP/s, fraction 1): a layer's core costs 2 x heads x (d_qk + d_v) x its causal pairs,
a local layer's pairs capped at the window plus the kernel's padding
(``attn_prefill_window_pad_tokens``, the serving prefill model's)."""

from __future__ import annotations

import pytest
from test_train_physics import DENSE, PEAK, batch

from dse.perf.train_time import attention_core_s
from dse.scoring.train_predict import design_numbers

FULL = 2048 * 2049 / 2           # causal pairs of one 2048-token sequence: 2,098,176
LOCAL = 2048 * (256 + 64)        # a 256-token window plus 64 padded keys: 655,360
PER_PAIR = 2 * 16 * (64 + 64)    # FLOPs a pair: 16 heads, d_qk = d_v = 64


def test_local_layers_attend_to_their_window_by_hand():
    full = PER_PAIR * FULL / PEAK
    local = PER_PAIR * LOCAL / PEAK
    assert full == pytest.approx(8.594e-6, rel=1e-3) and local == pytest.approx(2.684e-6, rel=1e-3)
    pad = {"kernel": {"attn_prefill_window_pad_tokens": 64.0}}
    assert float(attention_core_s(batch(DENSE, **pad))) == pytest.approx(full, rel=1e-12)
    # half the layers local: the mean layer costs (8.594 + 2.684) / 2 = 5.639 us
    half = batch(DENSE, sliding_window=256, local_layers=4, **pad)
    assert float(attention_core_s(half)) == pytest.approx((full + local) / 2, rel=1e-12)
    assert float(attention_core_s(half)) == pytest.approx(5.639e-6, rel=1e-3)
    every = batch(DENSE, sliding_window=256, local_layers=8, **pad)
    assert float(attention_core_s(every)) == pytest.approx(local, rel=1e-12)
    # a window as long as the sequence is full attention; no window, the local count is moot
    wide = batch(DENSE, sliding_window=4096, local_layers=8, **pad)
    assert float(attention_core_s(wide)) == pytest.approx(full, rel=1e-12)
    assert float(attention_core_s(batch(DENSE, local_layers=8, **pad))) == \
        pytest.approx(full, rel=1e-12)


def test_the_catalog_gives_gpt_oss_its_local_layers():
    from dse.catalog import training as tcat
    m = tcat.lookup("models", "gpt-oss-120b")
    acc, _ = tcat.lookup("accelerators", "h100-sxm")
    topo = tcat.lookup("topologies", "hgx-8")
    c = design_numbers(m, acc, topo, "bf16", {})
    assert (c["sliding_window"], c["local_layers"], c["num_layers"]) == (128.0, 18.0, 36)
