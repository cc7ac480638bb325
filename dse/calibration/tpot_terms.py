"""The model's time per output token of calibration cases, term by term, beside the measured one.

    python -m dse.calibration.tpot_terms                       # every closed-loop case with a TPOT
    python -m dse.calibration.tpot_terms --by runtime kind front_end decade
    python -m dse.calibration.tpot_terms --runtime vllm --kind dense --rows

The model's ``tpot_s`` is a pass of the mean step (``dse.perf.serve._rates``: the decode-only
step and the steps that also carry prompt chunks, ``step_s``) or, where it is slower, the serial
front end's streaming of every running answer (``dse.perf.frontend.streamed_tpot``). Its terms,
in seconds per output token (pp = 1 and no speculative decoding on these rows):

gemm_s       the decode-only step's GEMM ops (q/k/v/o projections, dense MLP, routed and shared
             experts, router), each with its collectives (all-reduce, all-to-all)
attention_s  the decode-only step's attention against the KV cache
logits_s     the output head and its all-gather
fixed_s      the decode-only step's fixed time: the per-layer time (``layer_overhead_s``), the
             GEMMs' launch latencies and the per-step time
seq_s        the scheduler's host time per running sequence (``seq_overhead_s`` x sequences /
             dp), part of the step's fixed time, shown apart
prompt_s     what the steps that carry prompt tokens add to the mean step (``step_s`` less the
             decode-only step)
stream_s     where the streaming bound is slower than the step, what it adds (``tpot_s - step_s``)
floor_s      the streaming bound itself (running answers / front-end processes x the front end's
             time per streamed token)

Per case (``--rows``) with the measured ``true_tpot_s`` and ``ratio`` = model / measured; else
the mean of each term and the geometric-mean ratio by the ``--by`` columns (runtime, kind,
front_end: "own" or the front end a case's deployment served through, ``cases.FRONT_ENDS``;
decade: ``fit.concurrency_decade``; hardware, model, tp, isl, osl). Queue-suspect cases
(``cases.set_apart``) are left out, as the fit leaves them out. A diagnostic: it reads the
calibration set and the catalog, it changes nothing.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

from dse.calibration.calibrate import model_kind
from dse.calibration.cases import FRONT_END, load, set_apart
from dse.calibration.fit import concurrency_decade, holdout_key
from dse.calibration.ttft_terms import term_means
from dse.errors import InputError
from dse.perf import frontend
from dse.perf.serve import score
from dse.perf.step import OPS
from dse.scoring.predict import prepare

GEMM_OPS = ("attn_proj", "mlp_dense", "moe_routed", "moe_shared", "router")
TERMS = ("gemm_s", "attention_s", "logits_s", "fixed_s", "seq_s", "prompt_s", "stream_s")
BY = ("runtime", "kind", "front_end", "decade", "hardware", "model", "tp", "isl", "osl")


def terms(batch) -> pd.DataFrame:
    """The TPOT terms (module docstring) of every row of a Batch, with the model's ``tpot_s``,
    ``step_s`` and ``floor_s``: one row per design."""
    metrics, steps = score(batch, breakdown=True)
    dec = steps.decode
    n = len(batch)
    op = {name: np.broadcast_to(dec.op_s[i], (n,)) for i, name in enumerate(OPS)}
    seqs = np.maximum(np.broadcast_to(batch.concurrency, (n,)), 1.0)
    seq = np.broadcast_to(batch.seq_overhead_s * seqs / batch.dp, (n,))
    floor = seqs / frontend.processes(batch) * frontend.stream_s(batch) \
        / np.maximum(batch.osl, 1.0)
    out = pd.DataFrame({
        "gemm_s": sum(op[o] for o in GEMM_OPS),
        "attention_s": op["attn_core"],
        "logits_s": op["logits"],
        "fixed_s": np.broadcast_to(dec.overhead_s, (n,)) - seq,
        "seq_s": seq,
        "prompt_s": metrics["step_s"] - np.broadcast_to(dec.total_s, (n,)),
        "stream_s": metrics["tpot_s"] - metrics["step_s"],
        "floor_s": np.broadcast_to(floor, (n,)).astype(float),
        "step_s": metrics["step_s"], "tpot_s": metrics["tpot_s"]})
    return out


def case_terms(cases: pd.DataFrame, truth: pd.DataFrame) -> pd.DataFrame:
    """``terms`` of every closed-loop case with a measured TPOT (queue-suspect cases left out),
    with its runtime, model kind, front end, concurrency decade, layout and lengths, the
    measured ``true_tpot_s`` and ``ratio`` (model / measured). Each case must give its layout
    and concurrency (one design per case), as the calibration sets do."""
    t = truth[(truth["metric"] == "tpot_s") & ~set_apart(truth)]
    measured = t.drop_duplicates("case_id").set_index("case_id")["value"].astype(float)
    conc = pd.to_numeric(cases.get("concurrency", pd.Series(np.nan, index=cases.index)),
                         errors="coerce")
    cases = cases[cases["case_id"].isin(measured.index) & conc.notna()].reset_index(drop=True)
    if cases.empty:
        raise InputError("no closed-loop case with a measured TPOT",
                         hint="the cases must give a concurrency and have a tpot_s truth")
    prep = prepare(cases, file="cases.csv")
    if len(prep.resolved) != len(cases):
        raise InputError("a case expands to several designs",
                         hint="give tp, pp, ep, dp and concurrency on every case")
    out = terms(prep.batch)
    at = prep.resolved["_case"].to_numpy(int)
    c = cases.iloc[at].reset_index(drop=True)
    fe = c[FRONT_END].fillna("").astype(str) if FRONT_END in c else pd.Series("", index=c.index)
    info = pd.DataFrame({
        "case_id": c["case_id"].astype(str),
        "runtime": holdout_key(c, "runtime").to_numpy(),
        "kind": c["model"].map(model_kind).to_numpy(),
        "front_end": fe.replace("", "own").to_numpy(),
        "decade": [concurrency_decade(float(x)) for x in pd.to_numeric(c["concurrency"])],
        "hardware": c["hardware"].astype(str).to_numpy(), "model": c["model"].astype(str),
        "tp": pd.to_numeric(c["tp"]).astype(int), "isl": pd.to_numeric(c["isl"]).astype(int),
        "osl": pd.to_numeric(c["osl"]).astype(int),
        "concurrency": pd.to_numeric(c["concurrency"]).astype(int)})
    out = pd.concat([info, out], axis=1)
    out["true_tpot_s"] = out["case_id"].map(measured).to_numpy()
    out["ratio"] = out["tpot_s"] / out["true_tpot_s"]
    return out


def summary(rows: pd.DataFrame, by=("runtime", "kind")) -> pd.DataFrame:
    """Mean of every term, the model's and the measured TPOT, and the geometric-mean ratio
    (model / measured) by the ``by`` columns."""
    return term_means(rows, by, [*TERMS, "floor_s", "tpot_s", "true_tpot_s"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dse.calibration.tpot_terms", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", help="calibration folder (default ../shared/calibration)")
    p.add_argument("--by", nargs="+", choices=BY, default=["runtime", "kind"],
                   help="the columns the means are taken by (default: runtime kind)")
    for col in ("runtime", "kind", "model", "hardware"):
        p.add_argument(f"--{col}", help=f"only the cases of this {col}")
    p.add_argument("--rows", action="store_true", help="one row per case, not the means")
    a = p.parse_args(argv)
    try:
        cases, truth = load(a.dir)
        rows = case_terms(cases, truth)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for col in ("runtime", "kind", "model", "hardware"):
        if getattr(a, col):
            rows = rows[rows[col] == getattr(a, col)]
    if rows.empty:
        print("error: no case left after the filters", file=sys.stderr)
        return 2
    pd.set_option("display.width", 250)
    pd.set_option("display.max_rows", 2000)
    table = rows.drop(columns=["case_id"]) if a.rows else summary(rows, a.by)
    ms = [c for c in table.columns if c.endswith("_s")]
    table[ms] = table[ms] * 1e3
    print("milliseconds per output token; ratio = model / measured (geometric mean)")
    print(table.rename(columns={c: c[:-2] + "_ms" for c in ms})
          .to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
