"""The optuna strategy: Optuna's samplers propose designs, asked and told in batches.

The numpy model is the engine and Optuna the driver and bookkeeper: a batch of trials (a
population) is asked, scored in one vectorized call, written to a Parquet score table, then told
back with its objective values and constraint violations (Optuna's constraint API: a trial is
feasible when every value is <= 0). The study lives in the run folder (an Optuna journal file)
unless ``--storage`` names an RDB URL.

Resume: trials a killed process left RUNNING are told from the score table when their batch was
written (nothing is lost), else failed so the sampler asks again (nothing counted twice).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pandas as pd

from dse import pareto, runs
from dse.errors import InputError
from dse.perf import score_chunked

SAMPLERS = ("nsga2", "nsga3", "tpe", "random", "qmc", "gp")
KEEP_METRICS = ("ttft_s", "tpot_s", "output_tokens_per_s_per_chip", "output_tokens_per_s_per_rack",
                "usd_per_mtok_output", "usd_per_mtok_input", "num_chips", "bound", "feasible")
BIG = 1e30


def make_sampler(name: str, seed: int, population: int):
    import optuna
    s = optuna.samplers
    if name == "nsga2":
        return s.NSGAIISampler(population_size=population, seed=seed)
    if name == "nsga3":
        return s.NSGAIIISampler(population_size=population, seed=seed)
    if name == "tpe":
        return s.TPESampler(seed=seed, multivariate=True, constant_liar=True)
    if name == "random":
        return s.RandomSampler(seed=seed)
    if name == "qmc":
        return s.QMCSampler(seed=seed, warn_independent_sampling=False)
    if name == "gp":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise InputError("--sampler gp needs PyTorch", hint="pip install torch, or use nsga2") from None
        return s.GPSampler(seed=seed)
    raise InputError(f"unknown sampler {name!r}", hint="one of " + ", ".join(SAMPLERS))


def _ordered(p) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in p.values)


def distributions(space) -> dict:
    """Optuna searches the same grid as the exhaustive strategy: an ordered numeric parameter
    is sampled as an index into its sorted values (so samplers see the order), any other as a
    category. Designs therefore have the same ids whatever strategy scored them."""
    from optuna.distributions import CategoricalDistribution, IntDistribution
    out = {}
    for p in space.parameters:
        if _ordered(p) and len(p.values) > 1:
            out[p.path] = IntDistribution(0, len(p.values) - 1)
        else:
            out[p.path] = CategoricalDistribution(list(range(len(p.values))))
    return out


def grid_index(space, trials) -> np.ndarray:
    """Per trial, the index into each parameter's values (columns in parameter order)."""
    return np.array([[t.params[p.path] for p in space.parameters] for t in trials], dtype=np.int64)


def storage_for(d: Path, url: str | None):
    import optuna
    if url:
        return url
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    return JournalStorage(JournalFileBackend(str(d / "optuna.journal")))


def _violations(s: dict, space) -> np.ndarray:
    """Constraint values per row (<= 0 feasible): infeasible designs and each bound."""
    cols = [np.where(np.asarray(s["feasible"], bool), 0.0, 1.0)]
    for c in space.constraints:
        v = np.asarray(s[c.metric], dtype=np.float64)
        v = np.where(np.isfinite(v), v, BIG)
        if c.max is not None:
            cols.append((v - c.max) / max(abs(c.max), 1e-30))
        if c.min is not None:
            cols.append((c.min - v) / max(abs(c.min), 1e-30))
    return np.column_stack(cols)


def _constraint_names(space) -> list[str]:
    names = ["feasible"]
    for c in space.constraints:
        if c.max is not None:
            names.append(f"{c.metric}<={c.max}")
        if c.min is not None:
            names.append(f"{c.metric}>={c.min}")
    return names


def _set_constraints(trial, values, space) -> None:
    for name, v in zip(_constraint_names(space), values):
        trial.set_constraint(name, float(v))


def _batch_file(d: Path, first: int) -> Path:
    return d / "scores" / f"trials-{first:09d}.parquet"


def _stored(d: Path) -> pd.DataFrame:
    files = sorted((d / "scores").glob("trials-*.parquet"))
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True) if files else pd.DataFrame()


def run(space, d: Path, manifest: dict, *, max_trials: int | None, budget_s: float | None,
        storage_url: str | None = None, progress: bool = True) -> dict:
    import optuna
    from optuna.trial import Trial, TrialState
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler_name = manifest.get("sampler", "nsga2")
    population = int(manifest.get("population", 64))
    sampler = make_sampler(sampler_name, manifest.get("seed", 0), population)
    directions = [o.direction for o in space.objectives]
    study = optuna.create_study(study_name=manifest["study_name"], storage=storage_for(d, storage_url),
                                sampler=sampler, directions=directions, load_if_exists=True)
    dists = distributions(space)
    metrics = [o.metric for o in space.objectives]

    stored = _stored(d)
    done_numbers = set(stored["trial"].tolist()) if len(stored) else set()
    # trials a killed process left running: tell them from their stored scores, or fail them
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t.number in done_numbers:
            row = stored[stored["trial"] == t.number].iloc[0]
            trial = Trial(study, t._trial_id)
            _set_constraints(trial, row["_constraints"], space)
            study.tell(trial, [float(row[f"_value_{i}"]) for i in range(len(metrics))])
        else:
            study.tell(t.number, state=TrialState.FAIL)

    admissible = stored[stored["_admissible"]] if len(stored) else stored
    front = pareto.front_of([admissible], space.objectives) if len(admissible) else pd.DataFrame()
    prev = runs.read_progress(d)
    elapsed0 = float(prev.get("elapsed_s", 0.0))
    total = int(manifest.get("trials", 1000))
    target = total if max_trials is None else min(total, len(stored) + max_trials)
    scored = len(stored)
    ref = manifest.get("reference")
    t0 = time.monotonic()
    flags = {"stop": False}

    def on_signal(signum, frame):
        flags["stop"] = True

    old = [signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)]
    (d / "lock").write_text(str(os.getpid()))
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=total, initial=scored, unit="trial", dynamic_ncols=True,
                   desc=f"optuna {sampler_name}", mininterval=0.5)
    hv = None

    def save(state):
        nonlocal hv
        if ref is not None and len(front):
            hv = pareto.hypervolume(pareto.objective_matrix(front, space.objectives),
                                    np.array(ref["point"]), np.array(ref["scale"]))
        runs.write_front(d, front, space.objectives, [p.path for p in space.parameters])
        failed = len(study.get_trials(deepcopy=False, states=(TrialState.FAIL,)))
        runs.write_json(d / "progress.json", {
            "state": state, "trials_completed": scored, "trials_failed": failed,
            "trials_total": total, "designs_scored": scored,
            "elapsed_s": elapsed0 + time.monotonic() - t0, "front_size": len(front),
            "hypervolume": hv})

    try:
        save("running")
        while scored < target and not flags["stop"]:
            if budget_s is not None and time.monotonic() - t0 >= budget_s:
                break
            n = min(population, target - scored)
            trials = [study.ask(dists) for _ in range(n)]
            coords = grid_index(space, trials)
            design_ids = np.ravel_multi_index(tuple(coords.T), space.shape) if len(space.shape) \
                else np.zeros(n, np.int64)
            vals = space.values_at(design_ids)
            batch, _ = space.batch_from_values(vals)
            s = score_chunked(batch, dtype=np.float32)
            F = pareto.objective_matrix(s, space.objectives)
            values = np.where(np.isfinite(F), F, BIG)
            values = values * np.array([1.0 if o.direction == "minimize" else -1.0
                                        for o in space.objectives])
            cons = _violations(s, space)
            ok = pareto.admissible(s, space.objectives, space.constraints)
            table = pd.DataFrame({"trial": [t.number for t in trials], "design_id": design_ids})
            for p, v in vals.items():
                table[p] = v
            for m in sorted(set(metrics) | {c.metric for c in space.constraints} | set(KEEP_METRICS)):
                v = s[m]
                table[m] = v.astype(np.float64) if v.dtype.kind == "f" else v
            for i in range(len(metrics)):
                table[f"_value_{i}"] = values[:, i]
            table["_constraints"] = list(cons)
            table["_admissible"] = ok
            path = _batch_file(d, trials[0].number)
            table.to_parquet(path.with_suffix(".parquet.tmp"), index=False)
            os.replace(path.with_suffix(".parquet.tmp"), path)
            for t, v, c in zip(trials, values, cons):
                _set_constraints(t, c, space)
                study.tell(t, [float(x) for x in v])
            scored += n
            if ok.any():
                front = pareto.front_of([front, table[ok]], space.objectives)
                if ref is None:
                    point, scale = pareto.reference(pareto.objective_matrix(front, space.objectives))
                    ref = {"point": point.tolist(), "scale": scale.tolist()}
                    manifest["reference"] = ref
                    runs.write_json(d / "manifest.json", manifest)
            save("running")
            if bar:
                bar.update(n)
                bar.set_postfix(front=len(front), hv=f"{hv:.4g}" if hv is not None else "-")
        save("finished" if scored >= total else "stopped")
    except BaseException:
        save("failed" if not flags["stop"] else "stopped")
        raise
    finally:
        if bar:
            bar.close()
        for sig, h in zip((signal.SIGINT, signal.SIGTERM), old):
            signal.signal(sig, h)
        try:
            (d / "lock").unlink()
        except FileNotFoundError:
            pass
    return runs.status(d)
