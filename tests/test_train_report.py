"""The training calibration report (dse.calibration.train_report, train_compare): its figures
on a hand-made frame of four truths, the files it writes, and which cases llm-analysis can
express. Small and fast: no model run, no llm-analysis import."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from dse.calibration import train_compare as tc
from dse.calibration import train_report as tr
from dse.catalog import training as tcat


def frame() -> pd.DataFrame:
    """Four truths of two sources, as train_fit.joined returns them: a step time and three
    throughputs; every predicted step 10 s at 100 TFLOP/s/chip and MFU 0.5 (so a step at the
    peak takes 5 s)."""
    j = pd.DataFrame({
        "case_id": ["a1", "a2", "b1", "b2"], "source": ["A", "A", "B", "B"],
        "metric": ["step_time_s", "tokens_per_s_per_chip", "tokens_per_s_per_chip",
                   "tokens_per_s_per_chip"],
        "value": [12.5, 1000.0, 800.0, 1250.0], "step_time_s": [10.0] * 4,
        "tokens_per_s_per_chip": [1000.0] * 4, "model_tflops_per_chip": [100.0] * 4,
        "mfu": [0.5] * 4})
    j["pred"] = np.where(j["metric"] == "step_time_s", j["step_time_s"],
                         j["tokens_per_s_per_chip"])
    j["log_err"] = np.abs(np.log(j["pred"] / j["value"]))
    return j


def test_true_step_converts_throughputs_through_the_predicted_tokens():
    assert list(tc.true_step_s(frame())) == pytest.approx([12.5, 10.0, 12.5, 8.0])


def test_roofline_mfu_is_the_geometric_mean_of_the_ratios():
    assert tc.roofline_u([5.0, 5.0], [10.0, 40.0]) == pytest.approx(0.25)


def test_side_by_side_figures_by_hand():
    la = pd.DataFrame({"case_id": ["a1", "a2", "b1", "b2"],
                       "llm_analysis_step_at_1_s": [5.0, 5.0, 5.0, np.nan],
                       "llm_analysis_covered": [True, True, True, False],
                       "llm_analysis_note": ["", "", "", "MoE: no experts"]})
    f, out = tr.side_by_side(frame(), la)
    # dse: |log| 0.223 (a1), 0 (a2), 0.223 (b1), 0.223 (b2); per source A 1.118, B 1.25
    assert out["dse"]["per_source"] == {"A": pytest.approx(np.sqrt(1.25), abs=1e-4),
                                        "B": pytest.approx(1.25, abs=1e-4)}
    # roofline: at-peak 5 s everywhere; u = 5 / geomean(12.5, 10, 12.5, 8) = 5 / 10.57
    u = 5.0 / np.exp(np.mean(np.log([12.5, 10.0, 12.5, 8.0])))
    assert out["roofline"]["mfu"] == pytest.approx(u, abs=1e-4)
    la_out = out["llm_analysis"]
    assert (la_out["covered"], la_out["cases"], la_out["coverage"]) == (3, 4, 0.75)
    # its efficiency on the three it covers: 5 / geomean(12.5, 10, 12.5)
    eff = 5.0 / np.exp(np.mean(np.log([12.5, 10.0, 12.5])))
    assert la_out["flops_efficiency"] == pytest.approx(eff, abs=1e-4)
    assert la_out["not_covered"] == {"b2": "MoE: no experts"}
    assert np.isnan(f.set_index("case_id").loc["b2", "llm_analysis_step_s"])


def test_report_files(tmp_path):
    j = frame()
    report, table = tr.build(j, {"compute_fraction_scale": 0.7}, "four truths",
                             {"A": 1.2, "B": 1.3}, None, "python -m x --report")
    out = tr.write(tmp_path / "training", report, table)
    r = json.loads((out / "report.json").read_text())
    assert r["truths"] == 4 and r["sources"] == {"A": 2, "B": 2}
    assert r["in_sample"]["per_source_metric"]["A"]["step_time_s"]["cases"] == 1
    assert r["leave_one_source_out"] == {"A": 1.2, "B": 1.3}
    assert r["left_out_worst"] == {"source": "B", "error_factor": 1.3}
    assert r["memory"]["truths"] == 0 and r["side_by_side"]["llm_analysis"]["installed"] is False
    page = (out / "README.md").read_text()
    assert "worst **1.300** (B)" in page and "| a1 | 12.5 | 10 |" in page


def test_llm_analysis_cannot_express_moe_or_context_parallel():
    dense = {"model_spec": tcat.lookup("models", "mpt-7b"), "cp": 1.0, "precision": "bf16"}
    assert tc.expressible(dense) == (True, "")
    assert tc.expressible(dict(dense, cp=2.0))[0] is False
    moe = dict(dense, model_spec=tcat.lookup("models", "qwen3-30b-a3b"))
    ok, why = tc.expressible(moe)
    assert not ok and why.startswith("MoE")
    llama = dict(dense, model_spec=tcat.lookup("models", "llama-3.1-8b"), precision="fp8")
    assert tc.expressible(llama) == (True, ("MLP counted as 4h non-gated; fp8 as its 8-bit "
                                           "weight/activation peak"))
