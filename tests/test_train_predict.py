"""``dse predict --train`` against contracts/train-cases.md: the output columns, blanks chosen
by dse, the contract's catalog ids, and bad input refused with one line naming row and column
(exit 2)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from helpers import SHARED, run_cli, run_subprocess, write_cases

from dse.api import predict_train
from dse.catalog import topologies
from dse.catalog import training as tcat

CONTRACT = SHARED / "contracts" / "train-cases.md"
TRAIN_CASES = SHARED / "calibration" / "training_cases.csv"
OUTPUT = ["case_id", "tp", "pp", "dp", "ep", "cp", "vp", "micro_batch_seqs", "recompute",
          "zero_stage", "step_time_s", "tokens_per_s_per_chip", "model_tflops_per_chip", "mfu",
          "hfu", "memory_per_chip_bytes", "bound", "feasible"]
COLUMNS = ["case_id", "model", "hardware", "topology", "num_chips", "tp", "pp", "dp", "ep", "cp",
           "vp", "zero_stage", "global_batch_seqs", "micro_batch_seqs", "seq_len", "precision",
           "recompute", "pipeline_schedule", "sequence_parallel", "mtp_layers"]
DENSE = {"case_id": "dense", "model": "llama-3.1-8b", "hardware": "h100-sxm", "num_chips": 8,
         "tp": 1, "pp": 1, "dp": 8, "cp": 1, "global_batch_seqs": 128, "micro_batch_seqs": 1,
         "seq_len": 8192, "precision": "fp8", "zero_stage": 3}
MOE = {"case_id": "moe", "model": "qwen3-235b-a22b", "hardware": "h100-sxm", "num_chips": 256,
       "tp": 2, "pp": 8, "dp": 16, "ep": 32, "cp": 1, "vp": 4, "global_batch_seqs": 2048,
       "micro_batch_seqs": 1, "seq_len": 4096, "precision": "fp8"}


def write(path, rows, columns=COLUMNS):
    return write_cases(path, rows, columns)


def test_predict_train_writes_the_contract_columns(tmp_path, capsys):
    cases = write(tmp_path / "c.csv", [DENSE, MOE])
    out = tmp_path / "p.csv"
    rc, text, err = run_cli(capsys, "predict", "--train", cases, "--out", out)
    assert "wrote 2 predictions" in text
    assert rc == 0, err
    p = pd.read_csv(out)
    assert list(p.columns[:len(OUTPUT)]) == OUTPUT
    assert list(p["case_id"]) == ["dense", "moe"]
    assert p["feasible"].all()
    # tokens/s/chip and model TFLOP/s per the contract's definitions
    s = p.set_index("case_id")
    assert s.loc["dense", "tokens_per_s_per_chip"] == pytest.approx(
        128 * 8192 / s.loc["dense", "step_time_s"] / 8)
    assert s.loc["dense", "mfu"] == pytest.approx(
        s.loc["dense", "model_tflops_per_chip"] * 1e12 / 1979e12)
    assert s.loc["dense", "hfu"] >= s.loc["dense", "mfu"]
    assert set(p["bound"]) <= {"compute", "memory", "network", "bubble"}


def test_blanks_are_chosen_valid_and_fixed_blanks_follow(tmp_path):
    row = {**DENSE, "tp": "", "pp": "", "dp": "", "cp": "", "micro_batch_seqs": ""}
    p = predict_train(pd.DataFrame([row]))
    r = p.iloc[0]
    assert r.tp * r.pp * r.dp * r.cp == 8 and 128 % (r.dp * r.micro_batch_seqs) == 0
    assert r.recompute in ("none", "selective", "full") and r.zero_stage == 3
    assert predict_train(pd.DataFrame([{**row, "zero_stage": ""}])).iloc[0].zero_stage == 1
    # cp blank with tp x pp x dp = num_chips takes 1; interleaved with blank vp picks vp >= 2
    q = predict_train(pd.DataFrame([{**DENSE, "cp": "", "tp": 2, "dp": 2, "pp": 2,
                                     "pipeline_schedule": "interleaved"}])).iloc[0]
    assert q.cp == 1 and q.vp >= 2


def test_no_native_precision_is_flagged():
    p = predict_train(pd.DataFrame([{**DENSE, "hardware": "a100-sxm-80g"}])).iloc[0]
    assert not p.feasible and "precision" in p.reason


def test_more_chips_for_the_same_job_cost_less_time_per_step():
    a = predict_train(pd.DataFrame([DENSE])).iloc[0]
    b = predict_train(pd.DataFrame([{**DENSE, "num_chips": 16, "dp": 16}])).iloc[0]
    assert b.step_time_s < a.step_time_s


def test_dotted_override_moves_the_prediction():
    slow = {**DENSE, "num_chips": 16, "dp": 16,
            "topology.scaleout.link_bw_bytes_per_s": 1e9}
    a = predict_train(pd.DataFrame([{**DENSE, "num_chips": 16, "dp": 16}])).iloc[0]
    b = predict_train(pd.DataFrame([slow])).iloc[0]
    assert b.step_time_s > a.step_time_s


@pytest.mark.skipif(not TRAIN_CASES.exists(), reason="shared/calibration not next to checkout")
def test_the_public_training_set_predicts(tmp_path, capsys):
    out = tmp_path / "p.csv"
    rc, _, err = run_cli(capsys, "predict", "--train", TRAIN_CASES, "--out", out)
    assert rc == 0, err
    p = pd.read_csv(out)
    assert len(p) == 38 and np.isfinite(p["step_time_s"]).all()


@pytest.mark.skipif(not CONTRACT.exists(), reason="shared/contracts not next to the checkout")
def test_every_contract_id_is_in_the_training_catalog():
    text = CONTRACT.read_text()
    ids = text.split("## Catalog ids that must exist")[1]
    named = set(re.findall(r"`([a-z0-9][a-z0-9.\-]+)`", ids)) - {"config.json"}
    every = set(tcat.train_models()) | set(tcat.train_accelerators()) | set(topologies())
    assert named - every == set()
    assert len(named) > 30
    for k, (acc, _) in tcat.train_accelerators().items():
        assert acc.source_url.startswith("http"), k
    for k, m in tcat.train_models().items():
        assert m.source_url.startswith("http"), k


BAD = [
    ({"seq_len": 0}, "row 2 (case_id dense), column seq_len"),
    ({"num_chips": "eight"}, "column num_chips"),
    ({"tp": 3, "dp": 8}, "column num_chips"),
    ({"model": "llama-3.1-8"}, "column model"),
    ({"hardware": "h100"}, "column hardware"),
    ({"precision": "fp6"}, "column precision"),
    ({"recompute": "partial"}, "column recompute"),
    ({"zero_stage": 5}, "column zero_stage"),
    ({"topology": "nvl73"}, "column topology"),
    ({"sequence_parallel": "maybe"}, "column sequence_parallel"),
]


# a layout that breaks a rule (dse.perf.train_layout) is a row with feasible false and its
# reason, the other rows scored (contract: "feasible false when ... the layout is invalid")
INVALID = [
    ({"ep": 2}, "be 1 for a dense model"),
    ({"micro_batch_seqs": 3}, "whole number of micro-batches"),
    ({"vp": 2}, "vp >= 2 needs pp >= 2"),
    ({"vp": 2, "pp": 2, "dp": 4, "pipeline_schedule": "1f1b"}, "interleaved schedule"),
    ({"num_chips": 24, "tp": 3, "dp": 8}, "tp does not divide num_attention_heads"),
    ({"model": "qwen3-30b-a3b", "num_chips": 24, "dp": 24, "ep": 3, "global_batch_seqs": 48},
     "ep must divide num_experts"),
    ({"cp": 2, "dp": 4, "seq_len": 8190}, "2 x cp does not divide seq_len"),
    ({"pp": 4, "dp": 2, "vp": 16, "pipeline_schedule": "interleaved"},
     "pp x vp exceeds num_hidden_layers"),
    ({"num_chips": 24, "pp": 3, "pipeline_schedule": "dualpipe"}, "dualpipe needs an even pp"),
    ({"pp": 4, "dp": 2, "global_batch_seqs": 8, "pipeline_schedule": "dualpipe"},
     "at least 2 x pp"),
]


@pytest.mark.parametrize("change,why", INVALID)
def test_an_invalid_layout_is_an_infeasible_row_with_its_reason(change, why):
    p = predict_train(pd.DataFrame([DENSE, {**DENSE, "case_id": "bad", **change}]))
    good, bad = p.iloc[0], p.iloc[1]
    assert good.feasible and good.reason == ""
    assert not bad.feasible and bad.reason.startswith("invalid layout: ") and why in bad.reason
    assert np.isnan(bad.step_time_s) and np.isnan(bad.mfu)      # not scored
    # the same case with the rule kept is valid (the row differs only in the broken rule)
    assert "invalid" not in predict_train(pd.DataFrame([DENSE])).iloc[0].reason


def test_a_blank_vp_splits_the_layers_into_whole_chunks():
    """Interleaved with vp blank: a vp that splits the stage's layers evenly (Llama-3.1-70B, 80
    layers on pp 4: 20 a stage -> 2, 4 or 5, never 8), else one with a layer a chunk at least
    (Llama-3.1-405B, 126 layers on pp 16: vp <= 7, never 8)."""
    row = {"case_id": "x", "model": "llama-3.1-70b", "hardware": "h100-sxm", "num_chips": 64,
           "tp": 8, "pp": 4, "dp": 2, "cp": 1, "global_batch_seqs": 64, "seq_len": 8192,
           "precision": "bf16", "pipeline_schedule": "interleaved"}
    assert predict_train(pd.DataFrame([row])).iloc[0].vp in (2, 4, 5)
    big = {**row, "model": "llama-3.1-405b", "num_chips": 1024, "pp": 16, "dp": 8,
           "global_batch_seqs": 512}
    r = predict_train(pd.DataFrame([big])).iloc[0]
    assert 2 <= r.vp and 16 * r.vp <= 126 and r.feasible


@pytest.mark.parametrize("change,where", BAD)
def test_bad_values_exit_2_naming_row_and_column(tmp_path, capsys, change, where):
    cases = write(tmp_path / "c.csv", [{**DENSE, **change}])
    rc, _, err = run_cli(capsys, "predict", "--train", cases, "--out", tmp_path / "p.csv")
    assert rc == 2
    assert where in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("column,hint", [
    ("global_batch_seq", "global_batch_seqs"), ("recomptue", "recompute"),
    ("topology.scaleout.link_bw_byte_per_s", "topology.scaleout.link_bw_bytes_per_s"),
    ("hbm_bw_bytes_per_s", "accelerator.hbm_bw_bytes_per_s"),
])
def test_typo_and_field_columns_are_refused(tmp_path, capsys, column, hint):
    cases = write(tmp_path / "c.csv", [{**DENSE, column: 1}], COLUMNS + [column])
    rc, _, err = run_cli(capsys, "predict", "--train", cases, "--out", tmp_path / "p.csv")
    assert rc == 2 and column in err and hint in err


def test_missing_required_column_and_subprocess_exit_code(tmp_path):
    cols = [c for c in COLUMNS if c != "seq_len"]
    cases = write(tmp_path / "c.csv", [DENSE], cols)
    r = run_subprocess("predict", "--train", cases, "--out", tmp_path / "p.csv")
    assert r.returncode == 2 and "seq_len" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.skipif(not TRAIN_CASES.exists(), reason="shared/calibration not next to checkout")
def test_flop_convention_matches_megatron_bridge_published_tflops():
    """Megatron-Bridge 25.11 publishes "model TFLOP/s/GPU" with Megatron's count next to its
    tokens/s: dse's F per token times the measured tokens/s reproduces it (gpt-oss-120b
    excepted: the contract counts its sliding-window layers as full causal layers)."""
    cases = pd.read_csv(TRAIN_CASES, dtype=str, keep_default_na=False, na_values=[""])
    truth = pd.read_csv(SHARED / "calibration" / "training_truth.csv")
    mb = truth[(truth["source"] == "MB2511") & ~truth["case_id"].str.contains("gpt-oss")]
    p = predict_train(cases[cases["case_id"].isin(mb["case_id"])]).set_index("case_id")
    for _, t in mb.iterrows():
        published = float(re.search(r"=(\d+)", t["also_published"]).group(1))
        per_token = p.loc[t["case_id"], "model_tflops_per_chip"] / p.loc[
            t["case_id"], "tokens_per_s_per_chip"]
        assert per_token * t["value"] == pytest.approx(published, abs=1.0), t["case_id"]  # rounded
