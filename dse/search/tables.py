"""Score tables (runs/<id>/scores/*.parquet) and a batch's trial file: read, checked, written.

A score table carries in its Parquet metadata the run's space fingerprint and its place in
the run (a chunk's design range, a batch's segment and first trial); a table that is not
whole, or not this run's, or not at its place, is refused naming it (``corrupt``), and
`dse repair` moves it aside (dse.search.repair)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from dse.search.files import atomic_save, corrupt, manifest_file


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

