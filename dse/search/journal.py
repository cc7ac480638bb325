"""The journal of a local optuna/nested run: its lock, its recovery after a kill, its storage."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

from dse.errors import InputError
from dse.search.files import corrupt

LOCK_WAIT_S = 120.0     # the longest a process waits for the journal's lock before giving up
LOCK_REPORT_S = 10.0    # ... and when it says what it is waiting for


class JournalLock:
    """The journal's lock for Optuna's JournalFileBackend (its ``lock_obj``): an ``flock`` on
    ``<journal>.flock``, which the kernel releases when its holder exits, kill -9 included, so
    a lock is never left behind. The holder writes its pid and host into the file, so a wait
    (bounded: LOCK_WAIT_S) says whom it waits for."""

    def __init__(self, journal: Path, wait_s: float = LOCK_WAIT_S):
        self.path, self.wait_s, self.fd = str(journal) + ".flock", wait_s, None

    def owner(self) -> str:
        try:
            return Path(self.path).read_text().strip() or "unknown"
        except OSError:
            return "unknown"

    def acquire(self) -> bool:
        import fcntl
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        t0, delay, told = time.monotonic(), 0.0005, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - t0
                if waited >= self.wait_s:
                    os.close(fd)
                    raise InputError(f"the journal has been locked for {waited:.0f} s by "
                                     f"{self.owner()}", file=self.path,
                                     hint="that process is stuck: stop it, then resume") from None
                if waited >= LOCK_REPORT_S and not told:
                    print(f"dse: warning: waiting for the journal lock {self.path} held by "
                          f"{self.owner()} (giving up after {self.wait_s:.0f} s)", file=sys.stderr)
                    told = True
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
        me = f"pid {os.getpid()} on {socket.gethostname()}\n".encode()
        if os.pread(fd, len(me) + 1, 0) != me:
            # written only when another process held it last: a truncate and write on every
            # acquisition (each journal record takes one) cost ~3 ms each on a slow disk, ~40%
            # of a long optuna run's wall time (python -m dse.search.bench's rate check)
            os.ftruncate(fd, 0)
            os.pwrite(fd, me, 0)
        self.fd = fd
        return True

    def release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)             # closing the descriptor releases the flock


def recover_journal(f: Path) -> int:
    """A journal cut mid-record (a process killed while appending) is cut back to its last
    whole record, under the lock, before anything is appended after it; the cut bytes go to
    ``quarantine/``. Returns the bytes cut."""
    f = Path(f)
    if not f.is_file() or f.stat().st_size == 0:
        return 0
    lock = JournalLock(f)
    lock.acquire()
    try:
        with open(f, "rb+") as fh:
            size = fh.seek(0, 2)
            pos, tail = size, b""
            while pos > 0:
                step = min(65536, pos)
                fh.seek(pos - step)
                block = fh.read(step)
                k = block.rfind(b"\n")
                if k >= 0:
                    tail = block[k + 1:] + tail
                    pos = pos - step + k + 1
                    break
                tail = block + tail
                pos -= step
            else:
                pos = 0
            if not tail:
                return 0
            q = f.parent / "quarantine"
            q.mkdir(exist_ok=True)
            (q / f"{f.name}.cut-{int(time.time())}").write_bytes(tail)
            fh.truncate(pos)
            fh.flush()
            os.fsync(fh.fileno())
    finally:
        lock.release()
    print(f"dse: warning: {f} ended in a partial record ({len(tail)} bytes, a process killed "
          "while writing): cut back to its last whole record", file=sys.stderr)
    return len(tail)


def open_journal(d: Path):
    """The Optuna storage of a local run: its journal (absolute path, so any cwd resumes it),
    recovered to its last whole record, locked by ``JournalLock``."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    f = Path(d).resolve() / "optuna.journal"
    old = Path(str(f) + ".lock")      # Optuna's symlink lock, left by older dse runs
    if old.is_symlink() or old.exists():
        old.unlink(missing_ok=True)
    recover_journal(f)
    try:
        return JournalStorage(JournalFileBackend(str(f), lock_obj=JournalLock(f)))
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, AssertionError) as e:
        raise corrupt(f, "journal", e) from None        # a record is broken (a garbage line)

