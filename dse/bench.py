"""Benchmarks that print figures (speed is checked here, not in unit tests).

    python -m dse.bench                 # builder and scorer on the two spaces, predict on 200k cases
    python -m dse.bench --designs 2e6 --cases 0
    python -m dse.bench --only builder

1. builder: designs built from the catalog per second, the scorer's rate on them and both
   together, as the search builds them (``Space.batch_parts`` in chunks of 65,536 designs, scored
   in float32) on (a) a catalog grid like spaces/quickstart.toml (catalog ids, dtypes, runtimes,
   KV dtypes, layouts, prompt lengths and batch sizes: 1,165,824 designs) and (b) a hypothetical-chip sweep where every design is
   a distinct hardware point (FP4 FLOP/s x HBM bandwidth x HBM capacity x NVLink bandwidth, 32
   scale factors each: 1,048,576 chips); best and first (cold: graph reductions, grid resolution)
   of three passes, wall and CPU time; then the validated DataFrame path that ``dse predict`` and
   ``dse eval`` use (``resolve`` + ``to_batch``);
2. scorer: the full serving model on random but valid designs (every catalog accelerator and
   model, layouts, workloads), every design distinct: prefill, decode, memory fit and cost;
   headline: the search's path (chunks built in float32 from their resolved rows, then scored
   in float32), then the scorer alone (held in float32; float64 converted chunk by chunk;
   float64);
   then the same designs with every serving mechanism of issue 11 on (speculative decoding,
   expert imbalance, length distributions, a KV tier, a shared prefix, fp4 experts) and, on
   20,000 of them, at a request rate with p90 SLOs (queueing, percentiles, goodput);
3. train: the training scorer (``dse.scoring.train_space``) as the search runs it, on a grid of
   chips, dense and MoE models, precisions and training layouts, and on an all-valid dense and
   an all-valid MoE grid (designs per CPU-second);
4. predict: CSV to CSV end to end.

Everything runs on one core (OMP/BLAS threads pinned to 1); the scorer's rate is in CPU time
(best of three: the machines are shared, so wall time measures the neighbours).
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
from dse.build.designs import resolve, to_batch  # noqa: E402
from dse.build.resolved import Resolved
from dse.build.space import load_space
from dse.perf import score, score_chunked  # noqa: E402
from dse.scoring import train_space  # noqa: E402
from dse.scoring.predict import predict_file

# every figure printed, for ``--json`` (reports/bench/bench.json: the docs' speed page reads it)
RESULTS: list[dict] = []


def _record(key: str, what: str, n: int, rate: str, **numbers) -> None:
    RESULTS.append({"key": key, "what": what, "n": int(n), "rate": rate, **numbers})


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


def _search_path(res, n: int, chunk: int) -> tuple[float, float, float]:
    """Designs ``i % len(res)`` built from their resolved rows in float32 chunk by chunk, as
    the search builds them (``Space.batch_parts``: ``Resolved`` rows -> compact columns ->
    ``to_batch(dtype=np.float32)``), and scored in float32: (build, score) CPU seconds and
    the feasible share."""
    build = score_s = 0.0
    feasible = 0
    for lo in range(0, n, chunk):
        rows = np.arange(lo, min(lo + chunk, n), dtype=np.int64) % len(res)
        t0 = time.process_time()
        b = to_batch(res.take(rows).compact(np.arange(len(rows))), compact=True,
                     dtype=np.float32)
        t1 = time.process_time()
        b = b.replace(expert_imbalance=np.ones(len(b)))   # every mechanism off (see below)
        t2 = time.process_time()
        out = score_chunked(b, dtype=np.float32)
        t3 = time.process_time()
        build, score_s = build + t1 - t0, score_s + t3 - t2
        feasible += int(np.sum(out["feasible"]))
        del out
    return build, score_s, feasible / n


def bench_scorer(n: int) -> None:
    base = random_designs(min(n, 200_000))
    res = Resolved(resolve(base))
    batch = to_batch(res.compact(np.arange(len(res))))
    reps = int(np.ceil(n / len(base)))
    batch = batch.take(np.tile(np.arange(len(base)), reps)[:n])
    # every mechanism off: the MoE designs' published default expert imbalance too (1 = balanced)
    batch = batch.replace(expert_imbalance=np.ones(len(batch)))
    score(batch.take(slice(0, 1000)))  # warm-up
    # the headline: the search's own path, each chunk of 65,536 designs built in float32 from
    # its resolved rows (the catalog resolution is done once per distinct combination and
    # cached by the search, so it is not timed) and scored in float32
    best = None
    for _ in range(3):
        r = _search_path(res, n, CHUNK)
        if best is None or r[0] + r[1] < best[0] + best[1]:
            best = r
    build, score_s, feas = best
    print(f"scorer on the search's path (chunks of {CHUNK:,} designs built in float32 from "
          f"their resolved rows, then scored in float32): {n:,} designs in {build + score_s:.3f} "
          f"CPU-s = {n / (build + score_s):,.0f} designs per CPU-second on one core, built and "
          f"scored (build {n / build:,.0f}/CPU-s, score {n / score_s:,.0f}/CPU-s; decode, "
          f"prompt and TTFT steps, memory fit, cost; {feas:.0%} feasible)")
    _record("search_path",
            "scorer on the search's path: random catalog designs (every accelerator, model, "
            "dtype and layout mixed in each chunk), built in float32 from their resolved rows "
            "and scored", n, f"{n / (build + score_s) / 1e6:.2f} M designs per CPU-second (build "
            f"{n / build / 1e6:.2f} M, score {n / score_s / 1e6:.2f} M)",
            per_cpu_s=n / (build + score_s), build_per_cpu_s=n / build,
            score_per_cpu_s=n / score_s, feasible=feas)
    # the scorer alone: on the batch held in float32 (as the builder now emits it), on the
    # float64 batch converted chunk by chunk (what a float64 caller pays), and in float64
    batch32 = batch.astype(np.float32)
    runs = ((np.float32, "float32, alone, on the batch held in float32", batch32, "float32"),
            (np.float32, "float32 from the float64 batch, converted chunk by chunk", batch,
             "float32_from_float64"),
            (np.float64, "float64, as eval and predict use it", batch, "float64"))
    for dtype, label, held, key in runs:
        best = np.inf
        for _ in range(3):
            t0 = time.process_time()       # CPU time: the machines here are shared
            out = score_chunked(held, dtype=dtype)
            best = min(best, time.process_time() - t0)
        feas = float(np.mean(out["feasible"]))
        del out
        print(f"scorer ({label}): {n:,} designs in {best:.3f} CPU-s = {n / best:,.0f} designs "
              f"per CPU-second on one core ({feas:.0%} feasible)")
        _record(key, f"scorer, {label}", n, f"{n / best / 1e6:.2f} M designs per CPU-second",
                per_cpu_s=n / best, feasible=feas)
    bench_mechanisms(batch32, batch)


# the serving mechanisms of issue 11 switched on for every design (dse/perf/spec.py,
# imbalance.py, lengths.py, kvtier.py; queueing.py separately: it finds three roots in
# concurrency a design, ~17 points of the steps and one of the whole model)
MECHANISMS = {"spec_tokens": 2.0, "spec_acceptance": 0.8, "spec_mtp_layers": 1.0,
              "expert_imbalance": 1.3, "redundant_experts": 8.0, "isl_cv": 0.5, "osl_cv": 1.0,
              "tier_bytes": 250e9, "tier_bw_bytes_per_s": 64e9, "prefix_tokens": 64.0,
              "prefix_hit_fraction": 0.5, "cached_conversations": 256.0,
              "expert_weight_bytes": 0.5625}
QUEUEING = {"request_rate_per_s": 2.0, "ttft_slo_s": 2.0, "tpot_slo_s": 0.05}


def bench_mechanisms(batch, batch64) -> None:
    """``batch`` in float32 (scored in float32), ``batch64`` the same designs in float64."""
    n = len(batch)
    on = batch.replace(**MECHANISMS)
    best = np.inf
    for _ in range(2):
        t0 = time.process_time()       # CPU time: the machines here are shared
        score_chunked(on, dtype=np.float32)
        best = min(best, time.process_time() - t0)
    print(f"scorer with speculative decoding, expert imbalance, length distributions, a KV "
          f"tier, a shared prefix and fp4 experts on (float32): {n / best:,.0f} designs per "
          f"CPU-second")
    _record("mechanisms",
            "scorer with every serving mechanism on (speculative decoding, expert imbalance, "
            "length distributions, a KV tier, a shared prefix, fp4 experts; float32)", n,
            f"{n / best / 1e6:.2f} M designs per CPU-second", per_cpu_s=n / best)
    m = min(n, 20_000)
    q = batch64.take(slice(0, m)).replace(**MECHANISMS, **QUEUEING)
    dt = np.inf
    for _ in range(3):                 # best of three calls, as the builder's passes
        t0 = time.process_time()
        out = score_chunked(q, dtype=np.float64)
        dt = min(dt, time.process_time() - t0)
    good = float(np.mean(np.isfinite(out["goodput_requests_per_s_per_chip"])))
    print(f"scorer at a request rate with p90 SLOs (queueing, percentiles, goodput; float64): "
          f"{m / dt:,.0f} designs per CPU-second, best of 3 calls ({good:.0%} with a goodput)")
    _record("queueing",
            "scorer at a request rate with p90 SLOs (queueing, percentiles and goodput: ~100 "
            "scorings per design; float64, as eval and predict use it; best of 3 calls)", m,
            f"{m / dt:,.0f} designs per CPU-second",
            per_cpu_s=m / dt)
    # the same designs in the dtype both search strategies score in (optuna.run and
    # exhaustive: score_chunked(..., dtype=np.float32))
    q32 = batch.take(slice(0, m)).replace(**MECHANISMS, **QUEUEING)
    dt32 = np.inf
    for _ in range(3):
        t0 = time.process_time()
        score_chunked(q32, dtype=np.float32)
        dt32 = min(dt32, time.process_time() - t0)
    print(f"the same at a request rate in float32, as the search scores it: "
          f"{m / dt32:,.0f} designs per CPU-second, best of 3 calls")
    _record("queueing_float32",
            "the same at a request rate in float32, as both search strategies score it "
            "(best of 3 calls)", m, f"{m / dt32:,.0f} designs per CPU-second",
            per_cpu_s=m / dt32)


CATALOG_GRID = """name = "bench-catalog-grid"
[accelerator]
id = "h100-sxm"
[model]
id = "llama-3.1-70b"
[workload]
isl = 2048
osl = 256
[parameters]
"accelerator.id" = ["a100-sxm-80g", "h100-sxm", "h200-sxm", "b200", "b300", "gb200", "mi300x",
                    "mi355x", "tpu-v6e", "gaudi3", "l40s"]
"model.id" = ["llama-3.1-70b", "llama-3.1-8b", "mixtral-8x7b", "qwen3-30b-a3b"]
"model.weight_dtype" = ["bf16", "fp8", "fp4"]
"serving.runtime" = ["trtllm", "sglang", "vllm"]
"layout.tp" = [1, 2, 4, 8]
"layout.dp" = [1, 2, 4, 8]
"model.kv_dtype" = ["", "fp8"]
"workload.concurrency" = { low = 1, high = 2048, num = 24, log = true }
"workload.isl" = [1024, 2048, 4096, 8192]
[objectives]
usd_per_mtok_output = "minimize"
"""

_FACTORS = "{ scale = [" + ", ".join(f"{v:.4f}" for v in np.linspace(0.5, 2.0, 32)) + "] }"
CHIP_SWEEP = f"""name = "bench-chip-sweep"
[accelerator]
id = "b200"
[topology]
id = "nvl72"
[model]
id = "deepseek-v3"
weight_dtype = "fp4"
[layout]
tp = 1
dp = 64
ep = 64
[cost]
capex_model = "components"
[workload]
isl = 4096
osl = 1024
concurrency = 1024
[parameters]
"accelerator.peak_flops_per_s.fp4" = {_FACTORS}
"accelerator.hbm_bw_bytes_per_s" = {_FACTORS}
"accelerator.hbm_capacity_bytes" = {_FACTORS}
"topology.scaleup.link_bw_bytes_per_s" = {_FACTORS}
[objectives]
usd_per_mtok_output = "minimize"
"""
CHUNK = 65536     # designs per chunk, as the exhaustive strategy builds them


def _timed(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def bench_builder(label: str, text: str, limit: int | None = None, passes: int = 3,
                  key: str = "builder") -> None:
    """Build (and score) every design of a space in chunks, as the exhaustive search does."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "space.toml")
        with open(path, "w") as f:
            f.write(text)
        space = load_space(path)
    n = min(space.size, limit or space.size)
    chunks = [np.arange(lo, min(lo + CHUNK, n), dtype=np.int64) for lo in range(0, n, CHUNK)]
    runs = []
    for _ in range(passes):
        build = score_s = 0.0
        build_cpu = score_cpu = 0.0
        feasible = 0
        for idx in chunks:
            (distinct, rows, direct, _), w, c = _timed(lambda: space.batch_parts(idx, np.float32))
            build, build_cpu = build + w, build_cpu + c
            s, w, c = _timed(lambda: score_chunked(distinct, dtype=np.float32, rows=rows,
                                                   direct=direct))
            score_s, score_cpu = score_s + w, score_cpu + c
            feasible += int(np.sum(s["feasible"]))
        runs.append((build, build_cpu, score_s, score_cpu, feasible))
    best = min(runs, key=lambda r: r[0] + r[2])
    first = runs[0]
    rate = lambda t: f"{n / t / 1e6:.2f} M/s"  # noqa: E731
    print(f"builder, {label}: {n:,} designs in chunks of {CHUNK:,} ({best[4] / n:.0%} feasible), "
          f"best of {passes} passes: build {rate(best[0])} ({rate(best[1])} per CPU-second), "
          f"score {rate(best[2])} ({rate(best[3])}), build+score {rate(best[0] + best[2])} "
          f"({rate(best[1] + best[3])}); first pass build {rate(first[0])}, build+score "
          f"{rate(first[0] + first[2])}")
    cpu = lambda t: f"{n / t / 1e6:.2f} M"  # noqa: E731
    _record(key, f"builder + scorer, {label}, as the search builds it (chunks of {CHUNK:,}, "
            "float32)", n,
            f"build {cpu(best[1])}, score {cpu(best[3])}, both {cpu(best[1] + best[3])} "
            "designs per CPU-second", per_cpu_s=n / (best[1] + best[3]),
            build_per_cpu_s=n / best[1], score_per_cpu_s=n / best[3])


def _train_space(seq_len: int, parameters: str) -> str:
    """A training space of ``parameters`` (its [parameters] lines) for the training benchmark:
    15T tokens at a global batch of 1,024 sequences, time and cost minimised."""
    return (f'task = "train"\n[training]\ntokens = 15e12\nglobal_batch_seqs = 1024\n'
            f'seq_len = {seq_len}\n[parameters]\n{parameters}[objectives]\n'
            'train_time_s = "minimize"\ntrain_cost_usd = "minimize"\n')


TRAIN_GRID = _train_space(8192, """"accelerator.id" = ["a100-sxm-80g", "h100-sxm", "b200", "gb200"]
"model.id" = ["llama-3.1-70b", "llama-3.1-405b", "deepseek-v3"]
"training.precision" = ["bf16", "fp8"]
"layout.tp" = [1, 2, 4, 8]
"layout.pp" = [1, 4, 8, 16]
"layout.dp" = [8, 16, 32, 64, 128, 256]
"layout.cp" = [1, 2]
"layout.ep" = [1, 8]
"layout.micro_batch_seqs" = [1, 2, 4]
"layout.recompute" = ["none", "selective", "full"]
"layout.zero_stage" = [1, 3]
"layout.pipeline_schedule" = ["1f1b", "interleaved"]
"layout.vp" = [1, 2]
""")
# all-valid grids: every design a layout the model takes (the search's typical slice once a
# space names its models), dense and MoE apart -- the MoE scorer runs the expert terms
TRAIN_DENSE = _train_space(8192, """"accelerator.id" = ["a100-sxm-80g", "h100-sxm", "b200", "gb200"]
"model.id" = ["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b"]
"training.precision" = ["bf16", "fp8"]
"layout.tp" = [1, 2, 4, 8]
"layout.pp" = [1, 2, 4, 8]
"layout.dp" = [8, 16, 32, 64, 128, 256]
"layout.cp" = [1, 2]
"layout.micro_batch_seqs" = [1, 2, 4]
"layout.recompute" = ["none", "selective", "full"]
"layout.zero_stage" = [1, 3]
""")
TRAIN_MOE = _train_space(4096, """"accelerator.id" = ["h100-sxm", "h800-sxm", "b200", "gb200"]
"model.id" = ["deepseek-v3", "qwen3-235b-a22b", "gpt-oss-120b", "qwen3-30b-a3b"]
"training.precision" = ["bf16", "fp8"]
"layout.tp" = [1, 2, 4, 8]
"layout.pp" = [1, 4, 8]
"layout.dp" = [64, 128, 256]
"layout.cp" = [1, 2]
"layout.ep" = [8, 16, 32, 64]
"layout.micro_batch_seqs" = [1, 2, 4]
"layout.recompute" = ["none", "selective", "full"]
""")
TRAIN_GRIDS = (("train", TRAIN_GRID,
                ("4 chips x 3 models (dense and MoE) x 2 precisions x layouts, most of them "
                 "invalid")),
               ("train_dense", TRAIN_DENSE,
                ("all-valid dense grid: 4 chips x Llama-3.1 8B, 70B, 405B x 2 precisions x "
                 "layouts")),
               ("train_moe", TRAIN_MOE,
                ("all-valid MoE grid: 4 chips x DeepSeek-V3, Qwen3-235B, gpt-oss-120b, "
                 "Qwen3-30B x 2 precisions x layouts, ep 8 to 64")))


def bench_train(limit: int = 1 << 20, passes: int = 3) -> None:
    """The training scorer as the search runs it (``dse.scoring.train_space.score_index``:
    each chunk's designs built from their grid codes, scored in float32) on three grids
    (``TRAIN_GRIDS``): (a) 4 chips x 3 models (dense and MoE) x 2 precisions x layouts (tp, pp,
    dp, cp, ep, micro-batch, recompute, ZeRO, schedule, vp): 663,552 designs, the first
    ``limit`` scored; a layout the model cannot take (71% of them: ep on a dense model, vp
    without interleaving, ...) is flagged without scoring, as in a search; (b) an all-valid
    dense grid (82,944 designs) and (c) an all-valid MoE grid (82,944: every design runs the
    expert-parallel terms); each design is scored whether or not it fits in memory."""
    for key, grid, label in TRAIN_GRIDS:
        _bench_train_grid(key, grid, label, limit, passes)


def _bench_train_grid(key: str, grid: str, label: str, limit: int, passes: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "space.toml")
        with open(path, "w") as f:
            f.write(grid)
        space = load_space(path)
    n = min(space.size, limit)
    chunks = [np.arange(lo, min(lo + CHUNK, n), dtype=np.int64) for lo in range(0, n, CHUNK)]
    metrics = ["train_time_s", "train_cost_usd", "feasible", "reason"]
    runs = []
    layout = sum(1 << k for k in range(20)) & ~(train_space.MEMORY_BIT | 512)
    for _ in range(passes):
        wall = cpu = 0.0
        feasible = invalid = 0
        for idx in chunks:
            s, w, c = _timed(lambda: train_space.score_index(space, idx, metrics=metrics))
            wall, cpu, feasible = wall + w, cpu + c, feasible + int(np.sum(s["feasible"]))
            invalid += int(np.sum((np.asarray(s["reason"]) & layout) != 0))
        runs.append((wall, cpu, feasible, invalid))
    best = min(runs, key=lambda r: r[1])
    print(f"training scorer ({key}: {label}), build + score as the search runs it: {n:,} designs "
          f"of a grid of {space.size:,} in chunks of {CHUNK:,} ({best[2] / n:.0%} feasible; "
          f"{best[3] / n:.0%} layouts the model cannot take, flagged without scoring), best of "
          f"{passes} passes: {n / best[0] / 1e6:.2f} M designs/s wall, "
          f"{n / best[1] / 1e6:.2f} M per CPU-second (target >= 1 M)")
    _record(key, f"training designs, {label}: build + score as the search runs it (chunks of "
            f"{CHUNK:,}, float32)", n,
            f"{n / best[1] / 1e6:.2f} M designs per CPU-second", per_cpu_s=n / best[1])


def bench_resolve(n: int) -> None:
    base = random_designs(n)
    resolve(base.iloc[:10])
    best, best_cpu = np.inf, np.inf
    for _ in range(3):
        _, w, c = _timed(lambda: to_batch(resolve(base)))
        best, best_cpu = min(best, w), min(best_cpu, c)
    print(f"builder, validated DataFrame path (resolve + to_batch, as predict and eval use it): "
          f"{n:,} random designs in {best:.3f} s = {n / best:,.0f} designs/s "
          f"({n / best_cpu:,.0f} per CPU-second)")
    _record("resolve",
            "validated DataFrame path of `dse predict` / `dse eval` (resolve + to_batch, every "
            "column checked)", n, f"{n / best_cpu / 1e6:.2f} M designs per CPU-second",
            per_cpu_s=n / best_cpu)


def bench_predict(n: int) -> None:
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
    _record("predict", "`dse predict`, cases with fixed layouts, CSV to CSV end to end", n,
            f"{dt:.1f} s wall", wall_s=dt)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dse.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--designs", type=float, default=1e6, help="designs for the scorer benchmark")
    p.add_argument("--cases", type=float, default=2e5, help="cases for the predict benchmark (0: skip)")
    p.add_argument("--only", choices=("builder", "scorer", "train", "predict"),
                   help="run one benchmark")
    p.add_argument("--json", metavar="PATH", help="also write the figures, the machine and the "
                   "commit as JSON (reports/bench/bench.json: `python -m dse.docs` quotes it)")
    a = p.parse_args(argv)
    load = os.getloadavg()[0]
    if a.only in (None, "builder"):
        bench_builder("(a) catalog grid", CATALOG_GRID, key="builder_catalog_grid")
        bench_builder("(b) hypothetical-chip sweep, every design a distinct chip", CHIP_SWEEP,
                      key="builder_chip_sweep")
        bench_resolve(100_000)
    if a.only in (None, "scorer"):
        bench_scorer(int(a.designs))
    if a.only in (None, "train"):
        bench_train()
    if a.cases and a.only in (None, "predict"):
        bench_predict(int(a.cases))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak memory: {rss:,.0f} MB")
    if a.json:
        _write_json(a.json, argv, load, rss)
    return 0


def _write_json(path: str, argv, load: float, rss: float) -> None:
    import datetime as dt
    import json
    import platform
    import subprocess
    import sys
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=os.path.dirname(__file__),
                                check=False).stdout.strip()
    except OSError:
        commit = ""
    args = list(sys.argv[1:] if argv is None else argv)
    doc = {"measured": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
           "command": " ".join(["python -m dse.bench", *args]), "commit": commit,
           "machine": {"cpu": cpu, "cores": os.cpu_count(), "load": round(load, 2),
                       "load_end": round(os.getloadavg()[0], 2),
                       "python": platform.python_version(), "numpy": np.__version__},
           "threads": 1, "peak_memory_mb": round(rss), "results": RESULTS}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
