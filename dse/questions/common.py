"""Helpers shared by the worked questions (``dse/questions/*.py``); not an analysis itself.

Every analysis has the same shape, and its ``answer(ctx)`` reads as it: it takes the
``[answer]`` parameters, selects the designs its question turns on (the admissible designs of
the space, the best one per value of something, designs re-scored under overrides or at other
parameter values), and returns an ``Answer`` assembled by small named steps of its module:
``_numbers`` (the headline figures, JSON-able), ``_headline`` (them in words), ``_details``
(method and tables), ``_figure`` (each figure) and ``_lead`` (the numbers the first lines give).
What an analysis selects is handed to its steps in a ``Picks`` (by name) where it is more than
a frame or two. What several analyses repeat lives here:

- selecting designs: ``admissible`` (the search's test, as a mask), ``admissible_designs`` (the
  space scored and kept to those), ``best_per`` (the best design per value of a column),
  ``param_values`` (the parameter values of rows, for ``ctx.score(values=...)``),
  ``layout_curve`` (one design's layout over every batch);
- the per-op breakdown of a step: ``op_times``;
- text: ``fmt`` (a number), ``describe`` (a design with its id), ``layout_text`` (layout and
  batch), ``layout_pairs`` (``tp=1, dp=16``), ``slo_text`` (the space's constraints),
  ``limits_text`` (its upper limits), ``space_text`` (its size and parameters), ``md_table``
  (headers + rows) and ``md_frame`` (a DataFrame) as Markdown tables, ``in_units`` (a table's
  columns in the units it shows);
- figures: ``pyplot`` (matplotlib with the Agg backend), ``subplots``, ``dress`` (an axes'
  scales, labels, grid and legend as the questions draw them) and ``save``.

Helpers used by one analysis only stay in its module.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd

from dse import pareto
from dse.perf import OPS, score
from dse.questions.context import Context
from dse.results.pages import PNG_DPI, compact_png

BATCH = "workload.concurrency"
_SHORT = {"layout.tp": "tp", "layout.pp": "pp", "layout.dp": "dp", "layout.ep": "ep",
          BATCH: "batch", "serving.spec_tokens": "draft tokens"}


class Picks(SimpleNamespace):
    """What an analysis selected and computed, by name (``s.base``, ``s.fast``, ``s.df``...):
    its ``answer`` fills it, its steps (``_numbers(s)``, ``_headline(s)``, ``_details(ctx, s)``,
    ``_figure(ctx, s)``) read it."""


# ---------------------------------------------------------------- selecting designs

def admissible(ctx: Context, df: pd.DataFrame) -> np.ndarray:
    """Which designs of ``df`` are feasible, meet the space's constraints and have finite
    objectives (the same test as the search): a boolean mask aligned with ``df``."""
    return pareto.admissible(df, ctx.space.objectives, ctx.space.constraints)


def admissible_designs(ctx: Context, df: pd.DataFrame | None = None) -> pd.DataFrame:
    """The admissible designs of ``df`` (default: every design of the space, ``ctx.score()``),
    re-indexed from 0."""
    df = ctx.score() if df is None else df
    return df[admissible(ctx, df)].reset_index(drop=True)


def best_per(df: pd.DataFrame, by, metric: str, ok=None, minimize: bool = True) -> pd.DataFrame:
    """Per value of ``by`` (a column or a list of them), the row of ``df`` with the lowest (or
    highest) ``metric`` among the ``ok`` rows (a mask, all rows by default), in the order of
    ``by``, re-indexed from 0."""
    sub = df if ok is None else df[ok]
    g = sub.groupby(by)[metric]
    return df.loc[(g.idxmin() if minimize else g.idxmax()).to_numpy()].reset_index(drop=True)


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


def layout_pairs(row, paths) -> str:
    """``tp=1, dp=16, ep=16``: the values of ``paths`` (dotted) in one design."""
    return ", ".join(f"{k.split('.')[1]}={int(row[k])}" for k in paths)


def slo_text(ctx: Context) -> str:
    """The space's constraints as ``tpot_s <= 0.05 and ...`` (``no SLO`` when there are none)."""
    parts = []
    for c in ctx.space.constraints:
        if c.max is not None:
            parts.append(f"{c.metric} <= {c.max:g}")
        if c.min is not None:
            parts.append(f"{c.metric} >= {c.min:g}")
    return " and ".join(parts) or "no SLO"


def limits_text(ctx: Context, none: str = "") -> str:
    """The space's upper limits as ``tpot_s <= 0.05, ttft_s <= 2`` (``none`` when it has none)."""
    return ", ".join(f"{c.metric} <= {c.max:g}" for c in ctx.space.constraints
                     if c.max is not None) or none


def space_text(ctx: Context) -> str:
    """``3,000 designs (layout.tp, workload.concurrency)``: the space's size and parameters."""
    return f"{ctx.space.size:,} designs ({', '.join(p.path for p in ctx.space.parameters)})"


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


def in_units(df: pd.DataFrame, units: dict) -> pd.DataFrame:
    """A copy of ``df`` with columns in the units a table shows them in: ``units`` maps a column
    to (its new name, the factor it is multiplied by, a function of the column, or None to
    rename it only)."""
    out = df.copy()
    for col, (_, scale) in units.items():
        if scale is not None:
            out[col] = scale(out[col]) if callable(scale) else out[col] * scale
    return out.rename(columns={col: name for col, (name, _) in units.items()})


# ---------------------------------------------------------------- figures

def pyplot():
    """``matplotlib.pyplot`` with the non-interactive Agg backend."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def subplots(*args, **kw):
    """A new figure and its axes: ``matplotlib.pyplot.subplots`` with the Agg backend."""
    return pyplot().subplots(*args, **kw)


_GRID = {"both": {"which": "both"}, "major": {}, "y": {"axis": "y"}}


def dress(ax, xlabel: str | None = None, ylabel: str | None = None, title: str | None = None, *,
          xlog: float | None = None, ylog: float | None = None, grid: str = "both",
          legend=8, title_size: float | None = None) -> None:
    """An axes the way the worked questions draw them: log scales of base ``xlog``/``ylog``
    (None: linear), labels, title (of ``title_size`` points), a light grid (``both``: major and
    minor lines, ``major``, or ``y``: horizontal only) and a legend of ``legend`` points (a dict:
    the legend's arguments; None: no legend). Call it after drawing (the legend collects what
    is drawn), before a tick formatter (a scale resets it)."""
    if xlog:
        ax.set_xscale("log", base=xlog)
    if ylog:
        ax.set_yscale("log", base=ylog)
    if xlabel is not None:
        ax.set_xlabel(xlabel)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title, **({} if title_size is None else {"fontsize": title_size}))
    ax.grid(alpha=0.3, **_GRID[grid])
    if legend is not None:
        ax.legend(**(legend if isinstance(legend, dict) else {"fontsize": legend}))


def save(fig, ctx: Context, name: str) -> str:
    """Lay out ``fig``, write it to ``ctx.figure_path(name)``, close it; returns ``name``."""
    ctx.out.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(ctx.figure_path(name), dpi=PNG_DPI)
    compact_png(ctx.figure_path(name))
    pyplot().close(fig)
    return name
