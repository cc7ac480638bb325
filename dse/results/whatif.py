"""``dse whatif DIR``: re-score a run's front under overrides, and the front's sensitivities.

``--set PATH=VALUE`` gives a spec field a value, ``--scale PATH=FACTOR`` multiplies it (any
numeric dotted path; ``accelerator.peak_flops_per_s`` alone scales every dtype). Each front
design is scored before and after with the same model; the designs that stay non-dominated
form the what-if front. The sensitivity table gives, for each accelerator and topology spec,
the elasticity of each objective across the front for a +-20% change (median of
``(f(+20%) - f(-20%)) / (0.4 f)``), drawn as a tornado chart.

``--reoptimize`` also searches the run's space again with the overrides written in, warm-started
from the run, into a new run folder (``OUT/run``; see ``dse.results.reoptimize``), and the page adds the
re-optimized front against the re-scored old front: hypervolumes on one reference point, the
best of each objective, the designs new on the front and an overlaid plot; ``OUT/front.csv`` is
then the re-optimized front.
"""

from __future__ import annotations

import html
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dse import pareto
from dse.build.designs import kv_dtype_text as say
from dse.build.designs import resolve, settable_paths
from dse.build.mechanisms import check as check_mechanisms
from dse.build.mechanisms import scale_base
from dse.errors import InputError, suggest
from dse.perf import REASONS, score
from dse.results import pages, train_whatif
from dse.results import reoptimize as reopt
from dse.results.bands_report import whatif_bands, whatif_headline, whatif_lines
from dse.scoring.bands import check_samples
from dse.search import files, store
from dse.spec import validate
from dse.spec.csvsafe import spreadsheet_safe
from dse.spec.fields import REGISTRY, label, objective_label

SENSITIVITY = ("accelerator.peak_flops_per_s", "accelerator.hbm_bw_bytes_per_s",
               "accelerator.hbm_capacity_bytes", "topology.scaleup.link_bw_bytes_per_s",
               "topology.scaleout.link_bw_bytes_per_s", "accelerator.capex_usd",
               "accelerator.all_in_power_w")
DTYPE_PATHS = tuple(f"accelerator.peak_flops_per_s.{d}" for d in
                    ("bf16", "fp16", "fp8", "fp4", "int8", "int4"))


def parse_overrides(sets=None, scales=None, space=None) -> dict:
    """``--set PATH=VALUE`` and ``--scale PATH=FACTOR`` as {path: (op, value)}, each value parsed
    and checked by the field registry (``dse.spec.fields``, ``dse.spec.validate.parse_text``): numbers,
    and for string fields a catalog id (``accelerator.id=b300``) or a choice
    (``cost.capex_model=components``), a typo refused with the closest valid values. Items may
    be "PATH=VALUE" strings or a {path: value} dict (the Python API)."""
    train = space is not None and space.task == "train"
    registry = train_whatif.REGISTRY if train else REGISTRY
    dtype_paths = train_whatif.DTYPE_PATHS if train else DTYPE_PATHS
    valid = set(train_whatif.REGISTRY if train else settable_paths()) \
        | {"accelerator.peak_flops_per_s"}
    out = {}
    for items, op in ((sets or [], "set"), (scales or [], "scale")):
        if isinstance(items, dict):
            items = [f"{k}={v}" for k, v in items.items()]
        for item in items:
            if "=" not in item:
                raise InputError(f"--{op} {item!r} is not PATH=VALUE", hint="e.g. --scale "
                                 "accelerator.hbm_bw_bytes_per_s=1.5")
            path, value = item.split("=", 1)
            path = path.strip()
            if path not in valid:
                raise InputError(f"--{op}: unknown path {path!r}", hint=suggest(path, valid, "paths"))
            f = registry.get(path)
            if f is not None and not f.numeric and op == "scale":
                raise InputError(f"--scale {path}: a {'catalog id' if f.kind == 'id' else 'choice'}"
                                 " cannot be scaled", hint=f"--set {path}=VALUE ({f.valid()})")
            if op == "set":
                check = dtype_paths[0] if path == "accelerator.peak_flops_per_s" else path
                v = validate.parse_text(check, value, where=f"--set {path}", name=path,
                                        registry=registry, ids=train_whatif.ids if train else None)
                v = v if isinstance(v, str) else float(v)
            else:
                try:
                    v = float(value)
                except ValueError:
                    raise InputError(f"--scale {path}: {value.strip()!r} is not a number",
                                     hint="a finite factor > 0") from None
                if not (math.isfinite(v) and v > 0):
                    raise InputError(f"--scale {path}={value.strip()}: must be > 0 and finite",
                                     hint="a factor such as 1.5")
            for p in (dtype_paths if path == "accelerator.peak_flops_per_s" else (path,)):
                out[p] = (op, v)
    if not out:
        raise InputError("nothing to change", hint="give --set PATH=VALUE or --scale PATH=FACTOR")
    return out


def describe_overrides(overrides: dict) -> str:
    """``accelerator.id set b300, accelerator.hbm_bw_bytes_per_s scale 1.5``."""
    return ", ".join(f"{p} {op} {v if isinstance(v, str) else format(v, 'g')}"
                     for p, (op, v) in overrides.items())


def check_overrides(space, overrides: dict) -> None:
    """The overrides applied to the space's base design (each parameter at its first value)
    must still give a valid design: ranges after scaling, and the consistency rules."""
    if space.task == "train":
        return train_whatif.check_overrides(space, overrides)
    row = {**space.base, **{p.path: p.values[0] for p in space.parameters if not p.scale}}
    row.update({p: v for p, (op, v) in overrides.items() if isinstance(v, str)})
    try:
        table = resolve(pd.DataFrame([row]), file=space.file)
    except InputError as e:
        raise InputError(e.message, where="--set", hint=e.hint) from None
    for path, (op, v) in overrides.items():
        if isinstance(v, str):
            continue
        if op == "scale" and path == "serving.expert_imbalance" \
                and not (table["model.num_experts"].to_numpy(dtype=float) > 0).any():
            raise InputError(f"--scale {path}: the run's model {row.get('model.id', '')!r} is "
                             "dense (no routed experts), so it has no expert imbalance to scale",
                             where="--scale", hint="scale it on a run of an MoE model, or "
                             f"--set {path}=VALUE")
        cur = table[path].to_numpy(dtype=float)
        table[path] = np.full_like(cur, v) if op == "set" else \
            scale_base(table, path) * v
    rate = "workload.request_rate_per_s"
    rates = [float(v) for p in space.parameters if p.path == rate and not p.scale
             for v in p.values] or [float(space.base.get(rate, 0.0) or 0.0)]
    if "workload.concurrency" in overrides and rate not in overrides and max(rates) > 0:
        raise InputError(f"workload.concurrency: the run's designs take their "
                         f"concurrency from {rate} = {max(rates):g} (Little's law), so it "
                         "would be ignored", where="--set/--scale",
                         hint=f"--set {rate}=VALUE to change the load, or {rate}=0 with a "
                         "workload.concurrency for a fixed one")
    spec = {p.path: max(p.values) for p in space.parameters   # any design's draft tokens
            if p.path == "serving.spec_tokens" and not p.scale}
    if "serving.spec_tokens" in spec and "serving.spec_tokens" not in overrides:
        table["serving.spec_tokens"] = float(spec["serving.spec_tokens"])
    try:
        validate.check_table(table, columns=list(overrides))
        check_mechanisms(table)     # e.g. --set serving.spec_method=draft without a drafter
    except InputError as e:
        raise InputError(e.message, where="--set/--scale", hint=e.hint) from None


def _objective_table(space, ids, overrides=None) -> pd.DataFrame:
    if space.task == "train":
        return train_whatif.objective_table(space, ids, overrides)
    sp, vals, overrides = space.with_strings(space.values_at(ids), overrides)
    b, _ = sp.batch_from_values(vals, overrides)
    s = score(b)
    df = pd.DataFrame({o.metric: s[o.metric].astype(float) for o in space.objectives})
    df["feasible"] = pareto.admissible(s, space.objectives, space.constraints)
    df["reason"] = s["reason"].astype(np.int64)
    return df


# reasons a design is not a design at all (a layout the model cannot take, a value out of its
# domain, a backend without kernels), as against one that does not fit, is over its batch or
# rate caps, or misses a constraint: those are answers a what-if gives
INVALID = (1, 2, 4, 64, 256)


def _refuse_invalid(d: Path, after: pd.DataFrame, overrides: dict, train=False) -> None:
    """A what-if whose change leaves every design of the front invalid (``INVALID``): one line
    with the change, how many designs and why, before anything is written."""
    bits = after["reason"].to_numpy(dtype=np.int64)
    invalid, reasons = (train_whatif.INVALID, train_whatif.REASONS) if train \
        else (INVALID, REASONS)
    if len(bits) == 0 or not ((bits & sum(invalid)) != 0).all():
        return
    n = len(bits)
    why = "; ".join(f"{reasons[b]} ({int(((bits & b) != 0).sum())} of {n})" for b in invalid
                    if ((bits & b) != 0).any())
    flags = " ".join(f"--{op} {p}={v if isinstance(v, str) else format(v, 'g')}"
                     for p, (op, v) in overrides.items())
    raise InputError(f"the change leaves none of the front's {n} designs valid: {why}",
                     file=str(d), where=flags, hint="choose a value the model and the layouts "
                     "allow; a change that only makes designs not fit or miss a constraint is "
                     "an answer, and is written")


def _read_front(d: Path, space) -> pd.DataFrame:
    f = store.front_file(d)
    if not f.is_file():
        raise InputError("the run has no front.csv yet", file=str(d), hint="run or resume it first")
    try:
        front = pd.read_csv(f)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise InputError(f"corrupt front.csv ({type(e).__name__})", file=str(f),
                         hint="`dse run --resume` rewrites it from the score tables") from None
    if "design_id" not in front:
        raise InputError("corrupt front.csv: no design_id column", file=str(f),
                         hint="`dse run --resume` rewrites it from the score tables")
    if len(front) == 0:
        raise InputError("the run's front is empty", file=str(d), hint="nothing to re-score")
    ids = pd.to_numeric(front["design_id"], errors="coerce").to_numpy(dtype=float)
    if not (np.isfinite(ids).all() and (ids == np.round(ids)).all() and (ids >= 0).all()
            and (ids < space.size).all()):
        raise InputError("corrupt front.csv: a design_id is not a design of the run's space",
                         file=str(f), hint="`dse run --resume` rewrites it from the score tables")
    front["design_id"] = ids.astype(np.int64)
    return space.legacy(front)


@dataclass(frozen=True)
class WhatIf:
    """A what-if of a run: where it was written and what it found."""

    path: Path                    # the output folder (whatif.md, index.html, front.csv, ...)
    overrides: dict               # {path: ("set" | "scale", value)}
    rescored: pd.DataFrame        # every front design: each objective before, after, change
    front: pd.DataFrame           # the what-if front (re-optimized with ``reoptimize``)
    sensitivities: pd.DataFrame   # elasticity of each objective per spec, median over the front
    reoptimized: dict | None = None   # with ``reoptimize``: the new run and its comparison
    bands: dict | None = None     # with bands: each objective's median change and 90% band
    headline: tuple = ()          # the first lines (whatif.md, the terminal): each objective's
    # median change over the front, its 90% band, sign resolved or not, what would change it


def run_whatif(run_dir: str, sets=None, scales=None, out: str | None = None, *,
               reoptimize: bool = False, trials: int | None = None,
               budget_s: float | None = None, progress: bool = False,
               bands: int | None = None, seed: int = 0) -> WhatIf:
    """Re-score a run's front under ``sets`` / ``scales`` (``parse_overrides``), write the page
    into ``out`` (default DIR/whatif) and return what it found. ``bands``: parameter samples
    for the changes' 90% bands (default ``dse.scoring.bands.DEFAULT_SAMPLES``, 0: none; ``seed``)."""
    bands = check_samples(bands)
    d = Path(run_dir)
    m = store.load_manifest(d)
    space = store.space_of(d, m)
    front = _read_front(d, space)
    overrides = parse_overrides(sets, scales, space)
    if space.task == "train" and reoptimize:
        raise InputError("--reoptimize is not available for training runs yet",
                         file=str(d), hint="write the change into the space file and "
                         "`dse run` it; `dse compare` the two runs")
    check_overrides(space, overrides)
    o = Path(out) if out else d / "whatif"
    note = describe_overrides(overrides)
    if reoptimize:
        import tempfile

        if trials is not None and trials < 1:
            raise InputError(f"--trials {trials} must be >= 1")
        reopt.check(d, m, o)
        with tempfile.TemporaryDirectory() as tmp:   # the derived space, checked before output
            prepared = reopt.prepare(space, overrides, note, Path(tmp))
            return _make(d, m, space, front, overrides, o, prepared, trials, budget_s, progress,
                         bands, seed)
    return _make(d, m, space, front, overrides, o, None, trials, budget_s, progress, bands, seed)


def _make(d, m, space, front, overrides, o, prepared, trials, budget_s, progress,
          n_bands=0, seed=0) -> WhatIf:
    ids = front["design_id"].to_numpy(dtype=np.int64)
    before = _objective_table(space, ids)
    after = _objective_table(space, ids, overrides)
    if prepared is None:       # a re-optimization searches the whole space under the change
        _refuse_invalid(d, after, overrides, space.task == "train")
    moved = front.copy()
    if space.task == "train":
        moved["kv_dtype_before"] = moved["kv_dtype"] = ""
    else:
        moved["kv_dtype_before"], moved["kv_dtype"] = space.kv_dtypes(ids), \
            space.kv_dtypes(ids, overrides)
    for ob in space.objectives:
        moved[f"{ob.metric}_before"] = before[ob.metric]
        moved[ob.metric] = after[ob.metric]
        moved[f"{ob.metric}_change"] = after[ob.metric] / before[ob.metric] - 1.0
    band = None
    if n_bands:
        band = whatif_bands(space, ids, overrides, n_bands, seed)
        moved = pd.concat([moved, band.pop("columns").set_axis(moved.index)], axis=1)
    ok = after["feasible"].to_numpy()
    F = pareto.objective_matrix(moved[ok], space.objectives)
    new_front = moved[ok][pareto.nondominated(F)] if ok.any() else moved.iloc[:0]
    res = None
    if prepared is not None:
        o.mkdir(parents=True, exist_ok=True)
        res = reopt.reoptimize(d, m, space, front, prepared, o, trials=trials,
                               budget_s=budget_s, progress=progress)
        shutil.copyfile(store.front_file(res["run_dir"]), store.front_file(o))
        _state_kv_dtype(store.front_file(o), res["space"])
    else:
        o.mkdir(parents=True, exist_ok=True)
        store.write_front(o, new_front, space.objectives, space.columns)
        if space.task != "train":
            _state_kv_dtype(store.front_file(o), space, overrides)
    sens = sensitivities(space, ids)
    _write(o, space, overrides, moved, new_front, ok, sens, res, band)
    return WhatIf(o, overrides, moved, pd.read_csv(store.front_file(o)), sens, res, band,
                  tuple(whatif_headline(space, moved, band)))


def _state_kv_dtype(f: Path, space, overrides=None) -> None:
    """front.csv with a last column ``kv_dtype``: each design's KV cache element type after
    the change (a blank ``model.kv_dtype`` follows the weights, so a --set of either moves it)."""
    df = pd.read_csv(f)
    df["kv_dtype"] = space.kv_dtypes(df["design_id"].to_numpy(np.int64), overrides) \
        if len(df) else pd.Series(dtype=object)
    files.atomic_save(f, lambda p: spreadsheet_safe(df).to_csv(p, index=False))


def kv_line(before: np.ndarray, after: np.ndarray) -> str:
    """The what-if page's line on the KV cache's element type over the front, before and after."""
    if len(after) == 0:
        return "- KV cache element type: no front design"
    if (np.asarray(before) == np.asarray(after)).all():
        return f"- KV cache element type (unchanged): {say(after)}"
    return f"- KV cache element type: {say(before)} before, {say(after)} after"


def sensitivities(space, ids, step: float = 0.2) -> pd.DataFrame:
    base = _objective_table(space, ids)
    rows = []
    train = space.task == "train"
    for path in train_whatif.SENSITIVITY if train else SENSITIVITY:
        paths = ((train_whatif.DTYPE_PATHS if train else DTYPE_PATHS)
                 if path == "accelerator.peak_flops_per_s" else (path,))
        up = _objective_table(space, ids, {p: ("scale", 1 + step) for p in paths})
        dn = _objective_table(space, ids, {p: ("scale", 1 - step) for p in paths})
        row = {"parameter": path}
        for ob in space.objectives:
            e = (up[ob.metric] - dn[ob.metric]) / (2 * step * base[ob.metric])
            row[ob.metric] = float(np.nanmedian(e.to_numpy()))
        rows.append(row)
    return pd.DataFrame(rows)


def _fmt(v) -> str:
    return "-" if v is None or (isinstance(v, float) and not np.isfinite(v)) else f"{v:.4g}"


def _n(k: int, word: str) -> str:
    return f"{k:,} {word}" + ("" if k == 1 else "s")


def _reference(objs, res: dict) -> str:
    """The hypervolume's reference point (minimisation form in ``res``) in each objective's
    unit, and the scale."""
    if "reference" not in res:
        return "reference point not recorded"
    return "reference point " + ", ".join(
        f"{label(o.metric)} {(p if o.direction == 'minimize' else -p):.4g} (scale {sc:.4g})"
        for o, p, sc in zip(objs, res["reference"], res["scale"]))


def _reopt_lines(res: dict, space) -> list[str]:
    st, objs = res["status"], space.objectives
    hv_o, hv_n = res["hv_rescored"], res["hv_reoptimized"]
    gain = f" ({(hv_n / hv_o - 1) * 100:+.1f}%)" if hv_o > 0 else ""
    how = ("exhaustive: the exact new front" if res["strategy"] == "exhaustive" else
           f"{res['strategy']}: a new study whose first {_n(res['warm_start_trials'], 'trial')} "
           "were the old front's designs")
    unit = "work item" if res["strategy"] == "exhaustive" else "trial"
    lines = ["", "## Re-optimized with the change", "",
             (f"- new run: `{res['run_dir']}` ({how}); {st['state']}, "
              f"{_n(st['trials_completed'], unit)}, {st['designs_scored']:,} designs scored in "
              f"{res['elapsed_s']:.1f} s"),
             (f"- front: {len(res['old_front'])} designs re-scored -> {len(res['new_front'])} "
              f"re-optimized, of which {len(res['new'])} new (not on the old front)"),
             (f"- hypervolume (one reference point, objectives scaled by the union's range): "
              f"re-scored old front {hv_o:.4g}, re-optimized front {hv_n:.4g}{gain}; "
              + _reference(objs, res)), "",
             ("| objective | best on the original front | best re-scored | best re-optimized "
              "| change |"), "|---|---|---|---|---|"]
    for b in res["best"]:
        ch = (b["reoptimized"] / b["rescored"] - 1) * 100 if b["rescored"] else float("nan")
        lines.append(f"| {b['direction']} {b['metric']} | {_fmt(b['original'])} | "
                     f"{_fmt(b['rescored'])} | {_fmt(b['reoptimized'])} | "
                     + (f"{ch:+.1f}% |" if np.isfinite(ch) else "- |"))
    params = [p.column for p in space.parameters if p.path not in res["added"]]
    if len(res["new"]):
        lines += ["", "### Designs new on the front" + (" (first 20)" if len(res["new"]) > 20
                                                          else ""), "",
                  "| " + " | ".join(params + [o.metric for o in objs]) + " |",
                  "|---" * (len(params) + len(objs)) + "|"]
        for _, r in res["new"].head(20).iterrows():
            lines.append("| " + " | ".join([str(r[p]) for p in params] +
                                           [_fmt(float(r[o.metric])) for o in objs]) + " |")
    return lines


def _reopt_plot(o: Path, res: dict, space) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    objs = space.objectives
    pairs = [(0, 1)] + ([(0, 2)] if len(objs) > 2 else []) if len(objs) > 1 else []
    fig, axes = plt.subplots(1, max(1, len(pairs)), figsize=(6 * max(1, len(pairs)), 4.5),
                             dpi=pages.PNG_DPI, squeeze=False)
    for ax, (i, j) in zip(axes[0], pairs or [(0, 0)]):
        for df, kw in ((res["original"], {"c": "#bbbbbb", "marker": "o", "s": 14,
                                              "label": "original front (before the change)"}),
                       (res["old_front"], {"c": "#ff7f0e", "marker": "x", "s": 30,
                                               "label": "old front re-scored"}),
                       (res["new_front"], {"c": "#1f77b4", "marker": "o", "s": 16, "alpha": 0.8,
                                               "label": "re-optimized front"})):
            if len(df):
                ax.scatter(df[objs[i].metric], df[objs[j].metric], **kw)
        ax.set_xlabel(objective_label(objs[i].metric, objs[i].direction))
        ax.set_ylabel(objective_label(objs[j].metric, objs[j].direction))
        for k, setter in ((i, ax.set_xscale), (j, ax.set_yscale)):
            v = np.concatenate([np.asarray(df[objs[k].metric], float) for df in
                                (res["original"], res["old_front"], res["new_front"]) if len(df)])
            if pareto.log_axis(v):
                setter("log")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("re-optimized vs re-scored old front")
    fig.tight_layout()
    f = o / "reoptimized.png"
    fig.savefig(f, dpi=pages.PNG_DPI)
    pages.compact_png(f)
    plt.close(fig)
    return f


def _write(o, space, overrides, moved, new_front, ok, sens, res=None, band=None):
    lines = [f"# What if: {space.name}", "",
             "Overrides: " + describe_overrides(overrides), "",
             f"- front designs re-scored: {len(moved)}; still feasible: {int(ok.sum())}; "
             f"non-dominated after the change: {len(new_front)}"]
    if space.task != "train":
        lines.append(kv_line(moved["kv_dtype_before"].to_numpy(), moved["kv_dtype"].to_numpy()))
    if (overrides or {}).get("workload.request_rate_per_s", ("scale", 0.0))[0] == "set" \
            and overrides["workload.request_rate_per_s"][1] > 0:
        lines.append("- workload.request_rate_per_s is set: each design's concurrency follows "
                     "from the rate (Little's law on its step times) and replaces its "
                     "workload.concurrency")
    lines += whatif_headline(space, moved, band)
    if band is not None:
        lines += whatif_lines(band)
        import json
        (o / "bands.json").write_text(json.dumps(band, indent=2) + "\n")
    if res is not None:
        lines += _reopt_lines(res, res["space"])
    lines += ["", "## Sensitivity of the front (elasticity for +-20%, median over the front)", "",
              "| parameter | " + " | ".join(label(ob.metric) for ob in space.objectives) + " |",
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
    fig, ax = plt.subplots(figsize=pages.FIG_IN, dpi=pages.PNG_DPI)
    ax.barh(srt["parameter"], srt[ob.metric], color=np.where(srt[ob.metric] < 0, "#2ca02c", "#d62728"))
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel(f"elasticity of {label(ob.metric)}")
    ax.set_title("what moves the front (median elasticity over it, +-20%)")
    pages.style_axes(ax)
    fig.tight_layout()
    fig.savefig(o / "tornado.png", dpi=pages.PNG_DPI)
    pages.compact_png(o / "tornado.png")
    plt.close(fig)
    import base64

    def img(f):
        return pages.figure(base64.b64encode(f.read_bytes()).decode(), f.name)
    # the table that fits: parameters, then each objective before -> after and its change
    # (each design's band is in bands.json and the re-scored table's _lo/_hi columns; the page
    # shows the objectives' bands above, so that this table fits the page)
    cols = [c for c in space.columns if c in moved]
    for x in space.objectives:
        cols += [c for c in (f"{x.metric}_before", x.metric, f"{x.metric}_change") if c in moved]
    shown = moved[cols].copy()
    names = {c: label(c) for c in cols}
    for x in space.objectives:
        names[f"{x.metric}_before"] = f"{label(x.metric)} before"
        names[x.metric] = "after"
        ch = f"{x.metric}_change"
        if ch in shown:
            shown[ch] = [f"{v * 100:+.1f}%" if np.isfinite(v) else "-" for v in shown[ch]]
            names[ch] = "change"
    table = pages.table(shown, names)
    extra = ""
    if res is not None:
        extra = (f"<h2>Re-optimized front vs re-scored old front</h2>{img(_reopt_plot(o, res, res['space']))}"
                 "<h2>Designs new on the front</h2>" +
                 pages.table(res["new"], {c: label(c) for c in res["new"].columns}))
    body = (f"<h1>What if: {html.escape(space.name)}</h1><div class='summary'>"
            f"{pages.markdown_html(chr(10).join(lines[1:]))}</div>{img(o / 'tornado.png')}{extra}"
            f"<h2>Front designs before and after ({len(moved)})</h2>{table}")
    (o / "index.html").write_text(pages.page(f"what if: {space.name}", body))
