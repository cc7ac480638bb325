"""`dse predict` columns for the serving mechanisms (contracts/predict-cases.md: optional columns,
typo-checked and range-checked like the others): a case row and the equivalent design give the
same numbers, blank cells are the fields' defaults, bad values exit 2 naming row and column."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

import pandas as pd
import pytest
from helpers import one

from dse.cli import main

BASE = {"case_id": "x", "model": "deepseek-v3", "hardware": "gb200", "num_chips": 8, "tp": 1,
        "pp": 1, "ep": 8, "dp": 8, "weight_dtype": "fp8", "isl": 2048, "osl": 1024,
        "concurrency": 512}
DESIGN = {"accelerator.id": "gb200", "model.id": "deepseek-v3", "model.weight_dtype": "fp8",
          "layout.tp": 1, "layout.pp": 1, "layout.ep": 8, "layout.dp": 8, "workload.isl": 2048,
          "workload.osl": 1024, "workload.concurrency": 512}


def _predict(tmp_path, rows):
    cases, out = tmp_path / "cases.csv", tmp_path / "pred.csv"
    pd.DataFrame(rows).to_csv(cases, index=False)
    so, se = io.StringIO(), io.StringIO()
    with redirect_stdout(so), redirect_stderr(se):
        rc = main(["predict", str(cases), "--out", str(out)])
    if rc != 0:
        return rc, se.getvalue(), None
    # the CSV gives 4 significant digits: the numbers compared are the library's, at full
    # precision, and the CSV is checked to be them as written
    from dse.scoring.predict import csv_frame, predict_frame, read_cases
    full = predict_frame(read_cases(str(cases)))
    written = pd.read_csv(out)
    want = csv_frame(full)
    assert list(written.columns) == list(want.columns)
    for c in want.columns:
        if pd.api.types.is_float_dtype(want[c]):
            pd.testing.assert_series_equal(written[c].astype(float), want[c], check_names=False,
                                           rtol=1e-12)
    return rc, se.getvalue(), full.set_index("case_id")


def test_mechanism_columns_score_as_the_design_fields(tmp_path):
    rows = [{**BASE, "case_id": "mtp", "spec_tokens": 1, "spec_acceptance": 0.7},
            {**BASE, "case_id": "balanced", "expert_imbalance": 1.0},
            {**BASE, "case_id": "default"},
            {**BASE, "case_id": "eplb", "expert_imbalance": 1.5, "redundant_experts": 32},
            {**BASE, "case_id": "spread", "isl_cv": 1.0, "osl_cv": 1.0},
            {**BASE, "case_id": "rate", "concurrency": None, "request_rate_per_s": 20.0,
             "ttft_slo_s": 2.0, "tpot_slo_s": 0.05}]
    rc, err, p = _predict(tmp_path, rows)
    assert rc == 0, err
    same = {"mtp": {"serving.spec_tokens": 1, "serving.spec_acceptance": 0.7},
            "balanced": {"serving.expert_imbalance": 1.0}, "default": {},
            "eplb": {"serving.expert_imbalance": 1.5, "serving.redundant_experts": 32},
            "spread": {"workload.isl_cv": 1.0, "workload.osl_cv": 1.0}}
    for cid, extra in same.items():
        d = one({**DESIGN, **extra})
        for m in ("tpot_s", "ttft_s", "output_tokens_per_s_per_chip"):
            assert p.loc[cid, m] == pytest.approx(d[m], rel=1e-9), (cid, m)
    # a blank expert_imbalance is the published routing model, not balanced experts
    assert p.loc["default", "tpot_s"] > p.loc["balanced", "tpot_s"]
    assert p.loc["mtp", "spec_expected_tokens"] == pytest.approx(1.7, rel=1e-12)   # 1 + a
    d = one({**DESIGN, "workload.request_rate_per_s": 20.0, "workload.ttft_slo_s": 2.0,
             "workload.tpot_slo_s": 0.05})
    # (the request rate's roots are found on float32 times to 1e-4 of the concurrency (the
    # rate's own to 2e-5; 2e-6 before roots.py's sixth pass), so a design's rate metrics may
    # move by up to ~1e-4 with the other designs of its batch: rel 1e-4, was 1e-5)
    for m in ("ttft_p90_s", "tpot_p90_s", "goodput_requests_per_s_per_chip"):
        assert p.loc["rate", m] == pytest.approx(d[m], rel=1e-4), m


def test_mechanism_outputs_are_absent_when_no_case_uses_them(tmp_path):
    rc, err, p = _predict(tmp_path, [BASE])
    assert rc == 0, err
    assert "ttft_p90_s" not in p.columns and "spec_expected_tokens" not in p.columns


@pytest.mark.parametrize("col, value, where", [
    ("spec_tokens", -1, "spec_tokens"), ("isl_cv", "nan", "isl_cv"),
    ("expert_imbalance", 0.5, "expert_imbalance"), ("request_rate_per_s", -2, "request_rate_per_s"),
    ("kv_offload", "hots", "kv_offload"),
])
def test_bad_mechanism_values_exit_2_naming_row_and_column(tmp_path, col, value, where):
    rc, err, _ = _predict(tmp_path, [{**BASE, col: value}])
    assert rc == 2
    assert where in err and "row 2" in err, err
    assert "Traceback" not in err


def test_a_mechanism_column_typo_is_refused(tmp_path):
    rc, err, _ = _predict(tmp_path, [{**BASE, "spec_tokns": 2}])
    assert rc == 2 and "spec_tokns" in err and "spec_tokens" in err, err


def test_a_case_with_both_a_rate_and_a_concurrency_is_refused(tmp_path):
    # the rate sets the concurrency (Little's law); a concurrency beside it would be dropped
    rc, err, _ = _predict(tmp_path, [{**BASE, "request_rate_per_s": 20.0}])
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "row 2 (case_id x), column concurrency" in err
    assert "concurrency = 512 and request_rate_per_s = 20 are both given" in err
    rc, err, p = _predict(tmp_path, [{**BASE, "concurrency": None, "request_rate_per_s": 20.0}])
    assert rc == 0, err
    d = one({**DESIGN, "workload.request_rate_per_s": 20.0})
    assert p.loc["x", "concurrency"] == int(d["concurrency"])
    # (the rate's concurrency is a root found on float32 times, to ~2e-6: see above)
    assert p.loc["x", "tpot_s"] == pytest.approx(d["tpot_s"], rel=1e-5)


def test_a_rate_on_a_single_phase_case_is_refused(tmp_path):
    rc, err, _ = _predict(tmp_path, [{**BASE, "concurrency": None, "phase": "decode",
                                      "request_rate_per_s": 20.0}])
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "request_rate_per_s = 20 on a decode-only instance (phase = 'decode')" in err


def test_predict_states_the_kv_dtype_it_used(tmp_path):
    # contracts/predict-cases.md: a blank kv_dtype is fp8 with fp8/fp4 weights, else bf16; the
    # output says which, and it is the one scored (the same numbers as giving it explicitly)
    L = {"case_id": "x", "model": "llama-3.1-70b", "hardware": "h100-sxm", "num_chips": 4,
         "tp": 4, "pp": 1, "ep": 1, "dp": 1, "isl": 2048, "osl": 256, "concurrency": 16}
    rows = [{**L, "case_id": "fp8w", "weight_dtype": "fp8"},
            {**L, "case_id": "bf16w", "weight_dtype": "bf16"},
            {**L, "case_id": "bf16w_bf16kv", "weight_dtype": "bf16", "kv_dtype": "bf16"},
            {**L, "case_id": "bf16w_fp8kv", "weight_dtype": "bf16", "kv_dtype": "fp8"},
            {**L, "case_id": "fp8w_fp8kv", "weight_dtype": "fp8", "kv_dtype": "fp8"}]
    rc, err, p = _predict(tmp_path, rows)
    assert rc == 0, err
    assert p["kv_dtype"].to_dict() == {"fp8w": "fp8", "bf16w": "bf16", "bf16w_bf16kv": "bf16",
                                       "bf16w_fp8kv": "fp8", "fp8w_fp8kv": "fp8"}
    for a, b in (("bf16w", "bf16w_bf16kv"), ("fp8w", "fp8w_fp8kv")):
        for m in ("tpot_s", "ttft_s", "max_concurrent_sequences"):
            assert p.loc[a, m] == pytest.approx(p.loc[b, m], rel=1e-12), (a, m)
    # half the KV bytes per sequence: about twice the sequences fit beside the same weights
    assert p.loc["bf16w_fp8kv", "max_concurrent_sequences"] > \
        1.9 * p.loc["bf16w", "max_concurrent_sequences"]
