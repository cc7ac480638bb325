"""``dse compare DIR_A DIR_B``: two runs' fronts on one reference point.

Hypervolume of each (same reference point and scale), coverage each way (the share of one
front that the other weakly dominates), the union front with the run each design came from,
the best of each objective, the designs that appeared or vanished, and overlaid plots.
"""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import pandas as pd

from dse import pareto, runs
from dse.errors import InputError
from dse.space import Objective


def coverage(A: np.ndarray, B: np.ndarray) -> float:
    """Share of B's points weakly dominated by some point of A (minimisation)."""
    if len(B) == 0:
        return 0.0
    if len(A) == 0:
        return 0.0
    dom = (A[:, None, :] <= B[None, :, :]).all(axis=2).any(axis=0)
    return float(dom.mean())


def _load(d: Path):
    m = runs.load_manifest(d)
    f = d / "front.csv"
    if not f.is_file():
        raise InputError("the run has no front.csv yet", file=str(d), hint="run or resume it first")
    objs = tuple(Objective(o["name"], o["direction"]) for o in m["objectives"])
    return m, objs, pd.read_csv(f)


def _signature(front: pd.DataFrame, params: list[str]) -> list[str]:
    return ["; ".join(f"{p}={row[p]}" for p in params) for _, row in front.iterrows()]


def make_compare(dir_a: str, dir_b: str, out: str | None = None) -> Path:
    da, db = Path(dir_a), Path(dir_b)
    ma, oa, fa = _load(da)
    mb, ob, fb = _load(db)
    if [(o.metric, o.direction) for o in oa] != [(o.metric, o.direction) for o in ob]:
        raise InputError("the runs optimise different objectives", file=str(db),
                         hint="compare runs whose objectives (and directions) are the same")
    objs = oa
    o = Path(out) if out else Path("runs") / f"compare-{da.name}-vs-{db.name}"
    o.mkdir(parents=True, exist_ok=True)
    Fa, Fb = pareto.objective_matrix(fa, objs), pareto.objective_matrix(fb, objs)
    both = np.vstack([Fa, Fb]) if len(Fa) + len(Fb) else np.zeros((0, len(objs)))
    ref, scale = pareto.reference(both) if len(both) else (np.zeros(len(objs)), np.ones(len(objs)))
    hv_a, hv_b = pareto.hypervolume(Fa, ref, scale), pareto.hypervolume(Fb, ref, scale)
    params = [c for c in fa.columns if c in fb.columns and c not in {x.metric for x in objs}
              and c != "design_id"]
    ua = fa.assign(run="A", signature=_signature(fa, params))
    ub = fb.assign(run="B", signature=_signature(fb, params))
    union = pareto.front_of([ua.drop(columns="design_id"), ub.drop(columns="design_id")], objs) \
        if len(ua) + len(ub) else pd.DataFrame()
    cols = [x.metric for x in objs] + params + ["run"]
    union_out = union[cols] if len(union) else pd.DataFrame(columns=cols)
    union_out.to_csv(o / "union_front.csv", index=False)
    sa, sb = set(ua["signature"]), set(ub["signature"])
    lines = [f"# {da.name} (A) vs {db.name} (B)", "",
             f"Reference point (minimisation form) {np.round(ref, 6).tolist()}, scale "
             f"{np.round(scale, 6).tolist()}: the same for both runs.", "",
             "| | A | B |", "|---|---|---|",
             f"| front size | {len(fa)} | {len(fb)} |",
             f"| hypervolume | {hv_a:.6g} | {hv_b:.6g} |",
             f"| coverage of the other front (share it weakly dominates) | {coverage(Fa, Fb):.3f} "
             f"| {coverage(Fb, Fa):.3f} |",
             f"| designs in the union front | {(union_out['run'] == 'A').sum()} | "
             f"{(union_out['run'] == 'B').sum()} |", "", "Best of each objective:", ""]
    for x in objs:
        pick = (lambda f: f[x.metric].min()) if x.direction == "minimize" else (lambda f: f[x.metric].max())
        lines.append(f"- {x.direction} {x.metric}: A {pick(fa):.6g}, B {pick(fb):.6g}")
    lines += ["", f"Designs on B's front but not A's (appeared): {len(sb - sa)}",
              *[f"- {s}" for s in sorted(sb - sa)[:30]], "",
              f"Designs on A's front but not B's (vanished): {len(sa - sb)}",
              *[f"- {s}" for s in sorted(sa - sb)[:30]]]
    (o / "compare.md").write_text("\n".join(lines) + "\n")
    _plots(o, objs, fa, fb, union_out, lines)
    return o


def _plots(o: Path, objs, fa, fb, union, lines):
    import plotly.graph_objects as go
    x, y = objs[0].metric, (objs[1] if len(objs) > 1 else objs[0]).metric
    fig = go.Figure()
    for name, f, color in (("A", fa, "#1f77b4"), ("B", fb, "#d62728")):
        fig.add_trace(go.Scatter(x=f[x], y=f[y], mode="markers", name=f"front {name}",
                                 marker=dict(size=9, color=color, opacity=0.7)))
    fig.add_trace(go.Scatter(x=union[x], y=union[y], mode="markers", name="union front",
                             marker=dict(size=15, symbol="circle-open", color="black")))
    fig.update_layout(title=f"{x} vs {y}", xaxis_title=x, yaxis_title=y, height=560,
                      template="plotly_white")
    body = fig.to_html(full_html=False, include_plotlyjs="inline")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    f, ax = plt.subplots(figsize=(7, 5), dpi=110)
    ax.scatter(fa[x], fa[y], label="A", alpha=0.7)
    ax.scatter(fb[x], fb[y], label="B", alpha=0.7)
    ax.scatter(union[x], union[y], facecolors="none", edgecolors="black", s=80, label="union front")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.legend()
    ax.grid(alpha=0.3)
    f.tight_layout()
    f.savefig(o / "fronts.png")
    plt.close(f)
    md = html.escape("\n".join(lines))
    (o / "index.html").write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>compare"
                                  f"</title></head><body style='font-family:sans-serif'><pre>{md}"
                                  f"</pre>{body}</body></html>")
