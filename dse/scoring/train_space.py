"""Scoring the designs of a training space (``task = "train"``): the one training model
(``dse.perf.train_step.score_train``) on the designs a space's parameters give, the way
``dse predict --train`` scores a case file's rows (``train_predict.design_numbers``).

The catalog is read once per distinct combination of the non-layout fields (model,
accelerator, topology, precision, the model, chip and system numbers); the layout and job fields
go straight into the ``TrainBatch``, one value per design. A layout the grid makes invalid is
flagged without being scored (its metrics NaN): ``reason`` holds bits (``REASONS``; 8 = memory,
as serving's), and ``feasible`` is ``reason == 0``.

    score_values(space, vals, overrides=None, metrics=None, dtype=np.float32) -> {metric: array}
    score_index(space, ids, ...)      the designs of flat indices ``ids``
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd

from dse.build.space import distinct_codes
from dse.catalog import training as tcat
from dse.errors import InputError
from dse.perf.train_batch import (
    BOUNDS,
    CP_COMM_TYPES,
    LAYER_LAYOUT,
    MOE_GROUPED_GEMM,
    PRECISIONS,
    RECOMPUTE,
    SCHEDULES,
    TP_COMM_OVERLAP,
    GatheredKernel,
    TrainBatch,
)
from dse.perf.train_layout import LAYOUT_REASONS, layout_bits
from dse.perf.train_step import score_train
from dse.scoring.train_cases import OVERRIDES
from dse.scoring.train_predict import design_numbers, kernel_of
from dse.spec import train_fields
from dse.spec.fields import SCALE_SUFFIX

REASONS = {**LAYOUT_REASONS,
           8: "weights, gradients, optimizer state and activations do not fit in HBM",
           512: "the accelerator has no native support for the precision"}
REASONS = dict(sorted(REASONS.items()))
MEMORY_BIT = 8
# the chip and system numbers a design may set: the predict contract's dotted overrides, and cost
NUMBERS = {**{k: v for k, v in OVERRIDES.items() if k in train_fields.REGISTRY},
           "accelerator.price_usd_per_hour": "usd_per_hour",
           "accelerator.all_in_power_w": "all_in_power_w"}
MODEL = tuple(p for p in train_fields.REGISTRY if p.startswith("model.") and p != "model.id")
STRUCTURAL = ("model.id", "accelerator.id", "topology.id", "training.precision",
              "training.attention_kernel", *MODEL, *NUMBERS)
LAYOUT = {"layout.tp": "tp", "layout.pp": "pp", "layout.dp": "dp", "layout.cp": "cp",
          "layout.ep": "ep", "layout.vp": "vp", "layout.micro_batch_seqs": "micro_batch_seqs",
          "layout.recompute_layer_fraction": "recompute_layer_fraction",
          "layout.zero_stage": "zero_stage", "training.global_batch_seqs": "global_batch_seqs",
          "training.seq_len": "seq_len", "training.mtp_layers": "mtp_layers",
          "training.overlap_p2p_comm": "overlap_p2p_comm",
          "training.overlap_grad_reduce": "overlap_grad_reduce",
          "training.p2p_scatter_gather": "p2p_scatter_gather",
          "training.recompute_norms": "recompute_norms",
          "training.recompute_moe_act": "recompute_moe_act",
          "training.moe_router_force_load_balancing": "moe_router_force_load_balancing"}
CODES = {"layout.recompute": ("recompute", RECOMPUTE),
         "training.tp_comm_overlap": ("tp_comm_overlap", TP_COMM_OVERLAP),
         "training.cp_comm_type": ("cp_comm_type", CP_COMM_TYPES),
         "training.moe_grouped_gemm": ("moe_grouped_gemm", MOE_GROUPED_GEMM),
         "layout.pipeline_schedule": ("schedule", SCHEDULES)}
# the metrics every training score table keeps besides the run's objectives and constraints
KEEP_METRICS = ("train_time_s", "train_cost_usd", "step_time_s", "mfu", "tokens_per_s_per_chip",
                "num_chips", "memory_per_chip_bytes", "hbm_used_fraction",
                "usd_per_trillion_tokens", "bound", "feasible", "reason")
BREAKDOWN = ("compute_s", "memory_s", "overhead_s", "network_exposed_s", "bubble_s", "optimizer_s",
             "weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes")
# what a report says of a front design besides its objectives
SHOWN = ("step_time_s", "mfu", "tokens_per_s_per_chip", "num_chips", "memory_per_chip_bytes",
         "hbm_used_fraction", "usd_per_trillion_tokens")


def reason_text(bits: int) -> str:
    return "; ".join(t for b, t in REASONS.items() if int(bits) & b)


def _default(path: str):
    return train_fields.REGISTRY[path].default


def columns(space, vals: dict, n: int, overrides: dict | None = None) -> dict:
    """Every training field of the designs: {path: (values or a scalar, factor or None)};
    a value from the parameters (``vals``, keyed by path or ``<path>.scale`` column), else the
    base design, else the field's default; a scale factor multiplies that value, or is kept
    apart where the value is the catalog's (applied to it per combination). ``overrides``
    {path: ("set" | "scale", x)} (a what-if) apply last."""
    out = {}
    for path in train_fields.REGISTRY:
        v, f = space.base.get(path), None
        if path in vals:
            v = vals[path] if isinstance(vals[path], GridStrings) else np.asarray(vals[path])
        if path + SCALE_SUFFIX in vals:
            f = np.asarray(vals[path + SCALE_SUFFIX], float)
        op = (overrides or {}).get(path)
        if op is not None:
            if op[0] == "set":
                v, f = op[1], None
            else:
                f = op[1] if f is None else f * op[1]
        if v is None:
            d = _default(path)
            v = None if d is train_fields.serving.CATALOG else d
        if v is not None and f is not None:   # a factor of a value the design gives itself
            v, f = np.asarray(v, float) * f, None
            v = v if v.ndim else float(v)
        out[path] = (v, f)
    return out


def _combo_numbers(key: tuple) -> dict:
    """design_numbers of one distinct combination of STRUCTURAL values (None = the catalog's),
    scale factors as ("scale", x)."""
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    d = dict(zip(STRUCTURAL, key))
    m = tcat.lookup("models", d["model.id"])
    upd = {p.split(".", 1)[1]: d[p] for p in MODEL if d[p] is not None and not isinstance(d[p],
                                                                                         tuple)}
    acc, _ = tcat.lookup("accelerators", d["accelerator.id"])
    topo = tcat.lookup("topologies", d["topology.id"] or acc.default_topology)
    prec = d["training.precision"]
    given = {NUMBERS[p]: float(d[p]) for p in NUMBERS
             if d[p] is not None and not isinstance(d[p], tuple)}
    scaled = {p: d[p][1] for p in (*MODEL, *NUMBERS) if isinstance(d[p], tuple)}
    if any(p.startswith("model.") for p in scaled):
        for p, f in scaled.items():
            if p.startswith("model."):
                attr = p.split(".", 1)[1]
                upd[attr] = max(int(round(upd.get(attr, getattr(m, attr)) * f)), 0)
    if upd:
        m = m.model_copy(update=upd)
    kern = d["training.attention_kernel"]
    c = design_numbers(m, acc, topo, prec, given, kern)
    if any(p in NUMBERS for p in scaled):
        given.update({NUMBERS[p]: c[NUMBERS[p]] * f for p, f in scaled.items() if p in NUMBERS})
        c = design_numbers(m, acc, topo, prec, given, kern)
    if len(_CACHE) > 4096:
        _CACHE.clear()
    _CACHE[key] = c
    return c


_CACHE: dict = {}


def _sampled_kernel(c: dict, key: tuple, kernel_scale) -> dict:
    """A combination's numbers with its kernel constants from scaled catalog parameters."""
    d = dict(zip(STRUCTURAL, key))
    acc = d["accelerator.id"]
    base = tcat.train_accelerators()[acc][1]
    return {**c, "kernel": kernel_of(acc, d["training.precision"], kernel_scale(base))}


def _per_row(v, n: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(v, dtype=object), (n,))


class GridStrings:
    """A string parameter's values at grid codes, never materialized whole: the scorer reads
    them at the distinct combinations' rows and maps the codes (``_enum_codes``)."""

    def __init__(self, values: tuple, coords: np.ndarray):
        self.values, self.coords = values, coords

    def __len__(self) -> int:
        return len(self.coords)

    def __getitem__(self, row):
        return self.values[self.coords[row]]

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.values, dtype=object)[self.coords]


def _varies(v) -> bool:
    return isinstance(v, (np.ndarray, GridStrings))


def _enum_codes(v, choices, grid, dtype):
    """Codes into ``choices`` of enum values: a scalar, or per design (from the grid's codes
    when known: a table lookup, no string work)."""
    if isinstance(v, GridStrings):
        return np.asarray([choices.index(x) for x in v.values], dtype)[v.coords]
    if not _varies(v):
        return dtype(choices.index(v))
    if grid is not None:
        values, coords = grid
        return np.asarray([choices.index(x) for x in values], dtype)[coords]
    return np.asarray(pd.Categorical(np.asarray(v, object), categories=choices).codes, dtype)


def _distinct(keys: list, n: int) -> tuple[np.ndarray, np.ndarray]:
    """First row of each distinct combination of the key columns (codes), and each row's
    (``build.space.distinct_codes``: a table lookup when the combinations are few)."""
    if not keys:
        return np.array([0]), np.zeros(n, np.int64)
    return distinct_codes(keys, [int(k.max()) + 1 for k in keys])


def build(space, vals: dict, n: int, overrides: dict | None = None, dtype=np.float32,
          grid: dict | None = None, kernel_scale=None):
    """(TrainBatch of the designs, extra per-design arrays: tokens, whole dp). ``grid``:
    {path or column: (the parameter's values, each design's code)} when the designs are grid
    points (the distinct combinations then come from the codes). ``kernel_scale``: a function
    of a chip's serving-catalog id giving factors on its kernel parameters by catalog key (an
    uncertainty sample, ``dse.scoring.train_bands``)."""
    grid = grid or {}
    cols = columns(space, vals, n, overrides)
    # distinct structural combinations (a scale factor joins the key as ("scale", x))
    keys, varying = [], []
    for p in STRUCTURAL:
        v, f = cols[p]
        col = p + SCALE_SUFFIX if f is not None else p
        if (f is not None and _varies(f)) or (f is None and _varies(v)):
            varying.append(p)
            keys.append(v.coords if isinstance(v, GridStrings) and f is None else
                        grid[col][1] if col in grid and not (overrides or {}).get(p)
                        else pd.factorize(np.asarray(f if f is not None else v))[0])
    first, inverse = _distinct(keys, n)

    def key_of(row):
        out = []
        for p in STRUCTURAL:
            v, f = cols[p]
            x = f if f is not None else v
            x = x[row] if _varies(x) else x
            x = x.item() if hasattr(x, "item") else x
            out.append(("scale", float(x)) if f is not None else x)
        return tuple(out)
    try:
        combos = [_combo_numbers(key_of(int(r))) for r in first]
    except InputError as e:          # a combination the catalog cannot price: name the space
        raise e.at(file=space.file) from None
    if kernel_scale is not None:
        combos = [_sampled_kernel(c, key_of(int(r)), kernel_scale) for c, r in zip(combos, first)]
    skip = {"kernel", "peak_bf16", "peak_fp16", "peak_fp8", "peak_fp4"}

    # a number the same in every combination stays a scalar; the others are gathered per
    # design in one take of a (numbers x combinations) table (the kernel's on first read:
    # train_batch.GatheredKernel)
    names = [("f", k) for k in combos[0] if k not in skip] + \
        [("k", k) for k in combos[0]["kernel"]]
    table = np.array([[c[k] if w == "f" else c["kernel"][k] for c in combos] for w, k in names],
                     dtype)
    same = (table == table[:, :1]).all(axis=1)
    is_field = np.array([w == "f" for w, _ in names])
    gather = ~same & is_field
    rows = np.take(table[gather], inverse, axis=1) if gather.any() else table[:0]
    out = dict(zip([nk for nk, g_ in zip(names, gather) if g_], rows))
    out.update({nk: table[i, 0] for i, nk in enumerate(names) if same[i]})
    fields = {k: out[("f", k)] for w, k in names if w == "f"}
    lazy = ~same & ~is_field
    kernel = GatheredKernel({k: out[("k", k)] for w, k in names if w == "k" and ("k", k) in out},
                            [k for (w, k), g_ in zip(names, lazy) if g_], table[lazy], inverse)

    def num(path):
        v, f = cols[path]
        x = np.asarray(v, dtype) if _varies(v) else dtype(v)
        return x if f is None else x * np.asarray(f, dtype)
    for path, name in LAYOUT.items():
        if path != "layout.dp":
            fields[name] = num(path)
    for path, (name, choices) in CODES.items():
        fields[name] = _enum_codes(cols[path][0], choices, grid.get(path), dtype)
    fields["precision"] = _enum_codes(cols["training.precision"][0], PRECISIONS,
                                      grid.get("training.precision"), dtype)
    rest = fields["tp"] * fields["pp"] * fields["cp"]
    chips = ("layout.num_chips" in space.base or "layout.num_chips" in vals
             or "layout.num_chips" in (overrides or {}))
    fields["dp"] = num("layout.num_chips") / rest if chips else num("layout.dp")
    sp = _enum_codes(cols["layout.sequence_parallel"][0], ("auto", "on", "off"), None, dtype)
    fields["sequence_parallel"] = np.where(sp == 0, fields["tp"] > 1, sp == 1).astype(dtype)
    fields["kernel"] = kernel
    b = TrainBatch(**fields, layer_code=_layer_code(cols, vals, grid, overrides, inverse,
                                                     len(first), n))
    return b, {"tokens": num("training.tokens"), "whole_dp": fields["dp"] % 1 == 0}


# the parameter columns the per-layer terms' layout fields come from (train_batch.LAYER_LAYOUT)
LAYER_PATHS = tuple({**{n: p for p, n in LAYOUT.items()},
                     **{n: p for p, (n, _) in CODES.items()},
                     "sequence_parallel": "layout.sequence_parallel"}[k] for k in LAYER_LAYOUT)


def _layer_code(cols: dict, vals: dict, grid: dict, overrides, inverse, combos: int, n: int):
    """Each design's ``TrainBatch.layer_code``: its distinct combination of the structural
    values (``inverse``) and the grid codes of the ``LAYER_PATHS`` that vary; None where one
    varies without grid codes (or is scaled, or overridden) or where the possible codes are
    more than 4 n (a table lookup, no sort)."""
    codes, dims = [inverse], [combos]
    for path in LAYER_PATHS:
        v = cols[path][0]
        if not _varies(v) and not (path + SCALE_SUFFIX in vals):
            continue
        if isinstance(v, GridStrings):
            c, d = v.coords, len(v.values)
        elif path in grid and path + SCALE_SUFFIX not in vals and not (overrides or {}).get(path):
            c, d = grid[path][1], len(grid[path][0])
        else:
            return None
        codes.append(c)
        dims.append(d)
    if int(np.prod(dims, dtype=np.float64)) > 4 * n:
        return None
    return distinct_codes(codes, dims)[1]


def _scatter(scored: dict, rows: np.ndarray, n: int) -> dict:
    """The metrics of the designs ``rows`` (of ``n``) in full-length arrays: NaN (floats) or 0
    at the others."""
    out = {}
    for k, v in scored.items():
        v = np.asarray(v)
        full = (np.full(n, np.nan, v.dtype) if v.dtype.kind == "f"
                else np.zeros(n, v.dtype))
        if len(rows):
            full[rows] = v
        out[k] = full
    return out


# the step's metrics score_values reads to give the job's (and the reason bits)
_READ = ("tokens_per_s_per_chip", "usd_per_trillion_tokens", "energy_j_per_token",
         "memory_per_chip_bytes")


def score_values(space, vals: dict, overrides: dict | None = None, metrics=None,
                 dtype=np.float32, grid: dict | None = None, kernel_scale=None) -> dict:
    """Every training metric (or ``metrics``) of the designs given by their parameter values
    (``build``'s ``grid``: their grid codes, when known; ``kernel_scale``: ``build``'s)."""
    n = len(next(iter(vals.values()))) if vals else 1
    want = metrics if metrics is not None else train_fields.METRICS
    b, extra = build(space, vals, n, overrides, dtype, grid, kernel_scale)
    bits = np.broadcast_to(layout_bits(b, extra["whole_dp"]), (n,))
    valid = bits == 0
    with np.errstate(all="ignore"):
        # a layout the model cannot take is flagged, not scored: its metrics are NaN
        rows = None if valid.all() else np.flatnonzero(valid)
        # the rows scored are the valid layouts: their bits are 0, not computed again
        # (only the metrics wanted and those the job's metrics below read spread out)
        s = score_train(b, 0) if rows is None else _scatter(
            {k: v for k, v in score_train(b.take(rows if len(rows) else np.array([0])),
                                          0).items() if k in want or k in _READ}, rows, n)
        chips = b.tp * b.pp * b.dp * b.cp
        tokens = extra["tokens"]
        s["num_chips"] = chips
        s["tokens_per_s"] = s["tokens_per_s_per_chip"] * chips
        s["train_steps"] = tokens / (b.global_batch_seqs * b.seq_len)
        s["train_time_s"] = tokens / s["tokens_per_s"]
        s["train_cost_usd"] = s["usd_per_trillion_tokens"] * tokens / 1e12
        s["train_energy_j"] = s["energy_j_per_token"] * tokens
        s["hbm_used_fraction"] = s["memory_per_chip_bytes"] / b.hbm_capacity_bytes
    bits = bits | np.where(b.precision_native > 0, 0, 512)
    bits = bits | np.where(valid & ~(s["memory_per_chip_bytes"] <= b.hbm_capacity_bytes), MEMORY_BIT,
                           0)
    s["reason"] = bits
    s["feasible"] = bits == 0
    return {k: np.broadcast_to(s[k], (n,)) for k in want}


@lru_cache(maxsize=1024)
def _numbers(p, dtype) -> np.ndarray:
    """A numeric parameter's values in the scorer's precision (indexed by grid codes)."""
    return np.asarray(p.values, dtype)


def score_index(space, ids, metrics=None, dtype=np.float32) -> dict:
    """The metrics of the designs of flat indices ``ids``."""
    ids = np.asarray(ids, np.int64)
    if not space.parameters:
        s = score_values(space, {}, metrics=metrics, dtype=dtype)
        return {k: np.broadcast_to(v, (len(ids),)) for k, v in s.items()}
    coords = np.unravel_index(ids, space.shape)
    vals = {p.column: (GridStrings(p.values, c) if any(isinstance(v, str) for v in p.values)
                       else _numbers(p, dtype)[c]) for p, c in zip(space.parameters, coords)}
    grid = {p.column: (p.values, c) for p, c in zip(space.parameters, coords)}
    return score_values(space, vals, metrics=metrics, dtype=dtype, grid=grid)


def breakdown(space, ids) -> pd.DataFrame:
    """The parts of the step and of the memory of designs by flat index (``design_id`` first),
    float64: what a training run keeps of its front (``breakdown.parquet``)."""
    ids = np.asarray(ids, np.int64)
    s = score_index(space, ids, metrics=[*BREAKDOWN, *SHOWN, "bound", "reason"],
                    dtype=np.float64)
    out = pd.DataFrame({"design_id": ids})
    for k in BREAKDOWN + SHOWN:
        out[k] = np.asarray(s[k], np.float64)
    out["bound"] = np.array(BOUNDS, dtype=object)[np.asarray(s["bound"], np.int64)]
    out["reason"] = [reason_text(r) for r in s["reason"]]
    return out
