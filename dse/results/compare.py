"""``dse compare DIR_A DIR_B``: two runs' fronts on one reference point.

Hypervolume of each (same reference point and scale), coverage each way (the share of one
front that the other weakly dominates), the union front with the run each design came from,
the best of each objective, the designs that appeared or vanished, and overlaid plots.
"""

from __future__ import annotations

import html
import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dse import pareto
from dse.build.designs import kv_dtype_text
from dse.errors import InputError
from dse.results import pages
from dse.results.bands_report import compare_bands, compare_headline, compare_lines
from dse.results.reader import Run
from dse.search import store
from dse.spec.csvsafe import spreadsheet_safe
from dse.spec.design import read_toml
from dse.spec.fields import label, objective_label

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
    """A run's manifest, objectives and front (refused when front.csv is missing or corrupt)."""
    run = Run(d)
    f = store.front_file(d)
    if not f.is_file():
        raise InputError("the run has no front.csv yet", file=str(d), hint="run or resume it first")
    front = store.read_front(d)
    if front is None:
        raise InputError("corrupt front.csv", file=str(f),
                         hint="`dse status DIR` rebuilds it from the score tables")
    return run.manifest, run.objectives, run.legacy(front)


def _signature(front: pd.DataFrame, params: list[str]) -> list[str]:
    return ["; ".join(f"{p}={row[p]}" for p in params) for _, row in front.iterrows()]


def _same_design(ua: pd.DataFrame, ub: pd.DataFrame, metrics: list[str],
                 rtol: float = 1e-4) -> np.ndarray:
    """For each row of ``ub``: whether ``ua`` holds the same design, i.e. the same parameters
    and objective values equal to ``rtol`` (float32 scoring moves the last digits only)."""
    first = ua.drop_duplicates("signature").set_index("signature")
    out = np.zeros(len(ub), dtype=bool)
    for i, (sig, row) in enumerate(zip(ub["signature"], ub[metrics].to_numpy(float))):
        if sig in first.index:
            out[i] = bool(np.allclose(first.loc[sig, metrics].to_numpy(float), row,
                                      rtol=rtol, atol=0.0, equal_nan=True))
    return out


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
    warnings: tuple = ()           # how the two runs differ (workload, constraints, model)
    bands: dict | None = None      # with bands: the best designs' bands, P(A better) (bands.json)
    kv_dtypes: tuple = ()          # the KV cache's element types on A's and B's fronts, in words

    def reference_text(self) -> str:
        """The hypervolume's reference point: each objective's value (in its unit) and scale."""
        return "; ".join(f"{label(x.metric)} {(p if x.direction == 'minimize' else -p):.4g} "
                         f"(scale {sc:.4g})"
                         for x, p, sc in zip(self.objectives, self.reference, self.scale))

    def terminal_lines(self) -> list[str]:
        """What ``dse compare`` prints after the headline: each front's hypervolume on the one
        reference point (named), the coverage each way, the union front's split."""
        u = self.union
        return [f"hypervolume (one reference point for both runs, each objective divided by its "
                f"scale): A {self.hypervolume_a:.6g}, B {self.hypervolume_b:.6g}"
                + (f" (B/A {self.hypervolume_b / self.hypervolume_a:.4g})"
                   if self.hypervolume_a > 0 else ""),
                f"reference point: {self.reference_text()}",
                f"coverage (share of the other front it weakly dominates): A covers "
                f"{self.coverage_a:.1%} of B's front, B covers {self.coverage_b:.1%} of A's",
                f"fronts: A {len(self.front_a)} designs, B {len(self.front_b)}; union front "
                f"{len(u)}: {(u['run'] == 'A').sum()} from A, {(u['run'] == 'B').sum()} from B"]

    def lines(self) -> list[str]:
        """compare.md, as lines."""
        u = self.union
        ref = self.reference_text()
        out = [f"# {self.name_a} (A) vs {self.name_b} (B)", "", *compare_headline(self), ""]
        out += [f"**Warning:** {w}" for w in self.warnings] + ([""] if self.warnings else [])
        if self.kv_dtypes:
            out += [f"KV cache element type on the fronts: A {self.kv_dtypes[0]}; "
                    f"B {self.kv_dtypes[1]}.", ""]
        out += [f"Hypervolume reference point (the same for both runs; each objective divided "
                f"by its scale): {ref}.", "",
                "| | A | B |", "|---|---|---|",
                f"| front size | {len(self.front_a)} | {len(self.front_b)} |",
                f"| hypervolume | {self.hypervolume_a:.6g} | {self.hypervolume_b:.6g} |",
                f"| coverage of the other front (share it weakly dominates) | "
                f"{self.coverage_a:.3f} | {self.coverage_b:.3f} |",
                f"| designs in the union front | {(u['run'] == 'A').sum()} | "
                f"{(u['run'] == 'B').sum()} |", "", "Best of each objective:", "",
                "| objective | A | B |", "|---|---|---|"]
        for x in self.objectives:
            a, b = self.best[x.metric]
            out.append(f"| {x.direction} {label(x.metric)} | {a:.6g} | {b:.6g} |")
        if self.bands:
            out += ["", *compare_lines(self.bands)]
        out += ["", f"Designs on B's front but not A's (appeared): {len(self.appeared)}", "",
                *[f"- `{s}`" for s in self.appeared[:30]], "",
                f"Designs on A's front but not B's (vanished): {len(self.vanished)}", "",
                *[f"- `{s}`" for s in self.vanished[:30]]]
        return out

    def write(self, out: str | Path) -> Path:
        """Write index.html, compare.md, union_front.csv and the PNG of every objective pair
        (fronts.png, fronts-X-Y.png) into ``out``."""
        o = Path(out)
        o.mkdir(parents=True, exist_ok=True)
        spreadsheet_safe(self.union).to_csv(o / "union_front.csv", index=False)
        if self.bands:
            import json
            (o / "bands.json").write_text(json.dumps(self.bands, indent=2) + "\n")
        lines = self.lines()
        (o / "compare.md").write_text("\n".join(lines) + "\n")
        _plots(o, self, lines)
        return o


def _workload(d: Path, m: dict) -> dict:
    """What a run serves: its space's base workload and model, and the values of the parameters
    over them (read from its copy of the space file)."""
    try:
        t = read_toml(str(store.space_snapshot(d, m)))
    except InputError:
        return {}
    flat = {}
    for sec in ("model", "workload", "serving"):
        for k, v in (t.get(sec) or {}).items():
            flat[f"{sec}.{k}"] = v
    for k, v in (t.get("parameters") or {}).items():
        if k.split(".")[0] in ("model", "workload", "serving"):
            flat[k] = f"swept {v}"
    return flat


def differences(da: Path, ma: dict, db: Path, mb: dict) -> list[str]:
    """How two runs differ in what they serve or how they are judged: each a line for the page
    and the terminal (the comparison still runs: the fronts then answer different questions)."""
    out = []
    wa, wb = _workload(da, ma), _workload(db, mb)
    diff = [f"{k} {wa.get(k, 'unset')} vs {wb.get(k, 'unset')}" for k in sorted(set(wa) | set(wb))
            if wa.get(k) != wb.get(k)]
    if diff:
        out.append("the runs serve different workloads (A vs B): " + "; ".join(diff[:8])
                   + ("; ..." if len(diff) > 8 else "") + ": their fronts answer different questions")
    ca = sorted((c["metric"], c.get("max"), c.get("min")) for c in ma.get("constraints", []))
    cb = sorted((c["metric"], c.get("max"), c.get("min")) for c in mb.get("constraints", []))
    if ca != cb:
        def words(cs):
            return ", ".join(f"{k} {'<=' if hi is not None else '>='} {hi if hi is not None else lo}"
                             for k, hi, lo in cs) or "none"
        out.append(f"the runs' objectives files differ in their constraints: A {words(ca)}; "
                   f"B {words(cb)}")
    return out


def compare_runs(dir_a: str, dir_b: str, bands: int = 0, seed: int = 0) -> Comparison:
    """The figures of two run folders' fronts (nothing written); ``bands``: parameter samples
    for the best designs' bands and P(A better) (``dse.results.bands_report``), 0: none."""
    da, db = Path(dir_a), Path(dir_b)
    ma, oa, fa = _load(da)
    mb, ob, fb = _load(db)
    if ma.get("task", "serve") != mb.get("task", "serve"):
        raise InputError("one run is a training run and the other a serving run", file=str(db),
                         hint="compare runs of the same task")
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
    # precisions, float32 in exhaustive chunks, so its values can differ in the last digits); the
    # same parameters with other values (the runs' base designs or workloads differ) are two designs
    ub_only = ub[~_same_design(ua, ub, [x.metric for x in objs])]
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
                   sorted(sb - sa), sorted(sa - sb), tuple(differences(da, ma, db, mb)),
                   kv_dtypes=_kv_dtypes((da, ma, fa), (db, mb, fb)))
    if bands and len(fa) and len(fb):
        import dataclasses

        c = dataclasses.replace(c, bands=compare_bands(c, da, db, bands, seed))
    return c


def _kv_dtypes(*runs_) -> tuple:
    """Each run's front designs' KV cache element types in words (``build.kv_dtype_text``),
    from its space snapshot; () when a run's snapshot cannot be read (an old run folder)."""
    out = []
    for d, m, front in runs_:
        try:
            space = store.space_of(d, m)
            if space.task == "train":
                return ()
            ids = front["design_id"].to_numpy(np.int64)
            out.append(kv_dtype_text(space.kv_dtypes(ids)) if len(ids) else "none (empty front)")
        except (InputError, OSError, KeyError, ValueError):
            return ()
    return tuple(out)


def pairs(objectives) -> list[tuple]:
    """Every pair of objectives once (one objective: itself against itself)."""
    objs = list(objectives)
    return list(itertools.combinations(objs, 2)) if len(objs) > 1 else [(objs[0], objs[0])]


def _pair_plot(c: Comparison, xo, yo) -> str:
    """One objective pair of both fronts and the union front, interactive (the page loads the
    shared plotly.js)."""
    import plotly.graph_objects as go
    x, y = xo.metric, yo.metric
    both = pd.concat([c.front_a[[x]].rename(columns={x: "x"}).assign(y=c.front_a[y]),
                      c.front_b[[x]].rename(columns={x: "x"}).assign(y=c.front_b[y])]).astype(float)
    logs = [pareto.log_axis(v) for v in (both["x"], both["y"])]
    fig = go.Figure()
    for name, f, color in (("A", c.front_a, "#1f77b4"), ("B", c.front_b, "#d62728")):
        fig.add_trace(go.Scatter(x=f[x], y=f[y], mode="markers", name=f"front {name}",
                                 marker=dict(size=9, color=color, opacity=0.7)))
    fig.add_trace(go.Scatter(x=c.union[x], y=c.union[y], mode="markers", name="union front",
                             marker=dict(size=15, symbol="circle-open", color="black")))
    fig.update_layout(title=f"{label(x)} vs {label(y)}",
                      xaxis_title=objective_label(x, xo.direction),
                      yaxis_title=objective_label(y, yo.direction), height=520,
                      template="plotly_white", font=dict(size=13),
                      xaxis_type="log" if logs[0] else "linear",
                      yaxis_type="log" if logs[1] else "linear",
                      margin=dict(l=90, r=40, t=70, b=80))
    return fig.to_html(full_html=False, include_plotlyjs=False, default_width="100%")


def _pair_png(o: Path, c: Comparison, xo, yo, name: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    x, y = xo.metric, yo.metric
    f, ax = plt.subplots(figsize=pages.FIG_IN, dpi=pages.PNG_DPI)
    ax.scatter(c.front_a[x], c.front_a[y], label=f"A: {c.name_a}", alpha=0.7)
    ax.scatter(c.front_b[x], c.front_b[y], label=f"B: {c.name_b}", alpha=0.7)
    ax.scatter(c.union[x], c.union[y], facecolors="none", edgecolors="black", s=80,
               label="union front")
    ax.set_xlabel(objective_label(x, xo.direction))
    ax.set_ylabel(objective_label(y, yo.direction))
    for v, setter in ((pd.concat([c.front_a[x], c.front_b[x]]), ax.set_xscale),
                      (pd.concat([c.front_a[y], c.front_b[y]]), ax.set_yscale)):
        if pareto.log_axis(v.astype(float)):
            setter("log")
    pages.style_axes(ax)
    ax.legend(fontsize=pages.FONT_PT - 2)
    f.tight_layout()
    f.savefig(o / name, dpi=pages.PNG_DPI)
    pages.compact_png(o / name)
    plt.close(f)
    return name


def _plots(o: Path, c: Comparison, lines):
    """index.html: the summary, every objective pair of the two fronts (interactive, and as
    PNGs beside the page: ``fronts.png`` for the first pair, ``fronts-X-Y.png`` for the
    others), the union front."""
    plots, pngs = [], []
    for k, (xo, yo) in enumerate(pairs(c.objectives)):
        plots.append(_pair_plot(c, xo, yo))
        name = "fronts.png" if k == 0 else f"fronts-{xo.metric}-{yo.metric}.png"
        pngs.append(_pair_png(o, c, xo, yo, name))
    warn = "".join(f"<div class='warning'><strong>Warning:</strong> {html.escape(w)}</div>"
                   for w in c.warnings)
    text = [ln for ln in lines[1:] if not ln.startswith("**Warning:**")]
    labels = {k: label(k) for k in c.union.columns}
    page = (f"<h1>{html.escape(c.name_a)} (A) vs {html.escape(c.name_b)} (B)</h1>{warn}"
            f"<div class='summary'>{pages.markdown_html(chr(10).join(text))}</div>"
            f"<h2>Every objective pair ({len(plots)})</h2>{''.join(plots)}"
            f"<h2>Union front ({len(c.union)} designs)</h2>{pages.table(c.union, labels)}"
            f"<h2>Figures</h2>{''.join(pages.figure_file(n) for n in pngs)}")
    (o / "index.html").write_text(pages.plot_page(o, f"compare {c.name_a} vs {c.name_b}", page))
