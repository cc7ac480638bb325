"""Least-squares fit of the per-accelerator efficiency factors on the calibration set.

Each accelerator with calibration cases gets its own factors, fitted on its cases only (a few
parameters against tens of cases), with a weak log-normal prior that pulls each factor toward
the physical default so that no factor runs off to fit noise. Accelerators without cases get
``default``: the geometric mean of the fitted ones, with ``matmul_fraction`` expressed relative
to the measured matmul microbenchmark (MAMF) so it transfers to other chips.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from dse import catalog
from dse.build import EFF_FIELDS
from dse.calibrate import joined, weights
from dse.predict import Prepared, finish, prepare

# (name, prior, lower, upper, prior sigma in log space)
PARAMS = (
    ("matmul_fraction", 0.6, 0.15, 1.0, 0.5),
    ("matmul_half_rows", 64.0, 1.0, 2048.0, 1.0),
    ("attention_fraction", 0.5, 0.1, 1.0, 0.5),
    ("hbm_fraction", 0.8, 0.3, 1.0, 0.3),
    ("scaleup_fraction", 0.8, 0.1, 1.0, 0.5),
    ("layer_overhead_s", 20e-6, 1e-7, 5e-4, 1.5),
    ("step_overhead_s", 1e-3, 1e-5, 2e-2, 1.5),
)
FIXED = {"scaleout_fraction": 0.75, "network_overlap_fraction": 0.0}


def _batch_with(prep: Prepared, rows: np.ndarray, theta: np.ndarray):
    cols = {}
    for (name, *_), v in zip(PARAMS, theta):
        col = prep.batch.columns[name].copy()
        col[rows] = v
        cols[name] = col
    return prep.batch.replace(**cols)


def fit(cases: pd.DataFrame, truth: pd.DataFrame, verbose: bool = True) -> dict:
    """Fitted efficiency tables: {accelerator id: {field: value}, 'default': {...}}."""
    prep = prepare(cases, file="cases.csv")
    hw_rows = prep.resolved["accelerator.id"].to_numpy()
    fitted = {}
    for hw in sorted(cases["hardware"].unique()):
        rows = np.flatnonzero(hw_rows == hw)
        sub_cases = cases[cases["hardware"] == hw]
        sub_truth = truth[truth["case_id"].isin(sub_cases["case_id"])]
        base = sub_truth.merge(cases[["case_id", "hardware", "model"]], on="case_id")
        w = weights(base.assign(pred=1.0))
        w = np.sqrt(w / w.mean())
        x0 = np.log([p[1] for p in PARAMS])
        lo = np.log([p[2] for p in PARAMS])
        hi = np.log([p[3] for p in PARAMS])
        sig = np.array([p[4] for p in PARAMS])

        def resid(x):
            pred = finish(prep, _batch_with(prep, rows, np.exp(x)))
            pred = pred[pred["case_id"].isin(sub_cases["case_id"])]
            j = joined(pred, sub_cases, sub_truth)
            j = base[["case_id", "metric"]].merge(j, on=["case_id", "metric"], how="left")
            r = np.log(j["pred"].to_numpy(float) / j["value"].to_numpy(float))
            r = np.where(np.isfinite(r), r, 3.0)
            return np.concatenate([w * r, 0.1 * (x - x0) / sig])

        sol = least_squares(resid, x0, bounds=(lo, hi), diff_step=0.05, x_scale=1.0,
                            max_nfev=300)
        theta = np.exp(sol.x)
        fitted[hw] = {p[0]: float(v) for p, v in zip(PARAMS, theta)}
        if verbose:
            rms = np.sqrt(np.mean(sol.fun[: len(base)] ** 2))
            print(f"{hw:14s} " + " ".join(f"{p[0]}={v:.3g}" for p, v in zip(PARAMS, theta))
                  + f"  (weighted rms log error {rms:.3f}, {sol.nfev} evaluations)")
    return _tables(fitted, cases)


def _tables(fitted: dict, cases: pd.DataFrame) -> dict:
    accs = catalog.accelerators()
    n_cases = cases.groupby("hardware").size().to_dict()
    today = _dt.date.today().isoformat()
    out = {}
    for hw, vals in fitted.items():
        out[hw] = {**vals, **FIXED, "fitted_on": (
            f"{n_cases[hw]} cases of ../shared/calibration (TRTLLM-V017 offline throughput, "
            f"TRTLLM-ONLINE TTFT/TPOT) for {hw}, fitted {today}")}
    ratios = []
    for hw in fitted:
        mb = accs[hw].microbench
        if mb and mb.matmul_bf16_flops_per_s:
            ratios.append(mb.matmul_bf16_flops_per_s / accs[hw].peak_flops_per_s.bf16)
    default = {p[0]: float(np.exp(np.mean([np.log(v[p[0]]) for v in fitted.values()])))
               for p in PARAMS}
    out["default"] = {**default, **FIXED,
                      "reference_mamf_fraction": float(np.mean(ratios)) if ratios else 0.8,
                      "fitted_on": "geometric mean of the fitted accelerators ("
                                   + ", ".join(sorted(fitted)) + f"), {today}"}
    return out


def write_efficiency(tables: dict, path: Path | None = None) -> Path:
    path = path or Path(catalog.__file__).with_name("efficiency.toml")
    lines = ["# Empirical efficiencies of the serving model, per accelerator.",
             "# Written by `python -m dse.calibrate --fit --write` (fitted on ../shared/calibration);",
             "# do not edit by hand. `default` applies to accelerators without calibration data; its",
             "# matmul_fraction is scaled by the chip's measured matmul microbenchmark (MAMF) relative",
             "# to reference_mamf_fraction, the mean MAMF/peak of the fitted chips.", ""]
    order = ["default"] + sorted(k for k in tables if k != "default")
    for k in order:
        lines.append(f"[{k}]")
        for f in (*EFF_FIELDS, "reference_mamf_fraction", "fitted_on"):
            if f in tables[k]:
                v = tables[k][f]
                lines.append(f'{f} = "{v}"' if isinstance(v, str) else f"{f} = {v:.6g}")
        lines.append("")
    text = "\n".join(lines)
    text = text.replace("= inf", "= 1e300")
    path.write_text(text)
    catalog.accelerators.cache_clear()
    from dse import build
    build._FRAMES = None
    return path
