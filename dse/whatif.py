"""``dse whatif DIR``: re-score a run's front under overrides, and the front's sensitivities.

``--set PATH=VALUE`` gives a spec field a value, ``--scale PATH=FACTOR`` multiplies it (any
numeric dotted path; ``accelerator.peak_flops_per_s`` alone scales every dtype). Each front
design is scored before and after with the same model; the designs that stay non-dominated
form the what-if front. The sensitivity table gives, for each accelerator and topology spec,
the elasticity of each objective across the front for a +-20% change (median of
``(f(+20%) - f(-20%)) / (0.4 f)``), drawn as a tornado chart.
"""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import pandas as pd

from dse import pareto, runs
from dse.build import settable_paths
from dse.errors import InputError, suggest
from dse.perf import score
from dse.space import load_space

SENSITIVITY = ("accelerator.peak_flops_per_s", "accelerator.hbm_bw_bytes_per_s",
               "accelerator.hbm_capacity_bytes", "topology.scaleup.link_bw_bytes_per_s",
               "topology.scaleout.link_bw_bytes_per_s", "accelerator.capex_usd",
               "accelerator.all_in_power_w")
DTYPE_PATHS = tuple(f"accelerator.peak_flops_per_s.{d}" for d in
                    ("bf16", "fp16", "fp8", "fp4", "int8", "int4"))


def parse_overrides(sets: list[str], scales: list[str]) -> dict:
    valid = set(settable_paths()) | {"accelerator.peak_flops_per_s"}
    out = {}
    for items, op in ((sets or [], "set"), (scales or [], "scale")):
        for item in items:
            if "=" not in item:
                raise InputError(f"--{op} {item!r} is not PATH=VALUE", hint="e.g. --scale "
                                 "accelerator.hbm_bw_bytes_per_s=1.5")
            path, value = item.split("=", 1)
            path = path.strip()
            if path not in valid:
                raise InputError(f"--{op}: unknown path {path!r}", hint=suggest(path, valid, "paths"))
            try:
                v = float(value)
            except ValueError:
                raise InputError(f"--{op} {path}: {value!r} is not a number") from None
            if v <= 0 and not path.endswith(("fraction", "latency_s")):
                raise InputError(f"--{op} {path}={value}: must be > 0", hint="a positive number")
            for p in (DTYPE_PATHS if path == "accelerator.peak_flops_per_s" else (path,)):
                out[p] = (op, v)
    if not out:
        raise InputError("nothing to change", hint="give --set PATH=VALUE or --scale PATH=FACTOR")
    return out


def _objective_table(space, ids, overrides=None) -> pd.DataFrame:
    b, _ = space.batch_from_values(space.values_at(ids), overrides)
    s = score(b)
    df = pd.DataFrame({o.metric: s[o.metric].astype(float) for o in space.objectives})
    df["feasible"] = pareto.admissible(s, space.objectives, space.constraints)
    return df


def make_whatif(run_dir: str, sets=None, scales=None, out: str | None = None) -> Path:
    d = Path(run_dir)
    m = runs.load_manifest(d)
    if not (d / "front.csv").is_file():
        raise InputError("the run has no front.csv yet", file=str(d), hint="run or resume it first")
    snapshot = d / "inputs" / Path(m["space_file"]).name
    space = load_space(str(snapshot if snapshot.is_file() else m["space_file"]))
    front = pd.read_csv(d / "front.csv")
    if len(front) == 0:
        raise InputError("the run's front is empty", file=str(d), hint="nothing to re-score")
    overrides = parse_overrides(sets, scales)
    ids = front["design_id"].to_numpy(dtype=np.int64)
    before = _objective_table(space, ids)
    after = _objective_table(space, ids, overrides)
    o = Path(out) if out else d / "whatif"
    o.mkdir(parents=True, exist_ok=True)
    moved = front.copy()
    for ob in space.objectives:
        moved[f"{ob.metric}_before"] = before[ob.metric]
        moved[ob.metric] = after[ob.metric]
        moved[f"{ob.metric}_change"] = after[ob.metric] / before[ob.metric] - 1.0
    ok = after["feasible"].to_numpy()
    F = pareto.objective_matrix(moved[ok], space.objectives)
    new_front = moved[ok][pareto.nondominated(F)] if ok.any() else moved.iloc[:0]
    runs.write_front(o, new_front, space.objectives, [p.path for p in space.parameters])
    sens = sensitivities(space, ids)
    _write(o, space, overrides, moved, new_front, ok, sens)
    return o


def sensitivities(space, ids, step: float = 0.2) -> pd.DataFrame:
    base = _objective_table(space, ids)
    rows = []
    for path in SENSITIVITY:
        paths = DTYPE_PATHS if path == "accelerator.peak_flops_per_s" else (path,)
        up = _objective_table(space, ids, {p: ("scale", 1 + step) for p in paths})
        dn = _objective_table(space, ids, {p: ("scale", 1 - step) for p in paths})
        row = {"parameter": path}
        for ob in space.objectives:
            e = (up[ob.metric] - dn[ob.metric]) / (2 * step * base[ob.metric])
            row[ob.metric] = float(np.nanmedian(e.to_numpy()))
        rows.append(row)
    return pd.DataFrame(rows)


def _write(o, space, overrides, moved, new_front, ok, sens):
    lines = [f"# What if: {space.name}", "",
             "Overrides: " + ", ".join(f"{p} {op} {v:g}" for p, (op, v) in overrides.items()), "",
             f"- front designs re-scored: {len(moved)}; still feasible: {int(ok.sum())}; "
             f"non-dominated after the change: {len(new_front)}"]
    for ob in space.objectives:
        ch = moved[f"{ob.metric}_change"]
        lines.append(f"- {ob.metric}: median change {np.nanmedian(ch) * 100:+.1f}% "
                     f"(range {np.nanmin(ch) * 100:+.1f}% to {np.nanmax(ch) * 100:+.1f}%)")
    lines += ["", "## Sensitivity of the front (elasticity for +-20%, median over the front)", "",
              "| parameter | " + " | ".join(ob.metric for ob in space.objectives) + " |",
              "|---" * (1 + len(space.objectives)) + "|"]
    for _, r in sens.iterrows():
        lines.append(f"| {r['parameter']} | " + " | ".join(f"{r[ob.metric]:+.3f}"
                                                           for ob in space.objectives) + " |")
    (o / "whatif.md").write_text("\n".join(lines) + "\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ob = space.objectives[0]
    srt = sens.reindex(sens[ob.metric].abs().sort_values().index)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.barh(srt["parameter"], srt[ob.metric], color=np.where(srt[ob.metric] < 0, "#2ca02c", "#d62728"))
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel(f"elasticity of {ob.metric} (median over the front)")
    ax.set_title("tornado: what moves the front")
    fig.tight_layout()
    fig.savefig(o / "tornado.png")
    plt.close(fig)
    import base64
    png = base64.b64encode((o / "tornado.png").read_bytes()).decode()
    table = moved.to_html(index=False, float_format=lambda v: f"{v:.4g}", border=0)
    (o / "index.html").write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>what if</title></head>"
        f"<body style='font-family:sans-serif'><pre>{html.escape(chr(10).join(lines))}</pre>"
        f"<img src='data:image/png;base64,{png}'><h2>Front designs before and after</h2>{table}"
        f"</body></html>")
