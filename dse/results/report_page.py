"""The files of ``dse report``: ``summary.md`` (Markdown), ``index.html`` (the summary rendered,
interactive plots drawn with the shared plotly.js of ``dse.results.pages.plotly_head``, tables,
the PNG figures beside it by name) and PNG figures at print resolution. Every metric is labelled with its
name and unit by ``dse.spec.fields.label``; the numbers come from ``dse.results.report``.
"""

from __future__ import annotations

import html
import itertools
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from dse.build.designs import kv_dtype_text
from dse.pareto import log_axis
from dse.results import pages
from dse.spec.fields import label, metric_unit, objective_label

PLOT_FONT = dict(size=13)
MAX_BREAKDOWNS = 40        # front designs (besides the knee) whose per-op breakdown is shown


TRAIN_KNEE = ("step_time_s", "mfu", "tokens_per_s_per_chip", "num_chips",
              "memory_per_chip_bytes", "hbm_used_fraction", "usd_per_trillion_tokens")


def train_job_text(space) -> str:
    """A training space's job in words (its [training] table, or the defaults)."""
    from_base = {k.split(".", 1)[1]: v for k, v in space.base.items() if k.startswith("training.")}
    swept = [p.path.split(".", 1)[1] for p in space.parameters if p.path.startswith("training.")]
    words = ", ".join(f"{k} = {_fmt(v)}" for k, v in from_base.items())
    return (words or "the default job") + (f"; swept: {', '.join(swept)}" if swept else "")


def empty(o: Path, space) -> None:
    text = (f"# {space.name}\n\nNo design is feasible and meets the constraints: the front is "
            "empty.\n")
    (o / "summary.md").write_text(text)
    (o / "index.html").write_text(pages.page(space.name, pages.markdown_html(text)))


def _fmt(v) -> str:
    if isinstance(v, (float, np.floating)):
        return f"{v:.4g}"
    return str(v)


def _ratio(x, ref) -> str:
    """x relative to ref, as 'N.NNx'."""
    x, ref = float(x), float(ref)
    return f"{x / ref:.3g}x" if ref != 0 and np.isfinite(x / ref) else "n/a"


def _val(metric: str, v) -> str:
    """A metric's value with its unit: ``0.0159 s``."""
    u = metric_unit(metric)
    return f"{_fmt(v)} {u}".strip()


def reference_text(objectives, reference: dict | None) -> str:
    """The hypervolume's reference point in words: each objective's value, and the scale."""
    if not reference:
        return "reference point not set yet"
    pt, sc = reference["point"], reference["scale"]
    parts = []
    for ob, p, s in zip(objectives, pt, sc):
        v = p if ob.direction == "minimize" else -p
        parts.append(f"{label(ob.metric)} {v:.4g} (scale {s:.4g})")
    return "reference point " + "; ".join(parts)


def summary_lines(space, st, front, k, kb, per_accel, what) -> list[str]:
    """summary.md: the headline numbers: the front's extent and trade-off, a table of
    representative front designs, the best per accelerator, the knee with what bounds it."""
    lab = partial(label, task=space.task)
    row = front.iloc[k]
    objs = space.objectives
    params = space.columns
    hv = st.get("hypervolume")
    lines = [f"# {space.name}", "", space.question or "", "",
             f"- designs scored: {st['designs_scored']:,} of a space of {space.size:,} "
             f"({st['strategy']}, state {st['state']})",
             f"- Pareto front: {len(front)} designs ({st.get('front_check', 'front.csv')})"]
    if space.task == "train":
        lines.append("- a training space: " + train_job_text(space))
    else:
        lines.append("- KV cache element type on the front: " + kv_dtype_text(
            space.kv_dtypes(front["design_id"].to_numpy(np.int64))))
    if hv is not None:
        lines.append(f"- hypervolume {hv:.4g} (objectives divided by their scale; "
                     f"{reference_text(objs, st.get('reference'))})")
    lines.append("- best of each objective on the front:")
    best = {}
    for ob in objs:
        best[ob.metric] = i = (front[ob.metric].idxmin() if ob.direction == "minimize"
                               else front[ob.metric].idxmax())
        ps = ", ".join(f"{p}={_fmt(front.loc[i, p])}" for p in params)
        lines.append(f"  - {ob.direction} {lab(ob.metric)}: **{_val(ob.metric, front.loc[i, ob.metric])}**"
                     f" ({ps})")
    if len(objs) >= 2 and len(front) > 1:
        a, b = objs[0], objs[1]
        ia, ib = best[a.metric], best[b.metric]
        la, lb = lab(a.metric), lab(b.metric)
        lines += ["", "## The trade-off", ""]
        lines.append(f"- {la} spans {_fmt(front[a.metric].min())} to "
                     f"{_fmt(front[a.metric].max())} on the front, {lb} "
                     f"{_fmt(front[b.metric].min())} to {_fmt(front[b.metric].max())}.")
        lines.append(f"- Going from the best {a.metric} design to the best {b.metric} design "
                     f"changes {a.metric} by {_ratio(front.loc[ib, a.metric], front.loc[ia, a.metric])}"
                     f" and {b.metric} by {_ratio(front.loc[ib, b.metric], front.loc[ia, b.metric])}.")
        lines.append(f"- The knee (design {int(row['design_id'])}) is at {a.metric} "
                     f"{_ratio(row[a.metric], front.loc[ia, a.metric])} of its best and {b.metric} "
                     f"{_ratio(row[b.metric], front.loc[ib, b.metric])} of its best.")
        pick = np.unique(np.linspace(0, len(front) - 1, min(8, len(front))).astype(int))
        order = front.sort_values(a.metric).iloc[pick]
        cols = [ob.metric for ob in objs] + params
        lines += ["", f"Front at a glance (sorted by {la}, {len(order)} of {len(front)}):",
                  "", "| " + " | ".join(lab(c) for c in cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(_fmt(r[c]) for c in cols) + " |" for _, r in order.iterrows()]
    if per_accel is not None and len(per_accel):
        cols = ["accelerator.id", "designs on the front"] + [ob.metric for ob in objs]
        lines += ["", "## Best per accelerator", "",
                  f"The best of each objective for each accelerator, over {what} (admissible "
                  "designs: feasible and within the constraints) and the front.", "",
                  "| " + " | ".join(lab(c) for c in cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(_fmt(r[c]) for c in cols) + " |"
                  for _, r in per_accel.iterrows()]
    lines += ["", "## Knee design (closest to the ideal point)", ""]
    lines += [f"- {lab(p)} = {_fmt(row[p])}" for p in params]
    lines += [f"- {lab(ob.metric)} = {_fmt(row[ob.metric])}" for ob in objs]
    met = kb["metrics"]
    # each metric once (num_chips and hbm_used_fraction are in both lists)
    extra = [m for m in dict.fromkeys(("ttft_s", "tpot_s", "output_tokens_per_s_per_chip",
                                       "num_chips", "hbm_used_fraction", "usd_per_mtok_input",
                                       *TRAIN_KNEE)) if m in met
             and m not in {ob.metric for ob in objs}]
    lines += [f"- {lab(m)} = {_fmt(met[m])}" for m in extra]
    if "kv_dtype" in kb:
        per_token = met.get("kv_bytes_per_token")
        lines.append(f"- KV cache: {kv_dtype_text([kb['kv_dtype']])}"
                     + (f", {per_token / 1e3:,.1f} kB per token" if per_token else ""))
    lines += [f"- {'step' if space.task == 'train' else 'decode'} bound: {kb['bound']} "
              f"({kb['bound_why']})",
              f"- design_id: {int(row['design_id'])}",
              "", "Every number above is the model's score of the named design; the per-op "
              "breakdown of the knee and of the first front designs is in index.html."]
    return lines


def png(front, bg, path: Path, x, y, color=None, knee_row=None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=pages.FIG_IN, dpi=pages.PNG_DPI)
    if len(bg):
        ax.scatter(bg[x.metric], bg[y.metric], s=5, c="#b8b8b8", alpha=0.35, linewidths=0,
                   label=f"other designs ({len(bg):,} drawn)", rasterized=True)
    colors = dict(c=front[color.metric], cmap="viridis") if color else dict(c="#d62728")
    sc = ax.scatter(front[x.metric], front[y.metric], s=30, edgecolors="black", linewidths=0.4,
                    label="Pareto front", zorder=3, **colors)
    if knee_row is not None:
        ax.scatter([knee_row[x.metric]], [knee_row[y.metric]], s=180, marker="*", c="#ff7f0e",
                   edgecolors="black", linewidths=0.6, label="knee", zorder=4)
    if color:
        cb = fig.colorbar(sc, ax=ax)
        cb.set_label(objective_label(color.metric, color.direction), size=pages.FONT_PT - 1)
    for o, setter, scale in ((x, ax.set_xlabel, ax.set_xscale), (y, ax.set_ylabel, ax.set_yscale)):
        setter(objective_label(o.metric, o.direction))
        if log_axis(pd.concat([front[o.metric], bg[o.metric]]) if len(bg) else front[o.metric]):
            scale("log")
    pages.style_axes(ax)
    ax.legend(loc="best", fontsize=pages.FONT_PT - 2)
    fig.tight_layout()
    fig.savefig(path, dpi=pages.PNG_DPI)
    pages.compact_png(path)
    plt.close(fig)


def write(o: Path, space, st, front, bg, k, bds, per_accel, what) -> None:
    objs = space.objectives
    lines = summary_lines(space, st, front, k, bds[int(front["design_id"].iloc[k])], per_accel,
                          what)
    (o / "summary.md").write_text("\n".join(lines) + "\n")
    pngs = []
    main = (objs[0], objs[1] if len(objs) > 1 else objs[0], objs[2] if len(objs) > 2 else None)
    png(front, bg, o / "front.png", *main, knee_row=front.iloc[k])
    pngs.append("front.png")
    for a, b in itertools.combinations(objs, 2) if len(objs) > 2 else ():   # two: front.png
        name = f"pair-{a.metric}-{b.metric}.png"
        png(front, bg, o / name, a, b, knee_row=front.iloc[k])
        pngs.append(name)
    _html(o, space, lines, front, bg, k, bds, pngs, per_accel)


def _main_plot(space, front, bg, k):
    lab = partial(label, task=space.task)
    import plotly.graph_objects as go
    objs = space.objectives
    hover = ["<br>".join(f"{lab(c)} = {_fmt(v)}" for c, v in row.items())
             for _, row in front.iterrows()]
    xo, yo = objs[0], objs[1] if len(objs) > 1 else objs[0]
    x, y = xo.metric, yo.metric
    co = objs[2] if len(objs) > 2 else None
    fig = go.Figure()
    if len(bg):
        fig.add_trace(go.Scattergl(x=bg[x], y=bg[y], mode="markers",
                                   name=f"other designs ({len(bg):,} drawn)",
                                   marker=dict(color="#9a9a9a", size=4, opacity=0.3),
                                   hoverinfo="skip"))
    fig.add_trace(go.Scatter(
        x=front[x], y=front[y], mode="markers", name="Pareto front", text=hover, hoverinfo="text",
        marker=dict(size=10, color=front[co.metric] if co else "#d62728", colorscale="Viridis",
                    showscale=bool(co),
                    colorbar=dict(title=dict(text=lab(co.metric), side="right")) if co else None,
                    line=dict(width=0.5, color="black"))))
    fig.add_trace(go.Scatter(x=[front[x].iloc[k]], y=[front[y].iloc[k]], mode="markers",
                             name="knee", marker=dict(size=18, symbol="star", color="#ff7f0e")))

    def axis_type(v):
        return "log" if log_axis(pd.concat([front[v], bg[v]]) if len(bg) else front[v]) else "linear"

    fig.update_layout(title=f"{lab(x)} vs {lab(y)}" + (f", colour: {lab(co.metric)}"
                                                            if co else ""),
                      xaxis_title=objective_label(x, xo.direction),
                      yaxis_title=objective_label(y, yo.direction),
                      xaxis_type=axis_type(x), yaxis_type=axis_type(y), height=580,
                      template="plotly_white", font=PLOT_FONT,
                      margin=dict(l=90, r=40, t=70, b=90),
                      legend=dict(orientation="h", y=-0.2))
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id="front-plot",
                       default_width="100%")


def _pairs_plot(objs, front):
    """Every pair of objectives once (the lower triangle; no self-pairs)."""
    import plotly.graph_objects as go
    sm = go.Figure(go.Splom(dimensions=[dict(label=label(ob.metric), values=front[ob.metric])
                                        for ob in objs], marker=dict(size=6, color="#d62728"),
                            diagonal_visible=False, showupperhalf=False))
    n = len(objs)
    sm.update_layout(title="every objective pair (front)", height=260 * n, font=dict(size=12),
                     template="plotly_white", margin=dict(l=140, r=30, t=60, b=140))
    for i in range(1, n + 1):           # the empty first column and last row are dropped
        sm.update_layout(**{f"xaxis{i}": dict(tickangle=-30, automargin=True),
                            f"yaxis{i}": dict(automargin=True)})
    return sm.to_html(full_html=False, include_plotlyjs=False, div_id="pairs",
                      default_width="100%")


def _par_plot(space, front):
    lab = partial(label, task=space.task)
    import plotly.graph_objects as go
    objs = space.objectives
    dims = []
    for p in space.parameters:
        v = front[p.column]
        if v.dtype.kind in "fiub":
            dims.append(dict(label=lab(p.column), values=v))
        else:
            codes, cats = pd.factorize(v)
            dims.append(dict(label=lab(p.column), values=codes, tickvals=list(range(len(cats))),
                             ticktext=[str(c) for c in cats]))
    dims += [dict(label=lab(ob.metric), values=front[ob.metric]) for ob in objs]
    par = go.Figure(go.Parcoords(line=dict(color=front[objs[0].metric], colorscale="Viridis"),
                                 dimensions=dims, labelangle=-20, labelfont=dict(size=12)))
    par.update_layout(title="parallel coordinates over the front", height=460,
                      margin=dict(l=60, r=60, t=110, b=40))
    return par.to_html(full_html=False, include_plotlyjs=False, div_id="parcoords",
                       default_width="100%")


def _train_details(bds) -> str:
    """The step's parts and the memory of each shown training design."""
    out = []
    for did, bd in bds.items():
        p = bd["parts"]
        rows = "".join(f"<tr><td>{k}</td><td>{p[k] * 1e3:,.1f} ms</td></tr>" for k in
                       ("compute_s", "memory_s", "overhead_s", "network_exposed_s", "bubble_s",
                        "optimizer_s") if k in p)
        rows += "".join(f"<tr><td>{k}</td><td>{p[k] / 1e9:,.2f} GB</td></tr>" for k in
                        ("weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes"))
        out.append(f"<details><summary>design {did}: step "
                   f"{bd['metrics']['step_time_s']:.4g} s, bound {bd['bound']} "
                   f"({html.escape(bd['bound_why'])})</summary><div class='tablewrap'><table>"
                   f"<tr><th>part (per step, slowest stage)</th><th>value</th></tr>{rows}"
                   "</table></div></details>")
    return "".join(out)


def _details(bds) -> str:
    if bds and "parts" in next(iter(bds.values())):
        return _train_details(bds)
    details = []
    for did, bd in bds.items():
        parts = [f"<details><summary>design {did}: decode bound {bd['bound']} "
                 f"({html.escape(bd['bound_why'])})</summary>"]
        for name, title in (("decode", "decode-only step"), ("mixed", "step carrying prompts"),
                            ("prefill", "TTFT prefill step")):
            rows, overhead, total = bd["phases"][name]
            body = "".join(f"<tr><td>{op}</td><td>{c*1e3:.3f}</td><td>{m*1e3:.3f}</td>"
                           f"<td>{n*1e3:.3f}</td><td>{t*1e3:.3f}</td><td>{b}</td>"
                           f"<td>{fl / 1e9:.4g}</td><td>{hb / 1e6:.4g}</td><td>{nb / 1e6:.4g}</td>"
                           "</tr>" for op, c, m, n, t, b, fl, hb, nb in rows)
            parts.append(f"<p>{title}: {total*1e3:.3f} ms (overhead {overhead*1e3:.3f} ms)</p>"
                         "<div class='tablewrap'><table><tr><th>op</th><th>compute [ms]</th>"
                         "<th>memory [ms]</th><th>network [ms]</th><th>time [ms]</th>"
                         "<th>bound</th><th>work [GFLOP]</th><th>HBM [MB]</th><th>network [MB]</th>"
                         f"</tr>{body}</table></div>")
        parts.append("</details>")
        details.append("".join(parts))
    return "".join(details)


def _html(o, space, lines, front, bg, k, bds, pngs, per_accel):
    lab = partial(label, task=space.task)
    objs = space.objectives
    summary = pages.markdown_html("\n".join(lines[1:]))     # the title is the page's h1
    pair_html = _pairs_plot(objs, front) if len(objs) > 2 else ""
    labels = {c: lab(c) for c in front.columns}
    accel = ""
    if per_accel is not None and len(per_accel):
        accel = ("<h2>Best per accelerator</h2>" +
                 pages.table(per_accel, {c: lab(c) for c in per_accel.columns}))
    imgs = "".join(pages.figure_file(n) for n in pngs)
    body = (f"<h1>{html.escape(space.name)}</h1><div class='summary'>{summary}</div>"
            f"{_main_plot(space, front, bg, k)}{pair_html}{_par_plot(space, front)}{accel}"
            f"<h2>Front ({len(front)} designs)</h2>{pages.table(front, labels)}"
            f"<h2>Per-design breakdown (knee and the first {MAX_BREAKDOWNS} front designs)</h2>"
            "<p>Per chip, one stage step of one micro-batch: work is the op's arithmetic (a "
            "multiply-add = 2 FLOPs), HBM the bytes its memory terms stream, network the bytes "
            f"its collectives send.</p>{_details(bds)}<h2>Figures</h2>{imgs}")
    (o / "index.html").write_text(pages.plot_page(o, space.name, body))
