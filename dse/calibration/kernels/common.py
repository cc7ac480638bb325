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
rule is checked leave-one-chip-out (``python -m dse.calibration.kernels --loco``).

Leave-one-chip-out (``loco_donors``, the one donor filter every op class uses): chip X is
predicted by the transfer rule from donors that are (1) other chips, every runtime of X being
left out (X's tables of all runtimes are unseen: X under another runtime is no donor), (2)
entries fitted on their own measured rows, never a catalog entry that was itself filled by
transfer (a chip or runtime without a table: ``transfer``/``gemm.complete``; such an entry may
have been derived from X), and (3) not derived from X in part (a fitted entry with terms fixed
from other chips' fits, e.g. a host-staged chip's group-size terms, is no donor of those chips).
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
CATALOG_DIR = Path(__file__).resolve().parents[2] / "catalog" / "kernels"


@dataclass(frozen=True)
class Param:
    """One fitted parameter: its name (a catalog key), starting value, bounds, and kind:
    ``compute`` (a fraction of a peak FLOP/s, MAMF-scaled on transfer), ``fraction`` (of a
    bandwidth), ``latency`` (seconds), ``shape`` (rows, tokens, elements) or ``threshold`` (a
    kernel's largest supported shape: chosen from a grid of candidates, not by least squares;
    transferred as the neighbours' median)."""

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
    score: float = float("nan")   # the minimized cost (robust loss); compares starts


def bounded_cov(cov, log_lo, log_hi, jtj_diag=None) -> np.ndarray:
    """A log covariance whose parameters the data do not pin down gets their prior spread:
    each log sd is capped at that of a uniform draw within the parameter's log bounds,
    ``(hi - lo) / sqrt(12)``, and a parameter the fit cannot see (a zero Jacobian column, or a
    zero variance: pinned at a bound) gets exactly that, uncorrelated."""
    cov = np.array(cov, float)
    cap = (np.asarray(log_hi, float) - np.asarray(log_lo, float)) / np.sqrt(12.0)
    var = np.diag(cov).copy()
    flat = ~np.isfinite(var) | (var <= 0)
    if jtj_diag is not None:
        d = np.asarray(jtj_diag, float)
        flat |= d <= 1e-12 * max(float(np.max(d)), 1e-300)
    cov[flat, :] = 0.0
    cov[:, flat] = 0.0
    cov[flat, flat] = cap[flat] ** 2
    sd = np.sqrt(np.clip(np.diag(cov), 1e-300, None))
    f = np.minimum(1.0, cap / sd)
    return cov * np.outer(f, f)


def least_squares_fit(predict, params: tuple[Param, ...], true_s: np.ndarray,
                      weights: np.ndarray | None = None, max_nfev: int = 200,
                      loss: str = "linear", f_scale: float = 1.0) -> Fit:
    """Fit ``predict(values_dict) -> seconds`` to ``true_s`` in log space, parameters in log
    space within their bounds. Returns the values and the covariance of their logs.

    ``loss``/``f_scale``: scipy's robust loss on the log residuals. ``"soft_l1"`` with a small
    ``f_scale`` (e.g. 0.05) minimizes about the mean |log(pred/true)|, i.e. the reported error
    factor itself, and keeps a few pathological measured shapes (kernels off their tuned
    configurations) from dragging the fit of the rest."""
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
                        method="trf", loss=loss, f_scale=f_scale)
    dof = max(len(true_s) - len(params), 1)
    s2 = float(np.sum(sol.fun ** 2) / dof)
    try:
        jtj = sol.jac.T @ sol.jac
        cov = np.linalg.pinv(0.5 * (jtj + jtj.T), hermitian=True) * s2
        cov = 0.5 * (cov + cov.T)
    except np.linalg.LinAlgError:
        cov = np.full((len(params), len(params)), np.nan)
        jtj = np.zeros_like(cov)
    cov = bounded_cov(cov, lo, hi, np.diag(jtj) if np.ndim(cov) == 2 else None)
    vals = {p.name: float(v) for p, v in zip(params, np.exp(sol.x))}
    return Fit(vals, cov, len(true_s), float(np.sqrt(np.mean((sol.fun / w) ** 2))),
               float(sol.cost))


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
        # a threshold (a kernel's largest supported shape, chosen from a grid) takes the
        # neighbours' median: one of their kernels' values, never a mean between two
        v = float(np.median(xs)) if p.kind == "threshold" else float(np.exp(np.mean(np.log(xs))))
        if p.kind == "compute" and ratio is not None:
            v = v * ratio
        vals[p.name] = float(np.clip(v, p.lo, p.hi))
    return vals, near, ratio


def loco_donors(entries: dict, left_out: str, own, derived_from: dict | None = None) -> dict:
    """The leave-one-chip-out donors of ``left_out`` (module docstring): of ``entries``
    ({key: values}, a key being a chip or a tuple that starts with the chip), the keys in
    ``own`` (fitted on their own measured rows), never one of ``left_out`` itself (any
    runtime), and none whose ``derived_from`` ({key: chips some of its terms were taken from})
    names ``left_out``."""
    own = set(own)
    derived_from = derived_from or {}
    chip_of = lambda k: k if isinstance(k, str) else k[0]  # noqa: E731
    return {k: v for k, v in entries.items()
            if chip_of(k) != left_out and k in own and left_out not in derived_from.get(k, ())}


# --- parameter uncertainty ------------------------------------------------------------------
#
# Each catalog entry carries, per fitted family (a group of parameters fitted together), the
# covariance of the log parameters as ``log_sd`` (standard deviation of ln(value), one per name
# of ``params``) and ``log_corr`` (their correlation matrix), in a sub-table
# ``["<chip>".<runtime>.uncertainty.<family>]``; ``ln(value) ~ N(ln(fitted), diag(sd) C diag(sd))``
# draws parameter samples for uncertainty bands. Fitted entries: the least-squares covariance
# (``least_squares_fit``: s^2 (J^T J)^-1 of the log-space residuals; soft_l1 fits use scipy's
# loss-weighted Jacobian; a parameter the data leave free is capped at, and one they cannot
# see at all set to, the sd of a uniform draw within its log bounds: ``bounded_cov``). Transferred entries (no table for that chip/runtime): the donors'
# mean covariance plus an independent ``ln(loco)^2`` on every log parameter, where ``loco`` is
# the op class's median leave-one-chip-out error factor measured in the same fit
# (``LOCO_DEFAULT`` when none was measured): a transferred chip's parameters are uncertain by
# about the error the transfer rule shows on measured chips.

LOCO_DEFAULT = 1.3


def uncertainty(names, log_cov: np.ndarray, rule: str) -> dict:
    """The catalog sub-table of one family: params, log_sd, log_corr, rule."""
    cov = np.asarray(log_cov, float)
    sd = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = cov / np.outer(sd, sd)
    corr = np.where(np.isfinite(corr), np.clip(corr, -1.0, 1.0), 0.0)
    np.fill_diagonal(corr, 1.0)
    return {"params": list(names), "log_sd": [float(x) for x in sd],
            "log_corr": [[round(float(x), 3) for x in row] for row in corr], "rule": rule}


def inflated_cov(covs: list[np.ndarray], loco: float) -> np.ndarray:
    """A transferred entry's log covariance: the donors' mean plus ln(loco)^2 on the diagonal."""
    n = covs[0].shape[0]
    c = np.mean([np.nan_to_num(np.asarray(x, float)) for x in covs], axis=0) if covs \
        else np.zeros((n, n))
    return c + np.eye(n) * np.log(loco) ** 2


# --- catalog files --------------------------------------------------------------------------

def write_tables(name: str, header: str, entries: dict[tuple[str, str], dict],
                 path: Path | None = None) -> Path:
    """Write ``dse/catalog/kernels/<name>.toml``: one table ``["<chip>".<runtime>]`` per entry
    with its parameters and a ``fitted_on`` string (what it was fitted on, or transferred from)."""
    path = path or CATALOG_DIR / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    today = _dt.date.today().isoformat()
    lines = [f"# {line}" if line else "#" for line in header.strip().splitlines()]
    lines += [f"# Written by `python -m dse.calibration.kernels --fit --write` on {today}; do not edit by hand.",
              ""]
    for (chip, runtime) in sorted(entries):
        e = dict(entries[(chip, runtime)])
        unc = e.pop("uncertainty", {})
        backend = e.pop("backend", {})
        lines.append(f'["{chip}".{runtime}]')
        for k, v in e.items():
            if isinstance(v, str):
                lines.append(f'{k} = "{v}"')
            else:
                lines.append(f"{k} = {float(v):.6g}")
        lines.append("")
        for fam, u in unc.items():
            lines.append(f'["{chip}".{runtime}.uncertainty.{fam}]')
            lines.append("params = [" + ", ".join(f'"{n}"' for n in u["params"]) + "]")
            lines.append("log_sd = [" + ", ".join(f"{x:.4g}" for x in u["log_sd"]) + "]")
            lines.append("log_corr = [" + ", ".join(
                "[" + ", ".join(f"{x:.3g}" for x in row) + "]" for row in u["log_corr"]) + "]")
            lines.append(f'rule = "{u["rule"]}"')
            lines.append("")
        for b, sec in sorted(backend.items()):    # a kernel backend's own parameters (moe.py)
            lines.append(f'["{chip}".{runtime}.backend.{b}]')
            for k, v in sec.items():
                lines.append(f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {float(v):.6g}")
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

