"""dse report: a page (with one shared plotly.js beside its folder), figures, the front and a summary from a run folder."""

from __future__ import annotations

import re
import shutil
import subprocess

import pandas as pd
import pytest
from helpers import ROOT

from dse.cli import main

QUICK = ROOT / "spaces" / "quickstart.toml"


def test_report_of_the_quickstart_run(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["run", str(QUICK), "--out", str(run), "--quiet"]) == 0
    assert main(["report", str(run)]) == 0
    out = run / "report"
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(out)
    front = pd.read_csv(out / "front.csv")
    assert front.equals(pd.read_csv(run / "front.csv"))
    page = (out / "index.html").read_text()
    assert "<script" in page and "plotly" in page.lower()          # interactive
    assert "src=\"http" not in page and "src='http" not in page     # nothing fetched: opens offline
    # plotly.js is not inlined: one shared copy beside the report's folder, loaded relatively;
    # the figures are the PNG files beside the page, by name
    shared = run / "_static" / "plotly.min.js"
    assert "<script src='../_static/plotly.min.js'" in page and shared.stat().st_size > 3e6
    assert len(page) < 1_000_000 and "base64" not in page
    assert "src='front.png'" in page
    # a page copied alone says which file it misses and how to get it
    assert "id='plotly-missing'" in page and "Copy that file along with the page" in page
    assert page.count("<tr>") >= len(front)                       # the front's table
    assert "decode bound" in page and "TTFT prefill step" in page  # per-design breakdown
    summary = (out / "summary.md").read_text()
    assert "Knee design" in summary and f"Pareto front: {len(front)} designs" in summary
    for png in ("front.png", "pair-usd_per_mtok_output-tpot_s.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_of_an_empty_front_and_bad_folders(tmp_path, capsys):
    text = QUICK.read_text().replace("{ max = 5.0 }", "{ max = 1e-9 }")
    space = tmp_path / "s.toml"
    space.write_text(text)
    run = tmp_path / "run"
    main(["run", str(space), "--out", str(run), "--quiet"])
    assert main(["report", str(run), "--out", str(tmp_path / "rep")]) == 0
    assert "front is empty" in (tmp_path / "rep" / "summary.md").read_text()
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "run folder not found" in capsys.readouterr().err


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _chromium(page, profile, *extra) -> subprocess.Popen:
    """Headless Chromium on ``page`` (a profile folder of its own: several run at once)."""
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--enable-unsafe-swiftshader", f"--user-data-dir={profile}",
             "--enable-logging=stderr", "--v=0", "--virtual-time-budget=8000",
             "--window-size=1280,1600"]      # a laptop's page width: every table fits in it
    return subprocess.Popen([CHROMIUM, *flags, *extra, page.as_uri()], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.skipif(not CHROMIUM, reason="no chromium (.ci/run installs Debian's)")
def test_report_renders_in_headless_chromium(tmp_path, capsys):
    run = tmp_path / "run"
    main(["run", str(QUICK), "--out", str(run), "--quiet"])
    main(["report", str(run)])
    page = run / "report" / "index.html"
    main(["compare", str(run), str(run), "--out", str(tmp_path / "cmp")])
    main(["whatif", str(run), "--scale", "accelerator.hbm_bw_bytes_per_s=1.5", "--out",
          str(tmp_path / "wi")])
    alone = tmp_path / "alone" / "report"
    alone.mkdir(parents=True)
    shutil.copy(page, alone / "index.html")
    shot = run / "report" / "screenshot.png"
    # every page at once (each load is seconds of plotly in software GL), then checked in turn
    pages = {"report": page, "cmp": tmp_path / "cmp" / "index.html",
             "wi": tmp_path / "wi" / "index.html", "alone": alone / "index.html"}
    procs = {k: _chromium(p, tmp_path / f"profile-{k}", "--dump-dom") for k, p in pages.items()}
    procs["shot"] = _chromium(page, tmp_path / "profile-shot", f"--screenshot={shot}")
    try:
        done = {k: (p, *p.communicate(timeout=180)) for k, p in procs.items()}
    finally:                             # (a page past its time: no browser left running)
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()

    p, out, err = done["report"]
    assert p.returncode == 0, err[-2000:]
    console = [line for line in err.splitlines() if "CONSOLE" in line]
    errors = [line for line in console if "Uncaught" in line or ":ERROR:CONSOLE" in line
              or "Error:" in line]
    assert not errors, "\n".join(errors)
    front = pd.read_csv(run / "front.csv")
    # plotly drew one marker per front design (plus the knee's star)
    assert out.count('class="point"') >= len(front) > 0
    _check_rendered(out)
    # compare and whatif pages: the same checks
    for k in ("cmp", "wi"):
        d, d_out, d_err = done[k]
        assert d.returncode == 0, d_err[-2000:]
        _check_rendered(d_out, plots=k == "cmp")
    # the note on a missing plotly.js stays hidden while the shared copy loads, and shows on a
    # page copied alone
    assert re.search(r'id="plotly-missing"[^>]*style="display:\s*none', out)
    assert re.search(r'id="plotly-missing"[^>]*style="display:\s*block', done["alone"][1])
    r = done["shot"][0]
    assert r.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _check_rendered(dom: str, plots: bool = True) -> None:
    """What a reader sees: the layout check ran and found no table wider than the page, no
    literal Markdown marker in the text, and every plot axis title carries a unit."""
    assert 'data-layout-checked="1"' in dom
    assert "overflows" not in re.sub(r"<(script|style)\b.*?</\1>", "", dom, flags=re.DOTALL)
    text = re.sub(r"<(script|style|svg)\b.*?</\1>", "", dom, flags=re.DOTALL)
    text = re.sub(r"<[^>]+>", " ", text)
    for marker in ("**", "## ", "`", "|---"):
        assert marker not in text, f"literal {marker!r} in the rendered page"
    if plots:
        titles = re.findall(r'class="[xy]title"[^>]*>(.*?)</text>', dom)
        assert titles, "no axis titles drawn"
        for t in titles:
            assert re.search(r"\[[^\]]+\]", t), f"axis title without a unit: {t!r}"


def test_report_states_the_kv_dtype_of_the_front_and_the_knee(tmp_path, capsys):
    # issue 11: the KV cache's element type is stated, not left to follow the weights silently
    from dse.build.space import load_space
    from dse.pareto import knee
    run = tmp_path / "run"
    assert main(["run", str(QUICK), "--out", str(run), "--quiet"]) == 0
    assert main(["report", str(run)]) == 0
    summary = (run / "report" / "summary.md").read_text()
    front = pd.read_csv(run / "front.csv")
    n, n16 = len(front), int((front["model.weight_dtype"] == "bf16").sum())
    kinds = [f"bf16 (2 B per element, {n16} of {n} designs)" if n16 else "",
             f"fp8 (1 B per element, {n - n16} of {n} designs)" if n16 < n else ""]
    if n16 in (0, n):
        kinds = ["bf16 (2 B per element)" if n16 else "fp8 (1 B per element)"]
    assert "- KV cache element type on the front: " + ", ".join(k for k in kinds if k) in summary
    space = load_space(str(QUICK))
    row = front.iloc[knee(front, space.objectives)]
    b = 2.0 if row["model.weight_dtype"] == "bf16" else 1.0
    # Llama 3.1 70B: 80 layers x 8 KV heads x 128 x (K and V) elements per token
    per_token = 80 * 8 * 128 * 2 * b
    assert (f"- KV cache: {row['model.weight_dtype']} ({b:g} B per element), "
            f"{per_token / 1e3:,.1f} kB per token") in summary
