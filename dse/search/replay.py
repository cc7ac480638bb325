"""Candidate sampler settings measured fast: the optuna strategy's loop replayed in memory.

    python -m dse.search.replay quickstart moe-codesign --sampler tpe --population 4 --startup 2
    python -m dse.search.replay dense-70b-nodes --sampler nsga2 --population 16 --local 0.25

Every design of the space is scored once up front (one vectorized call); then the loop of
``OptunaRun`` runs against an in-memory study with those scores: batches of ``population``
trials asked, a proposal already scored told its values back at no cost and another asked
(``REPEATS_PER_TRIAL`` times per trial, then unscored designs drawn at random), optionally a
share of each batch enqueued next to the front (``--local``), until 5% of the designs (or
``--share``) are scored. Printed: the hypervolume of the front of what was scored, as a share of
the exact front's (its nadir + 10% as reference), mean and worst over seeds. It reproduces
``python -m dse.search.bench`` (run folders, journal) to four digits for the same settings and
takes seconds instead of minutes: the README's table of candidate defaults comes from it.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from dse import pareto  # noqa: E402
from dse.build.space import load_space  # noqa: E402
from dse.perf import score_chunked  # noqa: E402
from dse.search.driver import plan  # noqa: E402
from dse.search.optuna import strategy as o
from dse.search.optuna import surrogate
from dse.search.optuna.enqueue import enqueue_neighbours, unscored_points  # noqa: E402
from dse.search.optuna.study import distributions, params_of, point_key  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


class Scored:
    """Every design of a space scored: told values, constraints, the exact front's reference."""

    def __init__(self, space):
        self.space = space
        s = score_chunked(space.batch_from_values(space.values_at(np.arange(space.size)),
                                                  dtype=np.float32)[0],
                          dtype=np.float32)
        self.ok = pareto.admissible(s, space.objectives, space.constraints)
        self.F = pareto.objective_matrix(s, space.objectives).astype(np.float64)
        exact = self.F[self.ok][pareto.nondominated(self.F[self.ok])]
        self.ref, self.scale = pareto.reference(exact)
        self.hv = pareto.hypervolume(exact, self.ref, self.scale)
        sign = np.array([1.0 if ob.direction == "minimize" else -1.0 for ob in space.objectives])
        self.values = np.where(np.isfinite(self.F), self.F, o.BIG) * sign
        self.cons = o.violations(s, space)

    def front(self, ids) -> np.ndarray:
        ids = np.asarray(sorted(ids), np.int64)
        ids = ids[self.ok[ids]]
        return ids[pareto.nondominated(self.F[ids])] if len(ids) else ids

    def share(self, ids) -> float:
        f = self.front(ids)
        return pareto.hypervolume(self.F[f], self.ref, self.scale) / self.hv if len(f) else 0.0


def replay(sc: Scored, sampler: str, population: int, seed: int, budget: int,
           startup: int | None = None, local: float = 0.0, local_after: int = 0,
           adjacent: bool = False, margin: float | None = None,
           diagonal: bool = False, model: str | None = None,
           start: str | None = None) -> set[int]:
    """One run of ``budget`` distinct designs; returns the ids of the designs it scored."""
    import optuna
    from optuna.trial import TrialState
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sp, pos = sc.space, list(range(len(sc.space.parameters)))
    smp = o.make_sampler(sampler, seed, population, trials=budget)
    if sampler == "tpe" and startup is not None:
        smp = optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                                         n_startup_trials=startup)
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, sampler=smp,
                                directions=[ob.direction for ob in sp.objectives])
    sid = storage.get_study_id_from_name(study.study_name)
    dists, known, rng = distributions(sp), set(), np.random.default_rng(seed)
    shape = tuple(sp.shape)

    def tell(t, k, repeat=False):      # a repeat of a scored design: PRUNED, as the run tells it
        tid = storage.get_trial_id_from_study_id_trial_number(sid, t.number)
        storage.set_trial_system_attr(tid, "constraints", [float(v) for v in sc.cons[k]])
        if repeat:
            study.tell(t, state=TrialState.PRUNED)
        else:
            study.tell(t, [float(v) for v in sc.values[k]])

    first = surrogate.start_points(sp, pos, local_after, seed) if start == "pairs" else []
    while len(known) < budget:
        n = min(population, budget - len(known))
        todo = [c for c in first if np.ravel_multi_index(c, shape) not in known]
        for c in todo[:min(n, local_after - len(known))]:
            study.enqueue_trial(params_of(sp, c, pos))
        if local > 0 and known and len(known) >= local_after:
            k = int(np.floor(n * local + (len(known) * local) % 1 + 1e-9))
            if model == "additive":
                ks = sorted(known)
                for c in surrogate.propose(sp, pos, ks, sc.values[ks], sc.cons[ks], k,
                                           seed=seed + len(known)):
                    study.enqueue_trial(params_of(sp, c, pos))
            else:
                f = sc.front(known)
                front = pd.DataFrame({"design_id": f, **{     # metric values, not minimised form
                    ob.metric: sc.F[f, j] * (1.0 if ob.direction == "minimize" else -1.0)
                    for j, ob in enumerate(sp.objectives)}})
                enqueue_neighbours(study, sp, pos, front, k,
                                   {"point": list(sc.ref), "scale": list(sc.scale)},
                                   seed=len(known),
                                   known=[tuple(int(c) for c in np.unravel_index(q, shape))
                                          for q in known], adjacent=adjacent, margin=margin,
                                   diagonal=diagonal)
        batch, keys, repeats = [], set(), 0
        while len(keys) < n:
            t = study.ask(dists)
            k = point_key(sp, t.params, pos)
            if k in known:
                tell(t, k, repeat=True)
                repeats += 1
            else:
                batch.append((t, k))
                repeats += k in keys
                keys.add(k)
            if repeats >= o.REPEATS_PER_TRIAL * n:
                free = unscored_points(shape, known | keys, n - len(keys), rng)
                if not free:
                    return known | keys      # the space is spent
                for c in free:
                    study.enqueue_trial(params_of(sp, c, pos))
                repeats = -len(free) * o.REPEATS_PER_TRIAL   # the enqueued come out next
        told = set()
        for t, k in batch:           # a design proposed twice in the batch: told once scored
            tell(t, k, repeat=k in told)
            told.add(k)
        known |= keys
    return known


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dse.search.replay", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spaces", nargs="+", help="shipped space names (spaces/NAME.toml) or files")
    p.add_argument("--sampler", choices=o.SAMPLERS,
                   help="default: what `dse run --strategy optuna --trials N` plans")
    p.add_argument("--population", type=int)
    p.add_argument("--startup", type=int, help="TPE's random trials (default: the driver's rule)")
    p.add_argument("--local", type=float, help="share of each batch next to the front")
    p.add_argument("--local-after", type=int, default=0, help="trials before the local search")
    p.add_argument("--adjacent", action="store_true",
                   help="categorical neighbours: the adjacent values in the space file's list")
    p.add_argument("--polish", type=float,
                   help="share of the trials at the end on the local search (default: the "
                        "driver's POLISH_SHARE; 0: none)")
    p.add_argument("--no-diagonal", action="store_true",
                   help="the polish without its two-step neighbours")
    p.add_argument("--no-model", action="store_true",
                   help="a short run's local search without its surrogate (grid neighbours)")
    p.add_argument("--random-start", action="store_true",
                   help="a short run's first designs at random (not the pairs-covering start)")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--share", type=float, default=0.05, help="evaluations, share of the space")
    p.add_argument("--seeds", type=int, default=5)
    a = p.parse_args(argv)
    if a.polish is not None:
        o.POLISH_SHARE = a.polish
    for name in a.spaces:
        f = Path(name) if name.endswith(".toml") else ROOT / "spaces" / f"{name}.toml"
        sc = Scored(load_space(str(f)))
        budget = max(int(a.share * sc.space.size), 1)
        pl = plan(sc.space, "optuna", budget, None, a.sampler, a.population, None)
        sampler, pop = pl.get("sampler", "tpe"), pl.get("population", 1)
        local = a.local if a.local is not None else pl.get("local_share", 0.0)
        after = a.local_after or pl.get("local_after", 0)
        adjacent = a.adjacent or pl.get("local_adjacent", False)
        margin = pl.get("local_margin")
        diagonal = pl.get("local_diagonal", False) and not a.no_diagonal
        model = None if a.no_model else pl.get("local_model")
        start = None if a.random_start else pl.get("local_start")
        t0 = time.perf_counter()
        r = [sc.share(replay(sc, sampler, pop, s, budget, a.startup, local, after, adjacent,
                            margin, diagonal, model, start))
             for s in range(a.first_seed, a.first_seed + a.seeds)]
        print(f"{f.stem}: {sc.space.size:,} designs, {budget:,} scored, {sampler} population "
              f"{pop}" + (f" startup {a.startup}" if a.startup is not None else "")
              + (f" local {local:g} after {after}" + (" adjacent" if adjacent else "") + (" diagonal" if diagonal else "") + (f" model {model}" if model else "") + (f" start {start}" if start else "")
                 if local else "")
              + f": hypervolume {np.mean(r):.4f} of the exact front (worst {np.min(r):.4f}, "
              f"{a.seeds} seeds: {' '.join(f'{x:.4f}' for x in r)}; {(time.perf_counter() - t0) / a.seeds:.1f} s a run)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
