"""Benchmarks that print figures (speed is checked here, not in unit tests).

    python -m dse.bench                 # scorer throughput at 10^6 designs, predict on 200k cases
    python -m dse.bench --designs 2e6 --cases 0

The scorer benchmark builds a struct of arrays of random but valid designs (every catalog
accelerator and model, layouts, workloads) and times the full serving model: prefill, decode,
memory fit and cost, on one core (OMP/BLAS threads pinned to 1), in CPU time (best of three:
the machines are shared, so wall time measures the neighbours).
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import resource  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from dse import catalog  # noqa: E402
from dse.build import resolve, to_batch  # noqa: E402
from dse.perf import score, score_chunked  # noqa: E402


def random_designs(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    accs = list(catalog.accelerators())
    models = list(catalog.models())
    tp = rng.choice([1, 2, 4, 8], n)
    return pd.DataFrame({
        "accelerator.id": rng.choice(accs, n), "model.id": rng.choice(models, n),
        "model.weight_dtype": rng.choice(["bf16", "fp8", "fp4"], n),
        "layout.tp": tp, "layout.pp": rng.choice([1, 2], n), "layout.dp": rng.choice([1, 2, 4], n),
        "workload.isl": rng.choice([128, 1024, 4096, 16384], n),
        "workload.osl": rng.choice([128, 512, 2048], n),
        "workload.concurrency": rng.integers(1, 2048, n),
    })


def bench_scorer(n: int) -> None:
    base = random_designs(min(n, 200_000))
    t0 = time.perf_counter()
    batch = to_batch(resolve(base))
    t_build = time.perf_counter() - t0
    reps = int(np.ceil(n / len(base)))
    batch = batch.take(np.tile(np.arange(len(base)), reps)[:n])
    score(batch.take(slice(0, 1000)))  # warm-up
    for dtype, label in ((np.float32, "float32, as the search uses it"),
                         (np.float64, "float64, as eval and predict use it")):
        best = np.inf
        for _ in range(3):
            t0 = time.process_time()       # CPU time: the machines here are shared
            out = score_chunked(batch, dtype=dtype)
            best = min(best, time.process_time() - t0)
        feas = float(np.mean(out["feasible"]))
        print(f"scorer ({label}): {n:,} designs in {best:.3f} CPU-s = {n / best:,.0f} designs "
              f"per CPU-second on one core (decode, prompt and TTFT steps, memory fit, cost; {feas:.0%} feasible)")
    print(f"builder: {len(base):,} designs resolved from the catalog in {t_build:.3f} s "
          f"= {len(base) / t_build:,.0f} designs/s")


def bench_predict(n: int) -> None:
    from dse.predict import predict_file
    d = random_designs(n, seed=1)
    d["layout.tp"] = 8
    chips = d["layout.tp"] * d["layout.pp"] * d["layout.dp"]
    experts = d["model.id"].map(lambda m: catalog.models()[m].num_experts).to_numpy()
    group = (d["layout.tp"] * d["layout.dp"]).to_numpy()
    ep = np.minimum(group, np.maximum(experts, 1))
    ep = np.where(group % ep == 0, ep, 1)
    cases = pd.DataFrame({
        "case_id": [f"c{i}" for i in range(n)], "model": d["model.id"], "hardware": d["accelerator.id"],
        "num_chips": chips, "tp": d["layout.tp"], "pp": d["layout.pp"], "dp": d["layout.dp"],
        "ep": ep, "weight_dtype": d["model.weight_dtype"],
        "isl": d["workload.isl"], "osl": d["workload.osl"], "concurrency": d["workload.concurrency"]})
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "cases.csv"), os.path.join(tmp, "pred.csv")
        cases.to_csv(src, index=False)
        t0 = time.perf_counter()
        predict_file(src, dst)
        dt = time.perf_counter() - t0
    print(f"predict: {n:,} cases with fixed layouts and concurrency, CSV to CSV, in {dt:.2f} s "
          f"end to end (target < 10 s)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dse.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--designs", type=float, default=1e6, help="designs for the scorer benchmark")
    p.add_argument("--cases", type=float, default=2e5, help="cases for the predict benchmark (0: skip)")
    a = p.parse_args(argv)
    bench_scorer(int(a.designs))
    if a.cases:
        bench_predict(int(a.cases))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak memory: {rss:,.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
