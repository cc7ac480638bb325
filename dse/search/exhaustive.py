"""The exhaustive strategy: stream the whole space through the scorer in chunks.

Each chunk (a contiguous range of flat indices of the space: one *trial*, resumable and
shardable) is scored in one call, reduced to its admissible non-dominated designs, stored as a
Parquet score table, and merged into the running Pareto archive. Memory stays O(chunk + front)
whatever the space's size; the front is exact.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from dse import pareto, runs
from dse.perf import score_chunked

CHUNK_DESIGNS = 65536
SAVE_EVERY_S = 1.0     # front.csv and progress.json are rewritten at most this often (and at the end)
KEEP_METRICS = ("ttft_s", "tpot_s", "output_tokens_per_s_per_chip", "output_tokens_per_s_per_rack",
                "usd_per_mtok_output", "usd_per_mtok_input", "num_chips", "bound")


def _chunk_file(d: Path, i: int) -> Path:
    return d / "scores" / f"chunk-{i:08d}.parquet"


def score_chunk(space, i: int, chunk: int) -> tuple[pd.DataFrame, int]:
    """The admissible, non-dominated designs of chunk ``i`` and how many designs it scored."""
    lo, hi = i * chunk, min((i + 1) * chunk, space.size)
    idx = np.arange(lo, hi, dtype=np.int64)
    distinct, rows, direct, _ = space.batch_parts(idx)
    names = {o.metric for o in space.objectives} | {c.metric for c in space.constraints}
    s = score_chunked(distinct, dtype=np.float32, rows=rows, direct=direct,
                      metrics=sorted(names | set(KEEP_METRICS) | {"feasible"}))
    ok = pareto.admissible(s, space.objectives, space.constraints)
    F = pareto.objective_matrix(s, space.objectives)[ok]
    keep = np.flatnonzero(ok)[pareto.nondominated(F)]
    table = pd.DataFrame({"design_id": idx[keep]})
    for p, v in space.values_at(idx[keep]).items():
        table[p] = v
    for m in sorted(names | set(KEEP_METRICS)):
        v = s[m][keep]
        table[m] = v.astype(np.float64) if v.dtype.kind == "f" else v
    return table, hi - lo


def run(space, d: Path, manifest: dict, *, max_trials: int | None, budget_s: float | None,
        progress: bool = True) -> dict:
    chunk = int(manifest.get("chunk_designs", CHUNK_DESIGNS))
    n_chunks = -(-space.size // chunk)
    runs.remove_stale_tmp(d)                         # a chunk a killed process was writing
    done = {int(f.stem.split("-")[1]) for f in (d / "scores").glob("chunk-*.parquet")}
    elapsed0 = float(runs.read_progress(d).get("elapsed_s", 0.0))
    # the front from the durable score tables (a corrupt one is refused, naming it)
    front = pareto.front_of([runs.read_table(_chunk_file(d, i)) for i in sorted(done)],
                            space.objectives)
    designs = sum(min((i + 1) * chunk, space.size) - i * chunk for i in done)
    todo = [i for i in range(n_chunks) if i not in done]
    if max_trials is not None:
        todo = todo[:max_trials]
    t0 = time.monotonic()
    hv = None

    def hypervolume():
        nonlocal hv
        ref = manifest.get("reference")
        if ref is not None and len(front):
            hv = pareto.hypervolume(pareto.objective_matrix(front, space.objectives),
                                    np.array(ref["point"]), np.array(ref["scale"]))

    def save(state):
        hypervolume()
        runs.write_front(d, front, space.objectives, [p.path for p in space.parameters])
        runs.write_json(d / "progress.json", {
            "state": state, "trials_completed": len(done), "trials_failed": 0,
            "trials_total": n_chunks, "designs_scored": designs,
            "elapsed_s": elapsed0 + time.monotonic() - t0, "front_size": len(front),
            "hypervolume": hv})

    with runs.Working(d, progress, total=space.size, initial=designs, unit="design",
                      unit_scale=True, desc="exhaustive") as work:
        try:
            save("running")
            saved = time.monotonic()
            for i in todo:
                if work.stop or (budget_s is not None and time.monotonic() - t0 >= budget_s):
                    break
                table, n = score_chunk(space, i, chunk)
                # the chunk is done once its table is on disk (written whole, then renamed)
                runs.atomic_save(_chunk_file(d, i), lambda p: table.to_parquet(p, index=False))
                done.add(i)
                designs += n
                front = pareto.front_of([front, table], space.objectives)
                runs.fix_reference(manifest, d, pareto.objective_matrix(front, space.objectives)
                                   if len(front) else [])
                if time.monotonic() - saved >= SAVE_EVERY_S:   # front.csv, progress.json
                    save("running")
                    saved = time.monotonic()
                else:
                    hypervolume()                              # for the progress bar
                work.update(n, len(front), hv)
            save("finished" if len(done) == n_chunks else "stopped")
        except BaseException:
            save("failed" if not work.stop else "stopped")
            raise
    return runs.status(d)
