"""MoE grouped-GEMM efficiency per chip, runtime and dtype, fitted on aiconfigurator-core's
``moe/moe_perf`` tables (the model: ``dse.perf.kernel_gemm.grouped_gemm_s``).

Rows: the ``balanced`` distribution only (the power-law rows measure expert imbalance, another
model). Gated MLP kernels only: sources named ``*nongated*`` (2-matrix experts) and
``*situ_as_silu*`` are dropped. Every other source is the kernel the runtime dispatches for that
model shape (SGLang on Blackwell: FlashInfer TRT-LLM MoE for DeepSeek/Qwen3-like shapes, Triton
fused MoE for Mixtral-like ones; the shapes are disjoint), so all are kept; a shape measured by
two sources keeps the group's most common one. Version: per (chip, runtime, dtype) the newest
version that measured balanced rows of that dtype (TensorRT-LLM 1.3.0rc23 on Blackwell has only
MXFP4 rows, so rc20 is used for the rest).

Families (key prefix ``moe_<fam>_``): ``bf16`` (bfloat16), ``fp8`` (per-tensor), ``fp8_block``
(block-scaled, DeepSeek style), ``fp4`` (NVFP4). Not fitted: int4 weight-only, MXFP4 W4A16 and
W4A8 (few rows; another issue).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse.kernels import common
from dse.kernels import gemm as _g
from dse.perf.kernel_gemm import grouped_gemm_s

NAME = "moe"
TABLE = ("moe", "moe_perf")
SHAPE_COLS = ("num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size",
              "moe_ep_size")
FIT_ROWS = 2500            # ~60 groups -> ~150k rows
FAMILIES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "fp4"}
FAMILY_ORDER = ("bf16", "fp8", "fp8_block", "fp4")
PEAK_DTYPE = _g.PEAK_DTYPE
WEIGHT_BYTES = _g.WEIGHT_BYTES
SOURCE_TABLE = "moe_perf (balanced)"
sample = _g.sample
supported = _g.supported

_PER_FAMILY = (("fraction", 0.5, 0.01, 1.2, "compute"),
               ("half_rows", 32.0, 0.1, 4096.0, "shape"),
               ("width_half", 128.0, 1.0, 65536.0, "shape"),
               ("hbm_fraction", 0.6, 0.02, 1.2, "fraction"),
               ("token_bytes", 4.0, 1e-3, 1e3, "shape"),
               ("latency_s", 2e-5, 1e-7, 1e-2, "latency"))


def family_params(fam: str) -> tuple[common.Param, ...]:
    return tuple(common.Param(f"moe_{fam}_{s}", x0, lo, hi, kind)
                 for s, x0, lo, hi, kind in _PER_FAMILY)


PARAMS = tuple(p for fam in FAMILY_ORDER for p in family_params(fam))


def load(**kw) -> pd.DataFrame:
    """The fitted rows (``kw``: data.load's chips= / runtimes= filters) with ``family`` and
    ``held_out``."""
    from dse.kernels import data
    d = data.load(*TABLE, latest=False, **kw)
    d = d[(d["distribution"] == "balanced") & d["moe_dtype"].isin(FAMILIES)
          & ~d["kernel_source"].str.contains("nongated|situ_as_silu")].copy()
    d["family"] = d["moe_dtype"].map(FAMILIES)
    grp = ["chip", "runtime", "family"]
    vk = d["version"].map(data.version_key)
    newest = vk.groupby([d[c] for c in grp]).transform("max")
    d = d[vk == newest]
    d["_n"] = d.groupby(grp + ["kernel_source"])["num_tokens"].transform("size")
    d = (d.sort_values("_n", ascending=False, kind="stable")
         .drop_duplicates(grp + list(SHAPE_COLS)).drop(columns="_n"))
    u = d[list(SHAPE_COLS)].drop_duplicates()
    u = u.assign(held_out=common.held_out(u, SHAPE_COLS))
    return d.merge(u, on=list(SHAPE_COLS), how="left").reset_index(drop=True)


def predict(frame: pd.DataFrame, fam: str, acc, vals: dict) -> np.ndarray:
    p = f"moe_{fam}_"
    c = {k: frame[k].to_numpy() for k in SHAPE_COLS}
    return grouped_gemm_s(c["num_tokens"], c["hidden_size"], c["inter_size"], c["topk"],
                          c["num_experts"], c["moe_tp_size"], c["moe_ep_size"],
                          WEIGHT_BYTES[fam], getattr(acc.peak_flops_per_s, PEAK_DTYPE[fam]),
                          acc.hbm_bw_bytes_per_s, vals[p + "fraction"], vals[p + "half_rows"],
                          vals[p + "width_half"], vals[p + "hbm_fraction"],
                          vals[p + "token_bytes"], vals[p + "latency_s"])


HEADER = """MoE layer (grouped GEMM) model parameters per accelerator and runtime
(dse.perf.kernel_gemm.grouped_gemm_s; gated MLP, balanced routing, one chip):
  rows = tokens topk / ep; touched = (E/ep)(1 - (1 - topk/E)^tokens); w = inter / moe_tp
  t_s = latency_s + max(6 (rows + half_rows touched) hidden w / (peak fraction / (1 + width_half / w)),
                        touched 3 hidden w weight_bytes / (hbm_bw hbm_fraction))
        + rows hidden token_bytes / hbm_bw
Keys moe_<family>_{fraction, half_rows (rows per touched expert), width_half (elements),
hbm_fraction, token_bytes (bytes per routed row per hidden element), latency_s (s)};
families bf16, fp8 (per-tensor), fp8_block (block-scaled), fp4 (NVFP4).
Fitted on aiconfigurator-core's moe_perf kernel microbenchmarks, balanced rows (python -m dse.kernels)."""


def main(fit: bool = False, write: bool = False, loco: bool = False) -> pd.DataFrame:
    import sys
    return _g.run(sys.modules[__name__], fit, write, loco)
