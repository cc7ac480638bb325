"""The end-to-end refit (dse.calibration.fit): resample weights, warm starts and the written uncertainty."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import SHARED

CAL = SHARED / "calibration"
pytestmark = pytest.mark.skipif(not (CAL / "cases.csv").exists(),
                                reason="../shared/calibration is not next to the checkout")


@pytest.fixture(scope="module")
def small():
    """A few H100 and A100 offline cases (fast to refit)."""
    from dse.calibration.cases import load
    from dse.scoring.predict import prepare
    cases, truth = load(CAL)
    pick = cases[cases["source"].eq("TRTLLM-V017")
                 & cases["hardware"].isin(["h100-sxm", "a100-sxm-80g"])
                 & cases["model"].eq("llama-3.1-8b")].reset_index(drop=True)
    truth = truth[truth["case_id"].isin(set(pick["case_id"]))]
    return pick, truth, prepare(pick, file="cases.csv")


def test_counts_are_case_multiplicities(small):
    from dse.calibration.fit import fit
    cases, truth, prep = small
    base = fit(cases, truth, verbose=False, prep=prep)
    # every case drawn twice: the same weights after normalisation, the same fit
    twice = fit(cases, truth, verbose=False, prep=prep, counts=np.full(len(cases), 2))
    assert set(twice) == {"layer_overhead_s"}        # one end-to-end parameter (dse.calibration.fit)
    for k in ("layer_overhead_s",):
        assert twice[k] == pytest.approx(base[k], rel=1e-6)
    # a chip drawn zero times is the same as leaving it out
    a100 = (cases["hardware"] == "a100-sxm-80g").to_numpy()
    zero = fit(cases, truth, verbose=False, prep=prep, counts=(~a100).astype(int))
    out = fit(cases, truth, verbose=False, prep=prep, keep=~a100)
    for k in ("layer_overhead_s",):
        assert zero[k] == pytest.approx(out[k], rel=1e-6)


def test_bootstrap_gives_a_finite_covariance(small):
    from dse.calibration.fit import PARAMS, bootstrap, fit
    cases, truth, prep = small
    theta = fit(cases, truth, verbose=False, prep=prep)
    u = bootstrap(cases, truth, theta, n=4, prep=prep, verbose=False)
    assert u["params"] == [p[0] for p in PARAMS]
    sd = np.array(u["log_sd"])
    assert np.all(np.isfinite(sd)) and np.all(sd > 0)
    # capped at the sd of a uniform draw within the log bounds
    cap = np.array([np.log(p[3] / p[2]) for p in PARAMS]) / np.sqrt(12)
    assert np.all(sd <= cap + 1e-9)
    c = np.array(u["log_corr"])
    assert np.allclose(np.diag(c), 1) and np.allclose(c, c.T) and np.all(np.abs(c) <= 1)
    # seeded: the same draws again
    assert bootstrap(cases, truth, theta, n=4, prep=prep, verbose=False) == u


def test_written_uncertainty_matches_the_catalog_numbers():
    from dse import catalog
    from dse.calibration.fit import PARAMS, uncertainty
    u = uncertainty()
    assert u is not None and u["params"] == [p[0] for p in PARAMS]
    assert u["rule"].startswith("bootstrap")
    sd = np.array(u["log_sd"])
    assert np.all(np.isfinite(sd)) and np.all(sd > 0)
    # the per-layer time is pinned by hundreds of cases: within a factor ~1.5 (1 sd)
    assert sd[[p[0] for p in PARAMS].index("layer_overhead_s")] < np.log(1.5)
    eff = catalog.accelerators()["h100-sxm"].efficiency
    assert "bootstrap" in eff.fitted_on
    assert eff.step_overhead_s == 0.0                 # not fitted: fixed at 0 (dse.calibration.fit.FIXED)
