"""A case's harness lengths (``length_dist``: ``uniform[aL,bL]``, dse.scoring.harness): scored at
the mean lengths with their spread, worked by hand; every other ``length_dist`` untouched."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers import run_cli

from dse.scoring.harness import apply_lengths, spread

INFERENCEX = ("uniform[0.8L,L] (InferenceX benchmark_serving --random-range-ratio 0.8, "
              "--max-concurrency C)")
AIPERF = "unknown; AIC bench template uses aiperf fixed L (stddev 0)"
# uniform on [0.8 L, L]: mean 0.9 L, sd 0.2 L / sqrt(12) = 0.057735 L, cv 0.057735 / 0.9
CV_08 = 0.2 / np.sqrt(12.0) / 0.9


def test_spread_by_hand():
    share, cv, bad = spread(pd.Series([INFERENCEX, AIPERF, np.nan, "uniform[0.5L,1.5L]",
                                       "uniform[1.2L,L]", "uniform[L,L]"]))
    np.testing.assert_allclose(share, [0.9, 1.0, 1.0, 1.0, 1.0, 1.0])
    np.testing.assert_array_equal(bad, [False, False, False, False, True, False])
    np.testing.assert_allclose(cv[0], CV_08, rtol=1e-12)
    assert cv[0] == pytest.approx(0.06415, abs=1e-5)
    # [0.5 L, 1.5 L]: mean L (share 1) with a spread, b < a: malformed
    np.testing.assert_array_equal(cv[1:], [0.0, 0.0, 1.0 / (np.sqrt(3.0) * 2.0), 0.0, 0.0])


def test_apply_lengths_means_and_spread():
    cases = pd.DataFrame({"case_id": ["ix", "aic", "given", "about"],
                          "isl": ["1024", "1024", "8192", "1000"],
                          "osl": ["8192", "128", "1024", "100"],
                          "length_dist": [INFERENCEX, AIPERF, INFERENCEX, "uniform[0.5L,1.5L]"],
                          "isl_cv": [np.nan, np.nan, 0.5, np.nan]})
    out = apply_lengths(cases)
    # 0.9 x 1024 = 921.6 -> 922, 0.9 x 8192 = 7372.8 -> 7373; [0.5 L, 1.5 L]: mean L, cv
    # (1.5 - 0.5) / (sqrt(3) x 2) = 0.2887
    assert out["isl"].tolist() == [922, "1024", 7373, 1000]
    assert out["osl"].tolist() == [7373, "128", 922, 100]
    about = 1.0 / (np.sqrt(3.0) * 2.0)
    np.testing.assert_allclose(out["isl_cv"].to_numpy(float), [CV_08, np.nan, 0.5, about])
    np.testing.assert_allclose(out["osl_cv"].to_numpy(float), [CV_08, np.nan, CV_08, about])
    assert cases["isl"].tolist() == ["1024", "1024", "8192", "1000"]  # the input is not modified
    plain = cases.drop(columns="length_dist")
    assert apply_lengths(plain) is plain
    fixed = cases.assign(length_dist=AIPERF)
    assert apply_lengths(fixed) is fixed


BASE = {"model": "llama-3.1-70b", "hardware": "h200-sxm", "num_chips": 8, "tp": 8, "pp": 1,
        "ep": 1, "dp": 1, "weight_dtype": "fp8", "concurrency": 16}


def test_predict_scores_a_harness_case_at_its_mean_lengths(tmp_path, capsys):
    cases, out = tmp_path / "cases.csv", tmp_path / "pred.csv"
    pd.DataFrame([
        {**BASE, "case_id": "harness", "isl": 8192, "osl": 1024, "length_dist": INFERENCEX},
        {**BASE, "case_id": "means", "isl": 7373, "osl": 922, "isl_cv": CV_08,
         "osl_cv": CV_08},
        {**BASE, "case_id": "stated", "isl": 8192, "osl": 1024},
        {**BASE, "case_id": "aiperf", "isl": 8192, "osl": 1024, "length_dist": AIPERF}]
    ).to_csv(cases, index=False)
    rc, _, err = run_cli(capsys, "predict", cases, "--out", out)
    assert rc == 0, err
    p = pd.read_csv(out).set_index("case_id")
    for col in ("ttft_s", "tpot_s", "output_tokens_per_s_per_chip"):
        assert p.loc["harness", col] == p.loc["means", col]
        assert p.loc["aiperf", col] == p.loc["stated", col]
    # the mean prompt is 10% shorter: its prefill, and so the TTFT, is shorter
    assert p.loc["harness", "ttft_s"] < 0.95 * p.loc["stated", "ttft_s"]


@pytest.mark.parametrize("dist", ["uniform[1.2L,L]", "uniform[0L,L]", "uniform[0.8L,L",
                                  "uniform[0.8,1.0]"])
def test_a_malformed_uniform_is_refused_naming_the_row(tmp_path, capsys, dist):
    cases, out = tmp_path / "cases.csv", tmp_path / "pred.csv"
    pd.DataFrame([{**BASE, "case_id": "ok", "isl": 1024, "osl": 128, "length_dist": AIPERF},
                  {**BASE, "case_id": "typo", "isl": 1024, "osl": 128, "length_dist": dist}]
                 ).to_csv(cases, index=False)
    rc, _, err = run_cli(capsys, "predict", cases, "--out", out)
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "row 3 (case_id typo), column length_dist" in err and "uniform[0.8L,L]" in err
    assert not out.exists()
