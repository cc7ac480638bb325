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
    assert train_fit.error_factor(j) < 1.15
    assert (train_fit.per_source(j) < 1.25).all()
    u, roofline = train_fit.roofline(j)
    assert 0.2 < u < 0.6 and roofline > train_fit.error_factor(j)
