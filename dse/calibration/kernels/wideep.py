"""The scorer's routed-expert kernel time against aiconfigurator-core's wide-EP MoE tables.

The wide-EP tables time one EP rank's expert compute under DeepEP-style large expert
parallelism, the all-to-all excluded (``python -m dse.calibration.kernels.wideep``):

* SGLang (``moe/sglang/<v>/wideep_{context,generation}_moe_perf``; H100, H200, B200, B300,
  GB200, GB300): DeepSeek-V3's MoE (hidden 7168, 256 experts of width 2048, top-8, fp8 block
  scales) on DeepGEMM behind DeepEP, ``num_tokens`` the tokens of the whole EP group
  (``ep`` attention-DP ranks x the tokens of one), ``moe_ep_size`` simulated by loading
  256 x 2 / ep experts on 2 GPUs (aiconfigurator ``collect_wideep_deepep_moe.py``). Context
  rows: DeepEP's normal mode, the contiguous grouped GEMM over the rows a rank received;
  generation rows: the low-latency mode, DeepGEMM's masked grouped GEMM over the rank's
  ``256 / ep`` local experts, each with its own rows (``masked_m``). ``uniform`` rows route
  ``num_tokens x 8 / 256`` rows to every expert (decode below one row per expert: one row to
  each of the first ``num_tokens x 8 / ep`` local experts).
* TensorRT-LLM (``moe/trtllm/<v>/wideep_moe_perf``): its WideEP CUTLASS MoE on one EP rank,
  ``num_tokens`` again the whole group's, ``rank0_num_tokens`` the tokens that visit rank 0
  (power-law routing only; the ``*_eplb`` rows rebalanced by EPLB are the closest to even).

Each table row becomes one design (the chip, the runtime, DeepSeek-V3's shape with the row's
hidden / width / experts / top-k, tp 1, attention DP = ep, the row's ep, balanced experts,
no two-batch overlap) and the scorer's own routed-expert op (``dse.perf.op_mlp.moe_terms``)
is evaluated at a step of ``num_tokens`` tokens of the whole instance (decode tokens for
the generation rows, prompt tokens for the context rows): its per-layer ``max(compute,
memory) + additive`` is the kernel time compared with the measured latency. The error factor
is the geometric mean of ``max(pred/true, true/pred)``, the bias the geometric mean of
``pred/true`` (> 1: the model too slow).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

from dse.build.designs import resolve, to_batch
from dse.calibration.kernels import common, data
from dse.perf.basis import load as step_load
from dse.perf.step import Coefficients

SGLANG_TABLES = ("wideep_context_moe_perf", "wideep_generation_moe_perf")
TRTLLM_TABLE = "wideep_moe_perf"
TRTLLM_DISTRIBUTION = "power_law_1.01_eplb"
# the table's moe_dtype -> the design's weight dtype (the scorer picks its kernel family)
WEIGHTS = {"fp8_block": "fp8", "nvfp4": "fp4", "fp8": "fp8", "bfloat16": "bf16"}
MODEL = "deepseek-v3"


def load(chips=None) -> pd.DataFrame:
    """The wide-EP rows the comparison uses: SGLang's uniform rows (newest version per chip),
    TensorRT-LLM's EPLB-balanced rows without redundant slots; columns ``chip``, ``runtime``,
    ``phase`` (context, generation, or mixed for TensorRT-LLM's one table), the shape and
    ``latency_s``."""
    parts = []
    for table in SGLANG_TABLES:
        d = data.load("moe", table, chips=chips, runtimes=["sglang"])
        if len(d):
            d = d[d["distribution"] == "uniform"].copy()
            d["phase"] = "context" if "context" in table else "generation"
            parts.append(d)
    d = data.load("moe", TRTLLM_TABLE, chips=chips, runtimes=["trtllm"])
    if len(d):
        d = d[(d["distribution"] == TRTLLM_DISTRIBUTION)
              & (d["num_slots"] == d["num_experts"])].copy()
        d["phase"] = "mixed"
        parts.append(d)
    if not parts:
        return pd.DataFrame()
    out = pd.concat(parts, ignore_index=True)
    return out[out["moe_ep_size"] > 1].reset_index(drop=True)


def _designs(chip: str, runtime: str, frame: pd.DataFrame):
    """One scorer batch with a design per table row (module docstring)."""
    weights = WEIGHTS.get(str(frame["moe_dtype"].iloc[0]), "fp8")
    row = {"accelerator.id": chip, "model.id": MODEL, "serving.runtime": runtime,
           "model.weight_dtype": weights, "layout.tp": 1, "layout.dp": 8, "layout.ep": 8,
           "workload.isl": 1, "workload.osl": 2, "workload.concurrency": 64,
           "workload.phase": "decode", "serving.expert_imbalance": 1.0,
           "serving.ep_overlap": "none"}
    base = to_batch(resolve(pd.DataFrame([row])))
    b = base.take(np.zeros(len(frame), dtype=np.int64))
    ep = frame["moe_ep_size"].to_numpy(float)
    return b.replace(ep=ep, dp=ep, hidden=frame["hidden_size"].to_numpy(float),
                     ffn_expert=frame["inter_size"].to_numpy(float),
                     n_experts=frame["num_experts"].to_numpy(float),
                     top_k=frame["topk"].to_numpy(float))


def model_s(chip: str, runtime: str, frame: pd.DataFrame) -> np.ndarray:
    """The scorer's routed-expert kernel time per MoE layer (s) for each row of ``frame``
    (one chip and runtime): ``max(compute, memory) + additive`` of ``op_mlp.moe_terms`` at a
    step of ``num_tokens`` tokens (the all-to-all and the expert all-reduce left out)."""
    b = _designs(chip, runtime, frame)
    k = Coefficients(b)
    tok = frame["num_tokens"].to_numpy(float)
    z = np.zeros_like(tok)
    imb = None
    if "rank0_num_tokens" in frame:     # TensorRT-LLM's rows: rank 0's own tokens
        ep, topk = frame["moe_ep_size"].to_numpy(float), frame["topk"].to_numpy(float)
        imb = frame["rank0_num_tokens"].to_numpy(float) / (tok * -np.expm1(topk * np.log1p(-1.0 / ep)))
    out = np.empty(len(frame))
    for phase in ("context", "generation", "mixed"):
        sel = (frame["phase"] == phase).to_numpy()
        if not sel.any():
            continue
        dec, pre = (z, tok) if phase == "context" else (tok, z)
        s = step_load(k, dec, pre, np.maximum(pre, 1.0), z, z, z,
                      decode_step=phase != "context")
        (c, m, _, x), _ = k.moe.time(s, None if phase != "mixed" else imb)
        out[sel] = ((np.maximum(c, m) + x) / k.moe.layers)[sel]
    return out


def compare(frame: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per row: the model's kernel time (``model_s``) next to the measured one."""
    frame = load() if frame is None else frame
    parts = []
    for (chip, runtime), g in frame.groupby(["chip", "runtime"], sort=True):
        parts.append(g.assign(model_s=model_s(chip, runtime, g)))
    out = pd.concat(parts) if parts else frame.assign(model_s=[])
    return out.assign(ratio=out["model_s"] / out["latency_s"])


def summary(rows: pd.DataFrame, by=("chip", "runtime", "phase", "moe_ep_size")) -> pd.DataFrame:
    """Error factor (geometric mean of max(pred/true, true/pred)) and bias (geometric mean of
    pred/true) per group."""
    def one(g):
        return pd.Series({"rows": len(g),
                          "error": common.error_factor(g["model_s"], g["latency_s"]),
                          "bias": float(np.exp(np.mean(np.log(g["ratio"]))))})
    return rows.groupby(list(by)).apply(one, include_groups=False).reset_index()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dse.calibration.kernels.wideep",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--chips", nargs="*", help="dse accelerator ids (default: every chip)")
    p.add_argument("--by", default="chip,runtime,phase,moe_ep_size",
                   help="comma-separated grouping columns")
    p.add_argument("--rows", action="store_true", help="print every row")
    a = p.parse_args(argv)
    rows = compare(load(a.chips))
    pd.set_option("display.width", 200)
    pd.set_option("display.max_rows", 1000)
    if a.rows:
        print(rows[["chip", "runtime", "phase", "moe_ep_size", "num_tokens", "latency_s",
                    "model_s", "ratio"]].to_string(index=False))
    print(summary(rows, a.by.split(",")).to_string(index=False, float_format="%.3f"))
    tot = summary(rows.assign(all="all"), ["all"]).iloc[0]
    print(f"all rows: {int(tot['rows'])}, error {tot['error']:.3f}, bias {tot['bias']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
