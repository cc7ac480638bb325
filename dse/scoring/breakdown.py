"""The per-op table of a scored design: for each step (decode, the step that carries prompt
tokens, the TTFT prefill step) and each op, its compute, memory and network times, its time in
the step and what bounds it, and the work behind them: FLOPs, HBM bytes and network bytes per
chip (``dse.perf.step``'s conventions: one stage step of one micro-batch, a multiply-add = 2
FLOPs, all-reduce bytes by the ring convention).

One row per design (``wide``, what a run stores for its front and the report reads) or one row
per (design, step, op) (``long``, what ``dse eval`` prints and ``dse.evaluate(...).breakdown``
returns). Every number comes from ``dse.perf.score(batch, breakdown=True)``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse.perf import BOUNDS, OPS, bound_shares, op_bound, score

STEPS = (("decode", "decode-only step (what limits decoding)"),
         ("mixed", "step that carries prompt tokens (steady state)"),
         ("prefill", "step that carries this request's first prefill chunk (TTFT)"))
TIMES = ("compute_s", "memory_s", "network_s", "time_s")
WORK = ("flops", "hbm_bytes", "net_bytes")
QUANTITIES = TIMES + WORK
_FIELD = {"compute_s": "compute_s", "memory_s": "memory_s", "network_s": "network_s",
          "time_s": "op_s", "flops": "flops", "hbm_bytes": "hbm_bytes", "net_bytes": "net_bytes"}


def wide(metrics: dict, steps) -> pd.DataFrame:
    """One row per scored design: every float metric, the decode bound, the decode step's op
    time by what bounds each op (``bound_share.compute`` ...), and ``<step>.<op>.<quantity>``,
    ``<step>.<op>.bound``, ``<step>.overhead_s``, ``<step>.total_s`` of every step."""
    cols = {k: np.asarray(v, dtype=np.float64) for k, v in metrics.items()
            if np.asarray(v).dtype.kind == "f"}
    cols["bound"] = np.array(BOUNDS, dtype=object)[np.asarray(metrics["bound"], int)]
    for name, share in zip(BOUNDS, bound_shares(steps.decode)):
        cols[f"bound_share.{name}"] = np.asarray(share, dtype=np.float64)
    for step, _ in STEPS:
        st = getattr(steps, step)
        cls = op_bound(st.compute_s, st.memory_s, st.network_s)
        for j, op in enumerate(OPS):
            for q in QUANTITIES:
                cols[f"{step}.{op}.{q}"] = np.asarray(getattr(st, _FIELD[q])[j], np.float64)
            cols[f"{step}.{op}.bound"] = np.array(BOUNDS, dtype=object)[cls[j]]
        cols[f"{step}.overhead_s"] = np.asarray(st.overhead_s, dtype=np.float64)
        cols[f"{step}.total_s"] = np.asarray(st.total_s, dtype=np.float64)
    n = len(next(iter(cols.values())))
    return pd.DataFrame({k: np.broadcast_to(v, (n,)) for k, v in cols.items()})


def of_batch(batch) -> pd.DataFrame:
    """``wide`` of every design of a Batch (scored once, with its breakdown)."""
    metrics, steps = score(batch.expanded(), breakdown=True)
    return wide(metrics, steps)


def of_designs(space, ids) -> pd.DataFrame:
    """``wide`` of designs of a space by their flat indices, with ``design_id`` and the KV
    cache's element type each runs (``kv_dtype``): what a run keeps of its front."""
    ids = np.asarray(ids, dtype=np.int64)
    if not len(ids):
        return pd.DataFrame({"design_id": ids})
    b, _ = space.batch(ids)
    out = of_batch(b)
    out.insert(0, "design_id", ids)
    out.insert(1, "kv_dtype", np.asarray(space.kv_dtypes(ids), dtype=object))
    return out


def long(table: pd.DataFrame) -> pd.DataFrame:
    """``wide`` rows as one row per (design, step, op): ``design`` (the row's index),
    ``step``, ``op``, the times and the work, ``bound``; an ``overhead`` row per step carries
    the step's fixed time (its ``time_s``). Ops a design does not run (every number 0) are
    left out."""
    rows = []
    for i, r in table.iterrows():
        for step, _ in STEPS:
            for op in OPS:
                vals = {q: float(r[f"{step}.{op}.{q}"]) for q in QUANTITIES}
                if any(vals[q] != 0.0 for q in TIMES):
                    rows.append({"design": i, "step": step, "op": op, **vals,
                                 "bound": r[f"{step}.{op}.bound"]})
            rows.append({"design": i, "step": step, "op": "overhead",
                         **{q: 0.0 for q in QUANTITIES},
                         "time_s": float(r[f"{step}.overhead_s"]), "bound": ""})
    return pd.DataFrame(rows, columns=["design", "step", "op", *QUANTITIES, "bound"])


def bound_why(row) -> str:
    """Why a design's decode bound is what it is, in words: the decode step's op time by what
    bounds each op."""
    names = [n for n in BOUNDS if f"bound_share.{n}" in row]     # compute, memory, network
    shares = [float(row[f"bound_share.{n}"]) for n in names]
    tot = float(sum(shares)) or 1.0
    split = ", ".join(f"{v / tot:.0%} {n}" for n, v in zip(names, shares))
    return f"{split} of the decode step's op time" + (
        "; the batch fills the HBM" if row["bound"] == "capacity" else "")
