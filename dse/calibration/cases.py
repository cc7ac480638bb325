"""The calibration set (``../shared/calibration``: measured end-to-end serving cases and their
truths) and the model's error on it: the geometric mean over cases of ``max(pred/true,
true/pred)``, each case weighted so that every (source, hardware) pair counts equally within a
source. Read by the end-to-end fit (``fit``), its report (``calibrate``) and the kernel data
layer (``kernels.data``, for the folder)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from dse.errors import InputError
from dse.scoring.predict import read_cases

METRICS = ("output_tokens_per_s_per_chip", "ttft_s", "tpot_s", "input_tokens_per_s_per_chip")


def default_dir() -> Path:
    """``../shared/calibration`` next to the checkout, or $DSE_CALIBRATION_DIR."""
    env = os.environ.get("DSE_CALIBRATION_DIR")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parents[2]
    for base in (here, Path.cwd()):
        cand = base.parent / "shared" / "calibration"
        if cand.is_dir():
            return cand
    raise InputError("calibration folder not found", where="../shared/calibration",
                     hint="set DSE_CALIBRATION_DIR to the folder with cases.csv and truth.csv")


def load(folder: Path | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    folder = Path(folder) if folder else default_dir()
    cases = read_cases(str(folder / "cases.csv"))
    truth = pd.read_csv(folder / "truth.csv")
    return cases, truth


def joined(pred: pd.DataFrame, cases: pd.DataFrame, truth: pd.DataFrame) -> pd.DataFrame:
    """One row per (case, metric) with prediction, truth and the case's source and hardware."""
    t = truth.merge(cases[["case_id", "hardware", "model"]], on="case_id")
    long = pred.melt(id_vars="case_id", value_vars=[m for m in METRICS if m in pred.columns],
                     var_name="metric", value_name="pred")
    j = t.merge(long, on=["case_id", "metric"], how="left")
    j["factor"] = np.exp(np.abs(np.log(j["pred"].astype(float) / j["value"].astype(float))))
    # online rows at an infinite request rate carry no concurrency (fittable): their own
    # group in every report, never mixed into the rows whose inputs are known
    ok = pd.Series(fittable(cases), index=cases.index).groupby(cases["case_id"]).first()
    unknown = ~j["case_id"].map(ok).fillna(True).astype(bool)
    j.loc[unknown, "source"] = j.loc[unknown, "source"] + " (max rate, no concurrency)"
    return j


def weights(j: pd.DataFrame) -> np.ndarray:
    """Each (source, metric, hardware) group gets equal total weight within its (source, metric)."""
    n = j.groupby(["source", "metric", "hardware"])["case_id"].transform("count")
    return 1.0 / n.to_numpy(dtype=float)


def fittable(cases: pd.DataFrame) -> np.ndarray:
    """Cases whose inputs are known: online-serving rows at an infinite request rate carry no
    concurrency (their concurrency was bounded by the 500 requests sent, not by the runtime),
    so they are reported but not fitted."""
    conc = pd.to_numeric(cases.get("concurrency"), errors="coerce")
    online = cases["source"].astype(str).str.contains("ONLINE") if "source" in cases else False
    return ~(np.asarray(online) & conc.isna().to_numpy())
