"""``dse report DIR``: the Pareto report of a run.

Writes ``OUT/index.html`` (self-contained: interactive plots with plotly.js inlined, opens
offline), ``OUT/front.csv``, ``OUT/summary.md`` and PNG figures. Every number comes from the
run's stored scores or from re-scoring its front designs with the same model (the per-op
breakdown and the bound of each phase).
"""

from __future__ import annotations

import html
import itertools
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from dse import pareto, runs
from dse.errors import InputError
from dse.fields import label
from dse.perf import BOUNDS, OPS, score
from dse.space import load_space

MAX_BREAKDOWNS = 40


def knee(front: pd.DataFrame, objectives) -> int:
    """Row of the front closest to the ideal point, objectives scaled to [0, 1] on the front
    (on a log scale for an objective whose front values are positive and span over 10x, as
    costs and speeds on a batch sweep do: else the knee sits wherever the range is widest)."""
    F = np.column_stack([np.log(np.abs(v)) * np.sign(v) if _log_axis(v) else v
                         for v in pareto.objective_matrix(front, objectives).T])
    lo, hi = F.min(axis=0), F.max(axis=0)
    Z = (F - lo) / np.where(hi > lo, hi - lo, 1.0)
    return int(np.argmin(np.sqrt((Z ** 2).sum(axis=1))))


def _log_axis(v: np.ndarray) -> bool:
    a = np.abs(v)
    return bool(len(v) and (np.all(v > 0) or np.all(v < 0)) and a.max() / a.min() > 10)


def _breakdowns(space, ids: np.ndarray) -> list[dict]:
    b, _ = space.batch(ids)
    m, steps = score(b.expanded(), breakdown=True)
    out = []
    for i in range(len(ids)):
        phases = {}
        for name in ("decode", "mixed", "prefill"):
            st = getattr(steps, name)
            rows = []
            for j, op in enumerate(OPS):
                c, mem, net, t = (float(a[j, i]) for a in (st.compute_s, st.memory_s, st.network_s,
                                                             st.op_s))
                if t > 0:
                    rows.append((op, c, mem, net, t, ("compute", "memory", "network")[
                        int(np.argmax([c, mem, net]))]))
            phases[name] = (rows, float(st.overhead_s[i]), float(st.total_s[i]))
        out.append({"phases": phases, "bound": BOUNDS[
            int(m["bound"][i])], "metrics": {k: float(v[i]) for k, v in m.items()
                                             if v.dtype.kind == "f"}})
    return out


def _png(front, allpts, objectives, path: Path, x, y, color=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 5), dpi=110)
    if len(allpts):
        ax.scatter(allpts[x.metric], allpts[y.metric], s=6, c="#cccccc", label="scored designs")
    colors = dict(c=front[color.metric], cmap="viridis") if color else dict(c="#d62728")
    sc = ax.scatter(front[x.metric], front[y.metric], s=28, edgecolors="black", linewidths=0.4,
                    label="Pareto front", **colors)
    if color:
        fig.colorbar(sc, ax=ax, label=f"{color.metric} ({color.direction})")
    for o, setter in ((x, ax.set_xlabel), (y, ax.set_ylabel)):
        setter(f"{o.metric} ({o.direction})")
        if (front[o.metric] > 0).all() and front[o.metric].max() / front[o.metric].min() > 50:
            (ax.set_xscale if o is x else ax.set_yscale)("log")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _front(d: Path, m: dict, space) -> tuple[pd.DataFrame, str]:
    """The front the report shows and how it was checked. A local run's front is computed from
    its score tables and front.csv is verified against it (rewritten when it disagrees: a
    truncated or stale file); a shared run's front.csv was assembled from the storage."""
    front_csv = d / "front.csv"
    if m.get("storage"):
        if not front_csv.is_file() or runs.read_front(d) is None:
            raise InputError("the run has no readable front.csv", file=str(front_csv),
                             hint="`dse run --resume` rebuilds it from the shared storage")
        return space.legacy(runs.read_front(d)), "front.csv as assembled from the shared storage"
    n = len(list((d / "scores").glob("*.parquet")))
    if n == 0:
        raise InputError("the run has no score tables yet", file=str(d), hint="run or resume it first")
    fr = space.legacy(runs.front_from_tables(d, m))
    params = space.columns
    old = runs.read_front(d)
    old = space.legacy(old) if old is not None else None
    have = set(old["design_id"].astype(np.int64)) if old is not None else None
    want = set(fr["design_id"].astype(np.int64)) if len(fr) else set()
    if have == want:
        return old, f"computed from the run's {n} score tables; front.csv verified against them"
    else:
        what = ("unreadable" if old is None else
                f"{len(have & want)} of the {len(want)} front designs and {len(have - want)} others")
        print(f"dse: warning: {front_csv} was wrong ({what}): rebuilt from the score tables",
              file=sys.stderr)
        if runs._lock_owner(d) is None:
            runs.write_front(d, fr, m["objectives"], params)
        check = (f"computed from the run's {n} score tables; front.csv disagreed ({what}) "
                 "and was rebuilt")
    cols = list(dict.fromkeys([o.metric for o in space.objectives] + params)) + ["design_id"]
    return (fr[cols] if len(fr) else pd.DataFrame(columns=cols)).reset_index(drop=True), check


def make_report(run_dir: str, out: str | None = None) -> Path:
    d = Path(run_dir)
    m = runs.load_manifest(d)
    snapshot = runs.space_snapshot(d, m)
    space = load_space(str(snapshot if snapshot.is_file() else m["space_file"]))
    front, check = _front(d, m, space)
    o = Path(out) if out else d / "report"
    o.mkdir(parents=True, exist_ok=True)
    runs.write_front(o, front, space.objectives, space.columns)
    files = sorted((d / "scores").glob("*.parquet"))
    allpts = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True) if files else \
        pd.DataFrame()
    allpts = space.legacy(allpts)
    if "_admissible" in allpts:
        allpts = allpts[allpts["_admissible"]]
    objs = space.objectives
    st = {**runs.status(d), "front_check": check}
    if len(front) == 0:
        (o / "summary.md").write_text(f"# {space.name}\n\nNo design is feasible and meets the "
                                      "constraints: the front is empty.\n")
        (o / "index.html").write_text(f"<html><body><h1>{html.escape(space.name)}</h1><p>The front"
                                      " is empty: no design is feasible and meets the constraints."
                                      "</p></body></html>")
        return o
    ids = front["design_id"].to_numpy(dtype=np.int64)
    k = knee(front, objs)
    # figures
    pngs = []
    main = (objs[0], objs[1] if len(objs) > 1 else objs[0], objs[2] if len(objs) > 2 else None)
    _png(front, allpts, objs, o / "front.png", *main)
    pngs.append("front.png")
    for a, b in itertools.combinations(objs, 2):
        name = f"pair-{a.metric}-{b.metric}.png"
        _png(front, allpts, objs, o / name, a, b)
        pngs.append(name)
    # re-score the front designs for their per-op breakdown
    shown = np.unique(np.r_[ids[k], ids[:MAX_BREAKDOWNS]])
    bds = dict(zip(shown.tolist(), _breakdowns(space, shown)))
    _summary(o, space, st, front, k, bds[int(ids[k])])
    _html(o, space, st, front, allpts, k, bds, pngs)
    return o


def _fmt(v) -> str:
    if isinstance(v, (float, np.floating)):
        return f"{v:.4g}"
    return str(v)


def _summary(o, space, st, front, k, kb):
    """summary.md: the headline numbers: the front's extent and trade-off, a table of
    representative front designs, the knee with what bounds it."""
    row = front.iloc[k]
    objs = space.objectives
    params = space.columns
    lines = [f"# {space.name}", "", space.question or "", "",
             f"- designs scored: {st['designs_scored']:,} of a space of {space.size:,} "
             f"({st['strategy']}, state {st['state']})",
             f"- Pareto front: {len(front)} designs ({st.get('front_check', 'front.csv')})",
             "- best of each objective on the front:"]
    best = {}
    for ob in objs:
        best[ob.metric] = i = (front[ob.metric].idxmin() if ob.direction == "minimize"
                               else front[ob.metric].idxmax())
        ps = ", ".join(f"{p}={_fmt(front.loc[i, p])}" for p in params)
        lines.append(f"  - {ob.direction} {ob.metric}: {_fmt(front.loc[i, ob.metric])} ({ps})")
    if len(objs) >= 2 and len(front) > 1:
        a, b = objs[0], objs[1]
        ia, ib = best[a.metric], best[b.metric]
        lines += ["", "## The trade-off", ""]
        lines.append(f"- {a.metric} spans {_fmt(front[a.metric].min())} to "
                     f"{_fmt(front[a.metric].max())} on the front, {b.metric} "
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
        lines += ["", f"Front at a glance (sorted by {a.metric}, {len(order)} of {len(front)}):",
                  "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(_fmt(r[c]) for c in cols) + " |" for _, r in order.iterrows()]
    lines += ["", "## Knee design (closest to the ideal point)", ""]
    lines += [f"- {p} = {_fmt(row[p])}" for p in params]
    lines += [f"- {ob.metric} = {_fmt(row[ob.metric])}" for ob in objs]
    met = kb["metrics"]
    extra = [m for m in ("ttft_s", "tpot_s", "output_tokens_per_s_per_chip", "num_chips",
                         "hbm_used_fraction", "usd_per_mtok_input") if m in met
             and m not in {ob.metric for ob in objs}]
    lines += [f"- {m} = {_fmt(met[m])}" for m in extra]
    lines += [f"- decode bound: {kb['bound']}", f"- design_id: {int(row['design_id'])}",
              "", "Every number above is the model's score of the named design; the per-op "
              "breakdown of the knee and of the first front designs is in index.html."]
    (o / "summary.md").write_text("\n".join(lines) + "\n")


def _ratio(x, ref) -> str:
    """x relative to ref, as 'N.NNx'."""
    x, ref = float(x), float(ref)
    return f"{x / ref:.3g}x" if ref != 0 and np.isfinite(x / ref) else "n/a"


def _html(o, space, st, front, allpts, k, bds, pngs):
    import plotly.graph_objects as go
    objs = space.objectives
    hover = ["<br>".join(f"{c} = {_fmt(v)}" for c, v in row.items()) for _, row in front.iterrows()]
    x, y = objs[0].metric, (objs[1] if len(objs) > 1 else objs[0]).metric
    color = objs[2].metric if len(objs) > 2 else None
    fig = go.Figure()
    if len(allpts):
        bg = allpts.sample(20_000, random_state=0) if len(allpts) > 20_000 else allpts
        fig.add_trace(go.Scatter(x=bg[x], y=bg[y], mode="markers", name="scored designs",
                                   marker=dict(color="#cccccc", size=4), hoverinfo="skip"))
    fig.add_trace(go.Scatter(
        x=front[x], y=front[y], mode="markers", name="Pareto front", text=hover, hoverinfo="text",
        marker=dict(size=10, color=front[color] if color else "#d62728", colorscale="Viridis",
                    showscale=bool(color), colorbar=dict(title=color) if color else None,
                    line=dict(width=0.5, color="black"))))
    fig.add_trace(go.Scatter(x=[front[x].iloc[k]], y=[front[y].iloc[k]], mode="markers",
                             name="knee", marker=dict(size=18, symbol="star", color="#ff7f0e")))
    def axis_type(v):
        v = front[v]
        return "log" if (v > 0).all() and v.max() / v.min() > 50 else "linear"

    fig.update_layout(title=f"{space.name}: {x} vs {y}", xaxis_title=x, yaxis_title=y,
                      xaxis_type=axis_type(x), yaxis_type=axis_type(y), height=560,
                      template="plotly_white", legend=dict(orientation="h", y=-0.18))
    main = fig.to_html(full_html=False, include_plotlyjs="inline", div_id="front-plot")
    dims = []
    for p in space.parameters:
        v = front[p.column]
        if v.dtype.kind in "fiub":
            dims.append(dict(label=label(p.column), values=v))
        else:
            codes, cats = pd.factorize(v)
            dims.append(dict(label=label(p.column), values=codes, tickvals=list(range(len(cats))),
                             ticktext=[str(c) for c in cats]))
    dims += [dict(label=ob.metric, values=front[ob.metric]) for ob in objs]
    par = go.Figure(go.Parcoords(line=dict(color=front[objs[0].metric], colorscale="Viridis"),
                                 dimensions=dims))
    par.update_layout(title="parallel coordinates over the front", height=420)
    par_html = par.to_html(full_html=False, include_plotlyjs=False, div_id="parcoords")
    pair_html = ""
    if len(objs) > 2:
        sm = go.Figure(go.Splom(dimensions=[dict(label=ob.metric, values=front[ob.metric])
                                            for ob in objs], marker=dict(size=6)))
        sm.update_layout(title="every objective pair (front)", height=600)
        pair_html = sm.to_html(full_html=False, include_plotlyjs=False, div_id="pairs")
    table = front.to_html(index=False, float_format=lambda v: f"{v:.4g}", classes="front",
                          border=0)
    details = []
    for did, bd in bds.items():
        parts = [f"<details><summary>design {did}: decode bound {bd['bound']}</summary>"]
        for name, title in (("decode", "decode-only step"), ("mixed", "step carrying prompts"),
                            ("prefill", "TTFT prefill step")):
            rows, overhead, total = bd["phases"][name]
            body = "".join(f"<tr><td>{op}</td><td>{c*1e3:.3f}</td><td>{m*1e3:.3f}</td>"
                           f"<td>{n*1e3:.3f}</td><td>{t*1e3:.3f}</td><td>{b}</td></tr>"
                           for op, c, m, n, t, b in rows)
            parts.append(f"<p>{title}: {total*1e3:.3f} ms (overhead {overhead*1e3:.3f} ms)</p>"
                         "<table><tr><th>op</th><th>compute ms</th><th>memory ms</th>"
                         f"<th>network ms</th><th>time ms</th><th>bound</th></tr>{body}</table>")
        parts.append("</details>")
        details.append("".join(parts))
    import base64
    imgs = "".join(f'<img alt="{n}" src="data:image/png;base64,'
                   f'{base64.b64encode((o / n).read_bytes()).decode()}" width="560">' for n in pngs)
    summary = html.escape((o / "summary.md").read_text())
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(space.name)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}} table{{border-collapse:collapse;
font-size:12px}} td,th{{padding:2px 6px;border-bottom:1px solid #ddd;text-align:right}}
pre{{background:#f6f6f6;padding:1em;white-space:pre-wrap}}</style></head><body>
<h1>{html.escape(space.name)}</h1><p>{html.escape(space.question or '')}</p>
<pre>{summary}</pre>
{main}{pair_html}{par_html}
<h2>Front ({len(front)} designs)</h2>{table}
<h2>Per-design breakdown (knee and the first {MAX_BREAKDOWNS} front designs)</h2>{''.join(details)}
<h2>Figures</h2>{imgs}
</body></html>"""
    (o / "index.html").write_text(page)
