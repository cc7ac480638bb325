"""The `dse` command line against contracts/cli.md and contracts/predict-cases.md.

Most calls run in-process through ``dse.cli.main`` (captured with ``capsys``); a few run
``python -m dse`` as a real subprocess to check exit codes and the stderr line.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import CASE_COLUMNS, run_cli, run_subprocess, write_cases  # noqa: F401

import dse
from dse.cli import main

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
EXAMPLES = ROOT / "examples"
LLAMA_EXAMPLE = EXAMPLES / "llama70b-h100.toml"
CALIBRATION_CASES = SHARED / "calibration" / "cases.csv"

# contracts/predict-cases.md, "Catalog ids that must exist"
ACCELERATORS = ("a100-sxm-80g", "h100-sxm", "h100-pcie", "h200-sxm", "h800-sxm", "gh200", "b200",
                "b300", "gb200", "gb300", "mi300x", "mi325x", "mi355x", "l40s", "rtx-pro-6000",
                "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-v7", "trn2", "gaudi3")
TOPOLOGIES = ("hgx-8", "nvl72", "pcie-8", "mi-8", "tpu-torus-3d", "tpu-torus-2d",
              "trn2-ultraserver")
MODELS = ("llama-2-70b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "llama-4-scout",
          "llama-4-maverick", "mixtral-8x7b", "mixtral-8x22b", "deepseek-v3", "qwen3-30b-a3b",
          "qwen3-235b-a22b", "gpt-oss-120b", "kimi-k2", "palm-540b")

# contracts/predict-cases.md, "Output columns", in order (reason goes with feasible)
OUTPUT_COLUMNS = ["case_id", "concurrency", "ttft_s", "ttft_unloaded_s", "tpot_s",
                  "output_tokens_per_s_per_chip", "input_tokens_per_s_per_chip", "bound",
                  "feasible", "reason"]
BOUNDS = {"compute", "memory", "network", "capacity"}
OPS = ("attn_proj", "attn_core", "mlp_dense", "logits")

# a handful of cases from the contract's ids: dense and MoE, blank concurrency, blank layout,
# disaggregated decode and prefill, a prefix cache, and a model that cannot fit
SMALL_CASES = [
    dict(case_id="dense_fp8", model="llama-3.1-70b", hardware="h100-sxm", num_chips=4, tp=4, pp=1,
         ep=1, dp=1, weight_dtype="fp8", isl=2048, osl=256, concurrency=64),
    dict(case_id="moe_bf16", model="mixtral-8x7b", hardware="h200-sxm", topology="hgx-8",
         num_chips=2, tp=2, pp=1, ep=2, dp=1, weight_dtype="bf16", isl=1024, osl=128,
         concurrency=32, phase="both"),
    dict(case_id="auto_concurrency", model="llama-3.1-8b", hardware="h100-sxm", num_chips=1, tp=1,
         pp=1, ep=1, dp=1, weight_dtype="fp8", kv_dtype="fp8", isl=128, osl=128),
    dict(case_id="auto_layout_8", model="llama-3.1-70b", hardware="h200-sxm", num_chips=8,
         weight_dtype="fp8", isl=1024, osl=1024, concurrency=128),
    dict(case_id="moe_decode", model="deepseek-v3", hardware="b200", num_chips=8,
         weight_dtype="fp8", isl=1024, osl=1024, concurrency=64, phase="decode"),
    dict(case_id="dense_prefill", model="llama-3.1-70b", hardware="h100-sxm", num_chips=8, tp=8,
         pp=1, ep=1, dp=1, weight_dtype="fp8", isl=4096, osl=256, concurrency=8, phase="prefill"),
    dict(case_id="moe_no_prefix", model="qwen3-30b-a3b", hardware="h100-sxm", num_chips=1, tp=1,
         pp=1, ep=1, dp=1, weight_dtype="bf16", isl=2048, osl=256, concurrency=16),
    dict(case_id="moe_prefix_half", model="qwen3-30b-a3b", hardware="h100-sxm", num_chips=1, tp=1,
         pp=1, ep=1, dp=1, weight_dtype="bf16", isl=2048, osl=256, concurrency=16,
         prefix_hit_fraction=0.5),
    dict(case_id="no_fit", model="llama-3.1-405b", hardware="l40s", num_chips=1, tp=1, pp=1, ep=1,
         dp=1, weight_dtype="bf16", isl=1024, osl=128, concurrency=8),
    dict(case_id="no_fit_auto", model="llama-3.1-405b", hardware="l40s", num_chips=1,
         weight_dtype="bf16", isl=1024, osl=128),
]






def listed_ids(stdout: str) -> list[str]:
    """The ids of `dse catalog list`: the first word of each indented entry line."""
    return [line.split()[0] for line in stdout.splitlines()
            if line.startswith("  ") and line.strip()]


# `dse predict` writes 4 significant digits (``csv_frame``): the CSV is csv_frame of the library's
# frame to 1e-9, and the library's full-precision numbers to half a unit of the 4th digit
CSV_RTOL = 1e-9
DIGITS_RTOL = 5e-4


def assert_same_table(got: pd.DataFrame, want: pd.DataFrame, rtol: float = CSV_RTOL):
    """Equal columns and rows; numbers to RTOL, NaN where the library has NaN."""
    assert list(got.columns) == list(want.columns)
    assert len(got) == len(want)
    for c in want.columns:
        w, g = want[c], got[c]
        if pd.api.types.is_numeric_dtype(w) and not pd.api.types.is_bool_dtype(w):
            np.testing.assert_allclose(g.to_numpy(dtype=float), w.to_numpy(dtype=float),
                                       rtol=rtol, atol=0, equal_nan=True, err_msg=c)
        elif pd.api.types.is_bool_dtype(w):
            assert g.astype(str).str.lower().tolist() == w.astype(str).str.lower().tolist(), c
        else:
            text = lambda s: s.astype(object).where(s.notna(), "").astype(str).tolist()  # noqa: E731
            assert text(g) == text(w), c


# ---------------------------------------------------------------------------------------------
# catalog


def test_catalog_list_names_every_contract_id(capsys):
    rc, out, err = run_cli(capsys, "catalog", "list")
    assert rc == 0, err
    ids = set(listed_ids(out))
    for want in (*ACCELERATORS, *TOPOLOGIES, *MODELS):
        assert want in ids, f"{want} missing from `dse catalog list`"
    # a one-line summary follows each id
    for line in out.splitlines():
        if line.startswith("  ") and line.strip():
            assert len(line.split()) > 1, line


@pytest.mark.parametrize("kind, ids, others", [
    ("models", MODELS, ACCELERATORS + TOPOLOGIES),
    ("accelerators", ACCELERATORS, MODELS + TOPOLOGIES),
    ("topologies", TOPOLOGIES, ACCELERATORS + MODELS),
])
def test_catalog_list_one_kind(capsys, kind, ids, others):
    rc, out, err = run_cli(capsys, "catalog", "list", kind)
    assert rc == 0, err
    got = set(listed_ids(out))
    assert set(ids) <= got
    assert not got & set(others), f"`dse catalog list {kind}` lists other kinds: {got & set(others)}"


def test_catalog_show_fields_units_and_source(capsys):
    rc, out, err = run_cli(capsys, "catalog", "show", "h100-sxm")
    assert rc == 0, err
    assert "h100-sxm" in out.splitlines()[0]
    fields = {line.split()[0]: line for line in out.splitlines()[1:] if line.strip()}
    # values in readable units: SI prefixes, memory also in GiB (the "80GB" of the name), money
    for key, shown in (("hbm_capacity_bytes", "85.5 GB (79.6 GiB)"),
                       ("hbm_bw_bytes_per_s", "3.35 TB/s"), ("tdp_w", "700 W"),
                       ("price.usd_per_hour", "$1.30/h"), ("peak_flops_per_s.bf16", "989 TFLOP/s"),
                       ("efficiency.layer_overhead_s", " us")):
        assert key in fields, f"{key} not shown"
        assert fields[key].rstrip().endswith(shown) or shown in fields[key], fields[key]
    assert "source_url" in fields
    assert "https://" in fields["source_url"]
    # no None, no raw exponent: a missing peak rate says so
    assert "None" not in out and not re.search(r"\d e\+\d|\de\+\d\d (bytes|FLOP)", out), out
    assert "not supported" in fields["peak_flops_per_s.fp4"]


def test_catalog_show_names_the_kind_in_the_singular(capsys):
    rc, out, err = run_cli(capsys, "catalog", "show", "nvl72")
    assert rc == 0, err
    assert out.splitlines()[0] == "topology nvl72"
    assert "None" not in out and "e-07" not in out        # latencies in ns/us
    rc, out, err = run_cli(capsys, "catalog", "list", "accelerators")
    line = next(ln for ln in out.splitlines() if ln.split() and ln.split()[0] == "h100-sxm")
    assert "85.5 GB (79.6 GiB)" in line, line


def test_catalog_show_peak_flops_have_units(capsys):
    rc, out, err = run_cli(capsys, "catalog", "show", "h100-sxm")
    assert rc == 0, err
    line = next(l for l in out.splitlines() if l.split() and l.split()[0] == "peak_flops_per_s.bf16")
    assert "FLOP/s" in line, line


# ---------------------------------------------------------------------------------------------
# eval


def test_eval_text_breakdown_and_metrics(capsys):
    rc, out, err = run_cli(capsys, "eval", LLAMA_EXAMPLE)
    assert rc == 0, err
    assert err == ""
    for op in OPS:
        assert op in out, f"op {op} missing from the breakdown"
    assert "decode bound:" in out
    bound_line = next(l for l in out.splitlines() if l.startswith("decode bound:"))
    assert bound_line.split(":", 1)[1].strip() in BOUNDS
    for m in ("ttft_s", "tpot_s", "output_tokens_per_s_per_chip", "usd_per_mtok_output"):
        assert m in out, f"metric {m} missing"
    # the breakdown has compute, memory and network time per op, for decode and prefill steps
    assert "compute" in out and "memory" in out and "network" in out
    assert "decode" in out and "prefill" in out


def test_eval_json_one_object(capsys):
    rc, out, err = run_cli(capsys, "eval", LLAMA_EXAMPLE, "--json")
    assert rc == 0, err
    res = json.loads(out)  # the whole of stdout is one JSON value
    assert isinstance(res, dict)
    assert {"design", "metrics", "breakdown"} <= set(res)
    m = res["metrics"]
    for k in ("tpot_s", "ttft_s", "output_tokens_per_s_per_chip", "usd_per_mtok_output"):
        v = m[k]
        assert isinstance(v, (int, float)) and not isinstance(v, bool), (k, v)
        assert math.isfinite(v) and v > 0, (k, v)
    assert m["feasible"] is True
    assert m["bound"] in BOUNDS
    ops = {op["op"] for step in res["breakdown"].values() for op in step["ops"]}
    assert set(OPS) <= ops


def test_eval_json_is_strict_json(capsys):
    rc, out, err = run_cli(capsys, "eval", LLAMA_EXAMPLE, "--json")
    assert rc == 0, err

    def reject(name):
        raise ValueError(f"non-standard JSON constant {name}")

    json.loads(out, parse_constant=reject)


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.toml")))
def test_eval_json_equals_library(capsys, example):
    from dse.scoring.evaluate import evaluate_file
    path = EXAMPLES / example
    rc, out, err = run_cli(capsys, "eval", path, "--json")
    assert rc == 0, err
    got = json.loads(out)["metrics"]
    want = evaluate_file(str(path))["metrics"]
    assert set(got) == set(want)
    for k, w in want.items():
        g = got[k]
        if isinstance(w, float) and not isinstance(w, bool):
            assert g == pytest.approx(w, rel=1e-12), k
        else:
            assert g == w, k


# ---------------------------------------------------------------------------------------------
# predict


@pytest.fixture(scope="module")
def small_cases(tmp_path_factory):
    return write_cases(tmp_path_factory.mktemp("cases") / "cases.csv", SMALL_CASES)


@pytest.fixture(scope="module")
def small_prediction(small_cases, tmp_path_factory):
    """(stdout, prediction table) of `dse predict` on SMALL_CASES, run once for the module."""
    out = tmp_path_factory.mktemp("pred") / "predictions.csv"
    import io
    from contextlib import redirect_stderr, redirect_stdout
    so, se = io.StringIO(), io.StringIO()
    with redirect_stdout(so), redirect_stderr(se):
        rc = main(["predict", str(small_cases), "--out", str(out)])
    assert rc == 0, se.getvalue()
    return so.getvalue(), out, pd.read_csv(out)


def test_predict_output_columns_and_rows(small_prediction):
    _, _, pred = small_prediction
    assert list(pred.columns[:len(OUTPUT_COLUMNS)]) == OUTPUT_COLUMNS
    assert pred["case_id"].tolist() == [c["case_id"] for c in SMALL_CASES]
    assert set(pred["bound"]) <= BOUNDS
    assert pred["feasible"].dtype == bool
    assert (pred["concurrency"] >= 1).all()
    assert (pred["concurrency"] == np.round(pred["concurrency"])).all()


def test_predict_given_concurrency_is_kept(small_prediction):
    _, _, pred = small_prediction
    p = pred.set_index("case_id")
    for c in SMALL_CASES:
        if "concurrency" in c:
            assert p.loc[c["case_id"], "concurrency"] == c["concurrency"], c["case_id"]


def test_predict_feasible_rows_are_finite(small_prediction):
    _, _, pred = small_prediction
    p = pred.set_index("case_id")
    for cid in ("dense_fp8", "moe_bf16", "auto_concurrency", "auto_layout_8", "moe_no_prefix",
                "moe_prefix_half"):
        row = p.loc[cid]
        assert row["feasible"], (cid, row["reason"])
        for m in ("ttft_s", "tpot_s", "output_tokens_per_s_per_chip",
                  "input_tokens_per_s_per_chip"):
            assert math.isfinite(row[m]) and row[m] > 0, (cid, m, row[m])
        assert pd.isna(row["reason"]) or row["reason"] == ""


def test_predict_blank_concurrency_is_chosen(small_prediction):
    _, _, pred = small_prediction
    c = pred.set_index("case_id").loc["auto_concurrency", "concurrency"]
    assert int(c) == c and c >= 1


def test_predict_blank_layout_uses_num_chips(small_prediction):
    _, _, pred = small_prediction
    row = pred.set_index("case_id").loc["auto_layout_8"]
    assert row["feasible"]
    if {"tp", "pp", "dp"} <= set(pred.columns):  # extra columns, not in the contract
        assert row["tp"] * row["pp"] * row["dp"] == 8


def test_predict_decode_phase(small_prediction):
    _, _, pred = small_prediction
    row = pred.set_index("case_id").loc["moe_decode"]
    assert row["feasible"], row["reason"]
    assert row["input_tokens_per_s_per_chip"] == 0
    assert pd.isna(row["ttft_s"])
    assert math.isfinite(row["tpot_s"]) and row["tpot_s"] > 0
    assert row["output_tokens_per_s_per_chip"] > 0


def test_predict_prefill_phase(small_prediction):
    _, _, pred = small_prediction
    row = pred.set_index("case_id").loc["dense_prefill"]
    assert row["feasible"], row["reason"]
    assert pd.isna(row["tpot_s"])
    assert math.isfinite(row["ttft_s"]) and row["ttft_s"] > 0
    assert row["input_tokens_per_s_per_chip"] > 0


def test_predict_prefix_cache_shortens_ttft(small_prediction):
    _, _, pred = small_prediction
    p = pred.set_index("case_id")
    assert p.loc["moe_prefix_half", "ttft_s"] < p.loc["moe_no_prefix", "ttft_s"]


@pytest.mark.parametrize("cid", ["no_fit", "no_fit_auto"])
def test_predict_model_that_does_not_fit(small_prediction, cid):
    _, _, pred = small_prediction
    row = pred.set_index("case_id").loc[cid]
    assert not row["feasible"]
    assert isinstance(row["reason"], str) and row["reason"].strip()
    assert row["bound"] in BOUNDS


def test_predict_success_message_names_output(small_prediction):
    stdout, out, _ = small_prediction
    last = stdout.strip().splitlines()[-1]
    assert str(out) in last


def test_predict_equals_library(small_cases, small_prediction):
    from dse.scoring.predict import csv_frame, predict_frame, read_cases
    _, out, _ = small_prediction
    want = predict_frame(read_cases(str(small_cases)))
    got = pd.read_csv(out)
    assert_same_table(got, csv_frame(want))
    ok = want["feasible"].to_numpy()            # feasible rows: the library's numbers, rounded
    assert_same_table(got[ok].reset_index(drop=True), want[ok].reset_index(drop=True),
                      rtol=DIGITS_RTOL)


def test_predict_csv_has_4_significant_digits_and_blank_infeasible_rows(small_prediction):
    from dse.scoring.predict import BLANK_WHEN_INFEASIBLE
    _, out, pred = small_prediction
    for c in pred.columns:
        if pd.api.types.is_float_dtype(pred[c]):
            for v in pred[c].dropna():
                if v and math.isfinite(v):
                    assert float(f"{v:.3e}") == v, (c, v)       # 4 significant digits at most
    bad = pred[~pred["feasible"]]
    assert len(bad) >= 2                                       # the two cases that do not fit
    for c in BLANK_WHEN_INFEASIBLE:
        if c in bad:
            assert bad[c].isna().all(), c
    assert bad["reason"].str.len().gt(0).all() and bad["bound"].notna().all()


needs_calibration = pytest.mark.skipif(not CALIBRATION_CASES.is_file(),
                                       reason=f"calibration case file missing: {CALIBRATION_CASES}")


@needs_calibration
def test_predict_calibration_file(capsys, tmp_path):
    from dse.scoring.predict import predict_frame, read_cases
    out = tmp_path / "calibration_predictions.csv"
    rc, stdout, err = run_cli(capsys, "predict", CALIBRATION_CASES, "--out", out)
    assert rc == 0, err
    assert str(out) in stdout.strip().splitlines()[-1]
    got = pd.read_csv(out)
    assert len(got) == 364
    cases = pd.read_csv(CALIBRATION_CASES, dtype=str)
    assert got["case_id"].tolist() == cases["case_id"].tolist()
    assert list(got.columns[:len(OUTPUT_COLUMNS)]) == OUTPUT_COLUMNS
    assert set(got["bound"]) <= BOUNDS
    from dse.scoring.predict import csv_frame
    assert_same_table(got, csv_frame(predict_frame(read_cases(str(CALIBRATION_CASES)))))


# ---------------------------------------------------------------------------------------------
# the program itself (real subprocesses)


def test_version_subprocess():
    r = run_subprocess("--version")
    assert r.returncode == 0, r.stderr
    assert dse.__version__ in r.stdout + r.stderr


def test_no_arguments_exits_2_subprocess():
    r = run_subprocess()
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stdout == ""


def test_no_arguments_exits_2_in_process(capsys):
    rc, out, err = run_cli(capsys)
    assert rc == 2
    assert len(err.strip().splitlines()) == 1


def test_eval_json_subprocess():
    r = run_subprocess("eval", "examples/llama70b-h100.toml", "--json")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    res = json.loads(r.stdout)
    assert res["metrics"]["tpot_s"] > 0


def test_predict_subprocess(small_cases, tmp_path):
    out = tmp_path / "p.csv"
    r = run_subprocess("predict", small_cases, "--out", out)
    assert r.returncode == 0, r.stderr
    assert str(out) in r.stdout.strip().splitlines()[-1]
    assert len(pd.read_csv(out)) == len(SMALL_CASES)
