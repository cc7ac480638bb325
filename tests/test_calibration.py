"""The model against the published measurements in ../shared/calibration (regression guard)."""

from __future__ import annotations

import pytest
from helpers import SHARED

TARGET = 1.25   # geometric mean of max(pred/true, true/pred), per source and metric
CAL = SHARED / "calibration"

pytestmark = pytest.mark.skipif(not (CAL / "cases.csv").exists(),
                                reason="../shared/calibration is not next to the checkout")


@pytest.fixture(scope="module")
def report():
    from dse.calibrate import joined, load
    from dse.calibrate import report as make_report
    from dse.predict import predict_frame
    cases, truth = load(CAL)
    j = joined(predict_frame(cases), cases, truth)
    return j, make_report(j)


def test_every_truth_row_gets_a_finite_prediction(report):
    j, _ = report
    assert j["pred"].notna().all()
    assert (j["pred"] > 0).all()


def test_error_within_target_for_every_source_and_metric(report):
    _, r = report
    bad = r[r["error_factor"] > TARGET]
    assert bad.empty, "\n" + bad.to_string()


def test_no_systematic_bias(report):
    _, r = report
    assert ((r["bias"] > 1 / 1.2) & (r["bias"] < 1.2)).all(), "\n" + r.to_string()


def test_error_within_target_for_every_calibrated_accelerator(report):
    from dse.calibrate import report as make_report
    j, _ = report
    r = make_report(j, ("source", "metric", "hardware"))
    assert (r["error_factor"] <= 1.35).all(), "\n" + r.to_string()
