"""Dense GEMM efficiency per chip, runtime and dtype, fitted on aiconfigurator-core's
``gemm/gemm_perf`` tables (the model: ``dse.perf.kernel_gemm.gemm_s``).

Kernel families (the table's ``gemm_dtype``; each its own parameters, key prefix ``gemm_<fam>_``):

- ``bf16``      ``bfloat16``: the runtime's torch linear (cuBLAS);
- ``fp8``       ``fp8``: per-tensor scaled FP8 (trtllm torch flow, sglang sgl_kernel
                ``fp8_scaled_mm``, vllm Cutlass scaled_mm); peak = fp8;
- ``fp8_block`` ``fp8_block``: 1x128 / 128x128 block-scaled FP8 (DeepGEMM on Hopper/Blackwell;
                vLLM picks DeepGEMM, Cutlass or FlashInfer per shape, Triton on L40S); peak = fp8;
- ``fp4``       ``nvfp4``: NVFP4 (16-element blocks, fp8 scales) on Blackwell; peak = fp4.

Kernel source: every row of a (chip, runtime, dtype) table is the kernel the runtime dispatches
by default for that shape (where a table names several sources, e.g. vLLM's fp8_block, they
cover disjoint shapes), so all sources are kept; a shape measured twice keeps the group's most
common source. The weight-only int4/int8 and SmoothQuant tables (A100 trtllm 1.0 only) are not
fitted. A chip whose catalog entry has no fp8 (fp4) peak gets no fp8 / fp8_block (fp4) keys.

Fit: per (chip, runtime, family), log-space least squares on a seeded sample of at most
``FIT_ROWS`` shapes not held out (common.held_out on m|n|k); the error report uses every
held-out shape. (``fit_multistart`` runs it from the module's ``STARTS`` and ``RANDOM_STARTS``
too and keeps the best; GEMM uses its x0 only.)

Warm cache: ``l2_speedup`` (kernel_gemm.warm_l2_factor with the chip's ``l2_cache_bytes``) takes
the benchmark's L2 hits on a weight set smaller than the cache (the call re-run on the same
buffers; L40S GEMMs at <= 64 rows ran 1.5x faster than predicted over 4-16 MB and 0.8x above
40 MB); fit-only, the scorer's cache is cold, and the cold ``hbm_fraction`` is capped at the
DRAM peak (1.0; fits had reached the old 1.2 on L40S, RTX PRO 6000 and vLLM's fp8_block).
Pooled held-out 1.148 -> 1.146 (2026-12-03; L40S TensorRT-LLM bf16 1.25 -> 1.20).

Missing (chip, runtime, family) (``complete``, shared with moe.py; this supersedes the
"other runtimes' geometric mean" sentence of common.py): ``common.transfer`` from the chips
that fitted **that runtime's** family (MAMF-scaled compute), since kernels differ far more
between runtimes than between chips; only where no chip has that runtime's table, the chip's
own other runtimes (geometric mean); a chip with no table at all: transfer from the same
runtime, else from every runtime. ``fitted_on`` names the origin.
"""

from __future__ import annotations

import datetime as _dt

import numpy as np
import pandas as pd

from dse.calibration.kernels import common, data
from dse.calibration.kernels.data import RUNTIMES
from dse.catalog import accelerators
from dse.perf.kernel_gemm import gemm_s

NAME = "gemm"
TABLE = ("gemm", "gemm_perf")
SHAPE_COLS = ("m", "n", "k")
FIT_ROWS = 1500            # fitted shapes per (chip, runtime, family): ~100 groups -> ~150k rows
SEED = 0
FAMILIES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "fp4"}
PEAK_DTYPE = {"bf16": "bf16", "fp8": "fp8", "fp8_block": "fp8", "fp4": "fp4"}
WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp8_block": 1.0 + 4.0 / (128 * 128),
                "fp4": 0.5 + 1.0 / 16}

# (suffix, x0, lo, hi, kind) of one family's parameters
_PER_FAMILY = (("fraction", 0.7, 0.02, 1.2, "compute"),
               ("half_rows", 64.0, 0.5, 8192.0, "shape"),
               ("n_half", 128.0, 1.0, 65536.0, "shape"),
               ("k_half", 128.0, 1.0, 65536.0, "shape"),
               ("wave_elements", 1e5, 1e2, 1e9, "shape"),
               # the cold-cache weight stream: at most the DRAM peak (fits reached 1.2 on the
               # big-L2 chips before the warm-cache term took the benchmark's L2 hits)
               ("hbm_fraction", 0.7, 0.02, 1.0, "fraction"),
               ("latency_s", 5e-6, 1e-7, 1e-3, "latency"),
               # the benchmark's warm L2 (kernel_gemm.warm_l2_factor; the scorer's is cold)
               ("l2_speedup", 2.0, 1.0, 30.0, "shape"))


def family_params(fam: str) -> tuple[common.Param, ...]:
    return tuple(common.Param(f"gemm_{fam}_{s}", x0, lo, hi, kind)
                 for s, x0, lo, hi, kind in _PER_FAMILY)


PARAMS = tuple(p for fam in ("bf16", "fp8", "fp8_block", "fp4") for p in family_params(fam))


def supported(acc, fam: str) -> bool:
    return getattr(acc.peak_flops_per_s, PEAK_DTYPE[fam], None) is not None


def load(**kw) -> pd.DataFrame:
    """The fitted rows (``kw``: data.load's chips= / runtimes= filters) with ``family`` and
    ``held_out``."""
    d = data.load(*TABLE, **kw)
    d = d[d["gemm_dtype"].isin(FAMILIES)].copy()
    d["family"] = d["gemm_dtype"].map(FAMILIES)
    grp = ["chip", "runtime", "family"]
    return common.one_row_per_shape(d, grp, SHAPE_COLS, "m")


def predict(frame: pd.DataFrame, fam: str, acc, vals: dict) -> np.ndarray:
    p = f"gemm_{fam}_"
    return gemm_s(frame["m"].to_numpy(), frame["n"].to_numpy(), frame["k"].to_numpy(),
                  WEIGHT_BYTES[fam], getattr(acc.peak_flops_per_s, PEAK_DTYPE[fam]),
                  acc.hbm_bw_bytes_per_s, vals[p + "fraction"], vals[p + "half_rows"],
                  vals[p + "n_half"], vals[p + "k_half"], vals[p + "wave_elements"], vals[p + "hbm_fraction"],
                  vals[p + "latency_s"], l2_bytes=getattr(acc, "l2_cache_bytes", None) or 0.0,
                  l2_speedup=vals.get(p + "l2_speedup", 1.0))


# --- shared fitting driver (moe.py uses it too) ---------------------------------------------

def sample(frame: pd.DataFrame, n: int, seed: int = SEED) -> pd.DataFrame:
    if len(frame) <= n:
        return frame
    return frame.sample(n=n, random_state=seed)


def fit_multistart(predict, params, true_s, starts=(), n_random: int = 0,
                   seed: int = SEED, loss: str = "linear", f_scale: float = 1.0):
    """``common.least_squares_fit`` from several starts, keeping the lowest log-RMS: the
    parameters' own x0, each dict of ``starts`` ({suffix: value}, e.g. a TensorRT-LLM-like
    point), and ``n_random`` seeded log-uniform draws within the bounds (the max() of the
    compute and memory terms makes the least squares non-convex: a kernel can be fitted as
    "slow compute, never memory-bound" or as "fast compute, memory-bound")."""
    import dataclasses
    rng = np.random.default_rng(seed)
    cands = [params]
    for st in starts:
        cands.append(tuple(dataclasses.replace(p, x0=st.get(_suffix(p.name), p.x0))
                           for p in params))
    for _ in range(n_random):
        cands.append(tuple(dataclasses.replace(
            p, x0=float(np.exp(rng.uniform(np.log(p.lo), np.log(p.hi))))) for p in params))
    best = None
    for c in cands:
        r = common.least_squares_fit(predict, c, true_s, loss=loss, f_scale=f_scale)
        if best is None or r.score < best.score - 1e-9:
            best = r
    return best


def _suffix(name: str) -> str:
    """A parameter's family-free suffix: moe_fp8_block_half_rows -> half_rows."""
    for fam in ("fp8_block", "bf16", "fp8", "fp4"):
        for op in ("moe", "gemm"):
            pre = f"{op}_{fam}_"
            if name.startswith(pre):
                return name[len(pre):]
    return name


def _bias(pred, true) -> float:
    r = np.log(np.asarray(pred, float) / np.asarray(true, float))
    r = r[np.isfinite(r)]
    return float(np.exp(r.mean())) if len(r) else float("nan")


def run(mod, fit: bool, write: bool, loco: bool) -> pd.DataFrame:
    """Fit ``mod`` (gemm or moe: NAME, load, predict, family_params, supported, FIT_ROWS,
    HEADER, SOURCE_TABLE) per (chip, runtime, family), report, transfer, write."""
    accs = accelerators()
    d = mod.load()
    groups = {key: g for key, g in d.groupby(["chip", "runtime", "family"])}
    split = getattr(mod, "backends", None)      # per-backend fits (moe.py's docstring)
    kinds = {k: (split(g[~g["held_out"]]) if split else []) for k, g in groups.items()}
    fitted: dict[tuple, dict] = {}
    notes: dict[tuple, str] = {}
    covs: dict[tuple, np.ndarray] = {}       # (chip, runtime, family) -> log covariance
    rows = []
    bfit: dict[tuple, dict] = {}       # (chip, runtime, backend) -> {key: value}
    bnotes: dict[tuple, str] = {}      # (chip, runtime, backend, family) -> what it was fitted on
    if not fit:
        fitted = _read_catalog(mod.NAME)
        covs = _read_covariances(mod.NAME)
        bfit = _read_backends(mod.NAME)
    version = data.package_version()
    today = _dt.date.today().isoformat()
    for (chip, rt, fam), g in sorted(groups.items()):
        acc = accs[chip]
        if not mod.supported(acc, fam):
            continue
        params = mod.family_params(fam)
        train = g[~g["held_out"]]
        test = g[g["held_out"]]
        if fit:
            vals, res, s = _fit_rows(mod, train, fam, acc, params)
            fitted.setdefault((chip, rt), {}).update(vals)
            covs[(chip, rt, fam)] = res.log_cov
            dist = ("" if "distribution" not in g or g["distribution"].iloc[0] == "balanced"
                    else f" ({g['distribution'].iloc[0]} rows, corrected to balanced)")
            notes[(chip, rt, fam)] = (f"{g['version'].iloc[0]}{dist}: {len(s)} shapes, "
                                      f"held out {len(test)}")
        else:
            vals = fitted.get((chip, rt), {})
            if not all(p.name in vals for p in params):
                continue
        pf = mod.predict(train, fam, acc, vals)
        pt = mod.predict(test, fam, acc, vals)
        own = kinds[(chip, rt, fam)]
        if len(own) >= 2:      # each backend's rows scored with its own fit; auto kept apart
            rows.append(_row(mod.NAME + "/auto", chip, rt, fam, min(len(train), mod.FIT_ROWS),
                             pf, train, pt, test))
            pf, pt = pf.copy(), pt.copy()
            for b in own:
                if fit:
                    bv = _fit_rows(mod, train[train["backend"] == b], fam, acc, params)[0]
                    bfit.setdefault((chip, rt, b), {}).update(bv)
                    nb = int((~g["held_out"] & (g["backend"] == b)).sum())
                    bnotes[(chip, rt, b, fam)] = (f"{g['version'].iloc[0]}: "
                                                  f"{min(nb, mod.FIT_ROWS)} {b} shapes")
                bv = bfit.get((chip, rt, b), {})
                if not all(q.name in bv for q in params):
                    continue
                mf, mt = (train["backend"] == b).to_numpy(), (test["backend"] == b).to_numpy()
                pf[mf] = mod.predict(train[mf], fam, acc, bv)
                pt[mt] = mod.predict(test[mt], fam, acc, bv)
        elif own and fit:      # one backend: the joint fit is that backend's
            bfit.setdefault((chip, rt, own[0]), {}).update({q.name: vals[q.name] for q in params})
            bnotes[(chip, rt, own[0], fam)] = notes[(chip, rt, fam)] + " (the group's kernel)"
        rows.append(_row(mod.NAME, chip, rt, fam, min(len(train), mod.FIT_ROWS),
                         pf, train, pt, test))
    if loco or write:      # the transfer rule's error (also sizes transferred covariances)
        for (chip, rt, fam), g in sorted(groups.items()):
            acc = accs[chip]
            if not mod.supported(acc, fam):
                continue
            params = mod.family_params(fam)
            # donors: (chip, runtime, family) fitted on its own rows (a table the fit saw and
            # the chip supports), never a transferred catalog entry (common.loco_donors)
            own = {c for (c, r, f) in groups if r == rt and f == fam and mod.supported(accs[c], f)}
            others = common.loco_donors(
                {c: v for (c, r), v in fitted.items()
                 if r == rt and all(q.name in v for q in params)}, chip, own)
            if not others:
                continue
            vals, near, ratio = common.transfer(chip, others, params, accs)
            p = mod.predict(g, fam, acc, vals)
            mine = kinds[(chip, rt, fam)]
            for b in (mine if len(mine) >= 2 else []):   # as the report: each backend's own
                donors = {c: bfit[(c, rt, b)] for (c, r, f) in groups
                          if r == rt and f == fam and (c, rt, b) in bfit
                          and b in kinds[(c, r, f)]
                          and all(q.name in bfit[(c, rt, b)] for q in params)}
                donors = common.loco_donors(donors, chip, own)
                if donors:
                    bv = common.transfer(chip, donors, params, accs)[0]
                    m = (g["backend"] == b).to_numpy()
                    p = p.copy()
                    p[m] = mod.predict(g[m], fam, acc, bv)
            rows.append(dict(op_class=mod.NAME + "/loco", chip=chip, runtime=rt, dtype=fam,
                             shapes_fit=0, shapes_held_out=len(g), error_fit=float("nan"),
                             error_held_out=common.error_factor(p, g["latency_s"]),
                             bias_held_out=_bias(p, g["latency_s"])))
    if write:
        lo = [r["error_held_out"] for r in rows if r["op_class"].endswith("/loco")
              and np.isfinite(r["error_held_out"])]
        loco_err = float(np.median(lo)) if lo else common.LOCO_DEFAULT
        entries = complete(mod, fitted, notes, accs, version, today, covs, loco_err)
        if split:
            for key, sections in backend_entries(mod, bfit, bnotes, accs).items():
                entries[key]["backend"] = sections
        common.write_tables(mod.NAME, mod.HEADER, entries)
    if not loco:
        rows = [r for r in rows if not r["op_class"].endswith("/loco")]
    return pd.DataFrame(rows, columns=["op_class", "chip", "runtime", "dtype", "shapes_fit",
                                       "shapes_held_out", "error_fit", "error_held_out",
                                       "bias_held_out"])


def _row(op_class, chip, rt, fam, n_fit, pf, train, pt, test) -> dict:
    return dict(op_class=op_class, chip=chip, runtime=rt, dtype=fam, shapes_fit=n_fit,
                shapes_held_out=len(test), error_fit=common.error_factor(pf, train["latency_s"]),
                error_held_out=common.error_factor(pt, test["latency_s"]),
                bias_held_out=_bias(pt, test["latency_s"]))


def _fit_rows(mod, train: pd.DataFrame, fam: str, acc, params):
    """(values, fit result, sample) of the module's multistart fit on a sample of at most
    ``FIT_ROWS`` training rows (a group's, or one backend's of it); parameters the sample cannot
    identify (no rows use them) at their neutral value (``mod.unidentified``)."""
    s = mod.sample(train, mod.FIT_ROWS)
    res = fit_multistart(lambda v: mod.predict(s, fam, acc, v), params, s["latency_s"].to_numpy(),
                         getattr(mod, "STARTS", ()), n_random=getattr(mod, "RANDOM_STARTS", 0),
                         loss=getattr(mod, "LOSS", "linear"), f_scale=getattr(mod, "F_SCALE", 1.0))
    return {**res.values, **getattr(mod, "unidentified", lambda s_, f_: {})(s, fam)}, res, s


def backend_entries(mod, bfit, bnotes, accs) -> dict:
    """``{(chip, runtime): {backend: {"fitted_on": text, key: value}}}`` for every catalog chip:
    per (runtime, backend, family) some chip fitted, the chip's own fit, else
    ``common.transfer`` from the chips that fitted it (moe.py's docstring)."""
    out: dict = {}
    combos = sorted({(r, b) for (_, r, b) in bfit})
    for chip in accs:
        for rt, b in combos:
            e, src = {}, []
            for fam in mod.FAMILY_ORDER:
                if not mod.supported(accs[chip], fam):
                    continue
                params = mod.family_params(fam)
                names = [p.name for p in params]
                own = bfit.get((chip, rt, b), {})
                if all(n in own for n in names):
                    e.update({n: own[n] for n in names})
                    src.append(f"{fam}: fitted on {b} rows, {rt} {bnotes.get((chip, rt, b, fam), '')}")
                    continue
                pool = {c: v for (c, r, bb), v in bfit.items()
                        if r == rt and bb == b and c != chip and all(n in v for n in names)}
                if not pool:
                    continue
                vals, near, _ = common.transfer(chip, pool, params, accs)
                e.update(vals)
                src.append(f"{fam}: transferred from {rt} {b} fits of {', '.join(near)}")
            if e:
                out.setdefault((chip, rt), {})[b] = {"fitted_on": "; ".join(src), **e}
    return out


def _read_backends(name: str) -> dict:
    """{(chip, runtime, backend): {key: value}} of the catalog's backend sections."""
    import tomllib
    path = common.CATALOG_DIR / f"{name}.toml"
    if not path.exists():
        return {}
    return {(chip, rt, b): {k: v for k, v in sec.items() if k != "fitted_on"}
            for chip, rts in tomllib.loads(path.read_text()).items()
            for rt, e in rts.items() for b, sec in e.get("backend", {}).items()}


def complete(mod, fitted, notes, accs, version, today, covs=None, loco_err=None) -> dict:
    """An entry for every catalog accelerator x runtime, per family: the fit where this
    (chip, runtime) measured it; else ``common.transfer`` from the chips that fitted the same
    runtime's family (compute MAMF-scaled), since runtimes' kernels differ far more than chips
    do (SGLang's Triton MoE ~12-15% of peak, TensorRT-LLM's CUTLASS 75-86%); only where no chip
    has that runtime's family, the chip's other runtimes (geometric mean); else the transfer
    rule from every runtime of the measured chips."""
    entries = {}
    fams = mod.FAMILY_ORDER
    covs = covs or {}
    loco_err = loco_err or common.LOCO_DEFAULT
    for chip, acc in accs.items():
        for rt in common_runtimes():
            e, sources, unc = {}, [], {}
            for fam in fams:
                if not mod.supported(acc, fam):
                    continue
                params = mod.family_params(fam)
                names = [p.name for p in params]
                own = fitted.get((chip, rt), {})
                if all(n in own for n in names):
                    e.update({n: own[n] for n in names})
                    if (chip, rt, fam) in covs:
                        unc[f"{mod.NAME}_{fam}"] = common.uncertainty(
                            names, covs[(chip, rt, fam)], "fitted: least-squares covariance")
                    sources.append(f"{fam}: {mod.SOURCE_TABLE}, {rt} {notes.get((chip, rt, fam), '')}")
                    continue
                pool = {c: v for (c, r), v in fitted.items()
                        if r == rt and c != chip and all(n in v for n in names)}
                rt_pool = bool(pool)
                same = [v for (c, r), v in fitted.items()
                        if c == chip and r != rt and all(n in v for n in names)]
                if not pool and same:
                    e.update({n: float(np.exp(np.mean([np.log(v[n]) for v in same])))
                              for n in names})
                    donors = [covs[(chip, r, fam)] for (c, r), v in fitted.items()
                              if c == chip and r != rt and (chip, r, fam) in covs]
                    unc[f"{mod.NAME}_{fam}"] = _transferred(names, donors, loco_err)
                    sources.append(f"{fam}: geometric mean of this chip's other runtimes "
                                   f"(no chip has {rt}'s table)")
                    continue
                if not pool:
                    pool = {}
                    for (c, r), v in fitted.items():
                        if c != chip and all(n in v for n in names):
                            pool.setdefault(c, []).append(v)
                    pool = {c: {n: float(np.exp(np.mean([np.log(x[n]) for x in vs])))
                                for n in names} for c, vs in pool.items()}
                if not pool:
                    continue
                vals, near, ratio = common.transfer(chip, pool, params, accs)
                e.update(vals)
                donors = [covs[(m, r, fam)] for m in near for r in common_runtimes()
                          if (m, r, fam) in covs and (r == rt or not rt_pool)]
                unc[f"{mod.NAME}_{fam}"] = _transferred(names, donors, loco_err)
                r = "none" if ratio is None else f"{ratio:.3g}"
                sources.append(f"{fam}: transferred from {rt if rt_pool else 'all runtimes'} "
                               f"of {', '.join(near)} "
                               f"({len(near)} nearest by spec); compute x MAMF ratio {r}")
            merged: dict[str, list[str]] = {}
            for text in sources:       # one clause per distinct origin, families listed once
                fam, _, rest = text.partition(": ")
                merged.setdefault(rest, []).append(fam)
            body = "; ".join(f"{', '.join(f)}: {r}" for r, f in merged.items())
            head = f"aiconfigurator-core {version}; fitted {today}"
            entries[(chip, rt)] = {"fitted_on": f"{head}; {body}", **e, "uncertainty": unc}
    return entries


def _transferred(names, donors, loco_err) -> dict:
    """The uncertainty of a transferred family (common.inflated_cov)."""
    n = len(names)
    cov = common.inflated_cov([d for d in donors if np.shape(d) == (n, n)], loco_err) \
        if donors else np.eye(n) * np.log(loco_err) ** 2
    rule = (f"transferred: donors' covariance + ln({loco_err:.4g})^2 "
            "(median leave-one-chip-out error)")
    return common.uncertainty(names, cov, rule)


def _read_covariances(name: str) -> dict:
    """{(chip, runtime, family): log covariance} of the catalog's fitted families."""
    import tomllib
    path = common.CATALOG_DIR / f"{name}.toml"
    if not path.exists():
        return {}
    out = {}
    for chip, rts in tomllib.loads(path.read_text()).items():
        for rt, e in rts.items():
            for fam_key, u in e.get("uncertainty", {}).items():
                if not u.get("rule", "").startswith("fitted"):
                    continue
                sd = np.asarray(u["log_sd"], float)
                out[(chip, rt, fam_key.split("_", 1)[1])] = (np.outer(sd, sd)
                                                             * np.asarray(u["log_corr"], float))
    return out


def common_runtimes():
    return RUNTIMES


def _read_catalog(name: str) -> dict:
    import tomllib
    path = common.CATALOG_DIR / f"{name}.toml"
    if not path.exists():
        return {}
    doc = tomllib.loads(path.read_text())
    return {(chip, rt): {k: v for k, v in e.items()
                         if k not in ("fitted_on", "uncertainty", "backend")}
            for chip, rts in doc.items() for rt, e in rts.items()}


FAMILY_ORDER = ("bf16", "fp8", "fp8_block", "fp4")
SOURCE_TABLE = "gemm_perf"
HEADER = """Dense GEMM model parameters per accelerator and runtime (dse.perf.kernel_gemm.gemm_s):
  t_s = latency_s + max(2 ((m + half_rows) n + wave_elements) k / (peak * fraction * shape),
                        (n k weight_bytes + 2 (m k + m n)) / (hbm_bw * hbm_fraction))
  shape = 1 / (1 + n_half / n + k_half / k)
Keys gemm_<family>_{fraction, half_rows (rows), n_half, k_half, wave_elements (elements), hbm_fraction
(the cold-cache stream, <= 1), latency_s (s), l2_speedup (fit only: the benchmark's warm L2,
kernel_gemm.warm_l2_factor with the chip's l2_cache_bytes; the scorer's cache is cold)}; families bf16, fp8 (per-tensor scaled), fp8_block (block-scaled, DeepGEMM),
fp4 (NVFP4); a chip without that dtype's peak has no keys for it.
Fitted on aiconfigurator-core's gemm_perf kernel microbenchmarks (python -m dse.calibration.kernels)."""


def main(fit: bool = False, write: bool = False, loco: bool = False) -> pd.DataFrame:
    import sys
    return run(sys.modules[__name__], fit, write, loco)
