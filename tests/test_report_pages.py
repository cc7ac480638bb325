"""Pages people read and numbers with one meaning: the Markdown rendering, labels with units
from one place, the decode bound from op-time shares, "per rack" as whole instances, the
terminal's front table and status table, compare's warning when runs serve different workloads."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from helpers import ROOT

from dse.cli import main
from dse.perf import METRICS, bound_shares, decode_bound, op_bound, score
from dse.perf.serve import instances_per_rack
from dse.results.pages import markdown_html
from dse.spec.fields import METRIC_INFO, label

QUICK = ROOT / "spaces" / "quickstart.toml"


def _text(h: str) -> str:
    return re.sub(r"<[^>]+>", "", h)


def test_markdown_subset_renders_without_literal_markers():
    md = ("# Title\n\nA **bold** claim with `code` and *emphasis*.\n\n- one\n  - nested **x**\n"
          "- two\n\n| a | b |\n|---|---|\n| **1** | 2 |\n\n## Section\n\n1. first\n2. second\n")
    h = markdown_html(md)
    assert "<h1>Title</h1>" in h and "<h2>Section</h2>" in h
    assert "<strong>bold</strong>" in h and "<code>code</code>" in h and "<em>emphasis</em>" in h
    assert h.count("<ul>") == 2 and h.count("<ol>") == 1 and h.count("<li>") == 5
    assert "<th>a</th>" in h and "<td><strong>1</strong></td>" in h
    for marker in ("**", "##", "`", "|---"):
        assert marker not in _text(h), marker
    # HTML in the text is escaped, a product like 2*3*4 is not emphasis
    assert "&lt;b&gt;" in markdown_html("<b>") and "<em>" not in markdown_html("2*3*4 chips")


def test_every_metric_has_a_name_and_labels_carry_units():
    assert set(METRICS) <= set(METRIC_INFO)
    assert label("tpot_s") == "TPOT [s]"
    assert label("usd_per_mtok_output") == "output cost [$/Mtok]"
    assert label("layout.tp") == "layout.tp [chips]"          # a field: from the registry


def test_decode_bound_is_the_largest_share_of_op_time():
    # one compute-bound op of 10 ms (memory 9) and one memory-bound op of 3 ms: the summed
    # memory time (12) exceeds the summed compute time (10), but 77% of the op time is
    # compute-bound: the step is compute-bound
    c = np.array([[10.0], [0.0]])
    m = np.array([[9.0], [3.0]])
    n = np.zeros((2, 1))
    cls = op_bound(c, m, n)
    assert cls[:, 0].tolist() == [0, 1]
    shares = (np.array([10.0]), np.array([3.0]), np.array([0.0]))
    zero = np.zeros(1, np.int64)
    assert decode_bound(shares, zero, np.ones(1), np.full(1, 100.0), np.full(1, 512.0))[0] == 0
    shares = (np.array([3.0]), np.array([10.0]), np.array([0.0]))
    assert decode_bound(shares, zero, np.ones(1), np.full(1, 100.0), np.full(1, 512.0))[0] == 1
    # the batch fills the HBM and the step is not compute-bound: capacity
    assert decode_bound(shares, zero, np.full(1, 99.0), np.full(1, 100.0),
                        np.full(1, 512.0))[0] == 3


def test_scored_bound_agrees_with_the_breakdown_shares():
    from dse.build.space import load_space
    space = load_space(str(QUICK))
    ids = np.arange(0, space.size, 7, dtype=np.int64)
    b, _ = space.batch(ids)
    m, steps = score(b.expanded(), breakdown=True)
    plain = score(b.expanded())
    sh = np.vstack(bound_shares(steps.decode))
    roof = op_bound(sh[0], sh[1], sh[2])
    ok = (m["bound"] != 3) & m["feasible"]
    assert ok.sum() > 20
    assert (m["bound"][ok] == roof[ok]).all()
    assert (plain["bound"] == m["bound"]).all()              # the fast path agrees


def test_per_rack_counts_whole_instances():
    assert instances_per_rack(np.array([8.0, 16.0, 72.0, 144.0, 3.0]), 72.0).tolist() == \
        [9.0, 4.0, 1.0, 0.5, 24.0]
    from dse.build.space import load_space
    space = load_space(str(QUICK))
    b, _ = space.batch(np.arange(space.size, dtype=np.int64))
    s = score(b.expanded())
    rack = np.asarray(np.broadcast_to(b.expanded().rack_chips, (space.size,)), float)
    whole = np.floor(rack / s["num_chips"])
    ok = s["feasible"] & (whole >= 1)
    assert np.allclose(s["output_tokens_per_s_per_rack"][ok],
                       (s["output_tokens_per_s_per_instance"] * whole)[ok], rtol=1e-12)
    assert np.allclose(s["instances_per_rack"][ok], whole[ok])


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("pages") / "run"
    assert main(["run", str(QUICK), "--out", str(d), "--quiet"]) == 0
    return d


def test_run_ends_with_a_ranked_front_table_and_status_is_a_table(quick_run, tmp_path, capsys):
    d = tmp_path / "again"
    assert main(["run", str(QUICK), "--out", str(d), "--quiet"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == str(d)
    table = "\n".join(out[1:-1])
    assert "output cost [$/Mtok]" in table and "TPOT [s]" in table and "knee" in table
    front = pd.read_csv(d / "front.csv")
    best = front["usd_per_mtok_output"].min()
    row = next(line for line in out if "best output cost" in line)
    assert f"{best:.4g}" in row
    # the KV cache's element type each listed design runs: a blank one follows the weights
    assert out[1].rstrip().endswith("KV cache")
    rows = [line for line in out if "weight_dtype=" in line]
    assert rows and all(line.split()[-1] == ("fp8" if "weight_dtype=fp8" in line else "bf16")
                        for line in rows)
    assert main(["status", str(d)]) == 0
    st = capsys.readouterr().out
    assert "hypervolume" in st and "reference point" in st and "TPOT [s]" in st
    assert re.search(r"designs scored\s+480 of a space of 480", st)


def test_report_pages_show_units_the_cloud_and_best_per_accelerator(quick_run):
    assert main(["report", str(quick_run), "--out", str(quick_run / "rep")]) == 0
    o = quick_run / "rep"
    page = (o / "index.html").read_text()
    summary = (o / "summary.md").read_text()
    # the page's text (scripts aside: plotly.js is loaded in the head, the plots' data inline)
    assert "<pre>" not in page and "**" not in _text(re.sub(r"<script\b.*?</script>", "", page,
                                                             flags=re.DOTALL))
    assert "Best per accelerator" in page and "other designs" in page
    # the best per accelerator: the space has 480 designs, re-scored whole: the exact best
    from dse.build.space import load_space
    space = load_space(str(QUICK))
    b, _ = space.batch(np.arange(space.size, dtype=np.int64))
    s = score(b.expanded())
    ok = s["feasible"] & (s["ttft_s"] <= 5.0)
    acc = space.values_at(np.arange(space.size))["accelerator.id"]
    best_h100 = s["usd_per_mtok_output"][ok & (acc == "h100-sxm")].min()
    line = next(ln for ln in summary.splitlines() if ln.startswith("| h100-sxm |"))
    assert f"{best_h100:.4g}" in line
    assert "decode bound:" in summary and "of the decode step's op time" in summary
    assert "reference point" in summary


def test_compare_warns_when_the_workloads_differ(quick_run, tmp_path, capsys):
    other = tmp_path / "q.toml"
    other.write_text(QUICK.read_text().replace("isl = 2048", "isl = 4096"))
    b = tmp_path / "b"
    main(["run", str(other), "--out", str(b), "--quiet"])
    capsys.readouterr()
    assert main(["compare", str(quick_run), str(b), "--out", str(tmp_path / "cmp")]) == 0
    err = capsys.readouterr().err
    assert "warning" in err and "workload.isl 2048 vs 4096" in err
    page = (tmp_path / "cmp" / "index.html").read_text()
    assert "class='warning'" in page and "workload.isl 2048 vs 4096" in page
    assert "reference point" in (tmp_path / "cmp" / "compare.md").read_text()
    # the same workload: no warning
    assert main(["compare", str(quick_run), str(quick_run), "--out", str(tmp_path / "c2")]) == 0
    assert "warning" not in capsys.readouterr().err


def test_trial_counts_add_up_when_workers_overshoot():
    from dse.results.terminal import completed_words
    assert completed_words({"trials_completed": 180, "trials_total": 200}, "trials") == "180 of 200"
    words = completed_words({"trials_completed": 232, "trials_total": 200}, "trials")
    assert words.startswith("232 (the target 200 and 32 more")


def test_plain_terminal_text_has_no_markdown_markers():
    from dse.results.pages import plain
    md = ("# What if: quickstart\n\n- TPOT [s]: median change **-6.7%** (`--bands 0`), *not* "
          "2*3*4\n## Uncertainty bands\n```\ncode\n```\nsee [the page](index.html) "
          "![f](front.png)\n| a | b |\n|---|---|")
    assert plain(md).splitlines() == [
        "What if: quickstart", "", "- TPOT [s]: median change -6.7% (--bands 0), not 2*3*4",
        "Uncertainty bands", "code", "see the page (index.html) front.png", "| a | b |",
        "|---|---|"]
    assert plain("a `**literal**` code span") == "a **literal** code span"   # code is literal


def test_every_png_is_saved_at_print_resolution(tmp_path):
    import struct

    from dse.questions.common import pyplot, save
    from dse.questions.context import Context
    from dse.results import pages
    # every savefig of the pages and the questions passes the one constant
    calls = [(f, ln) for f in (ROOT / "dse").rglob("*.py") for ln in f.read_text().splitlines()
             if ".savefig(" in ln]
    assert len(calls) >= 5
    for f, ln in calls:
        assert "dpi=pages.PNG_DPI" in ln or "dpi=PNG_DPI" in ln, (f, ln)
    # ... and is rewritten as a palette PNG right after (the published reports' PNGs stay small)
    for f in {f for f, _ in calls}:
        assert f.read_text().count("compact_png(") >= f.read_text().count(".savefig("), f
    assert not [f for f in (ROOT / "dse").rglob("*.py") if "dpi=110" in f.read_text()]
    # a question's figure: its inches at PNG_DPI pixels
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot([0, 1], [0, 1])
    ctx = Context(None, tmp_path, tmp_path, {}, pd.DataFrame())
    name = save(fig, ctx, "f.png")
    w, h = struct.unpack(">II", (tmp_path / name).read_bytes()[16:24])
    assert pages.PNG_DPI == 200 and (w, h) == (1400, 900)
    from PIL import Image
    with Image.open(tmp_path / name) as im:
        assert im.mode == "P" and im.size == (1400, 900)            # 256-colour palette
