"""Processes started at the same instant on one run folder (issue 27, point 1): two resumes, a
resume and a worker, three workers. One owner at a time (an flock taken before the folder is
read: the second resume is refused, exit 2, naming the owner); workers join through the claim
lock; the run ends with exactly the trials asked, no trial of a live process failed, and every
counter (the run's and the workers' last lines, ``dse status``, the journal) says the same.

The processes are forked from this one (dse already imported) and released by one Barrier, so
they reach the run folder within milliseconds of each other; each scenario is repeated with
seeded base runs. With DSE_TEST_POSTGRES_URL, the same with the run's study in PostgreSQL.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import shutil
import sys

import pytest
from helpers import SMALL_SPACE

BASE_TRIALS, TOTAL = 4, 16      # the base run's trials, then the total the racers finish
R = ("run", "--resume", "{d}", "--quiet")
W = ("worker", "{d}", "--quiet")
SCENARIOS = {"two resumes": (R, R), "a resume and a worker": (R, W), "three workers": (W, W, W)}


def _child(barrier, args, out):
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = sys.stderr = open(fd, "w", buffering=1)     # past pytest's capture too
    from dse.cli import main
    barrier.wait()
    rc = 99
    try:
        rc = main(list(args))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)


def race(d, commands, timeout_s=120):
    """Each command in a forked process, all released at once; (exit codes, outputs)."""
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(len(commands))
    procs = []
    for i, c in enumerate(commands):
        p = ctx.Process(target=_child, args=(barrier, [a.format(d=d) for a in c],
                                             f"{d}.{i}.out"))
        p.start()
        procs.append(p)
    for p in procs:
        p.join(timeout_s)
        if p.is_alive():
            p.kill()
            p.join()
    return ([p.exitcode for p in procs],
            [open(f"{d}.{i}.out").read().strip() for i in range(len(commands))])


@pytest.fixture(scope="module")
def base_runs(tmp_path_factory):
    """Finished local optuna runs of BASE_TRIALS trials, one per seed, copied by each race."""
    from dse.cli import main
    root = tmp_path_factory.mktemp("own")
    (root / "s.toml").write_text(SMALL_SPACE)
    out = {}
    for seed in (1, 2):
        assert main(["run", str(root / "s.toml"), "--strategy", "optuna", "--sampler", "random",
                     "--population", "4", "--trials", str(BASE_TRIALS), "--seed", str(seed),
                     "--out", str(root / f"base{seed}"), "--quiet"]) == 0
        out[seed] = root / f"base{seed}"
    return out


def _copy(base, d, total):
    shutil.copytree(base, d)
    m = json.loads((d / "manifest.json").read_text())
    m["trials"] = total                 # the run is stopped short of its total
    (d / "manifest.json").write_text(json.dumps(m))


def _journal_trials(d):
    import optuna
    from optuna.trial import TrialState
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(d / "optuna.journal")))
    trials = [t for name in optuna.get_all_study_names(storage)
              for t in optuna.load_study(study_name=name, storage=storage).get_trials()]
    return {s: [t for t in trials if t.state == s] for s in TrialState}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("seed", [1, 2])
def test_processes_started_together_finish_exactly_the_trials_asked(base_runs, tmp_path,
                                                                    scenario, seed):
    from optuna.trial import TrialState

    from dse.search import store
    d = tmp_path / "run"
    _copy(base_runs[seed], d, TOTAL)
    commands = SCENARIOS[scenario]
    rcs, outs = race(d, commands)
    st = store.status(d)
    print(f"{scenario}, base run seed {seed}: exit codes {rcs}; status {st['trials_completed']} "
          f"trials ({st['state']}), by worker {st.get('trials_by_worker')}")
    for c, rc, out in zip(commands, rcs, outs):
        print(f"  dse {c[0]} -> {rc}: {out.splitlines()[0] if out else ''}")
    if scenario == "two resumes":
        # overlapping, the second is refused; on a loaded machine the first may finish its few
        # trials before the second takes the lock, which then finds the run finished: both
        # exit 0, and both must report the run's totals (checked below, as is the journal)
        assert sorted(rcs) in ([0, 2], [0, 0]), outs
        if 2 in rcs:
            err = outs[rcs.index(2)]
            assert len(err.splitlines()) == 1 and "the run is in use by pid" in err, err
            assert "internal error" not in err
            outs = [outs[rcs.index(0)]]
    else:
        assert rcs == [0] * len(commands), outs
    # every counter says TOTAL: the processes' last words, status, the stored batches, the journal
    for out in outs:
        n = re.search(r"(\d+) of (\d+) trials", out)
        assert n and int(n.group(1)) == int(n.group(2)) == TOTAL, out
    assert st["state"] == "finished" and st["trials_completed"] == TOTAL, st
    assert sum(st["trials_by_worker"].values()) == TOTAL
    told = {}
    for f in (d / "scores").glob("batch-*.trials.json"):
        told.update(json.loads(f.read_text()))
    assert len(told) == TOTAL
    trials = _journal_trials(d)
    assert not trials[TrialState.RUNNING] and not trials[TrialState.FAIL], \
        "a live process's trial was failed"
    assert sum(str(t.number) in told for t in trials[TrialState.COMPLETE]) == TOTAL
    # ... and the journal's COMPLETE trials (optuna-dashboard's count) are exactly those: a
    # repeat of a scored design is PRUNED there
    assert len(trials[TrialState.COMPLETE]) == TOTAL
    # nothing left behind: no owner lock, no live token, no temporary file
    assert not (d / "lock").exists() and not list((d / "live").iterdir())
    assert not list(d.rglob("*.tmp"))


def test_a_dead_process_s_trials_are_recovered_and_a_live_one_s_never(base_runs, tmp_path):
    """A live token whose process is gone (kill -9: its flock is free) does not protect its
    trials: the next process fails them and asks again; a live one's are left running."""
    import optuna
    from optuna.trial import TrialState

    from dse.cli import main
    from dse.search import journal, store
    d = tmp_path / "run"
    _copy(base_runs[1], d, BASE_TRIALS + 4)
    storage = journal.open_journal(d)
    study = optuna.load_study(study_name=json.loads((d / "manifest.json").read_text())
                              ["study_name"], storage=storage)
    dead = study.ask()                            # a trial of a process killed while scoring
    (d / "live").mkdir(exist_ok=True)
    (d / "live" / "gone-1-x").write_text(json.dumps({"trials": [[0, dead.number]]}))
    assert main(["run", "--resume", str(d), "--quiet"]) == 0
    trials = _journal_trials(d)
    print(f"dead process's trial {dead.number}: "
          f"{[t.state.name for t in trials[TrialState.FAIL] if t.number == dead.number]}")
    assert [t.number for t in trials[TrialState.FAIL]] == [dead.number]
    assert store.status(d)["trials_completed"] == BASE_TRIALS + 4
    assert not (d / "live" / "gone-1-x").exists()


@pytest.mark.skipif(not os.environ.get("DSE_TEST_POSTGRES_URL"), reason="needs PostgreSQL")
def test_a_shared_study_s_processes_started_together_finish_exactly(tmp_path, database):
    """The same with the run's study in PostgreSQL: a resume and two workers at once."""
    from dse.cli import main
    from dse.search import store
    (tmp_path / "s.toml").write_text(SMALL_SPACE)
    d = tmp_path / "run"
    assert main(["run", str(tmp_path / "s.toml"), "--strategy", "optuna", "--sampler", "random",
                 "--population", "4", "--trials", str(BASE_TRIALS), "--storage", database,
                 "--out", str(d), "--quiet"]) == 0
    m = json.loads((d / "manifest.json").read_text())
    m["trials"] = TOTAL
    (d / "manifest.json").write_text(json.dumps(m))
    rcs, outs = race(d, (R, W, W))
    print(f"PostgreSQL: exit codes {rcs}: {[o.splitlines()[0] for o in outs if o]}")
    assert rcs == [0, 0, 0], outs
    for out in outs:
        n = re.search(r"(\d+) of (\d+) trials", out)
        assert n and int(n.group(1)) == int(n.group(2)) == TOTAL, out
    st = store.status(d)
    assert st["trials_completed"] == TOTAL, st
