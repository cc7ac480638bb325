"""``dse compare DIR_A DIR_B``: two runs' fronts on one reference point.

Hypervolume of each (same reference point and scale), coverage each way (the share of one
front that the other weakly dominates), the union front with the run each design came from,
the best of each objective, the designs that appeared or vanished, and overlaid plots.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dse import pareto, runs
from dse.errors import InputError
from dse.fields import legacy_columns
from dse.space import Objective


RTOL = 1e-6   # the runs score in float32 (relative error ~1e-7): ties within it count as ties


def coverage(A: np.ndarray, B: np.ndarray, rtol: float = RTOL) -> float:
    """Share of B's points weakly dominated by some point of A (minimisation), values equal
    within ``rtol`` counting as equal (the same design scored by two code paths in float32)."""
    if len(B) == 0:
        return 0.0
    if len(A) == 0:
        return 0.0
    slack = rtol * np.abs(B)[None, :, :]
    dom = (A[:, None, :] <= B[None, :, :] + slack).all(axis=2).any(axis=0)
    return float(dom.mean())


def _load(d: Path):
    m = runs.load_manifest(d)
    f = d / "front.csv"
    if not f.is_file():
        raise InputError("the run has no front.csv yet", file=str(d), hint="run or resume it first")
    objs = tuple(Objective(o["name"], o["direction"]) for o in m["objectives"])
    front = runs.read_front(d)
    if front is None:
        raise InputError("corrupt front.csv", file=str(f),
                         hint="`dse status DIR` rebuilds it from the score tables")
    return m, objs, legacy_columns(front, scaled_paths(d, m))


def scaled_paths(d: Path, m: dict) -> list[str]:
    """The paths a run's space gives as scale factors (read from its copy of the space file),
    to name their columns ``<path>.scale`` in an old run folder's tables."""
    from dse.design import read_toml
    snap = runs.space_snapshot(d, m)
    try:
        params = read_toml(str(snap)).get("parameters") or {}
    except InputError:
        return []
    return [p for p, spec in params.items() if isinstance(spec, dict) and "scale" in spec]


def _signature(front: pd.DataFrame, params: list[str]) -> list[str]:
    return ["; ".join(f"{p}={row[p]}" for p in params) for _, row in front.iterrows()]


@dataclass(frozen=True)
class Comparison:
    """Two runs' fronts on one reference point: every figure ``dse compare`` prints."""

    name_a: str
    name_b: str
    objectives: tuple
    front_a: pd.DataFrame
    front_b: pd.DataFrame
    reference: np.ndarray          # minimisation form, the same for both runs
    scale: np.ndarray
    hypervolume_a: float
    hypervolume_b: float
    coverage_a: float              # share of B's front that A's weakly dominates
    coverage_b: float              # share of A's front that B's weakly dominates
    union: pd.DataFrame            # the union front, with the run ("A"/"B") of each design
    best: dict                     # metric -> (best on A, best on B)
    appeared: list                 # designs on B's front but not A's (parameter signatures)
    vanished: list                 # designs on A's front but not B's
    bands: dict | None = None      # with bands: the best designs' bands, P(A better) (bands.json)

    def lines(self) -> list[str]:
        """compare.md, as lines."""
        u = self.union
        out = [f"# {self.name_a} (A) vs {self.name_b} (B)", "",
               f"Reference point (minimisation form) {np.round(self.reference, 6).tolist()}, "
               f"scale {np.round(self.scale, 6).tolist()}: the same for both runs.", "",
               "| | A | B |", "|---|---|---|",
               f"| front size | {len(self.front_a)} | {len(self.front_b)} |",
               f"| hypervolume | {self.hypervolume_a:.6g} | {self.hypervolume_b:.6g} |",
               f"| coverage of the other front (share it weakly dominates) | "
               f"{self.coverage_a:.3f} | {self.coverage_b:.3f} |",
               f"| designs in the union front | {(u['run'] == 'A').sum()} | "
               f"{(u['run'] == 'B').sum()} |", "", "Best of each objective:", ""]
        for x in self.objectives:
            a, b = self.best[x.metric]
            out.append(f"- {x.direction} {x.metric}: A {a:.6g}, B {b:.6g}")
        if self.bands:
            from dse.bands_report import compare_lines
            out += compare_lines(self.bands)
        out += ["", f"Designs on B's front but not A's (appeared): {len(self.appeared)}",
                *[f"- {s}" for s in self.appeared[:30]], "",
                f"Designs on A's front but not B's (vanished): {len(self.vanished)}",
                *[f"- {s}" for s in self.vanished[:30]]]
        return out

    def write(self, out: str | Path) -> Path:
        """Write index.html, compare.md, union_front.csv and fronts.png into ``out``."""
        o = Path(out)
        o.mkdir(parents=True, exist_ok=True)
        self.union.to_csv(o / "union_front.csv", index=False)
        if self.bands:
            import json
            (o / "bands.json").write_text(json.dumps(self.bands, indent=2) + "\n")
        lines = self.lines()
        (o / "compare.md").write_text("\n".join(lines) + "\n")
        _plots(o, self.objectives, self.front_a, self.front_b, self.union, lines)
        return o


def compare_runs(dir_a: str, dir_b: str, bands: int = 0, seed: int = 0) -> Comparison:
    """The figures of two run folders' fronts (nothing written); ``bands``: parameter samples
    for the best designs' bands and P(A better) (``dse.bands_report``), 0: none."""
    da, db = Path(dir_a), Path(dir_b)
    ma, oa, fa = _load(da)
    mb, ob, fb = _load(db)
    if [(o.metric, o.direction) for o in oa] != [(o.metric, o.direction) for o in ob]:
        raise InputError("the runs optimise different objectives", file=str(db),
                         hint="compare runs whose objectives (and directions) are the same")
    objs = oa
    Fa, Fb = pareto.objective_matrix(fa, objs), pareto.objective_matrix(fb, objs)
    both = np.vstack([Fa, Fb]) if len(Fa) + len(Fb) else np.zeros((0, len(objs)))
    ref, scale = pareto.reference(both) if len(both) else (np.zeros(len(objs)), np.ones(len(objs)))
    params = [c for c in fa.columns if c in fb.columns and c not in {x.metric for x in objs}
              and c != "design_id"]
    ua = fa.assign(run="A", signature=_signature(fa, params))
    ub = fb.assign(run="B", signature=_signature(fb, params))
    # a design on both fronts counts once (as A's: the two runs may have scored it at different
    # precisions, float32 in exhaustive chunks, so its values can differ in the last digits)
    ub_only = ub[~ub["signature"].isin(set(ua["signature"]))]
    union = pareto.front_of([ua.drop(columns="design_id"), ub_only.drop(columns="design_id")],
                            objs) if len(ua) + len(ub_only) else pd.DataFrame()
    cols = [x.metric for x in objs] + params + ["run"]
    union_out = (union[cols] if len(union) else pd.DataFrame(columns=cols)).reset_index(drop=True)
    sa, sb = set(ua["signature"]), set(ub["signature"])
    best = {}
    for x in objs:
        pick = (lambda f: f[x.metric].min()) if x.direction == "minimize" else \
            (lambda f: f[x.metric].max())
        best[x.metric] = (float(pick(fa)), float(pick(fb)))
    c = Comparison(da.name, db.name, objs, fa, fb, ref, scale,
                   float(pareto.hypervolume(Fa, ref, scale)),
                   float(pareto.hypervolume(Fb, ref, scale)),
                   coverage(Fa, Fb), coverage(Fb, Fa), union_out, best,
                   sorted(sb - sa), sorted(sa - sb))
    if bands and len(fa) and len(fb):
        import dataclasses

        from dse.bands_report import compare_bands
        c = dataclasses.replace(c, bands=compare_bands(c, da, db, bands, seed))
    return c


def make_compare(dir_a: str, dir_b: str, out: str | None = None, bands: int = 0,
                 seed: int = 0) -> Path:
    c = compare_runs(dir_a, dir_b, bands, seed)
    return c.write(out or Path("runs") / f"compare-{Path(dir_a).name}-vs-{Path(dir_b).name}")


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
