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

from dse import pareto
from dse.perf import score_chunked
from dse.scoring import train_space
from dse.search import files, store, tables
from dse.search.loop import Strategy, drive

CHUNK_DESIGNS = 65536
SAVE_EVERY_S = 1.0     # front.csv and progress.json are rewritten at most this often (and at the end)


def score_chunk(space, i: int, chunk: int) -> tuple[pd.DataFrame, int]:
    """The admissible, non-dominated designs of chunk ``i`` and how many designs it scored."""
    lo, hi = i * chunk, min((i + 1) * chunk, space.size)
    idx = np.arange(lo, hi, dtype=np.int64)
    names = {o.metric for o in space.objectives} | {c.metric for c in space.constraints}
    keep_metrics = set(store.keep_metrics(space))
    if space.task == "train":
        s = train_space.score_index(space, idx, metrics=sorted(names | keep_metrics
                                                                | {"feasible"}))
    else:
        distinct, rows, direct, _ = space.batch_parts(idx, dtype=np.float32)   # no conversion
        s = score_chunked(distinct, dtype=np.float32, rows=rows, direct=direct,
                          metrics=sorted(names | keep_metrics | {"feasible"}))
    ok = pareto.admissible(s, space.objectives, space.constraints)
    F = pareto.objective_matrix(s, space.objectives)[ok]
    keep = np.flatnonzero(ok)[pareto.nondominated(F)]
    table = pd.DataFrame({"design_id": idx[keep]})
    for p, v in space.values_at(idx[keep]).items():
        table[p] = v
    for m in sorted(names | keep_metrics):
        v = s[m][keep]
        table[m] = v.astype(np.float64) if v.dtype.kind == "f" else v
    return table, hi - lo


class Exhaustive(Strategy):
    """Chunks in order; a chunk is done once its score table is on disk."""

    unit = "design"

    def open(self) -> None:
        d, space = self.d, self.space
        self.chunk = int(self.manifest.get("chunk_designs", CHUNK_DESIGNS))
        self.n_chunks = -(-space.size // self.chunk)
        files.remove_stale_tmp(d)                         # a chunk a killed process was writing
        self.done = store.chunk_ids(d)
        # the front from the durable score tables (a corrupt one is refused, naming it)
        self.front = pareto.front_of([tables.read_table(store.chunk_file(d, i)) for i in sorted(self.done)],
                                     space.objectives)
        self.designs = sum(min((i + 1) * self.chunk, space.size) - i * self.chunk for i in self.done)
        todo = [i for i in range(self.n_chunks) if i not in self.done]
        self.todo = iter(todo[:self.max_trials] if self.max_trials is not None else todo)
        self.saved = time.monotonic()

    def bar(self) -> dict:
        return {"total": self.space.size, "initial": self.designs, "unit": "design",
                "unit_scale": True, "desc": "exhaustive"}

    def counters(self) -> dict:
        return {"trials_completed": len(self.done), "trials_failed": 0,
                "trials_total": self.n_chunks, "designs_scored": self.designs}

    def propose(self):
        return next(self.todo, None)

    def score(self, i):
        return score_chunk(self.space, i, self.chunk)

    def store(self, i, scored) -> None:
        table = scored[0]
        # the chunk is done once its table is on disk (written whole, then renamed)
        tables.save_table(store.chunk_file(self.d, i), table, self.manifest)

    def tell(self, i, scored) -> int:
        table, n = scored
        self.done.add(i)
        self.designs += n
        self.front = pareto.front_of([self.front, table], self.space.objectives)
        store.fix_reference(self.manifest, self.d,
                           pareto.objective_matrix(self.front, self.space.objectives)
                           if len(self.front) else [])
        return n

    def after(self) -> None:
        if time.monotonic() - self.saved >= SAVE_EVERY_S:   # front.csv, progress.json
            self.save("running")
            self.saved = time.monotonic()
        else:
            self.hypervolume()                              # for the progress bar

    def finish(self) -> None:
        self.save("finished" if len(self.done) == self.n_chunks else "stopped")


def run(space, d: Path, manifest: dict, *, max_trials: int | None, budget_s: float | None,
        progress: bool = True) -> dict:
    """Drive an exhaustive run folder (see ``driver.run_space`` to create one)."""
    return drive(Exhaustive(space, d, manifest, max_trials=max_trials, budget_s=budget_s), progress)
