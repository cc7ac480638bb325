"""The calibration set (``../shared/calibration``: measured end-to-end serving cases and their
truths) and the model's error on it: the geometric mean over cases of ``max(pred/true,
true/pred)``, each case weighted so that every (source, hardware) pair counts equally within a
source. Read by the end-to-end fit (``fit``), its report (``calibrate``) and the kernel data
layer (``kernels.data``, for the folder).

Two serving sets are read (``SETS``) and concatenated: ``cases.csv``/``truth.csv`` (the
TensorRT-LLM v0.17 offline and v0.14 online tables) and ``silicon_hopper_cases.csv``/
``silicon_hopper_truth.csv`` (source ``AIC-SILICON``: the Hopper rows of aiconfigurator-core's
silicon sample; skipped when absent). ``silicon_sample.csv`` itself is never read (the folder's
README: its other rows are held out).

At load, inputs and fixes the case files do not state as columns are applied:

- ``OPEN_LOOP``: sources measured at a fixed Poisson request rate (TensorRT-LLM v0.14 online:
  ``QPS=2`` or ``QPS=16`` in each row's ``note``). Their rows get the dotted column
  ``workload.request_rate_per_s`` (dse's request-rate path, dse/perf/queueing.py), and their
  Little's-law concurrency moves to ``derived_concurrency`` (a case gives a rate or a
  concurrency, not both: contracts/predict-cases.md). A row whose rate cannot be read (``QPS=INF``,
  500 requests at once) keeps its columns.
- ``SOURCE_INPUTS``: ``{source: {dotted_column: value}}``, an input every case of a source shares
  (e.g. a runtime version's fixed per-request time); a case that gives the column itself keeps
  its own value.
- the harnesses' and recipes' rules (``dse.calibration.harness_rules``): layouts the export
  wrote wrong, the front end a deployment served through, the token budgets, scheduler loops and
  recipe settings a harness launched its runtime with, and the TTFTs measured while kernels
  compiled (flagged ``cold_start``: reported apart, never fitted).

Truths of the cases whose ``quality_flag`` says ``queue_suspect`` (a closed-loop TTFT that looks
dominated by queueing; the case's TPOT too: its running batch is unknown) are reported in their
own group (``joined``: source + ``QUEUE_SUSPECT``) and never fitted (``fit``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

# the rules' names, read here by the fit, the report and the tests
from dse.calibration.harness_rules import (  # noqa: F401
    BUDGET,
    COLD_STARTS,
    FRONT_END,
    FRONT_ENDS,
    LAYOUT_RULES,
    LOOP,
    MATCH_COLUMNS,
    RECIPES,
    SCHEDULER_LOOPS,
    STREAM,
    STREAM_INTERVALS,
    TOKEN_BUDGETS,
    apply_front_ends,
    apply_layout_rules,
    apply_recipes,
    apply_scheduler_loops,
    apply_stream_intervals,
    apply_token_budgets,
    cold_start_cases,
    front_ends,
    layout_rule_rows,
    mark_cold_starts,
    recipe_rows,
    version_tuple,
)
from dse.errors import InputError
from dse.scoring.predict import read_cases

METRICS = ("output_tokens_per_s_per_chip", "ttft_s", "tpot_s", "input_tokens_per_s_per_chip")
# (cases file, truth file, required): the serving sets, concatenated in this order
SETS = (("cases.csv", "truth.csv", True),
        ("silicon_hopper_cases.csv", "silicon_hopper_truth.csv", False))
RATE = "workload.request_rate_per_s"
# source -> the pattern of its note that gives the Poisson request rate (requests/s)
OPEN_LOOP = {"TRTLLM-ONLINE": r"QPS=([0-9]+(?:\.[0-9]*)?)(?![0-9A-Za-z.])"}
# source -> {dotted column: value}, applied where a case leaves the column blank; filled by the
# end-to-end parameters that describe a source's runtime version rather than the model
SOURCE_INPUTS: dict[str, dict[str, float | str]] = {
    # TensorRT-LLM's perf-overview tables (v0.17 offline, v0.14 online at a request rate) were
    # measured with its C++ benchmark driving the executor in-process: no HTTP front end, no
    # serial tokenizer or streaming process (dse.perf.frontend)
    **{src: {"serving.request_overhead_s": 0.0, "serving.frontend_prompt_token_s": 0.0,
             "serving.frontend_token_s": 0.0, "serving.frontend_text_token_s": 0.0}
       for src in ("TRTLLM-V017", "TRTLLM-ONLINE")},
}
COLD_START = " (cold start)"
QUEUE_SUSPECT = " (queue suspect)"
NO_CONCURRENCY = " (max rate, no concurrency)"


def default_dir() -> Path:
    """``../shared/calibration`` next to the checkout, or $DSE_CALIBRATION_DIR."""
    env = os.environ.get("DSE_CALIBRATION_DIR")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parents[2]
    for base in (here, Path.cwd()):
        cand = base.parent / "shared" / "calibration"
        if cand.is_dir():
            return cand
    raise InputError("calibration folder not found", where="../shared/calibration",
                     hint="set DSE_CALIBRATION_DIR to the folder with cases.csv and truth.csv")


def load(folder: Path | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every serving set of the folder (``SETS``) as one cases frame and one truth frame, with
    the open-loop rates (``OPEN_LOOP``) and the sources' inputs (``SOURCE_INPUTS``) applied."""
    folder = Path(folder) if folder else default_dir()
    parts_c, parts_t = [], []
    for cases_file, truth_file, required in SETS:
        if not required and not (folder / cases_file).exists():
            continue
        parts_c.append(read_cases(str(folder / cases_file)))
        try:
            parts_t.append(pd.read_csv(folder / truth_file))
        except FileNotFoundError:
            raise InputError("file not found", file=str(folder / truth_file),
                             hint=f"the truths of {cases_file}") from None
    cases = pd.concat(parts_c, ignore_index=True)
    dup = cases["case_id"].duplicated()
    if dup.any():
        raise InputError(f"case_id {cases['case_id'][dup].iloc[0]!r} is in two case files",
                         file=str(folder), hint="case ids must be unique across the sets")
    cases = apply_front_ends(apply_source_inputs(apply_layout_rules(apply_open_loop(cases))))
    cases = apply_recipes(apply_scheduler_loops(apply_token_budgets(cases)))
    return cases, mark_cold_starts(cases, pd.concat(parts_t, ignore_index=True))


def open_loop_rate(cases: pd.DataFrame) -> np.ndarray:
    """The Poisson request rate (requests/s) each case of an ``OPEN_LOOP`` source was measured
    at, read from its note; NaN for the others and where no finite positive rate is stated."""
    rate = pd.Series(np.nan, index=cases.index)
    if "note" not in cases or "source" not in cases:
        return rate.to_numpy()
    for source, pattern in OPEN_LOOP.items():
        rows = cases["source"].astype(str).eq(source)
        got = cases.loc[rows, "note"].astype(str).str.extract(pattern, expand=False)
        rate[rows] = pd.to_numeric(got, errors="coerce")
    r = rate.to_numpy(float)
    return np.where(np.isfinite(r) & (r > 0), r, np.nan)


def apply_open_loop(cases: pd.DataFrame) -> pd.DataFrame:
    """``cases`` with the ``OPEN_LOOP`` rows scored at their request rate: ``RATE`` set, their
    concurrency moved to ``derived_concurrency`` (a rate and a concurrency are not both given)."""
    rate = open_loop_rate(cases)
    on = np.isfinite(rate)
    if not on.any():
        return cases
    cases = cases.copy()
    conc = cases["concurrency"] if "concurrency" in cases else pd.Series(np.nan, index=cases.index)
    cases["derived_concurrency"] = conc.where(on)
    cases["concurrency"] = conc.where(~on)
    given = pd.to_numeric(cases[RATE], errors="coerce") if RATE in cases else \
        pd.Series(np.nan, index=cases.index)
    cases[RATE] = given.where(given.notna(), pd.Series(rate, index=cases.index))
    return cases


def apply_source_inputs(cases: pd.DataFrame, inputs: dict | None = None) -> pd.DataFrame:
    """``cases`` with each source's ``SOURCE_INPUTS`` (or ``inputs``) written where blank."""
    inputs = SOURCE_INPUTS if inputs is None else inputs
    if not inputs:
        return cases
    cases = cases.copy()
    src = cases["source"].astype(str)
    for source, cols in inputs.items():
        rows = src.eq(source)
        for col, value in cols.items():
            if col not in cases:
                cases[col] = pd.Series(np.nan, index=cases.index, dtype=object)
            cases[col] = cases[col].astype(object)
            cases.loc[rows & cases[col].isna(), col] = value
    return cases


def cold_start(truth: pd.DataFrame) -> np.ndarray:
    """Truth rows flagged ``cold_start`` (``mark_cold_starts``): TTFTs that hold kernel
    compiles, reported apart and never fitted."""
    if "quality_flag" not in truth:
        return np.zeros(len(truth), bool)
    return truth["quality_flag"].fillna("").astype(str).str.contains("cold_start").to_numpy()


def set_apart(truth: pd.DataFrame) -> np.ndarray:
    """Truth rows reported apart and never fitted: ``queue_suspect`` and ``cold_start``."""
    return queue_suspect(truth) | cold_start(truth)


def queue_suspect(truth: pd.DataFrame) -> np.ndarray:
    """Truth rows of the cases whose ``quality_flag`` marks a TTFT dominated by queueing (not
    fitted): every metric of such a case, its TPOT too. When requests wait in a queue the
    runtime is not running ``concurrency`` sequences, so the batch its TPOT was measured at is
    unknown (gpt-oss-120b on H100 under vLLM at concurrency 512: TTFTs of 20-460 s beside TPOTs
    of 4-27 ms, the step of a far smaller batch)."""
    if "quality_flag" not in truth:
        return np.zeros(len(truth), bool)
    flagged = truth["quality_flag"].fillna("").astype(str).str.contains("queue_suspect")
    return truth["case_id"].isin(set(truth.loc[flagged, "case_id"])).to_numpy()


def joined(pred: pd.DataFrame, cases: pd.DataFrame, truth: pd.DataFrame) -> pd.DataFrame:
    """One row per (case, metric) with prediction, truth and the case's source and hardware."""
    t = truth.merge(cases[["case_id", "hardware", "model"]], on="case_id")
    long = pred.melt(id_vars="case_id", value_vars=[m for m in METRICS if m in pred.columns],
                     var_name="metric", value_name="pred")
    j = t.merge(long, on=["case_id", "metric"], how="left")
    j["factor"] = np.exp(np.abs(np.log(j["pred"].astype(float) / j["value"].astype(float))))
    # online rows at an infinite request rate carry no concurrency (fittable): their own
    # group in every report, never mixed into the rows whose inputs are known
    ok = pd.Series(fittable(cases), index=cases.index).groupby(cases["case_id"]).first()
    unknown = ~j["case_id"].map(ok).fillna(True).astype(bool)
    j.loc[unknown, "source"] = j.loc[unknown, "source"] + NO_CONCURRENCY
    # TTFTs that look dominated by queueing: their own group too (never fitted)
    qs = queue_suspect(j)
    j.loc[qs, "source"] = j.loc[qs, "source"] + QUEUE_SUSPECT
    # TTFTs that hold kernel compiles: their own group too (never fitted)
    cs = cold_start(j) & ~qs
    j.loc[cs, "source"] = j.loc[cs, "source"] + COLD_START
    return j


def weights(j: pd.DataFrame) -> np.ndarray:
    """Each (source, metric, hardware) group gets equal total weight within its (source, metric)."""
    n = j.groupby(["source", "metric", "hardware"])["case_id"].transform("count")
    return 1.0 / n.to_numpy(dtype=float)


def fittable(cases: pd.DataFrame) -> np.ndarray:
    """Cases whose inputs are known: online-serving rows at an infinite request rate carry no
    concurrency (their concurrency was bounded by the 500 requests sent, not by the runtime),
    so they are reported but not fitted. A row at a request rate (``RATE``) is known."""
    blank = pd.Series(np.nan, index=cases.index)
    conc = pd.to_numeric(cases.get("concurrency", blank), errors="coerce")
    rate = pd.to_numeric(cases.get(RATE, blank), errors="coerce").fillna(0.0)
    online = cases["source"].astype(str).str.contains("ONLINE") if "source" in cases else False
    return ~(np.asarray(online) & conc.isna().to_numpy() & (rate <= 0).to_numpy())
