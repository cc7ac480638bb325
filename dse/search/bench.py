"""Search benchmarks that print figures (issue: search quality and speed).

    python -m dse.search.bench                       # all three, modest sizes
    python -m dse.search.bench --trials 100000       # the 10^5-trial Optuna drift check

1. exhaustive: designs scored per second including the Pareto archive (one core);
2. quality: hypervolume that `optuna` (NSGA-II) and `nested` reach with <= 5% of the evaluations,
   as a fraction of the exact front's (exhaustive), on one reference point;
3. Optuna trials per second over a long run (in memory), first vs last 10^4 trials.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from dse import pareto, runs  # noqa: E402
from dse.search import exhaustive, optuna_strategy  # noqa: E402
from dse.space import load_space  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _space(text: str) -> object:
    p = Path(tempfile.mkdtemp()) / "bench.toml"
    p.write_text(text)
    return load_space(str(p))


def big_space():
    t = (ROOT / "spaces" / "dense-70b-nodes.toml").read_text()
    t = t.replace("num = 23", "num = 200").replace('"layout.pp" = [1, 2]', '"layout.pp" = [1, 2, 4]')
    return _space(t.replace("[objectives]", '"workload.isl" = [256, 512, 1024, 2048, 4096, 8192, 16384, '
                            '32768]\n"workload.osl" = [128, 512, 2048]\n\n[objectives]'))


def _run(space, strategy: str, **extra) -> Path:
    d = runs.new_run_dir(space.name, str(Path(tempfile.mkdtemp()) / strategy))
    m = runs.create(d, space, strategy, extra.pop("seed", 0), {"chunk_designs": 262144,
                                                              "study_name": d.name, **extra})
    if strategy == "exhaustive":
        exhaustive.run(space, d, m, max_trials=None, budget_s=None, progress=False)
    else:
        optuna_strategy.run(space, d, m, max_trials=None, budget_s=None, progress=False)
    return d


def bench_exhaustive():
    space = big_space()
    space.batch(np.arange(100))
    t0 = time.perf_counter()
    d = _run(space, "exhaustive")
    dt = time.perf_counter() - t0
    st = runs.status(d)
    print(f"exhaustive: {st['designs_scored']:,} designs in {dt:.2f} s = "
          f"{st['designs_scored'] / dt:,.0f} designs/s including the Pareto archive and the "
          f"Parquet score tables (front {st['front_size']}; target 1,000,000/s)")


def bench_quality():
    space = load_space(str(ROOT / "spaces" / "dense-70b-nodes.toml"))
    exact = pd.read_csv(_run(space, "exhaustive") / "front.csv")
    budget = int(0.05 * space.size)
    outer, _ = optuna_strategy.split_parameters(space, True)
    inner = space.size // int(np.prod([space.shape[i] for i in outer]))
    fronts = {"exact (exhaustive)": (exact, space.size)}
    for name, strategy, sampler, trials, pop in (
            ("optuna nsga2", "optuna", "nsga2", budget, 24),
            ("optuna tpe", "optuna", "tpe", min(budget, 400), 16),
            ("nested tpe", "nested", "tpe", max(budget // inner, 1), 2)):
        d = _run(space, strategy, sampler=sampler, trials=trials, population=pop, seed=0)
        fronts[name] = (pd.read_csv(d / "front.csv"), runs.status(d)["designs_scored"])
    Fs = {k: pareto.objective_matrix(f, space.objectives) for k, (f, _) in fronts.items()}
    ref, scale = pareto.reference(np.vstack(list(Fs.values())))
    hv_exact = pareto.hypervolume(Fs["exact (exhaustive)"], ref, scale)
    for k, (f, n) in fronts.items():
        print(f"quality: {k:<20} {n:6,} designs scored ({n / space.size:6.1%} of the space): "
              f"hypervolume {pareto.hypervolume(Fs[k], ref, scale) / hv_exact:.4f} of the exact front")


def bench_optuna_rate(trials: int):
    """The optuna strategy as users run it (journal storage in the run folder, batches of 100,
    studies rotated every 10^4 trials), timed per window of 10^4 trials."""
    space = load_space(str(ROOT / "spaces" / "dense-70b-nodes.toml"))
    window = min(10_000, trials)
    d = runs.new_run_dir(space.name, str(Path(tempfile.mkdtemp()) / "rate"))
    m = runs.create(d, space, "optuna", 0, {"sampler": "nsga2", "population": 100,
                                             "study_name": d.name, "trials": trials,
                                             "segment_trials": optuna_strategy.SEGMENT_TRIALS})
    rates = []
    while runs.status(d)["trials_completed"] < trials:
        t0 = time.perf_counter()
        before = runs.status(d)["trials_completed"]
        optuna_strategy.run(space, d, m, max_trials=window, budget_s=None, progress=False)
        rates.append((runs.status(d)["trials_completed"] - before) / (time.perf_counter() - t0))
        print(f"  window {len(rates)}: trials {before:,}-{runs.status(d)['trials_completed']:,}: "
              f"{rates[-1]:,.1f} trials/s", flush=True)
    print(f"optuna nsga2 (journal storage, batches of 100, studies of "
          f"{optuna_strategy.SEGMENT_TRIALS:,}): {trials:,} trials; trials/s per window of "
          f"{window:,}: " + ", ".join(f"{r:,.0f}" for r in rates)
          + (f"; last/first = {rates[-1] / rates[0]:.2f} (target >= 0.5)" if len(rates) > 1 else ""))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dse.search.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=20_000, help="trials for the Optuna rate check")
    p.add_argument("--skip", nargs="*", default=[], choices=["exhaustive", "quality", "optuna"])
    a = p.parse_args(argv)
    if "exhaustive" not in a.skip:
        bench_exhaustive()
    if "quality" not in a.skip:
        bench_quality()
    if "optuna" not in a.skip:
        bench_optuna_rate(a.trials)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
