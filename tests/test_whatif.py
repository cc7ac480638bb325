"""dse whatif: the front re-scored under overrides, and its sensitivities."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import ROOT

from dse.cli import main

QUICK = ROOT / "spaces" / "quickstart.toml"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("w") / "run"
    assert main(["run", str(QUICK), "--out", str(d), "--quiet"]) == 0
    return d


def test_more_hbm_bandwidth_moves_every_front_design_the_right_way(run, tmp_path, capsys):
    out = tmp_path / "wi"
    assert main(["whatif", str(run), "--scale", "accelerator.hbm_bw_bytes_per_s=1.5",
                 "--out", str(out)]) == 0
    md = (out / "whatif.md").read_text()
    assert "accelerator.hbm_bw_bytes_per_s scale 1.5" in md
    # the page's table has each front design before and after: nothing got slower or costlier
    html = (out / "index.html").read_text()
    assert "TPOT [s] before" in html and "data:image/png;base64" in html   # labelled, with units
    front = pd.read_csv(out / "front.csv")
    assert len(front) > 0 and "design_id" in front
    assert "| accelerator.hbm_bw_bytes_per_s |" in md and "| accelerator.capex_usd |" in md


def test_whatif_numbers_match_a_rescore(run, tmp_path, capsys):
    from dse.build.space import load_space
    from dse.results.whatif import _objective_table
    space = load_space(str(QUICK))
    ids = pd.read_csv(run / "front.csv")["design_id"].to_numpy()
    base = _objective_table(space, ids)
    faster = _objective_table(space, ids, {"accelerator.hbm_bw_bytes_per_s": ("scale", 2.0)})
    assert (faster["tpot_s"] <= base["tpot_s"] * (1 + 1e-12)).all()
    assert (faster["output_tokens_per_s_per_rack"] >= base["output_tokens_per_s_per_rack"]
            * (1 - 1e-12)).all()
    same = _objective_table(space, ids, {"accelerator.capex_usd": ("scale", 1.0)})
    pd.testing.assert_frame_equal(same, base)


@pytest.mark.parametrize("args,needle", [
    (["--scale", "accelerator.hbm_bw_bytes_per_sec=1.5"], "did you mean"),
    (["--set", "accelerator.hbm_bw_bytes_per_s"], "is not PATH=VALUE"),
    (["--scale", "accelerator.hbm_bw_bytes_per_s=fast"], "is not a number"),
    (["--scale", "accelerator.hbm_bw_bytes_per_s=-1"], "must be > 0"),
    ([], "nothing to change"),
    (["--trials", "5", "--scale", "accelerator.tdp_w=2"], "go with --reoptimize"),
])
def test_bad_whatif_input_exits_2(run, capsys, args, needle):
    assert main(["whatif", str(run), *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------------------ --reoptimize

SMALL = (QUICK.read_text()
         .replace('["a100-sxm-80g", "h100-sxm", "h200-sxm", "b200", "mi300x"]',
                  '["h100-sxm", "h200-sxm", "b200"]')
         .replace("{ low = 1, high = 2048, num = 12, log = true }",
                  "{ low = 4, high = 512, num = 8, log = true }"))
HBM = "accelerator.hbm_bw_bytes_per_s"


def _hashes(d):
    return {str(f.relative_to(d)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(d.rglob("*")) if f.is_file() and "whatif" not in f.relative_to(d).parts}


def _F(df, objs=("usd_per_mtok_output", "tpot_s", "output_tokens_per_s_per_rack")):
    return np.column_stack([df[o] * (-1 if o.startswith("output_") else 1) for o in objs])


def _dominated_by(A, B, rtol=1e-6):
    """Every point of B weakly dominated by some point of A (minimisation, float32 slack)."""
    tol = rtol * np.abs(B)
    return (A[:, None, :] <= B[None, :, :] + tol[None]).all(axis=2).any(axis=0).all()


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("reopt")
    sp = root / "small.toml"
    sp.write_text(SMALL)
    d = root / "base"
    assert main(["run", str(sp), "--out", str(d), "--quiet", "--chunk-designs", "64"]) == 0
    # the same space with the change written in by hand: the exact answer
    hand = root / "hand.toml"
    hand.write_text(SMALL.replace("[objectives]", f'"{HBM}" = {{ scale = [1.5] }}\n\n[objectives]'))
    hd = root / "hand"
    assert main(["run", str(hand), "--out", str(hd), "--quiet"]) == 0
    return {"space": sp, "base": d, "hand": hd, "root": root}


def test_reoptimize_exhaustive_gives_the_exact_new_front(small, tmp_path, capsys):
    base = small["base"]
    before = _hashes(base)
    assert main(["whatif", str(base), "--scale", f"{HBM}=1.5", "--reoptimize", "--quiet"]) == 0
    assert _hashes(base) == before                      # the base run is untouched
    out = base / "whatif"
    new = pd.read_csv(out / "front.csv")
    hand = pd.read_csv(small["hand"] / "front.csv")
    # the run's front, and last the KV dtype each design runs (the weights' dtype is swept)
    assert list(new.columns) == list(hand.columns) + ["kv_dtype"]
    assert (new["kv_dtype"] == np.where(new["model.weight_dtype"] == "fp8", "fp8", "bf16")).all()
    new = new.drop(columns="kv_dtype")
    key = ["design_id"]
    pd.testing.assert_frame_equal(new.sort_values(key).reset_index(drop=True),
                                  hand.sort_values(key).reset_index(drop=True))
    # the re-scored old front (whatif without --reoptimize) is covered by the new front
    assert main(["whatif", str(base), "--scale", f"{HBM}=1.5", "--out", str(tmp_path / "r")]) == 0
    old = pd.read_csv(tmp_path / "r" / "front.csv")
    assert _dominated_by(_F(new), _F(old))
    md = (out / "whatif.md").read_text()
    hv = re.search(r"re-scored old front ([0-9.e+-]+), re-optimized front ([0-9.e+-]+)", md)
    assert hv and float(hv.group(2)) >= float(hv.group(1))
    assert "best re-optimized" in md and "exhaustive: the exact new front" in md
    html = (out / "index.html").read_text()
    assert html.count("data:image/png;base64") == 2 and (out / "reoptimized.png").is_file()
    # a normal run folder: its inputs carry the change, status and report work on it
    m = json.loads((out / "run" / "manifest.json").read_text())
    assert m["space_file"].startswith(str((out / "run").resolve()))
    assert "{ scale = [1.5] }" in Path(m["space_file"]).read_text()
    assert main(["status", str(out / "run"), "--json"]) == 0
    st = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert st["state"] == "finished" and st["front_size"] == len(new)
    assert main(["report", str(out / "run"), "--out", str(tmp_path / "rep")]) == 0
    assert main(["compare", str(base), str(out / "run"), "--out", str(tmp_path / "cmp")]) == 0


def test_a_stopped_reoptimized_run_resumes_with_the_change(small, tmp_path, capsys):
    out = tmp_path / "wi"
    assert main(["whatif", str(small["base"]), "--scale", f"{HBM}=1.5", "--reoptimize",
                 "--trials", "1", "--out", str(out), "--quiet"]) == 0
    assert json.loads((out / "run" / "progress.json").read_text())["state"] == "stopped"
    assert main(["run", "--resume", str(out / "run"), "--quiet"]) == 0
    new = pd.read_csv(out / "run" / "front.csv").sort_values("design_id").reset_index(drop=True)
    hand = pd.read_csv(small["hand"] / "front.csv").sort_values("design_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(new, hand)


def test_derived_space_scores_what_the_rescoring_scores(small, tmp_path):
    """Set on a searched parameter, scale of a searched parameter, of a base value and of a
    catalog value (per design: the accelerator id is searched): the derived space file scores
    each old design exactly as Space.batch_from_values(vals, overrides) does."""
    from dse.build.space import load_space
    from dse.results import reoptimize
    from dse.results.whatif import _objective_table, parse_overrides
    space = load_space(str(small["space"]))
    ov = parse_overrides(["layout.tp=4"], ["workload.concurrency=2", "workload.isl=0.5",
                                           "accelerator.peak_flops_per_s=1.3", f"{HBM}=0.8"])
    new, derived = reoptimize.prepare(space, ov, "test", tmp_path)
    assert new.shape[:4] == (3, 2, 1, 8) and new.size == space.size // 4
    assert new.base["workload.isl"] == 1024
    ids = np.arange(0, space.size, 7)
    got = reoptimize.score_ids(new, reoptimize.map_ids(space, new, ids, derived))
    want = _objective_table(space, ids, ov)
    for m in ("usd_per_mtok_output", "tpot_s", "output_tokens_per_s_per_rack"):
        np.testing.assert_allclose(got[m], want[m], rtol=2e-5)
    assert (got["_admissible"].to_numpy() == want["feasible"].to_numpy()).all()


def test_reoptimize_optuna_enqueues_the_old_front(tmp_path, capsys):
    sp = tmp_path / "small.toml"
    sp.write_text(SMALL)
    d = tmp_path / "base"
    assert main(["run", str(sp), "--strategy", "optuna", "--trials", "48", "--population", "16",
                 "--out", str(d), "--quiet"]) == 0
    old = pd.read_csv(d / "front.csv")
    out = tmp_path / "wi"
    assert main(["whatif", str(d), "--scale", f"{HBM}=1.5", "--reoptimize", "--trials", "20",
                 "--out", str(out), "--quiet"]) == 0
    run = out / "run"
    m = json.loads((run / "manifest.json").read_text())
    assert m["strategy"] == "optuna" and m["trials"] == max(20, len(old))
    trials = pd.concat([pd.read_parquet(f) for f in sorted((run / "scores").glob("batch-*.parquet"))])
    # the derived space appends a one-value parameter: old design ids keep their value
    assert set(old["design_id"]) <= set(trials["design_id"])
    new = pd.read_csv(out / "front.csv")
    assert main(["whatif", str(d), "--scale", f"{HBM}=1.5", "--out", str(tmp_path / "r")]) == 0
    assert _dominated_by(_F(new), _F(pd.read_csv(tmp_path / "r" / "front.csv")))
    assert main(["run", "--resume", str(run), "--trials", "16", "--quiet"]) == 0
    assert json.loads((run / "progress.json").read_text())["state"] == "finished"


@pytest.mark.parametrize("case", ["unknown", "nan", "invalid", "running", "corrupt", "front",
                                  "missing", "taken"])
def test_bad_reoptimize_input_exits_2_and_touches_nothing(small, tmp_path, capsys, case):
    import shutil
    d = tmp_path / "base"
    shutil.copytree(small["base"], d, ignore=shutil.ignore_patterns("whatif"))
    args = ["--scale", f"{HBM}=1.5"]
    if case == "unknown":
        args = ["--scale", "accelerator.hbm_bandwidth=1.5"]
    elif case == "nan":
        args = ["--set", f"{HBM}=lots"]
    elif case == "invalid":                     # only the derived space file can tell
        args = ["--scale", "layout.tp=1.5"]
    elif case == "running":               # another process owns the folder (its flock)
        import subprocess
        import sys
        holder = subprocess.Popen(
            [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
             "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)",
             str(d / "lock")], stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "held"
        request_kill = holder.kill
        p = json.loads((d / "progress.json").read_text())
        (d / "progress.json").write_text(json.dumps({**p, "state": "running"}))
    elif case == "corrupt":
        (d / "manifest.json").write_text("{ not json")
    elif case == "front":
        (d / "front.csv").write_text("usd_per_mtok_output,tpot_s\n1,2\n")
    elif case == "missing":
        d = tmp_path / "nope"
    elif case == "taken":
        (tmp_path / "wi" / "run").mkdir(parents=True)
        (tmp_path / "wi" / "run" / "x").write_text("mine")
    before = _hashes(d) if d.exists() else None
    try:
        rc = main(["whatif", str(d), *args, "--reoptimize", "--out", str(tmp_path / "wi"),
                   "--quiet"])
    finally:
        if case == "running":
            request_kill()
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert (_hashes(d) if d.exists() else None) == before
    left = sorted(str(f.relative_to(tmp_path / "wi")) for f in (tmp_path / "wi").rglob("*")) \
        if (tmp_path / "wi").exists() else []
    assert left == (["run", "run/x"] if case == "taken" else [])


# ---------------------------------------------------------------- scaling a blank default

def test_scaling_a_blank_expert_imbalance_scales_the_published_default():
    # issue 11: a blank serving.expert_imbalance is the published routing model of the row's
    # EP size; --scale multiplies that default (it did nothing: NaN x 1.2 stayed blank)
    from dse import catalog
    from dse.build.space import load_space
    from dse.perf import score_chunked
    from dse.perf.imbalance import published_imbalance
    space = load_space(str(ROOT / "spaces" / "questions" / "rack-goodput.toml"))
    ids = np.arange(space.size)
    vals = space.values_at(ids)
    path = "serving.expert_imbalance"
    b0, t0 = space.batch_from_values(vals)
    b1, t1 = space.batch_from_values(vals, {path: ("scale", 1.2)})
    ep = np.broadcast_to(np.asarray(t1["layout.ep"], float), (len(ids),))
    got = np.broadcast_to(np.asarray(t1[path], float), (len(ids),))
    pub = published_imbalance(ep, 256.0, catalog.expert_load_cv())
    moe = ep > 1
    np.testing.assert_allclose(got[moe], 1.2 * pub[moe], rtol=1e-12)
    assert np.isnan(got[~moe]).all()                 # ep = 1: no imbalance between ranks
    assert abs(pub[ep == 8][0] - 1.07) < 0.01         # the field's documented default
    s0, s1 = score_chunked(b0), score_chunked(b1)
    ok = np.isfinite(s0["tpot_s"]) & np.isfinite(s1["tpot_s"])
    assert (s1["tpot_s"][ok & moe] > s0["tpot_s"][ok & moe]).all()    # slower busiest rank
    np.testing.assert_array_equal(s1["tpot_s"][ok & ~moe], s0["tpot_s"][ok & ~moe])
    # the same as setting the scaled default by hand on one EP-8 design
    i = int(np.flatnonzero(ep == 8)[0])
    one = {k: np.asarray(v)[i:i + 1] for k, v in vals.items()}
    by_hand = score_chunked(space.batch_from_values(one, {path: ("set", 1.2 * pub[i])})[0])
    scaled = score_chunked(space.batch_from_values(one, {path: ("scale", 1.2)})[0])
    for m in ("tpot_s", "usd_per_mtok_output", "ttft_s"):
        np.testing.assert_allclose(scaled[m], by_hand[m], rtol=1e-12)


def test_scaling_the_expert_imbalance_of_a_dense_model_is_refused(run, tmp_path, capsys):
    before = _hashes(run)
    rc = main(["whatif", str(run), "--scale", "serving.expert_imbalance=1.2",
               "--out", str(tmp_path / "wi"), "--quiet", "--bands", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "dense" in err and "serving.expert_imbalance" in err and "Traceback" not in err
    assert _hashes(run) == before and not (tmp_path / "wi").exists()


def _one_step(a, b) -> bool:
    d = np.abs(np.asarray(a) - np.asarray(b))
    return int((d > 0).sum()) == 1 and int(d.max()) == 1


@pytest.mark.parametrize("trials,new_trials", [(20, 20), (120, 100)])
def test_reoptimize_keeps_the_base_runs_local_search(tmp_path, capsys, trials, new_trials):
    """A short run (the additive surrogate after 8 pairs-covering designs) and a polished default run
    (TPE, then the last share on the grid-neighbour search) re-optimize with the same search:
    the manifest's local keys carried over (the polish rescaled to the new trials); the new
    run's trials from ``local_after`` on are the surrogate's proposals (short) or grid
    neighbours (one step along one parameter) of designs it scored before them (polished)."""
    from dse.build.space import load_space
    from dse.search.optuna.strategy import POLISH_SHARE
    sp = tmp_path / "small.toml"
    sp.write_text(SMALL)
    d = tmp_path / "base"
    assert main(["run", str(sp), "--strategy", "optuna", "--trials", str(trials),
                 "--out", str(d), "--quiet"]) == 0
    base = json.loads((d / "manifest.json").read_text())
    short = "polish_share" not in base
    assert base["local_share"] == 1.0
    assert base.get("local_model") == "additive" if short else base["local_adjacent"] is True
    out = tmp_path / "wi"
    assert main(["whatif", str(d), "--scale", f"{HBM}=1.5", "--reoptimize", "--trials",
                 str(new_trials), "--out", str(out), "--quiet"]) == 0
    run = out / "run"
    m = json.loads((run / "manifest.json").read_text())
    assert (m["sampler"], m["population"]) == (base["sampler"], base["population"])
    assert m["local_share"] == 1.0
    if short:
        assert m["local_model"] == "additive" and "local_adjacent" not in m
    else:
        assert m["local_adjacent"] is True and m["local_margin"] == 1.0
    if not short:
        assert m["local_after"] == m["trials"] - round(POLISH_SHARE * m["trials"])
    else:
        assert m["local_after"] == base["local_after"] == 8     # SHORT_RUN_START
    space = load_space(str(run / "inputs" / Path(m["space_file"]).name)) \
        if not Path(m["space_file"]).is_file() else load_space(m["space_file"])
    t = pd.concat([pd.read_parquet(f) for f in sorted((run / "scores").glob("batch-*.parquet"))])
    t = t.drop_duplicates("trial").sort_values("trial")
    coords = np.array(np.unravel_index(t["design_id"].to_numpy(np.int64), space.shape)).T
    warm = m["whatif"]["warm_start_trials"]
    late = range(max(m["local_after"], warm), len(coords))
    assert len(late) >= 2
    if short:
        from dse.search.optuna import surrogate
        told = {}
        for f in (run / "scores").glob("batch-*.trials.json"):
            told.update({int(k): v for k, v in json.loads(f.read_text()).items()})
        order = [told[n] for n in sorted(told)]
        pos = list(range(len(space.parameters)))
        def best(n, k=2):        # the surrogate's best k after the first n trials
            want = surrogate.propose(space, pos, [r["key"] for r in order[:n]],
                                     [r["values"] for r in order[:n]],
                                     [r["constraints"] for r in order[:n]], k,
                                     seed=int(m.get("seed", 0)) + n)
            return [int(np.ravel_multi_index(w, space.shape)) for w in want]
        # a trial is the model's pick after the trials before it, or the second of a batch of
        # two asked at once (the first ask after the warm start)
        for n in late:
            assert order[n]["key"] == best(n, 1)[0] or order[n]["key"] in best(n - 1), n
        # nothing was enqueued behind the warm start to come out later as a repeat (the
        # surrogate's picks piled up there and were told as repeats of what was scored since)
        import optuna
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend
        st = JournalStorage(JournalFileBackend(str(run / "optuna.journal")))
        states = collections.Counter(t.state.name for s_ in optuna.get_all_study_summaries(st)
                                     for t in optuna.load_study(study_name=s_.study_name,
                                                                storage=st).trials)
        assert states["PRUNED"] == 0 and states["COMPLETE"] == len(order), states
        return
    near = [any(_one_step(coords[j], coords[i]) for i in range(j)) for j in late]
    assert sum(near) >= len(late) - 1, near


# ---------------------------------------------------------------- speculative decoding what-ifs

DRAFT_SETS = ["--set", "serving.spec_method=draft", "--set", "serving.spec_tokens=2",
              "--set", "serving.spec_draft_model=llama-3.1-8b"]


def test_whatif_sets_a_draft_model_and_matches_evaluating_the_design(run, tmp_path, capsys):
    # issue 11: --set serving.spec_draft_model=<id> crashed (no catalog table for 'serving')
    out = tmp_path / "wi"
    assert main(["whatif", str(run), *DRAFT_SETS, "--out", str(out), "--quiet",
                 "--bands", "0"]) == 0
    front = pd.read_csv(out / "front.csv")
    from dse.scoring.evaluate import evaluate_flat
    base = {"accelerator.id": "h100-sxm", "model.id": "llama-3.1-70b", "workload.isl": 2048,
            "workload.osl": 256, "layout.pp": 1, "layout.ep": 1, "layout.dp": 1}
    space_row = pd.read_csv(run / "front.csv").set_index("design_id")
    moved = []
    for _, r in front.head(3).iterrows():
        p = space_row.loc[int(r["design_id"])]
        flat = {**base, "accelerator.id": p["accelerator.id"],
                "model.weight_dtype": p["model.weight_dtype"], "layout.tp": int(p["layout.tp"]),
                "workload.concurrency": int(p["workload.concurrency"]),
                "serving.spec_method": "draft", "serving.spec_tokens": 2,
                "serving.spec_draft_model": "llama-3.1-8b"}
        m = evaluate_flat(flat)["metrics"]
        np.testing.assert_allclose(r["tpot_s"], m["tpot_s"], rtol=1e-9)
        np.testing.assert_allclose(r["usd_per_mtok_output"], m["usd_per_mtok_output"], rtol=1e-9)
        moved.append(abs(r["tpot_s"] / p["tpot_s"] - 1.0))
    # and it is a change: the run's own TPOTs were without speculation (on one design the
    # draft's cost and the accepted tokens may nearly cancel: B200 tp 1 at 64 sequences, -0.3%)
    assert max(moved) > 0.05, moved


@pytest.mark.parametrize("args,needle", [
    (["--set", "serving.spec_method=draft", "--set", "serving.spec_tokens=2"],
     'serving.spec_method = "draft" with serving.spec_tokens = 2 needs serving.spec_draft_model'),
    (["--set", "serving.spec_tokens=2"], "no MTP module"),
    (["--set", "serving.spec_draft_model=llama-3.1-8bb"], "is not a catalog id"),
])
def test_spec_whatif_that_cannot_run_is_one_line_exit_2(run, tmp_path, capsys, args, needle):
    before = _hashes(run)
    rc = main(["whatif", str(run), *args, "--out", str(tmp_path / "wi"), "--quiet",
               "--bands", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert needle in err and "Traceback" not in err and "internal error" not in err
    assert _hashes(run) == before and not (tmp_path / "wi").exists()


@pytest.fixture(scope="module")
def partial(tmp_path_factory):
    """A partial (60 random trials) quickstart run: its front mixes bf16 and fp8 weights (the
    exact front is all fp8 since the served GEMMs' fixed time is the kernel's)."""
    d = tmp_path_factory.mktemp("p") / "run"
    assert main(["run", str(QUICK), "--strategy", "optuna", "--sampler", "random", "--trials",
                 "60", "--out", str(d), "--quiet"]) == 0
    return d


def test_whatif_states_the_kv_dtype_before_and_after(partial, tmp_path, capsys):
    # the quickstart sweeps bf16 and fp8 weights, its KV dtype blank: it follows the weights
    run = partial
    front = pd.read_csv(run / "front.csv")
    n16 = int((front["model.weight_dtype"] == "bf16").sum())
    assert 0 < n16 < len(front)
    out = tmp_path / "wi"
    assert main(["whatif", str(run), "--set", "model.kv_dtype=fp8", "--out", str(out),
                 "--quiet", "--bands", "0"]) == 0
    md = (out / "whatif.md").read_text()
    n = len(front)
    assert (f"- KV cache element type: bf16 (2 B per element, {n16} of {n} designs), fp8 "
            f"(1 B per element, {n - n16} of {n} designs) before, fp8 (1 B per element) "
            "after") in md, md
    new = pd.read_csv(out / "front.csv")
    assert list(new.columns)[-2:] == ["design_id", "kv_dtype"] and (new["kv_dtype"] == "fp8").all()
    # the bf16-weight designs now hold an fp8 cache: cheaper (more fit), never costlier
    from dse.build.space import load_space
    from dse.results.whatif import _objective_table
    space = load_space(str(QUICK))
    ids = front["design_id"].to_numpy()
    before = _objective_table(space, ids)
    after = _objective_table(space, ids, {"model.kv_dtype": ("set", "fp8")})
    bf16 = (front["model.weight_dtype"] == "bf16").to_numpy()
    assert (after["usd_per_mtok_output"][~bf16] == before["usd_per_mtok_output"][~bf16]).all()
    assert (after["usd_per_mtok_output"][bf16] < before["usd_per_mtok_output"][bf16]).any()
    # a plain rescoring keeps each design's own
    assert main(["whatif", str(run), "--scale", f"{HBM}=1.5", "--out", str(tmp_path / "w2"),
                 "--quiet", "--bands", "0"]) == 0
    same = pd.read_csv(tmp_path / "w2" / "front.csv").merge(front, on="design_id")
    assert (same["kv_dtype"] == np.where(same["model.weight_dtype_x"] == "fp8", "fp8",
                                         "bf16")).all()
    assert "- KV cache element type (unchanged): " in (tmp_path / "w2" / "whatif.md").read_text()


def test_whatif_rate_replaces_each_designs_concurrency_and_says_so(run, tmp_path, capsys):
    out = tmp_path / "wi"
    assert main(["whatif", str(run), "--set", "workload.request_rate_per_s=0.5", "--out",
                 str(out), "--quiet", "--bands", "0"]) == 0
    md = (out / "whatif.md").read_text()
    assert "each design's concurrency follows from the rate" in md
    # the page's numbers are the rate's: the same as evaluating the design with the rate alone
    from dse.build.space import load_space
    from dse.results.whatif import _objective_table
    space = load_space(str(QUICK))
    ids = pd.read_csv(run / "front.csv")["design_id"].to_numpy()
    a = _objective_table(space, ids, {"workload.request_rate_per_s": ("set", 0.5)})
    vals = space.values_at(ids)
    from helpers import one
    for i in (0, len(ids) - 1):
        d = {"accelerator.id": vals["accelerator.id"][i], "model.id": "llama-3.1-70b",
             "model.weight_dtype": vals["model.weight_dtype"][i],
             "layout.tp": int(vals["layout.tp"][i]), "workload.isl": 2048, "workload.osl": 256,
             "workload.request_rate_per_s": 0.5}
        m = one(d)
        # (the rate's concurrency is a root found on float32 times, to ~2e-6: a design's
        # numbers at a rate may move by ~1e-6 with the other designs of its batch)
        assert a["tpot_s"][i] == pytest.approx(m["tpot_s"], rel=1e-5)


def test_a_concurrency_whatif_on_a_rate_run_is_refused(tmp_path, capsys):
    # the designs of a run served at a request rate take their concurrency from it: a
    # --set workload.concurrency would be silently ignored
    sp = tmp_path / "rate.toml"
    sp.write_text(QUICK.read_text().replace('osl = 256', 'osl = 256\nrequest_rate_per_s = 1.0')
                  .replace('"workload.concurrency" = { low = 1, high = 2048, num = 12, log = '
                           'true }', ''))
    d = tmp_path / "run"
    assert main(["run", str(sp), "--out", str(d), "--quiet"]) == 0
    capsys.readouterr()
    rc = main(["whatif", str(d), "--set", "workload.concurrency=64", "--out",
               str(tmp_path / "wi"), "--quiet", "--bands", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "take their concurrency from workload.request_rate_per_s = 1" in err
    # turning the rate off with it is a fixed-concurrency what-if
    assert main(["whatif", str(d), "--set", "workload.request_rate_per_s=0", "--set",
                 "workload.concurrency=64", "--out", str(tmp_path / "wi"), "--quiet",
                 "--bands", "0"]) == 0
