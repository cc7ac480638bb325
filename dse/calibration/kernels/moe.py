"""MoE grouped-GEMM efficiency per chip, runtime and dtype, fitted on aiconfigurator-core's
``moe/moe_perf`` tables (the model: ``dse.perf.kernel_gemm.grouped_gemm_s``).

Rows: the ``balanced`` distribution only (the power-law rows measure expert imbalance, another
model). Gated (3-matrix) and non-gated (2-matrix: up, down) experts: a row is non-gated when its
source is named ``*nongated*`` (TensorRT-LLM measures Nemotron-3's relu2 shapes only so) or its
shape is a non-gated model's (``nongated_shapes``, read from aiconfigurator-core's
``model_configs``: SGLang and vLLM measure the same Nemotron-3 shapes under their usual source
names; taken as gated, their bf16 weight reads at <= 64 tokens would run at 1.3-1.4x the HBM
peak at the 90th percentile, where every other shape reaches 0.9x, i.e. 2 matrices); the model's FLOPs and weight
bytes scale with the matrices (``grouped_gemm_s(matrices=)``, the scorer's ``mlp_mats``).
``*situ_as_silu*`` sources (another activation's kernel) are dropped.

Non-gated experts run another kernel than gated ones, so they carry their own efficiency: one
time factor ``nongated_slowdown`` per (chip, runtime, family) on the expert GEMMs (the max of
compute and weight reads; not on the latency or token bytes). The runtimes select the kernel by
the activation: TensorRT-LLM's non-gated CUTLASS MoE (aiconfigurator PR #273 measures it as
``moe_torch_flow_nongated``); SGLang runs relu2 experts on FlashInfer's CUTLASS MoE, not its
Triton fused MoE or, before sgl-project/sglang PR #21321, FlashInfer's TRT-LLM-gen MoE (which that PR
measures 1.7-1.85x faster than CUTLASS on Nemotron-3 Super); vLLM runs them on its Triton path
(vllm-project/vllm PR #25863). Fitted: 4.1 on H200 and 3.6 on H100 SGLang bf16 (held-out
1.457 -> 1.27, 1.403 -> 1.24), about 1.1 on TensorRT-LLM; a group without non-gated rows is
pinned at 1 (``unidentified``). MoE held-out median 1.154 -> 1.150 (share <= 1.15: 43% -> 49%). Every other source is the kernel the runtime dispatches for that
model shape (SGLang on Blackwell: FlashInfer TRT-LLM MoE for DeepSeek/Qwen3-like shapes, Triton
fused MoE for Mixtral-like ones; the shapes are disjoint), so all are kept; a shape measured by
two sources keeps the group's most common one. Version: per (chip, runtime, dtype) the newest
version that measured balanced rows of that dtype (TensorRT-LLM 1.3.0rc23 on Blackwell has only
MXFP4 rows, so rc20 is used for the rest).

Families (key prefix ``moe_<fam>_``): ``bf16`` (bfloat16), ``fp8`` (per-tensor), ``fp8_block``
(block-scaled, DeepSeek style), ``fp4`` (NVFP4), ``int4`` (int4 weight-only, W4A16: the
tables' ``int4_wo`` rows, Marlin MoE on SGLang and vLLM, FlashInfer's TensorRT-LLM-gen MxInt4
MoE for SGLang on Blackwell). W4A16 kernels dequantize the int4 weights to bf16 in registers and
run bf16 MMAs: compute at the bf16 peak, weight reads at the scorer's int4 bytes (0.53 B per
weight, group scales included), and their own tile: vLLM's fused_marlin_moe picks
block_size_m from 8-64 rows by the rows per expert (vllm/model_executor/layers/fused_moe/
fused_marlin_moe.py: the first of 8, 16, 32, 48, 64 with rows / experts / block < 0.9), where
the bf16 kernel's fit pads each touched expert to ~150 rows; on Kimi K2's experts (vLLM
0.24.0, H200, tp 8) the bf16 parameters put 64 tokens at 2.2x and 8192 tokens at 0.6x the
measured Marlin time. The scorer takes this family for int4 experts (``dse.build.select``
``MOE_INT4``). TensorRT-LLM has no int4 table: its int4 entries are the chip's other runtimes'
geometric mean (``gemm.complete``). ``mxfp4`` (the tables' ``w4a16_mxfp4`` rows: TensorRT-LLM's
Hopper MoE, vLLM's OAI Triton MXFP4 experts, SGLang's Triton fused MoE, on H100, H200 and
L40S): fp4 experts on a chip without fp4 tensor cores, the weights dequantized to bf16 in
registers and bf16 MMAs, so compute at the bf16 peak and weight reads at the scorer's fp4 bytes
(0.5625 B); ``supported`` only where the chip has no fp4 peak (Blackwell runs fp4 experts on
the ``fp4`` family). Before it (2026-12-05) the scorer charged such experts the fp8 block-scaled
CUTLASS family, the fp8 fallback of their compute peak: on gpt-oss-120b's shape at H200
TensorRT-LLM, 38 us a layer at ep 8 and 4 tokens where the table measures 80 us (the W4A16
kernel's fixed time, 72 us at one token whatever the ep), and 0.62 ms at ep 1 and 64 tokens
where it measures 0.62 ms but random routing touches fewer experts. Not fitted: W4A8 MXFP4
(another kernel per runtime, few shapes).

Rows without a balanced table: A100 TensorRT-LLM 1.0.0 and vLLM 0.14.0 measured only the
power-law distributions; their ``power_law_1.01`` rows are fitted, corrected by the measured
power_law_1.01 / balanced ratio (see ``load``).

Routing: the benchmark routes deterministically (``balanced_routing``), so the fit uses each
shape's exact routed rows and touched experts on the chip; the scorer keeps the
uniform-random expectation of real traffic (``kernel_gemm.touched_experts``).

Grouped routing (DeepSeek-V3/R1: 8 groups of 32 experts, the best 4 per token): SGLang's
(0.5.14) and vLLM's (0.24.0) collectors pass the balanced logits through the model's grouped
top-k, TensorRT-LLM's does not. Every group then ties, the first 4 win for every token, and the
benchmark hits 128 of the 256 experts (``_grouped_one``; ``GROUPED_ROUTING_SINCE`` names the
evidence); under EP the first chips take every entry. Fitted as if all 256 were hit, those rows
read the weights at 1.7x the HBM peak and put the H200 SGLang fp8_block fit at 1.57-1.9x the
table at ep 1 and 0.36-0.97x at ep 2-32. Real traffic spreads over all groups, so the scorer
keeps the uniform expectation (all 256 experts at a 1024-token prompt): at DeepSeek's shape
the scorer's time is about twice the SGLang/vLLM table's, as TensorRT-LLM's table says.
Emulated and refitted (2026-12-05), DeepSeek's held-out shapes per token decade: H200 SGLang
1.17-1.67 -> 1.05-1.07, vLLM 1.22-2.16 -> 1.05-1.11 (H100 alike); every SGLang/vLLM
fp8_block and fp4 group improves (H200 SGLang 1.111 -> 1.095, vLLM 1.100 -> 1.078, B200
SGLang fp4 1.148 -> 1.132), the other groups move < 0.004.

Waves and remote entries: the held-out bias fell with the expert parallelism, on every
runtime (SGLang 1.07 at ep 1 to 0.83 at ep 256, TensorRT-LLM 0.98 to 0.85, vLLM 1.00 to 0.92:
at wide EP the layer takes longer than its share of the rows says). Two terms carry it:
``wave_elements``, one wave of output tiles per call that a chip whose rows fill less still
pays (as ``gemm.py``'s dense GEMMs do), and ``remote_fraction``, the share of a local row's
compute an entry routed to another chip still costs: a kernel that runs over every entry of
the batch with an expert map, launching and skipping or zero-filling remote experts' tiles
(fitted 0 to 0.24 per group; RTX PRO 6000's TensorRT-LLM fp8_block kernel at 1, every entry
computed; SGLang's Triton fused MoE on Blackwell was predicted at 0.12-0.5x its measured time
at ep 256, its time barely falling with ep, but it shares its group, and so one value, with
FlashInfer's TensorRT-LLM MoE, which computes its own rows only: 0.004 there; the scorer
charges these entries only where a chip's kernel is handed them: every token's under TP+EP,
the dispatched tokens' under wide EP, ``dse.perf.op_mlp``, checked against the wide-EP tables
by ``wideep.py``). The wave floor
takes over part of the fixed time per layer (``latency_s`` 64 -> 0.1 us on A100 TensorRT-LLM
bf16, unchanged on most Blackwell TensorRT-LLM groups, where the floor fits at ~0).
Held-out median 1.150 -> 1.146, worst 1.451 -> 1.368, share <= 1.15 49% -> 57%;
leave-one-chip-out median 1.227 -> 1.214 (worst 2.68 both).

Warm cache: ``l2_speedup`` on the touched experts' weight reads (gemm.py's rule; fit-only, the
cold ``hbm_fraction`` capped at the DRAM peak): L40S SGLang bf16 1.33 -> 1.22, TensorRT-LLM
bf16 1.22 -> 1.13; median 1.146 -> 1.144, pooled 1.172 -> 1.164 (2026-12-03). The fits put it at
the 30 bound on the L40S (its small expert sets then run compute-bound).

Fit: ``gemm.fit_multistart`` from four starts (x0, a TensorRT-LLM-like point, two seeded
random: 1.147 -> 1.146 over one), soft_l1 loss on the log errors (``LOSS``), keeping the lowest cost (the hard max of
compute and memory terms has local optima). Residuals that remain: SGLang's and vLLM's Triton
fused MoE (per-shape tuned configurations, some shapes 3-10x off their neighbours); a second
kernel a runtime falls back to on some shapes of a group (vLLM's FlashInfer CUTLASS path on
Blackwell, 1.4-1.8x slower than its TensorRT-LLM-gen kernel on the same chip; SGLang's
FlashInfer CUTLASS MoE for Nemotron-3 shapes on Hopper, 2-3.5x slower than the group's Triton
kernel), which the scorer cannot tell from the shape; and a few TensorRT-LLM shapes
(Llama-4-like 16 experts top-1 at ep 2 measure 3.6x slower than at ep 1). Tried and not kept:
per-expert tile quantization with an exact ceil (rows per expert to a tile of 8-128 rows:
<= 0.003 better than the smooth ``half_rows`` padding on five groups, worse at 128), a fixed
time per global or per local expert (no gain).

Kernel backends (``serving.moe_backend``): a runtime runs the experts on one of several
kernels, chosen by a server flag or by the runtime per model (SGLang's ``--moe-runner-backend``:
FlashInfer's TensorRT-LLM-gen MoE for DeepSeek/Qwen3-like models on Blackwell, its Triton fused
MoE for others; vLLM's FlashInfer CUTLASS or TensorRT-LLM-gen experts), and the table names
it (``kernel_source``, mapped by ``backend_of``). Where a (chip, runtime, family) measured two
or more backends on at least ``MIN_BACKEND_ROWS`` gated training shapes each, each backend gets
its own fit on its own rows (``backends``), written to ``["<chip>".<runtime>.backend.<name>]``;
a group with one such backend's joint fit is that backend's. The auto entry (the keys of
``["<chip>".<runtime>]``, ``serving.moe_backend = "auto"``) stays the joint fit over every
kernel the runtime's benchmark dispatched: the mix a user gets without naming one. The error
report scores each held-out shape with the parameters of the backend that measured it (the
``moe/auto`` rows: the joint fit on the same shapes). Split groups: SGLang bf16 and fp8_block
on Blackwell (FlashInfer TRT-LLM vs Triton: B200 bf16 1.347 -> 1.153, fp8_block 1.203 ->
1.131), vLLM bf16 on Blackwell (FlashInfer CUTLASS vs TRT-LLM, 1.149 -> 1.100), vLLM fp8_block
on Hopper (CUTLASS vs Triton, H200 1.138 -> 1.100); MoE pooled 1.164 -> 1.143 (2026-12-03). A
chip without a backend's table takes ``common.transfer`` from the chips that fitted it (for
that runtime and family); a family no chip measured on that backend falls back to auto.
Leave-one-chip-out scores a split group's rows the same way (each backend transferred from
the other chips' own fits of it): MoE LOCO median 1.215 -> 1.182, pooled 1.283 -> 1.259.

Missing (chip, runtime, family): ``common.transfer`` from the chips that fitted that runtime's
family (MAMF-scaled compute); only if no chip has that runtime's table, the chip's other
runtimes' geometric mean (``gemm.complete``; ``fitted_on`` names the origin).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse.calibration.kernels import common, data
from dse.calibration.kernels import gemm as _g
from dse.catalog.specs import DTYPE_BYTES
from dse.perf.kernel_gemm import grouped_gemm_s

NAME = "moe"
TABLE = ("moe", "moe_perf")
SHAPE_COLS = ("num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size",
              "moe_ep_size")
FIT_ROWS = 2500            # ~60 groups -> ~150k rows
FAMILIES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "fp4",
            "int4_wo": "int4", "w4a16_mxfp4": "mxfp4"}
FAMILY_ORDER = ("bf16", "fp8", "fp8_block", "fp4", "int4", "mxfp4")
# int4 (W4A16: int4 weights dequantized to bf16 in registers, bf16 MMAs) computes at the bf16
# peak and reads the scorer's int4 bytes per weight (dse.catalog.specs.DTYPE_BYTES, group
# scales included), so the fitted hbm_fraction is of the bytes the scorer charges
# mxfp4 (W4A16 MXFP4 experts on a chip without FP4 tensor cores) likewise: bf16 MMAs, the
# scorer's fp4 bytes per weight
PEAK_DTYPE = {**_g.PEAK_DTYPE, "int4": "bf16", "mxfp4": "bf16"}
WEIGHT_BYTES = {**_g.WEIGHT_BYTES, "int4": DTYPE_BYTES["int4"], "mxfp4": DTYPE_BYTES["fp4"]}
SOURCE_TABLE = "moe_perf (balanced)"
# multi-start fit (gemm.fit_multistart): x0 above, a TensorRT-LLM-like point (CUTLASS grouped
# GEMM, the H200 trtllm bf16 fit), and two seeded random starts; the best log-RMS is kept
STARTS = ({"fraction": 0.8, "half_rows": 180.0, "width_half": 30.0, "hbm_fraction": 0.7,
           "token_bytes": 16.0, "latency_s": 3.5e-5},)
RANDOM_STARTS = 2
# robust loss (common.least_squares_fit): about the mean |log error|, the reported metric
LOSS, F_SCALE = "soft_l1", 0.05
sample = _g.sample


def supported(acc, fam: str) -> bool:
    """Whether the chip runs the family: it has the family's compute peak; mxfp4 (W4A16) only
    on a chip without an fp4 peak (where fp4 experts run it, ``dse.build.mechanisms``)."""
    if fam == "mxfp4" and getattr(acc.peak_flops_per_s, "fp4", None) is not None:
        return False
    return getattr(acc.peak_flops_per_s, PEAK_DTYPE[fam], None) is not None

_PER_FAMILY = (("fraction", 0.5, 0.01, 1.2, "compute"),
               ("half_rows", 32.0, 0.1, 4096.0, "shape"),
               ("width_half", 128.0, 1.0, 65536.0, "shape"),
               ("hbm_fraction", 0.6, 0.02, 1.0, "fraction"),   # cold cache: <= the DRAM peak
               ("token_bytes", 4.0, 1e-3, 1e3, "shape"),
               ("latency_s", 2e-5, 1e-7, 1e-2, "latency"),
               ("hidden_half", 64.0, 1e-2, 65536.0, "shape"),
               ("batch_bytes", 1.0, 1e-3, 1e3, "shape"),
               ("route_bytes", 0.1, 1e-4, 1e2, "shape"),
               ("nongated_slowdown", 1.0, 0.2, 8.0, "shape"),
               ("wave_elements", 1e4, 1.0, 1e9, "shape"),
               ("remote_fraction", 0.01, 1e-5, 1.0, "fraction"),
               # the benchmark's warm L2 on the expert weights (kernel_gemm.warm_l2_factor)
               ("l2_speedup", 2.0, 1.0, 30.0, "shape"))


def family_params(fam: str) -> tuple[common.Param, ...]:
    return tuple(common.Param(f"moe_{fam}_{s}", x0, lo, hi, kind)
                 for s, x0, lo, hi, kind in _PER_FAMILY)


PARAMS = tuple(p for fam in FAMILY_ORDER for p in family_params(fam))


# serving.moe_backend's choices after "auto" (dse/spec/fields.py lists the same names)
BACKENDS = ("triton", "flashinfer_trtllm", "flashinfer_cutlass", "cutlass", "deepgemm",
            "wideep")
# ("wideep": TensorRT-LLM's WideEP MoE module, no moe_perf source; fitted on its own wide-EP
# table, dse/calibration/kernels/wideep.py)
MIN_BACKEND_ROWS = 300     # gated training shapes a backend needs in a group for its own fit


def backend_of(source: str) -> str:
    """The kernel backend (one of ``BACKENDS``) of a table's ``kernel_source``: FlashInfer's
    TensorRT-LLM-gen MoE (``*flashinfer_trtllm*``, vLLM's ``*flashinfer_trtllm_trtllm*``), FlashInfer's
    CUTLASS MoE, DeepGEMM, Marlin, Triton (SGLang's and vLLM's fused MoE, vLLM's
    ``vllm_fused_moe``, TensorRT-LLM's ``*triton_fp8_block``); else TensorRT-LLM's own CUTLASS
    MoE (``moe_torch_flow*``)."""
    s = str(source)
    if "flashinfer_trtllm" in s or ("flashinfer" in s and "trtllm" in s):
        return "flashinfer_trtllm"
    for name in ("flashinfer_cutlass", "deepgemm", "marlin", "triton"):
        if name in s:
            return name
    return "triton" if s == "vllm_fused_moe" else "cutlass"


def backends(train: pd.DataFrame) -> list[str]:
    """The backends of a group's training rows with at least ``MIN_BACKEND_ROWS`` gated shapes
    (non-gated rows run another kernel the auto fit's ``nongated_slowdown`` carries), among
    ``serving.moe_backend``'s choices (Marlin, the int4 groups' only kernel, is not one)."""
    gated = train[train["_matrices"] == 3.0]
    n = gated.groupby("backend").size()
    return sorted(b for b in n[n >= MIN_BACKEND_ROWS].index if b in BACKENDS)


def unidentified(sample: pd.DataFrame, fam: str) -> dict:
    """Parameters a fit sample cannot identify, at their neutral value (``gemm.run``): a group
    without non-gated rows says nothing of the non-gated kernel, so 1 (the gated one's speed;
    a random start would otherwise leave an arbitrary value there)."""
    ng = "_matrices" in sample and bool((sample["_matrices"] == 2.0).any())
    return {} if ng else {f"moe_{fam}_nongated_slowdown": 1.0}


FALLBACK_DISTRIBUTION = "power_law_1.01"
TOKEN_BUCKETS = (8, 64, 512, 4096)     # num_tokens bucket edges of the fallback correction


def _bucket(tokens) -> np.ndarray:
    return np.searchsorted(np.asarray(TOKEN_BUCKETS), np.asarray(tokens, float), side="right")


def _fallback_correction(d: pd.DataFrame) -> pd.DataFrame:
    """Median ``power_law_1.01 / balanced`` latency ratio per (runtime, family, token bucket)
    over every (chip, version) that measured both on the same shapes and kernel."""
    k = ["chip", "runtime", "version", "family", "kernel_source"] + list(SHAPE_COLS)
    b = d[d["distribution"] == "balanced"].drop_duplicates(k)
    p = d[d["distribution"] == FALLBACK_DISTRIBUTION].drop_duplicates(k)
    m = b.merge(p, on=k, suffixes=("_b", "_p"))
    m = m.assign(bucket=_bucket(m["num_tokens"]),
                 log_ratio=np.log(m["latency_s_p"] / m["latency_s_b"]))
    return m.groupby(["runtime", "family", "bucket"], as_index=False)["log_ratio"].median()


def load(**kw) -> pd.DataFrame:
    """The fitted rows (``kw``: data.load's chips= / runtimes= filters) with ``family`` and
    ``held_out``. A (chip, runtime, family) that measured no balanced rows in any version
    (A100 TensorRT-LLM 1.0.0 and vLLM 0.14.0) is fitted on its ``power_law_1.01`` rows (the
    mildest imbalance), each divided by the median power_law_1.01 / balanced ratio of the same
    runtime and family (else of any runtime) per num_tokens bucket on the chips that measured
    both (1.00-1.07 median, up to ~1.2 at >= 4096 tokens)."""
    chips, runtimes = kw.pop("chips", None), kw.pop("runtimes", None)
    d = data.load(*TABLE, latest=False, **kw)
    d = d[d["distribution"].isin(["balanced", FALLBACK_DISTRIBUTION])
          & d["moe_dtype"].isin(FAMILIES)
          & ~d["kernel_source"].str.contains("situ_as_silu")].copy()
    d["family"] = d["moe_dtype"].map(FAMILIES)
    grp = ["chip", "runtime", "family"]
    has_bal = (d["distribution"] == "balanced").groupby([d[c] for c in grp]).transform("any")
    corr = _fallback_correction(d)
    d = d[(d["distribution"] == "balanced") | ~has_bal].copy()
    if chips is not None:
        d = d[d["chip"].isin(list(chips))]
    if runtimes is not None:
        d = d[d["runtime"].isin(list(runtimes))]
    fb = d["distribution"] != "balanced"
    if fb.any():
        f = d[fb].assign(bucket=_bucket(d.loc[fb, "num_tokens"]))
        same = f.merge(corr, on=["runtime", "family", "bucket"], how="left")["log_ratio"]
        anyrt = corr.groupby(["family", "bucket"], as_index=False)["log_ratio"].median()
        other = f.merge(anyrt, on=["family", "bucket"], how="left")["log_ratio"]
        lr = same.fillna(other).fillna(0.0).to_numpy()
        d.loc[fb, "latency_s"] = d.loc[fb, "latency_s"].to_numpy() / np.exp(lr)
    # newest version per gated / non-gated kind: TensorRT-LLM 1.3.0rc23 on Hopper measured
    # only Nemotron-3's non-gated shapes in bf16/fp8; the gated ones stay at rc20
    d = d.assign(_matrices=matrices(d))
    vk = d["version"].map(data.version_key)
    newest = vk.groupby([d[c] for c in grp + ["_matrices"]]).transform("max")
    d = d[vk == newest]
    d = common.one_row_per_shape(d, grp, SHAPE_COLS, "num_tokens")
    rows, touched = balanced_routing(d)
    return d.assign(_rows=rows, _touched=touched,
                    backend=d["kernel_source"].map(backend_of).to_numpy())


NONGATED_ACTS = ("relu2",)      # expert activations without a gate (2 weight matrices)


def nongated_shapes() -> set[tuple[int, int, int, int]]:
    """(hidden, inter, experts, topk) of every model in aiconfigurator-core's ``model_configs``
    whose experts are not gated (``mlp_hidden_act`` relu2: Nemotron-3 Nano/Super/Ultra), with
    hidden both the model width and its MoE latent width (``moe_latent_size``)."""
    import json
    out = set()
    for f in sorted((data.root().parent.parent / "model_configs").glob("*_config.json")):
        c = json.loads(f.read_text())
        c = c.get("text_config", c)
        if c.get("mlp_hidden_act", c.get("hidden_act")) not in NONGATED_ACTS:
            continue
        e = c.get("n_routed_experts") or c.get("num_experts")
        k, inter = c.get("num_experts_per_tok"), c.get("moe_intermediate_size")
        if not (e and k and inter):
            continue
        for h in (c.get("hidden_size"), c.get("moe_latent_size")):
            if h:
                out.add((int(h), int(inter), int(e), int(k)))
    return out


def matrices(frame: pd.DataFrame) -> np.ndarray:
    """Weight matrices per expert of each row: 2 for a ``*nongated*`` kernel source or a shape
    of a non-gated model (``nongated_shapes``; see the module docstring), else 3."""
    ng = nongated_shapes()
    key = zip(frame["hidden_size"], frame["inter_size"], frame["num_experts"], frame["topk"])
    shape = np.array([(int(h), int(i), int(e), int(k)) in ng for h, i, e, k in key], bool)
    src = frame["kernel_source"].str.contains("nongated").to_numpy()
    return np.where(shape | src, 2.0, 3.0)


def _balanced_one(tokens: int, experts: int, topk: int, ep: int) -> tuple[int, int]:
    """(routed rows, distinct experts hit) on the first of ``ep`` chips (experts
    ``[0, experts / ep)``) under the benchmark's ``balanced`` routing (aiconfigurator's
    collector ``balanced_logits``: token t's i-th expert is ``(t + i s) % E`` with
    ``s = ceil(E / topk)`` when ``t >= s``, else ``(t s / T + i s) % E``, truncated)."""
    stride = -(-experts // topk)
    t = np.arange(tokens, dtype=float)[:, None]
    i = np.arange(topk, dtype=float)[None, :]
    ex = ((t if tokens >= stride else t * stride / tokens) + i * stride) % experts
    ex = ex.astype(np.int64).ravel()
    local = ex[ex < experts // ep]
    return len(local), int(np.unique(local).size)


def _grouped_one(tokens: int, experts: int, topk: int, ep: int, n_group: int,
                 topk_group: int) -> tuple[int, int]:
    """(routed rows, distinct experts hit) on the first of ``ep`` chips when the benchmark's
    ``balanced_logits`` pass through DeepSeek-V3's group-limited top-k (``n_group`` groups of
    consecutive experts, the best ``topk_group`` groups per token, then the top ``topk``
    experts inside them): each token's ``topk`` high logits fall one per group, so every
    group ties and the lowest-indexed ``topk_group`` groups win for every token; inside them
    the token's high experts are taken and the remaining slots tie again among equal low
    logits, filled by the lowest-indexed experts (the ``_balanced_one`` pattern, then ties
    broken to the lowest index: assumed, not read from the kernels; it gives what the tables
    show, ep 2 as slow as ep 1). Only ``topk_group / n_group`` of the experts are ever hit
    (DeepSeek: 128 of 256)."""
    stride = -(-experts // topk)
    size = experts // n_group
    kept = topk_group * size                     # experts of the winning groups: [0, kept)
    t = np.arange(tokens, dtype=float)[:, None]
    i = np.arange(topk, dtype=float)[None, :]
    hi = (((t if tokens >= stride else t * stride / tokens) + i * stride) % experts
          ).astype(np.int64)
    local = experts // ep
    rows, hit = 0, set()
    pattern, count = np.unique(hi, axis=0, return_counts=True)    # rows repeat every stride
    for row, n in zip(pattern, count):
        high = sorted({int(e) for e in row if e < kept})[:topk]
        fill, e = [], 0
        while len(high) + len(fill) < topk and e < kept:
            if e not in high:
                fill.append(e)
            e += 1
        mine = [x for x in high + fill if x < local]
        rows += len(mine) * int(n)
        hit.update(mine)
    return rows, len(hit)


def grouped_shapes() -> dict[tuple[int, int, int, int], tuple[int, int]]:
    """(hidden, inter, experts, topk) -> (n_group, topk_group) of every model in
    aiconfigurator-core's ``model_configs`` with group-limited routing (``n_group`` > 1:
    DeepSeek-V3/R1/V3.1/V3.2, 8 groups, the best 4)."""
    import json
    out = {}
    for f in sorted((data.root().parent.parent / "model_configs").glob("*_config.json")):
        c = json.loads(f.read_text())
        c = c.get("text_config", c)
        g, kg = c.get("n_group") or c.get("num_expert_group"), c.get("topk_group")
        e = c.get("n_routed_experts") or c.get("num_experts")
        k, inter, h = c.get("num_experts_per_tok"), c.get("moe_intermediate_size"), c.get("hidden_size")
        if g and kg and int(g) > 1 and int(kg) < int(g) and e and k and inter and h:
            out[(int(h), int(inter), int(e), int(k))] = (int(g), int(kg))
    return out


# collectors that route the benchmark's balanced logits through the model's grouped top-k
# (aiconfigurator collector/cases/models/DeepseekV3ForCausalLM_cases.yaml,
# sglang_moe_num_expert_group 8 / topk_group 4, used by collector/sglang/collect_moe.py's
# TopK(use_grouped_topk=...) since the v2 collector, 1d12d3211, 2026-05-19; vLLM's
# collector/vllm/collect_moe.py use_grouped_topk for DeepSeek model types since the 0.24.0
# collector, d5bad971c, 2026-07-13). TensorRT-LLM's collector does not: its DeepSeek rows
# read all 256 experts' weights (H200 fp8_block, tp 1, 64 tokens: 2.66 ms, 4.2 TB/s), where
# SGLang 0.5.14 and vLLM 0.24.0 take 1.39 ms (8.1 TB/s if all 256 were read, above the
# 4.8 TB/s peak; 128 experts at 4.1 TB/s) and ep 2 takes the time of ep 1 (1.97 vs 1.96 ms
# at 1024 tokens: every entry lands on the first chip's 128 experts).
GROUPED_ROUTING_SINCE = {"sglang": "0.5.14", "vllm": "0.24.0"}


def _grouped_rows(frame: pd.DataFrame) -> np.ndarray:
    """Rows whose benchmark routed through a grouped top-k (``GROUPED_ROUTING_SINCE``)."""
    if ("runtime" not in frame or "version" not in frame
            or not frame["runtime"].isin(list(GROUPED_ROUTING_SINCE)).any()):
        return np.zeros(len(frame), bool)
    shapes = grouped_shapes()
    key = zip(frame["hidden_size"], frame["inter_size"], frame["num_experts"], frame["topk"])
    shape = np.array([(int(h), int(i), int(e), int(k)) in shapes for h, i, e, k in key], bool)
    since = [GROUPED_ROUTING_SINCE.get(r) for r in frame["runtime"]]
    new = np.array([s is not None and data.version_key(str(v)) >= data.version_key(s)
                    for s, v in zip(since, frame["version"])], bool)
    return shape & new


def balanced_routing(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the routed rows and distinct experts the benchmark's balanced routing gives
    one chip (``_balanced_one``; the fit uses these, not the uniform-random expectation the
    scorer uses for real traffic: at 16 tokens x top-8 of 128 experts the benchmark touches
    all 128 experts, random routing 82, and the measured time follows the 128). Rows of a
    grouped-routing model measured by a collector that applies the model's grouped top-k
    (``_grouped_rows``) take ``_grouped_one``: half of DeepSeek's experts."""
    cols = ["num_tokens", "num_experts", "topk", "moe_ep_size"]
    f = frame[cols].assign(_g=_grouped_rows(frame))
    shapes = grouped_shapes() if f["_g"].any() else {}
    f["_ng"], f["_kg"] = 0, 0
    if f["_g"].any():
        gk = [shapes[(int(h), int(i), int(e), int(k))] if g else (0, 0) for h, i, e, k, g in
              zip(frame["hidden_size"], frame["inter_size"], frame["num_experts"],
                  frame["topk"], f["_g"])]
        f["_ng"], f["_kg"] = [x[0] for x in gk], [x[1] for x in gk]
    keys = cols + ["_ng", "_kg"]
    u = f[keys].drop_duplicates()
    got = [_grouped_one(*(int(x) for x in r)) if r[4] else _balanced_one(*(int(x) for x in r[:4]))
           for r in u.itertuples(index=False)]
    u = u.assign(_rows=[g[0] for g in got], _touched=[g[1] for g in got])
    m = f[keys].merge(u, on=keys, how="left")
    return m["_rows"].to_numpy(float), m["_touched"].to_numpy(float)


def predict(frame: pd.DataFrame, fam: str, acc, vals: dict) -> np.ndarray:
    p = f"moe_{fam}_"
    c = {k: frame[k].to_numpy() for k in SHAPE_COLS}
    if "_rows" not in frame:
        rows, touched = balanced_routing(frame)
    else:
        rows, touched = frame["_rows"].to_numpy(), frame["_touched"].to_numpy()
    mats = frame["_matrices"].to_numpy() if "_matrices" in frame else 3.0   # (load sets it)
    return grouped_gemm_s(c["num_tokens"], c["hidden_size"], c["inter_size"], c["topk"],
                          c["num_experts"], c["moe_tp_size"], c["moe_ep_size"],
                          WEIGHT_BYTES[fam], getattr(acc.peak_flops_per_s, PEAK_DTYPE[fam]),
                          acc.hbm_bw_bytes_per_s, vals[p + "fraction"], vals[p + "half_rows"],
                          vals[p + "width_half"], vals[p + "hbm_fraction"],
                          vals[p + "token_bytes"], vals[p + "latency_s"], rows, touched,
                          vals.get(p + "hidden_half", 0.0), vals.get(p + "batch_bytes", 0.0),
                          matrices=mats, route_bytes=vals.get(p + "route_bytes", 0.0),
                          nongated_slowdown=vals.get(p + "nongated_slowdown", 1.0),
                          wave_elements=vals.get(p + "wave_elements", 0.0),
                          remote_fraction=vals.get(p + "remote_fraction", 0.0),
                          l2_bytes=getattr(acc, "l2_cache_bytes", None) or 0.0,
                          l2_speedup=vals.get(p + "l2_speedup", 1.0))


HEADER = """MoE layer (grouped GEMM) model parameters per accelerator and runtime
(dse.perf.kernel_gemm.grouped_gemm_s; balanced routing, one chip; mats = 3 gated, 2 not):
  rows = tokens topk / ep; touched = (E/ep)(1 - (1 - topk/E)^tokens); w = inter / moe_tp
  shape = 1 / (1 + width_half / w + hidden_half / hidden)
  remote = remote_fraction (tokens topk - rows)
  t_s = latency_s + max(2 mats ((rows + remote + half_rows touched) w + wave_elements) hidden
                        / (peak fraction shape),
                        touched mats hidden w weight_bytes / (hbm_bw hbm_fraction))
        (x nongated_slowdown when mats = 2)
        + (rows token_bytes + tokens (batch_bytes + topk route_bytes)) hidden / hbm_bw
Keys moe_<family>_{fraction, half_rows (rows per touched expert), width_half, hidden_half
(elements), hbm_fraction, token_bytes (bytes per routed row per hidden element), batch_bytes
(bytes per token of the whole batch per hidden element), route_bytes (bytes per routed entry
of the whole batch per hidden element), latency_s (s), nongated_slowdown (time factor of the
non-gated kernel's expert GEMMs vs the gated one's), wave_elements (output elements of one wave
of tiles, paid per call), remote_fraction (share of a local row's compute an entry routed to
another chip still costs), l2_speedup (fit only: the benchmark's warm L2 on the expert weights,
kernel_gemm.warm_l2_factor; the scorer's cache is cold)};
families bf16, fp8 (per-tensor), fp8_block (block-scaled), fp4 (NVFP4), int4 (weight-only W4A16:
bf16 peak, 0.53 B per weight), mxfp4 (W4A16 MXFP4 experts on a chip without fp4 tensor cores:
bf16 peak, 0.5625 B per weight).
[<chip>.<runtime>.backend.<name>]: one kernel backend's own keys (serving.moe_backend; fitted on
its own rows where a group measured two or more, else transferred; dse/calibration/kernels/moe.py).
Fitted on aiconfigurator-core's moe_perf kernel microbenchmarks, balanced rows (python -m dse.calibration.kernels)."""


def main(fit: bool = False, write: bool = False, loco: bool = False) -> pd.DataFrame:
    import sys
    return _g.run(sys.modules[__name__], fit, write, loco)
