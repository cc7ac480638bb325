"""The model against the published measurements in ../shared/calibration (regression guard).

One group is held to its own, looser bound, for a reason outside the model's physics: the
online rows at an infinite request rate carry no concurrency (``dse.calibration.cases.fittable``; 500
requests were sent, so their concurrency was set by the burst, which a case cannot say).
Multi-GPU L40S, which used to be a second such group (its aiconfigurator all-reduce tables come
from a box without PCIe peer-to-peer), is held to the common bound since the comm fit's
host-staged rule (``dse.calibration.kernels.comm.host_staged``).

The figures asserted per source are those of the sets they were written for (``TRTLLM``: the
v0.17 offline and v0.14 online tables of cases.csv; the online rows at a finite request rate are
scored open-loop, ``dse.calibration.cases.OPEN_LOOP``: M/D/1 queueing for the prefill at the
stated QPS). The Hopper set (``silicon_hopper_*``, source AIC-SILICON: three runtimes, MLA,
fine-grained MoE, closed-loop TTFT) is held to regression bounds at the figures of its first
composition fit (issue 28), +5%: the issue's targets (TPOT <= 1.15, TTFT <= 1.35) are not met
yet.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import SHARED

TARGET = 1.25   # geometric mean of max(pred/true, true/pred), per source and metric
CAL = SHARED / "calibration"
KNOWN = "(max rate, no concurrency)"
TRTLLM = ("TRTLLM-V017", "TRTLLM-ONLINE")     # the sets the figures below were written for

pytestmark = pytest.mark.skipif(not (CAL / "cases.csv").exists(),
                                reason="../shared/calibration is not next to the checkout")


@pytest.fixture(scope="module")
def report():
    from dse.calibration.calibrate import report as make_report
    from dse.calibration.cases import joined, load
    from dse.scoring.predict import predict_frame
    cases, truth = load(CAL)
    everything = joined(predict_frame(cases), cases, truth)
    j = everything[everything["source"].str.split(" ").str[0].isin(TRTLLM)]
    j = j.merge(cases[["case_id", "tp"]], on="case_id")
    j["pcie_multi"] = (j["hardware"] == "l40s") & (j["tp"].astype(float) > 1)
    return j, make_report(j[~j["pcie_multi"]]), everything


def test_every_truth_row_gets_a_finite_prediction(report):
    *_, everything = report        # the Hopper set too
    assert everything["source"].str.startswith("AIC-SILICON").sum() == 1811
    assert everything["pred"].notna().all()
    assert (everything["pred"] > 0).all()


def test_error_within_target_for_every_source_and_metric(report):
    _, r, _ = report
    r = r[~r["source"].str.contains(KNOWN, regex=False)]
    assert len(r) == 3           # V017 output tokens/s, online TPOT and TTFT
    bad = r[r["error_factor"] > TARGET]
    assert bad.empty, "\n" + bad.to_string()


def test_no_systematic_bias(report):
    _, r, _ = report
    r = r[~r["source"].str.contains(KNOWN, regex=False)]
    assert ((r["bias"] > 1 / 1.25) & (r["bias"] < 1.25)).all(), "\n" + r.to_string()


def test_error_within_target_for_every_calibrated_accelerator(report):
    from dse.calibration.calibrate import report as make_report
    j, _, _ = report
    j = j[~j["pcie_multi"] & ~j["source"].str.contains(KNOWN, regex=False)]
    r = make_report(j, ("source", "metric", "hardware"))
    assert (r["error_factor"] <= 1.35).all(), "\n" + r.to_string()


def test_known_limits_stay_within_their_measured_bounds(report):
    # regression bounds at the figures measured on 2026-12-02 (1.49 / 1.91), +10%
    _, r, _ = report
    known = r[r["source"].str.contains(KNOWN, regex=False)]
    assert len(known) == 2 and (known["error_factor"] <= 2.1).all(), "\n" + known.to_string()


# the Hopper set's figures at the first composition fit (2026-12-05), +5% (module docstring)
HOPPER_BOUNDS = {"tpot_s": 1.25, "ttft_s": 1.43}


def test_the_hopper_set_stays_within_its_regression_bounds(report):
    from dse.calibration.calibrate import report as make_report
    *_, everything = report
    r = make_report(everything[everything["source"] == "AIC-SILICON"])
    got = dict(zip(r["metric"], r["error_factor"]))
    assert set(got) == set(HOPPER_BOUNDS)
    assert all(got[m] <= b for m, b in HOPPER_BOUNDS.items()), "\n" + r.to_string()


def test_multi_gpu_l40s_within_target(report):
    """TP 4/8 L40S over PCIe (was 3.3x too slow on the host-staged all-reduce tables; 1.14 on
    2026-12-02): within the per-accelerator bound, and not systematically too slow."""
    from dse.calibration.calibrate import report as make_report
    j, _, _ = report
    r = make_report(j[j["pcie_multi"]], ("source", "metric"))
    assert (r["error_factor"] <= 1.35).all(), "\n" + r.to_string()
    assert (r["bias"] > 0.8).all(), "\n" + r.to_string()


def test_every_model_family_within_target_offline(report):
    """Each model family of the offline TensorRT-LLM v0.17 set on its own (Llama 1.10, Mixtral
    1.08 on 2026-12-02): Mixtral was 1.22, always too slow, while a width-0 shared expert and
    the router's width-edge penalty cost it ~30% of a decode step (dse/perf/step.py)."""
    from dse.calibration.calibrate import report as make_report
    j, _, _ = report
    j = j[~j["pcie_multi"] & (j["source"] == "TRTLLM-V017")]
    j = j.assign(family=j["model"].str.split("-").str[0])
    r = make_report(j, ("source", "metric", "family"))
    assert len(r) == 2 and (r["error_factor"] <= 1.18).all(), "\n" + r.to_string()


def test_load_reads_both_serving_sets():
    from dse.calibration.cases import load
    cases, truth = load(CAL)
    assert len(cases) == 364 + 916 and cases["case_id"].is_unique
    assert cases["source"].value_counts().to_dict() == {
        "AIC-SILICON": 916, "TRTLLM-V017": 328, "TRTLLM-ONLINE": 36}
    assert len(truth) == 400 + 1811
    hopper = cases[cases["source"] == "AIC-SILICON"]
    assert set(hopper["runtime"]) == {"trtllm", "sglang", "vllm"}
    assert (hopper["phase"] == "decode").sum() == 21
    # the contract's extra columns are kept (the silicon file's backend version, the flags)
    assert (hopper["backend"] == hopper["runtime"]).all() and hopper["snapshot"].notna().all()
    assert hopper["backend_version"].notna().sum() == 665 and "quality_flag" in truth


def test_load_without_the_hopper_set_reads_the_rest(tmp_path):
    from dse.calibration.cases import load
    for f in ("cases.csv", "truth.csv"):
        (tmp_path / f).write_bytes((CAL / f).read_bytes())
    cases, truth = load(tmp_path)
    assert len(cases) == 364 and len(truth) == 400


def test_open_loop_rows_carry_their_request_rate():
    from dse.calibration.cases import RATE, fittable, load
    cases, _ = load(CAL)
    online = cases[cases["source"] == "TRTLLM-ONLINE"]
    rate = online[RATE].astype(float)
    at_rate = online[rate.notna()]
    # QPS=2 and QPS=16 rows (their note), at a finite positive rate and no fixed concurrency
    assert len(at_rate) == 24
    assert sorted(rate.dropna().unique()) == [2.0, 16.0]
    assert np.isfinite(rate.dropna()).all() and (rate.dropna() > 0).all()
    for _, row in at_rate.iterrows():
        assert f"QPS={float(row[RATE]):g};" in row["note"]
    assert at_rate["concurrency"].isna().all()
    assert at_rate["derived_concurrency"].astype(float).ge(1).all()
    # QPS=INF rows: no rate to read, left as they were (not fitted: no concurrency)
    inf = online[rate.isna()]
    assert len(inf) == 12 and inf["note"].str.contains("QPS=INF").all()
    assert not fittable(inf).any() and fittable(at_rate).all()
    assert cases.loc[cases["source"] != "TRTLLM-ONLINE", RATE].isna().all()


def test_queue_suspect_truths_are_reported_apart_and_never_fitted(report):
    from dse.calibration.cases import QUEUE_SUSPECT, load, queue_suspect
    from dse.calibration.fit import fit_base
    cases, truth = load(CAL)
    flagged = queue_suspect(truth)
    # 50 flagged TTFTs, and the TPOTs of the same 50 cases (their running batch is unknown)
    assert flagged.sum() == 100
    base = fit_base(cases, truth)
    pairs = set(zip(truth["case_id"][flagged], truth["metric"][flagged]))
    assert {m for _, m in pairs} == {"ttft_s", "tpot_s"}
    assert len({c for c, _ in pairs}) == 50
    assert not any(k in pairs for k in zip(base["case_id"], base["metric"]))
    assert not base["quality_flag"].fillna("").str.contains("queue_suspect").any()
    # every other truth of a fittable case is fitted (less the 24 truths of the QPS=INF rows
    # and the 29 cold-start TTFTs that are not queue-suspect as well)
    assert len(base) == len(truth) - 100 - 24 - 29
    *_, everything = report
    apart = everything[everything["source"].str.endswith(QUEUE_SUSPECT)]
    assert len(apart) == 100 and set(apart["source"]) == {"AIC-SILICON" + QUEUE_SUSPECT}


def test_cold_start_ttfts_are_reported_apart_and_never_fitted(report):
    """InferenceX's TensorRT-LLM DeepSeek runs measured before its client warmed up
    (2026-01-21): the TTFTs of their 30 cases (one also queue-suspect) are set apart, their TPOTs
    kept; the
    run of 2026-01-28 and every other runtime's rows are not."""
    from dse.calibration.cases import COLD_START, cold_start, cold_start_cases, load
    from dse.calibration.fit import fit_base
    cases, truth = load(CAL)
    on = cold_start_cases(cases)
    assert on.sum() == 30
    picked = cases[on]
    assert set(picked["runtime"]) == {"trtllm"} and set(picked["model"]) == {"deepseek-v3"}
    assert picked["citation"].str.extract(r"measured=(\S{10})")[0].max() < "2026-01-21"
    flagged = cold_start(truth)
    assert flagged.sum() == 30 and set(truth["metric"][flagged]) == {"ttft_s"}
    base = fit_base(cases, truth)
    ids = set(picked["case_id"])
    assert not ((base["metric"] == "ttft_s") & base["case_id"].isin(ids)).any()
    # their TPOTs are fitted, but for the queue-suspect one's
    assert ((base["metric"] == "tpot_s") & base["case_id"].isin(ids)).sum() == 29
    *_, everything = report
    apart = everything[everything["source"].str.endswith(COLD_START)]
    assert len(apart) == 29 and set(apart["metric"]) == {"ttft_s"}

