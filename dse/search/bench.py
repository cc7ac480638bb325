"""Search benchmarks that print figures (issue: search quality and speed).

    python -m dse.search.bench                       # all three, modest sizes
    python -m dse.search.bench --trials 100000       # the 10^5-trial Optuna drift check
    python -m dse.search.bench --skip exhaustive quality optuna   # the shipped spaces only
    python -m dse.search.bench --quick --skip exhaustive quality optuna   # those <= 10^4 designs

1. exhaustive: designs scored per second including the Pareto archive (one core);
1b. shipped: on every shipped space, `optuna` with its defaults and 5% of the evaluations, as a
   share of the exact front's hypervolume, mean and worst over seeds (target >= 0.98);
2. quality: hypervolume that `optuna` (NSGA-II, TPE) and `nested` (TPE + local search next to
   the front) reach with <= 5% of the evaluations, as a share of the exact front's (exhaustive),
   on one reference point, mean and worst over seeds: `optuna` on dense-70b-nodes, `nested` on a
   hypothetical-chip space of 500 chip points (nested needs many hardware points to choose from);
3. Optuna trials per second over a long run on a 2.9 M-design space (journal storage, studies
   rotated every 10^4 trials), per window of 10^4 trials.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from dse import pareto  # noqa: E402
from dse.build.space import load_space  # noqa: E402
from dse.search import store
from dse.search.driver import (
    plan,
    run_space,  # noqa: E402
)
from dse.search.optuna import strategy as optuna_strategy

ROOT = Path(__file__).resolve().parents[2]


def _space(text: str) -> object:
    p = Path(tempfile.mkdtemp()) / "bench.toml"
    p.write_text(text)
    return load_space(str(p))


def big_space():
    t = (ROOT / "spaces" / "dense-70b-nodes.toml").read_text()
    t = t.replace("num = 23", "num = 600").replace('"layout.pp" = [1, 2]', '"layout.pp" = [1, 2, 4]')
    return _space(t.replace("[objectives]", '"workload.isl" = [256, 512, 1024, 2048, 4096, 8192, 16384, '
                            '32768]\n"workload.osl" = [128, 512, 2048]\n\n[objectives]'))


def _run(space, strategy: str, **extra) -> Path:
    """One run through the driver, as `dse run` makes it (trials that cover the space enumerate
    it)."""
    return run_space(space, Path(tempfile.mkdtemp()) / strategy, strategy=strategy,
                     trials=extra.get("trials"), seed=extra.get("seed", 0),
                     sampler=extra.get("sampler"), population=extra.get("population"),
                     chunk_designs=262144, progress=False)


def bench_exhaustive():
    space = big_space()
    space.batch(np.arange(100))
    t0, c0 = time.perf_counter(), time.process_time()
    d = _run(space, "exhaustive")
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    st = store.status(d)
    print(f"exhaustive: {st['designs_scored']:,} designs in {dt:.2f} s wall, {dc:.2f} s CPU = "
          f"{st['designs_scored'] / dt:,.0f} designs/s wall, {st['designs_scored'] / dc:,.0f} per "
          f"CPU-second, including the Pareto archive and the Parquet score tables (front "
          f"{st['front_size']}; target 1,000,000/s on one core)")


CHIP_SPACE = """name = "hypothetical-chip-bench"
question = "Which mix of FLOP/s, HBM bandwidth and capacity and NVLink bandwidth, priced by the \
component cost model, serves DeepSeek-V3 best? 500 chip points x 72 layouts and batches."
[accelerator]
id = "b200"
[topology]
id = "nvl72"
[model]
id = "deepseek-v3"
weight_dtype = "fp4"
[layout]
tp = 1
[cost]
capex_model = "components"
[workload]
isl = 4096
osl = 1024
[parameters]
"accelerator.peak_flops_per_s.fp4" = { scale = [0.5, 0.7, 1.0, 1.4, 2.0] }
"accelerator.hbm_bw_bytes_per_s" = { scale = [0.5, 0.7, 1.0, 1.4, 2.0] }
"accelerator.hbm_capacity_bytes" = { scale = [0.5, 0.75, 1.0, 1.5, 2.0] }
"topology.scaleup.link_bw_bytes_per_s" = { scale = [0.5, 1.0, 2.0, 4.0] }
"layout.ep" = [16, 32, 64]
"layout.dp" = [16, 32, 64]
"workload.concurrency" = { low = 256, high = 32768, num = 8, log = true }
[objectives]
usd_per_mtok_output = "minimize"
output_tokens_per_s_per_user = "maximize"
[constraints]
ttft_s = { max = 5.0 }
"""


def _quality(space, runs_spec, seeds) -> None:
    """Hypervolume each strategy reaches with its budget, as a share of the exact front's
    (one reference point for all); mean and worst over seeds."""
    exact = store.read_front(_run(space, "exhaustive"))
    ref, scale = pareto.reference(pareto.objective_matrix(exact, space.objectives))
    hv_exact = pareto.hypervolume(pareto.objective_matrix(exact, space.objectives), ref, scale)
    outer, _ = optuna_strategy.split_parameters(space, True)
    points = int(np.prod([space.shape[i] for i in outer]))
    print(f"quality on {space.name}: {space.size:,} designs ({points:,} hardware/model points x "
          f"{space.size // points:,} layouts and batches), exact front {len(exact)} designs")
    for name, strategy, sampler, trials, pop in runs_spec:
        shares, n = [], 0
        for seed in range(seeds):
            d = _run(space, strategy, sampler=sampler, trials=trials, population=pop, seed=seed)
            f = store.read_front(d)
            n = store.status(d)["designs_scored"]
            shares.append(pareto.hypervolume(pareto.objective_matrix(f, space.objectives), ref,
                                             scale) / hv_exact if len(f) else 0.0)
        print(f"  {name:<14} {n:6,} designs scored ({n / space.size:5.1%} of the space): "
              f"hypervolume {np.mean(shares):.4f} of the exact front (worst {np.min(shares):.4f}, "
              f"{seeds} seeds; target >= 0.99 with <= 5%)")


QUICK_MAX_DESIGNS = 10_000   # --quick: the shipped spaces up to this size (a few minutes in all)


def bench_shipped(seeds: int = 5, names=None, quick: bool = False) -> None:
    """Every shipped space (spaces/*.toml): the hypervolume `dse run --strategy optuna` reaches
    with its default sampler and population and 5% of the space's designs as trials, as a
    share of the exact front's, mean and worst over seeds (target >= 0.98 both). Every design
    the run scored counts: the share of the space scored is printed."""
    print(f"optuna defaults with 5% of the evaluations, {seeds} seeds (TPE at population "
          f"{optuna_strategy.DEFAULT_POPULATION['optuna']}, its first max(2, trials/50) <= 10 "
          f"trials random; NSGA-II at population {optuna_strategy.LONG_RUN[1]} beyond "
          f"{optuna_strategy.TPE_MAX_TRIALS:,} trials; runs of at most "
          f"{optuna_strategy.SHORT_RUN_TRIALS} trials: {optuna_strategy.SHORT_RUN_START} pairs-covering "
          f"designs, then one at a time the additive surrogate's proposal):", flush=True)
    for f in sorted((ROOT / "spaces").glob("*.toml")):
        if names and f.stem not in names:
            continue
        space = load_space(str(f))
        if quick and not names and space.size > QUICK_MAX_DESIGNS:
            print(f"  {f.stem:<26} {space.size:7,} designs: skipped (--quick measures spaces of "
                  f"up to {QUICK_MAX_DESIGNS:,})", flush=True)
            continue
        trials = max(int(0.05 * space.size), 1)
        p = plan(space, "optuna", trials, None, None, None, None)
        exact = store.read_front(_run(space, "exhaustive"))
        Fe = pareto.objective_matrix(exact, space.objectives)
        ref, scale = pareto.reference(Fe)
        hv = pareto.hypervolume(Fe, ref, scale)
        shares, scored, t0 = [], 0, time.perf_counter()
        for seed in range(seeds):
            d = _run(space, "optuna", trials=trials, seed=seed)
            scored = max(scored, store.status(d)["designs_scored"])
            fr = store.read_front(d)
            shares.append(pareto.hypervolume(pareto.objective_matrix(fr, space.objectives), ref,
                                             scale) / hv if len(fr) else 0.0)
        how = (f"{p['sampler']} population {p['population']}, polish "
               f"{p['polish_share']:.0%}" if p.get("polish_share") else
               "additive surrogate" if p.get("local_model") == "additive" else
               "local search" if p.get("local_share") == 1.0 else
               f"{p['sampler']} population {p['population']}")
        print(f"  {f.stem:<26} {space.size:7,} designs, {trials:5,} trials ({how}; at most "
              f"{scored / space.size:.1%} of the space scored): hypervolume "
              f"{np.mean(shares):.4f} of the exact front (worst {np.min(shares):.4f}; "
              f"{(time.perf_counter() - t0) / seeds:.1f} s a run)",
              flush=True)


def bench_quality(seeds: int = 5):
    space = load_space(str(ROOT / "spaces" / "dense-70b-nodes.toml"))
    budget = int(0.05 * space.size)
    _quality(space, (("optuna nsga2", "optuna", "nsga2", budget, 24),
                     ("optuna tpe", "optuna", "tpe", min(budget, 400), None)), seeds)
    chip = _space(CHIP_SPACE)
    outer, _ = optuna_strategy.split_parameters(chip, True)
    inner = chip.size // int(np.prod([chip.shape[i] for i in outer]))
    budget = int(0.05 * chip.size)
    _quality(chip, (("nested tpe", "nested", "tpe", budget // inner, 1),
                    ("optuna nsga2", "optuna", "nsga2", budget, 24)), seeds)


def bench_optuna_rate(trials: int):
    """The optuna strategy as users run it (journal storage in the run folder, batches of 100,
    studies rotated every 10^4 trials), timed per window of 10^4 trials, on a space of 2.9 M
    designs: a run never scores a design twice, so on dense-70b-nodes (5,280 designs) the
    trials past the space's size would be repeats told back, not trials scored."""
    space = big_space()
    window = min(10_000, trials)
    d = store.new_run_dir(space.name, str(Path(tempfile.mkdtemp()) / "rate"))
    m = store.create(d, space, "optuna", 0, {"sampler": "nsga2", "population": 100,
                                             "study_name": d.name, "trials": trials,
                                             "segment_trials": optuna_strategy.SEGMENT_TRIALS})
    rates, cpu_rates = [], []
    while store.status(d)["trials_completed"] < trials:
        t0, c0 = time.perf_counter(), time.process_time()
        before = store.status(d)["trials_completed"]
        optuna_strategy.run(space, d, m, max_trials=window, budget_s=None, progress=False)
        n = store.status(d)["trials_completed"] - before
        if n == 0:        # the space is spent (or the run stopped): nothing more to time
            break
        rates.append(n / (time.perf_counter() - t0))
        cpu_rates.append(n / max(time.process_time() - c0, 1e-9))
        print(f"  window {len(rates)}: trials {before:,}-{before + n:,}: {rates[-1]:,.1f} "
              f"trials/s wall, {cpu_rates[-1]:,.1f} per CPU-second", flush=True)
    print(f"optuna nsga2 (journal storage, batches of 100, studies of "
          f"{optuna_strategy.SEGMENT_TRIALS:,}): {trials:,} trials; trials/s per window of "
          f"{window:,}: " + ", ".join(f"{r:,.0f}" for r in rates)
          + (f"; last/first = {rates[-1] / rates[0]:.2f} wall, "
             f"{cpu_rates[-1] / cpu_rates[0]:.2f} per CPU-second (the machine is shared: CPU time "
             f"is the measure of the search itself; target >= 0.5)" if len(rates) > 1 else ""))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dse.search.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=20_000, help="trials for the Optuna rate check")
    p.add_argument("--skip", nargs="*", default=[],
                   choices=["exhaustive", "shipped", "quality", "optuna"])
    p.add_argument("--spaces", nargs="*", help="shipped spaces to measure (default: all)")
    p.add_argument("--seeds", type=int, default=5, help="seeds per strategy in the quality check")
    p.add_argument("--quick", action="store_true",
                   help=f"shipped spaces of up to {QUICK_MAX_DESIGNS:,} designs only (CI)")
    a = p.parse_args(argv)
    if "exhaustive" not in a.skip:
        bench_exhaustive()
    if "shipped" not in a.skip:
        bench_shipped(a.seeds, a.spaces, a.quick)
    if "quality" not in a.skip:
        bench_quality(a.seeds)
    if "optuna" not in a.skip:
        bench_optuna_rate(a.trials)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
