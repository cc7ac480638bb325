"""The training scorer's per-layer terms and layout rules computed once per distinct
``layer_code`` (``train_batch.by_layer_code``): the same numbers, bit for bit, as per design,
and ``layer_terms`` reads no layout or job field outside ``train_batch.LAYER_LAYOUT``."""

from __future__ import annotations

import dataclasses

import numpy as np

from dse.bench import TRAIN_GRID, TRAIN_MOE
from dse.build.space import load_space
from dse.perf.train_batch import LAYER_LAYOUT, layer_rows
from dse.perf.train_layout import layout_bits
from dse.perf.train_step import layer_terms, score_train
from dse.scoring import train_space


def _space(tmp_path, text):
    p = tmp_path / "space.toml"
    p.write_text(text)
    return load_space(str(p))


def _batch(space, ids):
    coords = np.unravel_index(ids, space.shape)
    vals = {p.column: (train_space.GridStrings(p.values, c)
                       if any(isinstance(v, str) for v in p.values)
                       else np.asarray(p.values, np.float32)[c])
            for p, c in zip(space.parameters, coords)}
    grid = {p.column: (p.values, c) for p, c in zip(space.parameters, coords)}
    return train_space.build(space, vals, len(ids), grid=grid)[0]


def test_layer_rows_hand_worked():
    b = _batch_of_codes(np.array([2, 0, 2, 2, 0, 2]))
    first, inverse = layer_rows(b)
    # codes 0 and 2 present: slots 0 and 1, each design's slot; a representative of each
    assert inverse.tolist() == [1, 0, 1, 1, 0, 1]
    assert sorted(np.array([2, 0, 2, 2, 0, 2])[first].tolist()) == [0, 2]
    # more than half the designs distinct: not worth it; no codes: none
    assert layer_rows(_batch_of_codes(np.array([0, 1, 1, 0]))) is not None
    assert layer_rows(_batch_of_codes(np.array([0, 1, 2, 2]))) is None
    assert layer_rows(_batch_of_codes(None)) is None


def _batch_of_codes(code):
    from dse.perf.train_batch import TrainBatch
    names = [f.name for f in dataclasses.fields(TrainBatch) if f.default is dataclasses.MISSING]
    return TrainBatch(**{k: 1.0 for k in names if k != "kernel"}, kernel={}, layer_code=code)


def test_builder_codes_the_moe_grid_and_scores_bit_for_bit(tmp_path):
    space = _space(tmp_path, TRAIN_MOE)
    ids = np.random.default_rng(0).choice(space.size, 20000, replace=False)
    b = _batch(space, ids)
    assert b.layer_code is not None
    first, inverse = layer_rows(b)
    assert len(first) < len(ids) / 4         # 4 chips x 4 models x 2 precisions x 4 tp x ...
    # designs of one code: equal LAYER_LAYOUT fields
    for k in LAYER_LAYOUT:
        v = np.broadcast_to(getattr(b, k), (len(ids),))
        assert np.array_equal(v, v[first][inverse])
    a, c = score_train(b, 0), score_train(b.replace(layer_code=None), 0)
    assert b.replace(tp=b.tp).layer_code is None        # a replaced field drops the codes
    for k in a:
        assert np.array_equal(a[k], c[k], equal_nan=True), k


def test_mixed_grid_scored_rows_bit_for_bit(tmp_path):
    """The mixed grid (most layouts invalid: the scorer takes the valid rows, codes and all)."""
    space = _space(tmp_path, TRAIN_GRID)
    ids = np.arange(0, space.size, 7)[:30000]
    s = train_space.score_index(space, ids)
    b = _batch(space, ids)
    rows = np.flatnonzero(np.asarray(s["reason"]) & ~(train_space.MEMORY_BIT | 512) == 0)
    # the layout bits (heads / tp, experts / ep, seq_len / 2 cp once per code): as per design
    assert np.array_equal(layout_bits(b), layout_bits(b.replace(layer_code=None)))
    assert (layout_bits(b) & 2).any()       # ep 8 on a dense model: broken in codes
    sub = b.take(rows)
    assert layer_rows(sub) is not None
    direct = score_train(sub.replace(layer_code=None), 0)
    assert np.array_equal(np.asarray(s["step_time_s"])[rows], direct["step_time_s"])
    assert np.array_equal(np.asarray(s["memory_per_chip_bytes"])[rows],
                          direct["memory_per_chip_bytes"])


def test_layer_terms_read_no_other_layout_field(tmp_path):
    """Every per-design layout and job field outside LAYER_LAYOUT shuffled: the per-layer
    terms do not move (so designs of one code may share them)."""
    space = _space(tmp_path, TRAIN_MOE)
    b = _batch(space, np.arange(0, space.size, 11))
    n = len(b.tp)
    rng = np.random.default_rng(1)
    other = {k: rng.permutation(np.resize(np.asarray(v, np.float32), n))
             for k, v in [("pp", [1, 2, 4, 8]), ("dp", [8, 64, 256]), ("vp", [1, 2, 3]),
                          ("zero_stage", [0, 1, 2, 3]), ("recompute", [0, 1, 2]),
                          ("recompute_layer_fraction", [0.25, 1.0]),
                          ("schedule", [0, 1, 2, 3]), ("global_batch_seqs", [256, 1024]),
                          ("mtp_layers", [0, 1]), ("tp_comm_overlap", [0, 1, 2]),
                          ("overlap_p2p_comm", [0, 1]), ("overlap_grad_reduce", [0, 1]),
                          ("p2p_scatter_gather", [0, 1]), ("cp_comm_type", [0, 1, 2]),
                          ("recompute_norms", [0, 1]),
                          ("recompute_moe_act", [0, 1])]}
    a, c = layer_terms(b), layer_terms(b.replace(**other))
    for k in a:
        assert np.array_equal(a[k], c[k], equal_nan=True), k


def test_first_max_is_argmax():
    """The step's bound: the first of the largest part, a NaN the largest (np.argmax's)."""
    from dse.perf.train_step import first_max
    nan = np.nan
    c = np.array([3.0, 1.0, 2.0, nan, 1.0, 5.0, 2.0], np.float32)
    m = np.array([3.0, 2.0, 1.0, 1.0, nan, nan, 2.0], np.float32)
    n = np.array([1.0, 2.0, 4.0, nan, 1.0, 1.0, 2.0], np.float32)
    bub = 2.0
    assert first_max(c, m, n, bub).tolist() == [0, 1, 2, 0, 1, 1, 0]
    assert first_max(c, m, n, bub).tolist() == np.argmax(
        np.stack(np.broadcast_arrays(c, m, n, bub)), axis=0).tolist()


def test_gathered_kernel_hand_worked():
    """Kernel keys gathered from a (keys x combinations) table on first read; take keeps the
    table and picks the index."""
    from dse.perf.train_batch import GatheredKernel
    k = GatheredKernel({"a": 1.5}, ["b"], np.array([[10.0, 20.0, 30.0]]), np.array([2, 0, 2]))
    assert k["a"] == 1.5 and k["b"].tolist() == [30.0, 10.0, 30.0]
    assert sorted(k) == ["a", "b"] and len(k) == 2 and k.get("c", 0.0) == 0.0
    assert k.take(np.array([1]))["b"].tolist() == [10.0]
