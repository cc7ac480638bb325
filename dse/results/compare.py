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

    def lines(self) -> list[str]:
        """compare.md, as lines."""
        u = self.union
        ref = "; ".join(f"{label(x.metric)} {(p if x.direction == 'minimize' else -p):.4g} "
                        f"(scale {sc:.4g})"
                        for x, p, sc in zip(self.objectives, self.reference, self.scale))
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
        """Write index.html, compare.md, union_front.csv and fronts.png into ``out``."""
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
            ids = front["design_id"].to_numpy(np.int64)
            out.append(kv_dtype_text(space.kv_dtypes(ids)) if len(ids) else "none (empty front)")
        except (InputError, OSError, KeyError, ValueError):
            return ()
    return tuple(out)


def _plots(o: Path, c: Comparison, lines):
    import base64

    import plotly.graph_objects as go

    objs, fa, fb, union = c.objectives, c.front_a, c.front_b, c.union
    xo, yo = objs[0], objs[1] if len(objs) > 1 else objs[0]
    x, y = xo.metric, yo.metric
    both = pd.concat([fa[[x, y]], fb[[x, y]]]).astype(float)
    logs = [pareto.log_axis(v) for v in (both[x], both[y])]
    fig = go.Figure()
    for name, f, color in (("A", fa, "#1f77b4"), ("B", fb, "#d62728")):
        fig.add_trace(go.Scatter(x=f[x], y=f[y], mode="markers", name=f"front {name}",
                                 marker=dict(size=9, color=color, opacity=0.7)))
    fig.add_trace(go.Scatter(x=union[x], y=union[y], mode="markers", name="union front",
                             marker=dict(size=15, symbol="circle-open", color="black")))
    fig.update_layout(title=f"{label(x)} vs {label(y)}", xaxis_title=objective_label(x, xo.direction),
                      yaxis_title=objective_label(y, yo.direction), height=560,
                      template="plotly_white", font=dict(size=13),
                      xaxis_type="log" if logs[0] else "linear",
                      yaxis_type="log" if logs[1] else "linear",
                      margin=dict(l=90, r=40, t=70, b=80))
    body = fig.to_html(full_html=False, include_plotlyjs="inline", default_width="100%")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    f, ax = plt.subplots(figsize=pages.FIG_IN, dpi=pages.PNG_DPI)
    ax.scatter(fa[x], fa[y], label=f"A: {c.name_a}", alpha=0.7)
    ax.scatter(fb[x], fb[y], label=f"B: {c.name_b}", alpha=0.7)
    ax.scatter(union[x], union[y], facecolors="none", edgecolors="black", s=80, label="union front")
    ax.set_xlabel(objective_label(x, xo.direction))
    ax.set_ylabel(objective_label(y, yo.direction))
    if logs[0]:
        ax.set_xscale("log")
    if logs[1]:
        ax.set_yscale("log")
    pages.style_axes(ax)
    ax.legend(fontsize=pages.FONT_PT - 2)
    f.tight_layout()
    f.savefig(o / "fronts.png", dpi=pages.PNG_DPI)
    plt.close(f)
    warn = "".join(f"<div class='warning'><strong>Warning:</strong> {html.escape(w)}</div>"
                   for w in c.warnings)
    text = [ln for ln in lines[1:] if not ln.startswith("**Warning:**")]
    png = pages.figure(base64.b64encode((o / "fronts.png").read_bytes()).decode(), "fronts.png")
    labels = {k: label(k) for k in union.columns}
    page = (f"<h1>{html.escape(c.name_a)} (A) vs {html.escape(c.name_b)} (B)</h1>{warn}"
            f"<div class='summary'>{pages.markdown_html(chr(10).join(text))}</div>{body}"
            f"<h2>Union front ({len(union)} designs)</h2>{pages.table(union, labels)}"
            f"<h2>Figure</h2>{png}")
    (o / "index.html").write_text(pages.page(f"compare {c.name_a} vs {c.name_b}", page))
