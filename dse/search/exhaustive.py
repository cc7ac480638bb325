"""The exhaustive strategy: stream the whole space through the scorer in chunks.

Each chunk (a contiguous range of flat indices of the space: one *trial*, resumable and
shardable) is scored in one call, reduced to its admissible non-dominated designs, stored as a
Parquet score table, and merged into the running Pareto archive. Memory stays O(chunk + front)
whatever the space's size; the front is exact.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pandas as pd

from dse import pareto, runs
from dse.perf import score_chunked

CHUNK_DESIGNS = 65536
KEEP_METRICS = ("ttft_s", "tpot_s", "output_tokens_per_s_per_chip", "output_tokens_per_s_per_rack",
                "usd_per_mtok_output", "usd_per_mtok_input", "num_chips", "bound")


def _chunk_file(d: Path, i: int) -> Path:
    return d / "scores" / f"chunk-{i:08d}.parquet"


def score_chunk(space, i: int, chunk: int) -> tuple[pd.DataFrame, int]:
    """The admissible, non-dominated designs of chunk ``i`` and how many designs it scored."""
    lo, hi = i * chunk, min((i + 1) * chunk, space.size)
    idx = np.arange(lo, hi, dtype=np.int64)
    batch, _ = space.batch(idx)
    s = score_chunked(batch, dtype=np.float32)
    ok = pareto.admissible(s, space.objectives, space.constraints)
    F = pareto.objective_matrix(s, space.objectives)[ok]
    keep = np.flatnonzero(ok)[pareto.nondominated(F)]
    table = pd.DataFrame({"design_id": idx[keep]})
    for p, v in space.values_at(idx[keep]).items():
        table[p] = v
    names = {o.metric for o in space.objectives} | {c.metric for c in space.constraints}
    for m in sorted(names | set(KEEP_METRICS)):
        v = s[m][keep]
        table[m] = v.astype(np.float64) if v.dtype.kind == "f" else v
    return table, hi - lo


def run(space, d: Path, manifest: dict, *, max_trials: int | None, budget_s: float | None,
        progress: bool = True) -> dict:
    chunk = int(manifest.get("chunk_designs", CHUNK_DESIGNS))
    n_chunks = -(-space.size // chunk)
    done = {int(f.stem.split("-")[1]) for f in (d / "scores").glob("chunk-*.parquet")}
    prev = runs.read_progress(d)
    elapsed0 = float(prev.get("elapsed_s", 0.0))
    frames = [pd.read_parquet(_chunk_file(d, i)) for i in sorted(done)]
    front = pareto.front_of(frames, space.objectives)
    designs = sum(min((i + 1) * chunk, space.size) - i * chunk for i in done)
    todo = [i for i in range(n_chunks) if i not in done]
    if max_trials is not None:
        todo = todo[:max_trials]
    ref = manifest.get("reference")
    t0 = time.monotonic()
    state = {"stop": False}

    def on_signal(signum, frame):   # Ctrl-C / SIGTERM: finish the chunk at hand, then stop
        state["stop"] = True

    old = [signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)]
    (d / "lock").write_text(str(os.getpid()))
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=space.size, initial=designs, unit="design", unit_scale=True,
                   dynamic_ncols=True, desc="exhaustive", mininterval=0.5)
    hv = None

    def save(st):
        nonlocal hv
        F = pareto.objective_matrix(front, space.objectives) if len(front) else np.zeros((0, 1))
        if ref is not None and len(front):
            hv = pareto.hypervolume(F, np.array(ref["point"]), np.array(ref["scale"]))
        runs.write_front(d, front, space.objectives, [p.path for p in space.parameters])
        runs.write_json(d / "progress.json", {
            "state": st, "trials_completed": len(done), "trials_failed": 0,
            "trials_total": n_chunks, "designs_scored": designs,
            "elapsed_s": elapsed0 + time.monotonic() - t0, "front_size": len(front),
            "hypervolume": hv})

    try:
        save("running")
        for i in todo:
            if state["stop"] or (budget_s is not None and time.monotonic() - t0 >= budget_s):
                break
            table, n = score_chunk(space, i, chunk)
            tmp = _chunk_file(d, i).with_suffix(".parquet.tmp")
            table.to_parquet(tmp, index=False)
            os.replace(tmp, _chunk_file(d, i))     # the chunk is done once its table is on disk
            done.add(i)
            designs += n
            front = pareto.front_of([front, table], space.objectives)
            if ref is None and len(front):
                point, scale = pareto.reference(pareto.objective_matrix(front, space.objectives))
                ref = {"point": point.tolist(), "scale": scale.tolist()}
                manifest["reference"] = ref
                runs.write_json(d / "manifest.json", manifest)
            save("running")
            if bar:
                bar.update(n)
                bar.set_postfix(front=len(front), hv=f"{hv:.4g}" if hv is not None else "-")
        finished = len(done) == n_chunks
        save("finished" if finished else "stopped")
    except BaseException:
        save("failed" if not state["stop"] else "stopped")
        raise
    finally:
        if bar:
            bar.close()
        for s, h in zip((signal.SIGINT, signal.SIGTERM), old):
            signal.signal(s, h)
        try:
            (d / "lock").unlink()
        except FileNotFoundError:
            pass
    return runs.status(d)
