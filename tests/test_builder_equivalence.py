"""The builder gives, bit for bit, the numbers frozen in golden arrays for fixed inputs.

tests/golden/builder.npz holds what the builder (``dse.build.designs.resolve`` and ``to_batch``,
``dse.build.space.Space.batch`` and ``batch_from_values``) produced for the inputs below. It was
first generated from frozen copies of the builder before issue 10 item 7 (the catalog as
integer-coded tables), which the current builder then matched bit for bit; those copies are gone
and the goldens are the reference now. The inputs are regenerated here from fixed seeds:

- mixed designs: every accelerator and model (MoE and MLA among them), every weight dtype, KV
  dtypes, fp8 scalings, runtimes, topologies, layouts, serving phases, cost modes, overrides of
  catalog, derived and kernel fields, and the serving mechanisms' fields of issue 11 (per-op
  dtypes, expert imbalance, lengths, KV tier): the resolved table's settable-path columns
  (``settable_paths()``; internal columns such as ``reference.*`` are not frozen), the Batch and
  the scored metrics;
- every shipped space's designs (``spaces/*.toml``, ``spaces/questions/*.toml``, scale factors
  included, disaggregated serving among them) through ``Space.batch``, and a what-if re-scoring
  (``batch_from_values`` with overrides): the Batches and the scored metrics;
- a hypothetical-chip sweep (every design a distinct chip) and a grid with more structural
  combinations than ``FULL_RESOLVE``, built in overlapping calls: the Batches (and the sweep's
  metrics).

How the goldens are compared:

- Batch fields (which fields are present, too) and resolved columns: exactly (float64 equality,
  NaN == NaN; ints, booleans, strings and dtypes exactly). Where full arrays compress well they
  are stored whole; for the mixed designs (random overrides: high entropy) the golden keeps the
  full arrays of a subset of the designs, chosen to include every value of every string column
  (every catalog accelerator, model, topology, dtype, runtime), and a SHA-256 per column over
  every design's values.
- The four Batch fields from the topology reduction's max flows are stored whole (FLOW_FIELDS).
- Scored metrics, for a subset of each case's designs: relative 1e-12, NaN == NaN (integers and
  booleans exactly), as before, because numpy's exp/log may round differently in the last bit on
  another CPU. The scorer's own goldens are tests/test_goldens.py.

A failure names the case, the field or column and the first differing design (its inputs),
or, for a mixed design whose values the golden does not keep, the column whose SHA-256 differs.

Regenerate only after an intended change of what the builder produces (a builder change; a
catalog or scorer change moves these numbers too), and say why in the commit
(PYTHONHASHSEED=0 makes the file's bytes reproducible):
    PYTHONHASHSEED=0 DSE_UPDATE_GOLDENS=1 python -m pytest tests/test_builder_equivalence.py
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd
import pytest

from helpers import ROOT

from dse import catalog
from dse.build import designs as build
from dse.build import tables
from dse.build.space import load_space
from dse.catalog.specs import DTYPES
from dse.perf import score

GOLDEN = ROOT / "tests" / "golden" / "builder.npz"
UPDATE = bool(os.environ.get("DSE_UPDATE_GOLDENS"))
N = 3000
KEEP_MIXED = 300      # mixed designs whose full arrays the golden keeps (all: a SHA-256 per column)
KEEP_SCORES = 48      # designs per space whose metrics the golden keeps
SCORE_RTOL = 1e-12
# Batch fields from the topology reduction's max flows (dse.catalog.topology.reduce): networkx's
# preflow-push visits nodes in an order that follows Python's per-process string hashing, so
# the reduction rounds the flow to 12 digits (the last bits varied by up to 3 ulp from one
# process to the next before); stored whole and compared exactly like every other field
# (FLOW_ULPS: the ulp a comparison of them allows).
FLOW_FIELDS = ("tp_bw_fraction", "tp_bw_rel", "ffn_bw_rel", "a2a_bw_rel")
FLOW_ULPS = 0
# the mixed designs' string columns whose every value the kept designs include
COVER = ("accelerator.id", "model.id", "topology.id", "model.weight_dtype", "model.kv_dtype",
         "model.fp8_scaling", "model.expert_dtype", "model.attention_dtype", "serving.runtime",
         "serving.ep_overlap", "serving.a2a_kernel", "serving.kv_offload", "layout.dense_mlp",
         "workload.phase", "cost.mode", "cost.capex_model")


def mixed_designs(n: int = N, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    accs, models = list(catalog.accelerators()), list(catalog.models())
    moe = np.array([catalog.models()[m].num_experts > 0 for m in models])
    model = rng.choice(models, n)
    tp = rng.choice([1, 2, 4, 8], n)
    dp = rng.choice([1, 2, 4], n)
    is_moe = moe[[models.index(m) for m in model]]
    ep = np.where(is_moe & (rng.random(n) < 0.5), tp * dp, 1)
    nan = lambda p, v: np.where(rng.random(n) < p, v, np.nan)  # noqa: E731
    d = pd.DataFrame({
        "accelerator.id": rng.choice(accs, n), "model.id": model,
        "topology.id": rng.choice(["", "", "hgx-8", "nvl72", "pcie-8", "mi-8", "tpu-torus-3d",
                                   "tpu-torus-2d", "trn2-ultraserver"], n),
        "model.weight_dtype": rng.choice(list(DTYPES), n),
        "model.kv_dtype": rng.choice(["", "", "fp8", "bf16", "fp16"], n),
        "model.fp8_scaling": rng.choice(["auto", "tensor", "block"], n),
        "serving.runtime": rng.choice(["trtllm", "sglang", "vllm"], n),
        "serving.ep_overlap": rng.choice(["none", "tbo"], n),
        "serving.a2a_kernel": rng.choice(["auto", "low_latency", "normal"], n),
        "layout.dense_mlp": rng.choice(["auto", "split", "replicated"], n),
        "workload.phase": rng.choice(["both", "both", "prefill", "decode"], n),
        "cost.mode": rng.choice(["ownership", "rental"], n),
        "cost.capex_model": rng.choice(["catalog", "components"], n),
        "layout.tp": tp, "layout.dp": dp, "layout.ep": ep, "layout.pp": rng.choice([1, 2], n),
        "workload.isl": rng.choice([128, 1024, 8192], n),
        "workload.osl": rng.choice([64, 512], n),
        "workload.concurrency": rng.integers(1, 1024, n),
        # overrides, blank (NaN) on most rows: a catalog field, a dtype the chip may lack,
        # derived system fields and a fitted kernel parameter
        "accelerator.hbm_bw_bytes_per_s": nan(0.3, rng.uniform(1e12, 1e13, n)),
        "accelerator.peak_flops_per_s.fp8": nan(0.1, rng.uniform(5e14, 5e15, n)),
        "accelerator.scaleup_link_bw_bytes_per_s": nan(0.2, rng.uniform(1e11, 2e12, n)),
        "topology.scaleup.domain_chips": nan(0.2, rng.choice([8, 16, 32, 64], n)),
        "topology.scaleup.link_bw_bytes_per_s": nan(0.1, rng.uniform(1e11, 2e12, n)),
        "accelerator.kernel.gemm_bf16_fraction": nan(0.2, rng.uniform(0.3, 0.9, n)),
        "accelerator.kernel.ar_nccl_fraction": nan(0.2, rng.uniform(0.3, 0.9, n)),
        # serving mechanisms (issue 11): per-op precision, expert imbalance and redundant
        # experts, length distributions, a KV offload tier and a shared prefix
        "model.expert_dtype": rng.choice(["", "", "fp4", "fp8", "bf16"], n),
        "model.attention_dtype": rng.choice(["", "", "fp8", "bf16"], n),
        "serving.expert_imbalance": nan(0.3, rng.uniform(1.0, 1.5, n)),
        "serving.redundant_experts": nan(0.2, rng.choice([0, 8, 32], n)),
        "workload.isl_cv": nan(0.2, rng.uniform(0.0, 1.0, n)),
        "serving.kv_offload": rng.choice(["none", "none", "host"], n),
        "workload.prefix_tokens": nan(0.2, rng.choice([0, 64, 512], n)),
    })
    return d


SPACES = sorted(p for p in glob.glob(str(ROOT / "spaces" / "*.toml")) +
                glob.glob(str(ROOT / "spaces" / "questions" / "*.toml"))
                if 'task = "train"' not in open(p).read())   # training spaces: test_train_space
# what-if re-scoring: an override of a catalog field and of a system feeder
WHATIF = {"accelerator.hbm_bw_bytes_per_s": ("scale", 1.5),
          "accelerator.scaleup_link_bw_bytes_per_s": ("set", 9e11)}

SWEEP = """
name = "sweep"
[accelerator]
id = "b200"
[topology]
id = "nvl72"
[model]
id = "deepseek-v3"
weight_dtype = "fp4"
[layout]
dp = 8
ep = 8
[cost]
capex_model = "components"
[parameters]
"accelerator.id" = ["b200", "h200-sxm", "mi300x"]
"serving.runtime" = ["sglang", "trtllm"]
"accelerator.peak_flops_per_s.fp4" = { scale = [0.5, 1.0, 2.0] }
"accelerator.hbm_bw_bytes_per_s" = { scale = [0.5, 1.3, 2.0] }
"accelerator.scaleup_link_bw_bytes_per_s" = { scale = [0.5, 2.0] }
"topology.scaleup.domain_chips" = [8, 16, 72]
"accelerator.kernel.moe_fp4_fraction" = { scale = [0.8, 1.0] }
"model.expert_dtype" = ["", "fp8"]
"layout.tp" = [1, 2, 8]
"workload.concurrency" = [16, 256, 4096]
[objectives]
usd_per_mtok_output = "minimize"
"""

BIG_GRID = """
name = "big-grid"
[accelerator]
id = "h100-sxm"
[model]
id = "llama-3.1-8b"
[parameters]
"accelerator.id" = ["a100-sxm-80g", "h100-sxm", "h200-sxm", "b200", "mi300x", "tpu-v6e", "l40s"]
"model.weight_dtype" = ["bf16", "fp8", "fp4", "int8", "int4", "fp16"]
"model.kv_dtype" = ["", "fp8", "bf16"]
"model.fp8_scaling" = ["auto", "tensor", "block"]
"serving.runtime" = ["trtllm", "sglang", "vllm"]
"serving.ep_overlap" = ["none", "tbo"]
"cost.mode" = ["ownership", "rental"]
"layout.tp" = [1, 2]
[objectives]
usd_per_mtok_output = "minimize"
"""


# --- what the builder gives for each case ---

@dataclass
class Case:
    """One case's outputs: {group: {column: full-length array}}, its metrics for given rows,
    and a description of design ``i`` of a group (for failure messages)."""
    groups: dict
    scores: Callable[[np.ndarray], dict] | None
    describe: Callable[[str, int], str]
    keep: dict          # group -> the rows whose full arrays a new golden keeps (None: all)


def _load_text(text: str, name: str):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(text)
        return load_space(path)


def _describe_space(space, idx: dict) -> Callable[[str, int], str]:
    def describe(group: str, i: int) -> str:
        j = int(idx[group][i])
        vals = {k: v[0] for k, v in space.values_at(np.array([j])).items()}
        return f"grid index {j}: " + ", ".join(f"{k}={v}" for k, v in vals.items())
    return describe


def _kept_covering(table: dict, n: int, k: int) -> list[int]:
    """The first row with each value of each COVER column, then the first rows up to k."""
    rows = set()
    for c in COVER:
        _, first = np.unique(np.asarray(table[c], dtype=str), return_index=True)
        rows.update(int(i) for i in first)
    i = 0
    while len(rows) < min(k, n):
        rows.add(i)
        i += 1
    return sorted(rows)


def _even(n: int, k: int) -> list[int]:
    return sorted({int(i) for i in np.linspace(0, n - 1, min(n, k)).round()})


@functools.cache
def case_mixed() -> Case:
    d = mixed_designs()
    table = build.resolve(d)
    paths = set(build.settable_paths())
    b = build.to_batch(table)
    cols = {c: table[c].to_numpy() for c in table.columns if c in paths}
    cols = {c: (v, str(table[c].dtype)) for c, v in cols.items()}

    def describe(group: str, i: int) -> str:
        r = d.iloc[i]
        keys = ("accelerator.id", "model.id", "topology.id", "model.weight_dtype",
                "serving.runtime", "layout.tp", "layout.dp", "layout.ep", "layout.pp")
        return f"mixed_designs() row {i}: " + ", ".join(f"{k}={r[k]}" for k in keys)
    keep = _kept_covering({c: v for c, (v, _) in cols.items()}, len(d), KEEP_MIXED)
    batch = {k: v for k, v in b.expanded().columns.items() if k not in FLOW_FIELDS}
    flows = {k: v for k, v in b.expanded().columns.items() if k in FLOW_FIELDS}
    # the flow fields whole (compared within FLOW_ULPS, which a SHA-256 cannot do)
    return Case({"table": cols, "batch": batch, "batch-topology": flows},
                lambda rows: score(b.take(np.asarray(rows))), describe,
                {"table": keep, "batch": keep, "batch-topology": None, "scores": keep})


@functools.cache
def case_space(path: str) -> Case:
    space = load_space(path)
    rng = np.random.default_rng(1)
    idx = np.sort(rng.choice(space.size, min(space.size, 2000), replace=False))
    b, _ = space.batch(idx)
    b = b.expanded()
    w, _ = space.batch_from_values(space.values_at(idx[:300]), WHATIF)
    return Case({"batch": b.columns, "whatif": w.expanded().columns},
                lambda rows: score(b.take(np.asarray(rows))),
                _describe_space(space, {"batch": idx, "whatif": idx[:300], "scores": idx}),
                {"batch": None, "whatif": None, "scores": _even(len(idx), KEEP_SCORES)})


@functools.cache
def case_sweep() -> Case:
    space = _load_text(SWEEP, "sweep.toml")
    idx = np.arange(space.size)
    b, _ = space.batch(idx)
    b = b.expanded()
    return Case({"batch": b.columns}, lambda rows: score(b.take(np.asarray(rows))),
                _describe_space(space, {"batch": idx, "scores": idx}),
                {"batch": None, "scores": _even(len(idx), 4 * KEEP_SCORES)})


@functools.cache
def case_big_grid() -> Case:
    # more structural combinations than FULL_RESOLVE: resolved per call and cached by row;
    # overlapping calls: rows cached by earlier calls mix with new ones
    from dse.build.space import FULL_RESOLVE
    space = _load_text(BIG_GRID, "big.toml")
    assert space.size // 2 > FULL_RESOLVE
    rng = np.random.default_rng(2)
    groups, idxs = {}, {}
    for k in range(3):
        idx = np.sort(rng.choice(space.size, 700, replace=False))
        groups[f"call{k}"], idxs[f"call{k}"] = space.batch(idx)[0].expanded().columns, idx
    return Case(groups, None, _describe_space(space, idxs), {g: None for g in groups})


def _name(path: str) -> str:
    return "space:" + path.split("spaces/")[-1]


CASES: dict[str, Callable[[], Case]] = {
    "mixed": case_mixed,
    **{_name(p): functools.partial(case_space, p) for p in SPACES},
    "sweep": case_sweep,
    "big-grid": case_big_grid,
}


# --- golden file: one .npz; per case and group a JSON entry (columns, dtypes, rows, kept rows,
# SHA-256s) and the kept rows' values as a float64 matrix (numbers) and a str matrix (text) ---

def _split(col) -> tuple[np.ndarray, str]:
    if isinstance(col, tuple):
        return np.asarray(col[0]), col[1]
    a = np.asarray(col)
    return a, str(a.dtype)


def _text(a: np.ndarray) -> np.ndarray:
    """Strings as themselves, anything else (None, NaN) marked so it cannot pass for one."""
    return np.array([v if isinstance(v, str) else "\x00" + repr(v) for v in a.tolist()], dtype=str)


def _is_text(a: np.ndarray) -> bool:
    return a.dtype.kind not in "fiub"


def _canonical(a: np.ndarray) -> np.ndarray:
    """Floats with one NaN and one zero (NaN == NaN, -0.0 == 0.0, as numpy's equality)."""
    if a.dtype.kind == "f":
        return np.ascontiguousarray(np.where(np.isnan(a), np.nan, a) + 0.0, dtype="<f8")
    return np.ascontiguousarray(a, dtype="<i8" if a.dtype.kind in "iu" else "|u1")


def digest(a: np.ndarray) -> str:
    h = hashlib.sha256(f"{a.dtype.kind}:{len(a)}:".encode())
    if _is_text(a):
        h.update("\x1f".join(_text(a).tolist()).encode())
    else:
        h.update(_canonical(a).tobytes())
    return h.hexdigest()


def _metrics(case: Case, rows: list[int]) -> dict:
    return {k: np.asarray(v) for k, v in case.scores(np.asarray(rows, dtype=np.int64)).items()}


def _entry(cols: dict, kept: list[int] | None, hashed: bool, taken: bool = False):
    """The JSON entry and the arrays of one group. ``kept``: the designs whose values are
    stored (None: all); ``taken``: ``cols`` holds only those designs' values (the metrics)."""
    arrays = {k: _split(v) for k, v in cols.items()}
    names = sorted(arrays)
    assert not (hashed and set(names) & set(FLOW_FIELDS)), "flow fields are stored whole"
    n = len(arrays[names[0]][0])
    rows = np.arange(n) if kept is None or taken else np.asarray(kept)
    num = [c for c in names if not _is_text(arrays[c][0])]
    txt = [c for c in names if _is_text(arrays[c][0])]
    meta = {"rows": n, "dtypes": {c: arrays[c][1] for c in names}, "numeric": num, "text": txt,
            "kept": None if kept is None else [int(i) for i in kept], "taken": taken,
            "sha256": {c: digest(arrays[c][0]) for c in names} if hashed else None}
    data = {"num": np.stack([arrays[c][0][rows].astype(np.float64) for c in num])
            if num else np.zeros((0, len(rows))),
            "text": np.stack([_text(arrays[c][0][rows]) for c in txt])
            if txt else np.zeros((0, len(rows)), dtype=str)}
    return meta, data


def write_goldens() -> None:
    meta, data = {}, {}
    for name, make in CASES.items():
        case = make()
        meta[name] = {}
        for group, cols in case.groups.items():
            kept = case.keep[group]
            meta[name][group], arrays = _entry(cols, kept, hashed=kept is not None)
            data.update({f"{name}|{group}|{k}": v for k, v in arrays.items()})
        if case.scores is not None:
            kept = case.keep["scores"]
            meta[name]["scores"], arrays = _entry(_metrics(case, kept), kept, hashed=False,
                                                  taken=True)
            data.update({f"{name}|scores|{k}": v for k, v in arrays.items()})
    data["meta"] = np.array(json.dumps(meta, sort_keys=True, separators=(",", ":")))
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    # an .npz (np.load reads it), LZMA-compressed, with fixed timestamps: same data, same bytes
    with zipfile.ZipFile(GOLDEN, "w") as z:
        for key in sorted(data):
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_LZMA
            with z.open(info, "w") as f:
                np.lib.format.write_array(f, data[key], allow_pickle=False)


@functools.cache
def goldens() -> tuple[dict, dict]:
    if UPDATE or not GOLDEN.exists():
        write_goldens()
    with np.load(GOLDEN, allow_pickle=False) as z:
        data = {k: z[k] for k in z.files}
    return json.loads(str(data.pop("meta"))), data


@pytest.fixture(scope="module")
def golden():
    missing = not GOLDEN.exists()
    g = goldens()
    if missing and not UPDATE:
        pytest.fail(f"{GOLDEN} was missing; written now, commit it")
    return g


# --- comparison ---

def _ulps(a: float, b: float) -> int:
    ia, ib = (int(np.array(x, dtype="<f8").view("<i8")) for x in (a, b))
    ia, ib = (i if i >= 0 else -(1 << 63) - i for i in (ia, ib))
    return abs(ia - ib)


def _first_difference(got: np.ndarray, want: np.ndarray, rtol: float = 0.0,
                      ulps: int = 0) -> int | None:
    """The first position where ``got`` differs from ``want`` (NaN == NaN; floats within
    ``rtol`` relative or ``ulps`` units in the last place where given), or None."""
    same = got == want
    if got.dtype.kind == "f" and want.dtype.kind == "f":
        same |= np.isnan(got) & np.isnan(want)
        with np.errstate(invalid="ignore"):
            if rtol:
                same |= np.abs(got - want) <= rtol * np.abs(want)
            if ulps:
                same |= np.abs(got - want) <= ulps * np.spacing(np.abs(want))
    bad = np.flatnonzero(~np.asarray(same))
    return int(bad[0]) if len(bad) else None


def compare(name: str, group: str, cols: dict, golden, describe, rtol: float = 0.0) -> list:
    """Every difference of ``cols`` from the golden ``name``/``group``, one line each."""
    meta_all, data = golden
    assert name in meta_all, f"{name}: no golden (regenerate: see this file's docstring)"
    meta = meta_all[name][group]
    where = f"{name} [{group}]"
    arrays = {k: _split(v) for k, v in cols.items()}
    want = meta["numeric"] + meta["text"]
    problems = []
    if set(arrays) != set(want):
        problems.append(f"{where}: columns differ: missing {sorted(set(want) - set(arrays))}, "
                        f"new {sorted(set(arrays) - set(want))}")
    # ids: the stored designs; pos: where they are in ``cols``
    ids = np.arange(meta["rows"]) if meta["kept"] is None else np.asarray(meta["kept"])
    pos = np.arange(meta["rows"]) if meta["kept"] is None or meta["taken"] else ids
    n = len(next(iter(arrays.values()))[0])
    if n != meta["rows"]:
        problems.append(f"{where}: {n} designs, golden {meta['rows']}")
    stored = {**dict(zip(meta["numeric"], data[f"{name}|{group}|num"])),
              **dict(zip(meta["text"], data[f"{name}|{group}|text"]))}
    for c in want:
        if c not in arrays:
            continue
        a, dtype = arrays[c]
        if dtype != meta["dtypes"][c]:
            problems.append(f"{where} {c}: dtype {dtype}, golden {meta['dtypes'][c]}")
            continue
        if len(a) != meta["rows"]:
            continue
        g = _text(a[pos]) if c in meta["text"] else a[pos].astype(np.float64)
        i = _first_difference(g, stored[c], rtol if a.dtype.kind == "f" else 0.0,
                              FLOW_ULPS if c in FLOW_FIELDS else 0)
        if i is not None:
            got, exp = g[i], stored[c][i]
            if c in meta["numeric"]:
                got, exp = float(got), float(exp)
                ulp = f" ({_ulps(got, exp)} ulp)" if np.isfinite(got) and np.isfinite(exp) else ""
            else:
                got, exp, ulp = str(got), str(exp), ""
            problems.append(f"{where} {c}: first differing design: {describe(group, int(ids[i]))}"
                            f": got {got!r}, golden {exp!r}{ulp}")
        elif meta["sha256"] is not None and digest(a) != meta["sha256"][c]:
            problems.append(f"{where} {c}: differs (SHA-256 over all {meta['rows']} designs) on "
                            f"a design whose values the golden does not keep (it keeps {len(ids)})")
    return problems


def check_case(name: str, golden, groups=None) -> None:
    """The case's groups (all, or ``groups``) against the goldens; one failure lists them all."""
    case = CASES[name]()
    problems = []
    for group, cols in case.groups.items():
        if groups is None or group in groups:
            problems += compare(name, group, cols, golden, case.describe)
    if case.scores is not None and (groups is None or "scores" in groups):
        kept = golden[0][name]["scores"]["kept"]
        problems += compare(name, "scores", _metrics(case, kept), golden, case.describe,
                            rtol=SCORE_RTOL)
    if problems:
        pytest.fail(f"{len(problems)} difference(s) from tests/golden/{GOLDEN.name} (an intended "
                    "builder change? see this file's docstring):\n" + "\n".join(problems[:40]),
                    pytrace=False)


# --- the tests ---

@pytest.fixture(scope="module")
def designs():
    return mixed_designs()


def test_mixed_designs_cover_what_they_claim(designs):
    m = catalog.models()
    kinds = {("moe" if m[i].num_experts else "dense") + ("-mla" if m[i].kv_lora_rank else "")
             for i in designs["model.id"]}
    assert kinds == {"dense", "moe", "moe-mla"}
    assert set(designs["accelerator.id"]) == set(catalog.accelerators())
    assert set(designs["model.id"]) == set(catalog.models())
    assert set(designs["model.weight_dtype"]) == set(DTYPES)
    assert set(designs["serving.runtime"]) == set(catalog.runtime_defaults())


def test_goldens_cover_the_catalog(golden):
    """The golden's full arrays include every catalog accelerator, model, topology, weight
    dtype and runtime (the mixed designs kept), every serving phase and mode, both cost modes."""
    meta, data = golden
    m = meta["mixed"]["table"]
    text = dict(zip(m["text"], data["mixed|table|text"]))
    assert set(text["accelerator.id"]) == set(catalog.accelerators())
    assert set(text["model.id"]) == set(catalog.models())
    assert set(text["topology.id"]) == set(catalog.topologies())
    assert set(text["model.weight_dtype"]) == set(DTYPES)
    assert set(text["serving.runtime"]) == set(catalog.runtime_defaults())
    assert set(text["workload.phase"]) == set(build.PHASES)
    assert set(text["cost.mode"]) == {"ownership", "rental"}
    assert len(m["kept"]) >= KEEP_MIXED and m["sha256"] is not None and m["rows"] == N
    modes = set()
    for name in meta:
        if name.startswith("space:"):
            b = meta[name]["batch"]
            modes |= set(dict(zip(b["numeric"], data[f"{name}|batch|num"]))["disaggregated"])
    assert modes == set(build.SERVING_MODES.values())
    assert {n for n in meta if n.startswith("space:")} == {_name(p) for p in SPACES}


def test_resolve_gives_the_golden_table(golden):
    check_case("mixed", golden, groups=("table",))


def test_to_batch_and_score_match_the_goldens(golden):
    check_case("mixed", golden, groups=("batch", "batch-topology", "scores"))


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.split("spaces/")[-1])
def test_space_batches_match_the_goldens(path, golden):
    check_case(_name(path), golden)


def test_hypothetical_chip_sweep_matches_the_goldens(golden):
    check_case("sweep", golden)


def test_grid_beyond_full_resolution_matches_the_goldens(golden):
    check_case("big-grid", golden)


def test_tables_follow_a_reloaded_catalog():
    t = tables.tables()
    assert tables.tables() is t                     # built once per process
    acc = catalog.accelerators()
    a = t.ids["accelerator"].index("h100-sxm")
    assert t.columns["accelerator.hbm_bw_bytes_per_s"][a] == acc["h100-sxm"].hbm_bw_bytes_per_s
    assert np.isnan(t.columns["accelerator.peak_flops_per_s.fp4"][a])   # the H100 has no FP4
    r = t.runtimes.index("sglang")
    k = t.kernel_keys.index("gemm_bf16_fraction")
    assert t.kernel[a, r, k] == catalog.kernel_params()[("h100-sxm", "sglang")]["gemm_bf16_fraction"]
    catalog.accelerators.cache_clear()                      # what dse.calibration.fit does after a write
    try:
        assert tables.tables() is not t
    finally:
        catalog.accelerators.cache_clear()


def test_float32_build_is_the_float64_build_converted(designs):
    """The builder's float32 batches (what the search scores) are the float64 ones rounded
    once, column for column, and score the same as the float64 batch converted chunk by chunk;
    so are a space's parts (``Space.batch_parts(dtype=np.float32)``)."""
    from dse.perf import score_chunked
    table = build.resolve(designs)
    b64, b32 = build.to_batch(table), build.to_batch(table, dtype=np.float32)
    assert {v.dtype for v in b32.columns.values()} == {np.dtype(np.float32)}
    assert set(b32.columns) == set(b64.columns)
    for k, v in b64.columns.items():
        np.testing.assert_array_equal(b32.columns[k], v.astype(np.float32), err_msg=k)
    s32, s64 = score_chunked(b32, 1000, np.float32), score_chunked(b64, 1000, np.float32)
    for m, v in s64.items():
        np.testing.assert_array_equal(s32[m], v, err_msg=m)
    space = load_space(str(ROOT / "spaces" / "quickstart.toml"))
    idx = np.arange(min(space.size, 5000), dtype=np.int64)
    d64, r64, x64, _ = space.batch_parts(idx)
    d32, r32, x32, _ = space.batch_parts(idx, dtype=np.float32)
    np.testing.assert_array_equal(r32, r64)
    assert all(v.dtype == np.float32 for v in (*d32.columns.values(), *x32.values()))
    a = score_chunked(d32, 1000, np.float32, rows=r32, direct=x32)
    b = score_chunked(d64, 1000, np.float32, rows=r64, direct=x64)
    for m, v in b.items():
        np.testing.assert_array_equal(a[m], v, err_msg=m)
