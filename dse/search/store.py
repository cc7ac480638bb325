"""Run folders: manifest, input snapshot, score tables, the front and progress, all atomic.

    runs/<id>/manifest.json        dse version, command, inputs and their hashes, strategy, seed
    runs/<id>/inputs/              a copy of the space file
    runs/<id>/scores/*.parquet     per work item: the admissible, non-dominated scored designs
    runs/<id>/front.csv            the current front (objectives, parameters, design_id)
    runs/<id>/progress.json        state and counters (what `dse status` prints)
    runs/<id>/front_breakdown.parquet  the front designs' per-op breakdown (dse.scoring.breakdown)
    runs/<id>/optuna.journal       the Optuna study of a local optuna/nested run (durable)
    runs/<id>/quarantine/          durable files `dse repair` found corrupt, moved aside

Durable files (score tables, their trials.json, the journal, the manifest) hold what was
computed; derived files (front.csv, progress.json and their counters) are rebuilt from them by
`dse status`, `dse run --resume` and `dse repair` whenever they are missing, corrupt or disagree.
A corrupt durable file is refused (exit 2, naming it) until `dse repair DIR` moves it aside and
re-queues its work.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import socket
import sys
from pathlib import Path

import pandas as pd

from dse import pareto
from dse.build.space import Objective, load_space, objectives_file
from dse.errors import InputError
from dse.scoring import train_space
from dse.search import locks
from dse.search.files import (
    REPAIR_HINT,
    atomic_save,
    manifest_file,
    remove_stale_tmp,
    write_json,
)
from dse.search.tables import check_table, read_table, read_trials
from dse.spec.csvsafe import spreadsheet_safe
from dse.spec.design import read_toml
from dse.spec.fields import legacy_columns, scale_column
from dse.version import __version__

STATES = ("running", "stopped", "finished", "failed")
# the metrics every score table keeps besides the run's objectives and constraints (what the
# report, comparisons, what-ifs and the short runs' surrogate read back)
KEEP_METRICS = ("ttft_s", "ttft_unloaded_s", "tpot_s", "output_tokens_per_s_per_chip",
                "output_tokens_per_s_per_rack", "usd_per_mtok_output", "usd_per_mtok_input",
                "num_chips", "bound", "feasible", "hbm_used_fraction")


def keep_metrics(space) -> tuple:
    """The metrics a score table of ``space`` keeps besides its objectives and constraints
    (a training space's: ``dse.scoring.train_space.KEEP_METRICS``)."""
    return train_space.KEEP_METRICS if space.task == "train" else KEEP_METRICS


def make_folders(d: Path) -> None:
    """A run folder's subfolders (its score tables, its input snapshot)."""
    (Path(d) / "scores").mkdir(parents=True, exist_ok=True)
    (Path(d) / "inputs").mkdir(exist_ok=True)



def write_manifest(d: Path, m: dict) -> None:
    write_json(manifest_file(d), m)


def update_manifest(d: Path, m: dict, **kv) -> dict:
    """``kv`` set in the manifest on disk (read again under the run's claim lock, so that
    processes sharing the folder never write back each other's stale copies) and in ``m``."""
    with locks.claim(d):
        disk = json.loads(manifest_file(d).read_text())
        disk.update(kv)
        write_manifest(d, disk)
    m.update(kv)
    return m


def write_progress(d: Path, progress: dict) -> None:
    write_json(Path(d) / "progress.json", progress)


def new_run_dir(space_name: str, out: str | None) -> Path:
    """A new, empty run folder (created). A run that then fails or is refused before it has
    computed anything removes it again (``discard``)."""
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
    make_folders(d)
    return d


def discard(d: Path, existed: bool = False) -> None:
    """Remove a run folder that holds no computed result (a failed or refused start); one that
    existed before (an empty --out) is emptied, not removed."""
    d = Path(d)
    if not d.is_dir() or any((d / "scores").glob("*.parquet")):
        return
    if existed:
        for f in d.iterdir():
            shutil.rmtree(f) if f.is_dir() else f.unlink()
    else:
        shutil.rmtree(d, ignore_errors=True)


def snapshot_inputs(space_file: str, d: Path) -> list[str]:
    """Copy the space file and the objectives file it names into the run folder, laid out so
    that the copy's relative reference resolves to the copy (``inputs/<space>``,
    ``objectives/<file>`` or ``inputs/<sub>/<file>``). Returns the copies' paths in the run."""
    src = Path(space_file)
    shutil.copy2(src, d / "inputs" / src.name)
    out = [f"inputs/{src.name}"]
    spec = read_toml(str(src)).get("objectives")
    if isinstance(spec, str):
        path = objectives_file(spec, str(src), src.parent)
        target = (Path(d) / "inputs" / os.path.relpath(path, src.parent.resolve())).resolve()
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        out.append(os.path.relpath(target, Path(d).resolve()))
    return out


def inputs_payload(d: Path, m: dict) -> str:
    """The run's input snapshot as JSON {path in the run folder: text}, for remote workers."""
    files = m.get("inputs") or [f"inputs/{Path(m['space_file']).name}"]
    return json.dumps({f: (Path(d) / f).read_text() for f in files if (Path(d) / f).is_file()})


def write_inputs(d: Path, payload: str) -> None:
    root = Path(d).resolve()
    for rel, text in json.loads(payload).items():
        target = (root / rel).resolve()
        if root not in target.parents:
            raise InputError(f"an input path {rel!r} leaves the run folder", file=str(d))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def space_snapshot(d: Path, m: dict) -> Path:
    """The run's own copy of its space file (what resume, workers and reports read)."""
    return Path(d).resolve() / "inputs" / Path(m["space_file"]).name


def space_of(d: Path, m: dict | None = None):
    """The run's space, loaded from its own copy of the space file (the original file when a
    run folder from before the copies has none, or its copy cannot be read and the original
    still can): the one loader of a run's space, what resume, workers, reports, what-ifs,
    comparisons and the terminal read."""
    m = load_manifest(d) if m is None else m
    snap = space_snapshot(d, m)
    if snap.is_file():
        try:
            return load_space(str(snap))
        except InputError:
            if not Path(m["space_file"]).is_file():   # e.g. objectives in a file next to it
                raise
    return load_space(str(m["space_file"]))


def scaled_paths(d: Path, m: dict) -> list[str]:
    """The paths a run's space gives as scale factors (read from its copy of the space file),
    to name their columns ``<path>.scale`` in an old run folder's tables."""
    try:
        params = read_toml(str(space_snapshot(d, m))).get("parameters") or {}
    except InputError:
        return []
    return [p for p, spec in params.items() if isinstance(spec, dict) and "scale" in spec]


def chunk_file(d: Path, i: int) -> Path:
    """The score table of the exhaustive strategy's chunk ``i``."""
    return Path(d) / "scores" / f"chunk-{i:08d}.parquet"


def chunk_ids(d: Path) -> set[int]:
    """The exhaustive strategy's chunks whose score tables are on disk."""
    return {int(f.stem.split("-")[1]) for f in score_tables(d, "chunk")}


def batch_files(d: Path, segment: int, first: int) -> tuple[Path, Path]:
    """The score table and trials file of the optuna strategy's batch starting at trial
    ``first`` of study segment ``segment``."""
    stem = Path(d) / "scores" / f"batch-{segment:03d}-{first:09d}"
    return stem.with_suffix(".parquet"), stem.with_suffix(".trials.json")


def complete_batches(d: Path, clean: bool = True) -> tuple[pd.DataFrame, dict]:
    """Designs and per-trial results of every complete batch; a batch whose trial file is missing
    (the process died while writing it) is removed, its trials are asked again. ``clean=False``
    (a worker joining a run folder others may be writing): incomplete batches are only skipped."""
    frames, told = [], {}
    for f in score_tables(d, "batch"):
        tf = f.with_suffix(".trials.json")
        if not tf.is_file():
            if clean:
                f.unlink()
            continue
        frames.append(read_table(f))     # a corrupt table or trials file: refused, named
        segment = int(f.stem.split("-")[1])
        told.update({(segment, int(k)): v for k, v in read_trials(tf).items()})
    if clean:
        remove_stale_tmp(d)
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()), told


def front_file(d: Path) -> Path:
    """A run's (or a report's, a what-if's) front.csv."""
    return Path(d) / "front.csv"


def breakdown_file(d: Path) -> Path:
    """The per-op breakdown of a run's front designs (derived: rewritten when a run stops)."""
    return Path(d) / "front_breakdown.parquet"


def write_breakdown(d: Path, table: pd.DataFrame) -> None:
    atomic_save(breakdown_file(d), lambda p: table.to_parquet(p, index=False))


def read_breakdown(d: Path) -> pd.DataFrame | None:
    """front_breakdown.parquet, or None when it is missing or unreadable (it is derived)."""
    try:
        t = pd.read_parquet(breakdown_file(d))
    except Exception:           # missing, partial or corrupt: the reader recomputes it
        return None
    return t if "design_id" in t else None


def journal_file(d: Path) -> Path:
    """The Optuna journal of a local optuna/nested run (absolute: any cwd resumes it)."""
    return Path(d).resolve() / "optuna.journal"


def score_tables(d: Path, kind: str = "*") -> list[Path]:
    """The run's score tables, sorted: every one (``kind="*"``), the exhaustive strategy's
    chunks (``"chunk"``) or the optuna strategy's batches (``"batch"``)."""
    return sorted((Path(d) / "scores").glob(f"{kind}-*.parquet" if kind != "*" else "*.parquet"))


def create(d: Path, space, strategy: str, seed: int, extra: dict) -> dict:
    inputs = snapshot_inputs(space.file, d)
    manifest = {
        "dse_version": __version__, "created": dt.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join(["dse", *sys.argv[1:]]), "python": sys.version.split()[0],
        "space_file": str(Path(space.file).resolve()), "space_digest": space.digest,
        "space_name": space.name, "question": space.question, "strategy": strategy, "seed": seed,
        "size": space.size, "parameters": space.columns,
        "objectives": [o.to_dict() for o in space.objectives],
        "constraints": [{"metric": c.metric, "max": c.max, "min": c.min} for c in space.constraints],
        "inputs": inputs,
        **({"task": space.task} if space.task != "serve" else {}),
        **extra,
    }
    manifest["fingerprint"] = manifest_fingerprint(manifest)
    write_manifest(d, manifest)
    return manifest


# the manifest's entries that never change over a run's life: their hash is kept with them, so
# that an edited size or chunk size (which would change what every score table means) is refused
FINGERPRINT_KEYS = ("space_digest", "size", "chunk_designs", "strategy", "study_name", "seed")


def manifest_fingerprint(m: dict) -> str:
    import hashlib
    return hashlib.sha256(json.dumps([m.get(k) for k in FINGERPRINT_KEYS],
                                     default=str).encode()).hexdigest()[:16]


def load_manifest(d: Path) -> dict:
    f = manifest_file(d)
    if not Path(d).is_dir():
        raise InputError("run folder not found", file=str(d), hint="give the folder `dse run` printed")
    if not f.is_file():
        raise InputError("not a run folder (no manifest.json)", file=str(d),
                         hint="give the folder `dse run` printed")
    try:
        m = json.loads(f.read_bytes().decode("utf-8"))
        if not isinstance(m, dict):
            raise TypeError(f"a JSON {type(m).__name__}, not an object")
        for key, kind in MANIFEST_KEYS.items():
            if not isinstance(m[key], kind):
                raise TypeError(f"{key} is {m[key]!r}, not a {kind.__name__}")
    except (ValueError, KeyError, TypeError) as e:     # UnicodeDecodeError, JSONDecodeError too
        why = " ".join(f"{type(e).__name__}: {e}".split())[:160]
        raise InputError(f"corrupt manifest ({why})", file=str(f),
                         hint="the run cannot be read; start a new one") from None
    if "fingerprint" in m and m["fingerprint"] != manifest_fingerprint(m):
        changed = ", ".join(FINGERPRINT_KEYS[:3])
        raise InputError(f"corrupt manifest (its fixed entries ({changed}, ...) were edited: "
                         "they no longer match its fingerprint)", file=str(f),
                         hint="restore the values the run was made with, or start a new run")
    check_layout(d)
    return m


MANIFEST_KEYS = {"dse_version": str, "strategy": str, "objectives": list, "space_file": str}


def check_layout(d: Path) -> None:
    """The run folder's own paths are what they should be (``scores`` a folder, the journal's
    lock a file): else refused, naming the path, with the repair that heals it."""
    for p, kind in layout_problems(Path(d)):
        raise InputError(f"{p.name} is {kind}", file=str(p),
                         hint=REPAIR_HINT.replace("DIR", str(d)))


def layout_problems(d: Path) -> list[tuple[Path, str]]:
    """The run folder's paths of the wrong kind: (path, what it is instead)."""
    bad = []
    scores = d / "scores"
    if scores.exists() and not scores.is_dir():
        bad.append((scores, "a file, not the folder of score tables"))
    for name in ("optuna.journal.flock", "lock", "claim.flock", "progress.json", "front.csv"):
        if (d / name).is_dir():
            bad.append((d / name, "a folder, not a file"))
    if (d / "live").exists() and not (d / "live").is_dir():
        bad.append((d / "live", "a file, not the folder of processes at work"))
    return bad


def check_version(m: dict, d: Path) -> None:
    if not isinstance(m.get("dse_version"), str):
        raise InputError(f"dse_version is {m.get('dse_version')!r}, not a version string",
                         file=str(manifest_file(d)), hint="the run cannot be resumed")
    if m["dse_version"].split(".")[:2] != __version__.split(".")[:2]:
        raise InputError(f"the run was made by dse {m['dse_version']}, this is dse {__version__}",
                         file=str(d), hint="resume it with that version, or start a new run")


def read_progress(d: Path) -> dict:
    """progress.json, or {} when it is missing or corrupt (it is derived: rebuilt from the
    durable files by whoever writes it next)."""
    f = Path(d) / "progress.json"
    try:
        p = json.loads(f.read_text())
    except (OSError, ValueError):
        return {}
    return p if isinstance(p, dict) else {}


def write_front(d: Path, front: pd.DataFrame, objectives, parameters) -> None:
    """front.csv: objectives, parameter columns, design_id. A parameter named by its path whose
    table column is ``<path>.scale`` (a scale factor) is written under that column."""
    parameters = [scale_column(c) if c not in front and scale_column(c) in front else c
                  for c in parameters]
    cols = [o["name"] if isinstance(o, dict) else o.metric for o in objectives] + list(parameters)
    cols = list(dict.fromkeys(cols)) + ["design_id"]
    out = front[cols] if len(front) else pd.DataFrame(columns=cols)
    atomic_save(Path(d) / "front.csv", lambda p: spreadsheet_safe(out).to_csv(p, index=False))



def worker_name() -> str:
    """The process that scores a batch, as its trial file records it: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


UNRECORDED = "unrecorded"     # trials of batches written before the worker was recorded


def _chunk_designs(m: dict, i: int) -> int:
    chunk, size = int(m.get("chunk_designs", 65536)), int(m.get("size") or 0)
    return max(min((i + 1) * chunk, size) - i * chunk, 0)


def durable(d: Path, m: dict, check: bool = True) -> dict | None:
    """Counters from the durable files of a local run (None for a shared-storage run, whose
    counters live in the storage): trials completed, designs scored, trials total."""
    d = Path(d)
    if m.get("storage"):
        return None
    if m["strategy"] == "exhaustive":
        files = sorted((d / "scores").glob("chunk-*.parquet"))
        if check:
            for f in files:
                check_table(f)
        done = [int(f.stem.split("-")[1]) for f in files]
        n_chunks = -(-int(m.get("size") or 0) // int(m.get("chunk_designs", 65536)))
        return {"trials_completed": len(done), "designs_scored": sum(_chunk_designs(m, i) for i in done),
                "trials_total": n_chunks}
    n, by_worker = 0, {}
    for f in sorted((d / "scores").glob("batch-*.trials.json")):
        if not f.with_name(f.name.replace(".trials.json", ".parquet")).is_file():
            continue
        if check:
            check_table(f.with_name(f.name.replace(".trials.json", ".parquet")))
        t = read_trials(f)
        n += len(t)
        for r in t.values():        # the same files as the total: the counts add up to it
            w = str(r.get("worker", UNRECORDED))
            by_worker[w] = by_worker.get(w, 0) + 1
    per = m.get("designs_per_trial")
    return {"trials_completed": n, "designs_scored": n * int(per) if per else None,
            "trials_total": int(m.get("trials", 0)),
            "trials_by_worker": dict(sorted(by_worker.items()))}


def front_from_tables(d: Path, m: dict) -> pd.DataFrame:
    """The run's front computed from its score tables (every table read, corrupt ones refused)."""
    objectives = [Objective(o["name"], o["direction"]) for o in m["objectives"]]
    frames = []
    for f in sorted((Path(d) / "scores").glob("*.parquet")):
        if f.name.startswith("batch-") and not f.with_suffix(".trials.json").is_file():
            continue                       # an incomplete batch: its trials are asked again
        t = read_table(f)
        if "_admissible" in t:
            t = t[t["_admissible"].astype(bool)]
        frames.append(t)
    # a run folder resumed across the scale-column rule: its old tables name <path>.scale <path>
    scaled = {c[:-len(".scale")] for t in frames for c in t.columns if c.endswith(".scale")}
    frames = [legacy_columns(t, [p for p in scaled if scale_column(p) not in t.columns])
              for t in frames] if scaled else frames
    return pareto.front_of(frames, objectives)


def read_front(d: Path) -> pd.DataFrame | None:
    """front.csv, or None when it is missing or unreadable."""
    try:
        f = pd.read_csv(Path(d) / "front.csv")
    except (OSError, ValueError, pd.errors.ParserError, pd.errors.EmptyDataError,
            UnicodeDecodeError):
        return None
    return f if "design_id" in f else None


def lock_owner(d: Path) -> int | None:
    """The pid of the process that owns the run folder now (``locks``: its flock, not the pid
    written in the file, decides), None when nobody does."""
    return locks.owner_pid(d)


def at_work(d: Path) -> bool:
    """Another process owns the run folder or works on it (a ``dse worker``) now."""
    return locks.at_work(d)


def status(d: Path, heal: bool = True) -> dict:
    """The run's state and counters. Counters of a local run are taken from its durable files
    (they agree with what is stored, also after kill -9); with ``heal``, a missing, corrupt or
    disagreeing progress.json or front.csv is rebuilt from them (when no process is at work)."""
    d = Path(d)
    m = load_manifest(d)
    p = read_progress(d)
    state = p.get("state", "stopped") if p.get("state") in STATES else "stopped"
    alive = at_work(d)
    if state == "running" and not alive:
        state = "stopped"   # killed: the work it finished is on disk
    counts = durable(d, m)
    front = read_front(d)
    front_size = len(front) if front is not None else None
    rebuild_front = counts is not None and (
        front is None or not p or front_size != p.get("front_size"))
    if rebuild_front:
        fr = front_from_tables(d, m)
        front_size = len(fr)
        if heal and not alive:
            write_front(d, fr, m["objectives"], m["parameters"])
    if counts is not None:
        if counts["designs_scored"] is None:
            counts["designs_scored"] = int(p.get("designs_scored", 0))
        if state == "finished" and counts["trials_completed"] < counts["trials_total"]:
            state = "stopped"       # work was re-queued (dse repair): not finished any more
        if state in ("stopped", "failed") and counts["trials_total"] and \
                counts["trials_completed"] >= counts["trials_total"]:
            state = "finished"
    else:
        counts = {k: p.get(k) for k in ("trials_completed", "designs_scored", "trials_total")}
    out = {
        "state": state, "trials_completed": int(counts["trials_completed"] or 0),
        "trials_failed": int(p.get("trials_failed", 0)),
        "designs_scored": int(counts["designs_scored"] or 0),
        "elapsed_s": float(p.get("elapsed_s", 0.0)), "front_size": int(front_size or 0),
        "objectives": m["objectives"], "strategy": m["strategy"], "space_size": m.get("size"),
        "trials_total": counts["trials_total"], "hypervolume": p.get("hypervolume"),
        "run_dir": str(d),
    }
    if counts.get("trials_by_worker"):
        out["trials_by_worker"] = counts["trials_by_worker"]   # host:pid -> trials; sum = total
    if heal and not alive and m.get("storage") is None and (
            not p or rebuild_front or any(p.get(k) != out[k] for k in
                                          ("state", "trials_completed", "designs_scored",
                                           "front_size"))):
        write_progress(d, {k: out[k] for k in (
            "state", "trials_completed", "trials_failed", "trials_total", "designs_scored",
            "elapsed_s", "front_size", "hypervolume")})
    return out


def fix_reference(manifest: dict, d: Path, F) -> dict:
    """The run's hypervolume reference point and scale, set once from its first front and
    stored in the manifest so that every later figure (and a comparison) uses the same one
    (the first of the processes sharing a run folder to set it sets it for all)."""
    if manifest.get("reference") is None and len(F):
        with locks.claim(d):
            disk = json.loads(manifest_file(d).read_text()).get("reference")
            if disk is None:
                point, scale = pareto.reference(F)
                disk = {"point": point.tolist(), "scale": scale.tolist()}
                update_manifest(d, manifest, reference=disk)
            manifest["reference"] = disk
    return manifest.get("reference")
