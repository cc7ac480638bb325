"""``dse predict`` resolves each distinct design of a case file once (``dse.build.distinct``):
the lengths and the concurrency are written per row, everything else is resolved on the first
row of each distinct combination and gathered, across the file's chunks (``Memo``). These
tests hold the shortcut to the row-by-row path it replaces: the same resolved table, the same
batch, the same predictions, and messages naming the same rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dse.build import distinct
from dse.build.designs import kv_dtype_of, resolve, to_batch
from dse.errors import InputError, RowNames
from dse.scoring import predict
from dse.spec import validate
from dse.spec.csvsafe import spreadsheet_safe

MODELS = ("llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b")
CHIPS = ("h100-sxm", "b200", "mi300x")


def _cases(n: int, seed: int = 0) -> pd.DataFrame:
    """Cases as a CSV gives them (strings, blanks NaN): a few designs, many lengths."""
    rng = np.random.default_rng(seed)
    tp = rng.choice(["1", "2", "8"], n)
    return pd.DataFrame({
        "case_id": [f"c{i}" for i in range(n)], "model": rng.choice(MODELS, n),
        "hardware": rng.choice(CHIPS, n), "num_chips": tp, "tp": tp, "pp": "1", "dp": "1",
        "ep": "1", "weight_dtype": rng.choice(["bf16", "fp8"], n),
        "kv_dtype": pd.Series(rng.choice(["bf16", ""], n)).replace("", np.nan),
        "isl": rng.choice(["128", "1024", "8192"], n), "osl": rng.choice(["128", "1000"], n),
        "concurrency": rng.integers(1, 300, n).astype(str)}, dtype=object)


def _table(cases: pd.DataFrame) -> pd.DataFrame:
    t = predict._design_table(predict._expand_layouts(cases, "cases.csv"))
    t["workload.concurrency"] = pd.to_numeric(t["workload.concurrency"])
    return t.drop(columns=["_case", "case_id"])


def test_distinct_rows_first_seen_order_and_float_bits():
    f = pd.DataFrame({"a": ["x", "y", "x", np.nan, "y", np.nan],
                      "b": [0.0, 1.0, 0.0, 2.0, 1.0, 2.0], "c": [1, 1, 1, 1, 1, 1]})
    first, inverse = distinct.distinct_rows(f)
    assert first.tolist() == [0, 1, 3]
    assert inverse.tolist() == [0, 1, 0, 2, 1, 2]
    g = pd.DataFrame({"b": [0.0, -0.0, 0.0]})            # -0.0 is not 0.0 to a division
    assert distinct.distinct_rows(g)[1].tolist() == [0, 1, 0]
    # a column mixing True with 1 cannot be factorized safely: no shortcut
    assert distinct.distinct_rows(pd.DataFrame({"a": [True, 1, "1"]}, dtype=object)) is None


def test_resolve_batch_is_resolve_then_to_batch():
    t = _table(_cases(400))
    names = [f"row {i + 2}" for i in range(len(t))]
    want = resolve(t, file="cases.csv", row_names=names)
    want_b = to_batch(want)
    memo = distinct.Memo()
    got, got_b = distinct.resolve_batch(t, file="cases.csv", row_names=names, memo=memo)
    assert len(memo.rows) == len(distinct.distinct_rows(
        t.drop(columns=list(distinct.PER_ROW)))[0]) < len(t) / 3
    assert list(got.columns) == list(want.columns)
    for c in want.columns:
        a, b = want[c].to_numpy(), got[c].to_numpy()
        if a.dtype.kind == "f" or b.dtype.kind == "f":
            np.testing.assert_array_equal(a.astype(float), b.astype(float), err_msg=c)
        else:
            assert list(a) == list(b), c
    assert set(got_b.columns) == set(want_b.columns)
    for k in want_b.columns:
        np.testing.assert_array_equal(got_b.columns[k], want_b.columns[k], err_msg=k)


def test_a_later_chunk_reuses_the_memo_and_scores_the_same():
    cases = _cases(600, seed=3)
    whole = predict.predict_frame(cases, file="cases.csv")
    memo = distinct.Memo()
    first = predict.predict_frame(cases.iloc[:300], file="cases.csv", memo=memo)
    held = len(memo.rows)
    second = predict.predict_frame(cases.iloc[300:].reset_index(drop=True), file="cases.csv",
                                   offset=300, memo=memo)
    assert len(memo.rows) - held < held / 2          # the second half adds few designs
    pd.testing.assert_frame_equal(pd.concat([first, second], ignore_index=True), whole)


def test_the_memo_is_emptied_past_its_bound(monkeypatch):
    monkeypatch.setattr(distinct, "MEMO_ROWS", 60)
    memo = distinct.Memo()
    for seed in (5, 6):      # each ~55 distinct designs, most of them shared
        t = _table(_cases(300, seed=seed))
        names = [f"row {i + 2}" for i in range(len(t))]
        got, b = distinct.resolve_batch(t, file="cases.csv", row_names=names, memo=memo)
        want = resolve(t, file="cases.csv", row_names=names)
        assert len(memo.rows) == len(distinct.distinct_rows(
            t.drop(columns=list(distinct.PER_ROW)))[0])    # the second emptied it first
        np.testing.assert_array_equal(b.hbm_bw_bytes_per_s, to_batch(want).hbm_bw_bytes_per_s)
        assert got["accelerator.id"].tolist() == want["accelerator.id"].tolist()


@pytest.mark.parametrize("column,value,words", [
    ("isl", "0", "isl = 0 is not valid"),
    ("osl", "many", "osl = 'many' is not a number"),
])
def test_a_bad_length_on_a_repeated_design_names_its_own_row(column, value, words):
    cases = _cases(50, seed=7)
    cases.loc[:, ["model", "hardware", "num_chips", "tp", "weight_dtype", "kv_dtype"]] = \
        ["llama-3.1-8b", "h100-sxm", "1", "1", "fp8", np.nan]      # one design, 50 rows
    cases.loc[37, column] = value
    with pytest.raises(InputError) as e:
        predict.predict_frame(cases, file="cases.csv")
    assert words in str(e.value) and "row 39 (case_id c37)" in str(e.value)


def test_an_unknown_id_names_the_first_row_that_has_it():
    cases = _cases(80, seed=9)
    cases.loc[[21, 55], "hardware"] = "h100-sxn"
    with pytest.raises(InputError) as e:
        predict.predict_frame(cases, file="cases.csv")
    assert "row 23 (case_id c21)" in str(e.value) and "h100-sxn" in str(e.value)


def test_parse_column_per_distinct_string_is_per_value():
    col = pd.Series(["8", " 8", "", np.nan, "1e3", "inf", "x", "8"] * 3, dtype=object)
    for path in ("workload.isl", "layout.tp"):
        with pytest.raises(InputError) as e:
            validate.parse_column(path, col, names=[f"r{i}" for i in range(len(col))])
        assert "r5" in str(e.value) and "'inf'" in str(e.value)
    ok = pd.Series(["8", " 8", "", np.nan, "1e3", "8"], dtype=object, index=list("abcdef"))
    got = validate.parse_column("workload.isl", ok)
    assert list(got.index) == list("abcdef")
    np.testing.assert_array_equal(got.to_numpy(), [8, 8, np.nan, np.nan, 1000, 8])


def test_row_names_are_made_when_asked():
    made = []
    names = RowNames(3, lambda i: made.append(i) or f"row {i + 2}")
    assert len(names) == 3 and not made
    assert names[2] == "row 4" and made == [2]
    with pytest.raises(IndexError):
        names[3]


def test_kv_dtype_of_per_distinct_pair():
    w = np.array(["fp8", " fp4", "bf16", None, "fp8"], dtype=object)
    kv = np.array(["", np.nan, "fp8 ", "", "bf16"], dtype=object)
    assert kv_dtype_of(w, kv).tolist() == ["fp8", "fp8", "fp8", "bf16", "bf16"]
    assert kv_dtype_of("fp8", kv).tolist() == ["fp8", "fp8", "fp8", "fp8", "bf16"]


def test_spreadsheet_safe_only_touches_formula_cells():
    f = pd.DataFrame({"a": ["=SUM(A1)", "-1", "-1x", "@x", "c0", np.nan, "+2.5", "\tx"],
                      "b": [1, 2, 3, 4, 5, 6, 7, 8],
                      "c": pd.Series(["x", "=1+1", None, "y", "-", "+", "1", "2"], dtype="str")})
    out = spreadsheet_safe(f)
    assert out["a"].tolist()[:5] == ["'=SUM(A1)", "-1", "'-1x", "'@x", "c0"]
    assert out["a"].tolist()[6:] == ["+2.5", "'\tx"]
    assert out["c"].tolist()[:2] == ["x", "'=1+1"] and out["c"].tolist()[4:6] == ["'-", "'+"]
    assert out["b"].tolist() == f["b"].tolist()
    plain = pd.DataFrame({"id": [f"c{i}" for i in range(1000)], "bound": "memory"})
    assert spreadsheet_safe(plain) is plain


def test_memo_keys_tell_a_blank_from_any_string():
    keys = distinct._keys(pd.DataFrame({
        "a": pd.Series(["x", np.nan, "<blank>", None, "nan"], dtype=object),
        "b": [1.0, np.nan, 1.0, np.nan, 1.0]}))
    assert keys[1] == keys[3]                  # NaN and None: one blank, as in a chunk
    assert len({keys[0], keys[1], keys[2], keys[4]}) == 4


def test_to_numeric_per_distinct_string_is_pandas():
    for values in (["8", "16", "8"], ["8", None, "2.5"], ["1", "x", ""], ["-4", "1e3", "8"]):
        col = pd.Series(values * 4, dtype=object, index=range(10, 10 + 4 * len(values)))
        want = pd.to_numeric(col, errors="coerce")
        got = validate.to_numeric(col, errors="coerce")
        assert got.dtype == want.dtype and got.index.equals(want.index)
        np.testing.assert_array_equal(got.to_numpy(), want.to_numpy())
    with pytest.raises(ValueError):
        validate.to_numeric(pd.Series(["8", "x"], dtype=object))
