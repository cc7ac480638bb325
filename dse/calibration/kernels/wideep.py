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
memory) + additive`` is the kernel time compared with the measured latency (TensorRT-LLM's rows
at rank 0's own tokens: ``expert_imbalance`` = ``rank0_num_tokens`` over its balanced share).
The error factor is the geometric mean of ``max(pred/true, true/pred)``, the bias the geometric
mean of ``pred/true`` (> 1: the model too slow).

What the SGLang context rows measure is not a serving step's: their benchmark hands a rank all
``num_tokens`` tokens of the group (most without a local entry; DeepEP hands it about its rows'
worth) and times the un-graphed call with a device synchronize before its end event (a
0.2-0.5 ms floor on every chip and ep). The scorer, which hands a rank its own tokens, sits
below them, more so at wide ep; the fit (``fit``) reproduces them with that routing and a
fit-only host time.

``--fit [--write]``: SGLang's DeepEP expert kernel (DeepGEMM) per chip on both SGLang tables,
written to ``dse/catalog/kernels/moe_wideep.toml`` as ``["<chip>".sglang.backend.deepgemm]``
(the scorer's choice for SGLang designs with attention DP and ep > 1, serving.toml
``wide_ep_moe_backend``).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

from dse.build.designs import resolve, to_batch
from dse.calibration.kernels import common, data
from dse.calibration.kernels.gemm import PEAK_DTYPE, WEIGHT_BYTES
from dse.catalog import accelerators, kernel_params
from dse.perf.basis import load as step_load
from dse.perf.kernel_gemm import grouped_gemm_s
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


# --- SGLang's DeepEP expert kernel (DeepGEMM), fitted on its own wide-EP tables -----------

BACKEND = "deepgemm"
FAMILY = "fp8_block"            # the tables' only dtype (DeepSeek's block-scaled fp8)
CATALOG = "moe_wideep"          # dse/catalog/kernels/moe_wideep.toml
# (suffix, x0, lo, hi, kind): the kernel_gemm.grouped_gemm_s terms the tables pin (moe.py's
# bounds; a fraction of the peak at most 1); batch_bytes: the bytes per received token and
# hidden element (the normal layout's scatter of the received fp8 tokens to their experts'
# rows and gather of the bf16 outputs), which the context rows pin (their benchmark hands a
# rank every token of the group, num_tokens of them, ~4 B per element)
FREE = (("fraction", 0.6, 0.01, 1.0, "compute"),
        ("half_rows", 32.0, 0.1, 4096.0, "shape"),
        ("hbm_fraction", 0.7, 0.02, 1.0, "fraction"),
        ("latency_s", 2e-5, 1e-7, 1e-2, "latency"),
        ("wave_elements", 1e4, 1.0, 1e9, "shape"),
        ("token_bytes", 1.0, 1e-3, 1e3, "shape"),
        ("batch_bytes", 1.0, 1e-3, 1e3, "shape"))
# fit only: the context benchmark's host time inside its timed region (an un-graphed call
# timed with a device synchronize before its end event: a ~0.3-0.4 ms floor on every chip and
# ep, where the CUDA-graphed generation rows reach 35 us); never a scorer term
HOST = common.Param("context_host_s", 3e-4, 1e-6, 2e-3, "latency")
# one model shape (hidden 7168, width 2048) cannot pin the edge terms or a non-gated kernel:
# the chip's SGLang auto entry's values
FROM_AUTO = ("width_half", "hidden_half", "nongated_slowdown")
# DeepEP hands a rank its own rows (the low-latency layout: per local expert; the normal one:
# scattered per local expert by its received tokens' ids), so no remote entries and no scan of
# every routed entry's hidden vector: those terms at moe.py's lower bounds. (Fitted free, they
# go to their bounds or trade with the compute rate: the error moves by < 0.002 on every chip.)
FLOOR = {"route_bytes": 1e-4, "remote_fraction": 1e-5}


def _benchmark_routing(frame: pd.DataFrame):
    """(received tokens, routed rows, touched experts) of one rank in SGLang's wide-EP
    benchmark (``uniform``; aiconfigurator's collect_wideep_deepep_moe.py): rows =
    num_tokens x k / ep. Generation (the low-latency layout): spread over all 256 / ep local
    experts at one row or more each, else one row on each of the first ``rows`` experts, the
    received tokens as the scorer counts them (ep (1 - (1 - 1/ep)^k) / ep of the step's
    tokens). Context (the normal layout): every local expert gets its share (shapes with less
    than a row per expert are not measured), and the rank is handed all ``num_tokens`` tokens
    of the group, most of them without a local entry."""
    tok = frame["num_tokens"].to_numpy(float)
    k = frame["topk"].to_numpy(float)
    ep = frame["moe_ep_size"].to_numpy(float)
    rows = tok * k / ep
    local = frame["num_experts"].to_numpy(float) / ep
    per_expert = np.floor(tok * k / frame["num_experts"].to_numpy(float))
    touched = np.where(per_expert >= 1.0, local, np.minimum(rows, local))
    ctx = (frame["phase"] == "context").to_numpy()
    recv = np.where(ctx, tok, tok * -np.expm1(k * np.log1p(-1.0 / ep)))
    return recv, rows, touched


def _grouped_s(frame: pd.DataFrame, acc, vals: dict, fam: str, routing) -> np.ndarray:
    """The grouped GEMM's time of each table row with the parameters ``vals`` of family
    ``fam``, the rows each rank receives from ``routing(frame)``."""
    recv, rows, touched = routing(frame)
    c = {k: frame[k].to_numpy(float) for k in ("hidden_size", "inter_size", "topk",
                                                  "num_experts", "moe_tp_size", "moe_ep_size")}
    return grouped_gemm_s(recv, c["hidden_size"], c["inter_size"], c["topk"], c["num_experts"],
                          c["moe_tp_size"], c["moe_ep_size"], WEIGHT_BYTES[fam],
                          getattr(acc.peak_flops_per_s, PEAK_DTYPE[fam]),
                          acc.hbm_bw_bytes_per_s, vals["fraction"], vals["half_rows"],
                          vals["width_half"], vals["hbm_fraction"], vals["token_bytes"],
                          vals["latency_s"], rows, touched, vals["hidden_half"],
                          vals["batch_bytes"], route_bytes=vals["route_bytes"],
                          nongated_slowdown=vals["nongated_slowdown"],
                          wave_elements=vals["wave_elements"],
                          remote_fraction=vals["remote_fraction"])


def _kernel_s(frame: pd.DataFrame, acc, vals: dict) -> np.ndarray:
    t = _grouped_s(frame, acc, vals, FAMILY, _benchmark_routing)
    return t + (frame["phase"] == "context").to_numpy() * vals.get(HOST.name, 0.0)


def fit(chips=None) -> dict:
    """{chip: ({moe_fp8_block_<key>: value}, fitted_on)} for each chip with SGLang's wide-EP
    tables: DeepGEMM's grouped GEMMs on one rank (the all-to-all excluded), generation rows
    (the low-latency layout, CUDA-graphed) and context rows (the normal layout, with their
    benchmark's host time, ``HOST``) fitted together."""
    accs = accelerators()
    rows = load(chips)
    rows = rows[rows["runtime"] == "sglang"]
    out = {}
    for chip, g in rows.groupby("chip", sort=True):
        auto = kernel_params()[(chip, "sglang")]
        fixed = {k: auto[f"moe_{FAMILY}_{k}"] for k in FROM_AUTO} | FLOOR
        params = tuple(common.Param(n, x0, lo, hi, kind) for n, x0, lo, hi, kind in FREE)
        def predict(v, g=g, acc=accs[chip], fixed=fixed):
            return _kernel_s(g, acc, {**fixed, **v})

        f = common.least_squares_fit(predict, (*params, HOST), g["latency_s"].to_numpy(float),
                                     max_nfev=400, loss="soft_l1", f_scale=0.05)
        vals = {**fixed, **f.values}
        pred = _kernel_s(g, accs[chip], vals)
        err = {ph: common.error_factor(pred[m], g["latency_s"][m])
               for ph in ("generation", "context") for m in [(g["phase"] == ph).to_numpy()]}
        ver = ", ".join(sorted(g["version"].unique()))
        note = (f"aiconfigurator-core {data.package_version()} moe/sglang/{ver}/"
                f"wideep_{{generation,context}}_moe_perf (uniform; DeepEP + DeepGEMM): "
                f"{len(g)} shapes, error generation {err['generation']:.3f}, context "
                f"{err['context']:.3f} (with the context benchmark's host time "
                f"{vals[HOST.name] * 1e6:.0f} us, fit only); " + ", ".join(FROM_AUTO)
                + " from the chip's sglang auto fit; " + ", ".join(FLOOR)
                + " at their floors (DeepEP hands a rank its rows)")
        vals.pop(HOST.name)
        out[chip] = ({f"moe_{FAMILY}_{k}": v for k, v in vals.items()}, note)
    return out


# --- TensorRT-LLM's WideEP MoE (moe_config.backend WIDEEP), fitted on its own wide-EP table ---

TRT_BACKEND = "wideep"          # serving.moe_backend: TensorRT-LLM's WideEP MoE module
# the table's moe_dtype -> the kernel family its keys are written for
TRT_FAMILY = {"fp8_block": "fp8_block", "nvfp4": "fp4"}
# the kernel_gemm.grouped_gemm_s terms the table pins (FREE's) and the remote entries: a rank
# is handed its received tokens with their whole top-k lists (the collector's
# run_moe_compute: rank 0's tokens and their token_selected_slots), so an entry routed to
# another rank is the kernel's to skip (what it costs it, fitted)
TRT_FREE = FREE + (("remote_fraction", 0.01, 1e-5, 1.0, "fraction"),)
# one model shape per width (hidden 7168, widths 1536 and 2048) cannot pin the edge terms, a
# non-gated kernel or the scan of every entry of the batch: the chip's TensorRT-LLM auto values
TRT_FROM_AUTO = ("width_half", "hidden_half", "nongated_slowdown", "route_bytes")


def _trtllm_routing(frame: pd.DataFrame):
    """(received tokens, routed rows, touched experts) of rank 0 in TensorRT-LLM's wide-EP
    benchmark as the scorer counts them (``op_mlp.moe_terms`` with the row's imbalance,
    ``model_s``): received = ``rank0_num_tokens``; rows = received x k / dest, ``dest`` the
    ranks a token visits, ep (1 - (1 - 1/ep)^k); touched = (E / ep)(1 - (1 - k/E)^tokens)
    over the whole group's tokens."""
    tok = frame["num_tokens"].to_numpy(float)
    k = frame["topk"].to_numpy(float)
    ep = frame["moe_ep_size"].to_numpy(float)
    e = frame["num_experts"].to_numpy(float)
    recv = frame["rank0_num_tokens"].to_numpy(float)
    dest = ep * -np.expm1(k * np.log1p(-1.0 / ep))
    return recv, recv * k / dest, e / ep * -np.expm1(tok * np.log1p(-k / e))


def _trtllm_kernel_s(frame: pd.DataFrame, fam: str, acc, vals: dict) -> np.ndarray:
    return _grouped_s(frame, acc, vals, fam, _trtllm_routing)


def fit_trtllm(chips=None) -> dict:
    """{chip: ({moe_<family>_<key>: value}, fitted_on)} for each chip with TensorRT-LLM's
    wide-EP table (``TRTLLM_DISTRIBUTION`` rows without redundant slots, ep 2-256): its WideEP
    CUTLASS MoE on rank 0, the all-to-all excluded, fitted on rank 0's own tokens."""
    accs = accelerators()
    rows = load(chips)
    rows = rows[rows["runtime"] == "trtllm"]
    out = {}
    for chip, g in rows.groupby("chip", sort=True):
        fam = TRT_FAMILY[str(g["moe_dtype"].iloc[0])]
        auto = kernel_params()[(chip, "trtllm")]
        fixed = {k: auto[f"moe_{fam}_{k}"] for k in TRT_FROM_AUTO}
        params = tuple(common.Param(n, x0, lo, hi, kind) for n, x0, lo, hi, kind in TRT_FREE)
        def predict(v, g=g, acc=accs[chip], fixed=fixed, fam=fam):
            return _trtllm_kernel_s(g, fam, acc, {**fixed, **v})

        f = common.least_squares_fit(predict, params, g["latency_s"].to_numpy(float),
                                     max_nfev=400, loss="soft_l1", f_scale=0.05)
        vals = {**fixed, **f.values}
        before = _trtllm_kernel_s(g, fam, accs[chip], {
            k: auto[f"moe_{fam}_{k}"] for k in vals})
        err = common.error_factor(predict(f.values), g["latency_s"])
        ver = ", ".join(sorted(g["version"].unique()))
        note = (f"aiconfigurator-core {data.package_version()} moe/trtllm/{ver}/"
                f"{TRTLLM_TABLE} ({TRTLLM_DISTRIBUTION}, no redundant slots; rank 0's tokens): "
                f"{len(g)} shapes, ep {int(g['moe_ep_size'].min())}-"
                f"{int(g['moe_ep_size'].max())}, error {err:.3f} (the chip's auto entry: "
                f"{common.error_factor(before, g['latency_s']):.3f}); "
                + ", ".join(TRT_FROM_AUTO) + " from the chip's trtllm auto fit")
        out[chip] = ({f"moe_{fam}_{k}": v for k, v in vals.items()}, note)
    return out


HEADER = """The wide-EP expert kernels (the scorer's choice for designs with attention DP and ep > 1
under serving.moe_backend "auto", serving.toml [runtimes.*] wide_ep_moe_backend):
- SGLang: DeepGEMM behind DeepEP (serving.moe_backend = "deepgemm"), fp8_block keys, fitted
  per chip on aiconfigurator-core's moe/sglang/<v>/wideep_{generation,context}_moe_perf
  (uniform rows);
- TensorRT-LLM: its WideEP MoE (moe_config.backend WIDEEP; serving.moe_backend = "wideep"),
  fp8_block (Hopper) or fp4 (Blackwell) keys, fitted per chip on
  moe/trtllm/<v>/wideep_moe_perf (EPLB-balanced power-law rows, rank 0's tokens).
Keys as moe.toml's (dse.perf.kernel_gemm.grouped_gemm_s, ``tokens`` the tokens dispatched to
the rank); dse/calibration/kernels/wideep.py (fit, fit_trtllm).
Chips without the tables keep their auto entry (no transfer: measured on every NVIDIA chip
these runtimes' wide EP runs on here)."""


def write(fitted: dict, path=None, trtllm: dict | None = None):
    """``dse/catalog/kernels/moe_wideep.toml``: ``["<chip>".sglang.backend.deepgemm]`` per chip
    of ``fitted`` (``fit``), ``["<chip>".trtllm.backend.wideep]`` per chip of ``trtllm``
    (``fit_trtllm``)."""
    import datetime as _dt

    path = path or common.CATALOG_DIR / f"{CATALOG}.toml"
    lines = [f"# {ln}" if ln else "#" for ln in HEADER.splitlines()]
    lines += [(f"# Written by `python -m dse.calibration.kernels.wideep --fit --write` on "
               f"{_dt.date.today().isoformat()}; do not edit by hand."), ""]
    for rt, backend, entries in (("sglang", BACKEND, fitted),
                                 ("trtllm", TRT_BACKEND, trtllm or {})):
        for chip, (vals, note) in sorted(entries.items()):
            lines += [f'["{chip}".{rt}.backend.{backend}]', f'fitted_on = "{note}"']
            lines += [f"{k} = {float(v):.6g}" for k, v in vals.items()] + [""]
    path.write_text("\n".join(lines))
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dse.calibration.kernels.wideep",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--chips", nargs="*", help="dse accelerator ids (default: every chip)")
    p.add_argument("--by", default="chip,runtime,phase,moe_ep_size",
                   help="comma-separated grouping columns")
    p.add_argument("--rows", action="store_true", help="print every row")
    p.add_argument("--fit", action="store_true",
                   help="fit SGLang's DeepGEMM and TensorRT-LLM's WideEP kernels per chip "
                        "(fit, fit_trtllm)")
    p.add_argument("--write", action="store_true", help="with --fit: write the catalog file")
    a = p.parse_args(argv)
    if a.fit:
        fitted, trt = fit(a.chips), fit_trtllm(a.chips)
        for chip, (vals, note) in [*fitted.items(), *trt.items()]:
            print(chip, {k: float(f"{v:.4g}") for k, v in vals.items()}, note, sep="\n  ")
        if a.write:
            print("wrote", write(fitted, trtllm=trt))
            kernel_params.cache_clear()
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
