"""Search spaces: a base design plus parameters over dotted spec paths, objectives, constraints.

    question = "..."                 # what the space answers (shown in reports)
    [accelerator]                    # the base design, as in a design file
    id = "h100-sxm"
    [model]
    id = "llama-3.1-70b"
    [parameters]                     # dotted path = values
    "layout.tp" = [1, 2, 4, 8]                                   # a list
    "workload.concurrency" = { low = 1, high = 1024, num = 11, log = true }  # a range
    "accelerator.hbm_bw_bytes_per_s" = { scale = [1.0, 1.5, 2.0] }         # factors of the base
    [objectives]                     # metric = "minimize" | "maximize" (or objectives = "file")
    usd_per_mtok_output = "minimize"
    [constraints]                    # metric = { max = x } | { min = x }
    ttft_s = { max = 2.0 }
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dse.build.designs import (DIRECT_FIELDS, FEEDERS, STRING_PATHS, apply_numbers, kv_dtype_of,
                               resolve, settable_paths, to_batch)
from dse import catalog
from dse.spec import validate
from dse.spec.design import DIRECTIONS, NUMERIC_METRICS, SECTIONS, SPACE_KEYS, flatten, read_toml
from dse.errors import InputError, suggest
from dse.spec.fields import LIMITS, REGISTRY, legacy_columns, scale_column
from dse.perf import Batch
from dse.build.resolved import Resolved
from dse.build.mechanisms import RATE_PATHS
from dse.build import train_space
from dse.spec import train_fields

STRING_VALUED = STRING_PATHS


FULL_RESOLVE = 4096   # structural combinations resolved all at once when the grid has at most


@dataclass(frozen=True)
class Parameter:
    path: str
    values: tuple          # the grid the exhaustive strategy walks
    scale: bool = False    # values are factors of the base design's value
    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False

    @property
    def categorical(self) -> bool:
        return self.low is None

    @property
    def column(self) -> str:
        """Its column in every table: the path, or ``<path>.scale`` for scale factors."""
        return scale_column(self.path) if self.scale else self.path

    @functools.cached_property
    def index(self) -> dict:
        """value -> its position in ``values``."""
        return {v: i for i, v in enumerate(self.values)}


@dataclass(frozen=True)
class Objective:
    metric: str
    direction: str

    def to_dict(self):
        return {"name": self.metric, "direction": self.direction}


@dataclass(frozen=True)
class Constraint:
    metric: str
    max: float | None = None
    min: float | None = None


@dataclass(frozen=True)
class Space:
    file: str
    name: str
    question: str
    base: dict
    parameters: tuple
    objectives: tuple
    constraints: tuple
    digest: str
    answer: dict | None = None   # [answer]: the analysis of a worked question (dse.questions)
    task: str = "serve"          # "serve" or "train" (task = "train": dse.build.train_space)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(p.values) for p in self.parameters)

    @property
    def size(self) -> int:
        return int(math.prod(self.shape)) if self.parameters else 1

    @property
    def columns(self) -> list[str]:
        """The parameters' table columns (``Parameter.column``)."""
        return [p.column for p in self.parameters]

    def values_at(self, index: np.ndarray) -> dict[str, np.ndarray]:
        """Parameter values of the designs with flat indices ``index`` (C order), keyed by
        column (``<path>.scale`` for scale factors)."""
        index = np.asarray(index, dtype=np.int64)
        if not self.parameters:
            return {}
        coords = np.unravel_index(index, self.shape)
        return {p.column: _value_array(p)[c] for p, c in zip(self.parameters, coords)}

    def kv_dtypes(self, index: np.ndarray, overrides: dict | None = None) -> np.ndarray:
        """The KV cache's element type (``model.kv_dtype``, a blank filled as the scorer fills
        it: ``build.kv_dtype_of``) of the designs at ``index``, under string ``overrides``
        {path: (op, value)} (a what-if's ``--set model.kv_dtype=fp8``)."""
        vals = self.values_at(index)
        n = len(np.asarray(index).ravel())

        def col(path):
            over = (overrides or {}).get(path)
            if over is not None and isinstance(over[1], str):
                return np.full(n, over[1], dtype=object)
            if path in vals:
                return np.asarray(vals[path], dtype=object)
            return np.full(n, self.base.get(path) or "", dtype=object)
        return kv_dtype_of(col("model.weight_dtype"), col("model.kv_dtype"))

    def with_strings(self, vals: dict, overrides: dict | None):
        """String overrides (catalog ids, choices) written into the space and the designs'
        values: (the space with them in its base design, the values, the numeric overrides
        left)."""
        strings = {p: v for p, (op, v) in (overrides or {}).items() if isinstance(v, str)}
        if not strings:
            return self, vals, overrides
        n = len(next(iter(vals.values()))) if vals else 1
        vals = dict(vals)
        for p in self.parameters:
            if p.path in strings:
                vals[p.column] = np.full(n, strings[p.path], dtype=object)
        derived = dataclasses.replace(self, base={**self.base, **strings})
        return derived, vals, {p: x for p, x in overrides.items() if p not in strings}

    def legacy(self, frame: pd.DataFrame) -> pd.DataFrame:
        """A table of an old run folder with its scale-factor columns renamed ``<path>.scale``."""
        return legacy_columns(frame, [p.path for p in self.parameters if p.scale])

    def _resolved(self, combos: tuple, structural: list, n: int) -> Resolved:
        """The catalog resolution of distinct structural combinations. When the grid has at
        most FULL_RESOLVE of them they are all resolved at once, then only taken by row;
        otherwise each is resolved once, cached, and assembled."""
        paths = tuple(p.path for p in structural)
        full = self._full_resolution(tuple(structural))
        if full is not None:
            try:
                codes = [np.array([p.index[v] for v in col], dtype=np.int64)
                         for p, col in zip(structural, combos)]
            except KeyError:            # values off the grid (explicit values): row cache
                pass
            else:
                rows = (np.ravel_multi_index(codes, [len(p.values) for p in structural])
                        if structural else np.zeros(n, np.int64))
                return full.take(rows)
        cache = self.__dict__.setdefault("_rows", {})
        keys = [(paths, row) for row in zip(*combos)] if structural else [(paths, ())] * n
        missing = list(dict.fromkeys(k for k in keys if k not in cache))
        if missing:
            if len(cache) > 4096:
                cache.clear()
            rows = pd.DataFrame({k: [v] * len(missing) for k, v in self.base.items()})
            for j, path in enumerate(paths):
                rows[path] = [k[1][j] for k in missing]
            res = Resolved(resolve(rows, file=self.file))
            for i, k in enumerate(missing):
                cache[k] = (res, i)
        parts = [cache[k] for k in keys]
        tables = list({id(t): t for t, _ in parts}.values())
        start = dict(zip(map(id, tables), np.cumsum([0] + [len(t) for t in tables])))
        whole = tables[0] if len(tables) == 1 else Resolved.stack(tables)
        return whole.take(np.array([start[id(t)] + i for t, i in parts], dtype=np.int64))

    def _full_resolution(self, structural: tuple) -> Resolved | None:
        """Every combination of the structural parameters' grid values, resolved (C order),
        or None when there are more than FULL_RESOLVE."""
        cache = self.__dict__.setdefault("_full", {})
        key = tuple(p.path for p in structural)
        if key not in cache:
            count = math.prod(len(p.values) for p in structural)
            if count > FULL_RESOLVE or not structural:
                cache[key] = None
            else:
                grid = np.unravel_index(np.arange(count), [len(p.values) for p in structural])
                rows = pd.DataFrame({k: [v] * count for k, v in self.base.items()})
                for p, c in zip(structural, grid):
                    rows[p.path] = [p.values[i] for i in c]
                cache[key] = Resolved(resolve(rows, file=self.file))
        return cache[key]

    def batch(self, index: np.ndarray, dtype=np.float64) -> tuple[Batch, dict]:
        """Scorer input for the designs at ``index``, and their resolved columns."""
        b, rows, direct, table = self.batch_parts(index, dtype)
        return b.gather(rows, direct), table

    def batch_parts(self, index: np.ndarray, dtype=np.float64):
        """The designs at ``index`` as parts the scorer gathers chunk by chunk
        (``score_chunked(b, rows=..., direct=...)``): the compact Batch of their distinct rows,
        each design's row in it, the direct fields {field: values}, and the resolved columns.
        ``dtype``: the Batch's and direct fields' precision (``np.float32`` where the search
        scores in float32: the scorer then never converts)."""
        index = np.asarray(index, dtype=np.int64)
        if not self.parameters:
            return self.batch_from_values({}, parts=True, dtype=dtype)
        coords = np.unravel_index(index, self.shape)
        direct = {p.path for p in self.parameters if not p.scale and p.path in DIRECT_FIELDS}
        # values are only needed at each distinct row, except the direct ones (every design)
        vals = {p.path: (_value_array(p)[c] if p.path in direct else _LazyValues(p, c))
                for p, c in zip(self.parameters, coords)}
        return self.batch_from_values(vals, codes=dict(zip((p.path for p in self.parameters),
                                                           coords)), parts=True, dtype=dtype)

    def batch_from_values(self, vals: dict[str, np.ndarray], overrides: dict | None = None,
                          codes: dict | None = None, parts: bool = False, dtype=np.float64):
        """Scorer input for designs given by their parameter values (one array per path), and the
        resolved columns of their distinct non-direct rows.

        Parameters that are one scorer field and nothing else (batch, prompt and answer lengths,
        runtime caps: ``build.DIRECT_FIELDS``) are written straight into the Batch; the designs'
        distinct combinations of the other parameters are built once (compact) and gathered.
        Within those, only the distinct *structural* values (catalog ids, dtypes, modes and the
        numbers the system's derived links come from) go through the catalog. All values were
        checked when the space was loaded; a parameter missing from ``vals`` keeps the base
        design's value. ``codes``: the values' grid coordinates, when known;
        ``parts``: return ``batch_parts``'s tuple instead of (Batch, table). A scale-factor
        parameter's values may be keyed by its path or its column (``<path>.scale``).
        ``dtype``: the Batch's precision (``np.float32``: as the search scores, no conversion).
        """
        vals = {next((p.path for p in self.parameters if p.scale and p.column == k), k): v
                for k, v in vals.items()} if any(k.endswith(".scale") for k in vals) else vals
        n = len(next(iter(vals.values()))) if vals else 1
        given = [p for p in self.parameters if p.path in vals]   # the others: the base design's
        direct = [p for p in given
                  if not p.scale and p.path in DIRECT_FIELDS and p.path not in (overrides or {})]
        rest = [p for p in given if p not in direct]
        if rest and n > 1:
            if codes is not None:
                first, inverse = _distinct_codes([codes[p.path] for p in rest],
                                                 [len(p.values) for p in rest])
            else:
                first, inverse = _distinct_rows([np.asarray(vals[p.path]) for p in rest])
        else:
            first, inverse = np.array([0]), np.zeros(n, np.int64)
        b, table = self._distinct_batch({p.path: _at(vals[p.path], first) for p in rest},
                                        overrides, dtype)
        fields = {DIRECT_FIELDS[p.path]: np.asarray(vals[p.path], dtype=dtype) for p in direct}
        if parts:
            return b, inverse, fields, table
        return b.gather(inverse, fields), table

    def _distinct_batch(self, vals: dict[str, np.ndarray], overrides: dict | None = None,
                        dtype=np.float64) -> tuple[Batch, dict]:
        n = len(next(iter(vals.values()))) if vals else 1
        structural = [p for p in self.parameters if p.path in vals
                      and not p.scale and (p.path in STRING_VALUED or p.path in FEEDERS)]
        if structural:
            first, inverse = _distinct_rows([np.asarray(vals[p.path]) for p in structural])
        else:
            first, inverse = np.array([0]), np.zeros(n, np.int64)
        combos = tuple(tuple(np.asarray(vals[p.path], dtype=object)[first].tolist())
                       for p in structural)
        res = self._resolved(combos, structural, len(first))
        # columns the same for every design stay length-1 (the scorer broadcasts them); the
        # others are broadcast with numpy, strings as Categoricals (codes only)
        table = res.compact(inverse)
        explicit = {p.path for p in self.parameters if not p.scale and p.path in vals} \
            | set(self.base)
        numbers = [(p.path, "scale" if p.scale else "value", vals[p.path])
                   for p in self.parameters if p not in structural and p.path in vals]
        apply_numbers(table, numbers, overrides, explicit)
        return to_batch(table, compact=True, dtype=dtype), table


class _LazyValues:
    """A parameter's values at grid coordinates, looked up only where asked (``_at``)."""

    def __init__(self, p: Parameter, coords: np.ndarray):
        self.p, self.coords = p, coords

    def __len__(self) -> int:
        return len(self.coords)

    def __array__(self, dtype=None, copy=None):
        return np.asarray(_value_array(self.p)[self.coords], dtype=dtype)


def _at(values, rows: np.ndarray) -> np.ndarray:
    if isinstance(values, _LazyValues):
        return _value_array(values.p)[values.coords[rows]]
    return np.asarray(values)[rows]


def _distinct_rows(columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """First row of each distinct combination of the columns, and each row's combination."""
    codes = [pd.factorize(c)[0] for c in columns]
    return _distinct_codes(codes, [int(c.max()) + 1 for c in codes])


def _distinct_codes(codes: list[np.ndarray], dims: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """First row of each distinct combination of grid codes (in key order), and each row's."""
    size = math.prod(dims)
    n = len(codes[0])
    if size <= 4 * n:                   # few possible keys: a table instead of a sort
        key = np.ravel_multi_index(codes, dims)
        first_at = np.full(size, -1, np.int64)
        first_at[key[::-1]] = np.arange(n - 1, -1, -1)      # the last write is the first row
        present = np.flatnonzero(first_at >= 0)
        slot = np.empty(size, np.int64)
        slot[present] = np.arange(len(present))
        return first_at[present], slot[key]
    if size < 2**62:
        key = np.ravel_multi_index(codes, dims)
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    else:
        _, first, inverse = np.unique(np.stack(codes, axis=1), axis=0, return_index=True,
                                      return_inverse=True)
    return first, inverse.reshape(-1)


distinct_codes = _distinct_codes      # (public: the training scorer's distinct combinations)


@functools.lru_cache(maxsize=256)
def _value_array(p: Parameter) -> np.ndarray:
    """A parameter's values as an array: float when all are numbers (fast to index and to
    factorize), object otherwise."""
    if all(isinstance(v, int) and not isinstance(v, bool) for v in p.values):
        return np.asarray(p.values, dtype=np.int64)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in p.values):
        return np.asarray(p.values, dtype=np.float64)
    return np.asarray(p.values, dtype=object)


MAX_VALUES = LIMITS["values per parameter"]


def _number(spec: dict, key: str, file: str, where: str, *, whole=False, positive=False):
    """A range key's value: a finite number (a whole one for num), never a bool."""
    v = spec[key]
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if ok and whole:
        ok = float(v).is_integer() and 1 <= v <= MAX_VALUES
    if ok and positive:
        ok = v > 0
    if not ok:
        want = (f"a whole number in [1, {MAX_VALUES:,}] (limit: values per parameter)" if whole
                else "a finite number > 0" if positive else "a finite number")
        raise InputError(f"{key} = {v!r} is not valid", file=file, where=where, hint=want)
    return v


def _listed(path: str, vals: list, file: str, where: str, registry=None) -> tuple:
    if len(vals) > MAX_VALUES:
        raise InputError(f"{len(vals):,} values", file=file, where=where,
                         hint=f"at most {MAX_VALUES:,}; limit: values per parameter")
    return validate.check_values(path, vals, file=file, where=where, registry=registry)


def _grid(path: str, spec, file: str, registry=None) -> Parameter:
    """One ``[parameters]`` entry; ``registry``: the fields its values are checked against
    (default the serving fields; a training space passes its own)."""
    where = f"parameters.{path}"
    if isinstance(spec, list):
        if not spec:
            raise InputError("an empty list of values", file=file, where=where,
                             hint="give at least one value")
        return Parameter(path, _listed(path, spec, file, where, registry))
    if not isinstance(spec, dict):
        raise InputError(f"{spec!r} is not a list of values or a range table", file=file,
                         where=where, hint="e.g. [1, 2, 4] or { low = 1, high = 64, num = 7 }")
    allowed = {"values", "scale", "low", "high", "num", "step", "log"}
    for k in spec:
        if k not in allowed:
            raise InputError(f"unknown key {k!r}", file=file, where=where,
                             hint=suggest(k, allowed, "range keys"))
    if "values" in spec or "scale" in spec:
        key = "scale" if "scale" in spec else "values"
        vals = spec[key]
        if not isinstance(vals, list) or not vals:
            raise InputError(f"{key} must be a non-empty list", file=file, where=where)
        if key == "values":
            return Parameter(path, _listed(path, vals, file, where, registry))
        if len(vals) > MAX_VALUES:
            raise InputError(f"{len(vals):,} scale factors", file=file, where=where,
                             hint=f"at most {MAX_VALUES:,}; limit: values per parameter")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                   and v > 0 for v in vals):
            raise InputError("scale factors must be finite positive numbers", file=file,
                             where=where, hint="e.g. { scale = [1.0, 1.5, 2.0] }")
        return Parameter(path, tuple(vals), scale=True)
    if "low" not in spec or "high" not in spec:
        raise InputError("a range needs low and high", file=file, where=where,
                         hint="e.g. { low = 1, high = 1024, num = 11, log = true }")
    low, high = (_number(spec, k, file, f"{where}.{k}") for k in ("low", "high"))
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise InputError(f"log = {log!r} is not valid", file=file, where=f"{where}.log",
                         hint="true or false")
    step = _number(spec, "step", file, f"{where}.step", positive=True) if "step" in spec else 1
    integer = isinstance(low, int) and isinstance(high, int) and not isinstance(step, float)
    if high < low:
        raise InputError(f"the range {low}..{high} is empty", file=file, where=where,
                         hint="low <= high")
    if log and low <= 0:
        raise InputError("a log range needs low > 0", file=file, where=where)
    if "step" in spec:
        count = (high - low) / step + 1
        if not count <= MAX_VALUES:
            raise InputError(f"the range gives {count:,.0f} values", file=file, where=where,
                             hint=f"at most {MAX_VALUES:,}; limit: values per parameter")
        vals = np.arange(low, high + step * 1e-9, step)
    else:
        num = int(_number(spec, "num", file, f"{where}.num", whole=True)) if "num" in spec else 5
        vals = np.geomspace(low, high, num) if log else np.linspace(low, high, num)
    if integer:
        vals = np.unique(np.round(vals).astype(np.int64))
    return Parameter(path, _listed(path, [v.item() for v in vals], file, where, registry),
                     low=float(low),
                     high=float(high), log=log, integer=integer)


def objectives_file(spec: str, file: str, base_dir: Path) -> Path:
    """The objectives file a space names, confined to the space file's folder or the
    ``objectives/`` folder next to it (a run snapshots it; it must not reach anywhere else)."""
    path = (Path(base_dir) / spec).resolve()
    roots = [Path(base_dir).resolve(), (Path(base_dir) / ".." / "objectives").resolve()]
    if not any(path == r or r in path.parents for r in roots):
        raise InputError(f"the objectives file {spec!r} is outside the space file's folder and "
                         "../objectives/", file=file, where="objectives",
                         hint="put it next to the space file or in objectives/")
    return path


def _objectives(spec, file: str, base_dir: Path, metrics=NUMERIC_METRICS):
    if isinstance(spec, str):
        path = objectives_file(spec, file, base_dir)
        doc = read_toml(str(path))
        spec = doc.get("objectives", {})
        cons = doc.get("constraints", {})
        file = str(path)
    else:
        cons = None
    if not isinstance(spec, dict) or not spec:
        raise InputError("no objectives", file=file, where="objectives",
                         hint='e.g. [objectives] usd_per_mtok_output = "minimize"')
    out = []
    for metric, direction in spec.items():
        if metric not in metrics:
            raise InputError(f"unknown metric {metric!r}", file=file, where=f"objectives.{metric}",
                             hint=suggest(metric, metrics, "metrics"))
        if direction not in DIRECTIONS:
            raise InputError(f"unknown direction {direction!r}", file=file,
                             where=f"objectives.{metric}", hint=suggest(str(direction), DIRECTIONS))
        out.append(Objective(metric, direction))
    return tuple(out), cons, file


def _constraints(spec, file: str, metrics=NUMERIC_METRICS):
    out = []
    for metric, c in (spec or {}).items():
        where = f"constraints.{metric}"
        if metric not in metrics:
            raise InputError(f"unknown metric {metric!r}", file=file, where=where,
                             hint=suggest(metric, metrics, "metrics"))
        if not isinstance(c, dict) or not c or set(c) - {"max", "min"}:
            raise InputError(f"{c!r} is not a bound", file=file, where=where,
                             hint="{ max = x } and/or { min = x }")
        for k, v in c.items():
            _bound(metric, v, file, f"{where}.{k}")
        out.append(Constraint(metric, c.get("max"), c.get("min")))
    return tuple(out)


def _bound(metric: str, v, file: str, where: str) -> None:
    """A constraint bound: a finite number >= 0 (every metric ``dse.perf.score`` returns -- a
    time, a cost, a rate, a count, a size, a fraction -- is never negative, so a negative bound
    is a slip: as a max it leaves no design, as a min it binds nothing; NaN would leave none)."""
    valid = "a finite number >= 0, e.g. { max = 2.0 }"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        shown = str(v).lower() if isinstance(v, bool) else repr(v)
        raise InputError(f"bound {shown} is not a number", file=file, where=where, hint=valid)
    if not math.isfinite(v):
        raise InputError(f"bound {v} is not a finite number", file=file, where=where, hint=valid)
    if v < 0:
        raise InputError(f"bound {v:g} is negative, and {metric} never is", file=file,
                         where=where, hint=valid)


def load_space(path: str) -> Space:
    doc = read_toml(path)
    if "task" in doc and doc["task"] != "serve":
        return _train_space(path, doc)
    for k in doc:
        if k not in SPACE_KEYS:
            raise InputError(f"unknown key {k!r}", file=path, hint=suggest(k, SPACE_KEYS, "top-level keys"))
    base = flatten({k: v for k, v in doc.items() if k in SECTIONS})
    valid = set(settable_paths())
    for key in base:
        if key not in valid:
            raise InputError(f"unknown key {key!r}", file=path, hint=suggest(key, valid, "valid keys"))
        base[key] = validate.check_value(key, base[key], file=path)
        if REGISTRY[key].kind == "id" and base[key] != "":   # named here, not under a parameter
            catalog.lookup(validate.catalog_kind(key), base[key], file=path, where=key)
    params = []
    for p, spec in (doc.get("parameters") or {}).items():
        if p not in valid:
            raise InputError(f"unknown parameter path {p!r}", file=path, where="parameters",
                             hint=suggest(p, valid, "valid paths"))
        param = _grid(p, spec, path)
        if param.scale and p in STRING_VALUED:
            raise InputError("only numeric fields can be scaled", file=path, where=f"parameters.{p}")
        params.append(param)
    objectives, file_cons, obj_file = _objectives(doc.get("objectives"), path, Path(path).parent)
    constraints = _constraints(doc.get("constraints") if doc.get("constraints") is not None
                               else file_cons, path if doc.get("constraints") is not None else obj_file)
    for need in ("accelerator.id", "model.id"):
        if need not in base and need not in {p.path for p in params}:
            raise InputError(f"missing {need}", file=path,
                             hint=f"set it in [{need.split('.')[0]}] or in [parameters]")
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    space = Space(path, doc.get("name") or Path(path).stem, doc.get("question", ""), base,
                  tuple(params), objectives, constraints, digest, _answer(doc.get("answer"), path))
    if space.size == 0:
        raise InputError("the space is empty", file=path, hint="every parameter needs a value")
    if math.prod(len(p.values) for p in params) > LIMITS["designs per space"]:
        raise InputError(f"the space has {math.prod(len(p.values) for p in params):.3g} designs",
                         file=path, hint=f"at most {LIMITS['designs per space']:.0e} (limit: "
                         "designs per space)")
    # resolve one design to catch bad values (unknown ids in lists, negative numbers) now
    _check_values(space)
    return space


def _train_space(path: str, doc: dict) -> Space:
    """A training space (``task = "train"``, ``dse.build.train_space``): the same grammar, the
    training fields and metrics."""
    train_space.check_top(doc, path)
    base = train_space.base_design(doc, path)
    params = []
    for p, spec in (doc.get("parameters") or {}).items():
        train_space.check_parameter_path(p, path)
        params.append(_grid(p, spec, path, train_fields.REGISTRY))
    metrics = train_fields.NUMERIC_METRICS
    objectives, file_cons, obj_file = _objectives(doc.get("objectives"), path, Path(path).parent,
                                                  metrics)
    given = doc.get("constraints") is not None
    constraints = _constraints(doc.get("constraints") if given else file_cons,
                               path if given else obj_file, metrics)
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    space = Space(path, doc.get("name") or Path(path).stem, doc.get("question", ""), base,
                  tuple(params), objectives, constraints, digest,
                  _answer(doc.get("answer"), path), task="train")
    if math.prod(len(p.values) for p in params) > LIMITS["designs per space"]:
        raise InputError(f"the space has {space.size:.3g} designs", file=path,
                         hint=f"at most {LIMITS['designs per space']:.0e} (limit: designs per "
                         "space)")
    train_space.check_space(space)
    return space


def _answer(spec, file: str) -> dict | None:
    if spec is None:
        return None
    if not isinstance(spec, dict) or not isinstance(spec.get("analysis"), str):
        raise InputError("[answer] needs analysis = \"NAME\"", file=file, where="answer",
                         hint="the name of a module of dse/questions, e.g. \"fast-mode\"")
    return dict(spec)


def _check_values(space: Space) -> None:
    """Every listed value must resolve: try each parameter's values against the base design
    (scale factors: the scaled base value), then every combination of the model parameters
    (whose consistency rules span fields) when there are at most FULL_RESOLVE of them."""
    firsts = {q.path: q.values[0] for q in space.parameters if not q.scale}
    for p in space.parameters:
        rows = [{**space.base, **firsts, **({} if p.scale else {p.path: v})} for v in p.values]
        try:
            res = resolve(pd.DataFrame(rows), file=space.file)
            if p.scale:
                with np.errstate(over="ignore"):
                    res[p.path] = res[p.path].to_numpy(dtype=float) * np.asarray(p.values, float)
                validate.check_table(res, columns=[p.path],
                                     names=[f"scale factor {v!r}" for v in p.values])
        except InputError as e:
            raise InputError(e.message, file=space.file, where=f"parameters.{p.path}"
                             + (f", {e.where}" if e.where and not e.where.startswith("design")
                                else ""), hint=e.hint) from None
    _check_load(space)
    _check_phase_rate(space)
    model = [p for p in space.parameters if p.path.startswith("model.") and not p.scale
             and REGISTRY[p.path].numeric]
    if len(model) > 1 and math.prod(len(p.values) for p in model) <= FULL_RESOLVE:
        grid = np.unravel_index(np.arange(math.prod(len(p.values) for p in model)),
                                [len(p.values) for p in model])
        rows = pd.DataFrame({k: [v] * len(grid[0]) for k, v in {**space.base, **firsts}.items()})
        for p, c in zip(model, grid):
            rows[p.path] = [p.values[i] for i in c]
        names = [", ".join(f"{p.path} = {p.values[i]}" for p, i in zip(model, row))
                 for row in zip(*grid)]
        try:
            resolve(rows, file=space.file, row_names=names)
        except InputError as e:
            raise InputError(e.message, file=space.file, where=f"parameters ({e.where})",
                             hint=e.hint) from None


def _check_load(space: Space) -> None:
    """A space gives the load one way: ``workload.concurrency`` (fixed) or
    ``workload.request_rate_per_s`` (the concurrency follows from it, Little's law): a swept
    or fixed concurrency beside a rate would be silently dropped, so both are refused."""
    rate, conc = "workload.request_rate_per_s", "workload.concurrency"
    params = {p.path: p for p in space.parameters if not p.scale}
    rates = [float(v) for v in params[rate].values] if rate in params else \
        [float(space.base.get(rate, 0.0) or 0.0)]
    if max(rates) > 0 and (conc in params or conc in space.base):
        where = f"parameters.{conc}" if conc in params else conc
        raise InputError(f"{conc} and {rate} = {max(rates):g} are both given: the rate sets the "
                         "concurrency (Little's law on the model's step times)",
                         file=space.file, where=where, hint=f"drop {conc} to serve the rate, "
                         f"or {rate} for a fixed concurrency")


def _check_phase_rate(space: Space) -> None:
    """The grid's every combination of ``workload.phase`` with a request rate or latency SLO
    (``mechanisms.check_rate``, which refuses a rate on a prefill-only or decode-only instance
    row by row): the per-parameter check above pairs each parameter's values with the others'
    first values only, so a swept phase beside a swept rate would let some rows through."""
    params = {p.path: p for p in space.parameters if not p.scale}
    values = lambda path, default: (list(params[path].values) if path in params  # noqa: E731
                                    else [space.base.get(path, default)])
    single = [v for v in values("workload.phase", "both") if v in ("prefill", "decode")]
    if not single:
        return
    for path in RATE_PATHS:
        pos = [float(v) for v in values(path, 0.0) if v not in (None, "") and float(v) > 0]
        if pos and (path in params or "workload.phase" in params):
            where = f"parameters.{path}" if path in params else "parameters.workload.phase"
            raise InputError(f"{path} = {pos[0]:g} with workload.phase = {single[0]!r} in the "
                             f"grid: one pool of a disaggregated system has no request stream "
                             "of its own", file=space.file, where=where,
                             hint="model the whole system (serving.mode = \"disaggregated\" "
                             "with workload.phase = \"both\"), or sweep the phase and the "
                             "rate in separate spaces")


def describe(space: Space) -> str:
    lines = [f"space {space.file}: {space.name}"]
    if space.question:
        lines.append(f"question: {space.question}")
    lines.append("base design:")
    for k, v in space.base.items():
        lines.append(f"  {k} = {v!r}")
    lines.append(f"parameters ({len(space.parameters)}):")
    for p in space.parameters:
        shown = ", ".join(map(str, p.values[:8])) + (", ..." if len(p.values) > 8 else "")
        kind = "scale factors" if p.scale else ("range" if not p.categorical else "values")
        lines.append(f"  {p.column}: {len(p.values)} {kind} [{shown}]")
    lines.append("objectives: " + ", ".join(f"{o.direction} {o.metric}" for o in space.objectives))
    if space.constraints:
        lines.append("constraints: " + ", ".join(
            " and ".join(x for x in (f"{c.metric} <= {c.max}" if c.max is not None else "",
                                     f"{c.metric} >= {c.min}" if c.min is not None else "") if x)
            for c in space.constraints))
    lines.append(f"size: {space.size:,} designs")
    return "\n".join(lines)
