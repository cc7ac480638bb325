"""Hostile inputs (issue 27, point 4): each is refused with one line naming the file and the key,
exit code 2 and no traceback, or (CSV cells a spreadsheet would evaluate) neutralised."""

from __future__ import annotations

import pandas as pd
import pytest
from helpers import CASE_COLUMNS, SHARED, SMALL_SPACE, run_cli, write_cases
from test_bad_input import GOOD, assert_one_line_error


def validate_space(capsys, tmp_path, text, name="space.toml"):
    """``dse validate`` on TEXT written to NAME: (exit code, stdout, stderr, the path)."""
    path = tmp_path / name
    path.write_text(text)
    rc, out, err = run_cli(capsys, "validate", path)
    return rc, out, err, path


# ---------------------------------------------------------------------------------------------
# 1. constraint bounds


@pytest.mark.parametrize("key", ["max", "min"])
@pytest.mark.parametrize("value, words", [("nan", "not a finite number"),
                                          ("inf", "not a finite number"),
                                          ("-inf", "not a finite number"),
                                          ("-1", "negative"), ("-0.5", "negative"),
                                          ("true", "not a number"), ('"2"', "not a number")])
def test_constraint_bound_not_finite_or_negative(capsys, tmp_path, key, value, words):
    text = SMALL_SPACE.replace("ttft_s = { max = 2.0 }", f"ttft_s = {{ {key} = {value} }}")
    rc, _, err, path = validate_space(capsys, tmp_path, text)
    line = assert_one_line_error(rc, err, file=path)
    assert f"constraints.ttft_s.{key}" in line and words in line
    assert ">= 0" in line  # says what is valid


def test_constraint_bound_in_an_objectives_file_names_that_file(capsys, tmp_path):
    (tmp_path / "obj.toml").write_text('[objectives]\ntpot_s = "minimize"\n'
                                       "[constraints]\nusd_per_mtok_output = { max = nan }\n")
    head = SMALL_SPACE.split("[objectives]")[0]
    rc, _, err, _ = validate_space(capsys, tmp_path, 'objectives = "obj.toml"\n' + head)
    line = assert_one_line_error(rc, err, file=tmp_path / "obj.toml")
    assert "constraints.usd_per_mtok_output.max" in line


@pytest.mark.parametrize("bound", ["{ max = 0 }", "{ min = 0.0, max = 3 }", "{ min = 1e-9 }"])
def test_constraint_bound_zero_or_positive_is_accepted(capsys, tmp_path, bound):
    rc, out, err, _ = validate_space(
        capsys, tmp_path, SMALL_SPACE.replace("{ max = 2.0 }", bound))
    assert rc == 0, err
    assert "constraints: ttft_s" in out


# ---------------------------------------------------------------------------------------------
# 3. deeply nested TOML

DEEP = {
    "arrays": "name = " + "[" * 1200 + "]" * 1200 + "\n",
    "inline tables": "name = " + "{ a = " * 1200 + "1" + " }" * 1200 + "\n",
    "table headers": "[model." + ".".join(["a"] * 1200) + "]\nx = 1\n",
    "dotted keys": "model." + ".".join(["a"] * 1200) + " = 1\n",
    "33 levels": "[model." + ".".join(["a"] * 32) + "]\nx = 1\n",
}


@pytest.mark.parametrize("command", ["validate", "eval"])
@pytest.mark.parametrize("kind", sorted(DEEP))
def test_deeply_nested_toml_is_refused(capsys, tmp_path, command, kind):
    path = tmp_path / "deep.toml"
    path.write_text(DEEP[kind])
    rc, _, err = run_cli(capsys, command, path)
    line = assert_one_line_error(rc, err, file=path)
    assert "nested" in line and "at most 32 levels" in line
    assert "RecursionError" not in line


def test_deeply_nested_objectives_file_is_refused(capsys, tmp_path):
    (tmp_path / "obj.toml").write_text(DEEP["arrays"])
    head = SMALL_SPACE.split("[objectives]")[0]
    rc, _, err, _ = validate_space(capsys, tmp_path, 'objectives = "obj.toml"\n' + head)
    assert "nested" in assert_one_line_error(rc, err, file=tmp_path / "obj.toml")


def test_nesting_up_to_the_limit_is_read(capsys, tmp_path):
    # 32 levels get past the reader, to the check of the keys
    path = tmp_path / "deep.toml"
    path.write_text("[model." + ".".join(["a"] * 31) + "]\nx = 1\n")
    rc, _, err = run_cli(capsys, "eval", path)
    line = assert_one_line_error(rc, err, file=path)
    assert "nested" not in line and "unknown key" in line


# ---------------------------------------------------------------------------------------------
# 7. an unknown id in a space's base design is named under its own key

FIXED_ACC = SMALL_SPACE.replace('"accelerator.id" = ["h100-sxm", "h200-sxm", "a100-sxm-80g"]\n', "")


@pytest.mark.parametrize("text, key, bad", [
    (FIXED_ACC.replace('id = "h100-sxm"', 'id = "h100-sxmm"'), "accelerator.id", "h100-sxmm"),
    (FIXED_ACC.replace('id = "llama-3.1-8b"', 'id = "llama-3.1-8bb"'), "model.id", "llama-3.1-8bb"),
    (FIXED_ACC.replace("[model]", '[topology]\nid = "hgx-88"\n[model]'), "topology.id", "hgx-88"),
    # swept by a parameter: the base value is still a typo, and named as such
    (SMALL_SPACE.replace('id = "h100-sxm"', 'id = "h100-sxmm"'), "accelerator.id", "h100-sxmm"),
])
def test_unknown_base_id_names_its_key(capsys, tmp_path, text, key, bad):
    rc, _, err, path = validate_space(capsys, tmp_path, text)
    line = assert_one_line_error(rc, err, file=path)
    assert f"{path}: {key}: unknown" in line and repr(bad) in line
    assert "parameters." not in line
    assert "did you mean" in line


# ---------------------------------------------------------------------------------------------
# 5. a population (or segment) of no trials


@pytest.mark.parametrize("flag, value", [("--population", 0), ("--population", -4),
                                         ("--segment-trials", 0)])
@pytest.mark.parametrize("strategy", ["exhaustive", "optuna"])
def test_run_with_no_trials_per_batch_is_refused(capsys, tmp_path, flag, value, strategy):
    space = tmp_path / "space.toml"
    space.write_text(SMALL_SPACE)
    out = tmp_path / "run"
    rc, _, err = run_cli(capsys, "run", space, "--strategy", strategy, flag, value,
                         "--out", out, "--quiet")
    line = assert_one_line_error(rc, err)
    assert f"{flag} {value} must be >= 1" in line
    assert not out.exists(), "a refused run leaves no run folder"


# ---------------------------------------------------------------------------------------------
# 2. a case column named like a field's last part


def predict_with(capsys, tmp_path, column, value):
    cases = write_cases(tmp_path / "cases.csv", [{**GOOD, column: value}],
                        [*CASE_COLUMNS, column])
    out = tmp_path / "predictions.csv"
    rc, _, err = run_cli(capsys, "predict", cases, "--out", out)
    return rc, err, cases, out


@pytest.mark.parametrize("column, meant", [
    ("hbm_bw_bytes_per_s", "'accelerator.hbm_bw_bytes_per_s'"),
    ("max_num_tokens", "'serving.max_num_tokens'"),
    ("tdp_w", "'accelerator.tdp_w'"),
    ("max_num_token", "'serving.max_num_tokens'"),           # one edit from it
    ("link_bw_bytes_per_s", ("'topology.scaleout.link_bw_bytes_per_s' or "
                             "'topology.scaleup.link_bw_bytes_per_s'")),
])
def test_case_column_named_like_a_field_is_refused(capsys, tmp_path, column, meant):
    rc, err, cases, out = predict_with(capsys, tmp_path, column, "8192")
    line = assert_one_line_error(rc, err, file=cases)
    assert f"column {column}" in line and f"rename it to {meant}" in line
    assert not out.exists()


@pytest.mark.parametrize("column", ["accelerator.hbm_bw_bytes_per_s", "my_remark", "source",
                                    "citation", "note", "split", "mode", "derived_inputs"])
def test_dotted_and_extra_case_columns_are_accepted(capsys, tmp_path, column):
    value = "4.0e12" if "." in column else "aggregated"
    rc, err, _, out = predict_with(capsys, tmp_path, column, value)
    assert rc == 0, err
    assert len(pd.read_csv(out)) == 1


@pytest.mark.parametrize("name", ["cases.csv", "silicon_hopper_cases.csv"])
def test_calibration_case_files_still_predict(tmp_path, name):
    path = SHARED / "calibration" / name
    if not path.exists():
        pytest.skip(f"{path} is not here")
    from dse.scoring.predict import read_cases
    assert len(read_cases(str(path))) > 0     # every column of theirs is accepted


# ---------------------------------------------------------------------------------------------
# 4. CSV injection: text cells a spreadsheet would evaluate

HOSTILE_IDS = ['=HYPERLINK("http://x","y")', "+1+1", "-2+3", "@SUM(A1)", "\tx", "\rx"]


def test_predictions_neutralise_formula_case_ids(capsys, tmp_path):
    ids = [*HOSTILE_IDS, "-7", "plain"]
    cases = write_cases(tmp_path / "cases.csv", [{**GOOD, "case_id": i} for i in ids])
    out = tmp_path / "predictions.csv"
    rc, _, err = run_cli(capsys, "predict", cases, "--out", out)
    assert rc == 0, err
    pred = pd.read_csv(out, dtype={"case_id": str}, keep_default_na=False)
    assert list(pred["case_id"]) == ["'" + i for i in HOSTILE_IDS] + ["-7", "plain"]
    assert pred["ttft_s"].dtype == float and (pred["ttft_s"] > 0).all()


def test_spreadsheet_safe_touches_text_cells_only():
    from dse.spec.csvsafe import spreadsheet_safe
    df = pd.DataFrame({"id": ["=1+2", "-1", "-x", "ok", None],
                       "n": [-1.0, -2.5, 3.0, 4.0, 5.0],
                       "mixed": [-1, "@x", 2.5, "'=done", float("nan")]})
    out = spreadsheet_safe(df)
    assert list(out["id"][:4]) == ["'=1+2", "-1", "'-x", "ok"] and pd.isna(out["id"][4])
    assert out["n"].tolist() == [-1.0, -2.5, 3.0, 4.0, 5.0] and out["n"].dtype == float
    assert out["mixed"].tolist()[:4] == [-1, "'@x", 2.5, "'=done"]   # once only
    assert df["id"][0] == "=1+2", "the caller's frame is left alone"
    clean = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    assert spreadsheet_safe(clean) is clean


def test_front_csv_neutralises_text_cells(tmp_path):
    from dse.search import store
    front = pd.DataFrame({"tpot_s": [0.01, -0.0], "accelerator.id": ["=evil()", "h100-sxm"],
                          "design_id": [3, 4]})
    store.write_front(tmp_path, front, [{"name": "tpot_s"}], ["accelerator.id"])
    back = pd.read_csv(tmp_path / "front.csv")
    assert back["accelerator.id"].tolist() == ["'=evil()", "h100-sxm"]
    assert back["tpot_s"].tolist() == [0.01, -0.0] and back["design_id"].tolist() == [3, 4]


# ---------------------------------------------------------------------------------------------
# 6. a what-if whose change leaves no design of the front valid

WHATIF_SPACE = """
name = "w"
[accelerator]
id = "h100-sxm"
[model]
id = "llama-3.1-8b"
[parameters]
"layout.tp" = [1, 2, 4]
"workload.concurrency" = [1, 8, 64]
[objectives]
usd_per_mtok_output = "minimize"
tpot_s = "minimize"
"""


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("whatif")
    (d / "space.toml").write_text(WHATIF_SPACE)
    from dse.cli import main
    assert main(["run", str(d / "space.toml"), "--out", str(d / "run"), "--quiet"]) == 0
    return d / "run"


def test_whatif_that_leaves_no_valid_design_is_refused(capsys, tmp_path, small_run):
    n = len(pd.read_csv(small_run / "front.csv"))
    out = tmp_path / "wi"
    rc, _, err = run_cli(capsys, "whatif", small_run, "--set", "layout.tp=3", "--out", out)
    line = assert_one_line_error(rc, err, file=small_run)
    assert "--set layout.tp=3" in line
    assert f"none of the front's {n} designs valid" in line
    assert f"tp does not divide num_attention_heads ({n} of {n})" in line   # dse.perf.REASONS
    assert not out.exists(), "nothing is written"


def test_whatif_where_no_design_fits_is_an_answer(capsys, tmp_path, small_run):
    # a change that only makes the designs not fit: a legitimate answer, written
    out = tmp_path / "wi"
    rc, _, err = run_cli(capsys, "whatif", small_run, "--scale",
                         "accelerator.hbm_capacity_bytes=0.01", "--out", out, "--bands", 0)
    assert rc == 0, err
    assert "still feasible: 0" in (out / "whatif.md").read_text()
