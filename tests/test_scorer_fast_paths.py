"""The scorer's fast paths (terms skipped when no row of a batch has them, phase flags as
Python numbers, in-place accumulation) give the numbers of the full arithmetic: the same
designs scored with and without the per-op breakdown, alone and mixed with rows that turn the
skipped terms on, agree."""

import numpy as np
import pytest

from dse.bench import random_designs
from dse.build.designs import resolve, to_batch
from dse.perf import score

KEYS = ("ttft_s", "tpot_s", "step_s", "output_tokens_per_s_per_chip", "usd_per_mtok_input",
        "decode_network_s", "decode_compute_s", "decode_memory_s", "bound", "reason")


@pytest.fixture(scope="module")
def batch():
    return to_batch(resolve(random_designs(400, seed=3)))


def _close(a, b, keys=KEYS, rtol=1e-12):
    for k in keys:
        x, y = np.asarray(a[k], float), np.asarray(b[k], float)
        assert np.array_equal(np.isnan(x), np.isnan(y)), k
        m = np.isfinite(x)
        np.testing.assert_allclose(x[m], y[m], rtol=rtol, err_msg=k)


def test_breakdown_and_plain_scoring_agree(batch):
    plain = score(batch)
    detailed, _ = score(batch, breakdown=True)
    _close(plain, detailed)


@pytest.mark.parametrize("field,value", [("network_overlap_fraction", 0.5),
                                         ("two_batch_overlap", 1.0), ("phase", 2.0),
                                         ("ep", 2.0)])
def test_a_row_that_turns_a_term_on_leaves_the_other_rows_alone(batch, field, value):
    # the first half scored alone (the term is skipped) and next to rows that have it (the term
    # is computed, zero on these rows) give the same numbers
    half = len(batch) // 2
    alone = score(batch.take(slice(0, half)))
    vals = np.asarray(getattr(batch, field), float)
    vals = np.broadcast_to(vals, (len(batch),)).copy()
    vals[half:] = value
    mixed = score(batch.replace(**{field: vals}))
    keys = KEYS if field != "phase" else tuple(k for k in KEYS if k != "ttft_s")
    _close(alone, {k: np.asarray(v)[:half] for k, v in mixed.items()}, keys, rtol=1e-9)


def test_a_lazy_take_reads_as_the_eager_take(batch):
    # (dse.perf.queueing's probe takes its open rows' columns only when its queue times read
    # them: the same rows, the same columns, the same scores)
    rows = np.array([399, 3, 3, 17, 250])
    lazy, eager = batch.take_lazy(rows), batch.take(rows)
    assert len(lazy) == 5 and dict.__len__(lazy.columns) == 0
    np.testing.assert_array_equal(lazy.tp, eager.tp)
    assert dict.__len__(lazy.columns) == 1                     # read: taken
    moved = lazy.replace(concurrency=np.full(5, 7.0))          # still lazy, the update in place
    assert dict.__len__(moved.columns) <= 3 and "isl" in moved.columns   # (+ its dtype's)
    assert moved.has_on("spec_tokens") == eager.has_on("spec_tokens")
    assert sorted(lazy.columns) == sorted(eager.columns)      # iterating: every column
    _close(score(moved), score(eager.replace(concurrency=np.full(5, 7.0))), rtol=0.0)


def test_the_kernel_branch_select_is_np_where_bit_for_bit():
    from dse.perf.forms import select
    rng = np.random.default_rng(1)
    for dt in (np.float32, np.float64):
        yes, no = rng.normal(size=(2, 3, 40)).astype(dt)
        yes[0, :5] = [np.inf, -np.inf, np.nan, 0.0, -0.0]
        no[1, :5] = [np.nan, np.inf, -0.0, 1e30, -np.inf]
        mask = rng.random((3, 40)) < 0.5
        want = np.where(mask, yes, no)
        got = select(mask, yes.copy(), no.copy())
        assert got.dtype == dt
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
        # other shapes: np.where's own
        np.testing.assert_array_equal(select(mask[0], yes, no[0]), np.where(mask[0], yes, no[0]))
