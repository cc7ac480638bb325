"""What every kernel fit shares: the held-out rule, the least-squares fit, the error factor, the
transfer rule to chips without tables, and the catalog writer.

Held-out rule (the same for every op class and chip): a measured shape is held out of the fit
when ``crc32(shape key) % 5 == 0``, where the shape key is the op's shape columns joined as
text (so about 20% of the shapes, the same shapes on every chip and runtime). The error report
gives each op class's error on the held-out shapes only.

Transfer rule (chips without tables: MI300X/MI325X/MI355X, TPUs, Trn2, Gaudi 3, H800, GH200,
hypothetical chips): every fitted parameter is written for every catalog accelerator. A chip
without measurements takes the geometric mean of its ``K_NEAREST`` nearest measured chips in
the space of log spec ratios (bf16 FLOP/s, HBM bandwidth, FLOP per HBM byte); a compute
efficiency (``kind="compute"``) is then multiplied by the chip's measured matmul
microbenchmark (MAMF / peak) over the same neighbours' mean, when the chip has one. A runtime
missing on a measured chip takes the same rule from the chips that have that runtime's table
(runtime kernels differ more than chips do: SGLang's Triton MoE reaches a fifth of what
TensorRT-LLM's CUTLASS kernels do); only when no chip has it, the chip's other runtimes. The
rule is checked leave-one-chip-out (``python -m dse.kernels --loco``).
"""

from __future__ import annotations

import datetime as _dt
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

K_NEAREST = 3
HOLDOUT_MOD = 5
CATALOG_DIR = Path(__file__).resolve().parents[1] / "catalog" / "kernels"


@dataclass(frozen=True)
class Param:
    """One fitted parameter: its name (a catalog key), starting value, bounds, and kind:
    ``compute`` (a fraction of a peak FLOP/s, MAMF-scaled on transfer), ``fraction`` (of a
    bandwidth), ``latency`` (seconds) or ``shape`` (rows, tokens, elements)."""

    name: str
    x0: float
    lo: float
    hi: float
    kind: str = "fraction"


def shape_key(frame: pd.DataFrame, cols) -> np.ndarray:
    text = frame[list(cols)].astype(str).agg("|".join, axis=1)
    return np.array([zlib.crc32(t.encode()) for t in text], dtype=np.uint64)


def held_out(frame: pd.DataFrame, cols) -> np.ndarray:
    """The documented held-out rule: True for the ~20% of shapes with crc32 % 5 == 0."""
    return (shape_key(frame, cols) % HOLDOUT_MOD) == 0


def error_factor(pred, true, weights=None) -> float:
    """Geometric mean of max(pred/true, true/pred)."""
    r = np.abs(np.log(np.asarray(pred, float) / np.asarray(true, float)))
    ok = np.isfinite(r)
    if not ok.any():
        return float("nan")
    w = None if weights is None else np.asarray(weights, float)[ok]
    return float(np.exp(np.average(r[ok], weights=w)))


@dataclass
class Fit:
    values: dict
    log_cov: np.ndarray        # covariance of the log parameters (for uncertainty bands)
    rows: int
    rms_log: float


def least_squares_fit(predict, params: tuple[Param, ...], true_s: np.ndarray,
                      weights: np.ndarray | None = None, max_nfev: int = 200) -> Fit:
    """Fit ``predict(values_dict) -> seconds`` to ``true_s`` in log space, parameters in log
    space within their bounds. Returns the values and the covariance of their logs."""
    true_s = np.asarray(true_s, float)
    w = np.ones_like(true_s) if weights is None else np.sqrt(np.asarray(weights, float))
    x0 = np.log([p.x0 for p in params])
    lo = np.log([p.lo for p in params])
    hi = np.log([p.hi for p in params])
    x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)

    def resid(x):
        vals = {p.name: v for p, v in zip(params, np.exp(x))}
        r = np.log(np.maximum(predict(vals), 1e-30) / true_s)
        return w * np.where(np.isfinite(r), r, 10.0)

    sol = least_squares(resid, x0, bounds=(lo, hi), x_scale=1.0, max_nfev=max_nfev,
                        method="trf")
    dof = max(len(true_s) - len(params), 1)
    s2 = float(np.sum(sol.fun ** 2) / dof)
    try:
        cov = np.linalg.pinv(sol.jac.T @ sol.jac) * s2
    except np.linalg.LinAlgError:
        cov = np.full((len(params), len(params)), np.nan)
    vals = {p.name: float(v) for p, v in zip(params, np.exp(sol.x))}
    return Fit(vals, cov, len(true_s), float(np.sqrt(np.mean((sol.fun / w) ** 2))))


# --- transfer to chips without tables -----------------------------------------------------

def _spec_vector(acc) -> np.ndarray:
    bf16 = acc.peak_flops_per_s.bf16
    bw = acc.hbm_bw_bytes_per_s
    return np.array([np.log10(bf16), np.log10(bw), np.log10(bf16 / bw)])


def _mamf_ratio(acc):
    mb = acc.microbench
    if mb and mb.matmul_bf16_flops_per_s:
        return mb.matmul_bf16_flops_per_s / acc.peak_flops_per_s.bf16
    return None


def neighbours(chip: str, measured: list[str], accs: dict) -> list[str]:
    """The K_NEAREST measured chips closest to ``chip`` in log spec space (never itself)."""
    others = [m for m in measured if m != chip]
    v = _spec_vector(accs[chip])
    dist = [float(np.linalg.norm(_spec_vector(accs[m]) - v)) for m in others]
    order = np.argsort(dist, kind="stable")
    return [others[i] for i in order[:K_NEAREST]]


def transfer(chip: str, fitted: dict[str, dict], params: tuple[Param, ...], accs: dict):
    """Parameters for ``chip`` from the chips in ``fitted`` ({chip: {name: value}}) by the
    documented rule; returns (values, the neighbours used, the MAMF factor applied or None)."""
    near = neighbours(chip, sorted(fitted), accs)
    vals = {}
    ratio = None
    own = _mamf_ratio(accs[chip])
    near_ratios = [r for r in (_mamf_ratio(accs[m]) for m in near) if r]
    if own and near_ratios:
        ratio = own / float(np.exp(np.mean(np.log(near_ratios))))
    for p in params:
        xs = [fitted[m][p.name] for m in near if p.name in fitted[m]]
        if not xs:
            continue
        v = float(np.exp(np.mean(np.log(xs))))
        if p.kind == "compute" and ratio is not None:
            v = v * ratio
        vals[p.name] = float(np.clip(v, p.lo, p.hi))
    return vals, near, ratio


# --- catalog files --------------------------------------------------------------------------

def write_tables(name: str, header: str, entries: dict[tuple[str, str], dict],
                 path: Path | None = None) -> Path:
    """Write ``dse/catalog/kernels/<name>.toml``: one table ``["<chip>".<runtime>]`` per entry
    with its parameters and a ``fitted_on`` string (what it was fitted on, or transferred from)."""
    path = path or CATALOG_DIR / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    today = _dt.date.today().isoformat()
    lines = [f"# {line}" if line else "#" for line in header.strip().splitlines()]
    lines += [f"# Written by `python -m dse.kernels --fit --write` on {today}; do not edit by hand.",
              ""]
    for (chip, runtime) in sorted(entries):
        e = entries[(chip, runtime)]
        lines.append(f'["{chip}".{runtime}]')
        for k, v in e.items():
            if isinstance(v, str):
                lines.append(f'{k} = "{v}"')
            else:
                lines.append(f"{k} = {float(v):.6g}")
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def one_row_per_shape(d: pd.DataFrame, group: list, shape_cols, count_col: str) -> pd.DataFrame:
    """Where a table measured a shape with several kernel sources, keep the group's most common
    source's row (the runtime's default kernel), and mark every shape with the held-out rule."""
    d = d.copy()
    d["_n"] = d.groupby(group + ["kernel_source"])[count_col].transform("size")
    d = (d.sort_values("_n", ascending=False, kind="stable")
         .drop_duplicates(group + list(shape_cols)).drop(columns="_n"))
    u = d[list(shape_cols)].drop_duplicates()
    u = u.assign(held_out=held_out(u, shape_cols))
    return d.merge(u, on=list(shape_cols), how="left").reset_index(drop=True)

