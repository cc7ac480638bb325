"""Pareto fronts and hypervolumes of score tables (moocore does the heavy lifting).

Objectives are turned into minimisation (a maximised metric is negated); rows that are
infeasible, violate a constraint or have a non-finite objective never enter a front.
"""

from __future__ import annotations

import moocore
import numpy as np
import pandas as pd


def objective_matrix(scores: dict | pd.DataFrame, objectives) -> np.ndarray:
    cols = []
    for o in objectives:
        v = np.asarray(scores[o.metric], dtype=np.float64)
        cols.append(v if o.direction == "minimize" else -v)
    return np.column_stack(cols) if cols else np.zeros((0, 0))


def admissible(scores: dict | pd.DataFrame, objectives, constraints) -> np.ndarray:
    ok = np.asarray(scores["feasible"], dtype=bool).copy()
    for c in constraints:
        v = np.asarray(scores[c.metric], dtype=np.float64)
        if c.max is not None:
            ok &= v <= c.max
        if c.min is not None:
            ok &= v >= c.min
    F = objective_matrix(scores, objectives)
    return ok & np.isfinite(F).all(axis=1)


def nondominated(F: np.ndarray) -> np.ndarray:
    """Mask of the rows of F (minimisation) that no other row dominates; duplicates kept once."""
    if len(F) == 0:
        return np.zeros(0, bool)
    if F.shape[1] == 1:
        return F[:, 0] == F[:, 0].min()
    return moocore.is_nondominated(F, keep_weakly=False)


def front_of(frames: list[pd.DataFrame], objectives) -> pd.DataFrame:
    """The Pareto set of the union of score tables (already admissible rows)."""
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame()
    allf = pd.concat(frames, ignore_index=True)
    if "design_id" in allf:      # a design scored twice (a sampler may ask it again) counts once
        allf = allf.drop_duplicates("design_id", keep="first")
    mask = nondominated(objective_matrix(allf, objectives))
    return allf[mask].reset_index(drop=True)


def reference(F: np.ndarray, margin: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """A reference point and scale for hypervolumes: the nadir plus a margin, and the range."""
    lo, hi = F.min(axis=0), F.max(axis=0)
    span = np.where(hi > lo, hi - lo, np.maximum(np.abs(hi), 1.0))
    return hi + margin * span, span


def hypervolume(F: np.ndarray, ref: np.ndarray, scale: np.ndarray) -> float:
    """Hypervolume of F (minimisation) against ``ref``, each objective divided by ``scale``."""
    if len(F) == 0:
        return 0.0
    Fs = F / scale
    r = np.asarray(ref) / scale
    inside = (Fs < r).all(axis=1)
    if not inside.any():
        return 0.0
    return float(moocore.hypervolume(Fs[inside], ref=r))


LOG_AXIS_RATIO = 10.0   # the one axis rule: a log scale where values span more than this


def log_axis(values) -> bool:
    """Whether values are best seen on a log scale: all of one sign (NaNs ignored) and spanning
    over ``LOG_AXIS_RATIO`` (costs and speeds over a batch sweep do). The knee scales such an
    objective by its log, and every figure draws it on a log axis."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    a = np.abs(v)
    return bool(len(v) and (np.all(v > 0) or np.all(v < 0)) and a.max() / a.min() > LOG_AXIS_RATIO)


def knee(front: pd.DataFrame, objectives) -> int:
    """Row of the front closest to the ideal point, objectives scaled to [0, 1] on the front
    (on a log scale for an objective whose front values span over 10x, ``log_axis``, as costs
    and speeds on a batch sweep do: else the knee sits wherever the range is widest)."""
    F = np.column_stack([np.log(np.abs(v)) * np.sign(v) if log_axis(v) else v
                         for v in objective_matrix(front, objectives).T])
    lo, hi = F.min(axis=0), F.max(axis=0)
    Z = (F - lo) / np.where(hi > lo, hi - lo, 1.0)
    return int(np.argmin(np.sqrt((Z ** 2).sum(axis=1))))
