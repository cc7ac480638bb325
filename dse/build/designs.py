"""From catalog ids and dotted overrides to the scorer's struct of arrays.

A *design table* is a pandas DataFrame with one row per design and dotted columns
(``accelerator.hbm_bw_bytes_per_s``, ``model.num_experts``, ``layout.tp``, ...). ``resolve``
fills every column from the catalog and applies the overrides a case file, a design file or a
search space gives; ``to_batch`` turns the resolved table into ``dse.perf.Batch``. Every command
goes through these two functions.

Both work on the catalog's integer-coded tables (``dse.build.tables``): the catalog columns
of every design are ``table[path][codes]``, the fitted kernel parameters
``kernel[accelerator, runtime]``, and the per-design selections (compute dtype, kernel family,
topology numbers) are numpy on codes (``dse.build.select``): no Python work per design.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from dse import catalog
from dse.build import tables
from dse.spec import fields
from dse.build import mechanisms
from dse.spec import validate
from dse.build.select import (ATTN_DECODE_KEYS, ATTN_PREFILL_KEYS, GEMM_KEYS, KERNEL,  # noqa: F401
                              MOE_KEYS, dtype_columns, encode, kernel_fields, lookup,
                              topology_columns)
from dse.build.tables import ACC_FIELDS, EFF_FIELDS, MODEL_FIELDS, TOPO_FIELDS  # noqa: F401
from dse.build.runtimes import runtime_defaults
from dse.errors import InputError, suggest
from dse.perf import Batch
from dse.perf import kernel_comm
from dse.catalog.specs import DTYPES
from dse.catalog.specs import DTYPE_BYTES

# settable paths that are not read from a catalog entry, with their defaults (dse/spec/fields.py);
# the serving runtime's from dse/catalog/serving.toml (sources there)
DEFAULTS: dict[str, object] = {
    **fields.defaults(),
    **{f"serving.{k}": v for k, v in catalog.serving_defaults().items()},
    **{f"cost.scaleup_tier_{k}": v for k, v in catalog.cost_model()["scaleup_tier"].items()},
}
PHASES = {"both": 0, "prefill": 1, "decode": 2}
SERVING_MODES = {"aggregated": 0.0, "disaggregated": 1.0}
DENSE_MLP = {"split": 0.0, "replicated": 1.0}
A2A_KERNELS = {"auto": 0.0, "low_latency": 1.0, "normal": 2.0}
CAPEX_MODELS = ("catalog", "components")
STRING_PATHS = fields.string_paths()
# the specs the component cost model prices, and the catalog values they are compared with
COMPONENT_SPECS = {"hbm_capacity": "accelerator.hbm_capacity_bytes",
                   "hbm_bandwidth": "accelerator.hbm_bw_bytes_per_s",
                   "scaleup": "topology.scaleup.link_bw_bytes_per_s",
                   "scaleout": "topology.scaleout.link_bw_bytes_per_s",
                   **{f"compute.{d}": f"accelerator.peak_flops_per_s.{d}" for d in DTYPES}}


def settable_paths() -> list[str]:
    """Every dotted path a design, case or space may set (the registry's resolved fields)."""
    return fields.paths()


def _ids(table: pd.DataFrame, col: str, kind: str, file, row_names, alias=None) -> pd.Series:
    known = catalog.table(kind)
    ids = table[col].astype(str).str.strip()
    bad = ~ids.isin(list(known))
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise InputError(f"unknown {SINGULAR[kind]} id {ids.iloc[i]!r}", file=file,
                         where=f"{row_names[i]}, column {(alias or {}).get(col, col)}",
                         hint=suggest(ids.iloc[i], known, f"valid {kind}"))
    return ids


def _row_names(table: pd.DataFrame) -> list[str]:
    if "case_id" in table.columns:
        return [f"row {i + 2} (case_id {c})" for i, c in enumerate(table["case_id"].astype(str))]
    return [f"design {i}" for i in range(len(table))]


SINGULAR = {"accelerators": "accelerator", "topologies": "topology", "models": "model"}


def resolve(table: pd.DataFrame, *, file: str | None = None, row_names: list[str] | None = None,
            aliases: dict[str, str] | None = None) -> pd.DataFrame:
    """Every settable path for every row: catalog values, then the table's own overrides.

    ``row_names`` and ``aliases`` (dotted path -> the user's column name) make errors name the
    user's row and column rather than internal ones.
    """
    T = tables.tables()
    names = row_names or _row_names(table)
    alias = aliases or {}
    paths = set(settable_paths())
    for col in table.columns:
        if "." in col and col not in paths:
            raise InputError(f"unknown key {col!r}", file=file, hint=suggest(col, paths, "valid keys"))
    for need in ("accelerator.id", "model.id"):
        if need not in table.columns:
            raise InputError(f"missing {need}", file=file, hint="every design names a catalog id")
    n = len(table)
    acc_ids = _ids(table, "accelerator.id", "accelerators", file, names, alias)
    a = encode(acc_ids, T.ids["accelerator"])
    cols = {p: T.columns[p][a] for p in T.paths("accelerator")}
    cols["accelerator.default_topology"] = T.default_topology[a]
    topo_ids = table["topology.id"] if "topology.id" in table.columns else pd.Series([None] * n)
    topo_ids = topo_ids.where(topo_ids.notna() & (topo_ids.astype(str).str.strip() != ""),
                              cols["accelerator.default_topology"])
    topo_ids = _ids(pd.DataFrame({"topology.id": topo_ids.to_numpy()}), "topology.id",
                    "topologies", file, names, alias)
    t = encode(topo_ids, T.ids["topology"])
    cols.update({p: T.columns[p][t] for p in T.paths("topology")})
    model_ids = _ids(table, "model.id", "models", file, names, alias)
    m = encode(model_ids, T.ids["model"])
    cols.update({p: T.columns[p][m] for p in T.paths("model")})
    cols["accelerator.id"] = acc_ids.to_numpy()
    cols["topology.id"] = topo_ids.to_numpy()
    cols["model.id"] = model_ids.to_numpy()
    out = pd.DataFrame({**cols, **DEFAULTS}, index=pd.RangeIndex(n))
    src = table.reset_index(drop=True)
    for col in src.columns:
        if "." not in col or col in ("accelerator.id", "topology.id", "model.id"):
            continue
        if col.startswith(("topology.scaleup.", "topology.scaleout.")):
            continue
        out[col] = _merge(out.get(col), src[col], col, file, names, alias)
    derive_system(out)
    for col in src.columns:
        if col.startswith(("topology.scaleup.", "topology.scaleout.")):
            out[col] = _merge(out[col], src[col], col, file, names, alias)
    # the runtime first: its defaults fill what a design leaves blank
    validate.check_table(out, file=file, names=names, alias=alias,
                         columns=["serving.runtime", "serving.moe_backend"])
    runtime_defaults(out)
    mechanisms.resolve_defaults(out, file, names, alias)   # hook: serving mechanisms (issue 11)
    out = kernel_columns(out)
    _check_values(out, file, names, alias)
    return out


def kernel_columns(out: pd.DataFrame) -> pd.DataFrame:
    """The fitted kernel parameters of each row's (accelerator, runtime), where a design did
    not override them (``accelerator.kernel.<key>``). A chip with no entry (none is missing
    today: the fit writes every catalog chip) takes the mean entry of the runtime. A row whose
    ``serving.moe_backend`` names a kernel takes that backend's MoE parameters where the
    catalog has them (fitted, or transferred from the chips that measured it), auto's else
    (a family no chip measured on that backend)."""
    T = tables.tables()
    a = encode(out["accelerator.id"], T.ids["accelerator"])
    r = encode(out["serving.runtime"], T.runtimes)                   # unknown runtime: the mean
    vals = T.kernel[a, r]
    if "serving.moe_backend" in out.columns:     # a named MoE kernel's own parameters
        b = encode(out["serving.moe_backend"].fillna("auto"), T.moe_backends)
        named = b > 0
        if named.any():
            over = T.backend_kernel[a[named], r[named], b[named]]
            vals = vals.copy()
            vals[named] = np.where(np.isnan(over), vals[named], over)
    new = pd.DataFrame(vals, columns=[KERNEL + k for k in T.kernel_keys], index=out.index)
    wide = wide_ep_kernel_columns(out, T, a, r)
    for col in new.columns:
        if col in out.columns:
            given = pd.to_numeric(out[col], errors="coerce").to_numpy(dtype=float)
            new[col] = np.where(np.isnan(given), new[col].to_numpy(), given)
            w = WIDE_EP + col[len(KERNEL):]
            if w in wide.columns:       # a parameter the design sets holds under wide EP too
                wide[w] = np.where(np.isnan(given), wide[w].to_numpy(), given)
    return pd.concat([out.drop(columns=[c for c in new.columns if c in out.columns]), new, wide],
                     axis=1)


WIDE_EP = "accelerator.kernel_wide_ep."   # the MoE parameters of the runtime's wide-EP kernel


def wide_ep_kernel_columns(out, T, a, r) -> pd.DataFrame:
    """The MoE parameters of the expert kernel a row's runtime runs under wide EP (attention
    DP with ep > 1: the all-to-all hands each rank its rows), where the design leaves
    ``serving.moe_backend`` on auto and the runtime names one (serving.toml [runtimes.*]
    ``wide_ep_moe_backend``: SGLang's DeepEP path runs DeepGEMM) with fitted parameters for the
    chip (dse/catalog/kernels/moe_wideep.toml); NaN elsewhere. ``to_batch`` takes them for the
    rows whose layout is wide EP (``wide_ep_moe_fields``); a layout is numeric in a space, so
    the choice is the batch's, not the resolution's."""
    names = {rt: v.get("wide_ep_moe_backend") for rt, v in catalog.runtime_defaults().items()}
    code = np.array([T.moe_backends.index(names[rt]) if names.get(rt) in T.moe_backends
                     else -1 for rt in T.runtimes] + [-1])
    bk = code[r]
    if "serving.moe_backend" in out.columns:
        bk = np.where(encode(out["serving.moe_backend"].fillna("auto"), T.moe_backends) > 0,
                      -1, bk)
    named = sorted({int(c) for c in code if c >= 0})
    # (only the keys some chip has for those backends: fp8_block's today)
    keys = [i for i, k in enumerate(T.kernel_keys) if k.startswith("moe_")
            and named and np.isfinite(T.backend_kernel[:, :, named, i]).any()]
    vals = np.full((len(out), len(keys)), np.nan)
    on = bk >= 0
    if on.any():
        vals[on] = T.backend_kernel[a[on], r[on], bk[on]][:, keys]
    return pd.DataFrame(vals, columns=[WIDE_EP + T.kernel_keys[i] for i in keys],
                        index=out.index)


class _Overlay:
    """A resolved table (a DataFrame or a dict of columns) with some columns replaced."""

    def __init__(self, out, over: dict):
        self.out, self.over = out, over

    def __getitem__(self, c):
        return self.over[c] if c in self.over else self.out[c]

    def __contains__(self, c):
        return c in self.over or c in self.out


def wide_ep_moe_fields(out, cols: dict, kernel_args: tuple) -> None:
    """Rows with attention DP and ep > 1 (wide EP) take the MoE fields of their runtime's
    wide-EP kernel where the table has them (``wide_ep_kernel_columns``; the others keep
    their own); ``kernel_args``: ``select.kernel_fields``'s arguments after the table."""
    keys = [c[len(WIDE_EP):] for c in out if str(c).startswith(WIDE_EP)]
    if not keys:
        return
    def f(c):
        return np.asarray(out[c], dtype=float)

    wide = (f("layout.dp") > 1.0) & (f("layout.ep") > 1.0)
    over = {}
    for k in keys:
        w = f(WIDE_EP + k)
        if np.all(np.isnan(w)):
            continue
        over[KERNEL + k] = np.where(np.isnan(w), f(KERNEL + k), w)
    if not over or not wide.any():
        return
    alt = kernel_fields(_Overlay(out, over), *kernel_args)
    for k, v in alt.items():
        if k.startswith("moe_"):
            cols[k] = np.where(wide, v, cols[k])


def moe_kernel_missing(out) -> np.ndarray:
    """1.0 where a row's ``serving.moe_backend`` names a kernel with no fitted (or transferred)
    parameters for its runtime (``flashinfer_trtllm`` under ``trtllm``): the scorer marks an
    MoE design so infeasible with that reason (bit 256), as it does a layout the model cannot
    take, so a space may cross runtimes with backends."""
    if "serving.moe_backend" not in out:
        return np.zeros(1)
    T = tables.tables()
    avail = tables.backend_available(T)                 # [runtime (+1), backend]
    r = encode(out["serving.runtime"], T.runtimes)
    bk = encode(out["serving.moe_backend"], T.moe_backends)     # missing: -1, auto's
    ok = np.where(bk < 0, True, avail[r, np.maximum(bk, 0)])
    return np.where(ok, 0.0, 1.0)


DERIVED = ("topology.scaleup.domain_chips", "topology.scaleup.link_bw_bytes_per_s",
           "topology.scaleout.link_bw_bytes_per_s")
# the columns the derived ones are computed from
FEEDERS = ("topology.domain_chips", "accelerator.scaleup_domain_chips",
           "accelerator.scaleup_link_bw_bytes_per_s", "accelerator.scaleout_link_bw_bytes_per_s",
           "topology.scaleout_oversubscription")


def derive_system(out: pd.DataFrame, keep: set = frozenset()) -> None:
    """The system's numbers: a topology's own domain, else the accelerator's; links from the
    chip (scale-out divided by the fabric's oversubscription). ``keep``: derived columns a
    design set explicitly."""
    f = lambda c: np.asarray(out[c], dtype=float)  # noqa: E731  (a DataFrame or a dict of arrays)
    if "topology.scaleup.domain_chips" not in keep:
        dom = f("topology.domain_chips")
        out["topology.scaleup.domain_chips"] = np.where(np.isnan(dom),
                                                        f("accelerator.scaleup_domain_chips"), dom)
    if "topology.scaleup.link_bw_bytes_per_s" not in keep:
        out["topology.scaleup.link_bw_bytes_per_s"] = f("accelerator.scaleup_link_bw_bytes_per_s")
    if "topology.scaleout.link_bw_bytes_per_s" not in keep:
        out["topology.scaleout.link_bw_bytes_per_s"] = (
            f("accelerator.scaleout_link_bw_bytes_per_s") / f("topology.scaleout_oversubscription"))


def apply_numbers(table, numbers: list, overrides: dict | None, explicit: set):
    """What a space's designs set after their catalog resolution, applied in place to their
    resolved (possibly compact) table and returned: ``numbers`` [(path, "value" | "scale",
    one value or factor per design)] in the space's parameter order, then what-if
    ``overrides`` {path: ("set" | "scale", x)}. A factor multiplies the resolved value
    (``mechanisms.scale_base``: a blank default scales what it stands for); the system's derived
    numbers follow a moved feeder (``derive_system``) unless ``explicit`` paths set them."""
    moved = False
    for path, op, v in numbers:
        if op == "scale":
            table[path] = mechanisms.scale_base(table, path) * np.asarray(v, float)
            moved |= path in FEEDERS
        else:
            table[path] = np.asarray(v, dtype=float)
    for path, (op, value) in (overrides or {}).items():
        cur = np.asarray(table[path], dtype=float)
        table[path] = np.full_like(cur, value) if op == "set" else \
            mechanisms.scale_base(table, path) * value
        moved |= path in FEEDERS
    if moved:
        derive_system(table, keep=(explicit | set(overrides or {})) & set(DERIVED))
    return table


def _merge(base, override: pd.Series, col: str, file, names, alias) -> pd.Series:
    if col in STRING_PATHS:
        given = override.notna().to_numpy()
        text = np.asarray(override.astype(object).where(given, "").astype(str).str.strip(),
                          dtype=object)
        ov = pd.Series(np.where(given & (text != ""), text, None), index=override.index)
        if base is None:
            return ov
        return ov.where(ov.notna(), base)
    num = validate.parse_column(col, override, file=file, names=names, name=alias.get(col, col))
    if base is None:
        return num
    return num.where(num.notna(), pd.to_numeric(base, errors="coerce"))


def _check_values(out: pd.DataFrame, file, names, alias):
    validate.check_table(out, file=file, names=names, alias=alias)


def effective_dtypes(flat: dict) -> dict:
    """The dtypes a resolved design runs, blanks filled as the scorer fills them: the KV cache
    fp8 with fp8/fp4 weights, else bf16; the experts and attention projections the weights'."""
    w = str(flat.get("model.weight_dtype") or "bf16")
    out = {}
    for path in ("model.kv_dtype", "model.expert_dtype", "model.attention_dtype"):
        v = flat.get(path)
        v = "" if v is None or (isinstance(v, float) and v != v) else str(v).strip()
        if not v:
            v = str(kv_dtype_of(w, "")[0]) if path == "model.kv_dtype" else w
        out[path] = v
    return out


def kv_dtype_of(weight_dtype, kv_dtype) -> np.ndarray:
    """The KV cache's element type per row, as the scorer fills a blank ``model.kv_dtype``
    (``effective_dtypes``): fp8 with fp8/fp4 weights, else bf16; arrays or scalars. (Worked
    out once per distinct pair: a predictions table has 200,000 rows of a few dtypes.)"""
    cw, w = _distinct_text(weight_dtype)
    ck, kv = _distinct_text(kv_dtype)
    w = np.where(w == "", "bf16", w)
    blank = np.where(np.isin(w, ("fp8", "fp4")), "fp8", "bf16").astype(object)
    table = np.where(kv[None, :] == "", blank[:, None], kv[None, :]).astype(object)
    n = max(len(cw), len(ck))
    return table[np.broadcast_to(cw, (n,)), np.broadcast_to(ck, (n,))]


def _distinct_text(values) -> tuple[np.ndarray, np.ndarray]:
    """(each value's code, the distinct values as stripped strings, a blank as ""): factorized
    where the values are strings, else one code per value."""
    v = np.asarray(values, dtype=object).ravel()
    if len(v) > 1 and pd.api.types.infer_dtype(v, skipna=True) in ("string", "empty"):
        codes, uniques = pd.factorize(v)                 # a blank (NaN, None): code -1
        text = np.array([*(u.strip() for u in uniques), ""], dtype=object)
        return np.where(codes < 0, len(text) - 1, codes), text
    text = pd.Series(v, dtype=object).fillna("").astype(str).str.strip().to_numpy(dtype=object)
    return np.arange(len(v)), text


def kv_dtype_text(values) -> str:
    """The KV cache's element types of some designs in words: ``fp8 (1 B per element)``, or
    ``bf16 (2 B per element, 3 of 5 designs), fp8 (1 B per element, 2 of 5 designs)``."""
    values = np.asarray(values, dtype=object).ravel()
    kinds = pd.Series(values).value_counts().sort_index()      # by name: a stable line
    return ", ".join(f"{k} ({DTYPE_BYTES.get(k, float('nan')):g} B per element"
                     + (f", {c} of {len(values)} designs)" if len(kinds) > 1 else ")")
                     for k, c in kinds.items())


def catalog_specs(out) -> dict[str, np.ndarray]:
    """What the catalog system of each design has, for the specs the component cost model
    prices (``COMPONENT_SPECS``): the chip's own values and the links derived from the chip and
    its topology (``derive_system``), read from the ids, whatever the design overrides."""
    T = tables.tables()
    a = encode(out["accelerator.id"], T.ids["accelerator"])
    t = encode(out["topology.id"], T.ids["topology"])
    cat = {p: T.columns[p][t if p.startswith("topology.") else a] for p in FEEDERS}
    derive_system(cat)
    return {p: np.asarray(cat[p] if p in cat else T.columns[p][a], dtype=float)
            for p in COMPONENT_SPECS.values()}


def component_factors(out) -> dict[str, np.ndarray]:
    """Factors on the catalog capex and power: 1 with cost.capex_model = "catalog"; with
    "components", fixed + sum of each component's share x its spec / the catalog chip's spec
    (compute: the precision scaled most)."""
    f = lambda c: np.asarray(out[c], dtype=float)  # noqa: E731
    on = encode(out["cost.capex_model"], CAPEX_MODELS) == 1
    if not np.any(on):
        return {"capex": np.ones(1), "power": np.ones(1)}
    cat = catalog_specs(out)
    ratio = {k: f(p) / cat[p] for k, p in COMPONENT_SPECS.items()}
    compute = [ratio.pop(k) for k in list(ratio) if k.startswith("compute.")]
    ratio["compute"] = functools.reduce(np.maximum, (np.where(np.isfinite(r), r, 0.0)
                                                     for r in compute))
    shares = catalog.cost_model()
    out_f = {}
    for part in ("capex", "power"):
        sh = shares[part]
        v = sh["fixed"] + sum(sh[k] * r for k, r in ratio.items())
        out_f[part] = np.where(on, v, 1.0)
    return out_f


def scaleup_tier_units(out) -> np.ndarray:
    """800 Gb/s units of a chip's scale-up bandwidth (per direction) that pay for a second switch
    tier: all of them when the scale-up domain is larger than both one rack and the catalog
    system's own domain (whose capex already holds its switch stages: an NVL72 rack's trays, a
    TPU pod's torus), else none (cost_model.toml [scaleup_tier])."""
    f = lambda c: np.asarray(out[c], dtype=float)  # noqa: E731
    own = f("topology.domain_chips")
    own = np.where(np.isnan(own), f("accelerator.scaleup_domain_chips"), own)
    paid = np.maximum(own, f("topology.rack_chips"))
    bits = f("topology.scaleup.link_bw_bytes_per_s") * 8.0
    return np.where(f("topology.scaleup.domain_chips") > paid, bits / 800e9, 0.0)


# settable paths that are exactly one scorer field and feed no other (see to_batch)
DIRECT_FIELDS = {"workload.isl": "isl", "workload.osl": "osl", "workload.concurrency": "concurrency",
                 "workload.prefix_hit_fraction": "prefix_hit_fraction",
                 "workload.prefill_concurrency": "prefill_concurrency",
                 "workload.demand_output_tokens_per_s": "demand_output_tokens_per_s",
                 "serving.prefill_chip_ratio": "prefill_chip_ratio",
                 "serving.max_batch_size": "max_batch_size",
                 "serving.max_num_tokens": "max_num_tokens",
                 "serving.kv_memory_fraction": "kv_memory_fraction",
                 "serving.runtime_reserve_bytes": "runtime_reserve_bytes",
                 "cost.amortization_years": "amortization_years", "cost.pue": "pue",
                 "cost.electricity_usd_per_kwh": "electricity_usd_per_kwh",
                 **mechanisms.DIRECT}    # hook: serving mechanisms (issue 11)


AR_RULE_FIELDS = ("ar_oneshot_below_2_bytes", "ar_oneshot_below_4_bytes",
                  "ar_oneshot_below_bytes")


def tp2d_columns(out, topo) -> dict:
    """2D weight-stationary tp, the KV cache split by sequence and collectives on the links
    (dse.perf.tp2d): the layout fields, the topology's switch and the tp group's axis groups'
    shares of the topology (none where no row uses them)."""
    f = lambda c: np.asarray(out[c], dtype=float)  # noqa: E731
    tpx = f("layout.tp_x") if "layout.tp_x" in out else np.ones(1)
    kv = lookup(out["layout.kv_sharding"], {"batch": 1.0}, 0.0).astype(float) \
        if "layout.kv_sharding" in out else np.zeros(1)
    link = f("topology.link_collectives") if "topology.link_collectives" in out else np.zeros(1)
    if not (np.any(tpx != 1.0) or np.any(kv != 0.0) or np.any(link != 0.0)):
        return {}
    return {"tp_x": tpx, "kv_batch": kv, "link_collectives": link,
            "tp_x_bw_fraction": topo["tp_x"],
            "tp_yz_bw_fraction": topo["tp_yz"], "tp_a2a_bw_fraction": topo["tp_a2a"],
            "tp_x_latency_s": topo["tp_x_latency"], "tp_yz_latency_s": topo["tp_yz_latency"]}


def allreduce_rule_columns(out) -> dict:
    """The runtime's all-reduce selection by message size (serving.toml [runtimes.*]
    allreduce_oneshot_below_bytes; 0 where a runtime has none: the fastest branch)."""
    table = catalog.runtime_defaults()
    rt = out["serving.runtime"]
    return {name: lookup(rt, {r: float(v["allreduce_oneshot_below_bytes"][i])
                              for r, v in table.items()
                              if "allreduce_oneshot_below_bytes" in v}, 0.0).astype(float)
            for i, name in enumerate(AR_RULE_FIELDS)}


def to_batch(out, compact: bool = False, dtype=np.float64) -> Batch:
    """The resolved design table (a DataFrame, or a dict of columns) as the scorer's arrays.

    ``compact``: the dict may hold length-1 columns (the same value for every design); they
    stay length-1 in the Batch, which broadcasts them. ``dtype``: the Batch's precision
    (the fields are derived in float64 and emitted in it: float32 for the search)."""
    f = lambda c: np.asarray(out[c], dtype=float)  # noqa: E731
    matmul, attn, wbytes, kvbytes, low_bits, fam, kv_fp8, peak = dtype_columns(out)
    L = f("model.num_hidden_layers")
    n_exp = f("model.num_experts")
    step = np.maximum(f("model.moe_layer_step"), 1.0)
    n_moe = np.where(n_exp > 0, np.floor((L - f("model.first_k_dense_replace")) / step), 0.0)
    topo = topology_columns(out)
    components = component_factors(out)
    tier = scaleup_tier_units(out)
    # hook: per-op precision (dse.build.mechanisms): the experts' and attention's own dtypes
    prec = mechanisms.precision_columns(out, wbytes, matmul, fam, peak)
    kernel_args = (fam, kv_fp8, peak, f("model.kv_lora_rank") > 0, prec.pop("moe_family"))
    cols = {
        "n_layers": L, "hidden": f("model.hidden_size"), "n_heads": f("model.num_attention_heads"),
        "n_kv_heads": f("model.num_key_value_heads"), "head_dim": f("model.head_dim"),
        "ffn_dense": f("model.intermediate_size"), "vocab": f("model.vocab_size"),
        "tied": f("model.tie_word_embeddings"), "mlp_mats": np.where(f("model.mlp_gated") > 0, 3.0, 2.0),
        "n_experts": n_exp, "top_k": f("model.num_experts_per_tok"),
        "ffn_expert": f("model.moe_intermediate_size"), "n_shared": f("model.n_shared_experts"),
        "ffn_shared": f("model.shared_expert_intermediate_size"),
        "n_dense_layers": L - n_moe, "n_moe_layers": n_moe,
        "q_lora": f("model.q_lora_rank"), "kv_lora": f("model.kv_lora_rank"),
        "qk_nope": f("model.qk_nope_head_dim"), "qk_rope": f("model.qk_rope_head_dim"),
        "v_head": f("model.v_head_dim"), "window_tokens": f("model.sliding_window"),
        "n_local_layers": f("model.num_local_attention_layers"),
        "weight_bytes": wbytes, "kv_bytes": kvbytes, "act_bytes": 2.0,
        "dispatch_bytes": np.where(low_bits, 1.0, 2.0),
        "matmul_flops_per_s": matmul, "attn_flops_per_s": attn,
        "hbm_bw_bytes_per_s": f("accelerator.hbm_bw_bytes_per_s"),
        "hbm_capacity_bytes": f("accelerator.hbm_capacity_bytes"),
        **{k: f(f"accelerator.efficiency.{k}") for k in EFF_FIELDS},
        **{k: f(KERNEL + k) for k in kernel_comm.KEYS},
        **kernel_fields(out, *kernel_args),
        "domain_chips": f("topology.scaleup.domain_chips"),
        "scaleup_bw_bytes_per_s": f("topology.scaleup.link_bw_bytes_per_s"),
        "scaleup_latency_s": topo["latency"],
        "scaleout_bw_bytes_per_s": f("topology.scaleout.link_bw_bytes_per_s"),
        "scaleout_latency_s": f("topology.scaleout_latency_s"),
        "tp_bw_fraction": topo["tp"],
        "tp_bw_rel": topo["tp_rel"], "ffn_bw_rel": topo["ffn_rel"], "a2a_bw_rel": topo["a2a_rel"],
        "rack_chips": f("topology.rack_chips"),
        "scaleup_extra_latency_s": topo["extra_latency"],
        "a2a_mode": lookup(out["serving.a2a_kernel"], A2A_KERNELS).astype(float),
        "two_batch_overlap": lookup(out["serving.ep_overlap"], {"tbo": 1.0}, 0.0).astype(float),
        "moe_kernel_missing": moe_kernel_missing(out),
        "alltoall_overlap_fraction": f("serving.alltoall_overlap_fraction"),
        "tp": f("layout.tp"), "pp": f("layout.pp"), "ep": f("layout.ep"), "dp": f("layout.dp"),
        "dense_replicated": lookup(out["layout.dense_mlp"], DENSE_MLP).astype(float),
        **tp2d_columns(out, topo),
        "disaggregated": lookup(out["serving.mode"], SERVING_MODES).astype(float),
        **{f"prefill_{k}": np.where(f(f"layout.prefill_{k}") > 0, f(f"layout.prefill_{k}"),
                                    f(f"layout.{k}")) for k in ("tp", "pp", "ep", "dp")},
        "prefill_concurrency": f("workload.prefill_concurrency"),
        "demand_output_tokens_per_s": f("workload.demand_output_tokens_per_s"),
        "prefill_chip_ratio": f("serving.prefill_chip_ratio"),
        "isl": f("workload.isl"), "osl": f("workload.osl"),
        "concurrency": f("workload.concurrency"),
        "prefix_hit_fraction": f("workload.prefix_hit_fraction"),
        "phase": lookup(out["workload.phase"], PHASES).astype(float),
        "max_batch_size": f("serving.max_batch_size"), "max_num_tokens": f("serving.max_num_tokens"),
        "kv_memory_fraction": f("serving.kv_memory_fraction"),
        "runtime_reserve_bytes": f("serving.runtime_reserve_bytes"),
        "rental_usd_per_hour": f("accelerator.price_usd_per_hour"),
        "capex_usd": f("accelerator.capex_usd") * components["capex"]
        + tier * f("cost.scaleup_tier_usd_per_800g"),
        "amortization_years": f("cost.amortization_years"),
        "power_w": f("accelerator.all_in_power_w") * components["power"]
        + tier * f("cost.scaleup_tier_w_per_800g"), "pue": f("cost.pue"),
        "electricity_usd_per_kwh": f("cost.electricity_usd_per_kwh"),
        "use_rental": lookup(out["cost.mode"], {"rental": 1.0}, 0.0).astype(float),
        **mechanisms.batch_columns(out, kvbytes),     # hook: serving mechanisms (issue 11)
        **prec,
        **allreduce_rule_columns(out),
    }
    wide_ep_moe_fields(out, cols, kernel_args)     # the runtime's wide-EP expert kernel
    return Batch.from_columns(cols, compact=compact, dtype=dtype)


__all__ = ["A2A_KERNELS", "ACC_FIELDS", "ATTN_DECODE_KEYS", "ATTN_PREFILL_KEYS", "CAPEX_MODELS",
           "COMPONENT_SPECS", "DEFAULTS", "DENSE_MLP", "DERIVED", "DIRECT_FIELDS", "EFF_FIELDS",
           "FEEDERS", "GEMM_KEYS", "KERNEL", "MODEL_FIELDS", "MOE_KEYS", "PHASES",
           "SERVING_MODES", "STRING_PATHS", "TOPO_FIELDS", "component_factors", "derive_system",
           "effective_dtypes", "kernel_columns", "lookup", "resolve", "runtime_defaults",
           "settable_paths", "to_batch"]
