"""Fit and report the training model on the public training set (``training_*`` of
``../shared/calibration``; contracts/train-cases.md): as few training-specific parameters as
possible, fitted on every source at once, with the in-sample and the leave-one-source-out
error factors, and the fitted parameters' uncertainty.

Error factor = geometric mean of ``max(pred/true, true/pred)``, per source and metric, sources
weighted equally (the calibration README). The parameters (``FITTED``) are those of
``[training]`` in dse/catalog/training.toml; ``--write`` stores the fitted values there with
what they were fitted on and their uncertainty (``uncertainty``: the covariance of the log
parameters from the Jacobian of the truths' log errors, Gauss-Newton, sources weighted
equally), which training answers sample for their bands (dse.scoring.train_bands).

    python -m dse.calibration.train_fit                 # report with the catalog's values
    python -m dse.calibration.train_fit --fit [--write] # refit (and store), report, LOSO
    python -m dse.calibration.train_fit --fit --loso --write --report   # + reports/training/

``--report [DIR]`` writes the calibration report (dse.calibration.train_report: README.md and
report.json, with the hand roofline and llm-analysis side by side when it is installed).
"""

from __future__ import annotations

import argparse
import re
from datetime import date
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from dse.calibration import train_compare, train_report
from dse.calibration.cases import default_dir
from dse.catalog import training as tcat
from dse.scoring.train_predict import predict_train_frame

# fitted parameter: (lower, upper) bound
FITTED = {"compute_fraction_scale": (0.3, 1.5), "overlap_fraction": (0.0, 1.0),
          "layer_overhead_s": (0.0, 5e-3)}
# where every fit starts, whatever training.toml holds (so a refit of the same data gives the
# same values, --write is idempotent): the kernel fits as they are (scale 1), half of an
# overlappable collective hidden, 1 ms a layer (the order of a layer's launches and host gaps)
PRIOR = {"compute_fraction_scale": 1.0, "overlap_fraction": 0.5, "layer_overhead_s": 1e-3}
RESTARTS = 10        # Nelder-Mead restarts from its own result, at most (fit)
IMPROVES = 1e-6      # a restart that lowers the log error factor by less ends the fit
METRIC_COLUMN = {"step_time_s": "step_time_s", "tokens_per_s_per_chip": "tokens_per_s_per_chip",
                 "model_tflops_per_chip": "model_tflops_per_chip", "mfu": "mfu",
                 "memory_per_chip_bytes": "memory_per_chip_bytes"}


# The attention kernel a source's rows ran where the case file leaves it blank
# (``training.attention_kernel``, rates in dse/catalog/training.toml [attention_kernels]), by a
# stated rule: (source, a pattern of the citation, the models it covers (None = all), kernel).
# First match wins. Evidence, mosaicml/llm-foundry scripts/train/benchmarking/ (git blame of
# README.md at 8c8dd48f7, the commit the cases cite, gives the commit each table row came from):
# - "H100 80GB BF16 (Large Scale, >= 128 GPUs)" rows: added by 5e85bd62d (2024-01-06), run by its
#   sweep.py, which passes `--attn_impl flash` for 1b.yaml, 3b.yaml, 7b.yaml and 70b.yaml and
#   `--attn_impl triton` for 13b.yaml and 30b.yaml; submit_benchmarks.py there installs
#   `.[gpu-flash2]` (setup.py: flash-attn==2.4.2), so `flash` is FlashAttention-2.
# - every other MPT row ("H100 80GB BF16", "H100 80GB FP8", "A100 80GB ...", "A100 40GB ..."):
#   added by b2a43a147 (2023-10-19; its sweep.sh passes no --attn_impl; run_config installs
#   llm-foundry v0.3.0 with `.[gpu]`, flash-attn 1.0.9) or carried from the 2023-05 tables
#   (300cc5c58) whose sweep passes none either; submit_benchmarks.py's `--attn_impl` defaults
#   to 'triton' at both commits (and the scripts/train/yamls/pretrain yamls set
#   `attn_impl: triton`): llm-foundry's Triton FlashAttention (triton_flash_attn_fn,
#   llmfoundry/models/layers/flash_attn_triton.py at v0.3.0).
# - MEGATRON-2021 (NVIDIA/Megatron-LM README at 152aab304d) and KORTHI (Korthikanti et al.
#   2022, the runs the README at 2e90a342f5 reports): Megatron-LM's megatron/model/transformer.py
#   at those commits has no FlashAttention (no "flash" anywhere under megatron/); its attention
#   core is torch.baddbmm -> FusedScaleMaskSoftmax -> Dropout(--attention-dropout 0.1) ->
#   torch.bmm: "unfused".
LARGE_SCALE_FLASH = ("mpt-1b", "mpt-3b", "mpt-7b", "mpt-70b")
ATTENTION_RULES = (
    ("MPT", r"Large Scale", LARGE_SCALE_FLASH, "flash2"),
    ("MPT", r"", None, "triton"),
    ("MEGATRON-2021", r"", None, "unfused"),
    ("KORTHI", r"", None, "unfused"),
)
KERNEL_COLUMN = "training.attention_kernel"


def fill_by_rules(cases: pd.DataFrame, rules) -> pd.DataFrame:
    """``cases`` with each rule's columns set where blank, the first rule that matches a row
    winning: ``rules`` of ``(source, a pattern of the citation, the models it covers or None,
    {column: value})``; a value the case gives is kept."""
    c = cases.copy()
    src = c.get("source", pd.Series("", index=c.index)).fillna("").astype(str)
    cite = c.get("citation", pd.Series("", index=c.index)).fillna("").astype(str)
    done = np.zeros(len(c), bool)
    for source, pattern, models, values in rules:
        on = ~done & src.eq(source).to_numpy() & cite.str.contains(pattern, regex=True).to_numpy()
        if models is not None:
            on &= c["model"].astype(str).isin(models).to_numpy()
        _fill(c, on, values)
        done |= on
    return c


def _fill(c: pd.DataFrame, on: np.ndarray, values: dict) -> None:
    """``values`` written into ``c`` on the rows ``on`` whose cell is blank."""
    for col, v in values.items():
        if col not in c:
            c[col] = pd.Series(np.nan, index=c.index, dtype=object)
        c[col] = c[col].astype(object)
        c.loc[on & c[col].isna().to_numpy(), col] = v


def apply_attention_rules(cases: pd.DataFrame) -> pd.DataFrame:
    """``cases`` with ``training.attention_kernel`` set by ``ATTENTION_RULES`` where blank."""
    return fill_by_rules(cases, [(src, pat, models, {KERNEL_COLUMN: kernel})
                                 for src, pat, models, kernel in ATTENTION_RULES])


# What the Megatron-LM of a source's rows ran where the case file leaves it blank: the
# communication overlap (``training.tp_comm_overlap``, ``training.overlap_p2p_comm``,
# ``training.overlap_grad_reduce``), sequence parallelism and the ZeRO stage, by a stated rule:
# (source, a pattern of the citation, {column: value}). Evidence, NVIDIA/Megatron-LM:
# - MEGATRON-2021 (README at 152aab304d, 2021-01-11; examples/pretrain_gpt3_175B.sh there:
#   --fp16, --checkpoint-activations, no --DDP-impl, no --fp32-allreduce):
#   megatron/mpu/mappings.py's _reduce is a plain torch.distributed.all_reduce in the forward
#   (_ReduceFromModelParallelRegion) and the backward (_CopyToModelParallelRegion): every
#   tensor-parallel all-reduce on the critical path ("none"; the asynchronous all-reduce of the
#   input gradient, LinearWithGradAccumulationAndAsyncAllreduce, came with 83b1e42f30,
#   2022-02-13); megatron/training.py's communicate() waits on its batch_isend_irecv requests
#   before the stage goes on, and sends the whole [s, b, h] tensor (the scatter-gather
#   optimization came with 72e4230bb5, 2021-02-16; there is no sequence parallelism before the
#   sequence_parallel merge d898a8991d, 2022-05-25); train_step() calls the local DDP's
#   allreduce_params after forward_backward_pipelining returns (megatron/model/distributed.py:
#   its per-parameter hooks are commented out), in the gradients' dtype (fp16: 2 bytes,
#   dse's); no distributed optimizer (Float16DistributedOptimizer came with 2022-02): ZeRO 0.
# - KORTHI (Korthikanti et al. 2022; the code of the paper is the sequence_parallel merge
#   d898a8991d): megatron/mpu/layers.py's LinearWithGradAccumulationAndAsyncCommunication
#   runs the backward's all-gather and input-gradient all-reduce / reduce-scatter with
#   async_op=True under the gradient GEMMs, the forward's reduce (mpu/mappings.py) is
#   synchronous ("backward"); megatron/p2p_communication.py's _communicate waits on every
#   request and then torch.cuda.synchronize(), and without sequence parallelism sends a 1/tp
#   chunk of the tensor (scatter_gather_tensors_in_pipeline, on by default since 72e4230bb5);
#   training.py reduces the local DDP's gradients
#   after forward_backward_func; --use-distributed-optimizer is off by default (ZeRO 0).
SOFTWARE_RULES = (
    ("MEGATRON-2021", r"152aab304d", {"training.tp_comm_overlap": "none",
                                      "training.overlap_p2p_comm": "false",
                                      "training.overlap_grad_reduce": "false",
                                      "sequence_parallel": "false", "zero_stage": "0"}),
    ("KORTHI", r"", {"training.tp_comm_overlap": "backward",
                     "training.overlap_p2p_comm": "false",
                     "training.overlap_grad_reduce": "false",
                     "training.p2p_scatter_gather": "true", "zero_stage": "0"}),
)


def apply_software_rules(cases: pd.DataFrame) -> pd.DataFrame:
    """``cases`` with the columns of ``SOFTWARE_RULES`` set where blank (first match wins)."""
    return fill_by_rules(cases, [(src, pat, None, values) for src, pat, values in SOFTWARE_RULES])


# What a source's rows recompute selectively where the case file leaves it blank (Megatron-Core's
# ``recompute_modules``, ``training.recompute_norms`` / ``training.recompute_moe_act``), by a
# stated rule: (source, a pattern of the citation, the models it covers, {column: value}).
# Evidence, NVIDIA-NeMo/Megatron-Bridge: the 25.11 table came with 97ad8cc6f (2025-12-04), the
# release branch r0.2.0 (tag v0.2.0, 2025-11-26); scripts/performance/configs/gpt_oss/
# workload_base_configs.py there (and gpt_oss_workload_base_configs.py on main, from the
# "fix GPT-OSS perf scripts" commit f5b955fcb of 2025-11-20 through 5ccbfdfc0 of 2026-01-07)
# sets GPT_OSS_120B_H100_BF16 to pipeline_model_parallel_size=4,
# recompute_modules=["layernorm", "moe_act"]; scripts/performance/utils/helpers.py's
# set_recompute_overrides turns that into recompute_granularity "selective" with those modules
# (no core attention recompute: the case's recompute stays blank). No other MB2511 H100 row's
# config sets recompute_modules.
RECOMPUTE_RULES = (
    ("MB2511", r"0a25f911b2", ("gpt-oss-120b",), {"training.recompute_norms": "true",
                                                  "training.recompute_moe_act": "true"}),
)


def apply_recompute_rules(cases: pd.DataFrame) -> pd.DataFrame:
    """``cases`` with the columns of ``RECOMPUTE_RULES`` set where blank (first match wins)."""
    return fill_by_rules(cases, RECOMPUTE_RULES)


# How a source's software launched the routed experts' GEMMs where the case file leaves it blank
# (``training.moe_grouped_gemm``, dse.perf.train_time.layer_linears), by a stated rule: (source,
# a pattern of the citation, the models it covers (None = all), {column: value}). Evidence: the
# Megatron-Bridge 25.11 table (0a25f911b2) ran the NeMo 25.11 container, Megatron-Bridge r0.2.0
# (tag v0.2.0), which pins NVIDIA/TransformerEngine v2.9; its MoE recipes run Megatron-Core's
# TEGroupedMLP, i.e. TE's GroupedLinear, whose GEMMs at v2.9 go te_general_grouped_gemm ->
# nvte_multi_tensor_gemm -> multi_stream_cublas_gemm, one cuBLAS GEMM per local expert
# (transformer_engine/common/gemm/cublaslt_gemm.cu; the CUTLASS grouped kernel only with
# NVTE_USE_CUTLASS_GROUPED_GEMM=1, off by default, on Hopper), and grouped_linear.py casts each
# expert's FP8 inputs separately (split_quantize): "per_expert". The fit's MoE rows are all
# MB2511's; the rule pins them so the fit stays what it is whatever the field's default.
GROUPED_GEMM_RULES = (
    ("MB2511", r"0a25f911b2", None, {"training.moe_grouped_gemm": "per_expert"}),
)


def apply_grouped_gemm_rules(cases: pd.DataFrame) -> pd.DataFrame:
    """``cases`` with ``training.moe_grouped_gemm`` set by ``GROUPED_GEMM_RULES`` where blank."""
    return fill_by_rules(cases, GROUPED_GEMM_RULES)


# Rows whose own note says their router was forced to balance ("routing force-balanced"): the
# Megatron-Bridge 25.11 MoE rows, whose recipes (scripts/performance/configs/*/ at r0.2.0, every
# MoE model's base config) set moe_router_force_load_balancing=True (Megatron-Core's router then
# scores tokens at random: ~1% sampling spread, not learned routing's skew).
BALANCED_NOTE = "force-balanced"


def apply_routing_rule(cases: pd.DataFrame) -> pd.DataFrame:
    """``cases`` with ``training.moe_router_force_load_balancing`` true where blank and the
    case's note says its routing was force-balanced (``BALANCED_NOTE``)."""
    c = cases.copy()
    note = c.get("note", pd.Series("", index=c.index)).fillna("").astype(str)
    _fill(c, note.str.contains(BALANCED_NOTE, regex=False).to_numpy(),
          {"training.moe_router_force_load_balancing": "true"})
    return c


def load(folder: Path | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    folder = Path(folder or default_dir())
    cases = pd.read_csv(folder / "training_cases.csv", dtype=str, keep_default_na=False,
                        na_values=[""])
    truth = pd.read_csv(folder / "training_truth.csv")
    return apply_grouped_gemm_rules(apply_routing_rule(apply_recompute_rules(
        apply_software_rules(apply_attention_rules(cases))))), truth


def joined(cases: pd.DataFrame, truth: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
    """Truths with the prediction of their metric (``pred``) and ``log_err`` = |log(pred/true)|."""
    pred = predict_train_frame(_with(cases, params or {}), file="training_cases.csv")
    j = truth.merge(pred, on="case_id", how="left")
    j["pred"] = [row[METRIC_COLUMN[m]] for m, (_, row) in zip(j["metric"], j.iterrows())]
    j["log_err"] = np.abs(np.log(j["pred"].astype(float) / j["value"].astype(float)))
    return j


def error_factor(j: pd.DataFrame) -> float:
    """exp(mean over (source, metric) groups of the mean |log(pred/true)|)."""
    per = j.groupby(["source", "metric"])["log_err"].mean()
    return float(np.exp(per.mean()))


def per_source(j: pd.DataFrame) -> pd.Series:
    return np.exp(j.groupby("source")["log_err"].mean())


def roofline(j: pd.DataFrame) -> tuple[float, float]:
    """The hand roofline next to dse: every step at one MFU (``F / (chips peak mfu)``, F the
    contract's count, peak the precision's), that MFU fitted (the geometric mean over the
    truths); returns (MFU, error factor)."""
    flops_chip = j["model_tflops_per_chip"] * 1e12 * j["step_time_s"]    # F / chips (FLOPs)
    peak = j["model_tflops_per_chip"] * 1e12 / j["mfu"]
    step_at_peak = flops_chip / peak
    true_step = np.where(j["metric"] == "step_time_s", j["value"],
                         j["tokens_per_s_per_chip"] * j["step_time_s"] / j["value"])
    u = float(np.exp(np.mean(np.log(step_at_peak / true_step))))
    r = j.assign(log_err=np.abs(np.log(step_at_peak / u / true_step)))
    return u, error_factor(r)


def fit(cases: pd.DataFrame, truth: pd.DataFrame, start: dict | None = None) -> dict:
    """The ``FITTED`` values minimising the error factor on these cases: Nelder-Mead on the
    parameters mapped to their bounds by a logistic, from ``start`` (default ``PRIOR``, never the
    catalog's current values), restarted from its result (a fresh simplex) until a restart
    improves the log error factor by less than ``IMPROVES``: a simplex collapsed on a ridge ends
    a single run short of the minimum, and where it ends depended on the start."""
    names = list(FITTED)
    lo = np.array([FITTED[n][0] for n in names])
    hi = np.array([FITTED[n][1] for n in names])
    start = start or PRIOR
    x0v = np.clip((np.array([start[n] for n in names]) - lo) / (hi - lo), 1e-3, 1 - 1e-3)

    def values(z):
        return dict(zip(names, lo + (hi - lo) / (1.0 + np.exp(-z))))

    def cost(z):
        return np.log(error_factor(joined(cases, truth, values(z))))

    z = np.log(x0v / (1 - x0v))
    best = cost(z)
    for _ in range(RESTARTS):
        res = minimize(cost, z, method="Nelder-Mead",
                       options={"xatol": 1e-4, "fatol": 1e-8, "maxiter": 400})
        if res.fun < best:
            z, gain, best = res.x, best - res.fun, res.fun
        else:
            gain = 0.0
        if gain < IMPROVES:
            break
    return {k: float(f"{v:.6g}") for k, v in values(z).items()}


def leave_one_source_out(cases: pd.DataFrame, truth: pd.DataFrame, start: dict) -> pd.Series:
    """Per source: its error factor predicted with parameters fitted on the other sources."""
    out = {}
    for src in sorted(truth["source"].unique()):
        keep = truth["source"] != src
        ids = set(truth.loc[keep, "case_id"])
        p = fit(cases[cases["case_id"].isin(ids)], truth[keep], start)
        held = truth[~keep]
        j = joined(cases[cases["case_id"].isin(set(held["case_id"]))], held, p)
        out[src] = error_factor(j)
    return pd.Series(out)


STEP = 0.05          # relative step of the Jacobian's finite differences (log parameters)


def residuals(cases: pd.DataFrame, truth: pd.DataFrame, params: dict) -> np.ndarray:
    """Signed log errors ``log(pred / true)`` of the truths, in ``truth``'s order."""
    j = joined(cases, truth, params)
    return np.log(j["pred"].astype(float).to_numpy() / j["value"].astype(float).to_numpy())


def uncertainty(cases: pd.DataFrame, truth: pd.DataFrame, params: dict) -> dict:
    """The fitted parameters' uncertainty: ``{"params", "log_sd", "log_corr", "rule"}``, the
    covariance of their logs ``s^2 (J^T W J)^-1`` (J: d log(pred/true) / d log(param) by
    finite differences of STEP, one-sided away from a bound the fit sits on; W: each truth's
    weight, 1 / (truths of its source and metric), normalized to the number of truths, as the
    error factor weighs them; s^2: the weighted squared log errors over the degrees of
    freedom left). A parameter the truths do not move gets the log sd of its bounds' range."""
    names = list(FITTED)
    r0 = residuals(cases, truth, params)
    cols = []
    for n in names:
        lo, hi = FITTED[n]
        v = float(params[n])
        up = v * np.exp(STEP) <= hi
        h = STEP if up else -STEP
        if not up and v * np.exp(-STEP) < lo:
            cols.append(np.zeros_like(r0))
            continue
        r1 = residuals(cases, truth, {**params, n: v * np.exp(h)})
        cols.append((r1 - r0) / h)
    jac = np.column_stack(cols)
    grp = truth.groupby(["source", "metric"])["case_id"].transform("size").to_numpy(float)
    w = (1.0 / grp) * len(truth) / np.sum(1.0 / grp)
    dof = max(len(truth) - len(names), 1)
    s2 = float(np.sum(w * r0 ** 2) / dof)
    info = jac.T @ (w[:, None] * jac)
    cov = s2 * np.linalg.pinv(info)
    sd = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    dead = np.abs(np.diag(info)) < 1e-12
    for i in np.flatnonzero(dead):
        lo, hi = FITTED[names[i]]
        sd[i] = np.log(hi / max(lo, hi * 1e-3)) / np.sqrt(12.0)
    corr = cov / np.outer(np.where(sd > 0, sd, 1.0), np.where(sd > 0, sd, 1.0))
    corr[dead, :] = 0.0
    corr[:, dead] = 0.0
    np.fill_diagonal(corr, 1.0)
    return {"params": names, "log_sd": [float(f"{x:.4g}") for x in sd],
            "log_corr": [[float(f"{x:.3f}") for x in row] for row in np.clip(corr, -1, 1)],
            "rule": f"Gauss-Newton covariance of the log parameters on {len(truth)} truths "
                    f"(sources weighted equally), finite differences of {STEP:g} in log"}


def toml_inline(u: dict) -> str:
    """``uncertainty`` as one TOML inline table."""
    def val(v):
        if isinstance(v, str):
            return '"' + v.replace('"', "'") + '"'
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        return repr(v)
    return "{ " + ", ".join(f"{k} = {val(v)}" for k, v in u.items()) + " }"


def write(params: dict, fitted_on: str | None, unc: dict | None = None) -> Path:
    """Store fitted values (and their uncertainty) in dse/catalog/training.toml's [training]
    table (in place); ``fitted_on`` None keeps the note that is there."""
    path = Path(str(resources.files("dse.catalog").joinpath("training.toml")))
    text = path.read_text()
    for k, v in params.items():
        text = re.sub(rf"(?m)^{k} = .*$", f"{k} = {v!r}", text, count=1)
    if unc is not None:
        line = f"uncertainty = {toml_inline(unc)}"
        if re.search(r"(?m)^uncertainty = .*$", text):
            text = re.sub(r"(?m)^uncertainty = .*$", lambda _: line, text, count=1)
        else:
            text = re.sub(r"(?m)^(fitted_on = .*)$", lambda m: m.group(1) + "\n" + line, text,
                          count=1)
    if fitted_on is not None:
        text = re.sub(r'(?m)^fitted_on = .*$', f"fitted_on = {fitted_on!r}".replace("'", '"'),
                      text, count=1)
    path.write_text(text)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dse.calibration.train_fit", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", help="calibration folder (default ../shared/calibration)")
    ap.add_argument("--fit", action="store_true", help="refit the parameters")
    ap.add_argument("--loso", action="store_true", help="also leave one source out (slow)")
    ap.add_argument("--write", action="store_true", help="store the fit in training.toml")
    ap.add_argument("--per-case", metavar="CSV", help="also write every truth with its prediction")
    ap.add_argument("--report", nargs="?", const="reports/training", metavar="DIR",
                    help="write the calibration report (README.md, report.json) into DIR "
                         "(default reports/training)")
    a = ap.parse_args(argv)
    cases, truth = load(a.dir)
    params = {k: tcat.train_parameters()[k] for k in FITTED}
    if a.fit:
        params = fit(cases, truth)
    j = joined(cases, truth, params)
    print("parameters:", params)
    if a.per_case:
        cols = ["case_id", "source", "metric", "value", "pred", "log_err", "recompute",
                "recompute_layer_fraction", "step_time_s", "mfu", "memory_per_chip_bytes", "bound"]
        j[cols].to_csv(a.per_case, index=False)
    print("in sample, per source:")
    print(per_source(j).round(3).to_string())
    print(f"in sample, sources weighted equally: {error_factor(j):.3f}")
    u, ef = roofline(j)
    print(f"hand roofline (F / peak at one fitted MFU = {u:.3f}): error factor {ef:.3f}")
    loso, lo = "", None
    if a.loso:
        lo = leave_one_source_out(cases, truth, params)
        print("leave one source out (each source with the others' fit):")
        print(lo.round(3).to_string())
        loso = "; left out: " + ", ".join(f"{k} {v:.3f}" for k, v in lo.items())
    sources = ", ".join(sorted(truth["source"].unique()))
    note = tcat.train_parameters().get("fitted_on", "")
    if a.fit:
        note = (f"{len(truth)} truths of ../shared/calibration/training_* ({sources}), error "
                f"factor {error_factor(j):.3f} in sample{loso}; fitted "
                f"{date.today().isoformat()} by python -m dse.calibration.train_fit "
                f"--fit {'--loso ' if a.loso else ''}{'--write' if a.write else ''}".strip())
    if a.write:
        unc = uncertainty(cases, truth, params)
        print("uncertainty (log sd):", dict(zip(unc["params"], unc["log_sd"])))
        print("wrote", write(params, note if a.fit else None, unc))
    if a.report:
        report_to(Path(a.report), cases, j, params, lo, note, a)
    return 0


def report_to(folder: Path, cases: pd.DataFrame, j: pd.DataFrame, params: dict,
              loso: pd.Series | None, fitted_on: str, a) -> None:
    """Write the calibration report (dse.calibration.train_report) for ``--report``."""
    la = None
    if train_compare.version() is not None:
        la = train_compare.llm_analysis_frame(cases, j.drop_duplicates("case_id"))
    flags = " ".join(f for f, on in (("--fit", a.fit), ("--loso", a.loso), ("--write", a.write))
                     if on)
    command = f"python -m dse.calibration.train_fit {flags} --report".replace("  ", " ")
    report, table = train_report.build(j, params, fitted_on,
                                       None if loso is None else loso.to_dict(), la, command)
    print("wrote", train_report.write(folder, report, table))


def _with(cases: pd.DataFrame, params: dict) -> pd.DataFrame:
    c = cases.copy()
    for k, v in params.items():
        c[f"train.{k}"] = str(v)
    return c


if __name__ == "__main__":
    raise SystemExit(main())
