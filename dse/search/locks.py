"""Who works on a run folder, decided atomically with ``flock`` (the kernel releases a lock when
its holder exits, kill -9 included, so no lock is ever left behind by a dead process).

    DIR/lock           the owner: the one process that creates, resumes (``dse run --resume``)
                       or repairs (``dse repair``) the run. Taken (LOCK_EX) before anything of the
                       run folder is read and held until the process is done; a second one is
                       refused at once, naming the holder's pid. The file's text (pid, host) is
                       for people: a pid in it never decides anything.
    DIR/live/<token>   one per process at work on an optuna/nested run (its owner and every
                       ``dse worker``), held for the process's lifetime; its text lists the
                       trials the process holds RUNNING. A trial running in the study that no
                       live process holds belongs to a dead one: it is failed (or told from its
                       stored batch) and asked again.
    DIR/claim.flock    the short lock under which trials are counted against the run's total,
                       asked, handed out and recovered: N processes finish exactly the trials
                       asked, none ever fails another's live trial.

A lock probe (``held``) takes the lock shared for an instant; an owner that finds its lock
taken retries for ``PROBE_RETRY_S`` before it concludes the run is busy.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
import uuid
from pathlib import Path

from dse.errors import EnvironmentFault, InputError

PROBE_RETRY_S = 0.5      # a lock found taken is tried again this long (a probe holds it briefly)
_HELD: dict[str, int] = {}     # lock paths this process holds -> descriptor
_LIVE: dict[str, Live] = {}  # run folder -> this process's live token there


def _key(d: Path) -> str:
    return str(Path(d).resolve())


def me() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}"


def _flock(fd: int, how: int) -> bool:
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _k(path) -> str:
    return os.path.realpath(path)


def held(path: Path) -> bool:
    """Whether another process holds ``path``'s flock now (a missing file: nobody)."""
    if _k(path) in _HELD:
        return False            # ours
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return False
    try:
        if _flock(fd, fcntl.LOCK_SH):
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        return True
    finally:
        os.close(fd)


def _take(path: Path, text: str, wait_s: float = PROBE_RETRY_S) -> int | None:
    """The flock of ``path`` taken exclusively (its file made if need be, ``text`` written into
    it), or None when another process holds it for ``wait_s``. A file unlinked by its previous
    holder between our open and our lock is opened again (the lock is on the path's file)."""
    t0 = time.monotonic()
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if _flock(fd, fcntl.LOCK_EX):
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                try:
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, text.encode(), 0)
                except OSError as e:       # a full or read-only disk: the holder's text unwritten
                    os.close(fd)
                    raise EnvironmentFault.of(e, str(path)) or e from None
                _HELD[_k(path)] = fd
                return fd
        os.close(fd)
        if time.monotonic() - t0 >= wait_s:
            return None
        time.sleep(0.02)


def _drop(path: Path, unlink: bool) -> None:
    fd = _HELD.pop(_k(path), None)
    if fd is None:
        return
    if unlink:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)      # while still held: a waiter re-opens the path (``_take``)
    os.close(fd)


def holder_text(path: Path) -> str:
    try:
        return Path(path).read_text().split("\n")[0].strip() or "unknown"
    except (OSError, UnicodeDecodeError):
        return "unknown"


# --- the owner --------------------------------------------------------------------------------

def owner_file(d: Path) -> Path:
    return Path(d) / "lock"


def owner_busy(d: Path) -> bool:
    """Another process owns the run folder (creates, resumes or repairs it) now."""
    return held(owner_file(d))


def owner_pid(d: Path) -> int | None:
    """The pid the owner lock's holder wrote (None when nobody holds the lock)."""
    if not owner_busy(d):
        return None
    try:
        return int(holder_text(owner_file(d)).split()[1])
    except (IndexError, ValueError):
        return None


def acquire_owner(d: Path, what: str = "run") -> None:
    """This process owns the run folder until ``release_owner`` (or its exit), or InputError
    naming the owner. Taken again by the same process: nothing to do."""
    f = owner_file(d)
    if _k(f) in _HELD:
        return
    if f.is_dir():
        raise InputError("lock is a folder, not a file", file=str(f),
                         hint=f"`dse repair {d}` moves it to {d}/quarantine/")
    if _take(f, f"{me()}\n") is None:
        raise InputError(f"the run is in use by {holder_text(f)} (its owner: a run, a resume "
                         "or a repair)", file=str(d),
                         hint=f"wait for it to finish, or join it with `dse worker {d}`"
                         if what == "run" else "wait for it to finish, or stop it first")


def release_owner(d: Path) -> None:
    _drop(owner_file(d), unlink=True)


@contextlib.contextmanager
def owning(d: Path, what: str = "run"):
    """The owner lock held for the block (taken again by its holder: kept, not released)."""
    mine = _k(owner_file(d)) in _HELD
    acquire_owner(d, what)
    try:
        yield
    finally:
        if not mine:
            release_owner(d)


# --- processes at work and the trials they hold -----------------------------------------------

class Live:
    """This process's token in DIR/live/: held while it works on the run; ``hold(trials)``
    records the RUNNING trials it holds (call under ``claim``)."""

    def __init__(self, d: Path):
        self.dir = Path(d) / "live"
        self.dir.mkdir(exist_ok=True)
        self.name = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.path = self.dir / self.name
        self.fd = _take(self.path, json.dumps({"who": me(), "trials": []}) + "\n")
        _LIVE[_key(d)] = self

    def hold(self, trials, echoes=()) -> None:
        text = json.dumps({"who": me(), "trials": [list(t) for t in trials],
                           "echoes": [list(t) for t in echoes]}) + "\n"
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, text.encode(), 0)

    def close(self) -> None:
        for k, v in list(_LIVE.items()):
            if v is self:
                del _LIVE[k]
        _drop(self.path, unlink=True)


def others(d: Path) -> dict[str, dict]:
    """Other processes at work on the run: token -> {"trials": [[segment, number]], "echoes":
    [...]}; tokens of dead processes are removed (call under ``claim``)."""
    out = {}
    live = Path(d) / "live"
    if not live.is_dir():
        return out
    mine = _LIVE.get(_key(d))
    for f in live.iterdir():
        if mine is not None and f.name == mine.name:
            continue
        if not held(f):
            with contextlib.suppress(OSError):
                f.unlink()         # a dead process's token (the lock is free)
            continue
        try:
            rec = json.loads(f.read_text() or "{}")
        except (OSError, ValueError):
            rec = {}
        out[f.name] = rec if isinstance(rec, dict) else {}
    return out


def at_work(d: Path) -> bool:
    """Any other process owns the run folder or works on it now."""
    return owner_busy(d) or bool(_live_names(d))


def _live_names(d: Path) -> list[str]:
    live = Path(d) / "live"
    if not live.is_dir():
        return []
    mine = _LIVE.get(_key(d))
    return [f.name for f in live.iterdir() if (mine is None or f.name != mine.name) and held(f)]


@contextlib.contextmanager
def claim(d: Path):
    """The run's claim lock (blocking: held by others for a few milliseconds at a time)."""
    f = Path(d) / "claim.flock"
    if _k(f) in _HELD:          # re-entrant within one process
        yield
        return
    fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _HELD[_k(f)] = fd
        try:
            yield
        finally:
            del _HELD[_k(f)]
    finally:
        os.close(fd)
