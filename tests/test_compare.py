"""dse compare: hypervolume on one reference point, coverage both ways, union front."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers import ROOT

from dse.cli import main
from dse.results.compare import coverage

QUICK = ROOT / "spaces" / "quickstart.toml"


def test_coverage_of_hand_made_fronts():
    A = np.array([[1.0, 3.0], [2.0, 2.0], [3.0, 1.0]])
    B = np.array([[1.5, 3.5], [2.0, 2.0], [0.5, 4.0]])
    assert coverage(A, B) == pytest.approx(2 / 3)     # (0.5, 4) is not dominated by A
    assert coverage(B, A) == pytest.approx(1 / 3)     # only (2, 2) itself
    assert coverage(A, A) == 1.0


def test_compare_exhaustive_with_a_partial_optuna_run(tmp_path, capsys):
    ex, op = tmp_path / "ex", tmp_path / "op"
    main(["run", str(QUICK), "--out", str(ex), "--quiet"])
    main(["run", str(QUICK), "--strategy", "optuna", "--sampler", "random", "--trials", "60",
          "--out", str(op), "--quiet"])
    capsys.readouterr()
    assert main(["compare", str(ex), str(op), "--out", str(tmp_path / "cmp")]) == 0
    out = tmp_path / "cmp"
    # the terminal names each hypervolume, the reference point they share and the coverage
    printed = capsys.readouterr().out
    hv = next(ln for ln in printed.splitlines() if ln.startswith("hypervolume"))
    assert " A " in hv and ", B " in hv
    ref = next(ln for ln in printed.splitlines() if ln.startswith("reference point: "))
    assert "output cost [$/Mtok]" in ref and "(scale " in ref
    assert "A covers 100.0% of B's front" in printed
    md = (out / "compare.md").read_text()
    assert "hypervolume" in md and "coverage" in md
    union = pd.read_csv(out / "union_front.csv")
    exact = pd.read_csv(ex / "front.csv")
    # the exhaustive front is exact: the union front is made of its designs
    assert len(union) == len(exact) and set(union["run"]) <= {"A", "B"}
    # A covers all of B (B's designs are in the same space) and the page renders offline
    assert "| coverage of the other front (share it weakly dominates) | 1.000 |" in md
    page = (out / "index.html").read_text()
    assert "<script" in page
    assert (out / "fronts.png").read_bytes()[:4] == b"\x89PNG"
    # every objective pair is plotted (the quickstart's three objectives: three pairs, each also
    # a PNG), and the page loads the one shared plotly.js (not inlined) from beside its folder
    assert page.count("Plotly.newPlot") == 3 and "Every objective pair (3)" in page
    assert len(list(out.glob("fronts*.png"))) == 3
    assert "src='../_static/plotly.min.js'" in page and len(page) < 1_000_000
    assert (tmp_path / "_static" / "plotly.min.js").is_file()
    # each front's KV cache element type is stated: the quickstart's KV follows the weights
    # (the exact front is all fp8; the partial random run's mixes both)
    def stated(front):
        n = front["model.weight_dtype"].value_counts()
        return ", ".join(f"{d} ({b} B per element" + (f", {n[d]} of {len(front)} designs)"
                                                      if len(n) > 1 else ")")
                         for d, b in (("bf16", 2), ("fp8", 1)) if d in n)
    partial = pd.read_csv(op / "front.csv")
    assert (partial["model.weight_dtype"] == "bf16").any()
    assert f"KV cache element type on the fronts: A {stated(exact)}; B {stated(partial)}" in md
    assert "KV cache element type on the fronts" in (out / "index.html").read_text()


def test_compare_refuses_runs_with_different_objectives(tmp_path, capsys):
    other = tmp_path / "o.toml"
    other.write_text(QUICK.read_text().replace('tpot_s = "minimize"', 'ttft_s = "minimize"'))
    a, b = tmp_path / "a", tmp_path / "b"
    main(["run", str(QUICK), "--out", str(a), "--quiet"])
    main(["run", str(other), "--out", str(b), "--quiet"])
    capsys.readouterr()
    assert main(["compare", str(a), str(b)]) == 2
    assert "different objectives" in capsys.readouterr().err


def test_union_front_keeps_the_same_parameters_scored_on_another_workload(tmp_path, capsys):
    """Two runs of the same parameters on different workloads: a design of B with A's
    parameters but other values is B's own design (not deduplicated as A's), so the union front
    agrees with the coverage: what B dominates of A leaves the union."""
    other = tmp_path / "b.toml"
    other.write_text(QUICK.read_text().replace("osl = 256", "osl = 512"))
    a, b = tmp_path / "a", tmp_path / "b"
    main(["run", str(QUICK), "--out", str(a), "--quiet"])
    main(["run", str(other), "--out", str(b), "--quiet"])
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "cmp")]) == 0
    union = pd.read_csv(tmp_path / "cmp" / "union_front.csv")
    fa, fb = pd.read_csv(a / "front.csv"), pd.read_csv(b / "front.csv")
    objs = ["usd_per_mtok_output", "tpot_s", "output_tokens_per_s_per_rack"]
    sign = np.array([1.0, 1.0, -1.0])
    FA, FB = fa[objs].to_numpy() * sign, fb[objs].to_numpy() * sign
    dominated = [bool(((FB <= x).all(axis=1) & (FB < x).any(axis=1)).any()) for x in FA]
    assert any(dominated)          # the longer answers dominate part of A's front
    assert (union["run"] == "A").sum() == len(fa) - sum(dominated)
    assert (union["run"] == "B").sum() == len(fb)
