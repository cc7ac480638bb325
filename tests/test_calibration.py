"""The model against the published measurements in ../shared/calibration (regression guard).

One group is held to its own, looser bound, for a reason outside the model's physics: the
online rows at an infinite request rate carry no concurrency (``dse.calibration.cases.fittable``; 500
requests were sent, so their concurrency was set by the burst, which a case cannot say).
Multi-GPU L40S, which used to be a second such group (its aiconfigurator all-reduce tables come
from a box without PCIe peer-to-peer), is held to the common bound since the comm fit's
host-staged rule (``dse.calibration.kernels.comm.host_staged``).
"""

from __future__ import annotations

import pytest
from helpers import SHARED

TARGET = 1.25   # geometric mean of max(pred/true, true/pred), per source and metric
CAL = SHARED / "calibration"
KNOWN = "(max rate, no concurrency)"

pytestmark = pytest.mark.skipif(not (CAL / "cases.csv").exists(),
                                reason="../shared/calibration is not next to the checkout")


@pytest.fixture(scope="module")
def report():
    from dse.calibration.calibrate import report as make_report
    from dse.calibration.cases import joined, load
    from dse.scoring.predict import predict_frame
    cases, truth = load(CAL)
    j = joined(predict_frame(cases), cases, truth)
    j = j.merge(cases[["case_id", "tp"]], on="case_id")
    j["pcie_multi"] = (j["hardware"] == "l40s") & (j["tp"].astype(float) > 1)
    return j, make_report(j[~j["pcie_multi"]])


def test_every_truth_row_gets_a_finite_prediction(report):
    j, _ = report
    assert j["pred"].notna().all()
    assert (j["pred"] > 0).all()


def test_error_within_target_for_every_source_and_metric(report):
    _, r = report
    r = r[~r["source"].str.contains(KNOWN, regex=False)]
    bad = r[r["error_factor"] > TARGET]
    assert bad.empty, "\n" + bad.to_string()


def test_no_systematic_bias(report):
    _, r = report
    r = r[~r["source"].str.contains(KNOWN, regex=False)]
    assert ((r["bias"] > 1 / 1.25) & (r["bias"] < 1.25)).all(), "\n" + r.to_string()


def test_error_within_target_for_every_calibrated_accelerator(report):
    from dse.calibration.calibrate import report as make_report
    j, _ = report
    j = j[~j["pcie_multi"] & ~j["source"].str.contains(KNOWN, regex=False)]
    r = make_report(j, ("source", "metric", "hardware"))
    assert (r["error_factor"] <= 1.35).all(), "\n" + r.to_string()


def test_known_limits_stay_within_their_measured_bounds(report):
    # regression bounds at the figures measured on 2026-12-02 (1.49 / 1.91), +10%
    j, r = report
    known = r[r["source"].str.contains(KNOWN, regex=False)]
    assert len(known) == 2 and (known["error_factor"] <= 2.1).all(), "\n" + known.to_string()


def test_multi_gpu_l40s_within_target(report):
    """TP 4/8 L40S over PCIe (was 3.3x too slow on the host-staged all-reduce tables; 1.14 on
    2026-12-02): within the per-accelerator bound, and not systematically too slow."""
    from dse.calibration.calibrate import report as make_report
    j, _ = report
    r = make_report(j[j["pcie_multi"]], ("source", "metric"))
    assert (r["error_factor"] <= 1.35).all(), "\n" + r.to_string()
    assert (r["bias"] > 0.8).all(), "\n" + r.to_string()


def test_every_model_family_within_target_offline(report):
    """Each model family of the offline TensorRT-LLM v0.17 set on its own (Llama 1.10, Mixtral
    1.08 on 2026-12-02): Mixtral was 1.22, always too slow, while a width-0 shared expert and
    the router's width-edge penalty cost it ~30% of a decode step (dse/perf/step.py)."""
    from dse.calibration.calibrate import report as make_report
    j, _ = report
    j = j[~j["pcie_multi"] & (j["source"] == "TRTLLM-V017")]
    j = j.assign(family=j["model"].str.split("-").str[0])
    r = make_report(j, ("source", "metric", "family"))
    assert len(r) == 2 and (r["error_factor"] <= 1.18).all(), "\n" + r.to_string()
