"""Spaces, the exhaustive strategy and run folders: exact fronts, resume, status, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
from helpers import ROOT, SMALL_SPACE, brute_front

from dse.build.space import load_space
from dse.cli import main

QUICK = ROOT / "spaces" / "quickstart.toml"

SPACE = SMALL_SPACE


def write(tmp_path, text, name="space.toml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_validate_prints_parameters_and_size(capsys):
    assert main(["validate", str(QUICK)]) == 0
    out = capsys.readouterr().out
    assert "size: 480 designs" in out and "layout.tp: 4 values" in out


def test_scale_parameter_multiplies_the_base_value(tmp_path):
    space = load_space(write(tmp_path, SPACE))
    assert space.size == 3 * 3 * 10 * 2
    b, table = space.batch(np.array([0, 1]))
    assert b.hbm_bw_bytes_per_s[1] == pytest.approx(1.5 * b.hbm_bw_bytes_per_s[0])


def test_exhaustive_front_is_the_exact_pareto_set(tmp_path, capsys):
    path = write(tmp_path, SPACE)
    out = tmp_path / "run"
    assert main(["run", path, "--out", str(out), "--quiet", "--chunk-designs", "37"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(out)
    front = pd.read_csv(out / "front.csv")
    assert set(front["design_id"]) == brute_front(load_space(path))
    assert list(front.columns) == ["usd_per_mtok_output", "tpot_s", "accelerator.id", "layout.tp",
                                   "workload.concurrency", "accelerator.hbm_bw_bytes_per_s.scale",
                                   "design_id"]
    assert (front["ttft_s"] if "ttft_s" in front else pd.Series([0])).le(2.0).all()


def test_status_json_follows_the_contract(tmp_path, capsys):
    out = tmp_path / "run"
    main(["run", str(QUICK), "--out", str(out), "--quiet"])
    capsys.readouterr()
    assert main(["status", str(out), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["state"] == "finished" and st["designs_scored"] == 480
    assert st["trials_failed"] == 0 and st["front_size"] > 0 and st["elapsed_s"] >= 0
    assert st["objectives"][0] == {"name": "usd_per_mtok_output", "direction": "minimize"}
    front = pd.read_csv(out / "front.csv")
    assert [o["name"] for o in st["objectives"]] == list(front.columns[:3])


def test_resume_continues_without_losing_or_recounting(tmp_path, capsys):
    path = write(tmp_path, SPACE)
    out = tmp_path / "run"
    main(["run", path, "--out", str(out), "--quiet", "--chunk-designs", "20", "--trials", "3"])
    st = json.loads((out / "progress.json").read_text())
    assert st["state"] == "stopped" and st["designs_scored"] == 60
    main(["run", "--resume", str(out), "--quiet", "--trials", "2"])
    main(["run", "--resume", str(out), "--quiet"])
    capsys.readouterr()
    main(["status", str(out), "--json"])
    st = json.loads(capsys.readouterr().out)
    space = load_space(path)
    assert st["state"] == "finished" and st["designs_scored"] == space.size
    assert st["trials_completed"] == -(-space.size // 20)
    assert set(pd.read_csv(out / "front.csv")["design_id"]) == brute_front(space)


def test_kill_9_at_any_moment_loses_nothing(tmp_path):
    bigger = SPACE.replace('num = 10', 'num = 200')
    path = write(tmp_path, bigger)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "dse", "run", path, "--out", str(out), "--quiet",
           "--chunk-designs", "50"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + 60
    while time.time() < deadline and len(list((out / "scores").glob("*.parquet"))) < 3:
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert main(["status", str(out), "--json"]) == 0      # a killed run reads as stopped
    assert json.loads((out / "progress.json").read_text())["state"] in ("running", "stopped",
                                                                        "finished")
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    space = load_space(path)
    prog = json.loads((out / "progress.json").read_text())
    assert prog["state"] == "finished" and prog["designs_scored"] == space.size
    assert not list((out / "scores").glob("*.tmp"))
    assert set(pd.read_csv(out / "front.csv")["design_id"]) == brute_front(space)


@pytest.mark.parametrize("text,needle", [
    (SPACE.replace('"layout.tp"', '"layout.tpp"'), "did you mean 'layout.tp'"),
    (SPACE.replace('"layout.tp" = [1, 2, 4]', '"layout.tp" = []'), "empty list"),
    (SPACE.replace('tpot_s = "minimize"', 'tpot = "minimize"'), "unknown metric 'tpot'"),
    (SPACE.replace('tpot_s = "minimize"', 'tpot_s = "smallest"'), "unknown direction"),
    (SPACE.replace('"h200-sxm"', '"h200-sxn"'), "unknown accelerator id 'h200-sxn'"),
    (SPACE.replace("[constraints]", "[constraint]"), "unknown key 'constraint'"),
    (SPACE.replace("{ max = 2.0 }", '"fast"'), "is not a bound"),
    (SPACE.replace("low = 1, high = 512", "low = 512, high = 1"), "is empty"),
])
def test_bad_space_files_exit_2_with_one_line(tmp_path, capsys, text, needle):
    path = write(tmp_path, text)
    assert main(["validate", path]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1 and path in err


def test_a_constraint_no_design_meets_gives_an_empty_front_and_says_so(tmp_path, capsys):
    path = write(tmp_path, SPACE.replace("{ max = 2.0 }", "{ max = 1e-9 }"))
    assert main(["run", path, "--out", str(tmp_path / "r"), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "no scored design is feasible" in captured.err
    assert len(pd.read_csv(tmp_path / "r" / "front.csv")) == 0


def test_corrupt_or_foreign_run_folders_exit_2(tmp_path, capsys):
    assert main(["status", str(tmp_path / "nope")]) == 2
    d = tmp_path / "bad"
    d.mkdir()
    (d / "manifest.json").write_text("{not json")
    assert main(["status", str(d)]) == 2
    assert main(["run", "--resume", str(d)]) == 2
    out = tmp_path / "run"
    main(["run", str(QUICK), "--out", str(out), "--quiet"])
    m = json.loads((out / "manifest.json").read_text())
    m["dse_version"] = "9.9.0"
    (out / "manifest.json").write_text(json.dumps(m))
    before = (out / "front.csv").read_text()
    assert main(["run", "--resume", str(out)]) == 2
    assert "made by dse 9.9.0" in capsys.readouterr().err
    assert (out / "front.csv").read_text() == before
    assert main(["run", str(QUICK), "--out", str(out)]) == 2   # never overwrite a run


def test_budget_stops_cleanly(tmp_path, capsys):
    path = write(tmp_path, SPACE.replace('num = 10', 'num = 200'))
    out = tmp_path / "run"
    assert main(["run", path, "--out", str(out), "--quiet", "--chunk-designs", "10",
                 "--budget", "0s"]) == 0
    assert json.loads((out / "progress.json").read_text())["state"] == "stopped"
    assert main(["run", path, "--budget", "soon"]) == 2


@pytest.mark.parametrize("name", ["quickstart", "deepseek-racks", "hypothetical-accelerator",
                                  "moe-codesign", "dense-70b-nodes"])
def test_compact_batches_score_exactly_like_full_ones(name):
    # a space's batch keeps the columns shared by all its designs at length 1
    space = load_space(str(ROOT / "spaces" / f"{name}.toml"))
    idx = np.random.default_rng(0).choice(space.size, size=min(space.size, 3000), replace=False)
    b, _ = space.batch(np.sort(idx))
    full = b.expanded()
    assert any(len(v) == 1 for v in b.columns.values()) and len(b) == len(idx)
    from dse.perf import score
    a, f = score(b), score(full)
    for k in a:
        assert a[k].shape == (len(idx),)
        np.testing.assert_allclose(a[k], f[k], rtol=1e-12, equal_nan=True, err_msg=k)
