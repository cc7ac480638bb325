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
