"""``dse predict`` streams its case file (issue 27, point 3): read, checked, scored and written a
chunk at a time, so peak memory does not grow with the file; a field or a line over the stated
limit (``case_reader.MAX_FIELD_CHARS``: 1 MiB, ``MAX_LINE_CHARS``: 4 MiB) is refused with its row
before it is held; the streamed output is the whole-file output, chunk for chunk."""

from __future__ import annotations

import os
import resource

import pandas as pd
import pytest
from helpers import run_cli

from dse.scoring import case_reader, predict

HEADER = "case_id,model,hardware,num_chips,tp,pp,ep,dp,weight_dtype,isl,osl,concurrency\n"


def _cases(path, n, id_chars=8):
    with open(path, "w") as f:
        f.write(HEADER)
        for i in range(n):
            f.write(f"c{i:0{id_chars}d},llama-3.1-8b,h100-sxm,1,1,1,1,1,fp8,{128 + i % 500},128,8\n")
    return path


def _peak_kb_of_child(fn) -> int:
    """The peak RSS of ``fn()`` run in a forked child (RUSAGE_CHILDREN's maxrss: the largest of
    the children waited for so far, so callers compare successive children)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fn()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss


def test_peak_memory_does_not_grow_with_the_case_file(tmp_path, monkeypatch):
    """Chunks of 2,000 cases: a file of 2,000 cases and one of 60,000 with 300-character case
    ids (~21 MB: the old reader held ~180 MB more for it, every row as Python strings, then all
    the predictions) reach the same peak within 40 MB."""
    monkeypatch.setattr(predict, "CASES_PER_CHUNK", 2000)
    small = _cases(tmp_path / "small.csv", 2000, id_chars=300)
    big = _cases(tmp_path / "big.csv", 60_000, id_chars=300)
    out = str(tmp_path / "p.csv")
    base = _peak_kb_of_child(lambda: predict.predict_file(str(small), out, keep=False))
    peak = _peak_kb_of_child(lambda: predict.predict_file(str(big), out, keep=False))
    mb = os.path.getsize(big) / 1e6
    print(f"peak RSS: {base / 1024:.0f} MiB for 2,000 cases, {peak / 1024:.0f} MiB for 60,000 "
          f"({mb:.0f} MB)")
    assert peak - base < 40 * 1024
    written = pd.read_csv(out)
    assert len(written) == 60_000 and written["case_id"].iloc[-1] == f"c{59_999:0300d}"


def test_a_huge_field_or_line_is_refused_with_its_row(tmp_path, capsys):
    out = tmp_path / "p.csv"
    huge = tmp_path / "field.csv"
    _cases(huge, 3)
    with open(huge, "a") as f:         # row 5: a 2 MiB case id (quoted: one field)
        f.write('"' + "x" * (2 << 20) + '",llama-3.1-8b,h100-sxm,1,1,1,1,1,fp8,128,128,8\n')
    rc, _, err = run_cli(capsys, "predict", huge, "--out", out)
    tried = [f"a 2 MiB field -> exit {rc}: {err}"]
    assert rc == 2 and "row 5" in err and "a field longer than 1,048,576 characters" in err
    with open(huge, "a") as f:         # row 6: a 5 MiB field (past the line limit too)
        f.write("y" * (5 << 20) + ",llama-3.1-8b,h100-sxm,1,1,1,1,1,fp8,128,128,8\n")
    (tmp_path / "field.csv").write_text((tmp_path / "field.csv").read_text().replace(
        '"' + "x" * (2 << 20) + '"', "c9"))
    rc, _, err = run_cli(capsys, "predict", huge, "--out", out)
    tried.append(f"a 5 MiB field -> exit {rc}: {err}")
    assert rc == 2 and "row 6" in err and "a field longer than 1,048,576 characters" in err
    wide = tmp_path / "line.csv"
    _cases(wide, 1)
    with open(wide, "a") as f:         # row 3: 2.5 million short fields (a 5 MB line)
        f.write("a," * 2_500_000 + "\n")
    rc, _, err = run_cli(capsys, "predict", wide, "--out", out)
    tried.append(f"a 5 MB line -> exit {rc}: {err}")
    print("\n".join(tried))
    assert rc == 2 and "row 3" in err and "a line longer than 4,194,304 characters" in err
    assert not out.exists() and not list(tmp_path.glob("*.tmp")) and \
        not list(tmp_path.glob(".dse-predict-*"))


def test_streamed_output_is_the_whole_file_output(tmp_path, monkeypatch):
    """Chunks of 3 cases: every case's predictions are the one-chunk ones; a mechanism's columns
    (a request rate's percentiles and goodput) that only the last chunk uses still head the
    file, blank for the chunks that do not use it. (With one chunk the other cases get them
    too: the scorer computes the queueing figures for a whole batch once one case has a rate;
    the scoring's own chunks of ROWS_PER_CHUNK candidates did the same before the stream.)"""
    rows = [dict(case_id=f"k{i}", model="llama-3.1-8b", hardware="h100-sxm", num_chips="8",
                 weight_dtype="fp8", isl=str(256 + 64 * i), osl="128", tp="", pp="", ep="",
                 dp="", concurrency="" if i % 2 else "32", request_rate_per_s="",
                 ttft_slo_s="", tpot_slo_s="") for i in range(8)]
    rows[7].update(concurrency="", request_rate_per_s="20", ttft_slo_s="2", tpot_slo_s="0.05")
    cases = tmp_path / "c.csv"
    pd.DataFrame(rows).to_csv(cases, index=False)
    whole = predict.predict_file(str(cases), str(tmp_path / "whole.csv"))
    monkeypatch.setattr(predict, "CASES_PER_CHUNK", 3)
    assert len(list(predict.iter_cases(str(cases)))) == 3
    parts = predict.predict_file(str(cases), str(tmp_path / "parts.csv"))
    queue = [c for c in predict.MECHANISM_OUTPUT if c in whole]
    assert "ttft_p90_s" in queue
    base = [c for c in whole.columns if c not in queue]
    pd.testing.assert_frame_equal(parts[base], whole[base])
    pd.testing.assert_frame_equal(parts[queue].iloc[6:], whole[queue].iloc[6:])
    assert parts[queue].iloc[:6].isna().all().all()
    a = pd.read_csv(tmp_path / "whole.csv")
    b = pd.read_csv(tmp_path / "parts.csv")
    print(f"{len(rows)} cases in chunks of 3: columns {list(b.columns) == list(a.columns)}; "
          f"rows equal outside the queueing columns: {b[base].equals(a[base])}")
    assert list(b.columns) == list(a.columns) and b[base].equals(a[base])
    assert b[queue].iloc[6:].equals(a[queue].iloc[6:])


def test_a_duplicate_id_in_a_later_chunk_is_found_with_its_row(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(predict, "CASES_PER_CHUNK", 4)
    cases = _cases(tmp_path / "d.csv", 10)
    with open(cases, "a") as f:
        f.write("c00000002,llama-3.1-8b,h100-sxm,1,1,1,1,1,fp8,128,128,8\n")   # row 12
    rc, _, err = run_cli(capsys, "predict", cases, "--out", tmp_path / "p.csv")
    print(f"case c00000002 again in row 12 -> exit {rc}: {err}")
    assert rc == 2 and "row 12" in err and "duplicate case_id 'c00000002'" in err


@pytest.mark.parametrize("text,words", [
    ("", "the file is empty"),
    (HEADER, "no cases"),
    (HEADER.replace("concurrency", "concurency") + "a,llama-3.1-8b,h100-sxm,1,1,1,1,1,fp8,1,1,8\n",
     "concurency"),
    (HEADER + "a,llama-3.1-8b,h100-sxm,1,1,1,1,1,fp8,1,1,8,extra\n", "row 2 has 13 fields"),
])
def test_first_chunk_checks_keep_their_messages(tmp_path, capsys, text, words):
    cases = tmp_path / "c.csv"
    cases.write_text(text)
    rc, _, err = run_cli(capsys, "predict", cases, "--out", tmp_path / "p.csv")
    print(f"{text[:40]!r}... -> exit {rc}: {err}")
    assert rc == 2 and words in err and len(err.splitlines()) == 1


def test_the_limits_are_the_stated_ones():
    assert (case_reader.MAX_FIELD_CHARS, case_reader.MAX_LINE_CHARS) == (1 << 20, 4 << 20)
