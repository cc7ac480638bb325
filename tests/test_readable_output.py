"""What a reader gets (issue 26): progress as plain lines in a log, scale knobs named by their
path, one shared plotly.js per tree of pages, answer figures at the digits the model resolves,
answer pages that put the question first and name their numbers in words."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest

from dse.build.space import Objective


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_in_a_log_is_plain_lines_every_few_seconds(monkeypatch):
    from dse.search import progress
    log = io.StringIO()                                   # not a terminal
    bar = progress.bar(file=log, total=100, desc="chunks", unit="chunk")
    for _ in range(100):
        bar.set_postfix({"front": 3, "hv": "0.5"}, refresh=False)
        bar.update(1)
    bar.close()
    text = log.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert len(lines) <= 3                               # a fast loop: no line per update
    assert lines[-1].startswith("chunks: 100%") and "100/100" in lines[-1] and "front=3" in lines[-1]
    # the single-line ticker: a line per LOG_INTERVAL_S, the last always
    clock = iter([0.0, 1.0, 2.0, 6.0, 7.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    log = io.StringIO()
    t = progress.Ticker(log)
    for k in range(5):
        t.say(f"sample {k + 1}/5", final=k == 4)
    t.close()
    assert log.getvalue() == "sample 1/5\nsample 4/5\nsample 5/5\n"
    # on a terminal: one line rewritten in place
    tty = _Tty()
    t = progress.Ticker(tty)
    t.say("sample 1/2")
    t.say("sample 2/2", final=True)
    t.close()
    assert tty.getvalue() == "\rsample 1/2\rsample 2/2\n"


def test_terminal_table_names_each_scale_knob_by_its_path():
    from dse.results.terminal import front_lines
    knobs = ["accelerator.hbm_bw_bytes_per_s.scale", "accelerator.peak_flops_per_s.bf16.scale",
             "topology.scaleup_link_bw_bytes_per_s.scale"]
    front = pd.DataFrame({"usd_per_mtok_output": [1.0, 2.0], "tpot_s": [0.05, 0.02],
                          "layout.tp": [4, 8], **{k: [1.0, 1.5] for k in knobs},
                          "design_id": [0, 1]})
    objs = [Objective("usd_per_mtok_output", "minimize"), Objective("tpot_s", "minimize")]
    text = "\n".join(front_lines(front, objs, ["layout.tp", *knobs]))
    assert " scale=" not in text
    for k in knobs:
        assert f" {k}=1.5" in text and f" {k}=1" in text
    assert "tp=8" in text


def test_pages_share_one_plotly_js_beside_their_folders(tmp_path):
    from dse.results import pages
    a, b = tmp_path / "reports" / "one", tmp_path / "reports" / "two"
    for d in (a, b):
        d.mkdir(parents=True)
        (d / "index.html").write_text(pages.plot_page(d, "t", "<h1>t</h1><p>x</p>"))
    shared = tmp_path / "reports" / "_static" / "plotly.min.js"
    from plotly.offline import get_plotlyjs
    assert shared.read_text() == get_plotlyjs()
    stamp = shared.stat().st_mtime_ns
    pages.write_plotly(a)                                  # unchanged: not written again
    assert shared.stat().st_mtime_ns == stamp
    page = (a / "index.html").read_text()
    assert "<script src='../_static/plotly.min.js'" in page and len(page) < 20_000
    assert "plotly.js v" not in page                        # the library is not inlined
    assert page.index("id='plotly-missing'") < page.index("<h1>")   # said at the top if missing
    assert len(list(tmp_path.rglob("plotly.min.js"))) == 1


def test_answer_figures_are_rounded_to_what_the_model_resolves():
    from dse.questions.answer import resolved
    got = resolved({"a": 0.123456789, "b": [62620.31, 1.0e-5 / 3], "id": 9317.0, "n": 7,
                    "inf": float("inf"), "s": "x", "c": {"d": np.float64(14.4812)}})
    assert got == {"a": 0.1235, "b": [62620.0, 3.333e-06], "id": 9317.0, "n": 7,
                   "inf": float("inf"), "s": "x", "c": {"d": 14.48}}
    assert resolved(resolved(0.987654321)) == resolved(0.987654321) == 0.9877


def test_answer_page_puts_the_question_first_and_folds_the_bands():
    from dse.questions.answer import answer_page
    band = {"samples": 8, "seed": 0, "note": "n", "numbers": {"fast.tpot_s": {}}}
    page = answer_page("<html><body><h1>q</h1><div class='summary'>report</div></body></html>",
                       "How fast?", "- **Speed: 3x**", band, "- fast: TPOT [s]: 0.01",
                       ["a.png"])
    assert page.index("<h1>q</h1>") < page.index("<strong>Question.</strong> How fast?") \
        < page.index("<h2>Answer</h2>") < page.index("<details class='bands'><summary>") \
        < page.index("src='a.png'") < page.index("Pareto report") < page.index("report</div>")
    assert "<details class='bands' open" not in page


@pytest.mark.parametrize("key, name", [
    ("fast.usd_per_mtok_output", "fast: output cost [$/Mtok]"),
    ("baseline.output_tokens_per_s_per_rack", "baseline: output tokens per rack [tokens/s]"),
    ("cost_optimum.design_id", "cost optimum: design"),
    ("fast.ttft_s", "fast: TTFT [s]"),
    ("best_domain_chips", "best domain [chips]"),
    ("goodput_requests_per_s_per_rack", "goodput requests per rack [requests/s]"),
    ("usd_per_mtok_at_goodput", "price at goodput [$/Mtok]"),
    ("hop_share_max", "hop share max"),
])
def test_band_lines_name_numbers_in_words_with_units(key, name):
    from dse.questions.sampled import markdown, number_name
    assert number_name(key) == name
    band = {"samples": 4, "seed": 0, "note": "n", "numbers": {
        key: {"nominal": 1.0, "median": 1.1, "lo": 0.9, "hi": 1.3, "words": ""}}}
    md = markdown(band)
    assert f"- {name}: 1; under the samples" in md and f"`{key}`" not in md


def test_predict_rounds_to_4_significant_digits():
    from dse.scoring.predict import csv_frame, round_significant
    x = np.array([0.123456, 123456.7, 1.23456e-7, 0.0, np.nan, -9.87654, 99999.9])
    got = round_significant(x)
    want = [0.1235, 123500.0, 1.235e-7, 0.0, np.nan, -9.877, 100000.0]
    np.testing.assert_array_equal(got, want)
    pred = pd.DataFrame({"case_id": ["a", "b"], "tpot_s": [0.0123456, 0.5],
                         "feasible": [True, False], "reason": ["", "does not fit"],
                         "max_concurrent_sequences": [12.0, 0.0]})
    out = csv_frame(pred)
    assert out["tpot_s"].iloc[0] == 0.01235 and np.isnan(out["tpot_s"].iloc[1])
    assert pred["tpot_s"].iloc[0] == 0.0123456            # the frame itself is untouched


def test_answers_go_to_runs_unless_published():
    from pathlib import Path

    from dse.cli import build_parser
    from dse.questions.answer import answer_dir
    assert answer_dir("fast-mode") == Path("runs") / "answers" / "fast-mode"
    assert answer_dir("fast-mode", publish=True) == Path("reports") / "fast-mode"
    assert answer_dir("fast-mode", "x/y", publish=True) == Path("x/y")
    a = build_parser().parse_args(["answer", "s.toml"])
    assert a.publish is False and a.out is None
    assert build_parser().parse_args(["answer", "s.toml", "--publish"]).publish is True


def test_a_run_in_a_log_prints_progress_lines(tmp_path, monkeypatch):
    import sys

    from dse.search import working
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    with working.Working(tmp_path, True, total=4, desc="chunks", unit="chunk") as w:
        for k in range(4):
            w.update(1, 3 + k, 0.5, reference="reference point x")
    text = log.getvalue()
    assert "\r" not in text and text.endswith("\n")
    assert text.splitlines().count("hv: the front's hypervolume, reference point x") == 1
    assert "4/4" in text.splitlines()[-1] and "front=6" in text.splitlines()[-1]
