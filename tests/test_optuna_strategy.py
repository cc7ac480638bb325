"""The optuna strategy: batches asked and told, fronts from stored scores, resume after kill -9."""

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
from helpers import API_SPACE, ROOT

from dse import pareto
from dse.build.space import load_space
from dse.cli import main

QUICK = ROOT / "spaces" / "quickstart.toml"


def grid_ids(space, trials) -> np.ndarray:
    from dse.search.optuna.study import grid_index
    g = grid_index(space, trials)
    return np.ravel_multi_index(tuple(g.T), space.shape) if len(g) else np.zeros(0, np.int64)


def stored_front_ids(out, space) -> set:
    files = sorted((out / "scores").glob("batch-*.parquet"))
    allt = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    ok = allt[allt["_admissible"]].drop_duplicates("design_id")
    F = pareto.objective_matrix(ok, space.objectives)
    return set(ok["design_id"][pareto.nondominated(F)]), allt


@pytest.mark.parametrize("sampler", ["nsga2", "tpe", "random", "qmc"])
def test_samplers_run_and_the_front_is_the_pareto_set_of_all_trials(tmp_path, capsys, sampler):
    out = tmp_path / "run"
    n = 96 if sampler == "tpe" else 160
    assert main(["run", str(QUICK), "--strategy", "optuna", "--sampler", sampler, "--trials",
                 str(n), "--population", "32", "--out", str(out), "--quiet"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(out)
    st = json.loads((out / "progress.json").read_text())
    assert st["state"] == "finished" and st["trials_completed"] == n
    ids, allt = stored_front_ids(out, load_space(str(QUICK)))
    assert len(allt) == n and allt["trial"].is_unique
    front = pd.read_csv(out / "front.csv")
    assert set(front["design_id"]) == ids and len(ids) > 0


def test_optuna_finds_most_of_the_exact_front(tmp_path, capsys):
    # the quickstart space has 480 designs: 240 NSGA-II trials (10 generations) come close
    ex, op = tmp_path / "ex", tmp_path / "op"
    main(["run", str(QUICK), "--out", str(ex), "--quiet"])
    main(["run", str(QUICK), "--strategy", "optuna", "--sampler", "nsga2", "--trials", "240",
          "--population", "24",
          "--seed", "1", "--out", str(op), "--quiet"])
    space = load_space(str(QUICK))
    fe, fo = pd.read_csv(ex / "front.csv"), pd.read_csv(op / "front.csv")
    Fe, Fo = pareto.objective_matrix(fe, space.objectives), pareto.objective_matrix(fo, space.objectives)
    ref, scale = pareto.reference(np.vstack([Fe, Fo]))
    assert pareto.hypervolume(Fo, ref, scale) >= 0.95 * pareto.hypervolume(Fe, ref, scale)
    assert pareto.hypervolume(Fo, ref, scale) <= pareto.hypervolume(Fe, ref, scale) * (1 + 1e-6)
    assert set(fo["design_id"]) <= set(range(space.size))   # the same ids as the exhaustive run


def test_resume_after_kill_9_loses_and_duplicates_nothing(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "dse", "run", str(QUICK), "--strategy", "optuna", "--trials",
           "400", "--population", "16", "--sampler", "random", "--out", str(out), "--quiet"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + 60
    while time.time() < deadline and len(list((out / "scores").glob("*.parquet"))) < 4:
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert main(["run", "--resume", str(out), "--quiet", "--trials", "64"]) == 0
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    study = optuna.load_study(study_name=json.loads((out / "manifest.json").read_text())["study_name"],
                              storage=JournalStorage(JournalFileBackend(str(out / "optuna.journal"))))
    states = pd.Series([t.state.name for t in study.trials])
    assert (states != "RUNNING").all()
    ids, allt = stored_front_ids(out, load_space(str(QUICK)))
    assert allt["trial"].is_unique                      # nothing counted twice
    complete = {t.number: t for t in study.trials if t.state.name == "COMPLETE"}
    assert set(allt["trial"]) <= set(complete)          # nothing scored is lost
    # the other complete trials are proposals of designs scored before, told at no cost
    space = load_space(str(QUICK))
    again = [t for n, t in complete.items() if n not in set(allt["trial"])]
    assert {int(i) for i in grid_ids(space, again)} <= set(allt["design_id"])
    assert set(pd.read_csv(out / "front.csv")["design_id"]) == ids


def test_nested_scores_every_layout_under_each_point_and_beats_flat_per_trial(tmp_path, capsys):
    # quickstart: 10 hardware points (chip x dtype), 48 layouts x batch sizes under each
    out = tmp_path / "nested"
    assert main(["run", str(QUICK), "--strategy", "nested", "--sampler", "tpe", "--population", "2",
                 "--trials", "4", "--seed", "0", "--out", str(out), "--quiet"]) == 0
    st = json.loads((out / "progress.json").read_text())
    assert st["trials_completed"] == 4 and st["designs_scored"] == 4 * 48
    space = load_space(str(QUICK))
    ids, allt = stored_front_ids(out, space)
    assert set(pd.read_csv(out / "front.csv")["design_id"]) == ids
    # each trial keeps only its own non-dominated designs
    for _, g in allt[allt["_admissible"]].groupby("trial"):
        F = pareto.objective_matrix(g, space.objectives)
        assert pareto.nondominated(F).all()


def test_nested_reaches_the_exact_front_with_a_fraction_of_the_points(tmp_path, capsys):
    ex, ne = tmp_path / "ex", tmp_path / "ne"
    main(["run", str(QUICK), "--out", str(ex), "--quiet"])
    main(["run", str(QUICK), "--strategy", "nested", "--sampler", "tpe", "--population", "2",
          "--trials", "6", "--seed", "0", "--out", str(ne), "--quiet"])
    space = load_space(str(QUICK))
    Fe = pareto.objective_matrix(pd.read_csv(ex / "front.csv"), space.objectives)
    Fn = pareto.objective_matrix(pd.read_csv(ne / "front.csv"), space.objectives)
    ref, scale = pareto.reference(np.vstack([Fe, Fn]))
    assert pareto.hypervolume(Fn, ref, scale) >= 0.95 * pareto.hypervolume(Fe, ref, scale)


def test_long_runs_rotate_studies_warm_started_from_the_front(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", str(QUICK), "--strategy", "optuna", "--sampler", "nsga2", "--trials", "150",
                 "--population", "16",
                 "--segment-trials", "48", "--out", str(out), "--quiet"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["segment"] >= 2                                   # 150 trials in segments of ~48
    st = json.loads((out / "progress.json").read_text())
    assert st["state"] == "finished" and st["trials_completed"] == 150
    ids, allt = stored_front_ids(out, load_space(str(QUICK)))
    assert len(allt) == 150
    assert set(pd.read_csv(out / "front.csv")["design_id"]) == ids
    files = sorted(p.name for p in (out / "scores").glob("batch-*.parquet"))
    assert any(f.startswith("batch-001-") for f in files)


def test_a_lost_database_connection_is_retried(capsys, monkeypatch):
    import sqlalchemy.exc

    from dse.search.optuna import study as o
    monkeypatch.setattr(o.time, "sleep", lambda s: None)
    monkeypatch.setattr(o, "STORAGE_RETRY_S", 60.0)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("server closed"))
        return "ok"

    assert o.with_retry(flaky) == "ok" and len(calls) == 3
    assert capsys.readouterr().err.count("storage unreachable") == 1   # said once, not per try
    monkeypatch.setattr(o, "STORAGE_RETRY_S", 0.0)                     # the window is spent
    calls.clear()
    with pytest.raises(o.StorageUnavailable):
        o.with_retry(flaky)


def test_nested_local_search_enqueues_untried_grid_neighbours_of_the_front():
    import optuna

    from dse.search.bench import CHIP_SPACE, _space
    from dse.search.optuna.enqueue import enqueue_neighbours
    from dse.search.optuna.strategy import split_parameters
    from dse.search.optuna.study import coords_of, distributions
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = _space(CHIP_SPACE)
    outer, _ = split_parameters(space, True)
    study = optuna.create_study(direction="maximize")
    dists = distributions(space, outer)
    tried = study.ask(dists)
    study.tell(tried, 1.0)
    point = coords_of(space, tried.params, outer)
    coords = np.zeros(len(space.parameters), np.int64)
    coords[outer] = point
    front = pd.DataFrame({"design_id": [int(np.ravel_multi_index(coords, space.shape))],
                          "usd_per_mtok_output": [1.0], "output_tokens_per_s_per_user": [10.0]})
    n = enqueue_neighbours(study, space, outer, front, 50, None, seed=0)
    waiting = [t.system_attrs["fixed_params"] for t in study.get_trials(deepcopy=False)
               if t.state == optuna.trial.TrialState.WAITING]
    assert n == len(waiting) > 0
    # every one differs from the front's point by one grid step in one parameter, none twice
    steps = [sorted(abs(c - p) for c, p in zip(coords_of(space, w, outer), point)) for w in waiting]
    assert all(s[-1] == 1 and sum(s) == 1 for s in steps)
    assert len({tuple(sorted(w.items())) for w in waiting}) == len(waiting)
    # neighbours already tried or enqueued are not enqueued again
    assert enqueue_neighbours(study, space, outer, front, 50, None, seed=1) == 0


def test_short_runs_plan_a_local_search_and_longer_ones_tpe():
    from dse.search.driver import plan
    from dse.search.optuna import strategy as o
    space = load_space(str(QUICK))
    p = plan(space, "optuna", o.SHORT_RUN_TRIALS, None, None, None, None)
    assert p["sampler"] == "random" and p["population"] == 1 and p["local_share"] == 1.0
    assert p["local_after"] == o.SHORT_RUN_START and p["local_model"] == "additive"
    p = plan(space, "optuna", o.SHORT_RUN_TRIALS + 1, None, None, None, None)
    assert "local_model" not in p
    assert p["sampler"] == "tpe" and p["population"] == 2
    # longer runs: TPE, then the same local search on the last POLISH_SHARE of the trials
    assert p["local_share"] == 1.0 and p["local_adjacent"] and p["local_margin"] == 1.0
    assert p["local_diagonal"] and "local_diagonal" not in plan(space, "optuna", 24, None, None,
                                                                None, None)
    n = o.SHORT_RUN_TRIALS + 1
    assert p["local_after"] == n - round(o.POLISH_SHARE * n) and p["polish_share"] == o.POLISH_SHARE
    p = plan(space, "optuna", 400, None, None, None, None)
    assert p["local_after"] == 400 - round(o.POLISH_SHARE * 400)
    # a budget without a trial count has no last share: no polish; nor a sampler given
    assert "local_share" not in plan(space, "optuna", None, 60.0, None, None, None)
    assert "local_share" not in plan(space, "optuna", 400, None, "tpe", None, None)
    assert o.polish(400, 0.0) == {} and o.polish(400, 0.2)["local_after"] == 320
    # a sampler or population given by the user is kept
    assert plan(space, "optuna", 24, None, "nsga2", None, None)["sampler"] == "nsga2"


def test_a_short_run_asks_the_surrogate_for_each_trial_after_its_start(tmp_path, capsys):
    """The first 8 trials are the seed's pairs-covering start; every one after is the additive
    surrogate's proposal from the trials
    scored before it, with the values and constraints the run told Optuna (its trials files)."""
    from dse.search.optuna import surrogate
    out = tmp_path / "r"
    assert main(["run", str(QUICK), "--strategy", "optuna", "--trials", "24", "--seed", "1",
                 "--out", str(out), "--quiet"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["local_share"] == 1.0 and m["local_after"] == 8          # SHORT_RUN_START
    assert m["local_model"] == "additive"
    space = load_space(str(QUICK))
    told = {}
    for f in (out / "scores").glob("batch-*.trials.json"):
        told.update({int(k): v for k, v in json.loads(f.read_text()).items()})
    order = [told[n] for n in sorted(told)]
    assert len(order) == 24 and len({r["key"] for r in order}) == 24
    pos = list(range(len(space.parameters)))
    # the first 8: the pairs-covering start of the run's seed, in its order
    assert m["local_start"] == "pairs"
    from dse.search.optuna.study import is_ordered
    start = surrogate.start_designs(space.shape, [is_ordered(p) for p in space.parameters], 8, 1)
    assert [r["key"] for r in order[:8]] == [int(np.ravel_multi_index(c, space.shape))
                                             for c in start]
    for n in range(m["local_after"], 24):
        before = order[:n]
        want = surrogate.propose(space, pos, [r["key"] for r in before],
                                 [r["values"] for r in before],
                                 [r["constraints"] for r in before], 1, seed=1 + n)
        assert int(np.ravel_multi_index(want[0], space.shape)) == order[n]["key"], n
    st = json.loads(subprocess.run([sys.executable, "-m", "dse", "status", str(out), "--json"],
                                   capture_output=True, text=True, cwd=ROOT).stdout)
    assert sum(st["trials_by_worker"].values()) == st["trials_completed"] == 24


def test_the_progress_bar_says_the_hypervolume_reference_point(tmp_path, capsys):
    from dse.search.driver import run_space
    run_space(load_space(str(QUICK)), tmp_path / "r", strategy="optuna", trials=12, seed=0,
              progress=True)
    err = capsys.readouterr().err
    line = [ln for ln in err.splitlines() if ln.startswith("hv: the front's hypervolume")]
    assert len(line) == 1 and "reference point" in line[0] and "tpot" in line[0].lower()


def test_the_polish_tries_two_step_neighbours_after_the_one_step_ones():
    """``diagonal``: a point's untried one-step neighbours first, then one step along each of two
    parameters (deepseek-racks' missed extreme sits two steps from the found front: its one-step
    neighbours are dominated or inadmissible)."""
    import optuna

    from dse.search.optuna.enqueue import enqueue_neighbours
    from dse.search.optuna.study import distributions
    from dse.search.optuna.study import coords_of
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(str(QUICK))
    outer = list(range(len(space.parameters)))
    shape = np.array(space.shape)
    point = shape // 2                       # inside the grid along every parameter
    front = pd.DataFrame({"design_id": [int(np.ravel_multi_index(point, space.shape))],
                          **{ob.metric: [1.0] for ob in space.objectives}})
    movable = int((shape > 1).sum())
    inner = [int(point[i] > 0) + int(point[i] < shape[i] - 1) for i in range(len(shape))]
    one = sum(inner)
    two = sum(inner[a] * inner[b] for a in range(len(shape)) for b in range(a + 1, len(shape)))
    assert movable >= 2 and two > 0
    study = optuna.create_study(directions=[ob.direction for ob in space.objectives])
    assert enqueue_neighbours(study, space, outer, front, 10_000, None, adjacent=True) == one
    study = optuna.create_study(directions=[ob.direction for ob in space.objectives])
    n = enqueue_neighbours(study, space, outer, front, 10_000, None, adjacent=True, diagonal=True)
    assert n == one + two
    waiting = [np.abs(np.array(coords_of(space, t.system_attrs["fixed_params"], outer)) - point)
               for t in study.get_trials(deepcopy=False)]
    assert all(d.sum() == 1 for d in waiting[:one])               # one-step ones first
    assert all(d.sum() == 2 and d.max() == 1 for d in waiting[one:])
    assert enqueue_neighbours(study, space, outer, front, 10_000, None, adjacent=True,
                              diagonal=True) == 0             # none enqueued twice


SCALED = {**API_SPACE, "name": "interop", "constraints": {"ttft_s": {"max": 0.5}},
          "parameters": {**API_SPACE["parameters"],
                         "accelerator.hbm_bw_bytes_per_s": {"scale": [1.0, 1.5, 2.0]}}}


def test_the_study_holds_names_real_values_and_constraints_as_optuna_tools_read_them(tmp_path):
    """What optuna-dashboard and ``trials_dataframe()`` show of a run: the objectives by metric
    name, parameters by their real values (a scale factor named ``<path>.scale``, never under
    the bytes-per-second field's name), and each trial's constraint values."""
    import optuna

    import dse
    from dse.search.optuna.study import storage_for
    run = dse.run(SCALED, strategy="optuna", sampler="random", population=4, trials=30,
                  out=tmp_path / "run")
    study = optuna.load_study(study_name=run.manifest["study_name"],
                              storage=storage_for(run.path, None))
    assert study.metric_names == ["usd_per_mtok_output", "tpot_s"]
    assert study.user_attrs["constraint_names"] == ["feasible (log HBM need / capacity)",
                                                    "ttft_s<=0.5"]
    assert study.user_attrs["grids"] == {"workload.concurrency[i]": [8, 64, 512]}
    names = {n for t in study.trials for n in t.params}
    assert names == {"accelerator.id", "layout.tp", "workload.concurrency[i]",
                     "accelerator.hbm_bw_bytes_per_s.scale"}
    assert "params_accelerator.hbm_bw_bytes_per_s.scale" in study.trials_dataframe().columns
    scores = run.scores.set_index("design_id")
    space = run.space
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 30            # the run's trials (repeats told back are PRUNED)
    for t in done:
        design = int(grid_ids(space, [t])[0])
        row = scores.loc[design]
        assert t.params["accelerator.id"] == row["accelerator.id"]
        assert t.params["layout.tp"] == row["layout.tp"] and isinstance(t.params["layout.tp"], int)
        assert t.params["accelerator.hbm_bw_bytes_per_s.scale"] == \
            row["accelerator.hbm_bw_bytes_per_s.scale"]
        assert t.user_attrs["workload.concurrency"] == row["workload.concurrency"]
        assert t.values == pytest.approx([row["usd_per_mtok_output"], row["tpot_s"]], rel=1e-6)
        # the memory margin: log(HBM needed / available), <= 0 exactly where the design fits
        fit = np.log(row["hbm_used_fraction"])
        fit = min(fit, 0.0) if row["feasible"] else max(fit, 1e-3)
        want = [fit, (row["ttft_s"] - 0.5) / 0.5]
        assert t.system_attrs["constraints"] == pytest.approx(want, rel=1e-5, abs=1e-6)
    # a run folder from before the ``.scale`` rule (its study names the factor by the path) reads
    # the same design
    from dse.search.optuna.study import coords_of
    legacy = {k.removesuffix(".scale"): v for k, v in done[0].params.items()}
    pos = range(len(space.parameters))
    assert coords_of(space, legacy, pos) == coords_of(space, done[0].params, pos) is not None
    # both sides of the constraint appear, so the check above means something
    assert {c[1] > 0 for c in (t.system_attrs["constraints"] for t in done)} == {True, False}
