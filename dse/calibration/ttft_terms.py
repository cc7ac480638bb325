"""The model's time to first token of calibration cases, term by term, beside the measured one.

    python -m dse.calibration.ttft_terms                       # every case with a measured TTFT
    python -m dse.calibration.ttft_terms --runtime sglang --kind moe
    python -m dse.calibration.ttft_terms --model deepseek-v3 --rows

The terms add up to the model's ``ttft_s`` (``dse.perf.phases.ttft`` and ``ttft_closed_loop``),
in seconds:

front_end_s     the front end's own time per request (``phases.front_end_s``: the per-request
                time and tokenizing the prompt)
chunks_s        the steps that carry the prompt's chunks: ``pp x n_chunks x`` the TTFT step
                (``phases.prompt_load``: a prompt longer than a scheduler's token budget runs in
                ``n_chunks`` steps), split into the step's ops (``dse.perf.OPS``, each op's time in
                the step) and its fixed time (``chunk.overhead_s``: per layer, per step, GEMM
                launches, host time per sequence)
step_waits_s    the rest of the unloaded TTFT: half a pass of the running step, the pass an
                overlapped scheduler loop had already planned and a tier's fetch steps
                (``ttft_unloaded_s`` less the two terms above)
queue_s         the closed-loop wait for the other requests' prompts, the runtime's slots and a
                serial front end (``ttft_s - ttft_unloaded_s``)

Closed-loop cases only (those that give a concurrency). Per case (``--rows``) with the measured TTFT and ``ratio`` = measured / model; else the mean of
each term over the selected cases and the geometric-mean ratio, by runtime and model kind
(``calibrate.model_kind``). Queue-suspect and cold-start truths (``cases.set_apart``) are left
out, as the fit leaves them out. This is a diagnostic: it reads the calibration set, it changes
nothing.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

from dse.calibration.calibrate import model_kind
from dse.calibration.cases import load, set_apart
from dse.calibration.fit import holdout_key
from dse.errors import InputError
from dse.perf import OPS
from dse.perf.phases import front_end_s, prompt_load
from dse.scoring.breakdown import of_batch
from dse.scoring.predict import prepare

TERMS = ("front_end_s", "chunks_s", "step_waits_s", "queue_s")


def terms(batch) -> pd.DataFrame:
    """The TTFT terms (module docstring) of every row of a scored Batch, with the model's
    ``ttft_s`` and ``ttft_unloaded_s``, ``n_chunks`` and the TTFT step's per-op times scaled to
    the prompt (``chunk.<op>_s``, ``chunk.overhead_s``): one row per design."""
    b = batch.expanded()
    w = of_batch(b)
    load_ = prompt_load(b)
    scale = b.pp * np.broadcast_to(load_.n_chunks, (len(b),))
    out = pd.DataFrame({"n_chunks": np.broadcast_to(load_.n_chunks, (len(b),)),
                        "ttft_s": w["ttft_s"].to_numpy(),
                        "ttft_unloaded_s": w["ttft_unloaded_s"].to_numpy()})
    for op in OPS:
        out[f"chunk.{op}_s"] = scale * w[f"prefill.{op}.time_s"].to_numpy()
    out["chunk.overhead_s"] = scale * w["prefill.overhead_s"].to_numpy()
    out["front_end_s"] = np.broadcast_to(front_end_s(b), (len(b),)).astype(float)
    out["chunks_s"] = scale * w["prefill.total_s"].to_numpy()
    out["step_waits_s"] = out["ttft_unloaded_s"] - out["front_end_s"] - out["chunks_s"]
    out["queue_s"] = out["ttft_s"] - out["ttft_unloaded_s"]
    return out


def case_terms(cases: pd.DataFrame, truth: pd.DataFrame) -> pd.DataFrame:
    """``terms`` of every closed-loop case (one that gives its concurrency; the rows at a request
    rate are dse.perf.queueing's) with a measured TTFT (queue-suspect truths left out), with its
    runtime, model kind, layout, lengths, concurrency, the measured ``true_ttft_s`` and
    ``ratio`` (measured / model). Each case must give its layout and concurrency (one design
    per case), as the calibration sets do."""
    t = truth[(truth["metric"] == "ttft_s") & ~set_apart(truth)]
    measured = t.drop_duplicates("case_id").set_index("case_id")["value"].astype(float)
    conc = pd.to_numeric(cases.get("concurrency", pd.Series(np.nan, index=cases.index)),
                         errors="coerce")
    cases = cases[cases["case_id"].isin(measured.index) & conc.notna()].reset_index(drop=True)
    if cases.empty:
        raise InputError("no case with a measured TTFT is selected",
                         hint="loosen --runtime / --kind / --model")
    prep = prepare(cases)
    if len(prep.resolved) != len(cases):
        raise InputError("a case expands to several designs",
                         hint="give tp, pp, ep, dp and concurrency on every case")
    b = prep.batch
    out = terms(b)
    info = pd.DataFrame({
        "case_id": cases["case_id"].to_numpy(), "model": cases["model"].to_numpy(),
        "hardware": cases["hardware"].to_numpy(),
        "runtime": holdout_key(cases, "runtime").to_numpy(),
        "kind": cases["model"].map(model_kind).to_numpy(),
        "tp": b.tp, "ep": b.ep, "dp": b.dp, "isl": b.isl, "osl": b.osl,
        "concurrency": b.concurrency})
    out = pd.concat([info, out], axis=1)
    out["true_ttft_s"] = out["case_id"].map(measured).to_numpy()
    out["ratio"] = out["true_ttft_s"] / out["ttft_s"]
    return out


def term_means(rows: pd.DataFrame, by, cols) -> pd.DataFrame:
    """By the ``by`` columns: cases, the mean of each of ``cols``, and the geometric mean of the
    rows' ``ratio`` (shared by ttft_terms and tpot_terms)."""
    keys = [rows[k] for k in by]
    out = rows.groupby(keys, observed=True)[list(cols)].mean()
    out.insert(0, "cases", rows.groupby(keys, observed=True).size())
    out["ratio"] = np.exp(np.log(rows["ratio"]).groupby(keys, observed=True).mean())
    return out.reset_index()


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per runtime and model kind: cases, the mean of each term and of the measured TTFT, and
    the geometric mean of measured / model."""
    return term_means(rows, ("runtime", "kind"), [*TERMS, "ttft_s", "true_ttft_s"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dse.calibration.ttft_terms", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", help="calibration folder (default ../shared/calibration)")
    p.add_argument("--runtime", help="only this runtime (trtllm, sglang, vllm)")
    p.add_argument("--kind", choices=("mla", "moe", "dense"), help="only this model kind")
    p.add_argument("--model", help="only this catalog model")
    p.add_argument("--rows", action="store_true", help="one row per case (default: the summary)")
    a = p.parse_args(argv)
    try:
        cases, truth = load(a.dir)
        keep = np.ones(len(cases), bool)
        if a.runtime:
            keep &= holdout_key(cases, "runtime").to_numpy() == a.runtime
        if a.kind:
            keep &= cases["model"].map(model_kind).to_numpy() == a.kind
        if a.model:
            keep &= cases["model"].astype(str).to_numpy() == a.model
        rows = case_terms(cases[keep], truth)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    pd.set_option("display.width", 250)
    pd.set_option("display.max_rows", 2000)
    pd.set_option("display.max_columns", 60)
    if a.rows:
        cols = ["model", "hardware", "runtime", "tp", "ep", "dp", "isl", "osl", "concurrency",
                "true_ttft_s", "ttft_s", "ratio", *TERMS, "n_chunks",
                *[f"chunk.{op}_s" for op in OPS], "chunk.overhead_s"]
        print(rows[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    else:
        print(summary(rows).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
