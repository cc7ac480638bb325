"""Frozen copy of dse/build/designs.py before the catalog became integer-coded tables (issue 10,
item 7), kept only so that tests/test_builder_equivalence.py can check the new builder
against it. Not used by the package; do not edit (except to port a change of the model's
inputs made on the old builder: issue 11's serving hooks, marked "hook", and the string-based
precision_columns below).

From catalog ids and dotted overrides to the scorer's struct of arrays.

A *design table* is a pandas DataFrame with one row per design and dotted columns
(``accelerator.hbm_bw_bytes_per_s``, ``model.num_experts``, ``layout.tp``, ...). ``resolve``
fills every column from the catalog (joins on the ids, no loop over rows) and applies the
overrides a case file, a design file or a search space gives; ``to_batch`` turns the resolved
table into ``dse.perf.Batch``. Every command goes through these two functions.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse import catalog
from dse.build import mechanisms
from dse.build.designs import allreduce_rule_columns  # noqa: E402  (wired in after the freeze)
from dse.catalog import topology
from dse.catalog.specs import COMPUTE_FALLBACK, DTYPE_BYTES, DTYPES
from dse.errors import InputError, suggest
from dse.perf import Batch, kernel_comm
from dse.spec import fields, validate

ACC_FIELDS = ("hbm_capacity_bytes", "hbm_bw_bytes_per_s", "tdp_w", "scaleup_link_bw_bytes_per_s",
              "scaleup_domain_chips", "scaleout_link_bw_bytes_per_s")
EFF_FIELDS = ("hbm_fraction", "scaleup_fraction", "scaleout_fraction", "layer_overhead_s", "step_overhead_s",
              "network_overlap_fraction")
MODEL_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "intermediate_size", "vocab_size", "tie_word_embeddings", "mlp_gated",
                "num_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
                "shared_expert_intermediate_size", "first_k_dense_replace", "moe_layer_step",
                "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                "sliding_window", "num_local_attention_layers", "num_nextn_predict_layers")
TOPO_FIELDS = ("rack_chips", "scaleup_base_latency_s", "scaleup_hop_latency_s",
               "scaleout_latency_s", "scaleout_oversubscription")

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
KERNEL = "accelerator.kernel."   # prefix of the fitted per-op kernel parameters
REFERENCE = "reference."    # prefix of the catalog values a resolved table keeps


def _catalog_frames():
    accs = catalog.accelerators()
    rows = {}
    for k, a in accs.items():
        r = {f"accelerator.{f}": float(getattr(a, f)) for f in ACC_FIELDS}
        for d in DTYPES:
            v = getattr(a.peak_flops_per_s, d)
            r[f"accelerator.peak_flops_per_s.{d}"] = np.nan if v is None else float(v)
        r["accelerator.price_usd_per_hour"] = a.price.usd_per_hour
        r["accelerator.capex_usd"] = a.price.capex_usd
        r["accelerator.all_in_power_w"] = a.price.all_in_power_w
        for f in EFF_FIELDS:
            r[f"accelerator.efficiency.{f}"] = float(getattr(a.efficiency, f))
        r["accelerator.default_topology"] = a.default_topology
        rows[k] = r
    acc = pd.DataFrame.from_dict(rows, orient="index")
    topo = pd.DataFrame.from_dict({
        k: {**{f"topology.{f}": float(getattr(t, f)) for f in TOPO_FIELDS},
            "topology.domain_chips": np.nan if t.domain_chips is None else float(t.domain_chips)}
        for k, t in catalog.topologies().items()}, orient="index")
    mod = pd.DataFrame.from_dict({
        k: {f"model.{f}": float(getattr(m, f)) for f in MODEL_FIELDS}
        for k, m in catalog.models().items()}, orient="index")
    return acc, topo, mod


_FRAMES = None


def frames():
    global _FRAMES
    if _FRAMES is None:
        _FRAMES = _catalog_frames()
    return _FRAMES


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
    acc, topo, mod = frames()
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
    out = acc.loc[acc_ids.to_numpy()].reset_index(drop=True)
    topo_ids = table["topology.id"] if "topology.id" in table.columns else pd.Series([None] * n)
    topo_ids = topo_ids.where(topo_ids.notna() & (topo_ids.astype(str).str.strip() != ""),
                              out["accelerator.default_topology"].to_numpy())
    topo_ids = _ids(pd.DataFrame({"topology.id": topo_ids.to_numpy()}), "topology.id",
                    "topologies", file, names, alias)
    out = pd.concat([out, topo.loc[topo_ids.to_numpy()].reset_index(drop=True)], axis=1)
    model_ids = _ids(table, "model.id", "models", file, names, alias)
    out = pd.concat([out, mod.loc[model_ids.to_numpy()].reset_index(drop=True)], axis=1)
    out["accelerator.id"] = acc_ids.to_numpy()
    out["topology.id"] = topo_ids.to_numpy()
    out["model.id"] = model_ids.to_numpy()
    for k, v in DEFAULTS.items():
        out[k] = v
    cat = out.copy()
    derive_system(cat)
    for path in COMPONENT_SPECS.values():         # what the catalog chip has (cost model)
        out[REFERENCE + path] = cat[path].to_numpy(dtype=float)
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
    validate.check_table(out, file=file, names=names, alias=alias, columns=["serving.runtime"])
    runtime_defaults(out)
    mechanisms.resolve_defaults(out, file, names, alias)   # hook: serving mechanisms (issue 11)
    out = kernel_columns(out)
    _check_values(out, file, names, alias)
    return out


def kernel_columns(out: pd.DataFrame) -> pd.DataFrame:
    """The fitted kernel parameters of each row's (accelerator, runtime), where a design did
    not override them (``accelerator.kernel.<key>``). A chip with no entry (none is missing
    today: the fit writes every catalog chip) takes the mean entry of the runtime."""
    params = catalog.kernel_params()
    codes, uniques = pd.factorize(pd.MultiIndex.from_arrays(
        [out["accelerator.id"].astype(str), out["serving.runtime"].astype(str)]))
    entries = [params.get(tuple(u), {}) for u in uniques]
    new = {}
    for key in catalog.kernel_keys():
        table = [v[key] for v in params.values() if key in v]
        vals = np.array([e.get(key, np.nan) for e in entries] + [np.nan])[codes]
        col = KERNEL + key
        if col in out.columns:
            given = pd.to_numeric(out[col], errors="coerce").to_numpy(dtype=float)
            vals = np.where(np.isnan(given), vals, given)
        if np.isnan(vals).any():
            vals = np.where(np.isnan(vals), np.mean(table), vals)
        new[col] = vals
    return pd.concat([out.drop(columns=[c for c in new if c in out.columns]),
                      pd.DataFrame(new, index=out.index)], axis=1)


def runtime_defaults(out) -> None:
    """Fill what a design left to its runtime: the max batch per scheduler, and the dense MLP
    of an MoE under attention data parallelism ("auto")."""
    table = catalog.runtime_defaults()
    rt = out["serving.runtime"]
    cap = pd.to_numeric(out["serving.max_batch_size"], errors="coerce") \
        if "serving.max_batch_size" in out.columns else pd.Series(np.nan, index=out.index)
    own = lookup(rt, {r: float(v["max_batch_size"]) for r, v in table.items()})
    out["serving.max_batch_size"] = np.where(np.isnan(cap.to_numpy(dtype=float)), own, cap)
    dm = out["layout.dense_mlp"].astype(object)
    auto = (dm == "auto") | dm.isna()
    if auto.any():
        own = pd.Series(lookup(rt, {r: v["dense_mlp"] for r, v in table.items()}, ""),
                        index=out.index)
        out["layout.dense_mlp"] = dm.where(~auto, own)


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


def _merge(base, override: pd.Series, col: str, file, names, alias) -> pd.Series:
    if col in STRING_PATHS:
        ov = override.astype(object).where(override.notna(), None)
        ov = ov.map(lambda x: None if x is None or str(x).strip() == "" else str(x).strip())
        if base is None:
            return ov
        return ov.where(ov.notna(), base)
    num = validate.parse_column(col, override, file=file, names=names, name=alias.get(col, col))
    if base is None:
        return num
    return num.where(num.notna(), pd.to_numeric(base, errors="coerce"))


def _check_values(out: pd.DataFrame, file, names, alias):
    validate.check_table(out, file=file, names=names, alias=alias)


def lookup(values, mapping: dict, default=np.nan) -> np.ndarray:
    """``mapping[v]`` for every value, through the distinct values only (fast on strings and
    instant on a pandas Categorical); missing or unknown values give ``default``."""
    if isinstance(values, pd.Series):
        values = values.array if isinstance(values.dtype, pd.CategoricalDtype) else values.to_numpy()
    if isinstance(values, pd.Categorical):
        codes, uniques = values.codes, list(values.categories)
    else:
        codes, uniques = pd.factorize(np.asarray(values, dtype=object), use_na_sentinel=True)
        uniques = list(uniques)
    table = np.array([mapping.get(u, default) for u in uniques] + [default])
    return table[codes]     # code -1 (missing) picks the trailing default


def compute_peak(dtypes, peak: dict) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the peak FLOP/s weights of ``dtypes`` compute at (the first dtype of its
    fallback chain the chip has, else bf16) and the GEMM kernel family that selects."""
    w_code = lookup(dtypes, {d: i for i, d in enumerate(COMPUTE_FALLBACK)}, -1)
    matmul = np.full(len(w_code), np.nan)
    for i, (wd, chain) in enumerate(COMPUTE_FALLBACK.items()):
        sel = (w_code == i) & np.isnan(matmul)
        for d in chain:
            take = sel & np.isnan(matmul) & ~np.isnan(peak[d])
            matmul = np.where(take, peak[d], matmul)
    matmul = np.where(np.isnan(matmul), peak["bf16"], matmul)
    # the GEMM kernel family the compute dtype selects (fp8: per-tensor scaled)
    fam = np.where(matmul == peak.get("fp4", np.nan), "fp4",
                   np.where(matmul == peak["fp8"], "fp8", "bf16"))
    fam = np.where(np.isnan(peak["fp8"]) & (fam == "fp8"), "bf16", fam)
    return matmul, fam


def effective_dtypes(flat: dict) -> dict:
    """The dtypes a resolved design runs, blanks filled as the scorer fills them: the KV cache
    fp8 with fp8/fp4 weights, else bf16; the experts and attention projections the weights'."""
    w = str(flat.get("model.weight_dtype") or "bf16")
    out = {}
    for path in ("model.kv_dtype", "model.expert_dtype", "model.attention_dtype"):
        v = flat.get(path)
        v = "" if v is None or (isinstance(v, float) and v != v) else str(v).strip()
        if not v:
            v = ("fp8" if w in ("fp8", "fp4") else "bf16") if path == "model.kv_dtype" else w
        out[path] = v
    return out


def _dtype_columns(out):
    low_bits = lookup(out["model.weight_dtype"], {"fp8": 1.0, "fp4": 1.0}, 0.0) > 0
    kvbytes = lookup(out["model.kv_dtype"], DTYPE_BYTES).astype(float)
    blank_kv = np.isnan(kvbytes)                 # blank: fp8 for fp8/fp4 weights, else bf16
    kvbytes = np.where(blank_kv, np.where(low_bits, 1.0, 2.0), kvbytes)
    kv_fp8 = (lookup(out["model.kv_dtype"], {"fp8": 1.0}, 0.0) > 0) | (blank_kv & low_bits)
    peak = {d: np.asarray(out[f"accelerator.peak_flops_per_s.{d}"], dtype=float) for d in DTYPES}
    matmul, fam = compute_peak(out["model.weight_dtype"], peak)
    attn = np.where(kv_fp8 & ~np.isnan(peak["fp8"]), peak["fp8"], peak["bf16"])
    wbytes = lookup(out["model.weight_dtype"], DTYPE_BYTES).astype(float)
    return matmul, attn, wbytes, kvbytes, low_bits, fam, kv_fp8, peak


# the kernel parameters the scorer reads, per op: Batch field -> catalog key suffix
GEMM_KEYS = ("fraction", "half_rows", "n_half", "k_half", "wave_elements", "hbm_fraction",
             "latency_s")
MOE_KEYS = ("fraction", "half_rows", "width_half", "hbm_fraction", "token_bytes", "latency_s",
            "hidden_half", "batch_bytes", "route_bytes", "nongated_slowdown",
            "wave_elements", "remote_fraction")
# absent from a catalog: no such term (0), the gated kernel's speed for non-gated experts (1)
MOE_DEFAULT = {"hidden_half": 0.0, "batch_bytes": 0.0, "route_bytes": 0.0,
               "nongated_slowdown": 1.0, "wave_elements": 0.0, "remote_fraction": 0.0}
ATTN_PREFILL_KEYS = ("fraction", "half_tokens", "half_rows", "latency_s", "hbm_fraction",
                     "per_seq_s", "per_seq_head_s", "dim_half", "window_pad_tokens")
ATTN_PREFILL_ZERO_DEFAULT = ("per_seq_s", "per_seq_head_s", "dim_half",   # absent: no term
                             "window_pad_tokens")
ATTN_DECODE_KEYS = ("hbm_fraction", "compute_fraction", "group_min_heads", "latency_s",
                    "per_seq_s", "per_seq_kv_head_s", "group_max_heads", "fallback_fraction",
                    "window_group_max_heads",
                    "half_items", "split_tokens")
ATTN_DECODE_DEFAULT = {"group_max_heads": 1e4, "fallback_fraction": 1.0, "split_tokens": 1e12,
                       "window_group_max_heads": 1e4}


def _family(names) -> tuple[np.ndarray, list]:
    """The kernel family name of each row, factorized once: (codes, names)."""
    codes, uniques = pd.factorize(np.atleast_1d(np.asarray(names, dtype=object)))
    return codes, list(uniques)


def _kernel(out, fam: tuple, key: str, fallback: np.ndarray | None = None) -> np.ndarray:
    """Per row, the kernel column ``accelerator.kernel.<family>_<key>`` of its family (from
    ``_family``); rows whose family has no such column (a dtype the chip lacks) take
    ``fallback``."""
    codes, uniques = fam
    cols = {c: np.asarray(out[f"{KERNEL}{name}_{key}"], dtype=float)
            for c, name in enumerate(uniques) if f"{KERNEL}{name}_{key}" in out}
    shape = np.broadcast_shapes(codes.shape, *(v.shape for v in cols.values()))
    if len(uniques) == 1 and cols:
        vals = np.broadcast_to(cols[0], shape).astype(float)
    else:
        codes = np.broadcast_to(codes, shape)
        vals = np.full(shape, np.nan)
        for c, v in cols.items():
            sel = codes == c
            vals[sel] = np.broadcast_to(v, shape)[sel]
    if fallback is not None:
        vals = np.where(np.isnan(vals), fallback, vals)
    return vals


def kernel_fields(out, fam, kv_fp8, peak, is_mla, moe_fam=None) -> dict[str, np.ndarray]:
    """The fitted kernel parameters of each design's dtype and attention kind as scorer
    fields: GEMM and MoE of the compute dtype's family (fp8: per-tensor or block-scaled kernels
    by ``model.fp8_scaling``), attention of the model's kind (GQA/MHA or MLA) and KV dtype; a family the
    chip lacks falls back to bf16."""
    cols = {}
    scaling = np.asarray(out["model.fp8_scaling"], dtype=object)
    moe_model = np.asarray(out["model.num_experts"], dtype=float) > 0
    block = (scaling == "block") | ((scaling == "auto") & moe_model)
    fam = np.where((fam == "fp8") & block, "fp8_block", fam)
    if moe_fam is not None:              # hook: per-op precision (the experts' own dtype)
        moe_fam = np.where((moe_fam == "fp8") & block, "fp8_block", moe_fam)
    gemm, gemm16 = _family("gemm_" + fam), _family("gemm_bf16")
    moe, moe16 = _family("moe_" + (fam if moe_fam is None else moe_fam)), _family("moe_bf16")
    for k in GEMM_KEYS:
        cols[f"gemm_{k}"] = _kernel(out, gemm, k, _kernel(out, gemm16, k))
    for k in MOE_KEYS:
        cols[f"moe_{k}"] = _kernel(out, moe, k, _kernel(
            out, moe16, k, MOE_DEFAULT.get(k)))
    kind = np.where(is_mla, "mla", "attn")
    fp8_peak = kv_fp8 & ~np.isnan(peak["fp8"])
    pre = np.where(fp8_peak & ~is_mla, kind + "_prefill_fp8",
                   np.where(kv_fp8, kind + "_prefill_kv_fp8", kind + "_prefill"))
    dec = np.where(kv_fp8, kind + "_decode_kv_fp8", kind + "_decode")
    pre_f, pre0 = _family(pre), _family(kind + "_prefill")
    dec_f, dec0 = _family(dec), _family(kind + "_decode")
    for k in ATTN_PREFILL_KEYS:
        cols[f"attn_prefill_{k}"] = _kernel(out, pre_f, k, _kernel(
            out, pre0, k, 0.0 if k in ATTN_PREFILL_ZERO_DEFAULT else None))
    for k in ATTN_DECODE_KEYS:
        cols[f"attn_decode_{k}"] = _kernel(out, dec_f, k, _kernel(
            out, dec0, k, ATTN_DECODE_DEFAULT.get(k, 0.0)))
    # MLA with an fp8 cache prefills at the bf16 peak (the kv_fp8 fits are bf16 compute), and
    # decode compute fractions are of the bf16 peak: rescale to the attention peak used
    attn_peak = np.where(fp8_peak, peak["fp8"], peak["bf16"])
    pre_bf16 = pre != kind + "_prefill_fp8"
    cols["attn_prefill_fraction"] = np.where(pre_bf16, peak["bf16"] / attn_peak, 1.0) \
        * cols["attn_prefill_fraction"]
    for k in ("compute_fraction", "fallback_fraction"):
        cols[f"attn_decode_{k}"] = peak["bf16"] / attn_peak * cols[f"attn_decode_{k}"]
    return cols


def topology_columns(out) -> dict[str, np.ndarray]:
    """Group bandwidth fractions and latency from the reduced topology graph of each row."""
    topos = catalog.topologies()
    tp = np.asarray(out["layout.tp"], dtype=float)
    ffn = tp * np.asarray(out["layout.dp"], dtype=float)
    dom = np.asarray(out["topology.scaleup.domain_chips"], dtype=float)
    names = list(topos)
    tid = lookup(out["topology.id"], {t: i for i, t in enumerate(names)}, -1).astype(np.int64)
    tp, ffn, dom, tid = np.broadcast_arrays(tp, ffn, dom, tid)   # compact tables mix lengths
    cols = {k: np.ones(len(tp)) for k in ("tp", "ffn", "a2a")}
    cols["latency"] = np.zeros(len(tp))
    # the row's own latencies (catalog values unless a design overrides them)
    base_lat = np.broadcast_to(np.asarray(out["topology.scaleup_base_latency_s"], dtype=float),
                               tp.shape)
    hop_lat = np.broadcast_to(np.asarray(out["topology.scaleup_hop_latency_s"], dtype=float),
                              tp.shape)
    # the system the collective kernels were measured on: the accelerator's default topology
    ref = lookup(out["accelerator.default_topology"] if "accelerator.default_topology" in out
                 else out["topology.id"], {t: i for i, t in enumerate(names)}, -1).astype(np.int64)
    ref = np.broadcast_to(ref, tp.shape)
    ref_base = np.array([topos[t].scaleup_base_latency_s for t in names])[ref]
    ref_hop = np.array([topos[t].scaleup_hop_latency_s for t in names])[ref]
    cols["extra_latency"] = np.zeros(len(tp))
    for k in ("tp", "ffn", "a2a"):
        cols[k + "_rel"] = np.ones(len(tp))
    keys = pd.DataFrame({"t": tid, "d": dom, "r": ref, "g": np.maximum(ffn, tp)})
    # one reduction per (topology, domain): the largest group any of its rows needs
    gmax_of = keys.groupby(["t", "d"])["g"].max().to_dict()
    for (t, d, r), idx in keys.groupby(["t", "d", "r"]).indices.items():
        gmax = int(min(gmax_of[(t, d)], d))
        red = topology.reduce(topos[names[t]], int(d), gmax)
        g_tp = np.minimum(tp[idx], d)
        g_ffn = np.minimum(ffn[idx], d)
        cols["tp"][idx] = red.at(g_tp, "ar_fraction")
        cols["ffn"][idx] = red.at(g_ffn, "ar_fraction")
        cols["a2a"][idx] = red.at(g_ffn, "a2a_fraction")
        hops = red.at(np.maximum(g_ffn, 2.0), "hops")
        cols["latency"][idx] = base_lat[idx] + hop_lat[idx] * hops
        cols["extra_latency"][idx] = cols["latency"][idx] - (ref_base[idx] + ref_hop[idx] * hops)
        # the fitted collective kernels already carry the bandwidth share of the system they
        # were measured on: they see this topology's share relative to that one's
        if r >= 0 and r != t:
            rr = topology.reduce(topos[names[r]], int(d), gmax)
            cols["tp_rel"][idx] = cols["tp"][idx] / rr.at(g_tp, "ar_fraction")
            cols["ffn_rel"][idx] = cols["ffn"][idx] / rr.at(g_ffn, "ar_fraction")
            cols["a2a_rel"][idx] = cols["a2a"][idx] / rr.at(g_ffn, "a2a_fraction")
    return cols


def component_factors(out) -> dict[str, np.ndarray]:
    """Factors on the catalog capex and power: 1 with cost.capex_model = "catalog"; with
    "components", fixed + sum of each component's share x its spec / the catalog chip's spec
    (compute: the precision scaled most)."""
    f = lambda c: np.asarray(out[c], dtype=float)  # noqa: E731
    on = np.asarray(out["cost.capex_model"]) == "components"
    if not np.any(on):
        return {"capex": np.ones(1), "power": np.ones(1)}
    ratio = {k: f(p) / f(REFERENCE + p) for k, p in COMPONENT_SPECS.items()}
    n = max(np.size(v) for v in (*ratio.values(), on))
    compute = np.stack([np.broadcast_to(ratio.pop(k), (n,)) for k in list(ratio)
                        if k.startswith("compute.")])
    ratio["compute"] = np.max(np.where(np.isfinite(compute), compute, 0.0), axis=0)
    shares = catalog.cost_model()
    out_f = {}
    for part in ("capex", "power"):
        sh = shares[part]
        v = sh["fixed"] + sum(sh[k] * r for k, r in ratio.items())
        out_f[part] = np.where(on, v, 1.0)
    return out_f


def precision_columns(out, wbytes, matmul, fam, peak) -> dict:
    """Per-op precision: bytes and compute peak of the routed experts' and the attention
    projections' weights (``model.expert_dtype``, ``model.attention_dtype``; blank: the
    weights'), and the grouped-GEMM kernel family of the experts' dtype (``moe_family``:
    None when every row's experts are in the weights' dtype). (The serving branch's
    dse.build.mechanisms.precision_columns on strings, as the old builder ran it.)"""
    cols = {}
    moe_family = None
    weight = np.asarray(out["model.weight_dtype"], dtype=object)
    for key, path in (("expert", "model.expert_dtype"), ("attn", "model.attention_dtype")):
        given = pd.Series(np.asarray(out[path] if path in out.keys() else [""], dtype=object))
        given = given.fillna("").astype(str)
        given = np.broadcast_to(given.to_numpy(), np.broadcast_shapes(given.shape, weight.shape))
        if not np.any(given != ""):
            cols[f"{key}_weight_bytes"], cols[f"{key}_matmul_flops_per_s"] = wbytes, matmul
            continue
        dt = np.where(given == "", np.broadcast_to(weight, given.shape), given)
        mm, fm = compute_peak(dt, peak)
        cols[f"{key}_weight_bytes"] = lookup(dt, DTYPE_BYTES).astype(float)
        cols[f"{key}_matmul_flops_per_s"] = mm
        if key == "expert":
            moe_family = fm
    cols["moe_family"] = moe_family
    return cols


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


def to_batch(out, compact: bool = False) -> Batch:
    """The resolved design table (a DataFrame, or a dict of columns) as the scorer's arrays.

    ``compact``: the dict may hold length-1 columns (the same value for every design); they
    stay length-1 in the Batch, which broadcasts them."""
    f = lambda c: np.asarray(out[c], dtype=float)  # noqa: E731
    matmul, attn, wbytes, kvbytes, low_bits, fam, kv_fp8, peak = _dtype_columns(out)
    L = f("model.num_hidden_layers")
    n_exp = f("model.num_experts")
    step = np.maximum(f("model.moe_layer_step"), 1.0)
    n_moe = np.where(n_exp > 0, np.floor((L - f("model.first_k_dense_replace")) / step), 0.0)
    topo = topology_columns(out)
    components = component_factors(out)
    from dse.build.designs import (
        scaleup_tier_units,  # ported 2026-12-02 (multi-rack domain cost)
    )
    tier = scaleup_tier_units(out)
    # hook: per-op precision (dse.build.mechanisms): the experts' and attention's own dtypes
    prec = precision_columns(out, wbytes, matmul, fam, peak)
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
        **kernel_fields(out, fam, kv_fp8, peak, f("model.kv_lora_rank") > 0,
                        prec.pop("moe_family")),
        "domain_chips": f("topology.scaleup.domain_chips"),
        "scaleup_bw_bytes_per_s": f("topology.scaleup.link_bw_bytes_per_s"),
        "scaleup_latency_s": topo["latency"],
        "scaleout_bw_bytes_per_s": f("topology.scaleout.link_bw_bytes_per_s"),
        "scaleout_latency_s": f("topology.scaleout_latency_s"),
        "tp_bw_fraction": topo["tp"], "ffn_bw_fraction": topo["ffn"], "a2a_bw_fraction": topo["a2a"],
        "tp_bw_rel": topo["tp_rel"], "ffn_bw_rel": topo["ffn_rel"], "a2a_bw_rel": topo["a2a_rel"],
        "rack_chips": f("topology.rack_chips"),
        "scaleup_extra_latency_s": topo["extra_latency"],
        "a2a_mode": lookup(out["serving.a2a_kernel"], A2A_KERNELS).astype(float),
        "two_batch_overlap": lookup(out["serving.ep_overlap"], {"tbo": 1.0}, 0.0).astype(float),
        "alltoall_overlap_fraction": f("serving.alltoall_overlap_fraction"),
        "tp": f("layout.tp"), "pp": f("layout.pp"), "ep": f("layout.ep"), "dp": f("layout.dp"),
        "dense_replicated": lookup(out["layout.dense_mlp"], DENSE_MLP).astype(float),
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
        # the runtime's all-reduce selection rule (2026-12, wired in after the freeze)
        **allreduce_rule_columns(out),
    }
    return Batch.from_columns(cols, compact=compact)
