"""dse.calibration.tpot_terms: its terms add up to the model's TPOT, case by case."""

from __future__ import annotations

import pandas as pd
import pytest

from dse.calibration.tpot_terms import TERMS, case_terms, main, summary


def _cases():
    row = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "num_chips": "1", "tp": "1",
           "pp": "1", "ep": "1", "dp": "1", "weight_dtype": "fp8", "isl": "128", "osl": "128",
           "runtime": "vllm", "source": "S",
           "serving.frontend_token_s": "2e-4", "serving.seq_overhead_s": "2e-6"}
    cases = pd.DataFrame([{**row, "case_id": f"c{c}", "concurrency": str(c)}
                          for c in (1, 64, 512)])
    truth = pd.DataFrame({"case_id": cases["case_id"], "metric": "tpot_s",
                          "value": [0.01, 0.02, 0.05]})
    return cases, truth


def test_the_terms_add_up_to_the_models_tpot():
    """gemm + attention + logits + fixed + seq is the decode-only step (pp 1, no pipeline op);
    with the prompt steps' share it is the mean step, and the streaming bound's excess makes the
    TPOT; at 512 answers x 200 us a token (102.4 ms) the bound is the TPOT, and the sequences'
    host time is 2 us x 512 = 1.024 ms."""
    cases, truth = _cases()
    rows = case_terms(cases, truth).set_index("case_id")
    assert rows[list(TERMS)].sum(axis=1).to_numpy() == pytest.approx(
        rows["tpot_s"].to_numpy(), rel=1e-9)
    assert rows.loc["c512", "tpot_s"] == pytest.approx(512 * 2e-4, rel=1e-9)
    assert rows.loc["c512", "floor_s"] == pytest.approx(512 * 2e-4, rel=1e-9)
    assert rows.loc["c512", "seq_s"] == pytest.approx(512 * 2e-6, rel=1e-9)
    assert rows.loc["c1", "stream_s"] == 0.0
    assert rows.loc["c64", "ratio"] == pytest.approx(rows.loc["c64", "tpot_s"] / 0.02)
    s = summary(rows.reset_index(), ("runtime", "decade"))
    assert s["cases"].sum() == 3 and set(s["decade"]) == {"1-9", "10-99", "100-999"}


def test_no_case_left_is_one_line_and_exit_2(capsys):
    assert main(["--runtime", "no-such-runtime"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
