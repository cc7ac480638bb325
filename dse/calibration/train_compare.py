"""The other estimators the training report puts next to dse, on the same cases (issue 25,
point 6): a hand roofline and llm-analysis.

- **Hand roofline**: every step at one MFU, ``F / (chips x peak x u)`` (F the contract's FLOP
  count, the peak of the case's precision), ``u`` fitted on the set (closed form: the geometric
  mean of the ratios).
- **llm-analysis** (PyPI ``llm-analysis``, Apache-2.0; the optional extra ``dse-llm[compare]``;
  imported here only, by the report, never by dse at run time): its ``training()`` latency per
  step, ``FLOPs(its count, recompute included) / (tp x pp x peak x flops_efficiency)`` per
  micro-batch times the accumulation steps. Its chip is built from dse's catalog entry (the
  same peaks and bandwidths dse uses), its layout is the case's (blanks filled with dse's
  choice: llm-analysis picks no layout), and its one time knob that matters for training,
  ``flops_efficiency``, is fitted on the same cases (closed form, as the roofline's), so the
  comparison is between models, not between calibrations. ``hbm_memory_efficiency`` and the
  interconnect efficiencies do not enter its training latency.

A case llm-analysis cannot express is left out of its figures and named with the reason
(``expressible``): mixture-of-experts layers (its FLOP count has no experts: every layer's
MLP is ``16 b s h^2``), context parallelism (no such degree). Its fixed 4h MLP also miscounts
gated and non-4h MLPs (Llama's SwiGLU); such cases run, with a note.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import pandas as pd

from dse.catalog import training as tcat

NAME = "llm-analysis"


def roofline_u(step_at_peak_s, true_step_s) -> float:
    """The one MFU that best fits ``true = at_peak / u`` in log space."""
    return float(np.exp(np.mean(np.log(np.asarray(step_at_peak_s) / np.asarray(true_step_s)))))


def true_step_s(j: pd.DataFrame) -> np.ndarray:
    """Each truth as a step time (s): a step time as it is, a throughput through the predicted
    row's own tokens x step (tokens/s/chip x step_time_s / value)."""
    return np.where(j["metric"] == "step_time_s", j["value"],
                    j["tokens_per_s_per_chip"] * j["step_time_s"] / j["value"]).astype(float)


def version() -> str | None:
    """llm-analysis' installed version, or None when it is not installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as v
    try:
        return v("llm-analysis")
    except PackageNotFoundError:
        return None


def expressible(case: dict) -> tuple[bool, str]:
    """(whether llm-analysis can express the case, the reason or note) (module docstring)."""
    m = case["model_spec"]
    if m.n_moe_layers > 0:
        return False, "MoE: its FLOP count has no experts (every MLP 16 b s h^2)"
    if case["cp"] > 1:
        return False, "context parallelism: no such degree"
    notes = []
    if m.mlp_gated or m.intermediate_size != 4 * m.hidden_size:
        notes.append("MLP counted as 4h non-gated")
    if case["precision"] not in ("bf16", "fp16"):
        notes.append(f"{case['precision']} as its 8-bit weight/activation peak")
    return True, "; ".join(notes)


def _configs(case: dict):
    from llm_analysis.analysis import (
        ActivationRecomputation,
        DSZeRO,
        DtypeConfig,
        GPUConfig,
        ModelConfig,
        ParallelismConfig,
    )
    m, acc = case["model_spec"], case["accelerator_spec"]
    peaks = acc.peak_flops_per_s
    model = ModelConfig(name=case["model"],
                        num_layers=int(m.num_hidden_layers), n_head=int(m.num_attention_heads),
                        hidden_dim=int(m.hidden_size), vocab_size=int(m.vocab_size),
                        max_seq_len=int(case["seq_len"]),
                        num_key_value_heads=int(m.num_key_value_heads))
    half = peaks.fp16 or peaks.bf16
    gpu = GPUConfig(name=case["hardware"], mem_per_GPU_in_GB=acc.hbm_capacity_bytes / 1024**3,
                    hbm_bandwidth_in_GB_per_sec=acc.hbm_bw_bytes_per_s / 1e9,
                    intra_node_bandwidth_in_GB_per_sec=acc.scaleup_link_bw_bytes_per_s / 1e9,
                    intra_node_min_message_latency=8e-6,
                    peak_fp16_TFLOPS=(half if case["precision"] == "fp16" else peaks.bf16) / 1e12,
                    peak_i8_TFLOPS=(peaks.fp8 or peaks.bf16) / 1e12,
                    inter_node_bandwidth_in_GB_per_sec=acc.scaleout_link_bw_bytes_per_s / 1e9)
    bits = 16 if case["precision"] in ("bf16", "fp16") else 8
    dtype = DtypeConfig(name=f"w{bits}a{bits}e16", weight_bits=bits, activation_bits=bits,
                        embedding_bits=16)
    par = ParallelismConfig(tp_size=int(case["tp"]), pp_size=int(case["pp"]),
                            dp_size=int(case["dp"]), sp_size=int(case["tp"]))
    recompute = {"none": ActivationRecomputation.NONE,
                 "selective": ActivationRecomputation.SELECTIVE,
                 "full": ActivationRecomputation.FULL}[case["recompute"]]
    return model, gpu, dtype, par, recompute, DSZeRO(int(min(case["zero_stage"], 3)))


def step_s(case: dict, flops_efficiency: float = 1.0) -> float:
    """llm-analysis' time of one optimizer step (s) for one expressible case at
    ``flops_efficiency``."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")   # its import of transformers
    from llm_analysis.analysis import LLMAnalysis
    from llm_analysis.logger import logger
    logger.setLevel(logging.ERROR)               # its per-call configuration dump and warnings
    model, gpu, dtype, par, recompute, zero = _configs(case)
    la = LLMAnalysis(model, gpu, dtype, par, flops_efficiency=flops_efficiency,
                     hbm_memory_efficiency=1.0)
    mb = int(case["micro_batch_seqs"])
    ga = round(case["global_batch_seqs"] / (case["dp"] * mb))
    out = la.training(batch_size_per_gpu=mb, gradient_accumulation_steps=ga,
                      global_batch_size=int(case["global_batch_seqs"]),
                      seq_len=int(case["seq_len"]), activation_recomputation=recompute,
                      ds_zero=zero, flash_attn=True)
    return float(out["latency_per_iter"])


def case_inputs(cases: pd.DataFrame, pred: pd.DataFrame) -> list[dict]:
    """Per case, what llm-analysis needs: the catalog model and chip, and the layout the case
    gives (blanks filled with dse's choice: ``pred``, one row per case with the predicted
    layout's columns, as ``predict_train_frame`` or ``train_fit.joined`` return them). dse's
    ``full`` recompute of a share of the layers is llm-analysis' FULL."""
    pred = pred.set_index("case_id")
    out = []
    for _, row in cases.iterrows():
        p = pred.loc[row["case_id"]]
        acc, _ = tcat.lookup("accelerators", row["hardware"])
        c = {"case_id": row["case_id"], "model": row["model"], "hardware": row["hardware"],
             "model_spec": tcat.lookup("models", row["model"]), "accelerator_spec": acc,
             "precision": str(row["precision"]).strip(),
             "global_batch_seqs": float(row["global_batch_seqs"]),
             "seq_len": float(row["seq_len"])}
        for k in ("tp", "pp", "dp", "cp", "micro_batch_seqs", "zero_stage"):
            c[k] = float(p[k])
        c["recompute"] = str(p["recompute"])
        out.append(c)
    return out


def llm_analysis_frame(cases: pd.DataFrame, pred: pd.DataFrame) -> pd.DataFrame:
    """Per case: ``llm_analysis_step_at_1_s`` (its step at flops_efficiency 1; NaN where it
    cannot express the case), ``llm_analysis_covered`` and ``llm_analysis_note``."""
    rows = []
    for c in case_inputs(cases, pred):
        ok, note = expressible(c)
        t = np.nan
        if ok:
            try:
                t = step_s(c, 1.0)
            except (AssertionError, ValueError, ZeroDivisionError) as e:
                ok, note = False, f"llm-analysis refused the case: {str(e)[:80]}"
        rows.append({"case_id": c["case_id"], "llm_analysis_step_at_1_s": t,
                     "llm_analysis_covered": ok, "llm_analysis_note": note})
    return pd.DataFrame(rows)
