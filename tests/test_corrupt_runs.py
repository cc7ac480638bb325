"""Corrupt run folders (issue 27, point 5): each corruption is healed by ``dse repair`` (then
the run resumes) or refused with exit 2 and one line naming the file, by ``status``,
``--resume`` and ``repair`` alike; never an internal error."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import SMALL_SPACE


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished local optuna run (journal, 12 trials), copied by each test."""
    from dse.cli import main
    root = tmp_path_factory.mktemp("corrupt")
    (root / "s.toml").write_text(SMALL_SPACE)
    assert main(["run", str(root / "s.toml"), "--strategy", "optuna", "--sampler", "random",
                 "--trials", "12", "--out", str(root / "base"), "--quiet"]) == 0
    return root / "base"


@pytest.fixture
def run(finished, tmp_path):
    d = tmp_path / "r"
    shutil.copytree(finished, d)
    return d


def dse(capsys, *args):
    from dse.cli import main
    capsys.readouterr()
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err.strip()


def refused(capsys, d, command, *needles):
    rc, _, err = dse(capsys, *command)
    print(f"dse {' '.join(map(str, command[:2]))} -> exit {rc}: {err}")
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "internal error" not in err, err
    for n in needles:
        assert n in err, err


def _resume(d):
    return ("run", "--resume", d, "--trials", "2", "--quiet")


@pytest.mark.parametrize("corruption", ["binary garbage", "dse_version a number",
                                        "a JSON list"])
def test_an_unreadable_manifest_is_refused_by_every_command(run, capsys, corruption):
    f = run / "manifest.json"
    if corruption == "binary garbage":
        f.write_bytes(bytes(range(128, 256)) * 3)
    elif corruption == "a JSON list":
        f.write_text("[1, 2]")
    else:
        m = json.loads(f.read_text())
        m["dse_version"] = 5
        f.write_text(json.dumps(m))
    for command in (("status", run), _resume(run), ("repair", run), ("report", run)):
        refused(capsys, run, command, "manifest.json", "corrupt manifest")


@pytest.mark.parametrize("corruption", ["scores a file", "journal lock a folder",
                                        "owner lock a folder", "claim lock a folder",
                                        "live a file"])
def test_a_path_of_the_wrong_kind_is_refused_then_healed_by_repair(run, capsys, corruption):
    if corruption == "scores a file":
        shutil.rmtree(run / "scores")
        (run / "scores").write_text("not a folder")
        name = "scores"
    elif corruption == "live a file":
        shutil.rmtree(run / "live", ignore_errors=True)
        (run / "live").write_text("not a folder")
        name = "live"
    else:
        name = {"journal": "optuna.journal.flock", "owner": "lock",
                "claim": "claim.flock"}[corruption.split()[0]]
        if (run / name).exists():
            (run / name).unlink()
        (run / name).mkdir()
    for command in (("status", run), _resume(run)):
        refused(capsys, run, command, name, "dse repair")
    rc, out, err = dse(capsys, "repair", run)
    print(f"dse repair -> exit {rc}: {out.strip()}")
    assert rc == 0 and f"quarantined {name}" in out, err
    assert (run / "quarantine" / name).exists()
    rc, _, err = dse(capsys, *_resume(run))
    assert rc == 0, err
    rc, out, err = dse(capsys, "status", run, "--json")
    assert rc == 0 and json.loads(out)["trials_completed"] >= 2, err


@pytest.mark.parametrize("line", ['{"op_code": 999}', "not json at all", "42", "{}",
                                  '{"op_code": 5, "worker_id": "w"}'])
def test_a_journal_ending_in_a_whole_garbage_line_is_found_by_repair(run, capsys, line):
    with open(run / "optuna.journal", "a") as f:
        f.write(line + "\n")
    refused(capsys, run, _resume(run), "optuna.journal", "corrupt journal", "dse repair")
    rc, out, err = dse(capsys, "repair", run)
    print(f"{line!r}: dse repair -> exit {rc}: {out.strip()}")
    assert rc == 0 and "quarantined optuna.journal" in out and "no corrupt file" not in out
    rc, _, err = dse(capsys, *_resume(run))
    assert rc == 0, err


# --- valid files in the wrong place, edited manifests, locks (issue 27, point 5 rest) --------

@pytest.fixture(scope="module")
def chunked(tmp_path_factory):
    """Two finished exhaustive runs of 50-design chunks: the space of ``finished`` (180 designs,
    4 chunks) and one of another space (162 designs)."""
    from dse.cli import main
    root = tmp_path_factory.mktemp("chunked")
    (root / "s.toml").write_text(SMALL_SPACE)
    (root / "u.toml").write_text(SMALL_SPACE.replace('name = "t"', 'name = "u"')
                                 .replace("num = 10", "num = 9"))
    for name in ("s", "u"):
        assert main(["run", str(root / f"{name}.toml"), "--chunk-designs", "50",
                     "--out", str(root / name), "--quiet"]) == 0
    return root


@pytest.mark.parametrize("copy", ["a chunk of another space", "another chunk of the run",
                                  "another batch of the run"])
def test_a_valid_table_copied_over_another_is_refused_then_healed(chunked, run, tmp_path,
                                                                  capsys, copy):
    if copy == "another batch of the run":
        d = run
        batches = sorted((d / "scores").glob("batch-*.parquet"))
        src, dst = batches[0], batches[1]
        words = "made for segment 0, trials from 0"
    else:
        d = tmp_path / "x"
        shutil.copytree(chunked / "s", d)
        dst = d / "scores" / "chunk-00000001.parquet"
        src = (chunked / "u" if copy.endswith("space") else d) / "scores" / (
            "chunk-00000001.parquet" if copy.endswith("space") else "chunk-00000002.parquet")
        words = "of another space" if copy.endswith("space") else "made for designs 100..149"
    shutil.copyfile(src, dst)
    for command in (("status", d), _resume(d), ("report", d)):
        refused(capsys, d, command, dst.name, words, "dse repair")
    rc, out, err = dse(capsys, "repair", d)
    print(f"{copy}: dse repair -> exit {rc}: {out.strip()}")
    assert rc == 0 and f"quarantined scores/{dst.name}" in out, err
    rc, _, err = dse(capsys, "run", "--resume", d, "--quiet")
    assert rc == 0, err
    rc, out, err = dse(capsys, "status", d, "--json")
    st = json.loads(out)
    print(f"  resumed: {st['trials_completed']} of {st['trials_total']}, {st['state']}")
    assert st["state"] == "finished" and st["trials_completed"] == st["trials_total"]


@pytest.mark.parametrize("key,value", [("size", 500), ("chunk_designs", 25)])
def test_an_edited_size_or_chunk_size_is_refused_by_every_command(chunked, tmp_path, capsys,
                                                                  key, value):
    d = tmp_path / "x"
    shutil.copytree(chunked / "s", d)
    m = json.loads((d / "manifest.json").read_text())
    m[key] = value
    (d / "manifest.json").write_text(json.dumps(m))
    for command in (("status", d), _resume(d), ("repair", d), ("report", d)):
        refused(capsys, d, command, "manifest.json", "were edited")


def _hold_lock(d):
    """A process that owns the run folder (its flock on DIR/lock held) until killed."""
    import subprocess
    import sys
    code = ("import fcntl, os, socket, sys, time\n"
            f"fd = os.open({str(d / 'lock')!r}, os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "os.write(fd, f'pid {os.getpid()} on {socket.gethostname()}\\n'.encode())\n"
            "print('held', flush=True)\ntime.sleep(120)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_repair_and_resume_agree_about_locks(run, capsys):
    """A stale lock file naming a live pid (no flock held) blocks neither; a held owner lock
    blocks both, each naming the holder's pid."""
    import os
    (run / "lock").write_text(f"{os.getppid()} somehost\n")     # a live pid, not an owner
    rc, _, err = dse(capsys, "repair", run)
    print(f"stale lock naming live pid {os.getppid()}: repair -> {rc}")
    assert rc == 0, err
    (run / "lock").write_text(f"{os.getppid()} somehost\n")
    rc, _, err = dse(capsys, *_resume(run))
    print(f"  resume -> {rc}")
    assert rc == 0, err
    p = _hold_lock(run)
    try:
        for command in (("repair", run), _resume(run)):
            refused(capsys, run, command, f"in use by pid {p.pid}")
    finally:
        p.kill()
        p.wait()
    rc, _, err = dse(capsys, "repair", run)
    assert rc == 0, err
