"""``dse whatif DIR ... --reoptimize``: search the run's space again with the overrides applied.

How the overrides become part of the new run: **a derived space file.** The base run's space is
written out again (TOML, objectives and constraints inline) with every override written in,
and the new run is an ordinary run of that file, so ``dse run --resume``, ``dse worker``,
``dse status``, ``dse report`` and ``dse compare`` work on it unchanged and keep applying the
change (the file is the run's ``inputs/`` snapshot and the manifest's ``space_file``). Storing
the overrides in the manifest instead would need every strategy to apply them; a space file
needs none to. Each override becomes:

- ``--set PATH=V``: the base value ``PATH = V``; when ``PATH`` is a searched parameter, that
  parameter becomes the one value ``[V]`` (its column stays in the front, the grid shrinks).
- ``--scale PATH=F`` on a searched parameter: its values (or its scale factors) times ``F``;
  on a value the space writes in its base design: that value times ``F``; on anything else
  (a catalog value): a one-value parameter ``PATH = { scale = [F] }``, which multiplies *each
  design's own* resolved value, also when the accelerator (or topology, model) id is itself a
  searched parameter. These added parameters come last, so the base run's designs keep their
  coordinates.

That is what ``Space.batch_from_values(vals, overrides)`` (the re-scoring of ``dse whatif``)
computes, design by design; one combination differs there and is refused: scaling a derived
link (``topology.scaleup.link_bw_bytes_per_s``, ...) while the space scales a chip field it is
derived from.

The new run has the base run's strategy, seed, sampler, population and local search (the
manifest's ``local_*`` keys; a polish, ``polish_share``, over the new run's trials): an exhaustive run is
re-run exhaustively (the exact new front); an optuna or nested run starts a new study whose first
trials are the base run's front designs (``manifest["warm_start"]``, enqueued by the optuna
strategy), so the new front is at least as good as the re-scored old front, then runs
``--trials`` (default: the base run's count; never fewer than the enqueued designs) or until
``--budget``. The new study is a journal file in the new run folder, also when the base run used
an RDB ``--storage`` (its workers are not enlisted). The base run is only read.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from dse import pareto
from dse.build.designs import DERIVED, FEEDERS
from dse.build.space import STRING_VALUED, Space, load_space
from dse.errors import InputError
from dse.perf import score_chunked
from dse.search import driver, files, store
from dse.search.optuna import strategy as optuna_strategy
from dse.search.optuna.strategy import make_sampler
from dse.spec.design import toml_key, toml_value

STRATEGIES = ("exhaustive", "optuna", "nested")


@dataclass
class Derived:
    """A derived space's text and how the base run's designs map into it."""
    text: str
    keep: list[bool]             # per base parameter: keeps its grid (else collapsed to one value)
    added: list[str] = field(default_factory=list)   # one-value scale parameters appended


# ---------------------------------------------------------------------------------- TOML out

def toml_value_any(v) -> str:
    """A derived space's value: what the base space held, NaN and infinities included."""
    return toml_value(v, finite=False)


def _num(x: float):
    """A product written back as an int when it is one (tp 2 * 1.0 stays 2)."""
    x = float(x)
    return int(x) if x.is_integer() and abs(x) < 2**53 else x


def space_toml(name: str, question: str, base: dict, params: list[tuple[str, object]],
               objectives, constraints) -> str:
    lines = [f"name = {toml_value_any(name)}", f"question = {toml_value_any(question)}", ""]
    sections: dict[str, list[str]] = {}
    for k, v in base.items():
        sec, rest = k.split(".", 1)
        sections.setdefault(sec, []).append(f"{toml_key(rest, True)} = {toml_value_any(v)}")
    for sec, body in sections.items():
        lines += [f"[{sec}]", *body, ""]
    lines.append("[parameters]")
    lines += [f"{json.dumps(p)} = {toml_value_any(v)}" for p, v in params]
    lines += ["", "[objectives]"] + [f"{toml_key(o.metric, False)} = {toml_value_any(o.direction)}"
                                     for o in objectives]
    if constraints:
        lines += ["", "[constraints]"]
        for c in constraints:
            b = {k: v for k, v in (("max", c.max), ("min", c.min)) if v is not None}
            lines.append(f"{toml_key(c.metric, False)} = {toml_value_any(b)}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- derived space

def derive(space: Space, overrides: dict, note: str) -> Derived:
    """The space with ``overrides`` ({path: ("set"|"scale", v)}) written in."""
    base = dict(space.base)
    params: list[tuple[str, object]] = []
    keep: list[bool] = []
    for p in space.parameters:
        op, v = overrides.get(p.path, (None, None))
        if op == "set":
            params.append((p.path, [v if isinstance(v, str) else _num(v)]))
            keep.append(False)
        elif op == "scale":
            vals = [_num(x * v) for x in p.values]
            params.append((p.path, {"scale": vals} if p.scale else vals))
            keep.append(True)
        else:
            params.append((p.path, {"scale": list(p.values)} if p.scale else list(p.values)))
            keep.append(True)
    searched = {p.path for p in space.parameters}
    added = []
    for path, (op, v) in overrides.items():
        if path in searched:
            continue
        if op == "set":
            base[path] = v if isinstance(v, str) else _num(v)
        elif path in base and path not in STRING_VALUED:
            try:
                base[path] = _num(float(base[path]) * v)
            except (TypeError, ValueError):
                raise InputError(f"--scale {path}: the space's value {base[path]!r} is not a "
                                 "number", file=space.file, hint="--set it instead") from None
        else:
            params.append((path, {"scale": [_num(v)]}))
            added.append(path)
    scaled_feeders = [n for n, spec in params if isinstance(spec, dict) and n in FEEDERS]
    for path in added:
        if path in DERIVED and scaled_feeders:
            raise InputError(f"--scale {path} together with the scaled {scaled_feeders[0]} it is "
                             "derived from is ambiguous", hint=f"--set {path}=VALUE instead")
    question = f"What if {note}? " + (space.question or "")
    text = space_toml(f"{space.name}-whatif", question, base, params, space.objectives,
                      space.constraints)
    return Derived(text, keep, added)


def map_ids(old: Space, new: Space, ids: np.ndarray, derived: Derived) -> np.ndarray:
    """The base run's designs (flat ids of ``old``) as flat ids of the derived space."""
    ids = np.asarray(ids, dtype=np.int64)
    if not new.parameters:
        return np.zeros(len(ids), np.int64)
    coords = np.unravel_index(ids, old.shape) if old.parameters else ()
    cols = [c if k else np.zeros(len(ids), np.int64) for c, k in zip(coords, derived.keep)]
    cols += [np.zeros(len(ids), np.int64)] * len(derived.added)
    return np.ravel_multi_index(tuple(cols), new.shape).astype(np.int64)


def score_ids(space: Space, ids: np.ndarray) -> pd.DataFrame:
    """Designs of ``space`` scored the way the strategies score them (float32 chunks):
    objectives, parameters, design_id and whether each is admissible."""
    ids = np.asarray(ids, dtype=np.int64)
    b, _ = space.batch(ids, dtype=np.float32)   # built in float32: no conversion
    s = score_chunked(b, dtype=np.float32)
    df = pd.DataFrame({"design_id": ids})
    for p, v in space.values_at(ids).items():
        df[p] = v
    for o in space.objectives:
        df[o.metric] = np.asarray(s[o.metric], dtype=np.float64)
    df["_admissible"] = pareto.admissible(s, space.objectives, space.constraints)
    return df


# -------------------------------------------------------------------------------- the run

def check(d: Path, m: dict, o: Path) -> Path:
    """Refuse before anything is written: a running base run, an unknown strategy, a new
    run folder that is not empty. Returns the new run folder."""
    st = store.status(d)
    if st["state"] == "running":
        raise InputError("the run is still running", file=str(d),
                         hint="let it finish or stop it, then re-optimize from its front")
    if m["strategy"] not in STRATEGIES:
        raise InputError(f"unknown strategy {m['strategy']!r} in the manifest",
                         file=str(files.manifest_file(d)), hint="one of " + ", ".join(STRATEGIES))
    if m["strategy"] in ("optuna", "nested"):
        make_sampler(m.get("sampler", "nsga2"), 0, int(m.get("population", 32)))  # e.g. gp: torch
    nd = o / "run"
    if nd.exists() and (not nd.is_dir() or any(nd.iterdir())):
        raise InputError("the re-optimized run's folder exists and is not empty", file=str(nd),
                         hint="choose another --out, or continue it with `dse run --resume "
                              f"{nd}`")
    return nd


def prepare(space: Space, overrides: dict, note: str, tmp: Path) -> tuple[Space, Derived]:
    """Write and load the derived space in ``tmp`` (so a bad value fails before any output)."""
    derived = derive(space, overrides, note)
    f = tmp / f"{Path(space.file).stem}-whatif.toml"
    f.write_text(derived.text)
    try:
        return load_space(str(f)), derived
    except InputError as e:
        raise InputError(f"with {note}: {e.message}", file=space.file, hint=e.hint) from None


def run_new(m: dict, base_dir: Path, new_space: Space, nd: Path, old_front_ids: np.ndarray, *,
            trials: int | None, budget_s: float | None, progress: bool) -> tuple[Space, dict]:
    """Create the new run folder from the derived space and search it (``driver.run_space``)."""
    strategy = m["strategy"]
    extra = {"whatif": {"base_run": str(Path(base_dir).resolve()),
                        "base_space_digest": m.get("space_digest")}}
    n_warm, total, warm = 0, trials, None
    if strategy in ("optuna", "nested"):
        outer, _ = optuna_strategy.split_parameters(new_space, strategy == "nested")
        warm = [int(i) for i in dict.fromkeys(old_front_ids.tolist())]
        coords = np.unravel_index(np.asarray(warm, np.int64), new_space.shape) if warm else ()
        n_warm = len(set(zip(*[coords[i].tolist() for i in outer]))) if warm and outer else 0
        total = max(int(trials if trials is not None else m.get("trials", 1000)), n_warm)
    extra["whatif"]["warm_start_trials"] = n_warm
    # the base run's local search (a short run's, or the polish at the end of a default run)
    # goes with its sampler and population: without it a short run's new run is a plain random
    # search; the polish is the same share of the new run's trials
    extra.update({k: m[k] for k in driver.LOCAL_KEYS if k in m})
    if "polish_share" in m and total is not None:
        extra.update(optuna_strategy.polish(int(total), float(m["polish_share"])))
    d = driver.run_space(new_space, nd, strategy=strategy, trials=total, budget_s=budget_s,
                         seed=int(m.get("seed", 0)), sampler=m.get("sampler"),
                         population=m.get("population"), progress=progress, warm_start=warm,
                         chunk_designs=int(m.get("chunk_designs", 0)) or None,
                         segment_trials=m.get("segment_trials"), extra=extra,
                         own_copy=True)
    manifest = store.load_manifest(d)
    return store.space_of(d, manifest), manifest


def compare_fronts(space: Space, original: pd.DataFrame, old_rescored: pd.DataFrame,
                   new_front: pd.DataFrame, old_new_ids: np.ndarray) -> dict:
    """Hypervolumes on one reference point, best of each objective, designs new on the front."""
    objs = space.objectives
    Fo = pareto.objective_matrix(old_rescored, objs)
    Fn = pareto.objective_matrix(new_front, objs)
    both = np.vstack([Fo, Fn]) if len(Fo) + len(Fn) else np.zeros((0, len(objs)))
    ref, scale = (pareto.reference(both) if len(both)
                  else (np.zeros(len(objs)), np.ones(len(objs))))
    best = []
    for ob in objs:
        def f(df, pick=np.nanmin if ob.direction == "minimize" else np.nanmax, m=ob.metric):
            return float(pick(df[m])) if len(df) else float("nan")
        best.append({"metric": ob.metric, "direction": ob.direction, "original": f(original),
                     "rescored": f(old_rescored), "reoptimized": f(new_front)})
    new = (new_front[~new_front["design_id"].isin(set(old_new_ids.tolist()))]
           if len(new_front) else new_front)
    return {"hv_rescored": pareto.hypervolume(Fo, ref, scale),
            "hv_reoptimized": pareto.hypervolume(Fn, ref, scale),
            "reference": ref.tolist(), "scale": scale.tolist(), "best": best, "new": new}


def reoptimize(d: Path, m: dict, space: Space, front: pd.DataFrame, prepared, o: Path, *,
               trials: int | None = None, budget_s: float | None = None,
               progress: bool = False) -> dict:
    """The whole of --reoptimize, after ``check`` and ``prepare``; returns what the what-if
    page shows."""
    import time
    new_space, derived = prepared
    nd = o / "run"
    t0 = time.monotonic()
    old_ids = map_ids(space, new_space, front["design_id"].to_numpy(np.int64), derived)
    created = not nd.exists()
    try:
        space_n, manifest = run_new(m, d, new_space, nd, old_ids, trials=trials,
                                    budget_s=budget_s, progress=progress)
    except InputError:
        if created and nd.exists():
            shutil.rmtree(nd)        # nothing of a run that never started is left behind
        raise
    elapsed = time.monotonic() - t0
    st = store.status(nd)
    new_front = store.read_front(nd)
    rescored = score_ids(space_n, np.unique(old_ids))
    adm = rescored[rescored["_admissible"].to_numpy()]
    old_front = (adm[pareto.nondominated(pareto.objective_matrix(adm, space_n.objectives))]
                 if len(adm) else adm)
    res = compare_fronts(space_n, front, old_front, new_front, old_ids)
    res.update(run_dir=nd, status=st, elapsed_s=elapsed, space=space_n, old_front=old_front,
               new_front=new_front, original=front, strategy=m["strategy"],
               warm_start_trials=manifest["whatif"]["warm_start_trials"],
               added=derived.added)
    return res
