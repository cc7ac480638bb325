"""The contract every search strategy keeps, one suite run against each (exhaustive, optuna,
nested, exhaustive shards of a shared study on SQLite, and optuna runs that rotate their study
into segments; shards on PostgreSQL too when DSE_TEST_POSTGRES_URL is set): resume after kill -9,
the budget, the trials, several workers, and the front equal to the Pareto set of everything
scored."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
from helpers import ROOT

from dse import pareto
from dse.build.space import load_space
from dse.cli import main
from dse.search import store
from dse.search.bench import CHIP_SPACE

DENSE = ROOT / "spaces" / "dense-70b-nodes.toml"
QUICK = ROOT / "spaces" / "quickstart.toml"

# strategy -> (space file or text, run arguments of a run that takes a few seconds)
RUNS = {
    "exhaustive": (DENSE, ["--strategy", "exhaustive", "--chunk-designs", "64"]),
    "optuna": (QUICK, ["--strategy", "optuna", "--sampler", "random", "--population", "8",
                       "--trials", "240"]),
    "nested": (CHIP_SPACE, ["--strategy", "nested", "--sampler", "tpe", "--population", "2",
                            "--trials", "40"]),
    # the space's 15 chunks as trials of a shared study (SQLite: no server), pulled one by one
    "shards": (QUICK, ["--strategy", "exhaustive", "--chunk-designs", "32", "--storage", "{db}"]),
    # an optuna run whose study is capped at 24 trials: segments 0, 1, ... warm-started in turn
    "segments": (QUICK, ["--strategy", "optuna", "--sampler", "random", "--population", "8",
                         "--segment-trials", "24", "--trials", "120"]),
}
STRATEGIES = list(RUNS)
CHUNKED = ("exhaustive", "shards")        # chunk score tables; the others: batches of trials


def run_args(tmp_path, strategy) -> list[str]:
    """The strategy's run arguments, its shared storage (if any) in the test's folder."""
    db = f"sqlite:///{tmp_path / 'study.db'}"
    return [a.replace("{db}", db) for a in RUNS[strategy][1]]


@pytest.fixture(autouse=True)
def _short_grace(monkeypatch):
    """A chunk a killed process left running is failed and retried once its heartbeat is
    3 s stale here (10 s in use): the resume does not wait out the grace period."""
    from dse.search.optuna import segments, study
    monkeypatch.setattr(segments, "GRACE_S", 3)
    monkeypatch.setattr(study, "GRACE_S", 3)


def assert_rotated(d, segments_at_least=1):
    """The run's study was rotated: later segments hold score tables of their own."""
    m = json.loads((d / "manifest.json").read_text())
    assert m["segment"] >= segments_at_least
    batches = {f.name.split("-")[1] for f in (d / "scores").glob("batch-*.trials.json")}
    assert {f"{k:03d}" for k in range(segments_at_least + 1)} <= batches


def space_file(tmp_path, strategy) -> str:
    src, _ = RUNS[strategy]
    if isinstance(src, str):
        p = tmp_path / "space.toml"
        p.write_text(src)
        return str(p)
    return str(src)


def stored(d):
    """Every stored score table row, with the trial (batch) or chunk it came from."""
    frames = []
    for f in sorted((d / "scores").glob("*.parquet")):
        if f.name.startswith("batch-") and not f.with_suffix(".trials.json").is_file():
            continue
        t = pd.read_parquet(f)
        t["_file"] = f.name
        t["_segment"] = int(f.stem.split("-")[1]) if f.name.startswith("batch-") else 0
        frames.append(t)
    return pd.concat(frames, ignore_index=True)


def assert_front_is_the_pareto_set_of_everything_scored(d, space):
    allt = stored(d)
    ok = allt[allt["_admissible"].astype(bool)] if "_admissible" in allt else allt
    ok = ok.drop_duplicates("design_id")
    want = set(ok["design_id"][pareto.nondominated(pareto.objective_matrix(ok, space.objectives))])
    got = set(pd.read_csv(d / "front.csv")["design_id"])
    assert got == want and got


def assert_nothing_counted_twice(d, strategy):
    allt = stored(d)
    st = store.status(d)
    if strategy in CHUNKED:
        assert allt["design_id"].is_unique
        n = json.loads((d / "manifest.json").read_text())["chunk_designs"]
        assert st["trials_completed"] == len(list((d / "scores").glob("chunk-*.parquet")))
        assert st["designs_scored"] <= st["trials_completed"] * n
    else:
        trials = allt[["_segment", "trial"]].drop_duplicates()
        per = allt.groupby(["_segment", "trial"])["_file"].nunique()
        assert (per == 1).all()                        # a trial is stored in one batch only
        if strategy != "nested":
            assert len(trials) == len(allt)            # one design per trial
        assert st["trials_completed"] == sum(
            len(json.loads(f.read_text())) for f in (d / "scores").glob("batch-*.trials.json"))
    return st


def dse_cmd(*args):
    return [sys.executable, "-m", "dse", *map(str, args)]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_resume_after_kill_9_loses_and_counts_nothing_twice(tmp_path, strategy):
    path, out = space_file(tmp_path, strategy), tmp_path / "run"
    p = subprocess.Popen(dse_cmd("run", path, *run_args(tmp_path, strategy), "--out", out,
                                 "--quiet"),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + 120
    while time.time() < deadline and len(list((out / "scores").glob("*.parquet"))) < 3:
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert store.status(out)["state"] in ("stopped", "finished")      # killed: not "running"
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    st = assert_nothing_counted_twice(out, strategy)
    assert st["state"] == "finished"
    space = load_space(path)
    if strategy in CHUNKED:
        assert st["designs_scored"] == space.size
        assert st["trials_completed"] == -(-space.size // int(run_args(tmp_path, strategy)[3]))
    else:
        assert st["trials_completed"] == int(RUNS[strategy][1][-1])
    if strategy == "segments":
        assert_rotated(out, 4)                        # 120 trials in segments of <= 24
    assert_front_is_the_pareto_set_of_everything_scored(out, space)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_trials_asked_are_done_exactly(tmp_path, capsys, strategy):
    path, out = space_file(tmp_path, strategy), tmp_path / "run"
    args = run_args(tmp_path, strategy)
    want = 5 if strategy in CHUNKED else int(args[-1]) // 4
    if strategy not in CHUNKED:
        args[-1] = str(want)
    assert main(["run", path, *args, "--out", str(out), "--quiet"]
                + (["--trials", str(want)] if strategy in CHUNKED else [])) == 0
    st = assert_nothing_counted_twice(out, strategy)
    assert st["trials_completed"] == want
    assert st["state"] == ("stopped" if strategy in CHUNKED else "finished")
    if strategy == "segments":
        assert_rotated(out)                           # 30 trials: a second segment
    assert_front_is_the_pareto_set_of_everything_scored(out, load_space(path))
    more = 3
    assert main(["run", "--resume", str(out), "--trials", str(more), "--quiet"]) == 0
    assert store.status(out)["trials_completed"] == (want + more if strategy in CHUNKED
                                                    else want)   # optuna: the run's total


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_budget_is_honoured(tmp_path, capsys, strategy):
    path, out = space_file(tmp_path, strategy), tmp_path / "run"
    args = run_args(tmp_path, strategy)
    before = 0.0
    if strategy not in CHUNKED:
        args = args[:-2]                       # no --trials: the budget bounds the run
    elif strategy == "exhaustive":             # 660 chunks of 8: seconds even on a fast machine
        args[args.index("--chunk-designs") + 1] = "8"
    else:
        # shards: 110 chunks of 48 (each a few storage round trips: seconds even on a fast
        # machine); the run enqueues them all first, so the budget goes to a resume
        path = str(DENSE)
        args[args.index("--chunk-designs") + 1] = "48"
        assert main(["run", path, *args, "--trials", "1", "--out", str(out), "--quiet"]) == 0
        before = store.status(out)["elapsed_s"]
    if before:
        assert main(["run", "--resume", str(out), "--budget", "1.5s", "--quiet"]) == 0
    else:
        assert main(["run", path, *args, "--budget", "1.5s", "--out", str(out), "--quiet"]) == 0
    st = assert_nothing_counted_twice(out, strategy)
    assert int(bool(before)) < st["trials_completed"] and st["state"] == "stopped"
    spent = st["elapsed_s"] - before
    assert 1.5 <= spent < 1.5 + 3.0                   # at most one work item past the budget
    m = json.loads((out / "manifest.json").read_text())
    if strategy not in CHUNKED:            # a budget and no trials: until the space is spent
        space = load_space(path)
        from dse.search.driver import points
        assert m["trials"] == points(space, "nested" if strategy == "nested" else "optuna")
    assert_front_is_the_pareto_set_of_everything_scored(out, load_space(path))


@pytest.mark.parametrize("strategy", ["optuna", "nested", "segments"])
def test_several_workers_share_one_run(tmp_path, capsys, strategy):
    path, out = space_file(tmp_path, strategy), tmp_path / "run"
    args = RUNS[strategy][1]
    assert main(["run", path, *args, "--workers", "2", "--out", str(out), "--quiet"]) == 0
    st = assert_nothing_counted_twice(out, strategy)
    total, population = int(args[-1]), int(args[args.index("--population") + 1])
    # the trials are counted and asked under the run's claim lock: exactly the total
    assert st["trials_completed"] == total, (st, population)
    assert st["state"] == "finished"
    # every trial is recorded with the process that scored it: the counts add up to the total
    by = st["trials_by_worker"]
    assert 1 <= len(by) <= 2 and sum(by.values()) == st["trials_completed"]
    assert all(n > 0 for n in by.values())
    capsys.readouterr()
    assert main(["status", str(out)]) == 0
    row = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("trials by worker")]
    assert row and f"(sum {st['trials_completed']:,} = trials completed)" in row[0]
    assert_front_is_the_pareto_set_of_everything_scored(out, load_space(path))


@pytest.mark.skipif(not os.environ.get("DSE_TEST_POSTGRES_URL"), reason="needs PostgreSQL")
def test_shards_front_and_counts_with_workers(tmp_path, capsys, database):
    out = tmp_path / "run"
    assert main(["run", str(QUICK), "--strategy", "exhaustive", "--chunk-designs", "16",
                 "--storage", database, "--workers", "2", "--out", str(out), "--quiet"]) == 0
    st = store.status(out)
    assert st["state"] == "finished" and st["trials_completed"] == 30
    assert_front_is_the_pareto_set_of_everything_scored(out, load_space(str(QUICK)))


@pytest.mark.skipif(not os.environ.get("DSE_TEST_POSTGRES_URL"), reason="needs PostgreSQL")
def test_a_chunk_completed_out_of_id_order_is_counted(database):
    """Optuna's trial cache reads only trials numbered above the last finished one it saw: a
    trial another process created whose commit lands after a later one finished (PostgreSQL,
    two processes creating trials at once) is never read by it. A sharded run's stop decision
    and its final count read the database itself (``fresh_trials``), so a chunk completed so
    is neither lost from the count ("stopped: 464 of 480") nor asked again."""
    import optuna
    import sqlalchemy
    from optuna.trial import TrialState

    from dse.search import shards
    raw = optuna.storages.RDBStorage(database)
    study = optuna.create_study(study_name="s", storage=raw)
    eng = sqlalchemy.create_engine(database)

    def next_id(k):
        with eng.begin() as c:
            c.execute(sqlalchemy.text(
                f"SELECT setval(pg_get_serial_sequence('trials', 'trial_id'), {k})"))

    def complete(chunk):
        study.enqueue_trial({"chunk": chunk})
        tid = shards._pop_waiting(raw, study)
        t = optuna.Trial(study, tid)
        t.set_user_attr("front", {"design_id": [], "values": {}})
        raw.set_trial_state_values(tid, TrialState.COMPLETE, [1.0])
        return tid

    complete(0)
    next_id(10)
    late = optuna.load_study(study_name="s", storage=raw)     # another process's cached view
    complete(2)                                              # trial id 11, finished
    assert sorted(shards.completed_chunks(late)) == [0, 2]   # its cache has read past id 11
    next_id(5)
    hidden = complete(1)                                     # trial id 6: committed "late"
    eng.dispose()
    print(f"chunk 1 completed as trial id {hidden}; the cached view sees "
          f"{sorted(shards.completed_chunks(late))}")
    assert hidden < 11 and sorted(shards.completed_chunks(late)) == [0, 2]   # Optuna's hole
    fresh = shards.fresh_trials(raw, "s", (TrialState.COMPLETE,))
    assert sorted(shards.completed_chunks(fresh)) == [0, 1, 2]
    assert shards._missing(raw, late, 3) == [] and shards._missing(raw, late, 4) == [3]


def test_shards_on_sqlite_share_the_chunks_between_workers(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", str(QUICK), *run_args(tmp_path, "shards"), "--workers", "2",
                 "--out", str(out), "--quiet"]) == 0
    st = assert_nothing_counted_twice(out, "shards")
    assert st["state"] == "finished" and st["trials_completed"] == 15
    assert st["designs_scored"] == 480
    # every chunk once in the storage, each told complete by the run or its worker
    import optuna
    study = optuna.load_study(study_name=out.name, storage=run_args(tmp_path, "shards")[-1])
    from dse.search.shards import completed_chunks
    assert sorted(completed_chunks(study)) == list(range(15))
    assert_front_is_the_pareto_set_of_everything_scored(out, load_space(str(QUICK)))


def test_a_design_already_scored_is_never_scored_again(tmp_path, capsys):
    # 400 trials of the random sampler on 480 designs: it proposes hundreds of repeats
    out = tmp_path / "run"
    assert main(["run", str(QUICK), "--strategy", "optuna", "--sampler", "random", "--population",
                 "16", "--trials", "400", "--out", str(out), "--quiet"]) == 0
    allt = stored(out)
    assert len(allt) == 400 and allt["design_id"].is_unique
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    study = optuna.load_study(study_name=out.name, storage=JournalStorage(
        JournalFileBackend(str(out / "optuna.journal"))))
    # every counter reads the run's 400: the run's summary, `dse status` (and its per-worker
    # split), and the storage's COMPLETE trials (what optuna-dashboard counts); the repeats,
    # told at no cost, are PRUNED there with the stored values as a user attr
    from optuna.trial import TrialState
    capsys.readouterr()
    assert main(["status", str(out), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["trials_completed"] == 400 and sum(st["trials_by_worker"].values()) == 400
    assert json.loads((out / "progress.json").read_text())["trials_completed"] == 400
    states = [t.state for t in study.trials]
    assert states.count(TrialState.COMPLETE) == 400
    repeats = [t for t in study.trials if t.state == TrialState.PRUNED]
    assert len(repeats) > 100 and len(repeats) + 400 == len(study.trials)
    scored = {tuple(sorted(t.params.items())): t.values for t in study.trials
              if t.state == TrialState.COMPLETE}
    for t in repeats:       # each a design scored before, its values those the run stored
        assert t.user_attrs["repeat_values"] == pytest.approx(
            scored[tuple(sorted(t.params.items()))], rel=1e-12)
    print(f"400 trials, {len(repeats)} repeats told PRUNED; status, progress, storage: 400")
    # Optuna's view: metric names, real parameter values, constraints where samplers read them
    assert study.metric_names == ["usd_per_mtok_output", "tpot_s", "output_tokens_per_s_per_rack"]
    t = study.trials[0]
    space = load_space(str(QUICK))
    chips = next(p.values for p in space.parameters if p.path == "accelerator.id")
    assert t.params["accelerator.id"] in chips and isinstance(t.params["accelerator.id"], str)
    grids = study.user_attrs.get("grids", {})          # unequal steps: by position, values kept
    assert set(grids) == {"layout.tp[i]", "workload.concurrency[i]"}
    # ... and each trial's real values beside the positions (what optuna-dashboard lists), on
    # scored trials and on repeats told back alike
    for t in study.trials:
        for name, values in grids.items():
            assert t.user_attrs[name[:-3]] == values[t.params[name]]
    assert grids["layout.tp[i]"] == [1, 2, 4, 8]
    assert isinstance(t.system_attrs["constraints"], list)
    assert study.user_attrs["constraint_names"][0].startswith("feasible")
    assert len(t.system_attrs["constraints"]) == len(study.user_attrs["constraint_names"])


def test_trials_that_cover_the_space_enumerate_it(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", str(QUICK), "--strategy", "optuna", "--trials", "480", "--out", str(out),
                 "--quiet"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["strategy"] == "exhaustive" and "cover" in m["enumerated"]
    from helpers import brute_front
    assert set(pd.read_csv(out / "front.csv")["design_id"]) == brute_front(load_space(str(QUICK)))


def test_dashboard_without_optuna_dashboard_is_one_line_and_exit_2(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", str(QUICK), "--strategy", "optuna", "--trials", "16", "--population",
                 "8", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    try:
        import optuna_dashboard  # noqa: F401
        pytest.skip("optuna-dashboard is installed")
    except ImportError:
        pass
    assert main(["dashboard", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "optuna-dashboard" in err[0] and "pip install" in err[0]


def test_with_a_budget_the_progress_bar_follows_the_budget(tmp_path, capsys):
    from dse.search.driver import run_space
    d = run_space(str(DENSE), tmp_path / "run", strategy="optuna", sampler="random",
                  population=8, budget_s=2.0, progress=True)
    err = capsys.readouterr().err
    assert "/2 [" in err and "done=" in err          # seconds of the budget, trials as a figure
    assert json.loads((d / "manifest.json").read_text())["trials"] == 5280   # the space: no cap


def test_a_shards_worker_pops_a_chunk_its_study_cache_has_not_seen(tmp_path):
    # the flaky `KeyError: 6`: a worker pops a waiting chunk by trial id; when nothing was
    # running, its study's trial cache had never read that trial and `suggest_int` raised.
    # SQLite storage (no server): the run scores one chunk, a worker joins and does the rest.
    from dse.search.driver import run_space
    url = f"sqlite:///{tmp_path / 'study.db'}"
    d = run_space(QUICK, tmp_path / "run", strategy="exhaustive", storage=url, trials=1,
                  chunk_designs=160, progress=False)
    assert store.status(d)["trials_completed"] == 1
    run_space(run_dir=d, join=True, storage_url=url, progress=False)
    st = store.status(d)
    assert st["state"] == "finished" and st["trials_completed"] == 3
    assert st["designs_scored"] == 480
    assert_front_is_the_pareto_set_of_everything_scored(d, load_space(str(QUICK)))
