"""Helpers shared by the worked questions (``dse/questions/*.py``); not an analysis itself.

- selecting designs: ``admissible`` (the search's test, as a mask), ``param_values`` (the
  parameter values of rows, for ``ctx.score(values=...)``), ``layout_curve`` (one design's
  layout over every batch);
- the per-op breakdown of a step: ``op_times``;
- text: ``fmt`` (a number), ``describe`` (a design with its id), ``layout_text`` (layout and
  batch), ``slo_text`` (the space's constraints), ``md_table`` (headers + rows) and
  ``md_frame`` (a DataFrame) as Markdown tables;
- figures: ``pyplot`` (matplotlib with the Agg backend) and ``save``.

Helpers used by one analysis only stay in its module.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse import pareto
from dse.perf import OPS, score
from dse.questions.context import Context
from dse.results.pages import PNG_DPI

BATCH = "workload.concurrency"
_SHORT = {"layout.tp": "tp", "layout.pp": "pp", "layout.dp": "dp", "layout.ep": "ep",
          BATCH: "batch", "serving.spec_tokens": "draft tokens"}


# ---------------------------------------------------------------- selecting designs

def admissible(ctx: Context, df: pd.DataFrame) -> np.ndarray:
    """Which designs of ``df`` are feasible, meet the space's constraints and have finite
    objectives (the same test as the search): a boolean mask aligned with ``df``."""
    return pareto.admissible(df, ctx.space.objectives, ctx.space.constraints)


def param_values(ctx: Context, rows: pd.DataFrame) -> dict:
    """The parameter values of ``rows`` (as ``ctx.score(values=...)`` takes them)."""
    return {p.path: rows[p.path].to_numpy() for p in ctx.space.parameters}


def layout_curve(df: pd.DataFrame, row, layout=("layout.tp", "layout.dp", "layout.ep")) \
        -> pd.DataFrame:
    """The designs of ``df`` with ``row``'s model and ``layout`` (the columns present), over
    every batch."""
    same = np.ones(len(df), bool)
    for c in ("model.id", *layout):
        if c in df:
            same &= (df[c] == row[c]).to_numpy()
    return df[same].sort_values(BATCH).reset_index(drop=True)


# ---------------------------------------------------------------- per-op breakdown

def op_times(ctx: Context, values: dict, step: str = "decode", overrides: dict | None = None) \
        -> pd.DataFrame:
    """Per-op times of one step (``decode``, ``mixed`` or ``prefill``) of the designs given by
    parameter ``values``: columns ``<op>_compute_s``, ``<op>_memory_s``, ``<op>_network_s``,
    ``<op>_s`` for every op, ``overhead_s`` and ``total_s`` (one stage step)."""
    b = ctx.batch(values, overrides)      # under the context's parameter sample, if any
    _, steps = score(b.expanded(), breakdown=True)
    st = getattr(steps, step)
    out = {}
    for j, op in enumerate(OPS):
        out[f"{op}_compute_s"] = st.compute_s[j]
        out[f"{op}_memory_s"] = st.memory_s[j]
        out[f"{op}_network_s"] = st.network_s[j]
        out[f"{op}_s"] = st.op_s[j]
    out["overhead_s"] = st.overhead_s
    out["total_s"] = st.total_s
    return pd.DataFrame({k: np.asarray(v, dtype=float) for k, v in out.items()})


# ---------------------------------------------------------------- text

def fmt(v, digits: int = 3) -> str:
    """A number with ``digits`` significant digits, thousands separated when large."""
    if isinstance(v, (str, bool, np.bool_)):
        return str(v)
    v = float(v)
    if not np.isfinite(v):
        return str(v)
    if abs(v) >= 10 ** digits:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}"


def describe(row, extra: tuple = ()) -> str:
    """``design 985: model=..., tp=1, dp=16, ep=16, batch=8192`` from the parameter columns present."""
    parts = []
    for col in row.index:
        if col in _SHORT:
            parts.append(f"{_SHORT[col]}={int(row[col])}")
        elif col in ("model.id", "accelerator.id", "topology.id"):
            parts.append(f"{col.split('.')[0]}={row[col]}")
    parts += [f"{c}={fmt(row[c])}" for c in extra]
    return f"design {int(row['design_id'])} ({', '.join(parts)})"


def layout_text(row, paths=("layout.tp", "layout.pp", "layout.dp", "layout.ep")) -> str:
    """``tp=4 pp=1 batch=81``: the layout and batch of one design (paths present in ``row``)."""
    parts = [f"{p.split('.')[-1]}={int(row[p])}" for p in paths if p in row.index]
    return " ".join(parts + [f"batch={int(row[BATCH])}"])


def slo_text(ctx: Context) -> str:
    """The space's constraints as ``tpot_s <= 0.05 and ...`` (``no SLO`` when there are none)."""
    parts = []
    for c in ctx.space.constraints:
        if c.max is not None:
            parts.append(f"{c.metric} <= {c.max:g}")
        if c.min is not None:
            parts.append(f"{c.metric} >= {c.min:g}")
    return " and ".join(parts) or "no SLO"


def _markdown(headers, rows, cell) -> str:
    out = ["| " + " | ".join(map(str, headers)) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(out)


def md_table(headers: list[str], rows: list[list]) -> str:
    """A Markdown table from headers and rows; strings as they are, numbers through ``fmt``
    (3 significant digits, thousands separated)."""
    return _markdown(headers, rows, lambda v: v if isinstance(v, str) else fmt(v))


def md_frame(df: pd.DataFrame, digits: int = 4) -> str:
    """A DataFrame as a Markdown table: floats to ``digits`` significant figures (NaN empty),
    everything else as ``str``."""
    def cell(v):
        if isinstance(v, (float, np.floating)):
            return "" if np.isnan(v) else f"{v:.{digits}g}"
        return str(v)
    return _markdown(df.columns, df.itertuples(index=False), cell)


# ---------------------------------------------------------------- figures

def pyplot():
    """``matplotlib.pyplot`` with the non-interactive Agg backend."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(fig, ctx: Context, name: str) -> str:
    """Lay out ``fig``, write it to ``ctx.figure_path(name)``, close it; returns ``name``."""
    ctx.out.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(ctx.figure_path(name), dpi=PNG_DPI)
    pyplot().close(fig)
    return name
