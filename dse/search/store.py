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
import time
from pathlib import Path

import pandas as pd

from dse import pareto
from dse.build.space import Objective, load_space, objectives_file
from dse.errors import InputError, writing
from dse.scoring import train_space
from dse.search import locks
from dse.search.progress import bar as progress_bar
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


def make_folders(d: Path) -> None:
    """A run folder's subfolders (its score tables, its input snapshot)."""
    (Path(d) / "scores").mkdir(parents=True, exist_ok=True)
    (Path(d) / "inputs").mkdir(exist_ok=True)


def manifest_file(d: Path) -> Path:
    return Path(d) / "manifest.json"


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
    for p, kind in _layout(Path(d)):
        raise InputError(f"{p.name} is {kind}", file=str(p),
                         hint=REPAIR_HINT.replace("DIR", str(d)))


def _layout(d: Path) -> list[tuple[Path, str]]:
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


def heal_layout(d: Path) -> list[str]:
    """``repair``: paths of the wrong kind moved to quarantine/ (a missing lock or scores folder
    is made again; a journal or derived file that was a folder is gone: its work is redone)."""
    done = []
    for p, kind in _layout(Path(d)):
        moved = _quarantine(d, p)
        if p.name in ("scores", "live"):
            p.mkdir()
        done.append(f"quarantined {p.relative_to(d)} ({kind}) to {moved.relative_to(d)}")
    return done


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


def read_table(f: Path) -> pd.DataFrame:
    """A score table; a file that is not a whole Parquet table, or whose fingerprint is not
    the run's (``check_fingerprint``), is refused, naming it."""
    import pyarrow.parquet as pq
    try:
        at = pq.read_table(f)
    except FileNotFoundError:
        raise
    except Exception as e:       # pyarrow raises several types for a broken file
        raise corrupt(f, "score table", e) from None
    check_fingerprint(f, at.schema.metadata)
    try:
        t = at.to_pandas()
    except Exception as e:
        raise corrupt(f, "score table", e) from None
    if "design_id" not in t:
        raise corrupt(f, "score table (no design_id column)")
    if f.name.startswith("chunk-") and len(t):
        lo, hi = _table_place(f, _run_manifest(f))["designs"]
        ids = t["design_id"].to_numpy()
        if ids.min() < lo or ids.max() >= hi:
            raise corrupt(f, f"score table (designs {ids.min()}..{ids.max()} outside its chunk's "
                             f"range {lo}..{hi - 1})")
    return t


def check_table(f: Path) -> None:
    """Cheap check (the Parquet footer) that a score table is whole and the run's."""
    import pyarrow.parquet as pq
    try:
        meta = pq.ParquetFile(f).schema_arrow.metadata
    except FileNotFoundError:
        raise
    except Exception as e:
        raise corrupt(f, "score table", e) from None
    check_fingerprint(f, meta)


TABLE_META = b"dse"     # a score table's Parquet key: the run's space fingerprint and its place


def save_table(path: Path, table: pd.DataFrame, m: dict) -> None:
    """A score table written whole then renamed, carrying (Parquet metadata ``dse``) the
    space's fingerprint (the space file's digest) and its place in the run: a chunk's design
    range, a batch's segment and first trial; checked on every read (``check_fingerprint``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    meta = json.dumps({"space_digest": m.get("space_digest"), **_table_place(path, m)})

    def write(p):
        t = pa.Table.from_pandas(table, preserve_index=False)
        pq.write_table(t.replace_schema_metadata({**(t.schema.metadata or {}),
                                                  TABLE_META: meta.encode()}), p)
    atomic_save(path, write)


def _table_place(f: Path, m: dict) -> dict:
    """Where a score table belongs, from its name and the manifest: a chunk's designs
    [first, stop), a batch's segment and first trial."""
    kind, rest = Path(f).stem.split("-", 1)
    if kind == "chunk":
        i, chunk = int(rest), int(m.get("chunk_designs", 65536))
        return {"designs": [i * chunk, min((i + 1) * chunk, int(m.get("size") or 0))]}
    segment, first = rest.split("-")[:2]
    return {"segment": int(segment), "first_trial": int(first)}


_MANIFESTS: dict = {}


def _run_manifest(f: Path) -> dict:
    """The manifest of the run a score table is in (DIR/scores/<table>), read once per change."""
    mf = manifest_file(Path(f).parent.parent)
    try:
        st = mf.stat()
    except OSError:
        return {}
    key = (str(mf), st.st_mtime_ns, st.st_size)
    if key not in _MANIFESTS:
        try:
            _MANIFESTS.clear()
            _MANIFESTS[key] = json.loads(mf.read_text())
        except (OSError, ValueError):
            return {}
    return _MANIFESTS[key]


def check_fingerprint(f: Path, metadata) -> None:
    """A score table carrying another space's fingerprint, or another place (a chunk's range,
    a batch's segment and first trial) than its name says in this run, is refused: a valid
    table copied over another. Tables written before fingerprints carry none (accepted)."""
    raw = (metadata or {}).get(TABLE_META)
    m = _run_manifest(f)
    if raw is None or not m:
        return
    try:
        meta = json.loads(raw)
        digest, place = meta.get("space_digest"), {k: v for k, v in meta.items()
                                                   if k != "space_digest"}
    except (ValueError, AttributeError):
        raise corrupt(f, "score table (unreadable fingerprint)") from None
    if m.get("space_digest") is not None and digest != m["space_digest"]:
        raise corrupt(f, f"score table (of another space: fingerprint {digest}, the run's "
                         f"{m['space_digest']})")
    want = _table_place(f, m)
    if place != want:
        raise corrupt(f, f"score table (made for {_place_words(place)}, its name here says "
                         f"{_place_words(want)})")


def _place_words(p: dict) -> str:
    if "designs" in p:
        lo, hi = p["designs"]
        return f"designs {lo}..{hi - 1}"
    return f"segment {p.get('segment')}, trials from {p.get('first_trial')}"


def read_trials(f: Path) -> dict:
    """A batch's trials.json: {trial number: {values, constraints}}, refused when corrupt."""
    try:
        t = json.loads(Path(f).read_text())
        if not isinstance(t, dict):
            raise ValueError("not an object")
        for k, v in t.items():
            int(k)
            if not (isinstance(v, dict) and isinstance(v["values"], list)
                    and isinstance(v["constraints"], list)):
                raise ValueError(f"trial {k} has no values/constraints")
    except FileNotFoundError:
        raise
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise corrupt(Path(f), "trials file", e) from None
    return t


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


def _quarantine(d: Path, f: Path) -> Path:
    q = Path(d) / "quarantine"
    (q / f.parent.relative_to(d)).mkdir(parents=True, exist_ok=True)
    target = q / f.relative_to(d)
    if target.exists():
        target = target.with_name(f"{target.name}.{int(time.time())}")
    os.replace(f, target)
    return target


def repair(d: Path) -> list[str]:
    """Quarantine a run's corrupt durable files (moved to DIR/quarantine/), so that their work
    is done again on `dse run --resume`, and rebuild its derived files. Returns what was done,
    one line each. Owns the run folder while it works (``locks``): refused while another
    process owns it or works on it, as `dse run --resume` is."""
    d = Path(d)
    if not manifest_file(d).is_file():
        load_manifest(d)                 # refused: not a run folder
    healed = heal_layout(d) if locks.owner_file(d).is_dir() else []    # the lock itself
    with locks.owning(d, "repair"):
        busy = locks.others(d)
        if busy:
            who = ", ".join(sorted(r.get("who", t) for t, r in busy.items()))
            raise InputError(f"the run is in use by {len(busy)} worker(s) ({who})", file=str(d),
                             hint="wait for them to finish, or stop them first")
        if _layout(d):
            healed += heal_layout(d)
        return _repair(d, healed)


def _repair(d: Path, healed: list[str]) -> list[str]:
    m = load_manifest(d)
    done = healed
    remove_stale_tmp(d)
    for f in sorted((d / "scores").glob("*.parquet")):
        tf = f.with_suffix(".trials.json")
        try:
            read_table(f)
            if f.name.startswith("batch-") and tf.is_file():
                read_trials(tf)
            continue
        except InputError as e:
            why = e.message
        for g in (f, tf):
            if g.is_file():
                _quarantine(d, g)
        what = ("its designs are scored again" if f.name.startswith("chunk-")
                else "its trials are asked again")
        done.append(f"quarantined {f.relative_to(d)}{' and ' + tf.name if tf.exists() or f.name.startswith('batch-') else ''}"
                    f" ({why}): {what} by `dse run --resume`")
    for tf in sorted((d / "scores").glob("batch-*.trials.json")):    # without a table
        if not tf.with_name(tf.name.replace(".trials.json", ".parquet")).is_file():
            _quarantine(d, tf)
            done.append(f"quarantined {tf.relative_to(d)} (no score table): its trials are asked again")
    j = d / "optuna.journal"
    if j.is_file() and m["strategy"] in ("optuna", "nested") and not m.get("storage"):
        try:
            open_journal(d)          # replays every record: a broken one is refused
        except InputError as e:
            moved = _quarantine(d, j)
            segs = [int(f.stem.split("-")[1]) for f in (d / "scores").glob("batch-*.parquet")]
            m["segment"] = max([int(m.get("segment", 0)), *segs]) + 1
            m["failed_before"] = int(m.get("failed_before", 0))
            write_manifest(d, m)
            done.append(f"quarantined optuna.journal to {moved.relative_to(d)} ({e.message}): "
                        f"the run continues in a new study segment {m['segment']}, warm-started "
                        "from its front; every scored trial is kept")
    (d / "front.csv").unlink(missing_ok=True)    # derived: rebuilt now from the durable files
    st = status(d)
    done.append(f"rebuilt front.csv and progress.json: {st['trials_completed']:,} trials, "
                f"{st['designs_scored']:,} designs, front of {st['front_size']}; state {st['state']}")
    if not done[:-1]:
        done.insert(0, "no corrupt file found")
    return done


# --- the journal of a local optuna/nested run -----------------------------------------------

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


class Interrupted(KeyboardInterrupt):
    """A run stopped by SIGINT/SIGTERM after its work item at hand: resumable; exit 128 + signal."""

    def __init__(self, signum: int, d: Path):
        self.signum, self.d = signum, d
        super().__init__(f"interrupted: the run is stopped and resumable "
                         f"(dse run --resume {d})")


class Working:
    """A run at work (its owner lock or live token is ``locks``'s, held by the caller): Ctrl-C
    and SIGTERM turned into a request to stop after the work item at hand (then ``Interrupted``
    is raised: exit 130 or 143, the run resumable), and a progress bar with rate, ETA, front
    size and hypervolume (``dse.search.progress.bar``: plain lines every few seconds when
    stderr is not a terminal)."""

    def __init__(self, d: Path, progress: bool, by_time: bool = False, **bar):
        self.d, self.progress, self.bar_args, self.stop, self.bar = Path(d), progress, bar, False, None
        self.signum, self.by_time = None, by_time
        self._said_reference = False

    def _on_signal(self, signum, frame):
        self.stop = True
        self.signum = signum

    def __enter__(self) -> "Working":
        import signal
        self._old = [signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)]
        if self.progress:
            self.bar = progress_bar(**self.bar_args)
        return self

    def update(self, n: int, front_size: int, hv, elapsed: float | None = None,
               done: int | None = None, reference: str | None = None) -> None:
        """``n`` more work items done; a bar ``by_time`` (a run with a budget) shows the
        budget's seconds spent instead, and the work done as a figure. ``reference``: the
        hypervolume's reference point in words, printed above the bar once it is set (the bar's
        ``hv`` is measured against it)."""
        if not self.bar:
            return
        if reference and not self._said_reference:
            self.bar.write(f"hv: the front's hypervolume, {reference}", file=sys.stderr)
            self._said_reference = True
        post = {"front": front_size, "hv": f"{hv:.4g}" if hv is not None else "-"}
        if self.by_time and elapsed is not None and done is not None:
            post = {"done": f"{done:,}", **post}
        self.bar.set_postfix(post, refresh=False)      # shown by the update (a log: one line)
        if self.by_time and elapsed is not None:
            self.bar.update(max(min(round(elapsed), self.bar.total) - self.bar.n, 0))
        else:
            self.bar.update(n)

    def __exit__(self, *exc) -> None:
        import signal
        if self.bar:
            self.bar.close()
        for s, h in zip((signal.SIGINT, signal.SIGTERM), self._old):
            signal.signal(s, h)
        if self.signum is not None and (not exc or exc[0] is None):
            raise Interrupted(self.signum, self.d)


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
