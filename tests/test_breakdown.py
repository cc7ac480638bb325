"""The per-op table of FLOPs, bytes moved and network bytes: what ``dse eval`` prints,
``dse.evaluate(...).breakdown`` returns and a run keeps of its front for the report.

Hand-worked case: Llama 3.1 70B (80 layers, hidden 8192, MLP 28672 gated, GQA 64/8 heads of
128, vocab 128256) in FP8 on 4 x H100 (tp = 4), 64 sequences decoding.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers import ROOT

import dse
from dse.cli import main
from dse.scoring import breakdown
from dse.search import store

DESIGN = ROOT / "examples" / "llama70b-h100.toml"
QUICK = ROOT / "spaces" / "quickstart.toml"
L, D, F, V, TP, B = 80, 8192, 28672, 128256, 4, 64
MLP_PARAMS = 3 * D * F                       # gated: gate, up, down
ATTN_PARAMS = D * (64 * 128) + 2 * D * (8 * 128) + (64 * 128) * D     # q, k, v, o


def _row(table, step, op):
    r = table[(table["step"] == step) & (table["op"] == op)]
    assert len(r) == 1, (step, op)
    return r.iloc[0]


def test_evaluate_returns_the_work_of_each_op():
    ev = dse.evaluate(str(DESIGN))
    t = ev.breakdown
    assert list(t.columns) == ["step", "op", "compute_s", "memory_s", "network_s", "time_s",
                               "flops", "hbm_bytes", "net_bytes", "bound"]
    mlp = _row(t, "decode", "mlp_dense")
    # 2 FLOPs per multiply-add, the tp-sharded weights, one token per sequence
    assert mlp["flops"] == pytest.approx(2 * MLP_PARAMS * L / TP * B, rel=1e-9)
    assert mlp["hbm_bytes"] == pytest.approx(MLP_PARAMS * L / TP * 1.0, rel=1e-9)   # fp8: 1 B
    # the tp all-reduce of the MLP output: 2 (g - 1) / g of the tokens' bf16 activations
    assert mlp["net_bytes"] == pytest.approx(2 * (TP - 1) / TP * B * D * 2 * L, rel=1e-9)
    proj = _row(t, "decode", "attn_proj")
    assert proj["flops"] == pytest.approx(2 * ATTN_PARAMS * L / TP * B, rel=1e-9)
    head = _row(t, "decode", "logits")
    assert head["flops"] == pytest.approx(2 * V * D / TP * B, rel=1e-9)
    # the times stay the per-op table's: compute time >= the work at the chip's fp8 peak
    peak = 1979e12
    assert (t["compute_s"] >= t["flops"] / peak * 0.999).all()
    assert set(t["step"]) == {"decode", "mixed", "prefill"}


def test_dse_eval_prints_the_work_columns(capsys):
    assert main(["eval", str(DESIGN)]) == 0
    out = capsys.readouterr().out
    assert "GFLOP" in out and "HBM MB" in out and "net MB" in out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("mlp_dense"))
    assert f"{2 * MLP_PARAMS * L / TP * B / 1e9:.4g}" in line          # 1804 GFLOP
    assert main(["eval", str(DESIGN), "--json"]) == 0


def test_long_and_wide_agree():
    ev = dse.evaluate(str(DESIGN))
    w = breakdown.of_batch(_batch())
    long = breakdown.long(w)
    for q in breakdown.QUANTITIES:
        got = long[long["op"] != "overhead"].set_index(["step", "op"])[q]
        want = ev.breakdown[ev.breakdown["op"] != "overhead"].set_index(["step", "op"])[q]
        assert np.allclose(got.loc[want.index].to_numpy(), want.to_numpy(), rtol=1e-12)


def _batch():
    from dse.build.designs import resolve, to_batch
    return to_batch(resolve(pd.DataFrame([{
        "accelerator.id": "h100-sxm", "model.id": "llama-3.1-70b", "model.weight_dtype": "fp8",
        "layout.tp": 4, "workload.isl": 2048, "workload.osl": 256,
        "workload.concurrency": 64}])))


def test_a_run_keeps_its_fronts_breakdown_and_the_report_reads_it(tmp_path, monkeypatch):
    run = tmp_path / "run"
    assert main(["run", str(QUICK), "--out", str(run), "--quiet"]) == 0
    kept = store.read_breakdown(run)
    front = store.read_front(run)
    assert sorted(kept["design_id"]) == sorted(front["design_id"])
    assert {"decode.mlp_dense.flops", "mixed.attn_core.hbm_bytes", "decode.attn_proj.net_bytes",
            "kv_dtype", "bound"} <= set(kept.columns)
    # what it keeps is what the model gives for those designs now
    space = store.space_of(run)
    again = breakdown.of_designs(space, kept["design_id"].to_numpy())
    pd.testing.assert_frame_equal(kept.reset_index(drop=True), again, rtol=1e-12)
    # the report reads it: no design is scored again for its breakdown
    from dse.results import report

    def refuse(*a, **k):
        raise AssertionError("the report re-scored the front for its breakdown")
    monkeypatch.setattr(report.breakdown, "of_designs", refuse)
    ids = front["design_id"].to_numpy(np.int64)[:3]
    bds, source = report.breakdowns(run, space, ids)
    assert source == "kept by the run" and sorted(bds) == sorted(ids.tolist())
    assert main(["report", str(run)]) == 0
    assert "work [GFLOP]" in (run / "report" / "index.html").read_text()
    # without it (an interrupted run, an old run folder) the report scores them itself
    monkeypatch.undo()
    store.breakdown_file(run).unlink()
    bds2, source2 = report.breakdowns(run, space, ids)
    assert source2 == "scored for this report"
    assert bds2[int(ids[0])]["phases"] == bds[int(ids[0])]["phases"]
