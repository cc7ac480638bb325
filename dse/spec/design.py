"""Design files: one serving design as TOML sections of dotted spec paths.

    [accelerator]            # catalog id plus any field to override
    id = "h100-sxm"
    hbm_bw_bytes_per_s = 4.0e12
    [topology]               # optional; default: the accelerator's system
    id = "hgx-8"
    [model]
    id = "llama-3.1-70b"
    weight_dtype = "fp8"
    [layout]                 # tp/pp/ep/dp; give num_chips and leave some out to let dse choose
    tp = 4
    [workload]               # leave concurrency out for the offline maximum
    isl = 2048
    osl = 256
    concurrency = 64
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dse import catalog
from dse.errors import InputError, suggest
from dse.perf import METRICS
from dse.spec import fields, validate

SECTIONS = ("accelerator", "topology", "model", "layout", "workload", "serving", "cost")
# a space file: the sections of a base design and these top-level keys; objectives and
# constraints name numeric metrics of the scorer
SPACE_KEYS = ("question", "name", "parameters", "objectives", "constraints", "answer", "task",
              *SECTIONS)
NUMERIC_METRICS = tuple(m for m in METRICS if m not in ("bound", "feasible", "reason"))
DIRECTIONS = ("minimize", "maximize")


def flatten(doc: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in doc.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def read_toml(path: str) -> dict:
    p = Path(path)
    if not p.exists():
        raise InputError("file not found", file=path, hint="give the path of a TOML file")
    if not p.is_file():
        raise InputError("not a regular file", file=path, hint="give the path of a TOML file")
    limit = fields.LIMITS["TOML nesting depth"]
    try:
        doc = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"not valid TOML ({e})", file=path) from None
    except UnicodeDecodeError:
        raise InputError("not a text file", file=path) from None
    except RecursionError:  # tomllib recurses into nested arrays and inline tables
        raise InputError("tables or arrays nested too deeply to read", file=path,
                         hint=f"at most {limit} levels; limit: TOML nesting depth") from None
    if _depth(doc) > limit:
        raise InputError(f"tables or arrays nested more than {limit} levels deep", file=path,
                         hint=f"at most {limit} levels; limit: TOML nesting depth")
    return doc


def _depth(doc) -> int:
    """How deeply tables and arrays nest in a parsed TOML document (without recursion)."""
    deepest, todo = 0, [(doc, 0)]
    while todo:
        node, d = todo.pop()
        deepest = max(deepest, d)
        children = node.values() if isinstance(node, dict) else node
        todo.extend((c, d + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def load_design(path: str) -> dict:
    """The design as {dotted path: value}, every key checked against the settable paths."""
    return check_design(read_toml(path), path)


def check_design(doc: dict, path: str = "design") -> dict:
    """A design given as sections (``{"accelerator": {"id": ...}}``) or dotted paths
    (``{"accelerator.id": ...}``), or both, as {dotted path: value}, every key and value checked;
    ``path`` names it in errors."""
    doc = {k: v for k, v in doc.items()}
    dotted = {k: doc.pop(k) for k in list(doc) if "." in k and not isinstance(doc[k], dict)}
    for sec in doc:
        if sec not in SECTIONS:
            what = f"unknown section [{sec}]" if isinstance(doc[sec], dict) else \
                f"unknown top-level key {sec!r} (a design has only sections)"
            raise InputError(what, file=path, hint=suggest(sec, SECTIONS, "sections"))
    flat = {**flatten(doc), **dotted}
    valid = set(fields.paths(resolved_only=False))
    for key, v in flat.items():
        if key not in valid:
            raise InputError(f"unknown key {key!r}", file=path, hint=suggest(key, valid, "valid keys"))
        flat[key] = validate.check_value(key, v, file=path)
    for need in ("accelerator.id", "model.id"):
        if need not in flat:
            raise InputError(f"missing {need}", file=path,
                             hint=f"add [{need.split('.')[0]}] id = \"...\" (see `dse catalog list`)")
    for key, kind in (("accelerator.id", "accelerators"), ("model.id", "models"),
                      ("topology.id", "topologies")):
        if key in flat:
            catalog.lookup(kind, flat[key], file=path, where=key)
    return flat


def design_case(flat: dict) -> dict:
    """The design as one row of a predict case table (plus its other dotted overrides)."""
    row = {"case_id": "design", "hardware": flat["accelerator.id"], "model": flat["model.id"],
           "weight_dtype": flat.get("model.weight_dtype", "bf16"),
           "isl": flat.get("workload.isl", 1024), "osl": flat.get("workload.osl", 256)}
    lay = {k: flat[f"layout.{k}"] for k in ("tp", "pp", "ep", "dp") if f"layout.{k}" in flat}
    if "layout.num_chips" in flat:
        row["num_chips"] = flat["layout.num_chips"]
    else:
        row["num_chips"] = (lay.get("tp", 1) * lay.get("pp", 1) * lay.get("dp", 1))
        for k in ("tp", "pp", "dp"):
            lay.setdefault(k, 1)
        lay.setdefault("ep", 1)
    row.update(lay)
    mapping = {"topology.id": "topology", "model.kv_dtype": "kv_dtype",
               "workload.concurrency": "concurrency", "workload.prefix_hit_fraction":
               "prefix_hit_fraction", "workload.phase": "phase"}
    for k, col in mapping.items():
        if k in flat:
            row[col] = flat[k]
    skip = {"accelerator.id", "model.id", "model.weight_dtype", "workload.isl", "workload.osl",
            "layout.num_chips", *mapping, *(f"layout.{k}" for k in ("tp", "pp", "ep", "dp"))}
    row.update({k: v for k, v in flat.items() if k not in skip})
    return row


# --- writing TOML (a space or design given as a dict, a derived space) ----------------------

BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def toml_key(k: str, dotted: bool = False) -> str:
    """A key as TOML writes it: bare when it can be, else quoted (each part of a dotted key)."""
    if dotted:
        return ".".join(p if BARE_KEY.match(p) else json.dumps(p) for p in k.split("."))
    return k if BARE_KEY.match(k) else json.dumps(k)


def toml_value(v, finite: bool = True) -> str:
    """A value as TOML writes it (numpy scalars and arrays too). ``finite``: a NaN or infinity
    is refused (a space a person gave as a dict); else written as TOML's ``nan``/``inf``."""
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if not math.isfinite(v):
            if finite:
                raise InputError(f"{v} is not a finite number", file="space", hint="TOML values")
            return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple, np.ndarray)):
        return "[" + ", ".join(toml_value(x, finite) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{toml_key(str(k))} = {toml_value(x, finite)}"
                                for k, x in v.items()) + " }"
    raise InputError(f"{v!r} ({type(v).__name__}) cannot be written in a space file",
                     file="space", hint="strings, numbers, booleans, lists and tables")


def to_toml(doc: Mapping[str, Any]) -> str:
    """A space or design dict as TOML text (top-level values, then one table per section)."""
    top = [f"{toml_key(k)} = {toml_value(v)}" for k, v in doc.items()
           if not isinstance(v, Mapping)]
    tables = []
    for k, v in doc.items():
        if isinstance(v, Mapping):
            tables += ["", f"[{toml_key(k)}]",
                       *(f"{toml_key(str(kk))} = {toml_value(vv)}" for kk, vv in v.items())]
    return "\n".join(top + tables) + "\n"
