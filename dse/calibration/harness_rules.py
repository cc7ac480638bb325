"""The harnesses' and recipes' rules: what a benchmark harness or a launch recipe gave the
runtime that the case files do not state as columns, written on the cases at load
(``dse.calibration.cases.load``) where a case leaves the column blank.

- ``LAYOUT_RULES``: a layout the export wrote wrong for a whole class of rows, fixed by a
  stated rule (``apply_layout_rules``; the rule and its evidence at the constant).
- ``FRONT_ENDS``: the front end a case's deployment served through where it is not the
  runtime's own server (the ``front_end`` column: "dynamo" for aiconfigurator's benchmark
  template), and that front end's fitted numbers (efficiency.toml [front_ends.*]).
- ``TOKEN_BUDGETS``: the token budget per step a harness launched its deployments with where
  it is not the runtime's default (aiconfigurator's template: one whole prompt and a margin
  beside the running decodes), as ``serving.max_num_tokens``.
- ``SCHEDULER_LOOPS``: the scheduler loop a harness's deployments ran where it is not the
  runtime's default (aiconfigurator's template's vLLM 0.12 rows: synchronous), as
  ``serving.overlap_schedule``.
- ``RECIPES``: settings a harness's launch recipe gave the runtime for a class of rows (InferenceX's
  TensorRT-LLM Llama-3.1-70B recipe: its token budget, and batch waiting at 1k/1k below tp 8),
  written as their ``serving.*`` columns where blank.

Recorded, not applied at load: ``STREAM_INTERVALS``, the tokens per streamed chunk InferenceX's
TensorRT-LLM and SGLang recipes set (10 or 20; ``apply_stream_intervals`` writes them as
``serving.stream_interval``). Applied, they leave the in-sample fit as it is (TTFT 1.339 ->
1.341) but take SGLang's DeepSeek rows off the fitted repeated-text term
(``frontend_text_token_s.sglang``), which only SGLang's rows behind Dynamo then pin: with
Llama-3.1-8B left out it goes 27 ns -> 509 ns and that fold's TTFT 1.58 -> 1.86
(reports/end-to-end/prefill-ttft.md, twenty-first pass). The term stands for more than the text
SGLang repeats (a source puts that at 4 ns a token), and the interval waits for it to be split.

TTFTs measured where a runtime compiled kernels while the benchmark ran (``COLD_STARTS``: a
server started fresh, a client that sent no warm-up, kernels JIT-compiled in memory on first use)
are flagged ``cold_start`` at load (``mark_cold_starts``) and, like the queue-suspect ones,
reported in their own group (source + ``dse.calibration.cases.COLD_START``) and never fitted: a
mean over 10 C requests whose first wave waited for compiles is not the steady state dse
models. Their TPOTs are kept.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from dse import catalog

# Layouts the export wrote wrong for a whole class of rows: (name, rule) with the rule's fields
# ``runtime``, ``harness`` (a pattern of ``length_dist``), ``measured_before`` (the date in the
# citation's ``measured=``), and what it sets. InferenceX's single-node TensorRT-LLM recipes
# launched ``trtllm-serve --ep_size=$TP`` until its search-space configs arrived on 2025-11-03
# (SemiAnalysisAI/InferenceX benchmarks/dsr1_fp8_h200_trt_slurm.sh ``EP_SIZE="$TP"`` from
# 2025-09-18 to 2025-10-29, gptoss_fp4_h200_trt_slurm.sh ``--ep_size=$TP`` at e06929c70,
# 2025-11-01; commit 17d5e204f, 2025-11-03, put ``ep`` in .github/configs/nvidia-master.yaml:
# ``ep: 8`` at tp 8 for DeepSeek-R1 and ep = tp for gpt-oss, "For all sequence lengths, EP=TP",
# in a commit titled "no perf changes": the recipes' behaviour written down). aiconfigurator's
# 2026-04-06.csv export labels those runs ``ep1``; the same DeepSeek deployment re-measured on
# 2025-12-15 (db-dump/2026-04-27, ep 8) gives TPOTs within 0.3% of them (median ratio 0.997).
# So an MoE model's rows of such runs at tp > 1 and ep 1 ran ep = tp.
LAYOUT_RULES = (
    ("InferenceX TensorRT-LLM recipes before 2025-11-03: ep = tp",
     {"runtime": "trtllm", "harness": r"InferenceX", "measured_before": "2025-11-03",
      "set_ep_to_tp": True}),
)
MEASURED = r"measured=(\d{4}-\d{2}-\d{2})"
# the front end a case's deployment served through, where it is not the runtime's own OpenAI
# server: a pattern of the case's ``length_dist`` (the benchmark harness the conversion names)
# -> the front end, written to the ``front_end`` column. aiconfigurator's benchmark template
# (the "gap-analysis" rows of silicon_hopper_*: "AIC bench template uses aiperf fixed L") sends
# ``aiperf profile ... --extra-inputs {"nvext":{"ignore_eos":true}}`` (a Dynamo extension) to the
# deployment aiconfigurator's generator launches: ``python3 -m dynamo.frontend`` (HTTP server,
# tokenizer, router) in front of ``python3 -m dynamo.<runtime>`` workers, for all three runtimes
# (ai-dynamo/aiconfigurator src/aiconfigurator/generator/config/backend_templates/
# benchmark/bench_run.sh.j2 and {sglang,trtllm,vllm}/run.sh.j2). InferenceX's rows ran each
# runtime's own server. The front end's fitted numbers (efficiency.toml [front_ends.*],
# dse.calibration.fit) are written on its rows as ``serving.<field>`` where blank.
FRONT_ENDS = {r"AIC bench template": "dynamo"}
# The token budget per step a harness's deployments were launched with, where it is not the
# runtime's default (serving.toml max_num_tokens): a pattern of ``length_dist`` -> {runtime:
# (running, margin)}, the budget ``running x C / dp + isl + margin`` tokens a scheduler
# (attention-DP rank), written to ``serving.max_num_tokens`` where blank. aiconfigurator's
# generator writes these for its benchmark template's aggregated workers
# (ai-dynamo/aiconfigurator src/aiconfigurator/generator/rule_plugin/{trtllm,vllm,sglang}.rule
# at v0.5.0, 2025-12-23, and v0.6.0, 2026-02-12, the releases before the rows were measured):
# TensorRT-LLM and vLLM ``agg max_num_tokens = max_batch_size + SlaConfig.isl + 1500``, its
# batch (the sweep's sequences per worker, the row's C / dp) of decode tokens beside one whole
# prompt and a margin; SGLang ``max_prefill_tokens = SlaConfig.isl + 1500``, from which its
# PrefillAdder takes the running sequences' decodes (sgl-project/sglang python/sglang/srt/
# managers/schedule_policy.py: ``rem_input_tokens = max_prefill_tokens - running_bs``). dse's
# budget holds a step's decodes and its prompt tokens (dse.perf.phases.prompt_load), as theirs.
TOKEN_BUDGETS = {r"AIC bench template": {"trtllm": (1.0, 1500.0), "vllm": (1.0, 1500.0),
                                         "sglang": (0.0, 1500.0)}}
BUDGET = "serving.max_num_tokens"
# The scheduler loop a harness's deployments ran where it is not the runtime's default
# (serving.toml [runtimes.*] overlap_schedule), in ``RECIPES``' format (``version_below``: the
# rows' backend_version). vLLM turned async scheduling on by default
# in 0.14.0 (PR 27614; 0.11.1-0.13.0 vllm/config/scheduler.py ``async_scheduling: bool =
# False``); aiconfigurator's template maps ``disable_overlap_scheduler`` to nothing for vLLM
# (generator/config/backend_config_mapping.yaml, v0.6.0) and Dynamo 0.8-0.9's ``dynamo.vllm``
# does not set it, so the template's vLLM 0.12.0 rows ran the synchronous EngineCore.step.
# InferenceX's recipes passed ``async-scheduling: true`` to vLLM 0.10.2-0.11.2 (e.g.
# benchmarks/gptoss_fp4_h100_slurm.sh at 4e135fd3f): its rows keep the default.
# reports/end-to-end/scheduler-loops.md has the table for every runtime and version of the set.
LOOP = "serving.overlap_schedule"
SCHEDULER_LOOPS = (
    ("aiconfigurator template, vLLM before 0.14: synchronous loop",
     {"runtime": "vllm", "harness": r"AIC bench template", "version_below": (0, 14)},
     {LOOP: 0.0}),
)
# The tokens per streamed chunk a harness's recipe launched the runtime with, where it is not the
# runtime's default (serving.toml [runtimes.*] stream_interval = 1), in ``RECIPES``' format;
# rows served through a Dynamo image (their citation names ai-dynamo: other recipes) are left
# alone (``not_via``). Each recipe sets the same value at every
# SemiAnalysisAI/InferenceX commit in force on the rows' measured dates (2025-10-29 to
# 2026-03-27: 9596d23d7, e06929c70, f6a9d0b6a, d8cc89778, 749096c4c, 12ba0ae07, 79a42e20a).
_INFERENCEX_H200 = {"hardware": "h200-sxm", "harness": r"InferenceX", "not_via": "ai-dynamo"}
STREAM_INTERVALS = (
    ("InferenceX benchmarks/dsr1_fp8_h200_trt_slurm.sh, later single_node/dsr1_fp8_h200_trt.sh: "
     "extra_llm_api_options stream_interval: 10",
     {"runtime": "trtllm", "model": "deepseek-v3", **_INFERENCEX_H200},
     {"serving.stream_interval": 10.0}),
    ("InferenceX benchmarks/gptoss_fp4_h200_trt_slurm.sh, later gptoss_fp4_h200_trt.sh: "
     "stream_interval: 20",
     {"runtime": "trtllm", "model": "gpt-oss-120b", **_INFERENCEX_H200},
     {"serving.stream_interval": 20.0}),
    ("InferenceX benchmarks/70b_fp8_h200_trt_slurm.sh (9596d23d7): stream_interval: 10",
     {"runtime": "trtllm", "model": "llama-3.1-70b", **_INFERENCEX_H200},
     {"serving.stream_interval": 10.0}),
    ("InferenceX benchmarks/dsr1_fp8_h200_slurm.sh, later single_node/dsr1_fp8_h200.sh: "
     "sglang.launch_server --stream-interval 10",
     {"runtime": "sglang", "model": "deepseek-v3", **_INFERENCEX_H200},
     {"serving.stream_interval": 10.0}),
)
STREAM = "serving.stream_interval"
# Settings a harness's launch recipe gave the runtime: (recipe, match, settings). ``match``: the
# rows' ``runtime``, ``model``, ``hardware``, ``harness`` (a pattern of ``length_dist``) and, where
# given, their nominal ``isl`` and ``osl``, ``tp_below`` and ``not_via`` (a citation pattern that
# excludes a row; every key: ``recipe_rows``); ``settings``: ``serving.*`` values
# written where a case leaves them blank. SemiAnalysisAI/InferenceX
# benchmarks/70b_fp8_h200_trt_slurm.sh at 9596d23d7 (in force on the rows' 2025-10-29) launches
# ``trtllm-serve --max_num_tokens 16384`` and, "for 1k/1k ... and TP < 8",
# ``batch_wait_max_tokens_ratio: 0.9`` and ``batch_wait_timeout_iters: 20`` (TensorRT-LLM
# py_executor.py ``_waiting_requests``: prompts are held while decodes run until their tokens
# reach 0.9 x 16384 or 20 iterations pass; dse.perf.phases.batch_wait_s).
RECIPES = (
    ("InferenceX 70b_fp8_h200_trt_slurm.sh: --max_num_tokens 16384",
     {"runtime": "trtllm", "model": "llama-3.1-70b", "hardware": "h200-sxm",
      "harness": r"InferenceX"},
     {"serving.max_num_tokens": 16384.0}),
    ("InferenceX 70b_fp8_h200_trt_slurm.sh, 1k/1k and tp < 8: batch_wait_timeout_iters 20, "
     "batch_wait_max_tokens_ratio 0.9",
     {"runtime": "trtllm", "model": "llama-3.1-70b", "hardware": "h200-sxm",
      "harness": r"InferenceX", "isl": 1024, "osl": 1024, "tp_below": 8},
     {"serving.batch_wait_iters": 20.0, "serving.batch_wait_tokens_fraction": 0.9}),
)
# Runs whose TTFT holds kernel compiles (see the module docstring): (name, match) in ``RECIPES``'
# format, ``model`` the checkpoints whose FP8 weights are block-scaled (128 x 128) and
# ``measured_before`` the date in the citation's ``measured=``. TensorRT-LLM runs
# DeepSeek-V3/R1's FP8 block-scale GEMMs on Hopper through DeepGEMM, compiled with NVRTC and
# "stored in memory by default"
# (NVIDIA/TensorRT-LLM examples/models/core/deepseek_v3/README.md, DeepGEMM); the kernel is
# chosen from the token count M (cpp/include/tensorrt_llm/deep_gemm jit_utils.cuh
# get_best_gemm_config: block_m, block_n and TMA multicast by M), and the server's start-up
# warm-up runs one context forward at max_num_tokens and the CUDA-graph decode batches
# (tensorrt_llm/_torch/pyexecutor/model_engine.py warmup), so the prompts' token counts compile
# kernels while measured (~1 s each with NVRTC, deepseek-ai/DeepGEMM PR 94). InferenceX started
# the server fresh per configuration (runners/launch_h200-*.sh) and its client sent no warm-up
# until SemiAnalysisAI/InferenceX d053ae24e (2026-01-21, --num-warmups 2 x concurrency); the same
# deployment measured twice before then gives TPOTs within 0.3% and TTFTs up to 2x apart.
COLD_STARTS = (
    ("TensorRT-LLM, FP8 block-scale DeepGEMM JIT on Hopper, InferenceX client without warm-up",
     {"runtime": "trtllm", "model": ("deepseek-v3",), "hardware": ("h100-sxm", "h200-sxm"),
      "harness": r"InferenceX", "measured_before": "2026-01-21"}),
)
FRONT_END = "front_end"


def layout_rule_rows(cases: pd.DataFrame, rule: dict) -> np.ndarray:
    """The cases a ``LAYOUT_RULES`` rule changes: its runtime and harness, measured before its
    date, an MoE model (``catalog.models``) at tp > 1, ep 1 and dp 1."""
    need = ("runtime", "length_dist", "citation", "model", "tp", "ep")
    if any(col not in cases for col in need):
        return np.zeros(len(cases), bool)
    moe = {name for name, m in catalog.models().items() if m.num_experts > 0}
    measured = cases["citation"].fillna("").astype(str).str.extract(MEASURED, expand=False)
    dp = pd.to_numeric(cases["dp"], errors="coerce").fillna(1) if "dp" in cases else 1
    tp = pd.to_numeric(cases["tp"], errors="coerce")
    ep = pd.to_numeric(cases["ep"], errors="coerce")
    on = (cases["runtime"].astype(str).eq(rule["runtime"])
          & cases["length_dist"].fillna("").astype(str).str.contains(rule["harness"], regex=True)
          & measured.notna() & (measured.fillna("9999") < rule["measured_before"])
          & cases["model"].astype(str).isin(moe) & (tp > 1) & (ep == 1) & (dp == 1))
    return on.to_numpy(bool)


def apply_layout_rules(cases: pd.DataFrame, rules=None) -> pd.DataFrame:
    """``cases`` with each ``LAYOUT_RULES`` rule (or ``rules``) applied to the rows it covers
    (``layout_rule_rows``), the rule's name appended to their ``note``."""
    rules = LAYOUT_RULES if rules is None else rules
    out = cases
    for name, rule in rules:
        on = layout_rule_rows(out, rule)
        if not on.any():
            continue
        out = out.copy() if out is cases else out
        if rule.get("set_ep_to_tp"):
            out.loc[on, "ep"] = out.loc[on, "tp"]
        if "note" in out:
            out["note"] = out["note"].astype(object)
            out.loc[on, "note"] = (out.loc[on, "note"].fillna("").astype(str)
                                   + f"; layout rule: {name}")
    return out


def _blank(cases: pd.DataFrame, col: str) -> np.ndarray:
    """Rows that leave ``col`` blank (all of them where the column is absent)."""
    if col not in cases:
        return np.ones(len(cases), bool)
    return pd.to_numeric(cases[col], errors="coerce").isna().to_numpy()


def _fill(cases: pd.DataFrame, col: str, value: np.ndarray) -> pd.DataFrame:
    """``cases`` with ``value`` written to ``col`` where it is finite (the frame itself where
    no row gets one; a copy otherwise)."""
    on = np.isfinite(value)
    if not on.any():
        return cases
    out = cases.copy()
    given = out[col] if col in out else pd.Series(np.nan, index=out.index)
    out[col] = given.astype(object)
    out.loc[on, col] = value[on]
    return out


def apply_token_budgets(cases: pd.DataFrame, rules: dict | None = None) -> pd.DataFrame:
    """``cases`` with the token budget their harness launched them with (``TOKEN_BUDGETS``, or
    ``rules``) as ``serving.max_num_tokens`` where a case leaves it blank: ``running x C / dp +
    isl + margin`` for the rows of a harness pattern whose runtime the rule names."""
    rules = TOKEN_BUDGETS if rules is None else rules
    if "length_dist" not in cases or not rules:
        return cases
    dist = cases["length_dist"].fillna("").astype(str)
    runtime = cases["runtime"].fillna("").astype(str) if "runtime" in cases else \
        pd.Series("", index=cases.index)
    isl = pd.to_numeric(cases["isl"], errors="coerce").to_numpy(float)
    conc = pd.to_numeric(cases["concurrency"], errors="coerce").fillna(0.0).to_numpy(float)
    dp = (pd.to_numeric(cases["dp"], errors="coerce").fillna(1.0).clip(lower=1.0).to_numpy(float)
          if "dp" in cases else 1.0)
    blank = _blank(cases, BUDGET) & np.isfinite(isl)
    budget = np.full(len(cases), np.nan)
    for pattern, per_runtime in rules.items():
        harness = dist.str.contains(pattern, regex=True).to_numpy()
        for name, (running, margin) in per_runtime.items():
            on = harness & runtime.eq(name).to_numpy() & blank & np.isnan(budget)
            budget[on] = (running * conc / dp + isl + margin)[on]
    return _fill(cases, BUDGET, budget)


def version_tuple(v) -> tuple:
    """"0.12.0" -> (0, 12, 0); "1.0.0rc3" -> (1, 0, 0); () where no leading number."""
    out = []
    for part in str(v).split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        out.append(int(digits))
        if len(digits) < len(part):
            break
    return tuple(out)


def apply_scheduler_loops(cases: pd.DataFrame, rules=None) -> pd.DataFrame:
    """``cases`` with the scheduler loop their deployments ran (``SCHEDULER_LOOPS``, or
    ``rules``) as ``serving.overlap_schedule`` where a case leaves it blank (``apply_recipes``)."""
    return apply_recipes(cases, SCHEDULER_LOOPS if rules is None else rules)


def apply_stream_intervals(cases: pd.DataFrame, rules=None) -> pd.DataFrame:
    """``cases`` with the tokens per streamed chunk their recipe set (``STREAM_INTERVALS``, or
    ``rules``) as ``serving.stream_interval`` where a case leaves it blank (``apply_recipes``)."""
    return apply_recipes(cases, STREAM_INTERVALS if rules is None else rules)


MATCH_COLUMNS = {"runtime": "runtime", "model": "model", "hardware": "hardware",
                 "harness": "length_dist", "isl": "isl", "osl": "osl", "tp_below": "tp",
                 "not_via": "citation", "version_below": "backend_version",
                 "measured_before": "citation"}


def recipe_rows(cases: pd.DataFrame, match: dict) -> np.ndarray:
    """Per case: whether it is one of a rule's rows (``RECIPES``, ``SCHEDULER_LOOPS``,
    ``STREAM_INTERVALS``, ``COLD_STARTS``). Each key of ``match`` narrows them: ``runtime``,
    ``model``, ``hardware`` (a name or a tuple of names), ``harness`` (a pattern of
    ``length_dist``), the nominal ``isl`` and ``osl``, ``tp_below``, ``not_via`` (a citation
    pattern that excludes a row), ``version_below`` (the ``backend_version``) and
    ``measured_before`` (the citation's ``measured=`` date). No row where a column it needs is
    missing."""
    if any(MATCH_COLUMNS[k] not in cases for k in match):
        return np.zeros(len(cases), bool)
    on = np.ones(len(cases), bool)
    for key, want in match.items():
        col = cases[MATCH_COLUMNS[key]]
        text, number = col.fillna("").astype(str), pd.to_numeric(col, errors="coerce").to_numpy()
        if key in ("runtime", "model", "hardware"):
            hit = col.astype(str).isin(want if isinstance(want, tuple) else (want,))
        elif key == "harness":
            hit = text.str.contains(want, regex=True)
        elif key == "not_via":
            hit = ~text.str.contains(want)
        elif key in ("isl", "osl"):
            hit = number == want
        elif key == "tp_below":
            hit = number < want
        elif key == "version_below":
            hit = col.map(lambda v: 0 < len(version_tuple(v)) and version_tuple(v) < want)
        else:                                                        # measured_before
            date = text.str.extract(MEASURED, expand=False).fillna("")
            hit = date.ne("") & (date < want)
        on &= np.asarray(hit, bool)
    return on


def apply_recipes(cases: pd.DataFrame, rules=None) -> pd.DataFrame:
    """``cases`` with the settings of their harness's recipe (``RECIPES``, or ``rules``) written
    as their ``serving.*`` columns where a case leaves them blank."""
    out = cases
    for _, match, settings in (RECIPES if rules is None else rules):
        on = recipe_rows(cases, match)
        for col, v in settings.items():
            out = _fill(out, col, np.where(on & _blank(out, col), v, np.nan))
    return out


def cold_start_cases(cases: pd.DataFrame, rules=None) -> np.ndarray:
    """Per case: whether its run matches a ``COLD_STARTS`` rule (or ``rules``; ``recipe_rows``)."""
    out = np.zeros(len(cases), bool)
    for _, match in (COLD_STARTS if rules is None else rules):
        out |= recipe_rows(cases, match)
    return out


def mark_cold_starts(cases: pd.DataFrame, truth: pd.DataFrame, rules=None) -> pd.DataFrame:
    """``truth`` with ``cold_start`` added to the ``quality_flag`` of the TTFTs of the cases
    ``cold_start_cases`` selects (their other metrics untouched)."""
    ids = set(cases["case_id"][cold_start_cases(cases, rules)])
    on = (truth["case_id"].isin(ids) & truth["metric"].eq("ttft_s")).to_numpy()
    if not on.any():
        return truth
    out = truth.copy()
    flag = out["quality_flag"].fillna("").astype(str) if "quality_flag" in out \
        else pd.Series("", index=out.index)
    out["quality_flag"] = flag.where(~on, (flag + ";cold_start").str.lstrip(";"))
    return out


def front_ends(cases: pd.DataFrame, rules: dict | None = None) -> np.ndarray:
    """Per case: the front end its deployment served through (``FRONT_ENDS``, or ``rules``:
    a pattern of ``length_dist`` -> name), "" for the runtime's own server."""
    rules = FRONT_ENDS if rules is None else rules
    out = np.full(len(cases), "", dtype=object)
    if "length_dist" not in cases:
        return out
    dist = cases["length_dist"].fillna("").astype(str)
    for pattern, name in rules.items():
        out[dist.str.contains(pattern, regex=True).to_numpy() & (out == "")] = name
    return out


def apply_front_ends(cases: pd.DataFrame, rules: dict | None = None,
                     fitted: dict | None = None) -> pd.DataFrame:
    """``cases`` with their ``FRONT_END`` column (``front_ends``) and, on a front end's rows, its
    fitted numbers (``fitted``: {front end: {field: value}}, by default efficiency.toml's
    [front_ends.*]) written as ``serving.<field>`` where blank."""
    fitted = catalog.front_end_defaults() if fitted is None else fitted
    cases = cases.copy()
    cases[FRONT_END] = front_ends(cases, rules)
    for name, vals in fitted.items():
        rows = cases[FRONT_END].eq(name).to_numpy()
        for field, v in vals.items():
            if field != "fitted_on":
                col = f"serving.{field}"
                cases = _fill(cases, col, np.where(rows & _blank(cases, col), float(v), np.nan))
    return cases
