"""Bad input to the `dse` command line (contracts/cli.md, "Exit codes and errors").

Every case must exit 2 with exactly one line on stderr that names the file and the key, row or
column (with a suggestion where one makes sense), never a traceback, and must leave the output
file alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import CASE_COLUMNS, run_cli, run_subprocess, write_cases  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]

GOOD = dict(case_id="good", model="llama-3.1-8b", hardware="h100-sxm", num_chips=1, tp=1, pp=1,
            ep=1, dp=1, weight_dtype="fp8", isl=128, osl=128, concurrency=8)
SENTINEL = "SENTINEL: an earlier run's completed results\n"

DESIGN_OK = '[accelerator]\nid = "h100-sxm"\n\n[model]\nid = "llama-3.1-8b"\nweight_dtype = "fp8"\n'


def bad_row(**changes) -> dict:
    row = dict(GOOD, case_id="bad")
    row.update(changes)
    return row


def assert_one_line_error(rc, err, *, file=None):
    assert rc == 2, f"exit code {rc}, stderr: {err!r}"
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one stderr line, got: {err!r}"
    if file is not None:
        assert str(file) in lines[0], f"the file is not named: {lines[0]!r}"
    return lines[0]


def predict_bad(capsys, tmp_path, rows, columns=CASE_COLUMNS):
    """Run `dse predict` on ROWS; returns (the error line, the case file, the output path)."""
    cases = write_cases(tmp_path / "cases.csv", rows, columns)
    out = tmp_path / "predictions.csv"
    rc, stdout, err = run_cli(capsys, "predict", cases, "--out", out)
    line = assert_one_line_error(rc, err, file=cases)
    assert not out.exists(), "bad input must not write the output file"
    assert not list(tmp_path.glob("predictions.csv*")), "no temporary output is left behind"
    return line, cases, out


# ---------------------------------------------------------------------------------------------
# case CSV


def test_unknown_accelerator_id(capsys, tmp_path):
    line, _, _ = predict_bad(capsys, tmp_path, [GOOD, bad_row(hardware="h100-sxn")])
    assert "h100-sxn" in line
    assert "hardware" in line or "accelerator" in line
    assert "h100-sxm" in line  # the suggestion


def test_unknown_model_id(capsys, tmp_path):
    line, _, _ = predict_bad(capsys, tmp_path, [GOOD, bad_row(model="llama-3.1-8c")])
    assert "llama-3.1-8c" in line
    assert "model" in line
    assert "llama-3.1-8b" in line


def test_unknown_topology_id(capsys, tmp_path):
    line, _, _ = predict_bad(capsys, tmp_path, [GOOD, bad_row(topology="hgx-9")])
    assert "hgx-9" in line
    assert "topolog" in line
    assert "hgx-8" in line


@pytest.mark.parametrize("change", [dict(hardware="h100-sxn"), dict(model="llama-3.1-8c"),
                                    dict(topology="hgx-9")], ids=["hardware", "model", "topology"])
def test_unknown_id_names_the_csv_row(capsys, tmp_path, change):
    auto = dict(GOOD, case_id="auto", model="llama-3.1-70b", hardware="h200-sxm", num_chips=8,
                tp="", pp="", ep="", dp="")
    line, _, _ = predict_bad(capsys, tmp_path, [auto, GOOD, bad_row(**change)])
    assert "row 4" in line or "case_id bad" in line, line


def test_unknown_topology_message_spelling(capsys, tmp_path):
    line, _, _ = predict_bad(capsys, tmp_path, [bad_row(topology="hgx-9")])
    assert "topologie " not in line, line


@pytest.mark.parametrize("missing", ["case_id", "model", "hardware", "num_chips", "weight_dtype",
                                     "isl", "osl"])
def test_missing_required_column(capsys, tmp_path, missing):
    cols = [c for c in CASE_COLUMNS if c != missing]
    line, _, _ = predict_bad(capsys, tmp_path, [GOOD], columns=cols)
    assert repr(missing) in line or f"column {missing}" in line, line


def test_blank_required_value(capsys, tmp_path):
    line, _, _ = predict_bad(capsys, tmp_path, [GOOD, bad_row(hardware="")])
    assert "hardware" in line and "row 3" in line


def test_duplicate_case_id(capsys, tmp_path):
    line, _, _ = predict_bad(capsys, tmp_path, [GOOD, dict(GOOD)])
    assert "duplicate" in line and "good" in line
    assert "row 3" in line


@pytest.mark.parametrize("col, value", [("isl", "abc"), ("osl", "1.5"), ("num_chips", "0"),
                                        ("concurrency", "-4"), ("tp", "two")])
def test_non_numeric_or_invalid_integer(capsys, tmp_path, col, value):
    line, _, _ = predict_bad(capsys, tmp_path, [GOOD, bad_row(**{col: value})])
    assert col in line and value in line
    assert "row 3" in line
    assert "whole number" in line  # what would be valid


def test_tp_does_not_divide_heads(capsys, tmp_path):
    # llama-3.1-70b has 64 attention heads; tp = 3 with a full layout on 3 chips
    row = bad_row(model="llama-3.1-70b", num_chips=3, tp=3, pp=1, ep=1, dp=1)
    line, _, _ = predict_bad(capsys, tmp_path, [GOOD, row])
    assert "row 3" in line
    assert "tp" in line and "heads" in line


def test_layout_product_differs_from_num_chips(capsys, tmp_path):
    row = bad_row(model="llama-3.1-70b", num_chips=8, tp=2, pp=1, ep=1, dp=1)
    line, _, _ = predict_bad(capsys, tmp_path, [GOOD, row])
    assert "row 3" in line
    assert "num_chips" in line and "tp*pp*dp" in line


def test_ep_on_dense_model(capsys, tmp_path):
    row = bad_row(model="llama-3.1-70b", num_chips=4, tp=4, pp=1, ep=2, dp=1)
    line, _, _ = predict_bad(capsys, tmp_path, [GOOD, row])
    assert "row 3" in line
    assert "ep" in line and "dense" in line
    assert "ep = 1" in line  # the suggestion


@pytest.mark.parametrize("layout", [dict(tp=8, pp=1, ep=1, dp=1), dict(tp=4),
                                    dict(tp=2, pp=2)], ids=["full", "tp_only", "tp_pp"])
def test_layout_needs_more_chips_than_given(capsys, tmp_path, layout):
    row = bad_row(model="llama-3.1-70b", num_chips=2, **{k: "" for k in ("tp", "pp", "ep", "dp")})
    row.update(layout)
    line, _, _ = predict_bad(capsys, tmp_path, [GOOD, row])
    assert "row 3" in line
    assert "num_chips" in line


@pytest.mark.parametrize("change, words", [
    (dict(weight_dtype="fp9"), ("weight_dtype", "fp9", "fp8")),
    (dict(kv_dtype="fp9"), ("kv_dtype", "fp9", "fp8")),
    (dict(phase="decod"), ("phase", "decod", "decode")),
    (dict(prefix_hit_fraction="1.5"), ("prefix_hit_fraction", "1.5")),
    (dict(prefix_hit_fraction="half"), ("prefix_hit_fraction", "half")),
], ids=["weight_dtype", "kv_dtype", "phase", "fraction", "fraction_text"])
def test_invalid_case_values(capsys, tmp_path, change, words):
    line, _, _ = predict_bad(capsys, tmp_path, [GOOD, bad_row(**change)])
    for w in words:
        assert w in line, (w, line)


@pytest.mark.parametrize("col, value, valid", [
    ("serving.overlap_schedule", "1.5", "[0, 1]"), ("serving.overlap_schedule", "nan", "[0, 1]"),
    ("serving.stream_interval", "0", "whole number >= 1"),
    ("serving.stream_interval", "2.5", "whole number >= 1"),
    ("serving.batch_wait_iters", "-1", "whole number >= 0"),
    ("serving.batch_wait_iters", "inf", "whole number >= 0"),
    ("serving.batch_wait_tokens_fraction", "1.5", "[0, 1]"),
    ("serving.batch_wait_tokens_fraction", "-1", "[0, 1]")])
def test_scheduler_loop_stream_and_batch_wait_columns(capsys, tmp_path, col, value, valid):
    """The scheduler loop, stream interval and batch-wait columns: the row, the column and what
    would be valid; a misspelt one is named with the right spelling."""
    line, _, _ = predict_bad(capsys, tmp_path, [GOOD, bad_row(**{col: value})],
                             [*CASE_COLUMNS, col])
    assert "row 3" in line and col in line and value in line and valid in line
    line, _, _ = predict_bad(capsys, tmp_path, [GOOD, bad_row(**{col[:-1]: "1"})],
                             [*CASE_COLUMNS, col[:-1]])
    assert f"unknown key '{col[:-1]}'" in line and f"'{col}'" in line


def test_case_file_not_found(capsys, tmp_path):
    out = tmp_path / "p.csv"
    missing = tmp_path / "nope.csv"
    rc, _, err = run_cli(capsys, "predict", missing, "--out", out)
    assert_one_line_error(rc, err, file=missing)
    assert not out.exists()


def test_empty_case_file(capsys, tmp_path):
    cases = tmp_path / "cases.csv"
    cases.write_text("")
    out = tmp_path / "p.csv"
    rc, _, err = run_cli(capsys, "predict", cases, "--out", out)
    assert_one_line_error(rc, err, file=cases)
    assert not out.exists()


def test_unknown_accelerator_subprocess(tmp_path):
    cases = write_cases(tmp_path / "cases.csv", [GOOD, bad_row(hardware="h100-sxn")])
    out = tmp_path / "p.csv"
    r = run_subprocess("predict", cases, "--out", out)
    line = assert_one_line_error(r.returncode, r.stderr, file=cases)
    assert "h100-sxm" in line
    assert r.stdout == ""
    assert not out.exists()


# ---------------------------------------------------------------------------------------------
# output file safety


def test_out_equal_to_input_is_refused(capsys, tmp_path):
    cases = write_cases(tmp_path / "cases.csv", [GOOD])
    before = cases.read_bytes()
    rc, _, err = run_cli(capsys, "predict", cases, "--out", cases)
    line = assert_one_line_error(rc, err, file=cases)
    assert "--out" in line or "overwrite" in line
    assert cases.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cases.csv"]


def test_out_equal_to_input_other_spelling_is_refused(capsys, tmp_path, monkeypatch):
    cases = write_cases(tmp_path / "cases.csv", [GOOD])
    before = cases.read_bytes()
    monkeypatch.chdir(tmp_path)
    rc, _, err = run_cli(capsys, "predict", "cases.csv", "--out", f"./sub/../{cases.name}")
    assert rc == 2, err
    rc, _, err = run_cli(capsys, "predict", cases, "--out", "cases.csv")
    assert_one_line_error(rc, err)
    assert cases.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cases.csv"]


@pytest.mark.parametrize("rows", [
    [GOOD, bad_row(hardware="h100-sxn")],
    [GOOD, bad_row(isl="abc")],
    [GOOD, bad_row(model="llama-3.1-70b", num_chips=4, tp=4, pp=1, ep=2, dp=1)],
    [GOOD, bad_row(prefix_hit_fraction="1.5")],
    [GOOD, dict(GOOD)],
], ids=["unknown_id", "non_numeric", "bad_layout", "bad_fraction", "duplicate"])
def test_existing_output_untouched_on_bad_input(capsys, tmp_path, rows):
    cases = write_cases(tmp_path / "cases.csv", rows)
    out = tmp_path / "predictions.csv"
    out.write_text(SENTINEL)
    rc, _, err = run_cli(capsys, "predict", cases, "--out", out)
    assert_one_line_error(rc, err, file=cases)
    assert out.read_text() == SENTINEL
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cases.csv", "predictions.csv"]


def test_existing_output_untouched_when_input_missing(capsys, tmp_path):
    out = tmp_path / "predictions.csv"
    out.write_text(SENTINEL)
    rc, _, err = run_cli(capsys, "predict", tmp_path / "nope.csv", "--out", out)
    assert_one_line_error(rc, err)
    assert out.read_text() == SENTINEL


def test_out_in_missing_folder_is_bad_input(capsys, tmp_path):
    cases = write_cases(tmp_path / "cases.csv", [GOOD])
    rc, _, err = run_cli(capsys, "predict", cases, "--out", tmp_path / "no" / "such" / "p.csv")
    assert_one_line_error(rc, err)


# ---------------------------------------------------------------------------------------------
# design TOML


def eval_bad(capsys, tmp_path, text):
    design = tmp_path / "design.toml"
    design.write_text(text)
    rc, out, err = run_cli(capsys, "eval", design)
    line = assert_one_line_error(rc, err, file=design)
    assert out == ""
    return line


def test_design_ok_baseline(capsys, tmp_path):
    """The designs below differ from this one by one mistake each."""
    design = tmp_path / "design.toml"
    design.write_text(DESIGN_OK)
    rc, _, err = run_cli(capsys, "eval", design)
    assert rc == 0, err


def test_design_misspelled_key(capsys, tmp_path):
    text = DESIGN_OK.replace('id = "h100-sxm"', 'id = "h100-sxm"\nhbm_bw_bytes_per_sec = 3e12')
    line = eval_bad(capsys, tmp_path, text)
    assert "hbm_bw_bytes_per_sec" in line
    # the suggestion names the right key (not only as a prefix of the wrong one)
    assert line.replace("hbm_bw_bytes_per_sec", "").count("hbm_bw_bytes_per_s") >= 1, line


@pytest.mark.parametrize("section, hint", [("layuot", "layout"), ("gpu", "accelerator")])
def test_design_unknown_section(capsys, tmp_path, section, hint):
    line = eval_bad(capsys, tmp_path, DESIGN_OK + f"\n[{section}]\ntp = 1\n")
    assert section in line
    assert hint in line


def test_design_top_level_key_is_named_as_a_key(capsys, tmp_path):
    """A space file's ``name = ...`` in a design: a key outside every section, said as one."""
    line = eval_bad(capsys, tmp_path, 'name = "mine"\n' + DESIGN_OK)
    assert "top-level key 'name'" in line and "[name]" not in line
    assert "accelerator" in line                       # the sections a design has


@pytest.mark.parametrize("value", ["-1", "0", "-3.35e12"])
def test_design_bandwidth_not_positive(capsys, tmp_path, value):
    text = DESIGN_OK.replace('id = "h100-sxm"', f'id = "h100-sxm"\nhbm_bw_bytes_per_s = {value}')
    line = eval_bad(capsys, tmp_path, text)
    assert "hbm_bw_bytes_per_s" in line
    assert "positive" in line or "> 0" in line


def test_design_fraction_above_one(capsys, tmp_path):
    line = eval_bad(capsys, tmp_path, DESIGN_OK + "\n[workload]\nprefix_hit_fraction = 1.5\n")
    assert "prefix_hit_fraction" in line and "1.5" in line


def test_design_unknown_weight_dtype(capsys, tmp_path):
    line = eval_bad(capsys, tmp_path, DESIGN_OK.replace('"fp8"', '"fp9"'))
    assert "weight_dtype" in line and "fp9" in line
    assert "fp8" in line


def test_design_wrong_value_type(capsys, tmp_path):
    line = eval_bad(capsys, tmp_path, DESIGN_OK + '\n[workload]\nisl = "long"\n')
    assert "isl" in line and "long" in line


def test_design_malformed_toml(capsys, tmp_path):
    line = eval_bad(capsys, tmp_path, DESIGN_OK + "\n[workload\nisl = \n")
    assert "TOML" in line


def test_design_missing_file(capsys, tmp_path):
    missing = tmp_path / "nope.toml"
    rc, out, err = run_cli(capsys, "eval", missing)
    assert_one_line_error(rc, err, file=missing)
    assert out == ""


@pytest.mark.parametrize("text", [
    '[accelerator]\nid = "h100-sxm"\n\n[model]\nweight_dtype = "fp8"\n',
    '[accelerator]\nid = "h100-sxm"\n',
], ids=["no_model_id", "no_model_section"])
def test_design_missing_model_id(capsys, tmp_path, text):
    line = eval_bad(capsys, tmp_path, text)
    assert "model" in line and "id" in line


@pytest.mark.parametrize("old, new, hint", [
    ('"h100-sxm"', '"h100-sxn"', "h100-sxm"),
    ('"llama-3.1-8b"', '"llama-3.1-8c"', "llama-3.1-8b"),
], ids=["accelerator", "model"])
def test_design_unknown_id(capsys, tmp_path, old, new, hint):
    line = eval_bad(capsys, tmp_path, DESIGN_OK.replace(old, new))
    assert new.strip('"') in line
    assert hint in line


def test_design_malformed_toml_subprocess(tmp_path):
    design = tmp_path / "design.toml"
    design.write_text("[accelerator\nid = h100\n")
    r = run_subprocess("eval", design)
    assert_one_line_error(r.returncode, r.stderr, file=design)
    assert r.stdout == ""


# ---------------------------------------------------------------------------------------------
# catalog


@pytest.mark.parametrize("entry, hint", [("nosuchid", "valid"), ("h100-sxn", "h100-sxm"),
                                         ("llama-3.1-8c", "llama-3.1-8b")])
def test_catalog_show_unknown_id(capsys, entry, hint):
    rc, out, err = run_cli(capsys, "catalog", "show", entry)
    line = assert_one_line_error(rc, err)
    assert entry in line and hint in line
    assert out == ""


def test_catalog_show_unknown_id_subprocess():
    r = run_subprocess("catalog", "show", "nosuchid")
    line = assert_one_line_error(r.returncode, r.stderr)
    assert "nosuchid" in line
    assert r.stdout == ""


def test_catalog_list_unknown_kind(capsys):
    rc, _, err = run_cli(capsys, "catalog", "list", "gpus")
    line = assert_one_line_error(rc, err)
    assert "accelerators" in line
