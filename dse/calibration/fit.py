"""End-to-end remainder of the model, fitted on ../shared/calibration after the kernel fit.

The per-op efficiencies come from the kernel fits (``python -m dse.calibration.kernels``, the catalog's
``kernels/*.toml``). What end-to-end serving adds on top of the kernels, and what no kernel
table measures, are host and glue times (``PARAMS``), fitted here by least squares in log
space on the TensorRT-LLM tables and the Hopper set (three runtimes, closed-loop TTFT):

- a fixed time per layer per step (norms, residuals, rotary embedding, activation kernels),
  **shared by every chip and runtime**, one for the steps that carry prompt tokens (run
  eagerly) and one for the decode-only steps (replayed as CUDA graphs);
- the front end's time per request in both TTFTs (HTTP, the API server's and engine's
  hand-offs, streaming: ``serving.request_overhead_s``; 0 where a source measured in-process,
  ``dse.calibration.cases.SOURCE_INPUTS``): one number for the runtimes' own OpenAI servers,
  and one for the Dynamo front end that aiconfigurator's benchmark rows passed
  (``dse.calibration.harness_rules.FRONT_ENDS``), whatever the runtime behind it;
- per runtime, the scheduler's host time per running sequence per step
  (``serving.seq_overhead_s``: batch bookkeeping, sampling, detokenization);
- the serial front end (``dse.perf.frontend``: one process tokenizes and streams for every
  request, so it queues new requests and bounds many streams' TPOT): its time per prompt
  token (one number: the three runtimes tokenize with the same Hugging Face tokenizers), per
  output token (one number: each detokenizes and streams one token at a time) and, for SGLang alone, per token of text a streamed chunk repeats
  (its default streams the whole text so far; the others stream deltas). Left out of a
  cross-validation, SGLang's text term has nothing to fit it and keeps its prior (20 ns a token,
  ~5 ns a byte of JSON).

Two of them are not fitted but set from a published measurement of the process they stand for
(``SOURCED``): the front end's time per output token (SGLang's detokenizer saturating) and
Dynamo's front end's time per request (its front end saturating on one core). The rows pinned
each to a few deployments, so a fold that left those out moved them to a bound.

None is per chip (they describe the runtime, not the silicon), so they transfer to chips the
calibration set never saw; the other end-to-end factors stay at their physical priors
(``FIXED``). The per-runtime numbers are written to efficiency.toml's ``[runtimes.*]`` tables
(``catalog.runtime_defaults`` merges them; a design's own value wins).

A fixed time per step (scheduler, sampling, host-device synchronisation) was fitted too until
2026-12: with the all-reduce selection rule and the logits all-gather it came out at 12.6 us
(3.0 us before), and held at 0 the calibration figures are the same to three digits (offline
1.0958 vs 1.0959, online TPOT 1.1157 vs 1.1157, TTFT 1.1029 vs 1.1027), so it is not fitted:
``step_overhead_s`` stays a catalog field, written as 0 (``FIXED``).

Cross-validation (``cross_validate``) refits the numbers without one group of cases and predicts
the cases left out: one chip, one model family, one model, one runtime or one concurrency decade
(``holdout_key``). Parameters may be per runtime, named ``"<field>.<runtime>"``
(``_batch_with`` writes them on that runtime's rows only); left out, a runtime's own parameters
get the other runtimes' geometric mean (``_held_out_runtime``). A name ``"<field>.<front end>"``
applies to the rows served through that front end, whatever their runtime.

Not fitted: the online rows at an infinite request rate (no concurrency,
``dse.calibration.cases.fittable``) and the TTFTs flagged ``queue_suspect`` or ``cold_start``
(``dse.calibration.cases.set_apart``).

Uncertainty (``bootstrap``, written to efficiency.toml's ``[uncertainty.end_to_end]`` table in
the kernel tables' format: ``params``, ``log_sd``, ``log_corr``, ``rule``; read it with
``uncertainty()``): the covariance of the log parameters over ``BOOT_N`` refits on cases drawn
with replacement within each (source, hardware) group (seeded, warm-started at the fit), which
keeps the groups' weights and carries whatever the residuals share within a group (one chip's
kernel error moves all its cases together). A parameter that every resample puts at the same
bound gets the sd of a uniform draw within its log bounds (``dse.calibration.kernels.common.bounded_cov``).
"""

from __future__ import annotations

import datetime as _dt
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from dse import catalog
from dse.build.designs import EFF_FIELDS
from dse.build.runtimes import HOST_TIMES
from dse.calibration.cases import (
    FRONT_END,
    FRONT_ENDS,
    RATE,
    fittable,
    joined,
    set_apart,
    weights,
)
from dse.calibration.kernels import common as kernel_fits
from dse.errors import InputError
from dse.scoring.predict import Prepared, finish, prepare
from dse.spec.fields import REGISTRY

# (name, prior, lower, upper)
RUNTIMES = ("trtllm", "sglang", "vllm")
# front ends a parameter may be fitted for (cases.FRONT_ENDS): "<field>.<front end>" applies
# to the rows served through it, written to efficiency.toml [front_ends.*]
FRONT_END_NAMES = tuple(dict.fromkeys(FRONT_ENDS.values()))
PARAMS = (
    # fixed time per layer per step on every chip and runtime: norms, residuals, rotary
    # embedding, activation kernels, the launches no kernel table times
    ("layer_overhead_s", 10e-6, 1e-8, 5e-4),
    # the same in a decode-only step, which the runtimes replay as a CUDA graph (no kernel
    # launched from the host, the step's small kernels back to back): TensorRT-LLM's PyTorch
    # backend captures graphs for "batches that consist of decoding requests *only*"
    # (cuda_graph_config, on by default: NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py),
    # SGLang captures its decode batches (--disable-cuda-graph off by default, up to
    # --cuda-graph-max-bs: sgl-project/sglang python/sglang/srt/server_args.py), vLLM V1 its
    # decode batches (compilation_config cudagraph capture sizes, on unless --enforce-eager:
    # vllm-project/vllm vllm/config/compilation.py); aiconfigurator's benchmark template
    # captures every batch size up to max_batch_size (generator/rule_plugin/*.rule,
    # cuda_graph_batch_sizes). Until 2026-12 one per-layer time served both: 27.7 us, too much
    # for the decode steps of small batches (Llama-3.1-70B on H200 at 1-8 requests 1.2-1.3x
    # too slow under TensorRT-LLM and vLLM alike) and too little for the eager steps; fitted
    # apart, 22.2 us in a graph and 62.4 us eager (in-sample TPOT 1.153 -> 1.147, TTFT 1.340 ->
    # 1.337, TensorRT-LLM v0.14 online TPOT 1.126 -> 1.106, v0.17 offline 1.095 either way).
    # Not encoded: the capture's batch limit (a larger decode batch runs eagerly)
    ("graph_layer_overhead_s", 10e-6, 1e-8, 5e-4),
    # the front end per request, in both TTFTs: HTTP, the API server's and engine's hand-offs,
    # streaming the first token (0 where a source measured in-process: cases.SOURCE_INPUTS).
    # One number for the three runtimes' own OpenAI servers (written to every runtime's
    # table), and one for the Dynamo front end that aiconfigurator's benchmark rows passed
    # (cases.FRONT_ENDS: dynamo.frontend in front of every runtime's worker): the front end a
    # deployment runs, not its engine, sets it. (Fitted per runtime until 2026-12 it came out
    # at sglang 230 ms, trtllm 108 ms, vllm 12 ms, each runtime's share of Dynamo-fronted rows:
    # sglang 70 of 85, trtllm 308 of 541, vllm 53 of 302.)
    ("request_overhead_s", 0.05, 1e-4, 2.0),
    *((f"request_overhead_s.{fe}", 0.1, 1e-4, 2.0) for fe in FRONT_END_NAMES),
    # the scheduler's host time per running sequence per step (batch bookkeeping, sampling,
    # detokenization), on each attention-DP rank
    *((f"seq_overhead_s.{rt}", 3e-6, 1e-9, 2e-4) for rt in RUNTIMES),
    # the serial front end (dse.perf.frontend): one process tokenizes every prompt (the same
    # Hugging Face tokenizers in all three runtimes: one number, written to every runtime's
    # table) and streams every answer, detokenizing one token at a time (one number too: per
    # runtime, until 2026-12, the fit put it at trtllm 67 us, sglang 29 us, vllm 0.03 us, a
    # spread the rows do not pin -- trtllm's bootstrap log sd was 0.79 -- and a runtime left out
    # got the geometric mean of the other two), and SGLang's chunks repeat the whole text so far
    # (incremental_streaming_output = False by default; the others stream deltas: no such term)
    ("frontend_prompt_token_s", 2e-6, 1e-9, 1e-4),
    ("frontend_token_s", 2e-5, 1e-8, 1e-3),
    ("frontend_text_token_s.sglang", 2e-8, 1e-12, 1e-5),
    # the serial front end's time per request, whatever its lengths (dse.perf.frontend), for a
    # front end that is not the runtime's own server: aiconfigurator's Dynamo deployments of
    # TensorRT-LLM serving Llama-3.1-8B stop at 43-51 requests/s (osl 128-256, 128 clients)
    # from tp 2 to tp 8 whatever the GPUs do (at osl 128 fewer tokens/s at C = 128 than at
    # C = 64 on tp 4, isl 1024, and tp 8, isl 2048), ~20 ms of serial work a request where the
    # per-token terms give ~8 ms (reports/end-to-end/prefill-ttft.md, fourteenth pass). The
    # runtimes' own servers: none (their rows do not reach such rates)
    *((f"frontend_request_s.{fe}", 5e-3, 1e-7, 0.2) for fe in FRONT_END_NAMES),
)
# numbers of PARAMS taken from a published measurement of the process they stand for instead of
# fitted: held in every fit, bootstrap refit and cross-validation fold (a fold cannot move them),
# written to efficiency.toml with the fitted ones, with their source, and not sampled by the
# bands (their bootstrap would be a point). Each is the saturation rate of a front end that the
# benchmark made its bottleneck, so an upper bound on the time per unit of that process; held at
# those bounds, the in-sample figures are the free fit's to three digits (TPOT 1.132, TTFT 1.337
# vs 1.336) and the folds that left them to a few rows improve: SGLang out 1.713 -> 1.496,
# Llama-3.1-8B out 1.706 -> 1.609, concurrency 100-999 out 1.742 -> 1.619 (TTFT;
# reports/end-to-end/prefill-ttft.md, fifteenth pass)
SOURCED = {
    "frontend_token_s": (
        2.6e-5, ("sgl-project/sglang PR 9970 (2025-09-03, multi-detokenizer): one "
                 "DetokenizerManager process streams 5,122,821 output tokens in 133.01 s (38.5k "
                 "tokens/s) for 1,500 closed-loop clients of Qwen2.5-0.5B on dp 8 with 8 "
                 "tokenizer workers, the bottleneck the PR removes: <= 26 us per output token")),
    "frontend_request_s.dynamo": (
        5.29e-3, ("ai-dynamo/dynamo benchmarks/frontend/tokenizer-cache/README.md (1f2242a): "
                  "the front end alone on one CPU core, mock workers at 1e6x speed, saturates "
                  "at 189.01 requests/s with its tokenizer cache (107.49 without): <= 5.29 ms "
                  "of front-end work a request, its share of tokenizing ~90k-token prompts "
                  "included")),
}
# the numbers the fit moves
FITTED = tuple(p for p in PARAMS if p[0] not in SOURCED)
# the runtimes' own fields (efficiency.toml [runtimes.*], dse.build.runtimes.HOST_TIMES): a plain
# name among them is fitted as one number for every runtime
RUNTIME_FIELDS = tuple(h.split(".", 1)[1] for h in HOST_TIMES)
# end-to-end factors kept at their physical priors: the share of HBM bandwidth the traffic
# outside GEMMs and attention reaches (embedding rows), of the scale-up and scale-out links a
# pipeline hand-off or a KV transfer reaches, no overlap of collectives with compute (as
# TensorRT-LLM v0.14-v0.17 ran them: on the compute stream), and no fixed time per step (module
# docstring: redundant with the per-layer time)
FIXED = {"hbm_fraction": 0.8, "scaleup_fraction": 0.8, "scaleout_fraction": 0.75,
         "step_overhead_s": 0.0, "network_overlap_fraction": 0.0}


def _batch_with(prep: Prepared, theta: dict):
    """The prepared batch with the end-to-end numbers ``theta`` written in: a plain name
    (``layer_overhead_s``) on every row, a per-runtime name ``"<field>.<runtime>"``
    (``layer_overhead_s.vllm``) on the rows that run that runtime (over the plain name's value,
    or the batch's own where ``theta`` has no plain one)."""
    cols = {"step_overhead_s": FIXED["step_overhead_s"]}
    cols.update({k: v for k, v in theta.items() if "." not in k})
    for k in set(cols) & set(RUNTIME_FIELDS):   # a case that gives it itself keeps it
        cols[k] = np.where(_given(prep, k), getattr(prep.batch, k), cols[k])
    per_runtime = {k: v for k, v in theta.items() if "." in k}
    if per_runtime:
        runtime = _row_runtimes(prep)
        front = _row_front_ends(prep)
        # the runtimes' names first, a front end's over them
        for name, v in sorted(per_runtime.items(), key=lambda kv: kv[0].split(".", 1)[1]
                              in FRONT_END_NAMES):
            field, rt = name.split(".", 1)
            base = np.broadcast_to(cols[field] if field in cols else getattr(prep.batch, field),
                                   runtime.shape)
            if rt in FRONT_END_NAMES:
                # the rows served through that front end (which cases.apply_front_ends gave
                # the catalog's value of this very number)
                mine = front == rt
            else:
                # a case that gives the number itself (a source's input) keeps it
                mine = (runtime == rt) & ~_given(prep, field)
            cols[field] = np.where(mine, v, base)
    return prep.batch.replace(**cols)


def _given(prep: Prepared, field: str) -> np.ndarray:
    """Per prepared row: its case gives the setting behind batch field ``field`` itself (a
    dotted column such as ``serving.request_overhead_s``, or a source's input)."""
    cols = [c for c in prep.cases.columns if c.endswith("." + field)]
    if not cols or "_case" not in prep.resolved:
        return np.zeros(len(prep.resolved), bool)
    given = pd.to_numeric(prep.cases[cols[0]], errors="coerce").notna().to_numpy()
    return given[prep.resolved["_case"].to_numpy(int)]


def _row_front_ends(prep: Prepared) -> np.ndarray:
    """The front end (cases.FRONT_END, "" for the runtime's own server) of each of the
    prepared batch's rows (in its row order)."""
    n = len(prep.resolved)
    if FRONT_END not in prep.cases or "_case" not in prep.resolved:
        return np.full(n, "", dtype=object)
    fe = prep.cases[FRONT_END].fillna("").astype(str).to_numpy(object)
    return fe[prep.resolved["_case"].to_numpy(int)]


def _row_runtimes(prep: Prepared) -> np.ndarray:
    """The serving runtime of each of the prepared batch's rows (in its row order)."""
    return prep.resolved["serving.runtime"].astype(str).to_numpy()


def _residuals(prep: Prepared, cases: pd.DataFrame, truth: pd.DataFrame, theta) -> pd.DataFrame:
    pred = finish(prep, _batch_with(prep, theta))
    return joined(pred, cases, truth)


def in_sample(prep: Prepared, cases: pd.DataFrame, truth: pd.DataFrame, theta: dict) -> pd.DataFrame:
    """The cases predicted with the fitted numbers ``theta`` (``joined``'s rows): the refit's
    in-sample error, whatever efficiency.toml holds."""
    return _residuals(prep, cases, truth, theta)


BOOT_N = 24
BOOT_SEED = 0


def fit_base(cases: pd.DataFrame, truth: pd.DataFrame, keep=None, counts=None) -> pd.DataFrame:
    """The truths ``fit`` fits (with the case's hardware and model): those of the cases where
    ``keep`` (all by default) that are ``fittable`` and drawn (``counts`` > 0), less the TTFTs
    dominated by queueing and those that hold kernel compiles (``quality_flag`` queue_suspect,
    cold_start: reported, never fitted)."""
    keep = np.ones(len(cases), bool) if keep is None else np.asarray(keep)
    keep = keep & fittable(cases)
    if counts is not None:
        keep = keep & (np.asarray(counts) > 0)
    keep_ids = set(cases["case_id"][keep])
    return truth[truth["case_id"].isin(keep_ids) & ~set_apart(truth)].merge(
        cases[["case_id", "hardware", "model"]], on="case_id")


def fit(cases: pd.DataFrame, truth: pd.DataFrame, keep=None, verbose: bool = True,
        prep: Prepared | None = None, counts=None, start: dict | None = None,
        max_nfev: int = 60, hold: dict | None = None) -> dict:
    """The end-to-end number(s) of ``PARAMS`` fitted on the cases where ``keep`` (a boolean per case, all
    by default), every (source, metric, hardware) group weighted equally within its source;
    ``counts``: how many times each case is drawn (a bootstrap resample; 1 by default);
    ``start``: starting values (the priors by default); ``hold``: numbers of ``PARAMS`` not
    fitted but set (a diagnostic: what the others do when one comes from elsewhere), returned
    with the fitted ones."""
    prep = prep or prepare(cases, file="cases.csv")
    hold = {**{k: v for k, (v, _) in SOURCED.items()}, **dict(hold or {})}
    unknown = sorted(set(hold) - {p[0] for p in PARAMS})
    if unknown:
        raise InputError(f"no end-to-end number named {', '.join(unknown)}",
                         hint="one of " + ", ".join(p[0] for p in PARAMS))
    free = [p for p in PARAMS if p[0] not in hold]
    base = fit_base(cases, truth, keep, counts)
    w = np.sqrt(weights(base.assign(pred=1.0)))
    if counts is not None:
        mult = pd.Series(np.asarray(counts, float), index=cases["case_id"])
        w = w * np.sqrt(base["case_id"].map(mult).to_numpy(float))
    w = w / w.mean()
    names = [p[0] for p in free]
    lo = np.log([p[2] for p in free])
    hi = np.log([p[3] for p in free])
    x0 = np.log([(start or {}).get(p[0], p[1]) for p in free])
    x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)

    def resid(x):
        j = _residuals(prep, cases, truth, {**dict(zip(names, np.exp(x))), **hold})
        j = base[["case_id", "metric"]].merge(j, on=["case_id", "metric"], how="left")
        r = np.log(j["pred"].to_numpy(float) / j["value"].to_numpy(float))
        return w * np.where(np.isfinite(r), r, 3.0)

    # a robust loss: a few cases far off (a chip or model whose kernels the tables describe
    # poorly) must not pull the numbers every other chip shares
    sol = least_squares(resid, x0, bounds=(lo, hi), diff_step=0.05, max_nfev=max_nfev,
                        loss="soft_l1", f_scale=0.1)
    theta = {p[0]: float(v) for p, v in zip(free, np.exp(sol.x))}
    theta = {p[0]: float(hold[p[0]]) if p[0] in hold else theta[p[0]] for p in PARAMS}
    if verbose:
        print("  ".join(f"{k}={v:.4g}" for k, v in theta.items() if not k.startswith("_"))
              + f"  ({len(base)} values, {sol.nfev} evaluations)")
    return theta


def bootstrap(cases: pd.DataFrame, truth: pd.DataFrame, theta: dict, n: int = BOOT_N,
              seed: int = BOOT_SEED, prep: Prepared | None = None, verbose: bool = True) -> dict:
    """The fit's uncertainty (module docstring): ``{"params", "log_sd", "log_corr", "rule"}``
    from ``n`` case resamples within each (source, hardware) group, refitted from ``theta``."""
    prep = prep or prepare(cases, file="cases.csv")
    rng = np.random.default_rng(seed)
    groups = cases.groupby([cases["source"].astype(str), cases["hardware"].astype(str)]).indices
    draws = []
    t0 = time.perf_counter()
    for i in range(n):
        counts = np.zeros(len(cases), int)
        for idx in groups.values():
            np.add.at(counts, rng.choice(idx, size=len(idx), replace=True), 1)
        th = fit(cases, truth, verbose=False, prep=prep, counts=counts, start=theta, max_nfev=25)
        draws.append(np.log([th[p[0]] for p in FITTED]))
        if verbose:
            el = time.perf_counter() - t0
            print(f"\r  bootstrap {i + 1}/{n}  {(i + 1) / el:.2f} refits/s  "
                  f"ETA {el / (i + 1) * (n - i - 1):.0f} s", end="", flush=True)
    if verbose:
        print()
    x = np.array(draws)
    lo = np.log([p[2] for p in FITTED])
    hi = np.log([p[3] for p in FITTED])
    cov = kernel_fits.bounded_cov(np.atleast_2d(np.cov(x, rowvar=False)), lo, hi)
    rule = (f"bootstrap: {n} refits on cases resampled within each (source, hardware) group "
            f"(seed {seed}); a parameter the resamples do not move gets its bounds' uniform sd")
    return kernel_fits.uncertainty([p[0] for p in FITTED], cov, rule)


def uncertainty(path: Path | None = None) -> dict | None:
    """The end-to-end parameters' uncertainty as written by ``--fit --write`` (efficiency.toml's
    ``[uncertainty.end_to_end]``: params, log_sd, log_corr, rule), or None."""
    import tomllib
    path = path or Path(catalog.__file__).with_name("efficiency.toml")
    with open(path, "rb") as fh:
        return tomllib.load(fh).get("uncertainty", {}).get("end_to_end")


CV_BY = ("hardware", "family", "model", "runtime", "decade")


def cross_validate(cases: pd.DataFrame, truth: pd.DataFrame, by: str, only=None,
                   params: dict | None = None, hold: dict | None = None) -> pd.DataFrame:
    """Refit without each group of ``by`` (``CV_BY``: "hardware", "family", "model", "runtime"
    or "decade", ``holdout_key``) and predict that group; ``held_out`` names it. Without a
    runtime, its own per-runtime parameters (``"<name>.<runtime>"``) have nothing to fit them:
    they get the other runtimes' geometric mean (``_held_out_runtime``). ``only``: the groups
    to leave out (every group by default); ``params``: a dict that receives, per group left
    out, the numbers it was predicted with (which number moves without it); ``hold``: numbers
    set, not refitted (``fit``)."""
    prep = prepare(cases, file="cases.csv")
    key = holdout_key(cases, by)
    groups = sorted(key.unique())
    if only is not None:
        unknown = sorted(set(only) - set(groups))
        if unknown:
            raise InputError(f"no {by} group named {', '.join(unknown)} in the cases",
                             hint="one of " + ", ".join(groups))
        groups = [g for g in groups if g in set(only)]
    parts = []
    for g in groups:
        out = (key == g).to_numpy()
        theta = fit(cases, truth, keep=~out, verbose=False, prep=prep, hold=hold)
        if by == "runtime":
            theta = {**_held_out_runtime(theta, g), **(hold or {})}
        if params is not None:
            params[g] = dict(theta)
        j = _residuals(prep, cases, truth, theta)
        j = j.assign(w=weights(j))       # each case's weight in the fit, over all the cases
        parts.append(j[j["case_id"].isin(set(cases["case_id"][out]))].assign(held_out=g))
    return pd.concat(parts, ignore_index=True)


def holdout_key(cases: pd.DataFrame, by: str) -> pd.Series:
    """The group of each case that ``cross_validate`` leaves out together: its ``hardware``, its
    model ``family``, its ``model`` (catalog id), its ``runtime`` (blank: the catalog's default)
    or its concurrency ``decade`` ("1-9", "10-99", "100-999", "1000+"; "offline" for a blank
    concurrency; a row at a request rate by its derived concurrency, else "open-loop")."""
    if by == "hardware":
        return cases["hardware"].astype(str)
    if by == "family":
        return cases["model"].map(model_family)
    if by == "model":
        return cases["model"].astype(str)
    if by == "runtime":
        default = str(REGISTRY["serving.runtime"].default)
        rt = cases["runtime"] if "runtime" in cases else pd.Series(np.nan, index=cases.index)
        return rt.fillna(default).astype(str).replace("", default)
    if by == "decade":
        return pd.Series([concurrency_decade(c, r) for c, r in zip(
            _numeric(cases, "concurrency"), _open_loop_concurrency(cases))], index=cases.index)
    raise InputError(f"unknown cross-validation grouping {by!r}",
                     hint="one of " + ", ".join(CV_BY))


def _numeric(cases: pd.DataFrame, col: str) -> np.ndarray:
    blank = pd.Series(np.nan, index=cases.index)
    return pd.to_numeric(cases.get(col, blank), errors="coerce").to_numpy(float)


def _open_loop_concurrency(cases: pd.DataFrame) -> np.ndarray:
    """Per case: NaN unless it is served at a request rate; then its derived (Little's-law)
    concurrency where the case file gave one, else 0."""
    rate = np.nan_to_num(_numeric(cases, RATE))
    derived = np.nan_to_num(_numeric(cases, "derived_concurrency"))
    return np.where(rate > 0, derived, np.nan)


def concurrency_decade(concurrency: float, open_loop: float = np.nan) -> str:
    """"1-9", "10-99", "100-999" or "1000+" for a concurrency; "offline" when it is blank
    (NaN), unless the case runs at a request rate (``open_loop``: its derived concurrency, or 0
    where none is known: "open-loop")."""
    c = concurrency if np.isfinite(concurrency) else open_loop
    if not np.isfinite(c):
        return "offline"
    if c < 1:
        return "open-loop"
    if c < 10:
        return "1-9"
    if c < 100:
        return "10-99"
    return "100-999" if c < 1000 else "1000+"


def _held_out_runtime(theta: dict, runtime: str) -> dict:
    """``theta`` with each ``"<name>.<runtime>"`` of the held-out ``runtime`` replaced by the
    geometric mean of ``"<name>.<other>"`` over the other runtimes (kept where there is none)."""
    out = dict(theta)
    for key in theta:
        name, _, rt = key.rpartition(".")
        if not name or rt != runtime:
            continue
        others = [v for k, v in theta.items() if k != key and k.rpartition(".")[0] == name]
        if others:
            out[key] = float(np.exp(np.mean(np.log(others))))
    return out


def model_family(model_id: str) -> str:
    """The family a catalog model belongs to (its id up to the first dash)."""
    return str(model_id).split("-")[0]


def tables(theta: dict, cases: pd.DataFrame, unc: dict | None = None) -> dict:
    """efficiency.toml's tables: ``default`` (the fitted and fixed numbers) and, with ``unc``
    (``bootstrap``), ``uncertainty`` {"end_to_end": unc}."""
    today = _dt.date.today().isoformat()
    hws = ", ".join(sorted(cases["hardware"].unique()))
    runtimes = ", ".join(sorted(holdout_key(cases, "runtime").unique()))
    n = int(fittable(cases).sum())
    sd = "" if not unc else "; log-space sd " + ", ".join(
        f"{k} {s:.3f}" for k, s in zip(unc["params"], unc["log_sd"])) + " (bootstrap)"
    per_rt: dict = {}
    per_fe: dict = {}
    for name, v in theta.items():
        if "." in name and name in {p[0] for p in PARAMS}:
            field, rt = name.split(".", 1)
            (per_fe if rt in FRONT_END_NAMES else per_rt).setdefault(rt, {})[field] = v
        elif name in RUNTIME_FIELDS:       # one number for every runtime, in each one's table
            for rt in RUNTIMES:
                per_rt.setdefault(rt, {})[name] = v
    out = {"default": {**{p[0]: theta[p[0]] for p in PARAMS
                          if "." not in p[0] and p[0] not in RUNTIME_FIELDS}, **FIXED,
                       "fitted_on": (
                           f"{n} of {len(cases)} cases of ../shared/calibration ({hws}; "
                           f"{runtimes}; the online rows at an infinite request rate and the "
                           "cases whose TTFT is flagged queue_suspect, TTFT and TPOT, and the "
                           "TTFTs flagged cold_start are not fitted), on top of the kernel fits, "
                           "shared by every chip"
                           + sd + "; not fitted, from sources: "
                           + "; ".join(f"{k} = {v:.3g} s ({src})"
                                       for k, (v, src) in SOURCED.items())
                           + f"; fitted {today}")}}
    if per_rt:
        out["runtimes"] = per_rt
    if per_fe:
        out["front_ends"] = per_fe
    if unc:
        out["uncertainty"] = {"end_to_end": unc}
    return out


def _named_tables(tables: dict, kind: str) -> list[str]:
    """``[kind.name]`` TOML tables of ``tables[kind]`` ({name: {field: value}}), sorted."""
    lines = []
    for name, vals in sorted(tables.get(kind, {}).items()):
        lines.append(f"[{kind}.{name}]")
        lines += [f"{f} = {v:.6g}" for f, v in sorted(vals.items())]
        lines.append("")
    return lines


def write_efficiency(tables: dict, path: Path | None = None) -> Path:
    path = path or Path(catalog.__file__).with_name("efficiency.toml")
    lines = ["# End-to-end remainder of the serving model (dse.calibration.fit): what end-to-end serving adds",
             "# to the fitted kernels (dse/catalog/kernels) -- a fixed time per layer (eager steps; decode-only",
             "# steps replayed as CUDA graphs), none per step,",
             "# shared by every chip, the front end's time per request (the runtimes' own servers;",
             "# Dynamo's front end) and per runtime the scheduler's per running sequence, fitted on",
             "# ../shared/calibration -- and the factors kept at their physical priors. Written by",
             "# `python -m dse.calibration.calibrate --fit --write`; do not edit by hand. A chip may",
             "# get its own table; `default` applies to the others.", ""]
    for k in ["default"] + sorted(k for k in tables
                                  if k not in ("default", "uncertainty", "runtimes",
                                               "front_ends")):
        lines.append(f"[{k}]")
        for f in (*EFF_FIELDS, "fitted_on"):
            if f in tables[k]:
                v = tables[k][f]
                lines.append(f'{f} = "{v}"' if isinstance(v, str) else f"{f} = {v:.6g}")
        lines.append("")
    if tables.get("runtimes"):
        lines += ["# the runtimes' host times (serving.request_overhead_s: their own server per request;",
                  "# serving.seq_overhead_s: the scheduler per running sequence per step;",
                  "# serving.frontend_*: the serial front end per prompt token, output token and",
                  "# repeated text token, dse.perf.frontend), fitted with the default table above; a",
                  "# design's own [serving] value wins"]
    lines += _named_tables(tables, "runtimes")
    if tables.get("front_ends"):
        lines += ["# a front end's numbers (serving.request_overhead_s: its time per request),",
                  "# for the calibration rows served through it",
                  "# (dse.calibration.harness_rules.FRONT_ENDS: Dynamo's front end for",
                  "# aiconfigurator's benchmark rows); no design field selects one"]
    lines += _named_tables(tables, "front_ends")
    for fam, u in tables.get("uncertainty", {}).items():
        lines += [f"# uncertainty of the fitted numbers: {u['rule']}",
                  f"[uncertainty.{fam}]",
                  "params = [" + ", ".join(f'"{n}"' for n in u["params"]) + "]",
                  "log_sd = [" + ", ".join(f"{x:.4g}" for x in u["log_sd"]) + "]",
                  "log_corr = [" + ", ".join("[" + ", ".join(f"{x:.3g}" for x in row) + "]"
                                             for row in u["log_corr"]) + "]",
                  f'rule = "{u["rule"]}"', ""]
    path.write_text("\n".join(lines))
    catalog.accelerators.cache_clear()    # the builder's tables rebuild with the cache
    catalog.runtime_defaults.cache_clear()
    catalog.front_end_defaults.cache_clear()
    return path
