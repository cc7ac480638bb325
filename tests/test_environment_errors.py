"""Environment errors (issue 27, point 6): a full disk (ENOSPC), a read-only file system (EROFS)
or a denied permission (EACCES) is exit 3 (``dse --help``) and one line naming the path, never
``internal error: OSError``; no temporary file survives the failure.

Tests may run as root, where ``chmod`` stops no write: the failures are then injected where the
file is written (the read-only folder is also tried for real when not root).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from helpers import SMALL_SPACE

from dse.errors import EXIT_ENVIRONMENT, EnvironmentFault

CASE_ROWS = ("case_id,model,hardware,num_chips,isl,osl,concurrency,weight_dtype\n"
             "a,llama-3.1-8b,h100-sxm,1,128,128,4,fp8\nb,llama-3.1-8b,h100-sxm,2,512,64,16,bf16\n")


def _cases(root: Path) -> str:
    """A two-case file of its own (the tests run without ../shared too)."""
    path = root / "cases.csv"
    path.write_text(CASE_ROWS)
    return str(path)


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    (tmp_path / "spaces").mkdir()
    (tmp_path / "spaces" / "s.toml").write_text(SMALL_SPACE)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def dse(capsys, *args):
    from dse.cli import main
    capsys.readouterr()
    rc = main([str(a) for a in args])
    return rc, capsys.readouterr().err.strip()


def faulted(rc, err, *needles, root=None):
    print(f"exit {rc}: {err}")
    assert rc == EXIT_ENVIRONMENT == 3, err
    assert len(err.splitlines()) == 1 and err.startswith("dse: error: "), err
    assert "internal error" not in err and "OSError" not in err, err
    for n in needles:
        assert n in err, err
    if root is not None:
        assert not [str(p) for p in Path(root).rglob("*.tmp")]


def _raiser(code: int, after=None):
    def boom(*args, **kw):
        if after is not None:
            after(*args, **kw)
        raise OSError(code, os.strerror(code))
    return boom


def test_predict_onto_a_full_disk_leaves_no_tmp(cwd, capsys, monkeypatch):
    from dse.scoring import predict

    def half(frame, f, header=True):             # some bytes written, then the disk is full
        f.write(b"case_id,ttft_s\n")
    monkeypatch.setattr(predict, "write_csv", _raiser(errno.ENOSPC, half))
    rc, err = dse(capsys, "predict", _cases(cwd), "--out", "pred.csv")
    faulted(rc, err, "pred.csv: no space left on the device", root=cwd)
    assert not (cwd / "pred.csv").exists()


@pytest.mark.parametrize("code,words", [(errno.EROFS, "read-only file system"),
                                        (errno.EACCES, "permission denied"),
                                        (errno.ENOSPC, "no space left on the device")])
def test_a_run_whose_files_cannot_be_written(cwd, capsys, monkeypatch, code, words):
    """The first durable write of a run (its manifest) refused: exit 3 naming it, no run folder
    or temporary file left."""
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: _raiser(code)() if str(b).endswith(
        "manifest.json") else real(a, b))
    rc, err = dse(capsys, "run", "spaces/s.toml", "--out", "runs/r", "--quiet")
    faulted(rc, err, "runs/r/manifest.json", words, root=cwd)
    assert not (cwd / "runs" / "r").exists()


def test_a_score_table_on_a_full_disk_mid_run(cwd, capsys, monkeypatch):
    """The disk fills after a run has scored: exit 3 naming the table, no .tmp, and the run
    resumes once there is room. (Score tables are written by pyarrow, with the space's
    fingerprint in their metadata: dse.search.tables.save_table.)"""
    import pyarrow.parquet as pq
    real = pq.write_table
    calls = []

    def write_table(table, where, *a, **kw):
        calls.append(where)
        if len(calls) == 3 and "chunk-" in str(where):
            Path(where).write_bytes(b"PAR1 half")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(table, where, *a, **kw)
    monkeypatch.setattr(pq, "write_table", write_table)
    rc, err = dse(capsys, "run", "spaces/s.toml", "--out", "runs/r", "--chunk-designs", "40",
                  "--quiet")
    faulted(rc, err, "runs/r/scores/chunk-", "no space left on the device", root=cwd)
    monkeypatch.setattr(pq, "write_table", real)
    rc, err = dse(capsys, "run", "--resume", "runs/r", "--quiet")
    assert rc == 0, err


def test_a_report_into_a_folder_that_refuses(cwd, capsys, monkeypatch):
    assert dse(capsys, "run", "spaces/s.toml", "--out", "runs/r", "--quiet")[0] == 0
    monkeypatch.setattr(Path, "write_text", _raiser(errno.EACCES))
    rc, err = dse(capsys, "report", "runs/r", "--out", "rep")
    faulted(rc, err, "rep", "permission denied", root=cwd)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="root writes into a read-only folder anyway")
def test_a_read_only_folder_for_real(cwd, capsys):
    ro = cwd / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        faulted(*dse(capsys, "predict", _cases(cwd), "--out", "ro/p.csv"), "ro/p.csv",
                "permission denied", root=cwd)
        faulted(*dse(capsys, "run", "spaces/s.toml", "--out", "ro/r", "--quiet"), "ro/r",
                "permission denied", root=cwd)
    finally:
        ro.chmod(0o700)


def test_which_oserrors_are_the_environments():
    cases = [(OSError(errno.ENOSPC, "No space left on device", "f"), "f: no space left"),
             (OSError("Error writing bytes to file. Detail: [errno 28] No space left on device"),
              "no space left"),                          # pyarrow's: no errno, only the text
             (PermissionError(errno.EACCES, "Permission denied", "g"), "g: permission denied"),
             (OSError(errno.EROFS, "Read-only file system"), "read-only file system")]
    for e, words in cases:
        f = EnvironmentFault.of(e)
        print(f"{e!r} -> {f}")
        assert f is not None and words in str(f)
    assert EnvironmentFault.of(FileNotFoundError(errno.ENOENT, "No such file", "x")) is None
    assert EnvironmentFault.of(OSError(errno.EIO, "I/O error")) is None


def test_the_exit_code_is_documented():
    from dse import cli, errors
    text = cli.build_parser().format_help()
    assert "exit codes:" in text and "3    disk full, read-only file system or permission" in text
    assert "- 3: the environment refused" in cli.__doc__ and "3 the\nenvironment" in errors.__doc__


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_lock_that_cannot_be_written_names_it_and_leaves_no_folder(cwd, capsys, monkeypatch,
                                                                    code):
    """A disk with no byte left fails already at the owner lock's text (pid and host): exit 3
    naming DIR/lock, and the new run folder is removed (found on a full 2 MB tmpfs: the folder
    with its lock, inputs/ and scores/ was left behind)."""
    from dse.search import locks
    monkeypatch.setattr(locks.os, "pwrite", _raiser(code))
    rc, err = dse(capsys, "run", "spaces/s.toml", "--out", "runs/full", "--quiet")
    faulted(rc, err, "runs/full/lock", root=cwd)
    assert not (cwd / "runs" / "full").exists()
