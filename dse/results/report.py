"""``dse report DIR``: the Pareto report of a run.

Writes ``OUT/index.html`` (interactive plots drawn with one shared copy of plotly.js,
``OUT/../_static/plotly.min.js``, written with it: ``dse.results.pages``; opens offline; its PNG
figures are the files beside it), ``OUT/front.csv``, ``OUT/summary.md`` and PNG figures. Every number comes from the
run's stored scores, from the per-op breakdown the run kept of its front designs (scored with
the same model when it stopped; scored now for a run that was interrupted) or from scoring
designs of its space again for the cloud behind the front.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from dse import pareto
from dse.errors import InputError
from dse.perf import OPS, score
from dse.results import report_page
from dse.results.reader import Run
from dse.scoring import breakdown, train_space
from dse.search import store, tables

EXACT_DESIGNS = 100_000     # a space this small is re-scored whole for the cloud and the ranks
SAMPLE_DESIGNS = 20_000     # else a seeded sample of this many designs
CLOUD_POINTS = 4_000        # non-front designs drawn behind the front (faint)
SHOWN_METRICS = ("ttft_s", "tpot_s", "usd_per_mtok_output", "output_tokens_per_s_per_chip",
                 "num_chips")
TRAIN_SHOWN_METRICS = ("train_time_s", "train_cost_usd", "step_time_s", "mfu", "num_chips")


def breakdowns(d: Path, space, ids: np.ndarray) -> tuple[dict, str]:
    """The per-op breakdown of designs ``ids`` of the run's front, as the report draws them
    ({design_id: {"phases", "bound", "bound_why", "kv_dtype", "metrics"}}), and where it came
    from: the one the run kept when it stopped (``store.read_breakdown``), else the designs
    scored now with the same model (an interrupted run, a run folder from before it kept one)."""
    kept = store.read_breakdown(d)
    if kept is not None and set(ids.tolist()) <= set(kept["design_id"].tolist()):
        table, source = kept.set_index("design_id").loc[ids].reset_index(), "kept by the run"
    else:
        of = train_space.breakdown if space.task == "train" else breakdown.of_designs
        table, source = of(space, ids), "scored for this report"
    if space.task == "train":
        return {int(r["design_id"]): {
            "parts": {k: float(r[k]) for k in train_space.BREAKDOWN},
            "bound": r["bound"], "bound_why": train_bound_why(r),
            "metrics": {k: float(r[k]) for k in train_space.SHOWN}}
            for _, r in table.iterrows()}, source
    out = {}
    for _, r in table.iterrows():
        phases = {}
        for step, _title in breakdown.STEPS:
            rows = [(op, *(float(r[f"{step}.{op}.{q}"]) for q in breakdown.TIMES),
                     r[f"{step}.{op}.bound"], *(float(r[f"{step}.{op}.{q}"]) for q in breakdown.WORK))
                    for op in OPS if r[f"{step}.{op}.time_s"] > 0]
            phases[step] = (rows, float(r[f"{step}.overhead_s"]), float(r[f"{step}.total_s"]))
        out[int(r["design_id"])] = {
            "phases": phases, "bound": r["bound"], "kv_dtype": str(r["kv_dtype"]),
            "bound_why": breakdown.bound_why(r),
            "metrics": {k: float(r[k]) for k in table.columns
                        if "." not in k and k not in ("design_id", "kv_dtype", "bound")}}
    return out, source


def train_bound_why(r) -> str:
    """The parts of a training step, as shares of their sum (what its bound is the largest of)."""
    parts = {"compute": r["compute_s"], "HBM-bound work": r["memory_s"],
             "exposed communication": r["network_exposed_s"], "pipeline bubble": r["bubble_s"]}
    tot = float(sum(parts.values())) or 1.0
    return ", ".join(f"{v / tot:.0%} {k}" for k, v in parts.items()) + " of the step"


def _front(d: Path, m: dict, space) -> tuple[pd.DataFrame, str]:
    """The front the report shows and how it was checked. A local run's front is computed from
    its score tables and front.csv is verified against it (rewritten when it disagrees: a
    truncated or stale file); a shared run's front.csv was assembled from the storage."""
    front_csv = store.front_file(d)
    if m.get("storage"):
        if not front_csv.is_file() or store.read_front(d) is None:
            raise InputError("the run has no readable front.csv", file=str(front_csv),
                             hint="`dse run --resume` rebuilds it from the shared storage")
        return space.legacy(store.read_front(d)), "front.csv as assembled from the shared storage"
    n = len(store.score_tables(d))
    if n == 0:
        raise InputError("the run has no score tables yet", file=str(d), hint="run or resume it first")
    fr = space.legacy(store.front_from_tables(d, m))
    params = space.columns
    old = store.read_front(d)
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
        if store.lock_owner(d) is None:
            store.write_front(d, fr, m["objectives"], params)
        check = (f"computed from the run's {n} score tables; front.csv disagreed ({what}) "
                 "and was rebuilt")
    cols = list(dict.fromkeys([o.metric for o in space.objectives] + params)) + ["design_id"]
    return (fr[cols] if len(fr) else pd.DataFrame(columns=cols)).reset_index(drop=True), check


def population(space, d: Path, front: pd.DataFrame, m: dict) -> tuple[pd.DataFrame, str]:
    """The scored designs the report draws behind the front and ranks per accelerator, and what
    they are: every design of the space re-scored with the run's model when it has at most
    ``EXACT_DESIGNS`` designs, else a seeded uniform sample of ``SAMPLE_DESIGNS`` of them, plus
    the designs the run stored (an optuna run's trials). Admissible designs only (feasible and
    within the constraints); at most ``SAMPLE_DESIGNS`` of the stored ones (bounded memory)."""
    objs, cons = space.objectives, space.constraints
    if space.size <= EXACT_DESIGNS:
        ids, what = np.arange(space.size, dtype=np.int64), f"all {space.size:,} designs of the space"
    else:
        rng = np.random.default_rng(0)
        ids = np.unique(rng.integers(0, space.size, SAMPLE_DESIGNS, dtype=np.int64))
        what = f"a seeded sample of {len(ids):,} of the space's {space.size:,} designs"
    frames = []
    for lo in range(0, len(ids), 16384):
        part = ids[lo:lo + 16384]
        if space.task == "train":
            sc = train_space.score_index(space, part, dtype=np.float64)
        else:
            b, _ = space.batch(part)
            sc = score(b.expanded())
        ok = pareto.admissible(sc, objs, cons)
        f = pd.DataFrame({"design_id": part[ok]})
        for col, v in space.values_at(part[ok]).items():
            f[col] = v
        shown = TRAIN_SHOWN_METRICS if space.task == "train" else SHOWN_METRICS
        for name in dict.fromkeys([o.metric for o in objs] + list(shown)):
            f[name] = np.asarray(sc[name], dtype=np.float64)[ok]
        frames.append(f)
    if m["strategy"] != "exhaustive":          # the trials the run scored, bounded
        files = store.score_tables(d)
        per = max(1, SAMPLE_DESIGNS // max(len(files), 1))
        for fl in files:
            t = space.legacy(tables.read_table(fl))
            t = t[t["_admissible"]] if "_admissible" in t else t
            frames.append(t.sample(per, random_state=0) if len(t) > per else t)
        if files:
            what += " and the designs the run scored"
    pop = pd.concat([f for f in frames if len(f)], ignore_index=True) if frames else pd.DataFrame()
    if len(pop):
        pop = pop.drop_duplicates("design_id").reset_index(drop=True)
    return pop, what


def cloud(pop: pd.DataFrame, front: pd.DataFrame, n: int = CLOUD_POINTS) -> pd.DataFrame:
    """The non-front designs drawn as a faint cloud: at most ``n``, a seeded sample."""
    if not len(pop):
        return pop
    rest = pop[~pop["design_id"].isin(set(front["design_id"].astype(np.int64)))]
    return rest.sample(n, random_state=0) if len(rest) > n else rest


def best_per(pop: pd.DataFrame, front: pd.DataFrame, objectives, column: str) -> pd.DataFrame:
    """For each value of ``column`` (the accelerator): the best of each objective over ``pop``
    and the front (admissible designs), its design id, and how many of its designs are on the
    front."""
    both = pd.concat([front, pop], ignore_index=True).drop_duplicates("design_id")
    rows = []
    for key, g in both.groupby(column, sort=True):
        row = {column: key, "designs on the front": int((front[column] == key).sum())}
        for ob in objectives:
            i = g[ob.metric].idxmin() if ob.direction == "minimize" else g[ob.metric].idxmax()
            row[ob.metric] = float(g.loc[i, ob.metric])
            row[f"{ob.metric} design_id"] = int(g.loc[i, "design_id"])
        rows.append(row)
    out = pd.DataFrame(rows)
    first = objectives[0]
    return out.sort_values(first.metric, ascending=first.direction == "minimize",
                           ignore_index=True) if len(out) else out


def make_report(run_dir: str, out: str | None = None) -> Path:
    run = Run(run_dir)
    d, m, space = run.path, run.manifest, run.space
    front, check = _front(d, m, space)
    o = Path(out) if out else d / "report"
    o.mkdir(parents=True, exist_ok=True)
    store.write_front(o, front, space.objectives, space.columns)
    objs = space.objectives
    st = {**store.status(d), "front_check": check, "reference": m.get("reference")}
    if len(front) == 0:
        report_page.empty(o, space)
        return o
    front = front.reset_index(drop=True)
    ids = front["design_id"].to_numpy(dtype=np.int64)
    k = pareto.knee(front, objs)
    pop, what = population(space, d, front, m)
    bg = cloud(pop, front)
    accel = "accelerator.id" if "accelerator.id" in front.columns else None
    per_accel = best_per(pop, front, objs, accel) if accel else None
    # the per-op breakdown of the knee and the first front designs, as the run kept it
    shown = np.unique(np.r_[ids[k], ids[:report_page.MAX_BREAKDOWNS]])
    bds, _ = breakdowns(d, space, shown)
    report_page.write(o, space, st, front, bg, k, bds, per_accel, what)
    return o
