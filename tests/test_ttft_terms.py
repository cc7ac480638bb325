"""The TTFT term split of dse.calibration.ttft_terms, by hand: the terms add up to the model's
closed-loop TTFT, the prompt's chunk steps are n_chunks x pp TTFT steps (one more chunk just
above the scheduler's token budget), the front end is the request time plus tokenizing, and
the split reads the calibration set's cases."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers import SHARED, batch, design

from dse.calibration.ttft_terms import TERMS, case_terms, main, summary, terms
from dse.perf.phases import prompt_load
from dse.scoring.breakdown import of_batch

# DeepSeek-V3 on 8 H200 at tp 8 / ep 8 with four requests in flight: a scheduler's step budget
# is max_num_tokens 8192 less its 4 decodes = 8188 prompt tokens
DS = dict(acc="h200-sxm", model="deepseek-v3", **{
    "model.weight_dtype": "fp8", "layout.tp": 8, "layout.ep": 8, "workload.osl": 1024,
    "workload.concurrency": 4, "serving.runtime": "trtllm", "serving.max_num_tokens": 8192,
    "serving.request_overhead_s": 0.02, "serving.frontend_prompt_token_s": 5e-6})


def _terms(**kw):
    return terms(batch(design(**{**DS, **kw}))).iloc[0]


def test_terms_add_up_to_the_closed_loop_ttft():
    t = _terms(**{"workload.isl": 1024})
    assert sum(t[k] for k in TERMS) == pytest.approx(t["ttft_s"], rel=1e-12)
    assert t["front_end_s"] + t["chunks_s"] + t["step_waits_s"] == pytest.approx(
        t["ttft_unloaded_s"], rel=1e-12)
    # every term is time the request spends (none negative), the chunk steps the largest part
    # of the unloaded TTFT at this prompt
    assert min(t[k] for k in TERMS) >= 0.0
    assert t["chunks_s"] > t["step_waits_s"]


@pytest.mark.parametrize("isl, chunks", [(8188, 1), (8189, 2), (8192, 2)])
def test_the_chunk_steps_at_and_above_the_budget(isl, chunks):
    """8188 tokens fit one step's budget (8192 - 4 decodes); 8189 and 8192 take two steps of
    half the prompt each: chunks_s = pp x n x the TTFT step (scored on its own)."""
    b = batch(design(**{**DS, "workload.isl": isl}))
    t = terms(b).iloc[0]
    assert float(np.asarray(prompt_load(b).n_chunks).ravel()[0]) == chunks
    assert t["n_chunks"] == chunks
    step = of_batch(b)["prefill.total_s"].iloc[0]
    assert t["chunks_s"] == pytest.approx(chunks * step, rel=1e-12)
    # the per-op split and the step's fixed time make up the chunk term
    parts = t[[c for c in t.index if c.startswith("chunk.")]].sum()
    assert parts == pytest.approx(t["chunks_s"], rel=1e-9)


def test_two_chunks_cost_about_one_step_of_the_whole_prompt_more_overhead():
    """Two chunks of 4096 tokens carry the same prompt work as one of 8188: their sum is within
    a step's fixed time plus the second chunk's longer attention of one 8188-token step (not
    twice it, as charging two full chunks would)."""
    one = _terms(**{"workload.isl": 8188})
    two = _terms(**{"workload.isl": 8192})
    assert two["chunks_s"] < 1.25 * one["chunks_s"]
    assert two["chunks_s"] > 0.95 * one["chunks_s"]


def test_the_front_end_term_by_hand():
    """20 ms per request + 5 us x 1024 prompt tokens = 25.12 ms."""
    t = _terms(**{"workload.isl": 1024})
    assert t["front_end_s"] == pytest.approx(0.02 + 5e-6 * 1024, rel=1e-12)


def test_one_request_in_flight_waits_for_no_other():
    t = _terms(**{"workload.isl": 1024, "workload.concurrency": 1})
    assert t["queue_s"] == pytest.approx(0.0, abs=1e-12)


CAL = SHARED / "calibration"


@pytest.mark.skipif(not (CAL / "silicon_hopper_cases.csv").exists(),
                    reason="../shared/calibration is not next to the checkout")
def test_the_split_of_the_hopper_set_matches_the_predictions():
    from dse.calibration.cases import load
    from dse.scoring.predict import predict_frame
    cases, truth = load(CAL)
    pick = cases[(cases["model"] == "deepseek-v3") & (cases["source"] == "AIC-SILICON")]
    rows = case_terms(pick, truth)
    assert len(rows) == 16                    # the DeepSeek-V3 TTFTs the fit scores (the
    # 29 of InferenceX's TensorRT-LLM runs before its client warmed up are set apart: cold start)
    pred = predict_frame(pick.set_index("case_id").loc[rows["case_id"]].reset_index())
    assert np.allclose(rows["ttft_s"].to_numpy(), pred["ttft_s"].to_numpy(), rtol=1e-9)
    assert np.allclose(rows[list(TERMS)].sum(axis=1), rows["ttft_s"], rtol=1e-9)
    s = summary(rows)
    assert set(s["runtime"]) == {"sglang", "trtllm"} and set(s["kind"]) == {"mla"}


def test_a_selection_without_cases_is_one_line_and_exit_2(capsys, tmp_path):
    if not (CAL / "cases.csv").exists():
        pytest.skip("../shared/calibration is not next to the checkout")
    assert main(["--model", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error:")


def test_case_terms_refuses_cases_without_a_layout():
    cases = pd.DataFrame({"case_id": ["a"], "model": ["llama-3.1-8b"], "hardware": ["h100-sxm"],
                          "num_chips": [2], "weight_dtype": ["fp8"], "isl": [1000], "osl": [100],
                          "concurrency": [4]})
    truth = pd.DataFrame({"case_id": ["a"], "metric": ["ttft_s"], "value": [0.1]})
    from dse.errors import InputError
    with pytest.raises(InputError, match="several designs"):
        case_terms(cases, truth)
