"""`dse repair DIR`: a run's corrupt durable files moved to DIR/quarantine/ (their work is done
again on `dse run --resume`) and its derived files rebuilt."""

from __future__ import annotations

import os
import time
from pathlib import Path

from dse.errors import InputError
from dse.search import locks
from dse.search.files import manifest_file, remove_stale_tmp
from dse.search.journal import open_journal
from dse.search.store import layout_problems, load_manifest, status, write_manifest
from dse.search.tables import read_table, read_trials


def quarantine(d: Path, f: Path) -> Path:
    q = Path(d) / "quarantine"
    (q / f.parent.relative_to(d)).mkdir(parents=True, exist_ok=True)
    target = q / f.relative_to(d)
    if target.exists():
        target = target.with_name(f"{target.name}.{int(time.time())}")
    os.replace(f, target)
    return target


def heal_layout(d: Path) -> list[str]:
    """``repair``: paths of the wrong kind moved to quarantine/ (a missing lock or scores folder
    is made again; a journal or derived file that was a folder is gone: its work is redone)."""
    done = []
    for p, kind in layout_problems(Path(d)):
        moved = quarantine(d, p)
        if p.name in ("scores", "live"):
            p.mkdir()
        done.append(f"quarantined {p.relative_to(d)} ({kind}) to {moved.relative_to(d)}")
    return done


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
        if layout_problems(d):
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
                quarantine(d, g)
        what = ("its designs are scored again" if f.name.startswith("chunk-")
                else "its trials are asked again")
        done.append(f"quarantined {f.relative_to(d)}{' and ' + tf.name if tf.exists() or f.name.startswith('batch-') else ''}"
                    f" ({why}): {what} by `dse run --resume`")
    for tf in sorted((d / "scores").glob("batch-*.trials.json")):    # without a table
        if not tf.with_name(tf.name.replace(".trials.json", ".parquet")).is_file():
            quarantine(d, tf)
            done.append(f"quarantined {tf.relative_to(d)} (no score table): its trials are asked again")
    j = d / "optuna.journal"
    if j.is_file() and m["strategy"] in ("optuna", "nested") and not m.get("storage"):
        try:
            open_journal(d)          # replays every record: a broken one is refused
        except InputError as e:
            moved = quarantine(d, j)
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


