"""``dse predict``: score the serving instances of a case file (contracts/predict-cases.md).

Blank layout columns are filled with the best valid layout for ``num_chips`` and a blank
concurrency with the one that maximises output tokens/s within memory: candidates are expanded
into one table, scored in one call, and the best row per case is kept.

The CSV it writes (``csv_frame``) gives every figure to 4 significant digits and leaves the
metrics of an infeasible row blank; ``predict_frame`` (the API, the calibration) keeps the full
float64 values.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dse import catalog
from dse.build.designs import kv_dtype_of
from dse.build.distinct import Memo, resolve_batch
from dse.errors import InputError, RowNames, suggest, writing
from dse.perf import Batch, score_chunked
from dse.perf.memory_fit import BOUNDS, reason_text
from dse.perf.memory_fit import (
    KNEE_FRACTION as _KNEE,  # the batch that fills the HBM (decode_bound)
)
from dse.scoring import case_reader, harness
from dse.spec import validate
from dse.spec.csvsafe import spreadsheet_safe
from dse.spec.fields import REGISTRY

REQUIRED = ("case_id", "model", "hardware", "num_chips", "weight_dtype", "isl", "osl")
# the serving mechanisms' columns (issue 11): short names of their fields, blank = the field's
# default (every mechanism off, the expert imbalance from the published routing model)
MECHANISMS = {"spec_tokens": "serving.spec_tokens", "spec_acceptance": "serving.spec_acceptance",
              "spec_method": "serving.spec_method", "spec_draft_model": "serving.spec_draft_model",
              "expert_imbalance": "serving.expert_imbalance",
              "redundant_experts": "serving.redundant_experts",
              "request_rate_per_s": "workload.request_rate_per_s",
              "ttft_slo_s": "workload.ttft_slo_s", "tpot_slo_s": "workload.tpot_slo_s",
              "isl_cv": "workload.isl_cv", "osl_cv": "workload.osl_cv",
              "kv_offload": "serving.kv_offload", "prefix_tokens": "workload.prefix_tokens",
              "cached_conversations": "workload.cached_conversations",
              "expert_dtype": "model.expert_dtype", "attention_dtype": "model.attention_dtype",
              "num_requests": "workload.num_requests"}
OPTIONAL = ("topology", "tp", "pp", "ep", "dp", "kv_dtype", "concurrency", "prefix_hit_fraction",
            "phase", "runtime", "dense_mlp", "tp_x", "kv_sharding", *MECHANISMS)
# columns the calibration case files carry for the record and dse never reads (but
# ``length_dist``: a harness's ``uniform[aL,bL]`` lengths, dse.scoring.harness); named here
# because ``mode`` (the measured deployment, "aggregated") is also the last part of
# serving.mode and cost.mode, which any other such column is refused for
ANNOTATIONS = ("source", "citation", "note", "split", "mode", "derived_inputs", "backend",
               "backend_version", "snapshot", "mtp_check", "length_dist")
RENAME = {"model": "model.id", "hardware": "accelerator.id", "topology": "topology.id",
          "weight_dtype": "model.weight_dtype", "kv_dtype": "model.kv_dtype",
          "isl": "workload.isl", "osl": "workload.osl", "concurrency": "workload.concurrency",
          "prefix_hit_fraction": "workload.prefix_hit_fraction", "phase": "workload.phase",
          "tp": "layout.tp", "pp": "layout.pp", "ep": "layout.ep", "dp": "layout.dp",
          "runtime": "serving.runtime", "dense_mlp": "layout.dense_mlp",
          # 2D weight-stationary tp and the KV split by sequence (dse.perf.tp2d): given, or
          # searched with a blank layout where collectives run on the links (_link_layouts)
          "tp_x": "layout.tp_x", "kv_sharding": "layout.kv_sharding", **MECHANISMS}
# every case column's field (the registry's): numeric ones are checked as they are read, string
# ones (ids, choices) when the design is resolved
FIELD_OF = {"num_chips": "layout.num_chips", **RENAME}
NUMERIC = {c: p for c, p in FIELD_OF.items() if REGISTRY[p].numeric}
LAYOUT = ("layout.tp", "layout.pp", "layout.ep", "layout.dp")
# the mechanisms' outputs, written only when some case turns the mechanism on (else all NaN)
MECHANISM_OUTPUT = ("ttft_p90_s", "ttft_p99_s", "tpot_p90_s", "goodput_requests_per_s_per_chip",
                    "saturation_requests_per_s_per_instance", "spec_expected_tokens",
                    "kv_offloaded_fraction", "prefix_cache_evicted_fraction")
# blank concurrency: fractions of the memory-limited maximum that are tried (log-spaced)
CONCURRENCY_STEPS = 2.0 ** (-np.arange(0, 48) / 4.0)
# ... and the smallest concurrency within this share of the best throughput is kept: past the
# knee a server gains almost nothing and only lengthens every token
KNEE_FRACTION = _KNEE


def read_cases(path: str) -> pd.DataFrame:
    """The whole case file as one table of strings, checked (``iter_cases``'s chunks joined:
    for the API and tests; ``predict_file`` streams)."""
    parts = [c for _, c in iter_cases(path)]
    return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]


def iter_cases(path: str, rows: int | None = None):
    """(offset, chunk) of the case file, each chunk checked (the header once, then each row
    where the file has it): at most ``rows`` (default CASES_PER_CHUNK) cases a chunk, memory
    bounded whatever the file's size (``case_reader``)."""
    ids = case_reader.DuplicateIds(path)
    n = 0
    for header, offset, df in case_reader.chunks(path, rows or CASES_PER_CHUNK):
        if offset == 0:
            check_header(df.columns, path)
        if len(df):
            check_cases(df, path, offset, ids)
            n += len(df)
            yield offset, df
    if n == 0:
        raise InputError("no cases: the file has a header but no rows", file=path,
                         hint="add one row per serving instance (contracts/predict-cases.md)")


def check_header(columns, path: str) -> None:
    validate.typo_columns(columns, (*REQUIRED, *OPTIONAL), file=path)
    validate.field_part_columns(columns, (*REQUIRED, *OPTIONAL, *ANNOTATIONS), file=path)
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        raise InputError(f"missing required column {missing[0]!r}", file=path,
                         hint=suggest(missing[0], columns, "columns present") if len(columns)
                         else "the header row is empty")


def check_cases(df: pd.DataFrame, path: str, offset: int = 0, ids=None) -> None:
    """A chunk of cases (its first is the file's case ``offset``): required columns filled,
    case ids unique (over the file, with ``ids``), numbers numbers within their ranges."""
    for c in REQUIRED:
        blank = df[c].isna()
        if blank.any():
            i = int(np.flatnonzero(blank.to_numpy())[0])
            raise InputError(f"required column {c!r} is blank", file=path,
                             where=f"row {offset + i + 2}")
    if ids is not None:
        ids.check(df["case_id"], offset)
    ids_ = df["case_id"].to_numpy(dtype=object)
    for c, field_path in NUMERIC.items():
        if c not in df.columns:
            continue
        where = RowNames(len(df), lambda i, c=c: f"row {offset + i + 2} (case_id {ids_[i]}), "
                         f"column {c}")
        v = validate.parse_column(field_path, df[c], file=path, names=where, name=c)
        bad = v.notna().to_numpy() & validate.range_bad(field_path, v.to_numpy())
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(f"{c} = {df[c].iloc[i]!r} is not valid", file=path, where=where[i],
                             hint=REGISTRY[field_path].valid())


@functools.lru_cache(maxsize=64)
def _divisors(n: int) -> tuple[int, ...]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return tuple(sorted({*small, *(n // d for d in small)}))


@functools.lru_cache(maxsize=64)
def _layouts(num_chips: int) -> pd.DataFrame:
    """Every (tp, pp, ep, dp) with tp*pp*dp = num_chips and ep dividing tp*dp."""
    rows = []
    for tp in _divisors(num_chips):
        for pp in _divisors(num_chips // tp):
            dp = num_chips // tp // pp
            rows.extend((tp, pp, ep, dp) for ep in _divisors(tp * dp))
    return pd.DataFrame(rows, columns=list(LAYOUT), dtype=float)


def _on_links(m: pd.DataFrame) -> np.ndarray:
    """Per candidate row: a dense model on a topology whose collectives run on the links
    (``topology.link_collectives``, the accelerator's default system where none is given), at
    dp = 1 and ep = 1: the rows the 2D weight-stationary layouts are searched for."""
    topos, accs, models = catalog.topologies(), catalog.accelerators(), catalog.models()
    link_topo = {t: bool(v.link_collectives) for t, v in topos.items()}
    # (dict lookups over the distinct values: the usual GPU-only table costs two maps)
    acc = m["hardware"].map({a: v.default_topology for a, v in accs.items()})
    if "topology" in m.columns:
        tid = m["topology"]
        acc = tid.where(tid.notna() & (tid.astype(str).str.strip() != ""), acc)
    links = acc.map(link_topo).eq(True).to_numpy(bool)
    if not links.any():
        return links
    dense = m["model"].map({k: not v.num_experts for k, v in models.items()}) \
        .eq(True).to_numpy(bool)
    return links & dense & (m["layout.dp"].to_numpy() == 1) & (m["layout.ep"].to_numpy() == 1)


def _link_layouts(m: pd.DataFrame) -> pd.DataFrame:
    """Candidate layouts searched on top of (tp, pp, ep, dp) where the tp group's collectives
    run on the links (``_on_links``), for what the case leaves blank: 2D weight-stationary
    meshes X x (tp / X) for the divisors 1 < X <= sqrt(tp) (the paper's optimum
    sqrt(tp d_model / d_ff) is below sqrt(tp) for every d_ff > d_model) and the KV cache split
    by heads or by sequence (dse.perf.tp2d). Elsewhere they stay as given (1D, by heads when
    blank): on GPUs the 1D all-reduce is the fitted kernels', which the link model is not
    comparable with."""
    if not len(m):
        return m
    x_given = pd.to_numeric(m["tp_x"], errors="coerce").to_numpy(float) if "tp_x" in m.columns \
        else np.full(len(m), np.nan)
    if "tp_x" in m.columns:         # a given mesh keeps the candidates it fits (dp = ep = 1)
        fits = (np.mod(m["layout.tp"].to_numpy(), np.where(x_given > 1, x_given, 1)) == 0) \
            & (m["layout.dp"].to_numpy() == 1) & (m["layout.ep"].to_numpy() == 1)
        keep = ~(x_given > 1) | fits
        m, x_given = m[keep], x_given[keep]
    kv_given = m["kv_sharding"].astype(object).where(m["kv_sharding"].notna(), "") \
        .astype(str).str.strip().to_numpy() if "kv_sharding" in m.columns \
        else np.full(len(m), "", dtype=object)
    x_blank, kv_blank = np.isnan(x_given), kv_given == ""
    on = (x_blank | kv_blank) & _on_links(m)
    if not on.any():
        return m
    base, tp = m[on], m["layout.tp"].to_numpy()[on]
    xb, xg, kb, kg = x_blank[on], np.where(x_blank, 1.0, x_given)[on], kv_blank[on], \
        np.where(kv_blank, "heads", kv_given)[on]
    extra = []
    for x in sorted({int(d) for t in np.unique(tp) for d in _divisors(int(t))}):
        x_ok = np.where(xb, (np.mod(tp, x) == 0) & (x * x <= tp), xg == x)
        for kv in ("heads", "batch"):
            ok = x_ok & (kb | (kg == kv)) & ~((xg == x) & (kg == kv))   # (the row itself)
            if ok.any():
                extra.append(base[ok].assign(tp_x=float(x), kv_sharding=kv))
    return pd.concat([m, *extra], ignore_index=True) if extra else m


def _where(cases: pd.DataFrame, i: int, offset: int) -> str:
    return f"row {i + offset + 2} (case_id {cases['case_id'].iloc[i]})"


def _expand_layouts(cases: pd.DataFrame, file: str, offset: int = 0) -> pd.DataFrame:
    """One row per (case, candidate layout) agreeing with the layout columns the case gives."""
    chips = validate.to_numeric(cases["num_chips"]).astype(int)
    given = {c: validate.to_numeric(cases[c.split(".")[1]], errors="coerce")
             if c.split(".")[1] in cases.columns else pd.Series(np.nan, index=cases.index)
             for c in LAYOUT}
    full = np.logical_and.reduce([given[c].notna().to_numpy() for c in LAYOUT])
    if full.all():          # every layout given: one row per case, as the cases stand
        out = cases.assign(**given, _case=np.arange(len(cases)))
        return out.drop(columns=[c for c in out.columns if c.endswith("_given") or c == "_chips"])
    parts = [cases[full].assign(**{c: given[c][full] for c in LAYOUT}, _case=np.flatnonzero(full))]
    rest = cases[~full].assign(_case=np.flatnonzero(~full), _chips=chips[~full])
    for c in LAYOUT:
        rest[c + "_given"] = given[c][~full]
    for n, grp in rest.groupby("_chips"):
        cand = _layouts(int(n))
        m = grp.drop(columns=[c for c in LAYOUT if c in grp.columns]).merge(cand, how="cross")
        keep = np.ones(len(m), bool)
        for c in LAYOUT:
            g = m[c + "_given"].to_numpy()
            keep &= np.isnan(g) | (g == m[c].to_numpy())
        parts.append(_link_layouts(m[keep]))
    out = pd.concat(parts, ignore_index=True)
    missing = np.setdiff1d(np.arange(len(cases)), out["_case"].unique())
    if len(missing):
        i = int(missing[0])
        raise InputError(f"no layout with the given tp/pp/ep/dp uses exactly num_chips = "
                         f"{chips.iloc[i]} chips", file=file, where=_where(cases, i, offset),
                         hint="tp*pp*dp must equal num_chips and ep must divide tp*dp")
    return out.drop(columns=[c for c in out.columns if c.endswith("_given") or c == "_chips"])


def _check_explicit(cases, resolved, full_rows, file, offset=0):
    """Layouts the user wrote out must be valid: they name the row instead of guessing."""
    L = {c: resolved[c].to_numpy(dtype=float) for c in LAYOUT}
    chips = validate.to_numeric(cases["num_chips"]).to_numpy(dtype=float)[
        resolved["_case"].to_numpy()]
    heads = resolved["model.num_attention_heads"].to_numpy(dtype=float)
    # 2D weight-stationary tp (layout.tp_x) splits the heads over tp / tp_x chips
    tpx = resolved["layout.tp_x"].to_numpy(dtype=float) if "layout.tp_x" in resolved else 1.0
    experts = resolved["model.num_experts"].to_numpy(dtype=float)
    checks = [
        (L["layout.tp"] * L["layout.pp"] * L["layout.dp"] != chips,
         "tp*pp*dp = {v} chips but num_chips = {n}", "make tp*pp*dp equal num_chips"),
        (np.mod(heads, L["layout.tp"] / tpx) != 0,
         "tp = {tp} does not divide the model's {h} heads",
         ("use a tp that divides num_attention_heads (or, with layout.tp_x, whose tp / tp_x "
          "does)")),
        (np.mod(L["layout.tp"] * L["layout.dp"], L["layout.ep"]) != 0, "ep = {ep} does not divide tp*dp",
         "ep must divide tp*dp"),
        ((experts == 0) & (L["layout.ep"] != 1), "ep = {ep} on a dense model", "use ep = 1"),
        ((experts > 0) & (L["layout.ep"] > experts),
         "ep = {ep} exceeds the model's {e} experts", "use ep <= num_experts"),
    ]
    for bad, msg, hint in checks:
        bad = bad & full_rows
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            i = int(resolved["_case"].iloc[j])
            text = msg.format(v=int(L["layout.tp"][j] * L["layout.pp"][j] * L["layout.dp"][j]),
                              n=int(chips[j]), tp=int(L["layout.tp"][j]), h=int(heads[j]),
                              ep=int(L["layout.ep"][j]), e=int(experts[j]))
            raise InputError(text, file=file, where=_where(cases, i, offset), hint=hint)


def _check_rate_or_concurrency(cases, file, offset=0) -> None:
    """A case (or design) gives its load one way: a fixed ``concurrency``, or a
    ``request_rate_per_s`` whose concurrency follows from the step times (Little's law,
    dse/perf/queueing.py). Both given would silently drop the concurrency: refused."""
    if "concurrency" not in cases.columns:
        return
    rate = next((c for c in ("request_rate_per_s", "workload.request_rate_per_s")
                 if c in cases.columns), None)
    if rate is None:
        return
    r = validate.to_numeric(cases[rate], errors="coerce").fillna(0.0).to_numpy(float)
    c = validate.to_numeric(cases["concurrency"], errors="coerce")
    bad = (r > 0) & c.notna().to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        conc = "workload.concurrency" if rate.startswith("workload.") else "concurrency"
        raise InputError(f"{conc} = {c.iloc[i]:g} and {rate} = {r[i]:g} are both given: the "
                         "rate sets the concurrency (Little's law on the model's step times)",
                         file=file, where=_where(cases, i, offset) + ", column concurrency",
                         hint=f"leave {conc} blank to serve the rate, or {rate} blank "
                         "(or 0) for a fixed concurrency")


def _design_table(cases: pd.DataFrame) -> pd.DataFrame:
    cols = {RENAME[c]: cases[c] for c in RENAME if c in cases.columns and c not in ("tp", "pp", "ep", "dp")}
    t = pd.DataFrame(cols)
    for c in LAYOUT:
        t[c] = cases[c].to_numpy()
    for c in cases.columns:   # dotted overrides (design files, what-ifs) pass straight through
        if "." in c and c not in t.columns:
            t[c] = cases[c].to_numpy()
    t["case_id"] = cases["case_id"].to_numpy()
    t["_case"] = cases["_case"].to_numpy()
    if "workload.phase" in t.columns:
        t["workload.phase"] = t["workload.phase"].fillna("both").replace({"": "both"})
    return t


@dataclass(frozen=True)
class Prepared:
    """Every candidate row of a case table, ready to score (the layout and concurrency grid)."""

    cases: pd.DataFrame
    resolved: pd.DataFrame
    batch: Batch
    auto: np.ndarray   # per row: its case has a blank concurrency


def prepare(cases: pd.DataFrame, file: str = "cases", offset: int = 0,
            memo: Memo | None = None) -> Prepared:
    """Expand a case table into candidate rows: layouts for blank tp/pp/ep/dp, concurrencies
    for a blank concurrency (fractions of the memory-limited maximum); a case's harness
    lengths (``length_dist``, dse.scoring.harness) as its mean lengths. ``memo``: the designs
    that earlier chunks of the same file resolved (``dse.build.distinct.Memo``)."""
    cases = cases.reset_index(drop=True)
    cases = harness.apply_lengths(cases, file, lambda i: _where(cases, i, offset))
    _check_rate_or_concurrency(cases, file, offset)
    expanded = _expand_layouts(cases, file, offset)
    full_case = np.zeros(len(cases), bool)
    given = [c for c in ("tp", "pp", "ep", "dp") if c in cases.columns]
    if len(given) == 4:
        full_case = cases[given].notna().all(axis=1).to_numpy()
    table = _design_table(expanded)
    if "workload.concurrency" not in table:
        table["workload.concurrency"] = np.nan
    auto_c = table["workload.concurrency"].isna().to_numpy()
    table["workload.concurrency"] = validate.to_numeric(table["workload.concurrency"],
                                                  errors="coerce").fillna(1.0)
    case_rows = table["_case"].to_numpy()
    ids = cases["case_id"].astype(str).to_numpy(dtype=object)
    names = RowNames(len(case_rows), lambda j: f"row {case_rows[j] + offset + 2} "
                     f"(case_id {ids[case_rows[j]]})")
    aliases = {v: k for k, v in RENAME.items()}
    resolved, batch = resolve_batch(table.drop(columns=["_case", "case_id"]), file=file,
                                    row_names=names, aliases=aliases, memo=memo)
    resolved["_case"] = table["_case"].to_numpy()
    _check_explicit(cases, resolved, full_case[table["_case"].to_numpy()], file, offset)
    if auto_c.any():
        probe = score_chunked(batch.take(np.flatnonzero(auto_c)))
        cmax = np.maximum(probe["max_concurrent_sequences"], 1.0)
        idx_auto = np.flatnonzero(auto_c)
        grid = np.maximum(np.floor(cmax[:, None] * CONCURRENCY_STEPS[None, :]), 1.0)
        rows = np.concatenate([np.flatnonzero(~auto_c), np.repeat(idx_auto, grid.shape[1])])
        conc = np.concatenate([batch.concurrency[~auto_c], grid.ravel()])
        auto_c = np.concatenate([np.zeros((~auto_c).sum(), bool), np.ones(grid.size, bool)])
        batch = batch.take(rows).replace(concurrency=conc)
        resolved = resolved.iloc[rows].reset_index(drop=True)
    return Prepared(cases, resolved, batch, auto_c)


def finish(prep: Prepared, batch: Batch | None = None) -> pd.DataFrame:
    """Score the prepared rows (optionally with a modified batch) and keep the best per case."""
    s = score_chunked(prep.batch if batch is None else batch)
    return _select(prep.cases, prep.resolved, s, prep.auto)


CASES_PER_CHUNK = 50_000
ROWS_PER_CHUNK = 200_000     # candidate rows (layouts x concurrencies) scored at once


def case_weights(cases: pd.DataFrame) -> np.ndarray:
    """Candidate rows each case expands to, at most: its layouts (1 when tp/pp/ep/dp are all
    given) times the concurrency grid when its concurrency is blank."""
    full = np.ones(len(cases), bool)
    for c in ("tp", "pp", "ep", "dp"):
        full &= cases[c].notna().to_numpy() if c in cases.columns else False
    chips = validate.to_numeric(cases["num_chips"], errors="coerce").fillna(1).astype(np.int64)
    per = {int(n): len(_layouts(int(n))) for n in np.unique(chips[~full])}
    w = np.where(full, 1, chips.map(per).fillna(1).astype(np.int64).to_numpy())
    if "concurrency" in cases.columns:
        blank = cases["concurrency"].isna().to_numpy()
    else:
        blank = np.ones(len(cases), bool)
    return w * np.where(blank, len(CONCURRENCY_STEPS), 1)


def chunks(cases: pd.DataFrame) -> list[tuple[int, int]]:
    """(start, stop) of case chunks of at most ROWS_PER_CHUNK candidate rows (and
    CASES_PER_CHUNK cases; a single case bigger than that is a chunk of its own)."""
    ends = np.cumsum(case_weights(cases))
    out, start, done = [], 0, 0
    while start < len(cases):
        stop = int(np.searchsorted(ends, done + ROWS_PER_CHUNK, side="right"))
        stop = min(max(stop, start + 1), start + CASES_PER_CHUNK)
        out.append((start, stop))
        done, start = int(ends[stop - 1]), stop
    return out or [(0, 0)]


def predict_frame(cases: pd.DataFrame, file: str = "cases", offset: int = 0,
                  memo: Memo | None = None) -> pd.DataFrame:
    """Predictions for a case table (the CSV's columns, as strings or numbers; ``offset``: its
    first case's place in the file, for messages).

    Cases are taken in chunks of bounded candidate rows, so that memory stays bounded
    whatever the file's size and however many layouts and concurrencies dse chooses from;
    a design is resolved once for all of them (``memo``, which ``predict_file`` keeps over
    the file's chunks).
    """
    cases = cases.reset_index(drop=True)
    memo = memo if memo is not None else Memo()
    parts = [finish(prepare(cases.iloc[a:b], file, offset=offset + a, memo=memo))
             for a, b in chunks(cases)]
    return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]


def _select(cases, resolved, s, auto_rows) -> pd.DataFrame:
    case = resolved["_case"].to_numpy()
    phase = resolved["workload.phase"].to_numpy()
    goal = np.where(phase == "prefill", s["input_tokens_per_s_per_chip"],
                    s["output_tokens_per_s_per_chip"])
    goal = np.where(s["feasible"], goal, -1.0 / (1.0 + s["hbm_used_fraction"]))
    best_goal = pd.Series(goal).groupby(case).transform("max").to_numpy()
    auto = auto_rows
    eligible = np.where(auto, goal >= KNEE_FRACTION * best_goal, goal >= best_goal)
    eligible &= s["feasible"] | (best_goal < 0)
    conc = np.where(auto, s["concurrency"], 0.0)
    order = np.lexsort((-goal, conc, ~eligible, case))
    first = np.ones(len(order), bool)
    first[1:] = case[order][1:] != case[order][:-1]
    best = order[first]
    out = pd.DataFrame({"case_id": cases["case_id"].to_numpy()[case[best]]})
    out["concurrency"] = s["concurrency"][best].astype(int)
    for m in ("ttft_s", "ttft_unloaded_s", "tpot_s", "output_tokens_per_s_per_chip",
              "input_tokens_per_s_per_chip"):
        out[m] = s[m][best]
    out["bound"] = np.array(BOUNDS, dtype=object)[s["bound"][best].astype(int)]  # perf.decode_bound
    out["feasible"] = s["feasible"][best]
    out["reason"] = _reasons(s["reason"][best], s["max_concurrent_sequences"][best]).tolist()
    for c in ("tp", "pp", "ep", "dp"):
        out[c] = resolved[f"layout.{c}"].to_numpy()[best].astype(int)
    for m in ("usd_per_mtok_output", "usd_per_mtok_input", "max_concurrent_sequences"):
        out[m] = s[m][best]
    # the KV dtype used, stated (a blank kv_dtype follows the weights: contracts/predict-cases.md)
    out["kv_dtype"] = kv_dtype_of(_column(resolved, "model.weight_dtype")[best],
                                  _column(resolved, "model.kv_dtype")[best])
    for m in MECHANISM_OUTPUT:
        if m in s and np.isfinite(s[m][best]).any():
            out[m] = s[m][best]
    # the 2D weight-stationary mesh and the KV split (dse.perf.tp2d), where some case uses them
    if "layout.tp_x" in resolved.columns:
        tpx = pd.to_numeric(resolved["layout.tp_x"]).to_numpy(float)[best]
        kv = _column(resolved, "layout.kv_sharding")[best]
        if (tpx != 1).any() or (kv == "batch").any():
            out["tp_x"], out["kv_sharding"] = tpx.astype(int), kv
    out["_order"] = case[best]
    return out.sort_values("_order").drop(columns="_order").reset_index(drop=True)


def _reasons(bits: np.ndarray, max_sequences: np.ndarray) -> np.ndarray:
    """``reason_text`` of each row, made once per distinct (reason, sequences that fit) pair:
    the sequences only count where the reason is that the concurrency does not fit."""
    bits = np.asarray(bits).astype(np.int64)
    fit = np.where((bits & FIT_BITS) != 0, np.asarray(max_sequences, dtype=float), np.nan)
    kb, _ = pd.factorize(bits)
    kf, uf = pd.factorize(fit.view(np.int64))
    key = kb * max(len(uf), 1) + kf
    _, first, codes = np.unique(key, return_index=True, return_inverse=True)
    text = np.array([reason_text(bits[i], fit[i]) for i in first], dtype=object)
    return text[codes.reshape(-1)]


# the reason bits whose text says how many sequences fit (``reason_text``)
FIT_BITS = 16 | 32


def _column(table: pd.DataFrame, path: str) -> np.ndarray:
    """A string column of the resolved rows, blank where the table lacks it."""
    return table[path].to_numpy(dtype=object) if path in table.columns else \
        np.full(len(table), "", dtype=object)


CSV_DIGITS = 4       # significant digits of the predictions CSV (what the model resolves)
# the metrics a predictions CSV leaves blank on an infeasible row (no such server runs: its
# figures would be read as predictions); the row keeps its layout, bound, reason and memory
BLANK_WHEN_INFEASIBLE = ("ttft_s", "ttft_unloaded_s", "tpot_s", "output_tokens_per_s_per_chip",
                         "input_tokens_per_s_per_chip", "usd_per_mtok_output",
                         "usd_per_mtok_input", *MECHANISM_OUTPUT)


def round_significant(x, digits: int = CSV_DIGITS) -> np.ndarray:
    """``x`` rounded to ``digits`` significant digits, as the nearest double to the decimal
    (a CSV writes it back as that decimal); zero, NaN and infinities unchanged."""
    x = np.array(x, dtype=float)
    ok = np.isfinite(x) & (x != 0)
    v = x[ok]
    e = np.floor(np.log10(np.abs(v))).astype(int) - (digits - 1)
    p = 10.0 ** np.abs(e)
    x[ok] = np.where(e >= 0, np.round(v / p) * p, np.round(v * p) / p)
    return x


def csv_frame(pred: pd.DataFrame, digits: int = CSV_DIGITS) -> pd.DataFrame:
    """Predictions as the CSV gives them: metrics blank on infeasible rows
    (``BLANK_WHEN_INFEASIBLE``), floats at ``digits`` significant digits. The frame
    ``predict_frame`` returns (and the calibration fits on) keeps full precision."""
    out = pred.copy()
    if "feasible" in out:
        bad = ~out["feasible"].astype(bool).to_numpy()
        for c in BLANK_WHEN_INFEASIBLE:
            if c in out and bad.any():
                out[c] = np.where(bad, np.nan, out[c].to_numpy(dtype=float))
    for c in out.columns:
        if pd.api.types.is_float_dtype(out[c]):
            out[c] = round_significant(out[c].to_numpy(), digits)
    return out


def predict_file(path: str, out_path: str, keep: bool = True) -> pd.DataFrame | int:
    """The case file's predictions written to ``out_path`` as they are made: the file is read
    and scored a chunk at a time (``iter_cases``; memory bounded whatever its size), each
    chunk's predictions go to a part file, and the parts are joined into ``out_path.tmp``
    (the columns of every part: a mechanism's columns appear when any case uses it), then
    renamed (atomic: a failed run never leaves a half-written file). Returns the predictions
    at full precision (``keep``), else how many were written."""
    import shutil
    import tempfile
    folder = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(folder):
        raise InputError("the output folder does not exist", file=out_path,
                         hint="create it or write the predictions elsewhere")
    tmp = out_path + ".tmp"
    kept, columns, n = [], [], 0
    with _system_pool(), writing(out_path, tmp):   # a full or read-only disk: exit 3, no .tmp
        parts = tempfile.mkdtemp(prefix=".dse-predict-", dir=folder)
        try:
            files, memo = [], Memo()
            for offset, cases in iter_cases(path):
                pred = predict_frame(cases, file=path, offset=offset, memo=memo)
                n += len(pred)
                if keep:
                    kept.append(pred)
                columns += [c for c in pred.columns if c not in columns]
                files.append(os.path.join(parts, f"{len(files):06d}.parquet"))
                pred.to_parquet(files[-1], index=False)
            _join_parts(files, columns, tmp)
            os.replace(tmp, out_path)
        finally:
            shutil.rmtree(parts, ignore_errors=True)
    if not keep:
        return n
    return pd.concat(kept, ignore_index=True) if len(kept) > 1 else kept[0]


@contextlib.contextmanager
def _system_pool():
    """Arrow's allocations from the system allocator while a file streams: Arrow's default
    pool (mimalloc) keeps what each chunk's part file freed, and the peak grew with the file
    (measured: +68 MB for a 62 MB case file; +16 MB, flat from 60,000 cases on, with this)."""
    import pyarrow as pa
    old = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(old)


def _join_parts(files: list[str], columns: list[str], out: str) -> None:
    """The parts' predictions as one CSV (``csv_frame``'s rounding), a part at a time."""
    with open(out, "wb") as f:
        for i, part in enumerate(files):
            pred = pd.read_parquet(part)
            if len(files) > 1:
                pred = pred.reindex(columns=columns)
            write_csv(csv_frame(pred), f, header=i == 0)


def write_csv(frame: pd.DataFrame, path, header: bool = True) -> None:
    """CSV at full float precision, NaN as an empty field (pyarrow: ~15x faster than pandas),
    text cells a spreadsheet would evaluate neutralised (``spreadsheet_safe``). ``path``: a
    path or an open binary file (``header=False``: rows appended to it)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    table = pa.Table.from_pandas(spreadsheet_safe(frame), preserve_index=False)
    pacsv.write_csv(table, path, pacsv.WriteOptions(quoting_style="needed",
                                                    include_header=header))
