"""Helpers shared by the worked training questions (``dse/questions/train_*.py``); not an
analysis itself.

A training space's designs are scored by the training model (``ctx.score`` on a space with
``task = "train"``: ``dse.scoring.train_space``); under bands, by the same model under a sample
of the training fit's and the kernel fits' parameters (``dse.scoring.train_bands``). The step
time of a design is the sum of its parts (``PARTS``: compute, HBM-bound work with the
optimizer's update, exposed communication, pipeline bubble), so what sets a number the answers give is said by
the parts that differ between the designs it compares (``terms_text``).

- selecting: ``feasible`` (fits and the layout is valid; the space's constraints met),
  ``best`` (the best feasible row by a metric), ``best_per`` (per value of a column);
- text: ``layout_text``, ``parts_row`` / ``parts_table`` (a design's step in its parts),
  ``terms_text`` (the parts that set a ratio of two designs);
- figures: ``parts_figure`` (stacked step parts per design, seconds).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse import pareto
from dse.questions.common import dress, fmt, md_table, save, subplots
from dse.spec import train_fields

# the step's parts, which sum to it (memory_s includes the optimizer's update, optimizer_s)
PARTS = {"compute_s": "compute", "memory_s": "HBM-bound work and optimizer",
         "overhead_s": "fixed per-layer time", "network_exposed_s": "exposed communication",
         "bubble_s": "pipeline bubble"}
LAYOUT = ("layout.tp", "layout.pp", "layout.dp", "layout.cp", "layout.ep",
          "layout.micro_batch_seqs", "layout.recompute", "layout.zero_stage")
_SHORT = {"layout.micro_batch_seqs": "mb", "layout.zero_stage": "zero"}


def feasible(ctx, df: pd.DataFrame, constraints=None) -> np.ndarray:
    """Rows that fit, whose layout the model takes and that meet the space's constraints (or
    ``constraints``), with finite objectives: the search's test, as a mask."""
    cons = ctx.space.constraints if constraints is None else constraints
    return np.asarray(pareto.admissible(df, ctx.space.objectives, cons), bool)


def best(df: pd.DataFrame, ok, metric: str, maximize: bool = True) -> pd.Series:
    """The ``ok`` row of ``df`` with the highest (or lowest) ``metric``."""
    sub = df[np.asarray(ok, bool)]
    if not len(sub):
        raise ValueError(f"no feasible design to pick the best {metric} from")
    return df.loc[sub[metric].idxmax() if maximize else sub[metric].idxmin()]


def best_per(df: pd.DataFrame, ok, by, metric: str, maximize: bool = True) -> pd.DataFrame:
    """Per value of ``by``, the best ``ok`` row by ``metric``, in the order of ``by``."""
    sub = df[np.asarray(ok, bool)]
    g = sub.groupby(by)[metric]
    return df.loc[(g.idxmax() if maximize else g.idxmin()).to_numpy()].reset_index(drop=True)


def layout_text(row, extra=()) -> str:
    """``tp=1 pp=8 dp=256 ep=8 mb=1 recompute=none``: the layout of a design (the columns that
    ``row`` has, parameters or the base design)."""
    parts = []
    for p in (*extra, *LAYOUT):
        if p in row.index:
            v = row[p]
            name = _SHORT.get(p, p.split(".")[-1])
            parts.append(f"{name}={v if isinstance(v, str) else fmt(v)}")
    return " ".join(parts)


def with_layout(ctx, df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with the layout's fixed values (the base design's, else the field's default) as
    columns (``layout_text`` shows them), and dp = chips / (tp x pp x cp) where the space fixes the chips."""
    out = df.copy()
    for p in LAYOUT:
        if p not in out and p != "layout.dp":
            out[p] = ctx.space.base.get(p, train_fields.REGISTRY[p].default)
    if "layout.dp" not in out:
        out["layout.dp"] = (out["num_chips"] / (out["layout.tp"] * out["layout.pp"]
                                                * out["layout.cp"])).round()
    return out


def parts_row(row) -> dict:
    """A design's step in seconds: its parts and the step."""
    return {**{k: float(row[k]) for k in PARTS}, "step_time_s": float(row["step_time_s"])}


def parts_table(rows: list, labels: list[str]) -> str:
    """The step of each design in its parts (seconds), as a Markdown table."""
    heads = ["design", *[f"{v} [s]" for v in PARTS.values()], "step [s]", "tokens/s per chip",
             "MFU", "memory per chip [GB]"]
    body = [[lab, *[float(r[k]) for k in PARTS], float(r["step_time_s"]),
             float(r["tokens_per_s_per_chip"]), float(r["mfu"]),
             float(r["memory_per_chip_bytes"]) / 1e9] for lab, r in zip(labels, rows)]
    return md_table(heads, body)


def terms_text(a, b, a_name: str, b_name: str) -> str:
    """Which parts of the step set the ratio of design ``b``'s step to ``a``'s (per token):
    the parts that differ, largest first, with their seconds in each."""
    steps = (float(a["step_time_s"]), float(b["step_time_s"]))
    diffs = sorted(((float(b[k]) - float(a[k]), k) for k in PARTS), key=lambda x: -abs(x[0]))
    total = steps[1] - steps[0]
    said = []
    for d, k in diffs:
        if abs(d) < 0.02 * max(abs(total), 1e-3 * steps[0]):
            continue
        said.append(f"{PARTS[k]} {fmt(float(a[k]))} s ({a_name}) vs {fmt(float(b[k]))} s "
                    f"({b_name})")
    if not said:
        return "no part of the step differs by more than 2% of the difference"
    return "; ".join(said[:3])


def parts_figure(ctx, rows: list, labels: list[str], name: str, title: str,
                 per_token: bool = False) -> str:
    """Stacked bars of each design's step in its parts (seconds per step, or microseconds per
    token per chip); returns the file name."""
    fig, ax = subplots(figsize=(max(6.0, 1.4 * len(rows) + 2), 4.5))
    x = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    for k, words in PARTS.items():
        v = np.array([float(r[k]) for r in rows])
        if per_token:
            v = v / np.array([float(r["step_time_s"]) * float(r["tokens_per_s_per_chip"])
                              for r in rows]) * 1e6
        ax.bar(x, v, 0.6, bottom=bottom, label=words)
        bottom += v
    ax.set_xticks(x, labels, fontsize=8)
    dress(ax, "design", "microseconds per token per chip [us]" if per_token else
          "time per optimizer step [s]", title, grid="y", legend=8)
    return save(fig, ctx, name)
