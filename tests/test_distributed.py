"""Several `dse worker` processes on one PostgreSQL study: every trial done once, none lost.

Needs a PostgreSQL server: `.ci/run` installs and starts one and sets DSE_TEST_POSTGRES_URL
(an admin URL such as postgresql+psycopg2://dse:dse@127.0.0.1/postgres); skipped otherwise.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
from helpers import ROOT

URL = os.environ.get("DSE_TEST_POSTGRES_URL")
pytestmark = pytest.mark.skipif(not URL, reason="DSE_TEST_POSTGRES_URL not set (no PostgreSQL)")
QUICK = ROOT / "spaces" / "quickstart.toml"


def _wait_until(done, timeout_s: float = 60, poll_s: float = 0.1) -> None:
    """Poll ``done()`` until it is true or ``timeout_s`` passes."""
    deadline = time.time() + timeout_s
    while time.time() < deadline and not done():
        time.sleep(poll_s)


def _dse(*args, **kw):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "dse", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, **kw)


def _kill_while_telling(worker, database, study_name, stored) -> list[int]:
    """SIGKILL ``worker`` in the middle of its work, for certain (a kill at a moment only
    guessed may land between two batches, or after the worker's last): the trial_values table
    is locked (every process's tell waits on it, its trials RUNNING), and once the worker has
    stored a batch whose trials are still RUNNING in the database (``stored(running)``: those of
    the RUNNING trials its folder shows scored) it is killed, its tell pending; the lock is let
    go. Called as the workers start: none told anything yet, so none stops for want of work.
    Meanwhile the RUNNING trials' heartbeats are kept (a process stops its heartbeat thread as
    it tells: waiting longer than the grace period, its trials would be failed as stale by the
    worker starting up). Returns the trial numbers the worker left RUNNING."""
    import optuna
    import sqlalchemy
    from optuna.trial import TrialState
    storage = optuna.storages.RDBStorage(database)
    _wait_until(lambda: study_name in {s.study_name for s in storage.get_all_studies()})
    study = optuna.load_study(study_name=study_name, storage=storage)   # the run made it
    sid = storage.get_study_id_from_name(study_name)
    beat = sqlalchemy.text(       # existing heartbeats only: no row inserted, no lock waited on
        "UPDATE trial_heartbeats SET heartbeat = now() WHERE trial_id IN (SELECT trial_id "
        "FROM trials WHERE study_id = :sid AND state = 'RUNNING')")
    engine = sqlalchemy.create_engine(database)
    left: list[int] = []
    with engine.connect() as c, c.begin() as tx, \
            engine.connect().execution_options(isolation_level="AUTOCOMMIT") as beats:
        c.execute(sqlalchemy.text("LOCK TABLE trial_values IN EXCLUSIVE MODE"))

        def holding():
            beats.execute(beat, {"sid": sid})
            left[:] = stored(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
            return bool(left) or worker.poll() is not None
        t0 = time.monotonic()
        _wait_until(holding, 120, 0.1)
        print(f"worker killed {time.monotonic() - t0:.1f} s after the lock, trials {left} "
              "RUNNING")
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        tx.rollback()
    engine.dispose()
    return left


def _assert_retried(s, left):
    """The killed worker's RUNNING trials (``left``) were failed and each asked again."""
    by_number = {t.number: t for t in s.trials}
    assert left, "the kill interrupted no trial"
    for n in left:
        assert by_number[n].state.name == "FAIL", (n, by_number[n].state)
        assert any(r.system_attrs.get("failed_trial") == n for r in s.trials), n


def test_three_workers_complete_every_trial_once_and_survive_a_killed_worker(tmp_path, database):
    import optuna

    from dse import pareto
    from dse.build.space import load_space
    from dse.search.optuna.study import front_from_study

    total = 64          # 8 batches of 8: each process holds one as the kill lands
    run_dir = tmp_path / "run"
    runner = _dse("run", str(QUICK), "--strategy", "optuna", "--sampler", "random", "--trials",
                  str(total), "--population", "8", "--storage", database, "--out", str(run_dir),
                  "--quiet")
    _wait_until(lambda: (run_dir / "manifest.json").exists())
    study = run_dir.name
    workers = [_dse("worker", str(run_dir), "--quiet"),
               _dse("worker", "--storage", database, "--study", study, "--out",
                    str(tmp_path / "w2"), "--quiet"),
               _dse("worker", "--storage", database, "--study", study, "--out",
                    str(tmp_path / "w3"), "--quiet")]
    # kill one worker in the middle of its work (a batch scored and stored, not told): its
    # running trials must be failed and retried
    scores = tmp_path / "w2" / "scores"

    def stored(running):
        mine = {int(k) for f in scores.glob("*.trials.json") for k in json.loads(f.read_text())}
        return sorted(t.number for t in running if t.number in mine)
    left = _kill_while_telling(workers[1], database, study, stored)
    for p in [runner, workers[0], workers[2]]:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]

    s = optuna.load_study(study_name=study, storage=database)
    states = collections.Counter(t.state.name for t in s.trials)
    print("trial states:", dict(states))
    # every trial completed; workers asking at the same moment may add up to a batch each
    assert states["COMPLETE"] == total, states          # exactly the trials asked
    assert states["RUNNING"] == 0 and states["WAITING"] == 0   # none left behind
    numbers = [t.number for t in s.trials]
    assert len(numbers) == len(set(numbers))            # no duplicate trial numbers
    for t in s.trials:                                   # a failed trial was retried
        if t.state.name == "FAIL":
            assert any(r.system_attrs.get("failed_trial") == t.number for r in s.trials)
    _assert_retried(s, left)                             # the kill's trials among them
    # the run's front is the Pareto set of all completed trials
    space = load_space(str(QUICK))
    want = front_from_study(s, space)
    got = pd.read_csv(run_dir / "front.csv")
    assert set(got["design_id"]) == set(want["design_id"]) and len(got) > 0
    F = pareto.objective_matrix(got, space.objectives)
    assert pareto.nondominated(F).all()
    st = json.loads((run_dir / "progress.json").read_text())
    assert st["trials_completed"] == total                # the run's count is the storage's


def _segment_studies(database, base):
    import optuna

    from dse.search.optuna import segments
    storage = optuna.storages.RDBStorage(database)
    ks = sorted(segments.study_ids(storage, base))
    return [optuna.load_study(study_name=segments.segment_name(base, k), storage=storage)
            for k in ks]


def test_shared_study_rotates_segments_and_counts_every_trial_once(tmp_path, database):
    """Three processes on one PostgreSQL study with segments of 20 trials: they all switch to
    the newest segment, the totals add up over the segments, the front is over all of them."""
    from dse.build.space import load_space
    from dse.search.optuna.study import front_from_study

    total, pop, seg = 100, 8, 20
    run_dir = tmp_path / "run"
    runner = _dse("run", str(QUICK), "--strategy", "optuna", "--sampler", "random", "--trials",
                  str(total), "--population", str(pop), "--segment-trials", str(seg), "--storage",
                  database, "--out", str(run_dir), "--quiet")
    _wait_until(lambda: (run_dir / "manifest.json").exists())
    study = run_dir.name
    workers = [_dse("worker", str(run_dir), "--quiet"),
               _dse("worker", "--storage", database, "--study", study, "--out",
                    str(tmp_path / "w2"), "--quiet")]
    for p in [runner, *workers]:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]

    studies = _segment_studies(database, study)
    states = collections.Counter(t.state.name for s in studies for t in s.trials)
    print("segments:", len(studies), "trial states:", dict(states))
    assert len(studies) >= 4                               # 100 trials in segments of 20
    # every trial completed once; workers asking at the same moment (and racing warm starts)
    # may add a few
    assert states["COMPLETE"] == total, states          # exactly the trials asked
    assert states["RUNNING"] == 0 and states["WAITING"] == 0 and states["FAIL"] == 0
    ids = [t._trial_id for s in studies for t in s.trials]
    assert len(ids) == len(set(ids))
    for s in studies:
        assert len(s.trials) <= seg + 3 * pop + 2 * 10     # a segment is capped
    st = json.loads((run_dir / "progress.json").read_text())
    assert st["trials_completed"] == states["COMPLETE"] and st["state"] == "finished"
    status = json.loads(subprocess.run([sys.executable, "-m", "dse", "status", str(run_dir),
                                        "--json"], capture_output=True, text=True).stdout)
    assert status["trials_completed"] == states["COMPLETE"]
    space = load_space(str(QUICK))
    want = front_from_study(studies, space)
    got = pd.read_csv(run_dir / "front.csv")
    assert set(got["design_id"]) == set(want["design_id"]) and len(got) > 0


def test_exhaustive_shards_on_workers_survive_a_killed_worker_and_match_a_local_run(tmp_path,
                                                                                    database):
    """An exhaustive run's chunks as trials of a PostgreSQL study: the run and two workers pull
    them, one worker is killed mid-run; every chunk is completed (counted once), its front equals
    a plain local exhaustive run's."""
    import optuna

    from dse.build.space import load_space
    from dse.search import shards

    run_dir = tmp_path / "run"
    runner = _dse("run", str(QUICK), "--strategy", "exhaustive", "--chunk-designs", "8",
                  "--storage", database, "--out", str(run_dir), "--quiet")
    _wait_until(lambda: (run_dir / "manifest.json").exists())
    study = run_dir.name
    workers = [_dse("worker", str(run_dir), "--quiet"),
               _dse("worker", "--storage", database, "--study", study, "--out",
                    str(tmp_path / "w2"), "--quiet")]
    scores = tmp_path / "w2" / "scores"      # the chunk it stored, not told, is done again

    def stored(running):
        mine = {int(f.stem.split("-")[1]) for f in scores.glob("chunk-*.parquet")}
        return sorted(t.number for t in running if shards._chunk_of(t) in mine)
    left = _kill_while_telling(workers[1], database, study, stored)
    for p in [runner, workers[0]]:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]

    s = optuna.load_study(study_name=study, storage=database)
    states = collections.Counter(t.state.name for t in s.trials)
    chunks = collections.Counter(shards._chunk_of(t) for t in s.trials if t.state.name == "COMPLETE")
    print("trial states:", dict(states), "chunks completed twice:",
          sum(1 for n in chunks.values() if n > 1))
    n_chunks = -(-load_space(str(QUICK)).size // 8)
    assert set(chunks) == set(range(n_chunks))           # every chunk completed
    assert states["RUNNING"] == 0 and states["WAITING"] == 0
    for t in s.trials:                                   # a failed chunk was retried
        if t.state.name == "FAIL":
            assert any(r.system_attrs.get("failed_trial") == t.number for r in s.trials)
    _assert_retried(s, left)                             # the killed worker's chunk among them
    st = json.loads((run_dir / "progress.json").read_text())
    assert st["state"] == "finished" and st["trials_completed"] == n_chunks   # each once
    assert st["designs_scored"] == load_space(str(QUICK)).size
    # the exact front, every design scored at once in this process (what a plain local
    # exhaustive run writes: test_strategy_contract's covering run; no interpreter started)
    from helpers import brute_front
    want = brute_front(load_space(str(QUICK)))
    got = pd.read_csv(run_dir / "front.csv")
    assert set(got["design_id"]) == want and len(got) > 0
    assert set(shards.front_from_shards(s, load_space(str(QUICK)))["design_id"]) == want


def test_nested_run_with_workers_assembles_its_front_from_every_trial(tmp_path, database):
    """A nested run and two workers on one study: every trial completed once, each trial's
    point front stored with it, and the run's front = the Pareto set of every process's
    scored designs."""
    import optuna

    from dse import pareto
    from dse.build.space import load_space
    from dse.search.bench import CHIP_SPACE
    space_file = tmp_path / "nested.toml"
    space_file.write_text(CHIP_SPACE)
    total = 48
    run_dir = tmp_path / "run"
    runner = _dse("run", str(space_file), "--strategy", "nested", "--trials", str(total),
                  "--population", "2", "--storage", database, "--out", str(run_dir), "--quiet")
    _wait_until(lambda: (run_dir / "manifest.json").exists())
    workers = [_dse("worker", str(run_dir), "--quiet"),
               _dse("worker", "--storage", database, "--study", run_dir.name, "--out",
                    str(tmp_path / "w2"), "--quiet")]
    for p in [runner, *workers]:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    s = optuna.load_study(study_name=run_dir.name, storage=database)
    states = collections.Counter(t.state.name for t in s.trials)
    assert states["COMPLETE"] >= total and states["RUNNING"] == 0 and states["WAITING"] == 0
    assert all("front" in t.user_attrs for t in s.trials if t.state.name == "COMPLETE")
    space = load_space(str(space_file))
    tables = [pd.read_parquet(f) for d in (run_dir, tmp_path / "w2")
              for f in (d / "scores").glob("*.parquet")]
    every = pd.concat(tables, ignore_index=True)
    want = pareto.front_of([every[every["_admissible"]]], space.objectives)
    got = pd.read_csv(run_dir / "front.csv")
    assert set(got["design_id"]) == set(want["design_id"]) and len(got) > 0
