"""Run folders: manifest, input snapshot, score tables, the front and progress, all atomic.

    runs/<id>/manifest.json        dse version, command, inputs and their hashes, strategy, seed
    runs/<id>/inputs/              a copy of the space file
    runs/<id>/scores/*.parquet     per work item: the admissible, non-dominated scored designs
    runs/<id>/front.csv            the current front (objectives, parameters, design_id)
    runs/<id>/progress.json        state and counters (what `dse status` prints)
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pandas as pd

from dse import __version__
from dse.errors import InputError

STATES = ("running", "stopped", "finished", "failed")


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")   # per process: workers share folders
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path: Path, obj) -> None:
    atomic_write(path, json.dumps(obj, indent=2, default=str) + "\n")


def new_run_dir(space_name: str, out: str | None) -> Path:
    if out:
        d = Path(out)
        if d.exists() and any(d.iterdir()):
            raise InputError("the run folder exists and is not empty", file=str(d),
                             hint="choose another --out, or continue it with `dse run --resume`")
    else:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", space_name)
        d = Path("runs") / f"{stamp}-{safe}"
        n = 1
        while d.exists():
            n += 1
            d = Path("runs") / f"{stamp}-{safe}-{n}"
    (d / "scores").mkdir(parents=True, exist_ok=True)
    (d / "inputs").mkdir(exist_ok=True)
    return d


def create(d: Path, space, strategy: str, seed: int, extra: dict) -> dict:
    shutil.copy2(space.file, d / "inputs" / Path(space.file).name)
    manifest = {
        "dse_version": __version__, "created": dt.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join(["dse", *sys.argv[1:]]), "python": sys.version.split()[0],
        "space_file": str(Path(space.file).resolve()), "space_digest": space.digest,
        "space_name": space.name, "question": space.question, "strategy": strategy, "seed": seed,
        "size": space.size, "parameters": [p.path for p in space.parameters],
        "objectives": [o.to_dict() for o in space.objectives],
        "constraints": [{"metric": c.metric, "max": c.max, "min": c.min} for c in space.constraints],
        **extra,
    }
    write_json(d / "manifest.json", manifest)
    return manifest


def load_manifest(d: Path) -> dict:
    f = Path(d) / "manifest.json"
    if not Path(d).is_dir():
        raise InputError("run folder not found", file=str(d), hint="give the folder `dse run` printed")
    if not f.is_file():
        raise InputError("not a run folder (no manifest.json)", file=str(d),
                         hint="give the folder `dse run` printed")
    try:
        m = json.loads(f.read_text())
        _ = m["dse_version"], m["strategy"], m["objectives"], m["space_file"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise InputError(f"corrupt manifest ({type(e).__name__}: {e})", file=str(f),
                         hint="the run cannot be read; start a new one") from None
    return m


def check_version(m: dict, d: Path) -> None:
    if m["dse_version"].split(".")[:2] != __version__.split(".")[:2]:
        raise InputError(f"the run was made by dse {m['dse_version']}, this is dse {__version__}",
                         file=str(d), hint="resume it with that version, or start a new run")


def read_progress(d: Path) -> dict:
    f = Path(d) / "progress.json"
    if not f.is_file():
        return {}
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError:
        raise InputError("corrupt progress.json", file=str(f),
                         hint="`dse run --resume` rebuilds it from the score tables") from None


def write_front(d: Path, front: pd.DataFrame, objectives, parameters) -> None:
    cols = [o["name"] if isinstance(o, dict) else o.metric for o in objectives] + list(parameters)
    cols = list(dict.fromkeys(cols)) + ["design_id"]
    out = front[cols] if len(front) else pd.DataFrame(columns=cols)
    tmp = d / f"front.csv.{os.getpid()}.tmp"
    out.to_csv(tmp, index=False)
    os.replace(tmp, d / "front.csv")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    except OSError:
        return False
    return True


def status(d: Path) -> dict:
    m = load_manifest(d)
    p = read_progress(d)
    state = p.get("state", "stopped")
    lock = Path(d) / "lock"
    if state == "running":
        try:
            alive = pid_alive(int(lock.read_text().strip()))
        except (OSError, ValueError):
            alive = False
        if not alive:
            state = "stopped"   # killed: the work it finished is on disk
    front = Path(d) / "front.csv"
    front_size = len(pd.read_csv(front)) if front.is_file() else 0
    return {
        "state": state, "trials_completed": int(p.get("trials_completed", 0)),
        "trials_failed": int(p.get("trials_failed", 0)),
        "designs_scored": int(p.get("designs_scored", 0)),
        "elapsed_s": float(p.get("elapsed_s", 0.0)), "front_size": front_size,
        "objectives": m["objectives"], "strategy": m["strategy"], "space_size": m.get("size"),
        "trials_total": p.get("trials_total"), "hypervolume": p.get("hypervolume"),
        "run_dir": str(d),
    }


class Working:
    """A run at work: its lock file (the pid, so `dse status` can tell a killed run), Ctrl-C and
    SIGTERM turned into a request to stop after the work item at hand, and a progress bar with
    rate, ETA, front size and hypervolume."""

    def __init__(self, d: Path, progress: bool, **bar):
        self.d, self.progress, self.bar_args, self.stop, self.bar = Path(d), progress, bar, False, None

    def _on_signal(self, signum, frame):
        self.stop = True

    def __enter__(self) -> "Working":
        import signal
        self._old = [signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)]
        (self.d / "lock").write_text(str(os.getpid()))
        if self.progress:
            from tqdm import tqdm
            self.bar = tqdm(dynamic_ncols=True, mininterval=0.5, **self.bar_args)
        return self

    def update(self, n: int, front_size: int, hv) -> None:
        if self.bar:
            self.bar.update(n)
            self.bar.set_postfix(front=front_size, hv=f"{hv:.4g}" if hv is not None else "-")

    def __exit__(self, *exc) -> None:
        import signal
        if self.bar:
            self.bar.close()
        for s, h in zip((signal.SIGINT, signal.SIGTERM), self._old):
            signal.signal(s, h)
        try:
            (self.d / "lock").unlink()
        except FileNotFoundError:
            pass


def fix_reference(manifest: dict, d: Path, F) -> dict:
    """The run's hypervolume reference point and scale, set once from its first front and
    stored in the manifest so that every later figure (and a comparison) uses the same one."""
    if manifest.get("reference") is None and len(F):
        from dse import pareto
        point, scale = pareto.reference(F)
        manifest["reference"] = {"point": point.tolist(), "scale": scale.tolist()}
        write_json(Path(d) / "manifest.json", manifest)
    return manifest.get("reference")
