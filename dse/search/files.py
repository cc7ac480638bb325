"""A run folder's files written whole or not at all, and the refusal of a corrupt one.

Every durable file of a run folder (dse.search.store) is written to a temporary file that
carries the writer's pid, then renamed over its place: a reader sees the old file or the new,
never half of one, and a killed writer's temporary file is swept (``remove_stale_tmp``) by the
next process that owns the folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

from dse.errors import InputError, writing


def atomic_write(path: Path, text: str) -> None:
    """``text`` into ``path``, whole or not at all (see ``atomic_save``)."""
    def write(tmp):
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    atomic_save(path, write)


def atomic_save(path: Path, write) -> None:
    """``write(tmp)`` then rename over ``path``; the temporary file never outlives a failure (its
    name has the pid: workers share folders); a full disk, a read-only file system or a denied
    permission is an ``EnvironmentFault`` naming ``path`` (exit 3)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with writing(path, tmp):
        write(tmp)
        os.replace(tmp, path)


def remove_stale_tmp(d: Path) -> None:
    """Temporary files of processes that are gone (the pid is in the name: workers share
    folders, a live one's file is left alone)."""
    for sub in (Path(d), Path(d) / "scores"):
        for f in sub.glob("*.tmp"):
            pid = f.suffixes[-2][1:] if len(f.suffixes) >= 2 else ""
            if not (pid.isdigit() and pid_alive(int(pid))):
                f.unlink(missing_ok=True)


def write_json(path: Path, obj) -> None:
    atomic_write(path, json.dumps(obj, indent=2, default=str) + "\n")



def manifest_file(d: Path) -> Path:
    return Path(d) / "manifest.json"



def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    except OSError:
        return False
    return True


REPAIR_HINT = "`dse repair DIR` moves it to DIR/quarantine/ and re-queues its work"


def corrupt(f: Path, what: str, e: Exception | None = None) -> InputError:
    why = f" ({type(e).__name__}: {str(e).splitlines()[0][:100]})" if e is not None and str(e) else ""
    return InputError(f"corrupt {what}{why}", file=str(f),
                      hint=REPAIR_HINT.replace("DIR", str(Path(f).parent.parent)
                                               if Path(f).parent.name == "scores"
                                               else str(Path(f).parent)))

