"""The one search loop: propose -> score -> store -> tell, for every strategy.

A strategy is a small object (``Strategy``):

- ``propose()``: the next work item (a chunk of the space, a batch of asked trials, a shard
  pulled from a shared study), ``WAIT`` while other workers hold the rest, or None when done;
- ``score(item)``: one vectorized call of the model;
- ``store(item, scored)``: the item's Parquet score table (and trials file), written whole then
  renamed, so the item is done once it is on disk (resume after kill -9 loses nothing and counts
  nothing twice);
- ``tell(item, scored)``: Optuna told, the running Pareto archive merged; returns items done.

``drive(strategy)`` runs the loop until the strategy has nothing left, the budget is spent or a
signal asks to stop. The strategies (``exhaustive``, ``shards``, ``optuna.run``) subclass
``Strategy``; ``dse.search.driver`` creates, resumes and joins runs and picks the strategy.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from dse import pareto
from dse.scoring import breakdown, train_space
from dse.search import store, working
from dse.spec.fields import label

WAIT = "wait"              # propose(): others hold the remaining work; look again shortly


class Strategy:
    """The strategy side of the loop, and what every strategy shares: the run folder, its
    front, hypervolume, elapsed time and the writes of front.csv and progress.json."""

    unit = "trial"
    wait_s = 1.0

    def __init__(self, space, d: Path, manifest: dict, *, max_trials=None, budget_s=None,
                 storage_url=None, joining=False):
        self.space, self.d, self.manifest = space, Path(d), manifest
        self.max_trials, self.budget_s = max_trials, budget_s
        self.storage_url, self.joining = storage_url, joining
        self.front = None
        self.hv = None
        self.elapsed0 = float(store.read_progress(d).get("elapsed_s", 0.0))
        self.t0 = time.monotonic()

    # -- the loop's steps (each strategy defines them)
    def open(self) -> None: ...
    def propose(self): ...
    def score(self, item): ...
    def store(self, item, scored) -> None: ...
    def tell(self, item, scored) -> int: ...
    def finish(self) -> None: ...
    def close(self) -> None: ...
    def bar(self) -> dict: ...
    def counters(self) -> dict: ...

    def after(self) -> None:
        self.save("running")

    # -- shared bookkeeping
    def merge(self, table) -> None:
        ok = table[table["_admissible"]] if "_admissible" in table else table
        if len(ok):
            self.front = pareto.front_of([self.front if self.front is not None else pd.DataFrame(),
                                          ok], self.space.objectives)

    def hypervolume(self):
        ref = self.manifest.get("reference")
        if ref is not None and self.front is not None and len(self.front):
            self.hv = pareto.hypervolume(pareto.objective_matrix(self.front, self.space.objectives),
                                         np.array(ref["point"]), np.array(ref["scale"]))
        return self.hv

    def keep_breakdown(self) -> None:
        """The per-op breakdown of the front's designs, kept in the run for its report
        (``dse.scoring.breakdown``): written when the loop ends without an error."""
        if self.front is not None and "design_id" in self.front:
            ids = np.sort(self.front["design_id"].to_numpy(dtype=np.int64))
            of = train_space.breakdown if self.space.task == "train" else breakdown.of_designs
            store.write_breakdown(self.d, of(self.space, ids))

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def save(self, state: str, **extra) -> None:
        self.hypervolume()
        front = self.front if self.front is not None else pd.DataFrame()
        store.write_front(self.d, front, self.space.objectives, [p.path for p in self.space.parameters])
        store.write_progress(self.d, {
            "state": state, **self.counters(), "elapsed_s": self.elapsed0 + self.elapsed(),
            "front_size": len(front), "hypervolume": self.hv, **extra})


def drive(s: Strategy, progress: bool = True) -> dict:
    """The one loop: propose -> score -> store -> tell, until the strategy has nothing left,
    the budget is spent, or a signal asks to stop (after the item at hand: resumable)."""
    s.open()
    bar = s.bar()
    if s.budget_s is not None and s.max_trials is None:
        # a budget and no count of trials to do now: the bar (and its ETA) follows the budget
        bar = {"total": round(s.budget_s), "unit": "s", "desc": bar.get("desc"), "by_time": True}
    with working.Working(s.d, progress, **bar) as work:
        try:
            s.save("running")
            while not work.stop:
                if s.budget_s is not None and s.elapsed() >= s.budget_s:
                    break
                item = s.propose()
                if item is None:
                    break
                if item is WAIT:
                    time.sleep(s.wait_s)
                    continue
                scored = s.score(item)
                s.store(item, scored)
                n = s.tell(item, scored)
                s.after()
                work.update(n, len(s.front) if s.front is not None else 0, s.hv,
                            elapsed=s.elapsed(), done=s.counters().get("trials_completed"),
                            reference=_reference_words(s))
            s.finish()
            s.keep_breakdown()
        except BaseException:
            s.save("failed" if not work.stop else "stopped")
            raise
        finally:
            s.close()
    return store.status(s.d)


def _reference_words(s: Strategy) -> str | None:
    """The run's hypervolume reference point in words, once it is set (the bar's ``hv``)."""
    ref = s.manifest.get("reference")
    if not ref:
        return None
    return reference_words(s.space.objectives, ref)


def reference_words(objectives, reference: dict | None) -> str:
    if not reference:
        return "no reference point yet"
    return "reference point " + ", ".join(
        f"{label(o['name'] if isinstance(o, dict) else o.metric)} "
        f"{(p if (o['direction'] if isinstance(o, dict) else o.direction) == 'minimize' else -p):.4g}"
        for o, p in zip(objectives, reference["point"])) + "; each objective divided by " \
        "its range on the first front (" + ", ".join(f"{s:.4g}" for s in reference["scale"]) + ")"
