"""The end-to-end refit (dse.calibration.fit): resample weights, warm starts, the written
uncertainty, the cross-validation groups and per-runtime parameters. The tests on the data skip
without ../shared/calibration; those on synthetic cases always run."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import SHARED

CAL = SHARED / "calibration"
needs_data = pytest.mark.skipif(not (CAL / "cases.csv").exists(),
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


@needs_data
def test_counts_are_case_multiplicities(small):
    from dse.calibration.fit import fit
    cases, truth, prep = small
    # (a few evaluations each: the same start and the same weights give the same iterates, so
    # the equalities hold at any budget; the whole fit took minutes of the suite)
    steps = {"verbose": False, "prep": prep, "max_nfev": 3}
    base = fit(cases, truth, **steps)
    # every case drawn twice: the same weights after normalisation, the same fit
    twice = fit(cases, truth, counts=np.full(len(cases), 2), **steps)
    from dse.calibration.fit import PARAMS
    assert set(twice) == {p[0] for p in PARAMS}       # the end-to-end parameters
    for k in twice:
        assert twice[k] == pytest.approx(base[k], rel=1e-6)
    # a chip drawn zero times is the same as leaving it out
    a100 = (cases["hardware"] == "a100-sxm-80g").to_numpy()
    zero = fit(cases, truth, counts=(~a100).astype(int), **steps)
    out = fit(cases, truth, keep=~a100, **steps)
    for k in ("layer_overhead_s",):
        assert zero[k] == pytest.approx(out[k], rel=1e-6)


@needs_data
def test_bootstrap_gives_a_finite_covariance(small):
    from dse.calibration.fit import FITTED, bootstrap, fit
    cases, truth, prep = small
    theta = fit(cases, truth, verbose=False, prep=prep)
    u = bootstrap(cases, truth, theta, n=4, prep=prep, verbose=False)
    assert u["params"] == [p[0] for p in FITTED]     # the sourced numbers are not sampled
    sd = np.array(u["log_sd"])
    assert np.all(np.isfinite(sd)) and np.all(sd > 0)
    # capped at the sd of a uniform draw within the log bounds
    cap = np.array([np.log(p[3] / p[2]) for p in FITTED]) / np.sqrt(12)
    assert np.all(sd <= cap + 1e-9)
    c = np.array(u["log_corr"])
    assert np.allclose(np.diag(c), 1) and np.allclose(c, c.T) and np.all(np.abs(c) <= 1)
    # seeded: the same draws again
    assert bootstrap(cases, truth, theta, n=4, prep=prep, verbose=False) == u


def test_written_uncertainty_matches_the_catalog_numbers():
    from dse import catalog
    from dse.calibration.fit import FITTED, uncertainty
    u = uncertainty()
    assert u is not None and u["params"] == [p[0] for p in FITTED]
    assert u["rule"].startswith("bootstrap")
    sd = np.array(u["log_sd"])
    assert np.all(np.isfinite(sd)) and np.all(sd > 0)
    # the per-layer time is pinned by hundreds of cases: within a factor ~1.5 (1 sd)
    assert sd[[p[0] for p in FITTED].index("layer_overhead_s")] < np.log(1.5)
    eff = catalog.accelerators()["h100-sxm"].efficiency
    assert "bootstrap" in eff.fitted_on
    assert eff.step_overhead_s == 0.0                 # not fitted: fixed at 0 (dse.calibration.fit.FIXED)


def _two_runtimes():
    """One Llama-3.1-8B case on H100 per runtime, layout and concurrency given (one row each)."""
    import pandas as pd

    from dse.scoring.predict import prepare
    row = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "num_chips": "1", "tp": "1",
           "pp": "1", "ep": "1", "dp": "1", "weight_dtype": "fp8", "isl": "1024", "osl": "128",
           "concurrency": "8"}
    cases = pd.DataFrame([{**row, "case_id": rt, "runtime": rt}
                          for rt in ("trtllm", "vllm", "sglang")])
    return prepare(cases, file="cases.csv")


def test_a_per_runtime_parameter_applies_to_its_runtime_only():
    from dse.calibration.fit import FIXED, _batch_with
    prep = _two_runtimes()
    rt = dict(zip(prep.cases["case_id"].to_numpy()[prep.resolved["_case"].to_numpy()],
                  range(len(prep.resolved))))
    assert len(rt) == 3 == len(prep.batch)
    catalog_value = float(np.broadcast_to(prep.batch.layer_overhead_s, (3,))[rt["trtllm"]])
    b = _batch_with(prep, {"layer_overhead_s.vllm": 1e-3})
    assert b.layer_overhead_s[rt["vllm"]] == pytest.approx(1e-3, rel=1e-6)
    assert b.layer_overhead_s[rt["trtllm"]] == pytest.approx(catalog_value, rel=1e-6)
    assert b.layer_overhead_s[rt["sglang"]] == pytest.approx(catalog_value, rel=1e-6)
    assert catalog_value != pytest.approx(1e-3)
    # a plain name applies to every row, the runtime's own name over it
    b = _batch_with(prep, {"layer_overhead_s": 2e-5, "layer_overhead_s.vllm": 1e-3})
    assert b.layer_overhead_s[rt["vllm"]] == pytest.approx(1e-3, rel=1e-6)
    assert b.layer_overhead_s[rt["trtllm"]] == pytest.approx(2e-5, rel=1e-6)
    assert b.layer_overhead_s[rt["sglang"]] == pytest.approx(2e-5, rel=1e-6)
    assert np.all(b.step_overhead_s == FIXED["step_overhead_s"])


def test_held_out_runtime_gets_the_other_runtimes_geometric_mean():
    from dse.calibration.fit import _held_out_runtime
    theta = {"layer_overhead_s": 1e-5, "request_overhead_s.trtllm": 1e-3,
             "request_overhead_s.sglang": 4e-3, "request_overhead_s.vllm": 0.5,
             "x.vllm": 7.0, "x.trtllm": 3.0}
    out = _held_out_runtime(theta, "vllm")
    assert out["request_overhead_s.vllm"] == pytest.approx(2e-3, rel=1e-12)   # sqrt(1e-3 * 4e-3)
    assert out["x.vllm"] == pytest.approx(3.0, rel=1e-12)
    for k in ("layer_overhead_s", "request_overhead_s.trtllm", "request_overhead_s.sglang",
              "x.trtllm"):
        assert out[k] == theta[k]
    assert theta["request_overhead_s.vllm"] == 0.5                            # not modified
    # a runtime with no parameter of its own, or one no other runtime has: unchanged
    assert _held_out_runtime(theta, "tensorrt") == theta
    assert _held_out_runtime({"y.vllm": 2.0}, "vllm") == {"y.vllm": 2.0}
    # with today's PARAMS (no per-runtime name) it changes nothing
    assert _held_out_runtime({"layer_overhead_s": 1e-5}, "vllm") == {"layer_overhead_s": 1e-5}


def test_concurrency_decades():
    import pandas as pd

    from dse.calibration.fit import holdout_key
    cases = pd.DataFrame({"concurrency": ["9", "10", "999", "1000", np.nan, np.nan, "1"],
                          "workload.request_rate_per_s": [np.nan] * 5 + [16.0, np.nan],
                          "derived_concurrency": [np.nan] * 5 + ["205", np.nan]})
    assert holdout_key(cases, "decade").tolist() == [
        "1-9", "10-99", "100-999", "1000+", "offline", "100-999", "1-9"]


def test_holdout_keys():
    import pandas as pd

    from dse.calibration.fit import holdout_key
    from dse.errors import InputError
    cases = pd.DataFrame({"hardware": ["h100-sxm", "h200-sxm"],
                          "model": ["llama-3.1-70b", "deepseek-v3"],
                          "runtime": ["vllm", np.nan]})
    assert holdout_key(cases, "model").tolist() == ["llama-3.1-70b", "deepseek-v3"]
    assert holdout_key(cases, "family").tolist() == ["llama", "deepseek"]
    assert holdout_key(cases, "hardware").tolist() == ["h100-sxm", "h200-sxm"]
    assert holdout_key(cases, "runtime").tolist() == ["vllm", "trtllm"]   # blank: the default
    with pytest.raises(InputError):
        holdout_key(cases, "chip")


def test_source_inputs_fill_blanks_only():
    import pandas as pd

    from dse.calibration.cases import SOURCE_INPUTS, apply_source_inputs
    # the TensorRT-LLM perf-overview rows were measured in-process: no front end
    assert {src: v["serving.request_overhead_s"] for src, v in SOURCE_INPUTS.items()} == \
        {"TRTLLM-V017": 0.0, "TRTLLM-ONLINE": 0.0}
    cases = pd.DataFrame({"case_id": ["a", "b", "c"], "source": ["S", "S", "T"],
                          "serving.x": [np.nan, 3.0, np.nan]})
    out = apply_source_inputs(cases, {"S": {"serving.x": 1.5, "serving.y": "on"}})
    assert out["serving.x"].tolist()[:2] == [1.5, 3.0] and pd.isna(out["serving.x"].iloc[2])
    assert out["serving.y"].tolist()[:2] == ["on", "on"] and pd.isna(out["serving.y"].iloc[2])
    assert cases["serving.x"].isna().sum() == 2          # the input frame is not modified


AIC_TEMPLATE = "unknown; AIC bench template uses aiperf fixed L (stddev 0)"
INFERENCEX = ("uniform[0.8L,L] (InferenceX benchmark_serving --random-range-ratio 0.8, "
              "--max-concurrency C)")


def test_front_ends_name_the_aic_template_rows():
    import pandas as pd

    from dse.calibration.cases import FRONT_END, apply_front_ends, front_ends
    cases = pd.DataFrame({"case_id": ["a", "b", "c", "d"],
                          "length_dist": [AIC_TEMPLATE, INFERENCEX, np.nan, AIC_TEMPLATE],
                          "serving.request_overhead_s": [np.nan, np.nan, np.nan, 0.5]})
    # aiconfigurator's benchmark rows passed Dynamo's front end; the others their runtime's own
    assert front_ends(cases).tolist() == ["dynamo", "", "", "dynamo"]
    out = apply_front_ends(cases, fitted={"dynamo": {"request_overhead_s": 0.15,
                                                      "fitted_on": "x"}})
    assert out[FRONT_END].tolist() == ["dynamo", "", "", "dynamo"]
    got = pd.to_numeric(out["serving.request_overhead_s"]).tolist()
    assert got[0] == 0.15 and np.isnan(got[1]) and np.isnan(got[2])
    assert got[3] == 0.5                                   # a case's own value wins
    assert "fitted_on" not in " ".join(out.columns)
    assert FRONT_END not in cases                          # the input frame is not modified
    # nothing fitted: the column alone
    assert apply_front_ends(cases, fitted={})["serving.request_overhead_s"].iloc[0] != 0.15


def test_token_budgets_of_the_aic_template_rows():
    import pandas as pd

    from dse.calibration.cases import BUDGET, apply_token_budgets
    # aiconfigurator's generator: TensorRT-LLM / vLLM max_num_tokens = batch per worker + isl +
    # 1500; SGLang max_prefill_tokens = isl + 1500 (its running decodes come out of it)
    cases = pd.DataFrame({
        "case_id": list("abcdef"),
        "runtime": ["trtllm", "vllm", "sglang", "trtllm", "trtllm", "sglang"],
        "length_dist": [AIC_TEMPLATE] * 4 + [INFERENCEX, AIC_TEMPLATE],
        "isl": [4000, 1000, 2000, 1024, 1024, 8000],
        "concurrency": [320, 64, 9, 8, 8, 100],
        "dp": [2, 1, 1, 1, 1, 1],
        BUDGET: [np.nan, np.nan, np.nan, np.nan, np.nan, 4096.0]})
    out = apply_token_budgets(cases)
    got = pd.to_numeric(out[BUDGET]).tolist()
    # 320 clients over 2 attention-DP ranks: 160 decodes + 4000 + 1500 a rank
    assert got[:4] == [5660.0, 2564.0, 3500.0, 2532.0]
    assert np.isnan(got[4])                                 # InferenceX: the runtime's default
    assert got[5] == 4096.0                                 # a case's own value wins
    assert np.isnan(pd.to_numeric(cases[BUDGET]).iloc[0])   # the input frame is not modified
    # no template rows: the frame as it was, no column added
    plain = cases.drop(columns=BUDGET).assign(length_dist=INFERENCEX)
    assert apply_token_budgets(plain) is plain


def test_scheduler_loops_of_the_aic_template_vllm_rows():
    import pandas as pd

    from dse.calibration.cases import LOOP, apply_scheduler_loops, version_tuple
    assert version_tuple("0.12.0") == (0, 12, 0) and version_tuple("1.0.0rc3") == (1, 0, 0)
    assert version_tuple("0.5.6.post2") == (0, 5, 6) and version_tuple("nan") == ()
    # vLLM before 0.14 ran its synchronous loop behind aiconfigurator's template; InferenceX
    # passed --async-scheduling, 0.14 made it the default, SGLang's loop overlaps by default
    cases = pd.DataFrame({
        "case_id": list("abcdefgh"),
        "runtime": ["vllm", "vllm", "vllm", "sglang", "vllm", "vllm", "vllm", "vllm"],
        "length_dist": [AIC_TEMPLATE, AIC_TEMPLATE, INFERENCEX, AIC_TEMPLATE, AIC_TEMPLATE,
                        AIC_TEMPLATE, AIC_TEMPLATE, AIC_TEMPLATE],
        "backend_version": ["0.12.0", "0.14.0", "0.11.2", "0.5.6.post2", np.nan, "0.13.9",
                            "0.14", "0.13.0rc1"],
        LOOP: [np.nan, np.nan, np.nan, np.nan, np.nan, 1.0, np.nan, np.nan]})
    got = pd.to_numeric(apply_scheduler_loops(cases)[LOOP]).tolist()
    assert got[0] == 0.0 and got[7] == 0.0                  # 0.12.0, 0.13.0rc1: before 0.14
    # 0.14.0 and "0.14" are not below 0.14 (the bound is exclusive)
    assert all(np.isnan(got[i]) for i in (1, 2, 3, 4, 6))  # the runtime's default (overlap)
    assert got[5] == 1.0                                    # a case's own value wins
    assert np.isnan(pd.to_numeric(cases[LOOP]).iloc[0])     # the input frame is not modified


def test_cold_start_rule_by_the_citations_measured_date():
    import pandas as pd

    from dse.calibration.cases import COLD_STARTS, cold_start_cases, mark_cold_starts
    # InferenceX's TensorRT-LLM DeepSeek runs measured before 2026-01-21 (its client's warm-up):
    # the 20th is one, the 21st (the bound, exclusive) and a citation without a measured= date
    # are not; SGLang's, the template's and H200 vLLM's rows are not either
    cit = "silicon_data_source='x; measured={}T00:00:00.000Z'"
    cases = pd.DataFrame({
        "case_id": list("abcdefg"),
        "runtime": ["trtllm", "trtllm", "trtllm", "sglang", "trtllm", "trtllm", "vllm"],
        "model": ["deepseek-v3"] * 6 + ["deepseek-v3"],
        "hardware": ["h200-sxm", "h200-sxm", "h100-sxm", "h200-sxm", "h200-sxm", "h200-sxm",
                     "h200-sxm"],
        "length_dist": [INFERENCEX] * 4 + [AIC_TEMPLATE, INFERENCEX, INFERENCEX],
        "citation": [cit.format("2026-01-20"), cit.format("2026-01-21"),
                     cit.format("2025-12-01"), cit.format("2026-01-02"),
                     cit.format("2026-01-02"), "no date here", cit.format("2026-01-02")]})
    assert cold_start_cases(cases).tolist() == [True, False, True, False, False, False, False]
    assert cold_start_cases(cases.drop(columns="citation")).tolist() == [False] * 7
    truth = pd.DataFrame({"case_id": ["a", "a", "b", "c"],
                          "metric": ["ttft_s", "tpot_s", "ttft_s", "ttft_s"],
                          "quality_flag": ["", np.nan, "", "queue_suspect"]})
    flags = mark_cold_starts(cases, truth, COLD_STARTS)["quality_flag"].tolist()
    # the TTFTs only, appended to a flag already there
    assert flags == ["cold_start", "", "", "queue_suspect;cold_start"]   # (blank reads "")


def test_stream_intervals_of_the_inferencex_recipes():
    import pandas as pd

    from dse.calibration.cases import STREAM, apply_stream_intervals
    # InferenceX's TensorRT-LLM DeepSeek (10) and gpt-oss (20) and SGLang DeepSeek (10) recipes;
    # its vLLM recipes set none; a Dynamo image's row runs another recipe; the template's rows
    # keep the runtime's default; a case's own value wins
    cases = pd.DataFrame({
        "case_id": list("abcdefg"),
        "runtime": ["trtllm", "trtllm", "sglang", "vllm", "trtllm", "trtllm", "trtllm"],
        "model": ["deepseek-v3", "gpt-oss-120b", "deepseek-v3", "gpt-oss-120b", "deepseek-v3",
                  "llama-3.1-8b", "deepseek-v3"],
        "hardware": ["h200-sxm"] * 7,
        "length_dist": [INFERENCEX] * 5 + [AIC_TEMPLATE, INFERENCEX],
        "citation": ["x", "x", "x", "x", "image nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime",
                     "x", "x"],
        STREAM: [np.nan] * 6 + [4.0]})
    got = pd.to_numeric(apply_stream_intervals(cases)[STREAM]).tolist()
    assert got[:3] == [10.0, 20.0, 10.0]
    assert all(np.isnan(got[i]) for i in (3, 4, 5))         # the runtime's default (1)
    assert got[6] == 4.0
    assert np.isnan(pd.to_numeric(cases[STREAM]).iloc[0])   # the input frame is not modified


def test_recipe_settings_of_inferencex_trtllm_llama70b():
    import pandas as pd

    from dse.calibration.cases import apply_recipes
    # the recipe's budget on all its rows; batch waiting only at 1k/1k below tp 8; other models,
    # runtimes and harnesses untouched; a case's own value wins
    cases = pd.DataFrame({
        "case_id": list("abcdef"),
        "runtime": ["trtllm", "trtllm", "trtllm", "vllm", "trtllm", "trtllm"],
        "model": ["llama-3.1-70b"] * 3 + ["llama-3.1-70b", "gpt-oss-120b", "llama-3.1-70b"],
        "hardware": ["h200-sxm"] * 6,
        "length_dist": [INFERENCEX] * 6,
        "isl": [1024, 1024, 8192, 1024, 1024, 1024], "osl": [1024] * 6,
        "tp": [4, 8, 2, 4, 4, 2],
        "serving.max_num_tokens": [np.nan] * 5 + [4096.0]})
    out = apply_recipes(cases)
    wait = pd.to_numeric(out["serving.batch_wait_iters"]).tolist()
    assert wait[0] == 20.0 and all(np.isnan(wait[i]) for i in (1, 2, 3, 4))
    assert wait[5] == 20.0
    assert pd.to_numeric(out["serving.batch_wait_tokens_fraction"]).iloc[0] == 0.9
    budget = pd.to_numeric(out["serving.max_num_tokens"]).tolist()
    assert budget[:3] == [16384.0] * 3 and np.isnan(budget[3]) and np.isnan(budget[4])
    assert budget[5] == 4096.0
    assert "serving.batch_wait_iters" not in cases              # the input frame is not modified


def test_layout_rule_sets_ep_to_tp_on_early_inferencex_trtllm_moe_rows():
    import pandas as pd

    from dse.calibration.cases import LAYOUT_RULES, apply_layout_rules
    cite = ("aiconfigurator-core 0.12.0 ... silicon_data_source='source_file=2026-04-06.csv; "
            "model=DeepSeek-R1; silicon_concurrency=4; measured={}T00:00:00.000Z; wip=False'")
    # the 2026-04-06 export's DeepSeek TensorRT-LLM row (measured 2025-11-02, labelled ep1: the
    # recipe ran --ep_size=$TP), the same deployment re-measured 2025-12-15 (ep 8 already), a
    # dense model (ep does not apply), an SGLang row (its recipe set no ep) and a tp 1 row
    cases = pd.DataFrame({
        "case_id": list("abcde"),
        "model": ["deepseek-v3", "deepseek-v3", "llama-3.1-70b", "deepseek-v3", "gpt-oss-120b"],
        "runtime": ["trtllm", "trtllm", "trtllm", "sglang", "trtllm"],
        "tp": [8, 8, 8, 8, 1], "ep": [1, 8, 1, 1, 1], "dp": [1, 1, 1, 1, 1],
        "length_dist": [INFERENCEX] * 5,
        "citation": [cite.format(d) for d in ("2025-11-02", "2025-12-15", "2025-10-29",
                                              "2025-11-02", "2025-11-02")],
        "note": ["x", "y", "z", "w", "v"]})
    out = apply_layout_rules(cases)
    assert out["ep"].tolist() == [8, 8, 1, 1, 1]
    assert out["note"].iloc[0] == "x; layout rule: " + LAYOUT_RULES[0][0]
    assert out["note"].tolist()[1:] == ["y", "z", "w", "v"]
    assert cases["ep"].tolist() == [1, 8, 1, 1, 1]         # the input frame is not modified
    # the day the ep key arrived (2025-11-03) the rule stops; another harness is left alone
    late = cases.assign(citation=cite.format("2025-11-03"))
    assert apply_layout_rules(late)["ep"].tolist() == [1, 8, 1, 1, 1]
    assert apply_layout_rules(cases.assign(length_dist=AIC_TEMPLATE))["ep"].tolist() == \
        [1, 8, 1, 1, 1]


@pytest.mark.skipif(not (SHARED / "calibration" / "silicon_hopper_cases.csv").exists(),
                    reason="needs ../shared/calibration")
def test_layout_rule_on_the_hopper_set():
    from dse.calibration.cases import load
    cases, _ = load()
    ruled = cases[cases["note"].fillna("").str.contains("layout rule")]
    # 15 DeepSeek-V3 rows at tp 8 and 15 gpt-oss-120b rows at each of tp 2, 4, 8
    assert ruled.assign(tp=ruled["tp"].astype(int)).groupby(["model", "tp"]).size().to_dict() == {
        ("deepseek-v3", 8): 15, ("gpt-oss-120b", 2): 15, ("gpt-oss-120b", 4): 15,
        ("gpt-oss-120b", 8): 15}
    assert (ruled["ep"].astype(int) == ruled["tp"].astype(int)).all()


def _one_runtime_two_front_ends():
    """One Llama-3.1-8B trtllm case on H100 at concurrency 1, through its own server ("own")
    and through Dynamo's front end ("dyn")."""
    import pandas as pd

    from dse.calibration.cases import FRONT_END
    from dse.scoring.predict import prepare
    row = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "num_chips": "1", "tp": "1",
           "pp": "1", "ep": "1", "dp": "1", "weight_dtype": "fp8", "isl": "1024", "osl": "128",
           "concurrency": "1", "runtime": "trtllm"}
    cases = pd.DataFrame([{**row, "case_id": "own", FRONT_END: ""},
                          {**row, "case_id": "dyn", FRONT_END: "dynamo"}])
    return prepare(cases, file="cases.csv")


def test_a_front_end_parameter_applies_to_its_rows_whatever_the_runtime():
    from dse.calibration.fit import _batch_with, _held_out_runtime
    from dse.scoring.predict import finish
    prep = _one_runtime_two_front_ends()
    row = dict(zip(prep.cases["case_id"].to_numpy()[prep.resolved["_case"].to_numpy()],
                   range(len(prep.resolved))))
    theta = {"request_overhead_s": 0.02, "request_overhead_s.dynamo": 0.15,
             "request_overhead_s.trtllm": 0.4}
    b = _batch_with(prep, theta)
    # the runtime's own name over the plain one, the front end's over both
    assert b.request_overhead_s[row["own"]] == pytest.approx(0.4, rel=1e-12)
    assert b.request_overhead_s[row["dyn"]] == pytest.approx(0.15, rel=1e-12)
    b = _batch_with(prep, {"request_overhead_s": 0.02, "request_overhead_s.dynamo": 0.15})
    assert b.request_overhead_s[row["own"]] == pytest.approx(0.02, rel=1e-12)
    # one request in flight: no queue, the front-end delay adds to the TTFT as it is,
    # 0.15 - 0.02 = 130 ms between the two front ends (a 20% change of either is 3-30 ms)
    pred = finish(prep, b).set_index("case_id")
    assert pred.loc["dyn", "ttft_s"] - pred.loc["own", "ttft_s"] == pytest.approx(0.13, rel=1e-6)
    assert pred.loc["dyn", "tpot_s"] == pytest.approx(pred.loc["own", "tpot_s"], rel=1e-12)
    # a front end is not a runtime: leaving a runtime out leaves its number alone
    assert _held_out_runtime(theta, "trtllm")["request_overhead_s.dynamo"] == 0.15


def test_front_end_numbers_are_written_to_their_own_table(tmp_path):
    import tomllib

    import pandas as pd

    from dse.calibration.fit import RUNTIMES, tables, write_efficiency
    cases = pd.DataFrame({"case_id": ["a"], "hardware": ["h100-sxm"], "runtime": ["vllm"],
                          "source": ["S"]})
    theta = {"layer_overhead_s": 2e-5, "graph_layer_overhead_s": 1e-5,
             "request_overhead_s": 0.02, "request_overhead_s.dynamo": 0.15,
             "seq_overhead_s.vllm": 1e-6, "frontend_token_s": 2.4e-5}
    t = tables(theta, cases)
    # the two per-layer times (eager steps, decode-only steps replayed as CUDA graphs) are the
    # chips' default efficiency
    assert (t["default"]["layer_overhead_s"], t["default"]["graph_layer_overhead_s"]) == (2e-5, 1e-5)
    assert t["front_ends"] == {"dynamo": {"request_overhead_s": 0.15}}
    assert all(t["runtimes"][rt]["request_overhead_s"] == 0.02 for rt in RUNTIMES)
    # one time per streamed token, in every runtime's table
    assert all(t["runtimes"][rt]["frontend_token_s"] == 2.4e-5 for rt in RUNTIMES)
    assert "dynamo" not in t["runtimes"] and "request_overhead_s" not in t["default"]
    path = write_efficiency(t, tmp_path / "efficiency.toml")
    doc = tomllib.loads(path.read_text())
    assert doc["front_ends"]["dynamo"]["request_overhead_s"] == pytest.approx(0.15)
    assert doc["runtimes"]["vllm"]["request_overhead_s"] == pytest.approx(0.02)


@needs_data
def test_cross_validate_only_the_named_groups_and_their_numbers(small, monkeypatch):
    from dse.calibration import fit as fit_mod
    from dse.errors import InputError
    cases, truth, prep = small
    # (a few evaluations: the equalities below hold at any budget, the same start and weights
    # giving the same iterates)
    full = fit_mod.fit
    monkeypatch.setattr(fit_mod, "fit", lambda *a, **k: full(*a, **{**k, "max_nfev": 3}))
    params = {}
    cv = fit_mod.cross_validate(cases, truth, "hardware", only=["a100-sxm-80g"], params=params)
    a100 = (cases["hardware"] == "a100-sxm-80g").to_numpy()
    assert set(cv["held_out"]) == {"a100-sxm-80g"}
    assert set(cv["case_id"]) == set(cases["case_id"][a100])
    # the numbers it was predicted with: the refit without that chip, every end-to-end number
    assert list(params) == ["a100-sxm-80g"]
    assert set(params["a100-sxm-80g"]) == {p[0] for p in fit_mod.PARAMS}
    alone = fit_mod.fit(cases, truth, keep=~a100, verbose=False, prep=prep)
    for k, v in alone.items():
        assert params["a100-sxm-80g"][k] == pytest.approx(v, rel=1e-9)
    j = fit_mod.in_sample(prep, cases, truth, alone)
    j = j[j["case_id"].isin(set(cases["case_id"][a100]))].set_index(["case_id", "metric"])
    got = cv.set_index(["case_id", "metric"])["pred"]
    assert np.allclose(got.to_numpy(float), j.loc[got.index, "pred"].to_numpy(float), rtol=1e-9)
    with pytest.raises(InputError):
        fit_mod.cross_validate(cases, truth, "hardware", only=["b200"])


def test_calibrate_folds_take_the_held_out_names_of_each_grouping():
    import pandas as pd

    from dse.calibration.calibrate import CV_DEFAULT, _folds
    from dse.errors import InputError
    cases = pd.DataFrame({"hardware": ["h100-sxm", "h200-sxm", "h200-sxm"],
                          "model": ["llama-3.1-8b", "deepseek-v3", "llama-3.1-8b"],
                          "runtime": ["sglang", "vllm", "sglang"],
                          "concurrency": ["512", "8", "64"]})
    assert _folds(cases, None, None) == []                       # no --cv
    assert _folds(cases, [], None) == [(by, None) for by in CV_DEFAULT]
    assert _folds(cases, ["decade", "model", "runtime"], ["100-999", "llama-3.1-8b", "sglang"]) == [
        ("decade", ["100-999"]), ("model", ["llama-3.1-8b"]), ("runtime", ["sglang"])]
    # a grouping with none of the names is skipped
    assert _folds(cases, ["decade", "hardware"], ["1-9"]) == [("decade", ["1-9"])]
    # a name in another case (as the model or runtime is usually written) is its group's
    assert _folds(cases, ["model", "runtime"], ["DeepSeek-V3", "SGLang"]) == [
        ("model", ["deepseek-v3"]), ("runtime", ["sglang"])]
    with pytest.raises(InputError):
        _folds(cases, ["decade"], ["1000+"])


@needs_data
def test_a_held_number_is_set_not_fitted(small):
    from dse.calibration.fit import PARAMS, fit, in_sample
    from dse.errors import InputError
    cases, truth, prep = small
    steps = {"verbose": False, "prep": prep, "max_nfev": 3}
    held = fit(cases, truth, hold={"layer_overhead_s": 3.0e-5}, **steps)
    assert set(held) == {p[0] for p in PARAMS}
    assert held["layer_overhead_s"] == 3.0e-5
    # it is the value predicted with (offline TRT-LLM steps carry the per-layer time): twice
    # the time per layer, the other numbers the same, fewer tokens per second
    a = in_sample(prep, cases, truth, held)["pred"].to_numpy(float)
    b = in_sample(prep, cases, truth, {**held, "layer_overhead_s": 6.0e-5})["pred"].to_numpy(float)
    # (all but one: where a slower step changes the batch the case runs at)
    assert np.mean(b < a) > 0.9 and np.mean(np.log(b / a)) < -0.001
    # and the others are refitted around it
    free = fit(cases, truth, **steps)
    assert held["graph_layer_overhead_s"] != pytest.approx(free["graph_layer_overhead_s"], rel=1e-6)
    with pytest.raises(InputError):
        fit(cases, truth, hold={"no_such_s": 1.0}, **steps)


def test_calibrate_hold_reads_name_equals_seconds():
    from dse.calibration.calibrate import _hold, main
    from dse.errors import InputError
    assert _hold(["frontend_token_s=2.19e-5", "seq_overhead_s.sglang=0"]) == {
        "frontend_token_s": 2.19e-5, "seq_overhead_s.sglang": 0.0}
    for bad in (["frontend_token_s"], ["=1"], ["x=-1"], ["x=fast"]):
        with pytest.raises(InputError):
            _hold(bad)
    # never written to the catalog
    assert main(["--fit", "--write", "--hold", "layer_overhead_s=1e-5"]) == 2
    assert main(["--hold", "layer_overhead_s=1e-5"]) == 2


def test_sourced_numbers_are_set_not_fitted():
    """The two front-end numbers from published saturation rates (fit.SOURCED) are what the
    catalog holds, worked from their sources, and no fit moves them."""
    from dse import catalog
    from dse.calibration.fit import FITTED, PARAMS, SOURCED
    # SGLang PR 9970: 5,122,821 output tokens through one detokenizer in 133.01 s
    assert SOURCED["frontend_token_s"][0] == pytest.approx(133.01 / 5_122_821, rel=0.01)
    # Dynamo's tokenizer-cache benchmark: 189.01 requests/s on one core
    assert SOURCED["frontend_request_s.dynamo"][0] == pytest.approx(1 / 189.01, rel=0.01)
    assert {p[0] for p in FITTED} | set(SOURCED) == {p[0] for p in PARAMS}
    assert not {p[0] for p in FITTED} & set(SOURCED)
    for rt, vals in catalog.runtime_defaults().items():
        assert vals["frontend_token_s"] == pytest.approx(2.6e-5, rel=1e-4), rt
    assert catalog.front_end_defaults()["dynamo"]["frontend_request_s"] == \
        pytest.approx(5.29e-3, rel=1e-4)
    eff = catalog.accelerators()["h100-sxm"].efficiency
    assert "PR 9970" in eff.fitted_on and "tokenizer-cache" in eff.fitted_on


@needs_data
def test_a_fit_keeps_the_sourced_numbers(small):
    from dse.calibration.fit import SOURCED, fit
    cases, truth, prep = small
    theta = fit(cases, truth, verbose=False, prep=prep, max_nfev=3)
    for k, (v, _) in SOURCED.items():
        assert theta[k] == v
    # a --hold diagnostic may still override one
    held = fit(cases, truth, verbose=False, prep=prep, max_nfev=3,
               hold={"frontend_token_s": 1e-5})
    assert held["frontend_token_s"] == 1e-5


def test_a_held_out_groups_figure_does_not_depend_on_the_other_groups():
    """A case weighs in the report what it weighs in the fit (cases.weights over all the cases,
    carried as ``w`` by cross_validate), so a held-out group's figure is the same reported
    alone as beside other groups. Worked by hand: three h100 cases, two of group A at factors
    e^0.2 and e^0.4, one of group B at e^0.6, and one h200 case of group A at e^0.1; over all
    four each h100 case weighs 1/3 and the h200 case 1, so A's log error is
    (0.2/3 + 0.4/3 + 0.1) / (2/3 + 1) = 0.18."""
    import pandas as pd

    from dse.calibration.calibrate import report as make_report
    from dse.calibration.cases import weights
    logf = np.array([0.2, 0.4, 0.6, 0.1])
    j = pd.DataFrame({"case_id": ["a1", "a2", "b1", "a3"], "source": "S", "metric": "ttft_s",
                      "hardware": ["h100", "h100", "h100", "h200"],
                      "held_out": ["A", "A", "B", "A"], "factor": np.exp(logf),
                      "pred": np.exp(logf), "value": 1.0})
    j = j.assign(w=weights(j))
    by = ("source", "metric", "held_out")
    both = make_report(j, by).set_index("held_out")
    alone = make_report(j[j["held_out"] == "A"], by).set_index("held_out")
    assert both.loc["A", "error_factor"] == pytest.approx(np.exp(0.18), rel=1e-12)
    assert alone.loc["A", "error_factor"] == pytest.approx(np.exp(0.18), rel=1e-12)
    assert both.loc["B", "error_factor"] == pytest.approx(np.exp(0.6), rel=1e-12)
    assert both.loc["A", "bias"] == pytest.approx(np.exp(0.18), rel=1e-12)
    # without a carried weight, the frame's own rows set it (the in-sample report)
    own = make_report(j.drop(columns="w")[j["held_out"] == "A"], by).set_index("held_out")
    assert own.loc["A", "error_factor"] == pytest.approx(np.exp((0.3 + 0.1) / 2), rel=1e-12)


def test_cv_out_writes_the_held_out_rows_and_refuses_a_folder(tmp_path, capsys):
    import pandas as pd

    from dse.calibration.calibrate import _write_cv, main
    cv = pd.DataFrame({"case_id": ["a", "a", "b"], "source": "S", "metric": ["ttft_s", "tpot_s",
                       "ttft_s"], "value": [0.2, 0.01, 0.5], "pred": [0.1, 0.011, 0.5],
                       "w": [0.5, 0.5, 1.0], "model": "m", "hardware": "h100-sxm",
                       "held_out": "sglang", "by": "runtime"})
    cases = pd.DataFrame({"case_id": ["a", "b"], "runtime": ["sglang", "sglang"]})
    out = tmp_path / "cv.csv"
    _write_cv(cv, cases, str(out))
    back = pd.read_csv(out)
    assert list(back.columns) == ["by", "held_out", "case_id", "source", "metric", "value",
                                  "pred", "w", "model", "hardware", "runtime"]
    assert back["pred"].tolist() == [0.1, 0.011, 0.5] and set(back["runtime"]) == {"sglang"}
    # a folder, a missing folder, or no --cv: one line, exit 2, nothing written
    assert main(["--cv", "runtime", "--cv-out", str(tmp_path)]) == 2
    assert main(["--cv", "runtime", "--cv-out", str(tmp_path / "no" / "x.csv")]) == 2
    assert main(["--cv-out", str(tmp_path / "y.csv")]) == 2
    assert not (tmp_path / "y.csv").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(e.startswith("error: --") for e in err)
