"""The training fit (dse.calibration.train_fit): the error factor's weighting, and the catalog's
fitted parameters on the public training set (a regression guard on the figures the
calibration note states)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers import SHARED

from dse.calibration import train_fit

HAVE = (SHARED / "calibration" / "training_cases.csv").exists()


def test_error_factor_weights_sources_equally():
    j = pd.DataFrame({"source": ["a", "a", "a", "b"], "metric": ["m"] * 4,
                      "log_err": [np.log(1.1)] * 3 + [np.log(1.3)]})
    assert train_fit.error_factor(j) == pytest.approx(np.sqrt(1.1 * 1.3))


@pytest.mark.skipif(not HAVE, reason="shared/calibration not next to the checkout")
def test_catalog_parameters_on_the_public_training_set():
    cases, truth = train_fit.load(SHARED / "calibration")
    j = train_fit.joined(cases, truth)
    assert train_fit.error_factor(j) <= 1.10                    # issue 25's in-sample target
    per = train_fit.per_source(j)
    # every source within issue 25's 1.25 (the Megatron-Bridge 25.11 MoE rows too, since an
    # MoE layer pays the fixed time per local expert: docs/training.md)
    assert (per <= 1.25).all(), per
    u, roofline = train_fit.roofline(j)
    assert 0.2 < u < 0.6 and roofline > train_fit.error_factor(j)


@pytest.mark.skipif(not HAVE, reason="shared/calibration not next to the checkout")
def test_fit_ends_at_the_same_values_from_any_start():
    """The fit starts from train_fit.PRIOR, not the catalog's current values, and restarts
    until it stops improving: from a far start it ends at the same values (issue 25 audit:
    one Nelder-Mead run from the catalog ended at (0.911, 0.730, 1.73 ms) where the committed
    values were (0.933, 1.0, 2.20 ms)). Two sources (18 cases) keep it quick."""
    cases, truth = train_fit.load(SHARED / "calibration")
    truth = truth[truth["source"].isin(["NEMO2407", "KORTHI"])]
    cases = cases[cases["case_id"].isin(set(truth["case_id"]))]
    a = train_fit.fit(cases, truth)
    b = train_fit.fit(cases, truth, {"compute_fraction_scale": 0.6, "overlap_fraction": 0.2,
                                     "layer_overhead_s": 3e-3})
    for k in train_fit.FITTED:
        assert b[k] == pytest.approx(a[k], rel=1e-3), k
    # the fit of these 18 cases, as measured when this test was written
    assert a["compute_fraction_scale"] == pytest.approx(0.9333, rel=2e-3)
    assert a["layer_overhead_s"] == pytest.approx(1.373e-3, rel=1e-2)
