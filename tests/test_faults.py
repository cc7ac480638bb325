"""The fault sweep of issue 9 as tests: kill -9 at seeded random moments, stale locks, journals
cut mid-record, corrupt run folders, dse repair, SIGINT, leftovers of refused runs, and (with
PostgreSQL) a worker killed before its first heartbeat and a database outage.

Everything is small (a 180-design space, tens of trials) and every subprocess has a timeout,
so a hang fails the test instead of hanging the suite.
"""

from __future__ import annotations

import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
from helpers import ROOT, SMALL_SPACE, brute_front

from dse import pareto
from dse.build.space import load_space

SPACE = SMALL_SPACE.replace('name = "t"', 'name = "faults"')
RESUME_TIMEOUT_S = 60        # a resume after kill -9 must finish in this (it never waits on locks)


def _env():
    env = {k: v for k, v in os.environ.items() if k != "DSE_DEBUG"}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


_INPROC = {}


@pytest.fixture(autouse=True)
def _in_process(capsys, monkeypatch):
    """``dse(...)`` runs in this process (fast: no interpreter start-up) unless ``sub=True``."""
    _INPROC.update(capsys=capsys, monkeypatch=monkeypatch)
    yield
    _INPROC.clear()
    from dse.search.optuna import study
    study.set_storage_retry(None)


def dse(*args, cwd, timeout=RESUME_TIMEOUT_S, sub=False):
    if sub or not _INPROC:
        return subprocess.run([sys.executable, "-m", "dse", *map(str, args)], cwd=cwd,
                              env=_env(), capture_output=True, text=True, timeout=timeout)
    from types import SimpleNamespace

    from dse.cli import main
    _INPROC["monkeypatch"].chdir(cwd)
    _INPROC["capsys"].readouterr()
    rc = main([str(a) for a in args])
    out, err = _INPROC["capsys"].readouterr()
    return SimpleNamespace(returncode=rc, stdout=out, stderr=err)


def popen(*args, cwd):
    return subprocess.Popen([sys.executable, "-m", "dse", *map(str, args)], cwd=cwd, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def one_line_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err


@pytest.fixture
def space_dir(tmp_path):
    (tmp_path / "spaces").mkdir()
    (tmp_path / "spaces" / "s.toml").write_text(SPACE)
    return tmp_path


def _status(run, cwd):
    r = dse("status", run, "--json", cwd=cwd)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


STRATEGIES = {
    "exhaustive": ["--chunk-designs", "7"],
    "optuna": ["--strategy", "optuna", "--sampler", "random", "--population", "4",
               "--trials", "60"],
    # 6 hardware points: 4 trials (trials that cover the points would enumerate the space)
    "nested": ["--strategy", "nested", "--population", "2", "--trials", "4"],
}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_kill_9_at_random_moments_then_resume_from_another_cwd(space_dir, strategy):
    """A relative run folder (runs/k), killed with SIGKILL at seeded random moments (so also
    while writing tables, trials files and the journal), resumed each time within a timeout,
    from the run's cwd and from another one: the final counters equal what the storage holds,
    nothing is counted twice and the front is right."""
    rng = random.Random(f"kill-{strategy}")
    cwd = space_dir
    run = "runs/k"
    p = popen("run", "spaces/s.toml", "--out", run, "--quiet", *STRATEGIES[strategy], cwd=cwd)
    deadline = time.time() + 60
    while time.time() < deadline and not (cwd / run / "manifest.json").exists():
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 1.5))         # any moment of the run's work
    p.kill()
    p.wait()
    resumes = []
    for k in range(2):                         # killed again while resuming
        q = popen("run", "--resume", run, "--quiet", cwd=cwd)
        time.sleep(rng.uniform(1.2, 2.5))
        q.kill()
        q.wait()
    other = space_dir / "elsewhere"
    other.mkdir()
    t0 = time.monotonic()
    r = dse("run", "--resume", cwd / run, "--quiet", cwd=other, sub=True)   # from another cwd
    resumes.append(time.monotonic() - t0)
    assert r.returncode == 0, r.stderr[-2000:]
    print(f"{strategy}: resume after kill -9 took {resumes[-1]:.1f} s")
    st = _status(run, cwd)
    d = cwd / run
    assert st["state"] == "finished", st
    assert not list(d.rglob("*.tmp")) and not (d / "lock").exists()
    space = load_space(str(cwd / "spaces" / "s.toml"))
    front = set(pd.read_csv(d / "front.csv")["design_id"])
    if strategy == "exhaustive":
        assert st["designs_scored"] == space.size
        assert st["trials_completed"] == -(-space.size // 7)
        assert front == brute_front(space)
        return
    import optuna
    from optuna.trial import TrialState
    told = {}
    for f in (d / "scores").glob("batch-*.trials.json"):
        told.update(json.loads(f.read_text()))
    total = 60 if strategy == "optuna" else 4
    assert st["trials_completed"] == total == len(told), (st, len(told))
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(d / "optuna.journal")))
    study = optuna.load_study(study_name="k", storage=storage)
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    scored = [t for t in complete if str(t.number) in told]
    assert len(scored) == total and not study.get_trials(states=(TrialState.RUNNING,))
    # the other complete trials proposed designs scored before: told their values, not scored
    from dse.search.optuna.strategy import split_parameters
    from dse.search.optuna.study import point_key
    keys = {v["key"] for v in told.values()}
    outer, _ = split_parameters(space, strategy == "nested")
    assert all(point_key(space, t.params, outer) in keys for t in complete
               if str(t.number) not in told)
    m = json.loads((d / "manifest.json").read_text())
    assert st["designs_scored"] == total * m["designs_per_trial"]
    tables = pd.concat([pd.read_parquet(f) for f in (d / "scores").glob("batch-*.parquet")])
    want = pareto.front_of([tables[tables["_admissible"]]], space.objectives)
    assert front == set(want["design_id"])


def test_a_stale_lock_never_makes_a_resume_wait(space_dir):
    """Locks a killed process left behind (Optuna's symlink lock of older dse versions pointing
    nowhere, the run's lock file of a dead pid, a journal .flock file) cost nothing."""
    cwd = space_dir
    r = dse("run", "spaces/s.toml", "--out", "runs/l", "--quiet", *STRATEGIES["optuna"][:-1],
            "20", cwd=cwd)
    assert r.returncode == 0, r.stderr
    d = cwd / "runs" / "l"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    os.symlink("runs/l/optuna.journal", d / "optuna.journal.lock")   # relative: dangling
    (d / "lock").write_text(f"{dead.pid} somewhere\n")
    (d / "optuna.journal.flock").write_text(f"pid {dead.pid} on somewhere\n")
    m = json.loads((d / "manifest.json").read_text())
    m["trials"] = 28
    (d / "manifest.json").write_text(json.dumps(m))
    t0 = time.monotonic()
    r = dse("run", "--resume", "runs/l", "--quiet", cwd=cwd, timeout=30, sub=True)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 25 and "waiting" not in r.stderr
    assert _status("runs/l", cwd)["trials_completed"] == 28


def test_journal_cut_mid_record_is_recovered_and_never_made_unreadable(space_dir):
    cwd = space_dir
    r = dse("run", "spaces/s.toml", "--out", "runs/j", "--quiet", *STRATEGIES["optuna"][:-1],
            "20", cwd=cwd)
    assert r.returncode == 0, r.stderr
    d = cwd / "runs" / "j"
    j = d / "optuna.journal"
    data = j.read_bytes()
    j.write_bytes(data[:-37])                   # a process killed while appending a record
    m = json.loads((d / "manifest.json").read_text())
    m["trials"] = 32
    (d / "manifest.json").write_text(json.dumps(m))
    r = dse("run", "--resume", "runs/j", "--quiet", cwd=cwd)
    assert r.returncode == 0, r.stderr
    assert "partial record" in r.stderr
    assert list((d / "quarantine").glob("optuna.journal.cut-*"))
    assert j.read_bytes().endswith(b"\n")
    m["trials"] = 36
    (d / "manifest.json").write_text(json.dumps(m))
    r = dse("run", "--resume", "runs/j", "--quiet", cwd=cwd)   # still readable
    assert r.returncode == 0, r.stderr
    assert _status("runs/j", cwd)["trials_completed"] == 36


def _finished_exhaustive(cwd, name="c"):
    r = dse("run", "spaces/s.toml", "--out", f"runs/{name}", "--quiet", "--chunk-designs", "20",
            cwd=cwd)
    assert r.returncode == 0, r.stderr
    return cwd / "runs" / name


def test_derived_files_are_rebuilt_by_status_and_report_checks_the_front(space_dir):
    cwd = space_dir
    d = _finished_exhaustive(cwd)
    space = load_space(str(cwd / "spaces" / "s.toml"))
    good = pd.read_csv(d / "front.csv")
    # a truncated front.csv: status notices (front size disagrees) and rebuilds it
    lines = (d / "front.csv").read_text().splitlines()
    (d / "front.csv").write_text("\n".join(lines[: len(lines) // 2]) + "\n")
    st = _status("runs/c", cwd)
    assert st["front_size"] == len(good) and st["state"] == "finished"
    assert set(pd.read_csv(d / "front.csv")["design_id"]) == set(good["design_id"])
    # report: computed from the score tables, a truncated front.csv is rebuilt and said so
    (d / "front.csv").write_text("\n".join(lines[: len(lines) // 2]) + "\n")
    r = dse("report", "runs/c", cwd=cwd, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "rebuilt from the score tables" in r.stderr
    assert set(pd.read_csv(d / "report" / "front.csv")["design_id"]) == brute_front(space)
    assert "verified" in (d / "report" / "summary.md").read_text() or \
        "rebuilt" in (d / "report" / "summary.md").read_text()
    # a bad progress.json (and a missing one): rebuilt from the chunks
    for text in ("{not json", None):
        if text is None:
            (d / "progress.json").unlink()
        else:
            (d / "progress.json").write_text(text)
        st = _status("runs/c", cwd)
        assert st["state"] == "finished" and st["designs_scored"] == space.size
        assert json.loads((d / "progress.json").read_text())["designs_scored"] == space.size


def test_a_broken_chunk_is_refused_naming_it_then_repaired(space_dir):
    cwd = space_dir
    d = _finished_exhaustive(cwd)
    space = load_space(str(cwd / "spaces" / "s.toml"))
    chunk = d / "scores" / "chunk-00000003.parquet"
    chunk.write_bytes(chunk.read_bytes()[:100])
    for args in (("status", "runs/c"), ("run", "--resume", "runs/c"), ("report", "runs/c")):
        one_line_error(dse(*args, cwd=cwd), "chunk-00000003.parquet", "dse repair")
    r = dse("repair", "runs/c", cwd=cwd)
    assert r.returncode == 0, r.stderr
    assert "quarantined scores/chunk-00000003.parquet" in r.stdout
    assert (d / "quarantine" / "scores" / "chunk-00000003.parquet").is_file()
    st = _status("runs/c", cwd)
    assert st["state"] == "stopped" and st["designs_scored"] == space.size - 20
    r = dse("run", "--resume", "runs/c", "--quiet", cwd=cwd)
    assert r.returncode == 0, r.stderr
    st = _status("runs/c", cwd)
    assert st["state"] == "finished" and st["designs_scored"] == space.size
    assert set(pd.read_csv(d / "front.csv")["design_id"]) == brute_front(space)


def _finished_optuna(cwd, name="o", trials=24):
    r = dse("run", "spaces/s.toml", "--out", f"runs/{name}", "--quiet", "--strategy", "optuna",
            "--sampler", "random", "--population", "4", "--trials", str(trials), cwd=cwd)
    assert r.returncode == 0, r.stderr
    return cwd / "runs" / name


@pytest.mark.parametrize("target", ["trials.json", "parquet"])
def test_a_corrupt_batch_is_refused_then_repaired_and_its_trials_asked_again(space_dir, target):
    cwd = space_dir
    d = _finished_optuna(cwd)
    batch = sorted((d / "scores").glob("batch-*.parquet"))[1]
    f = batch.with_suffix(".trials.json") if target == "trials.json" else batch
    f.write_text('{"3": {"values": [1.0')
    one_line_error(dse("run", "--resume", "runs/o", cwd=cwd), f.name, "dse repair")
    one_line_error(dse("status", "runs/o", cwd=cwd), f.name)
    r = dse("repair", "runs/o", cwd=cwd)
    assert r.returncode == 0 and "quarantined" in r.stdout, r.stdout + r.stderr
    assert _status("runs/o", cwd)["trials_completed"] == 20
    r = dse("run", "--resume", "runs/o", "--quiet", cwd=cwd)
    assert r.returncode == 0, r.stderr
    st = _status("runs/o", cwd)
    assert st["state"] == "finished" and st["trials_completed"] == 24


def test_a_journal_broken_in_the_middle_is_refused_then_repaired(space_dir):
    cwd = space_dir
    d = _finished_optuna(cwd)
    j = d / "optuna.journal"
    lines = j.read_bytes().splitlines(keepends=True)
    lines[len(lines) // 2] = b'{"op_code": 5, "worker_id": \n'
    j.write_bytes(b"".join(lines))
    m = json.loads((d / "manifest.json").read_text())
    m["trials"] = 32
    (d / "manifest.json").write_text(json.dumps(m))
    one_line_error(dse("run", "--resume", "runs/o", cwd=cwd), "optuna.journal", "dse repair")
    r = dse("repair", "runs/o", cwd=cwd)
    assert r.returncode == 0 and "quarantined optuna.journal" in r.stdout, r.stdout + r.stderr
    r = dse("run", "--resume", "runs/o", "--quiet", cwd=cwd)
    assert r.returncode == 0, r.stderr
    st = _status("runs/o", cwd)
    assert st["state"] == "finished" and st["trials_completed"] == 32     # the 24 kept


def test_sigint_exits_130_and_the_run_resumes(space_dir):
    cwd = space_dir
    bigger = SPACE.replace("num = 10", "num = 120")
    (cwd / "spaces" / "b.toml").write_text(bigger)
    p = popen("run", "spaces/b.toml", "--out", "runs/i", "--quiet", "--chunk-designs", "10",
              cwd=cwd)
    d = cwd / "runs" / "i"
    deadline = time.time() + 30
    while time.time() < deadline and len(list((d / "scores").glob("chunk-*.parquet"))) < 3:
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    assert "resumable" in err and len(err.strip().splitlines()) == 1
    st = _status("runs/i", cwd)
    assert st["state"] == "stopped"
    r = dse("run", "--resume", "runs/i", "--quiet", cwd=cwd)
    assert r.returncode == 0, r.stderr
    assert _status("runs/i", cwd)["designs_scored"] == load_space(str(cwd / "spaces" / "b.toml")).size


def test_objectives_files_are_snapshotted_and_confined(space_dir):
    cwd = space_dir
    (cwd / "objectives").mkdir()
    (cwd / "objectives" / "o.toml").write_text(
        '[objectives]\nusd_per_mtok_output = "minimize"\ntpot_s = "minimize"\n')
    body = SPACE.split("[objectives]")[0]
    (cwd / "spaces" / "f.toml").write_text('objectives = "../objectives/o.toml"\n' + body)
    r = dse("run", "spaces/f.toml", "--out", "runs/f", "--quiet", cwd=cwd)
    assert r.returncode == 0, r.stderr
    d = cwd / "runs" / "f"
    assert (d / "objectives" / "o.toml").is_file() and (d / "inputs" / "f.toml").is_file()
    (cwd / "objectives" / "o.toml").write_text("garbage = ")     # the run reads its own copy
    r = dse("run", "--resume", "runs/f", "--quiet", cwd=cwd)
    assert r.returncode == 0, r.stderr
    for bad in ("../../../../etc/passwd", "/etc/passwd"):
        (cwd / "spaces" / "x.toml").write_text(f'objectives = "{bad}"\n' + body)
        one_line_error(dse("run", "spaces/x.toml", "--out", "runs/x", cwd=cwd),
                       "outside the space file's folder")
        assert not (cwd / "runs" / "x").exists()


def test_failed_or_refused_runs_leave_no_folder_or_temp_file(space_dir):
    cwd = space_dir
    r = dse("run", "spaces/s.toml", "--out", "runs/bad", "--strategy", "optuna", "--storage",
            "postgresql+psycopg2://nobody:x@127.0.0.1:1/none", "--storage-retry", "1s", "--quiet",
            cwd=cwd)
    one_line_error(r, "connection refused", "127.0.0.1:1")       # nothing listens: at once
    assert not (cwd / "runs" / "bad").exists()
    one_line_error(dse("run", "spaces/s.toml", "--storage-retry", "soon", cwd=cwd),
                   "--storage-retry")
    assert not (cwd / "runs").exists() or not any((cwd / "runs").iterdir())
    assert not list(cwd.rglob("*.tmp"))


# --- PostgreSQL ---------------------------------------------------------------------------

URL = os.environ.get("DSE_TEST_POSTGRES_URL")
needs_pg = pytest.mark.skipif(not URL, reason="DSE_TEST_POSTGRES_URL not set (no PostgreSQL)")


def _states(database, study):
    import optuna
    s = optuna.load_study(study_name=study, storage=database)
    return collections.Counter(t.state.name for t in s.trials)


@needs_pg
def test_a_worker_killed_before_its_first_heartbeat_leaves_no_hang(space_dir, database):
    """RUNNING trials with no heartbeat at all (their worker died between asking and its first
    heartbeat) are failed and retried like any other; the run stops at exactly its total."""
    import optuna
    cwd = space_dir
    total = 40
    r = dse("run", "spaces/s.toml", "--out", "runs/p", "--strategy", "optuna", "--sampler",
            "random", "--population", "4", "--trials", "8", "--storage", database, "--quiet",
            cwd=cwd, timeout=120)
    assert r.returncode == 0, r.stderr
    d = cwd / "runs" / "p"
    m = json.loads((d / "manifest.json").read_text())
    m["trials"] = total
    (d / "manifest.json").write_text(json.dumps(m))
    # a dead worker's trials: asked (RUNNING), never a heartbeat
    study = optuna.load_study(study_name="p", storage=database)
    from dse.search.optuna.study import distributions
    space = load_space(str(cwd / "spaces" / "s.toml"))
    for _ in range(5):
        study.ask(distributions(space))
    t0 = time.monotonic()
    r = dse("run", "--resume", "runs/p", "--quiet", cwd=cwd, timeout=120, sub=True)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    states = _states(database, "p")
    print(f"resume with 5 heartbeat-less trials: {took:.1f} s, states {dict(states)}")
    assert states["COMPLETE"] == total and states["RUNNING"] == 0 and states["WAITING"] == 0
    assert states["FAIL"] == 5
    st = _status("runs/p", cwd)
    assert st["trials_completed"] == total and st["designs_scored"] == total


def _cluster_of(url):
    """(version, name) of the local cluster serving ``url``'s port, via pg_lsclusters."""
    if not shutil.which("pg_ctlcluster") or not shutil.which("pg_lsclusters"):
        return None
    from sqlalchemy.engine import make_url
    u = make_url(url)
    if u.host not in ("127.0.0.1", "localhost"):
        return None
    out = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        ver, name, port, status = line.split()[:4]
        if int(port) == (u.port or 5432) and status == "online":
            return ver, name
    return None


@needs_pg
@pytest.mark.postgres(stops_server=True)   # alone on the server (tests/conftest.py)
def test_a_database_outage_under_a_shared_run_is_survived(space_dir, database):
    """PostgreSQL stopped for OUTAGE_S under a shared optuna run with a worker: both wait
    (retrying), carry on once it is back and end with exactly the trials asked."""
    cluster = _cluster_of(URL)
    if cluster is None:
        pytest.skip("needs a local PostgreSQL cluster managed by pg_ctlcluster")
    outage_s = 12
    cwd = space_dir
    total = 160
    (cwd / "spaces" / "b.toml").write_text(SPACE.replace("num = 10", "num = 60"))
    runner = popen("run", "spaces/b.toml", "--out", "runs/q", "--strategy", "optuna",
                   "--sampler", "random", "--population", "4", "--trials", total, "--storage",
                   database, "--storage-retry", "120s", "--quiet", cwd=cwd)
    d = cwd / "runs" / "q"
    deadline = time.time() + 60
    while time.time() < deadline and not (d / "manifest.json").exists():
        time.sleep(0.1)
    worker = popen("worker", "runs/q", "--quiet", "--storage-retry", "120s", cwd=cwd)
    deadline = time.time() + 60
    while time.time() < deadline and len(list((d / "scores").glob("*.json"))) < 4:
        time.sleep(0.1)
    ctl = ["pg_ctlcluster", *cluster]
    subprocess.run([*ctl, "stop", "-m", "fast"], check=True, timeout=60)
    try:
        time.sleep(outage_s)
    finally:
        subprocess.run([*ctl, "start"], check=True, timeout=60)
    for p in (runner, worker):
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-3000:]
    states = _states(database, "q")
    print(f"outage of {outage_s} s survived; states {dict(states)}")
    assert states["COMPLETE"] == total and states["RUNNING"] == 0, states
    st = _status("runs/q", cwd)
    assert st["trials_completed"] == total and st["state"] == "finished"


def test_the_journal_lock_says_its_holder_and_rewrites_it_only_when_it_changes(tmp_path):
    """The lock file holds its holder's pid (what a waiting process prints); acquiring it again
    in the same process leaves the file as it is (no truncate and write per journal record),
    while a lock last held by another process is rewritten with this one."""
    import socket
    from pathlib import Path

    from dse.search.journal import JournalLock
    j = tmp_path / "optuna.journal"
    lock = JournalLock(j)
    me = f"pid {os.getpid()} on {socket.gethostname()}"
    Path(str(j) + ".flock").write_text("pid 1 on elsewhere with a longer name than ours\n")
    lock.acquire()
    assert lock.owner() == me
    lock.release()
    before = os.stat(str(j) + ".flock").st_mtime_ns
    time.sleep(0.01)
    for _ in range(3):
        lock.acquire()
        lock.release()
    assert os.stat(str(j) + ".flock").st_mtime_ns == before and lock.owner() == me
