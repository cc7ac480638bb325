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


@pytest.mark.parametrize("corruption", ["scores a file", "journal lock a folder"])
def test_a_path_of_the_wrong_kind_is_refused_then_healed_by_repair(run, capsys, corruption):
    if corruption == "scores a file":
        shutil.rmtree(run / "scores")
        (run / "scores").write_text("not a folder")
        name = "scores"
    else:
        (run / "optuna.journal.flock").unlink()
        (run / "optuna.journal.flock").mkdir()
        name = "optuna.journal.flock"
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
