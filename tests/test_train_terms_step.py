"""The training model's step and memory terms the mutation check found unpinned (issue 25,
point 7), hand-worked on the small designs of test_train_physics (pure roofline): the fitted
per-layer overhead, the memory reserve and fragmentation, the HBM capacity that decides
feasibility, and the recompute policies' rerun forward."""

from __future__ import annotations

import pytest
from test_train_physics import batch

from dse.perf.train_memory import memory_bytes
from dse.perf.train_step import score_train
from dse.perf.train_time import attention_core_s


def test_layer_overhead_is_paid_per_layer_and_micro_batch():
    # 4 micro-batches x 8 layers x 100 us = 3.2 ms more per step, all of it in overhead_s
    b = batch(global_batch_seqs=4)
    s0, s1 = score_train(b), score_train(b.replace(layer_overhead_s=1e-4))
    assert float(s1["step_time_s"] - s0["step_time_s"]) == pytest.approx(3.2e-3, rel=1e-9)
    assert float(s1["overhead_s"] - s0["overhead_s"]) == pytest.approx(3.2e-3, rel=1e-9)
    assert float(s1["memory_s"] - s0["memory_s"]) == 0.0
    # pp = 2: 4 layers a stage, and the 1F1B bubble (p - 1) t_mb carries one micro-batch's:
    # (4 + 1) x 4 x 100 us
    p = b.replace(pp=2)
    d = score_train(p.replace(layer_overhead_s=1e-4))["step_time_s"] - score_train(p)["step_time_s"]
    assert float(d) == pytest.approx(5 * 4 * 1e-4, rel=1e-9)


def test_buffers_are_the_reserve_plus_fragmentation_of_model_state_and_activations():
    # buffers = 2 GB reserve + 10% of (weights + gradients + optimizer + activations)
    b = batch(reserve_bytes=2e9, fragmentation_fraction=0.1)
    m = memory_bytes(b)
    model = m["weights_bytes"] + m["grads_bytes"] + m["optimizer_bytes"]
    assert float(m["buffers_bytes"]) == pytest.approx(2e9 + 0.1 * (model + m["activations_bytes"]),
                                                      rel=1e-12)
    assert float(m["memory_per_chip_bytes"]) == pytest.approx(
        2e9 + 1.1 * (model + m["activations_bytes"]), rel=1e-12)
    # the small dense model: 16 bytes x 117.8e6 parameters = 1.885 GB of model state
    assert float(model) == pytest.approx(16 * (8 * (4 * 1024 ** 2 + 2 * 1024 + 2 * 1024 * 4096)
                                               + 2 * 32000 * 1024), rel=1e-12)


def test_a_design_fits_while_its_peak_memory_is_at_most_the_hbm_capacity():
    b = batch(reserve_bytes=1e9)
    need = float(score_train(b)["memory_per_chip_bytes"])
    for cap, fits in ((need * 1.1, True), (need, True), (need / 1.1, False)):
        s = score_train(b.replace(hbm_capacity_bytes=cap))
        assert bool(s["feasible"]) is fits
        assert int(s["reason"]) == (0 if fits else 1)


def test_recompute_reruns_the_forward_it_dropped():
    """Selective recompute reruns each layer's attention core (one forward); full recompute
    the whole layer's forward: GEMMs, attention core, and its elementwise pass and TP
    collectives a third time."""
    b = batch(global_batch_seqs=1)
    base = score_train(b)["compute_s"]
    sel = score_train(b.replace(recompute=1))["compute_s"]
    assert float(sel - base) == pytest.approx(8 * float(attention_core_s(b)), rel=1e-9)
