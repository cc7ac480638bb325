"""Collective cost models (``dse.perf.kernel_comm``) fitted on measured collective tables.

Data (kernel/collective microbenchmarks only):

- ``comm/nccl_perf`` (NCCL all_reduce, fp16, 2-8 GPUs, 256 .. 512M elements; ``message_size``
  is an element count, bytes = 2 x): op class ``allreduce_nccl``, runtime ``nccl``, 6
  parameters per chip (``ar_nccl_*``).
- ``comm/custom_allreduce_perf`` (the runtimes' custom all-reduce under CUDA graphs: SGLang
  ``*_graph``, vLLM ``*_graph``, TensorRT-LLM ``TRTLLM`` and ``TRTLLM_MNNVL_*``; eager variants are
  not fitted, the fastest kernel per shape is kept): op class ``allreduce_custom``, predicted as
  ``min(custom one-/two-shot, NCCL)`` with the chip's NCCL parameters held fixed (3 parameters
  per chip and runtime, ``ar_custom_*``).
- ``comm/moe_a2a_perf`` (trtllm: ``trtllm_deepep_ll`` / ``trtllm_deepep_ht``; vllm:
  ``deepep_ll`` / ``deepep_ht``; DeepEP V2 rows not fitted), ``comm/wideep_deepep_ll_perf`` and
  ``comm/wideep_deepep_normal_perf`` (sglang; fastest SM count per shape; one node = 8 GPUs,
  4 on GB200/GB300 trays), all single-node: op classes ``alltoall_<ll|normal>_<dispatch|combine>``.
  dtype ``default`` is read as fp8 for low-latency dispatch and bf16 otherwise; combine is bf16
  except low-latency fp8 (fp4-tagged combines run at bf16 speed in the tables).
- ``comm/trtllm_alltoall_perf`` (TensorRT-LLM's NVLink one-/two-sided all-to-all, GB200):
  pseudo-runtime ``trtllm_nvlink``, fastest kernel_source per shape (two-sided dispatch plus its
  ``alltoall_prepare``), every row fitted as both ``ll`` and ``normal`` (TRT-LLM runs this one
  kernel in both phases); it sets the a2a keys of the gb200/gb300 ``trtllm`` entries (gb300 by
  transfer). Rows of chips with NVLink domains (NVL72) are one scale-up node:
  ``rpn = max(ep / node_num, min(ep, scaleup_domain_chips))``, as the scorer has it.
- TensorRT-LLM's DeepEP rows (``moe_a2a_perf``) on gb200/gb300 are pseudo-runtime
  ``trtllm_deepep``: the catalog's trtllm entry of those chips carries the NVLink kernel's a2a
  keys (the kernel TRT-LLM runs on NVL72), so these rows are reported against the parameters
  fitted on them (fit mode only; against that entry they read 4-8x off, a kernel mismatch, not
  a model error) and are donors of the trtllm transfer to other chips.
- ``../shared/calibration/kernel_comm_measurements.csv`` as chip ``h800-sxm``: DeepEP V1 normal
  (bottleneck bandwidth, EP 8 NVLink and EP 16-64 RDMA, converted to seconds with the model's
  own bottleneck bytes) and low-latency rows (latency, EP 8-256, 8 GPUs a node), which are the
  only multi-node rows (they set ``a2a_scaleout_*``; every other chip takes them by transfer);
  the NCCL all-reduce busbw row of H800 (8 GPUs, taken at 1 GiB) sets its ``ar_nccl_fraction``.
  The V2 ("logical bandwidth") rows are not used.

Issue-rate terms of the all-to-all (``dse.perf.kernel_comm``): the normal kernels' cost per
token message (``a2a_normal_<phase>_message_s``) is fitted on every table; the low-latency
kernels' per-expert rate (``a2a_ll_<phase>_expert_bytes_per_s``) only on tables with at least
``MIN_EXPERT_COUNTS`` distinct expert counts (SGLang's wide-EP tables sweep 8-512): with two
(256 and 384, the TensorRT-LLM and vLLM tables) the term is proportional to the link term and
cannot be told from it. Such a table takes the rate the same DeepEP low-latency kernel has on
the chip's own tables that fit it (else any chip's; ``expert_rate_fixed``) and fits the rest
around it; the NVLink kernel (``trtllm_nvlink``) has no per-expert warp groups and no term.

Catalog entries (every accelerator x runtime): ``ar_nccl_*`` from the chip's NCCL table, else
by transfer. ``ar_custom_*`` and ``a2a_*`` from the (chip, runtime) table; a key the chip lacks
for that runtime takes the transfer rule (``common.transfer``) from the chips that have **that
runtime's** table (runtime kernels differ more than chips do); only when no chip has it, the
chip's own other runtimes (geometric mean); then a transfer over any runtime; then the prior
(``Param.x0``). ``fitted_on`` names the source of every key group.

Host-staged rows (documented data rule, ``host_staged``): a chip's NCCL rows of a group size
whose large-message (>= 16 MiB) bus bandwidth is below ``HOST_STAGED_FRACTION`` of the same
chip's 2-GPU bus bandwidth were measured on a box without peer-to-peer between those GPUs
(NCCL stages the ring through host memory). No topology in the catalog explains such a drop (a
PCIe tree's ring runs at the link rate: ``dse.catalog.topology``), and the end-to-end cases on that chip
ran on boxes with P2P. aiconfigurator-core's L40S table is the one case: busbw 20.1 GB/s for 2
GPUs (PCIe Gen4 x16 P2P: 63% of the 32 GB/s per direction, the share the RTX PRO 6000 box
reaches on Gen5 at 2 GPUs: 38.6 of 64 GB/s), 5.1 GB/s for 4, 1.45 GB/s for 8. Those rows (NCCL
and the runtimes' custom all-reduce of the same group sizes) are not fitted; the chip's
group-size terms (``GROUP_PARAMS``) are taken by transfer from the measured chips on the same
kind of fabric (the chip's default topology kind; the general transfer rule when none), and its
other parameters are fitted on the rows that remain.

Uncertainty (``dse.calibration.kernels.common``, section "parameter uncertainty"): every entry carries one
``uncertainty.<family>`` sub-table per family ``ar_nccl``, ``ar_custom``, ``a2a_<kind>_<phase>``
and ``a2a_scaleout``: the least-squares covariance of the log parameters where the family was
fitted on that chip's (and runtime's) table (the sub-block of a joint fit), and where it was
transferred the mean covariance of the transfer rule's nearest measured chips (the same
runtime's tables where any chip has them) plus ``ln(loco)^2`` on
every log parameter, ``loco`` being the median leave-one-chip-out error factor of the op class
in the same fit (``common.LOCO_DEFAULT`` when none was measured). A parameter fixed by transfer
inside a fitted family (a host-staged chip's group-size terms) gets the donors' variance plus
``ln(loco)^2``, uncorrelated.

Held-out rule and transfer rule: ``dse.calibration.kernels.common``; the all-to-all latencies take their
donors among the measured chips on the same default topology first (``same_fabric``: an HGX
board's chips from HGX boards, an NVL72 rack's from NVL72 racks), the general rule when none.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse.calibration.kernels import common, data
from dse.catalog import accelerators, topologies
from dse.perf import kernel_comm as kc

NAME = "comm"
P = common.Param
NCCL_PARAMS = (
    P("ar_nccl_latency_s", 6e-6, 1e-7, 1e-3, "latency"),
    P("ar_nccl_latency_per_log2_s", 2e-6, 1e-8, 1e-3, "latency"),
    P("ar_nccl_ll_fraction", 0.1, 1e-4, 2.0),
    P("ar_nccl_bulk_latency_s", 3e-5, 1e-7, 1e-2, "latency"),
    P("ar_nccl_fraction", 0.8, 1e-3, 3.0),
    P("ar_nccl_fraction_per_doubling", 1.0, 0.02, 4.0),
)
CUSTOM_PARAMS = (
    P("ar_custom_latency_s", 3e-6, 1e-7, 1e-3, "latency"),
    P("ar_custom_latency_per_log2_s", 3e-7, 1e-9, 1e-4, "latency"),
    P("ar_custom_fraction", 0.5, 1e-4, 3.0),
)
A2A_PARAMS = tuple(
    P(f"a2a_{kind}_{phase}_{what}", x0, lo, hi, k)
    for kind in ("ll", "normal") for phase in ("dispatch", "combine")
    for what, x0, lo, hi, k in (("latency_s", 3e-5, 1e-6, 1e-2, "latency"),
                                ("fraction", 0.5, 1e-3, 3.0, "fraction")))
SCALEOUT_PARAMS = (P("a2a_scaleout_latency_s", 1e-5, 1e-7, 1e-3, "latency"),
                   P("a2a_scaleout_fraction", 0.8, 1e-2, 3.0))
# the kernels' issue-rate terms (dse.perf.kernel_comm): one expert's rate (ll), per message
# (normal); the upper/lower bound is "no such term"
RATE_PARAMS = tuple(P(f"a2a_ll_{ph}_expert_bytes_per_s", 2e10, 1e8, 1e15) for ph in
                    ("dispatch", "combine")) \
    + tuple(P(f"a2a_normal_{ph}_message_s", 1e-8, 1e-13, 1e-5, "latency") for ph in
            ("dispatch", "combine"))
PARAMS = NCCL_PARAMS + CUSTOM_PARAMS + A2A_PARAMS + SCALEOUT_PARAMS + RATE_PARAMS
assert tuple(p.name for p in PARAMS) == kc.KEYS

AR_SHAPE = ("num_gpus", "message_size")
A2A_SHAPE = ("phase", "dtype", "tokens", "hidden", "topk", "experts", "ep")
CUSTOM_SOURCES = {"SGLang_CustomAllReduce_graph", "vLLM_custom_graph", "TRTLLM",
                  "TRTLLM_MNNVL_oneshot", "TRTLLM_MNNVL_twoshot"}
ELEM_BYTES = {"bf16": kc.BF16_ELEM_BYTES, "fp8": kc.FP8_ELEM_BYTES, "fp4": kc.NVFP4_ELEM_BYTES}
A2A_KIND = {"trtllm_deepep_ll": "ll", "trtllm_deepep_ht": "normal", "deepep_ll": "ll",
            "deepep_ht": "normal"}
RANKS_PER_NODE = {"gb200": 4, "gb300": 4}      # sglang wideep node_num=1 is one compute tray
# TensorRT-LLM's own NVLink all-to-all (comm/trtllm_alltoall_perf): the kernel TRT-LLM runs on
# NVL72 in both phases; pseudo-runtime of the fit, it sets the a2a keys of these chips' trtllm
# entries (chips without a table take it by transfer from the chips with one)
NVLINK_RT = "trtllm_nvlink"
NVLINK_CHIPS = ("gb200", "gb300")
NVLINK_SOURCES = ("NVLinkOneSided", "NVLinkTwoSided")
# TensorRT-LLM's DeepEP rows (moe_a2a_perf) on those chips: a kernel the chips' trtllm entry
# does not use there (it has the NVLink kernel's a2a keys), so they are reported against the
# parameters fitted on them (pseudo-runtime; fit mode only) and not against that entry (which
# made them look 4-8x off); they still take part in the trtllm transfer to other chips
DEEPEP_RT = "trtllm_deepep"
RT_POOL = {"trtllm": ("trtllm", DEEPEP_RT), DEEPEP_RT: ("trtllm", DEEPEP_RT)}
H800_AR_BYTES = 2.0 ** 30
HOST_STAGED_FRACTION = 0.4
HOST_STAGED_MIN_BYTES = 2.0 ** 24
# the parameters that set how an all-reduce scales with the group size (unmeasurable from
# 2-GPU rows alone: log2(2) - 1 = 0): transferred for a host-staged chip
GROUP_PARAMS = ("ar_nccl_latency_per_log2_s", "ar_nccl_fraction_per_doubling",
                "ar_custom_latency_per_log2_s")
# uncertainty families of a catalog entry: name -> parameter names
FAMILIES = {"ar_nccl": kc.AR_NCCL_KEYS, "ar_custom": kc.AR_CUSTOM_KEYS,
            **{f"a2a_{k}_{ph}": tuple(f"a2a_{k}_{ph}_{w}" for w in (
                "latency_s", "fraction", "expert_bytes_per_s" if k == "ll" else "message_s"))
               for k in ("ll", "normal") for ph in ("dispatch", "combine")},
            "a2a_scaleout": kc.SCALEOUT_KEYS}
HEADER = """Collective kernel parameters of dse.perf.kernel_comm (all-reduce: NCCL LL/Simple and the
runtime's custom one-/two-shot kernel; EP all-to-all: DeepEP low-latency and normal kernels,
dispatch and combine, and the scale-out tier), fitted by python -m dse.calibration.kernels.comm on
aiconfigurator-core's collective tables and the DeepEP/NCCL rows of
../shared/calibration/kernel_comm_measurements.csv (chip h800-sxm)."""


def _accs():
    return accelerators()


# --- data ----------------------------------------------------------------------------------

def nccl_rows() -> pd.DataFrame:
    d = data.load("comm", "nccl_perf", runtimes=["nccl"])
    d = d[(d["op_name"] == "all_reduce") & (d["nccl_dtype"] == "half")].copy()
    d["bytes"] = d["message_size"].astype(float) * 2.0
    d["dtype"] = "fp16"
    return d.reset_index(drop=True)


def custom_rows() -> pd.DataFrame:
    d = data.load("comm", "custom_allreduce_perf")
    d = d[d["kernel_source"].isin(CUSTOM_SOURCES)]
    d = d.groupby(["chip", "runtime", "num_gpus", "message_size"], as_index=False)["latency_s"].min()
    d["bytes"] = d["message_size"].astype(float) * 2.0
    d["dtype"] = "bf16"
    return d


def _dtype(backend_kind, phase, name):
    name = str(name).lower()
    if phase == "combine" and not (backend_kind == "ll" and name == "fp8"):
        return "bf16"     # measured combine times do not move with an fp4 tag (payload bf16)
    if name == "default":
        return "fp8" if (backend_kind == "ll" and phase == "dispatch") else "bf16"
    return {"bfloat16": "bf16", "fp8": "fp8", "fp4": "fp4", "nvfp4": "fp4"}.get(name, "bf16")


def a2a_rows() -> pd.DataFrame:
    cols = ["chip", "runtime", "kind", "phase", "dtype", "tokens", "hidden", "topk", "experts",
            "ep", "rpn", "latency_s"]
    parts = []
    d = data.load("comm", "moe_a2a_perf")
    d = d[d["comm_backend"].isin(A2A_KIND)].copy()
    if len(d):
        d["kind"] = d["comm_backend"].map(A2A_KIND)
        d["dtype"] = [_dtype(k, p, n) for k, p, n in zip(d["kind"], d["phase"], d["comm_dtype"])]
        d = d.rename(columns={"num_tokens": "tokens", "hidden_size": "hidden",
                              "num_experts": "experts", "ep_size": "ep"})
        d["rpn"] = d["ep"].astype(float) / d["node_num"].astype(float)
        nvl = d["chip"].isin(NVLINK_CHIPS) & (d["runtime"] == "trtllm")
        d.loc[nvl, "runtime"] = DEEPEP_RT
        parts.append(d[cols])
    parts.append(nvlink_a2a_rows())
    for kind, table in (("ll", "wideep_deepep_ll_perf"), ("normal", "wideep_deepep_normal_perf")):
        w = data.load("comm", table)
        if not len(w):
            continue
        w = w.rename(columns={"num_token": "tokens", "hidden_size": "hidden", "num_topk": "topk",
                              "num_experts": "experts"})
        rpn = w["chip"].map(RANKS_PER_NODE).fillna(8.0)
        for phase in ("dispatch", "combine"):
            col = f"{phase}_avg_t_s" if kind == "ll" else f"{phase}_transmit_s"
            x = w.assign(kind=kind, phase=phase, latency_s=w[col],
                         dtype="fp8" if phase == "dispatch" else "bf16",
                         rpn=rpn, ep=rpn * w["node_num"].astype(float))
            parts.append(x[cols])
    out = pd.concat(parts, ignore_index=True)
    for c in ("tokens", "hidden", "topk", "experts", "ep", "rpn"):
        out[c] = out[c].astype(float)
    # ranks inside one NVLink domain (NVL72: 72 chips over 18 trays) are one scale-up "node",
    # as the scorer has it (ranks_per_node = min(ep, domain_chips)): no scale-out term there
    dom = out["chip"].map(lambda c: float(_accs()[c].scaleup_domain_chips)).to_numpy(float)
    out["rpn"] = np.maximum(out["rpn"].to_numpy(float), np.minimum(out["ep"].to_numpy(float), dom))
    out = out[out["latency_s"] > 0]
    keys = [c for c in cols if c != "latency_s"]
    out = out.groupby(keys, as_index=False)["latency_s"].min()   # fastest SM count per shape
    return pd.concat([out, shared_a2a_rows()], ignore_index=True)


def nvlink_a2a_rows() -> pd.DataFrame:
    """TRT-LLM NVLink one-/two-sided all-to-all (GB200): fastest kernel_source per shape, the
    two-sided dispatch charged its ``alltoall_prepare`` step; combine payload bf16 (the dtype
    tag does not move it); ``alltoall_combine_low_precision`` not fitted. Every row enters
    twice, as kind ``ll`` and ``normal`` (TRT-LLM uses this one kernel in both phases)."""
    cols = ["chip", "runtime", "kind", "phase", "dtype", "tokens", "hidden", "topk", "experts",
            "ep", "rpn", "latency_s"]
    try:
        t = data.load("comm", "trtllm_alltoall_perf")
    except Exception:       # noqa: BLE001 - table optional
        return pd.DataFrame(columns=cols)
    if not len(t):
        return pd.DataFrame(columns=cols)
    t = t.rename(columns={"num_tokens": "tokens", "hidden_size": "hidden",
                          "num_experts": "experts", "moe_ep_size": "ep"})
    shape = ["chip", "moe_dtype", "tokens", "hidden", "topk", "experts", "ep"]
    prep = (t[(t["op_name"] == "alltoall_prepare") & (t["kernel_source"] == "NVLinkTwoSided")]
            .groupby(shape, as_index=False)["latency_s"].min()
            .rename(columns={"latency_s": "prep_s"}))
    t = t[t["op_name"].isin(["alltoall_dispatch", "alltoall_combine"])
          & t["kernel_source"].isin(NVLINK_SOURCES)].copy()
    t = t.merge(prep, on=shape, how="left")
    two = (t["op_name"] == "alltoall_dispatch") & (t["kernel_source"] == "NVLinkTwoSided")
    t.loc[two, "latency_s"] = t.loc[two, "latency_s"] + t.loc[two, "prep_s"].fillna(0.0)
    t["phase"] = t["op_name"].str.replace("alltoall_", "", regex=False)
    t["dtype"] = [_dtype("normal", p, n) for p, n in zip(t["phase"], t["moe_dtype"])]
    t["runtime"] = NVLINK_RT
    t["rpn"] = t["ep"].astype(float)
    t = t.groupby([c for c in cols if c not in ("kind", "latency_s")],
                  as_index=False)["latency_s"].min()        # fastest kernel_source per shape
    return pd.concat([t.assign(kind=k) for k in ("ll", "normal")], ignore_index=True)[cols]


def _shared():
    try:
        return data.shared_measurements()
    except Exception:       # noqa: BLE001 - the shared folder is optional
        return pd.DataFrame(columns=["id", "metric_name", "metric_value", "ep", "workload"])


def shared_a2a_rows() -> pd.DataFrame:
    s = _shared()
    s = s[s["id"].astype(str).str.match(r"DEEPEP-0(0\d|1\d|20)$")]
    rows = []
    acc = _accs()["h800-sxm"]
    for r in s.itertuples(index=False):
        phase = "dispatch" if "dispatch" in r.model else "combine"
        kind = "ll" if "low-latency" in r.model else "normal"
        ep = float(r.ep)
        tokens = 128.0 if kind == "ll" else 4096.0
        dt = "fp8" if phase == "dispatch" else "bf16"
        if kind == "ll":
            lat = float(r.metric_value) * 1e-6
        else:
            up, out = kc.alltoall_bytes(tokens, 7168, 8, 256, ep, 8, ELEM_BYTES[dt], kind)
            b = up if ep <= 8 else out
            lat = float(b) / (float(r.metric_value) * 1e9)
        rows.append(dict(chip="h800-sxm", runtime="deepep", kind=kind, phase=phase, dtype=dt,
                         tokens=tokens, hidden=7168.0, topk=8.0, experts=256.0, ep=ep, rpn=8.0,
                         latency_s=lat))
    del acc
    return pd.DataFrame(rows)


def shared_ar_rows() -> pd.DataFrame:
    s = _shared()
    s = s[(s["id"] == "NCCL-004")]
    rows = []
    for r in s.itertuples(index=False):
        g = 8.0
        t = 2 * (g - 1) / g * H800_AR_BYTES / (float(r.metric_value) * 1e9)
        rows.append(dict(chip="h800-sxm", runtime="nccl", num_gpus=g,
                         message_size=H800_AR_BYTES / 2, bytes=H800_AR_BYTES, dtype="fp16",
                         latency_s=t))
    return pd.DataFrame(rows)


# --- prediction ----------------------------------------------------------------------------

def _bw(frame, which="scaleup"):
    accs = _accs()
    attr = f"{which}_link_bw_bytes_per_s"
    return frame["chip"].map(lambda c: getattr(accs[c], attr)).to_numpy(float)


def predict_nccl(frame, vals):
    lat, spb = kc.nccl_allreduce_branches(frame["num_gpus"].to_numpy(float), _bw(frame),
                                          **{k: vals[k] for k in kc.AR_NCCL_KEYS})
    return np.min(lat + spb * frame["bytes"].to_numpy(float), axis=0)


def predict_custom(frame, vals):
    return kc.allreduce_s(frame["bytes"].to_numpy(float), frame["num_gpus"].to_numpy(float),
                          _bw(frame), **{k: vals[k] for k in kc.AR_NCCL_KEYS + kc.AR_CUSTOM_KEYS})


def predict_a2a(frame, vals):
    out = np.zeros(len(frame))
    f = frame
    up_bw, out_bw = _bw(f), _bw(f, "scaleout")
    eb = f["dtype"].map(ELEM_BYTES).to_numpy(float)
    for kind in ("ll", "normal"):
        for phase in ("dispatch", "combine"):
            m = ((f["kind"] == kind) & (f["phase"] == phase)).to_numpy()
            if not m.any():
                continue
            g = f[m]
            out[m] = kc.alltoall_s(g["tokens"].to_numpy(), g["hidden"].to_numpy(),
                                   g["topk"].to_numpy(), g["experts"].to_numpy(),
                                   g["ep"].to_numpy(), g["rpn"].to_numpy(), eb[m], up_bw[m],
                                   out_bw[m], **kc.phase_params(vals, kind, phase))
    return out


# --- fitting ---------------------------------------------------------------------------------

def _fit(predict, params, frame, fixed):
    """Fit ``params`` on ``frame`` (rows not held out) with ``fixed`` values for the others."""
    def pred(v):
        return predict(frame, {**fixed, **v})
    return common.least_squares_fit(pred, params, frame["latency_s"].to_numpy(float))


MIN_EXPERT_COUNTS = 3      # distinct expert counts a table needs to fit the per-expert rate


def _a2a_params(frame):
    """The a2a parameters a (chip, runtime) table fits, and the low-latency per-expert rates it
    cannot (fewer than ``MIN_EXPERT_COUNTS`` expert counts: the term is then proportional to
    the link term; module docstring)."""
    phases = frame[["kind", "phase"]].drop_duplicates().itertuples(index=False)
    have = [f"a2a_{k}_{ph}_" for k, ph in phases]
    ps = [p for p in A2A_PARAMS + RATE_PARAMS if any(p.name.startswith(h) for h in have)]
    fixed = []
    for ph in ("dispatch", "combine"):
        m = (frame["kind"] == "ll") & (frame["phase"] == ph)
        if m.any() and frame.loc[m, "experts"].nunique() < MIN_EXPERT_COUNTS:
            fixed.append(f"a2a_ll_{ph}_expert_bytes_per_s")
    ps = [p for p in ps if p.name not in fixed]
    if (frame["ep"] > frame["rpn"]).any():
        ps += list(SCALEOUT_PARAMS)
    return tuple(ps), fixed


RATE_HI = {p.name: p.hi for p in RATE_PARAMS}   # (the bound that is "no such term")


def expert_rate_fixed(chip, rt, names, fits, free) -> dict:
    """Values of the per-expert rates a table cannot fit (``_a2a_params``): the same DeepEP
    low-latency kernel's rates fitted on the chip's other tables (geometric mean; sglang's
    wide-EP table sweeps 8-512 experts), else on any chip's; TensorRT-LLM's NVLink kernel
    (no per-expert warp groups) has none (``RATE_HI``). ``free``: {(chip, runtime): the names
    that table fitted}."""
    out = {}
    for n in names:
        if rt == NVLINK_RT:
            out[n] = RATE_HI[n]
            continue
        fitted = {k: v[n] for k, v in fits.items() if n in free.get(k, ())}
        own = [x for (c, r), x in fitted.items() if c == chip]
        anyc = list(fitted.values())
        xs = own or anyc
        out[n] = float(np.exp(np.mean(np.log(xs)))) if xs else RATE_HI[n]
    return out


def rate_donors(chip, rt, names, fits, free) -> set:
    """The other chips ``expert_rate_fixed`` took rates from (none when the chip's own tables
    had them): a leave-one-chip-out of one of them cannot use this entry as a donor."""
    out = set()
    for n in names:
        if rt == NVLINK_RT:
            continue
        fitted = [c for (c, r), v in fits.items() if n in free.get((c, r), ())]
        if chip not in fitted:
            out |= set(fitted)
    return out


DEFAULTS = {p.name: p.x0 for p in PARAMS}


def host_staged(nccl: pd.DataFrame) -> dict[str, list[float]]:
    """{chip: group sizes} whose measured NCCL all-reduce ran host-staged (module docstring):
    median bus bandwidth at messages >= ``HOST_STAGED_MIN_BYTES`` below
    ``HOST_STAGED_FRACTION`` of the chip's own 2-GPU bus bandwidth."""
    out = {}
    big = nccl[nccl["bytes"] >= HOST_STAGED_MIN_BYTES]
    for chip, g in big.groupby("chip"):
        n = g["num_gpus"].astype(float)
        bus = (2.0 * (n - 1.0) / n * g["bytes"] / g["latency_s"]).groupby(n).median()
        if 2.0 not in bus.index:
            continue
        bad = [float(k) for k, v in bus.items() if k > 2.0 and v < HOST_STAGED_FRACTION * bus[2.0]]
        if bad:
            out[chip] = bad
    return out


def fabric_donors(chip: str, measured, accs) -> list[str]:
    """The measured chips whose default topology is of the same kind as ``chip``'s (the
    group-size terms are a property of the fabric), else the general transfer neighbours."""
    topo = topologies()

    def kind(c):
        t = accs[c].default_topology
        return topo[t].kind if t in topo else None
    same = sorted(c for c in measured if c != chip and kind(c) == kind(chip))
    return same or common.neighbours(chip, sorted(measured), accs)


def same_fabric(chip: str, measured, accs) -> list[str]:
    """The measured chips on ``chip``'s default topology (an HGX board, an NVL72 rack, ...),
    all of ``measured`` when none is: the donors of the all-to-all's fixed latencies
    (``*_latency_s``). A kernel's fixed latency belongs to the fabric and the system software
    it runs over as much as to the chip: TensorRT-LLM's DeepEP low-latency dispatch takes
    180-250 us on a GB200 tray against 70 us on a B200 board, chips a spec-ratio rule cannot
    tell apart. Its rates (fractions, per message, per expert) stay with the general rule: they
    follow the chip generation (Blackwell's DeepEP combine is slower per byte than Hopper's in
    TensorRT-LLM and vLLM; HGX donors alone make B200's 1.5x too fast)."""
    topo = accs[chip].default_topology if chip in accs else None
    same = sorted(c for c in measured if c != chip and c in accs
                  and accs[c].default_topology == topo)
    return same or sorted(c for c in measured if c != chip)


def fit_all(frames):
    """{class: {(chip, runtime): values}} fitted on the rows that are not held out, plus
    ``cov`` {(class, chip, runtime): (names, log covariance)} and ``staged`` {chip: (group
    sizes not fitted, donor chips of the group-size terms)}."""
    nccl, custom, a2a, h800_ar = frames[:4]
    staged = frames[4] if len(frames) > 4 else {}
    accs = _accs()
    # "derived": {class: {key: chips some of the entry's terms were taken from}} (the
    # leave-one-chip-out donor filter, common.loco_donors)
    fits = {"nccl": {}, "custom": {}, "a2a": {}, "cov": {}, "staged": {},
            "derived": {"nccl": {}, "custom": {}, "a2a": {}}}

    def run(predict, params, tr, fixed, key):
        f = _fit(predict, params, tr, fixed)
        fits["cov"][key] = ([p.name for p in params], f.log_cov)
        return f.values

    def group_fixed(chip, cls, rt=None):
        donors = fits["staged"][chip][1]
        if cls == "nccl":
            vs = [fits["nccl"][d] for d in donors if d in fits["nccl"]]
        else:
            vs = [fits["custom"][(d, rt)] for d in donors if (d, rt) in fits["custom"]] or \
                 [v for (d, r), v in fits["custom"].items() if d in donors]
        g = _geo(vs) if vs else {}
        return {k: g[k] for k in GROUP_PARAMS if k in g}

    for chip, g in nccl.groupby("chip"):
        if chip not in staged:
            fits["nccl"][chip] = run(predict_nccl, NCCL_PARAMS, g[~g["_held"]], {},
                                     ("nccl", chip, None))
    for chip, g in nccl.groupby("chip"):
        if chip in staged:
            fits["staged"][chip] = (staged[chip], fabric_donors(chip, list(fits["nccl"]), accs))
            fixed = group_fixed(chip, "nccl")
            fits["derived"]["nccl"][chip] = set(fits["staged"][chip][1])
            ps = tuple(p for p in NCCL_PARAMS if p.name not in fixed)
            fits["nccl"][chip] = {**fixed, **run(predict_nccl, ps, g[~g["_held"]], fixed,
                                                 ("nccl", chip, None))}
    groups = sorted(custom.groupby(["chip", "runtime"]), key=lambda kv: kv[0][0] in staged)
    for (chip, rt), g in groups:      # host-staged chips last: they take donors' terms
        fixed = group_fixed(chip, "custom", rt) if chip in staged else {}
        if chip in staged:
            fits["derived"]["custom"][(chip, rt)] = set(fits["staged"][chip][1])
        ps = tuple(p for p in CUSTOM_PARAMS if p.name not in fixed)
        fits["custom"][(chip, rt)] = {**fixed, **run(
            predict_custom, ps, g[~g["_held"]], {**fits["nccl"][chip], **fixed},
            ("custom", chip, rt))}
    # tables that fit every rate first; the others take the per-expert rates they cannot fit
    # from them (expert_rate_fixed)
    groups = sorted(a2a.groupby(["chip", "runtime"]),
                    key=lambda kv: bool(_a2a_params(kv[1][~kv[1]["_held"]])[1]))
    free = {}
    for (chip, rt), g in groups:
        tr = g[~g["_held"]]
        ps, names = _a2a_params(tr)
        fixed = expert_rate_fixed(chip, rt, names, fits["a2a"], free)
        fits["derived"]["a2a"][(chip, rt)] = rate_donors(chip, rt, names, fits["a2a"], free)
        free[(chip, rt)] = {p.name for p in ps}
        fits["a2a"][(chip, rt)] = {**fixed, **run(predict_a2a, ps, tr, {**DEFAULTS, **fixed},
                                                  ("a2a", chip, rt))}
    if len(h800_ar):   # H800: transferred NCCL parameters, its busbw row sets the fraction
        base, near, _ = common.transfer("h800-sxm", fits["nccl"], NCCL_PARAMS, _accs())
        fits["derived"]["nccl"]["h800-sxm"] = set(near)
        fr = run(predict_nccl, (NCCL_PARAMS[4],), h800_ar, base, ("nccl", "h800-sxm", None))
        fits["nccl"]["h800-sxm"] = {**base, **fr}
    return fits


def _geo(dicts):
    keys = set().union(*dicts)
    return {k: float(np.exp(np.mean([np.log(d[k]) for d in dicts if k in d]))) for k in keys}


def entry_for(chip, rt, fits, accs, exclude=None):
    """(values, fitted_on) of every key for one chip and runtime by the documented rules.
    ``trtllm`` on the NVL72 chips takes its a2a keys from TRT-LLM's NVLink all-to-all table
    (pseudo-runtime ``trtllm_nvlink``), by transfer where the chip has none."""
    vals, notes = {}, []
    derived = fits.get("derived", {})

    def fits_of(cls):    # every fit but ``exclude``'s and those derived from it (loco_donors)
        return common.loco_donors(fits[cls], exclude, fits[cls], derived.get(cls))
    nccl = fits_of("nccl")
    if chip in nccl:
        vals.update(nccl[chip])
        notes.append("ar_nccl: " + ("nccl_perf" if chip != "h800-sxm" else
                                    "transfer + NCCL-004 busbw"))
        if chip in fits.get("staged", {}):
            sizes, donors = fits["staged"][chip]
            notes.append("nccl_perf and custom rows of " + "/".join(f"{g:g}" for g in sizes)
                         + " GPUs host-staged (no P2P), not fitted; " + "+".join(GROUP_PARAMS)
                         + " from " + "+".join(donors) + " (same fabric kind)")
    else:
        v, near, _ = common.transfer(chip, nccl, NCCL_PARAMS, accs)
        vals.update(v)
        notes.append("ar_nccl: transfer from " + "+".join(near))
    for cls, ps in (("custom", CUSTOM_PARAMS),
                    ("a2a", A2A_PARAMS + SCALEOUT_PARAMS + RATE_PARAMS)):
        f = fits_of(cls)
        label = "ar_custom" if cls == "custom" else "a2a"
        names = [p.name for p in ps]
        own = {k: v for k, v in f.get((chip, rt), {}).items() if k in names}
        if cls == "a2a" and (chip, "deepep") in f:
            own = {**f[(chip, "deepep")], **own}
        how = [f"{rt} tables"] if own else []
        if cls == "a2a" and rt == "trtllm" and chip in NVLINK_CHIPS:
            nv = {c: v for (c, r), v in f.items() if r == NVLINK_RT}
            a2a_names = [p.name for p in A2A_PARAMS + RATE_PARAMS]
            if chip in nv:
                own = {**own, **{k: v for k, v in nv[chip].items() if k in a2a_names}}
                src = f"{chip} trtllm_alltoall_perf"
            elif nv:
                v, near, _ = common.transfer(chip, nv, A2A_PARAMS + RATE_PARAMS, accs)
                own = {**own, **v}
                src = "trtllm_alltoall_perf transfer from " + "+".join(near)
            else:
                src = None
            if src:
                how = [f"ll+normal: {src} (TRT-LLM NVLink one-/two-sided all-to-all, the one "
                       "kernel TRT-LLM runs on NVL72 in both phases; fastest per shape)"]
                own = {k: v for k, v in own.items() if k in names}
        got = dict(own)

        def transfer_from(pool):
            """Fill missing keys by transfer from the chips with tables of ``pool``'s
            runtimes (None: any runtime; per chip the geometric mean over its runtimes)."""
            missing = [n for n in names if n not in got]
            per_chip = {}
            for (c, r), v in f.items():
                if r == NVLINK_RT and rt not in (NVLINK_RT,):
                    continue          # NVL72-only kernel: never transferred to other runtimes
                if pool is None or r in pool:
                    per_chip.setdefault(c, []).append(v)
            per_chip = {c: _geo(v) for c, v in per_chip.items() if c != chip}
            for p in ps:
                if p.name not in missing:
                    continue
                have = {c: v for c, v in per_chip.items() if p.name in v}
                if not have:
                    continue
                if cls == "a2a" and p.name.endswith("_latency_s"):   # (same_fabric)
                    have = {c: have[c] for c in same_fabric(chip, have, accs)}
                v, near, _ = common.transfer(chip, have, (p,), accs)
                got.update(v)
                src = "any runtime" if pool is None else "+".join(pool)
                how.append(f"{p.name.split('_', 2)[1] if cls == 'a2a' else label} "
                           f"{src} transfer from " + "+".join(near))

        # runtime kernels differ more than chips do: a chip without this runtime's table takes
        # the runtime's kernels from the chips that have it, and its own other runtimes only
        # when no chip has that runtime's table
        transfer_from(RT_POOL.get(rt, (rt,)) if cls == "a2a" else (rt,))
        missing = [n for n in names if n not in got]
        if missing:       # the chip's other runtimes
            others = [v for (c, r), v in f.items()
                      if c == chip and r not in (rt, NVLINK_RT, DEEPEP_RT)]
            o = _geo(others) if others else {}
            add = {n: o[n] for n in missing if n in o}
            if add:
                got.update(add)
                how.append("chip's other runtimes")
        if any(n not in got for n in names):
            transfer_from(None)
        prior = [n for n in names if n not in got]
        if prior:         # nothing measured anywhere (e.g. scale-out without the H800 rows)
            got.update({n: DEFAULTS[n] for n in prior})
            how.append("prior for " + "+".join(prior))
        vals.update(got)
        notes.append(f"{label}: " + ", ".join(dict.fromkeys(how)))
    return vals, "; ".join(notes)


def frames_with_holdout():
    """(nccl, custom, a2a, h800 rows, host-staged {chip: group sizes}); the host-staged rows
    are dropped from the NCCL and custom frames."""
    nccl, custom, a2a, h800 = nccl_rows(), custom_rows(), a2a_rows(), shared_ar_rows()
    staged = host_staged(nccl)

    def drop(d):
        bad = np.array([float(n) in staged.get(c, ()) for c, n in zip(d["chip"], d["num_gpus"])],
                       bool)
        return d[~bad].reset_index(drop=True)
    nccl, custom = drop(nccl), drop(custom)
    nccl["_held"] = common.held_out(nccl, AR_SHAPE)
    custom["_held"] = common.held_out(custom, AR_SHAPE)
    a2a["_held"] = common.held_out(a2a, A2A_SHAPE)
    return nccl, custom, a2a, h800, staged


def _report_rows(op, frame, pred_fn, values_of, suffix=""):
    rows = []
    keys = ["chip", "runtime", "dtype"] + (["kind", "phase"] if "kind" in frame else [])
    for key, g in frame.groupby(keys):
        chip, rt, dt = key[:3]
        name = op if "kind" not in frame else f"alltoall_{key[3]}_{key[4]}"
        vals = values_of(chip, rt)
        if vals is None:
            continue
        p = pred_fn(g, vals)
        t = g["latency_s"].to_numpy(float)
        h = g["_held"].to_numpy(bool) if "_held" in g else np.zeros(len(g), bool)
        ho = np.log(p[h] / t[h]) if h.any() else np.array([])
        if suffix:        # leave-one-chip-out: every row of the chip is unseen
            h = np.ones(len(g), bool)
            ho = np.log(p / t)
        rows.append(dict(op_class=name + suffix, chip=chip, runtime=rt, dtype=dt,
                         shapes_fit=int((~h).sum()), shapes_held_out=int(h.sum()),
                         error_fit=common.error_factor(p[~h], t[~h]) if (~h).any() else np.nan,
                         error_held_out=common.error_factor(p[h], t[h]) if h.any() else np.nan,
                         bias_held_out=float(np.exp(np.mean(ho))) if len(ho) else np.nan))
    return rows


def loco_errors(rows) -> dict[str, float]:
    """{family: median leave-one-chip-out error factor of its op class} (scale-out: every
    all-to-all class; ``common.LOCO_DEFAULT`` where none was measured)."""
    lo = pd.DataFrame([r for r in rows if r["op_class"].endswith("/loco")])
    lo = lo[np.isfinite(lo["error_held_out"].astype(float))] if len(lo) else lo

    def med(mask):
        v = lo.loc[mask, "error_held_out"] if len(lo) else []
        return float(np.median(v)) if len(v) else common.LOCO_DEFAULT
    cls = lo["op_class"].str[:-5] if len(lo) else pd.Series(dtype=str)
    out = {"ar_nccl": med(cls == "allreduce_nccl"), "ar_custom": med(cls == "allreduce_custom"),
           "a2a_scaleout": med(cls.str.startswith("alltoall"))}
    for fam in FAMILIES:
        if fam.startswith("a2a_") and fam != "a2a_scaleout":
            out[fam] = med(cls == "alltoall_" + fam[4:])
    return out


def _cov_sources(chip, rt):
    """Where a family's fitted covariance of (chip, rt) lives, in the order entry_for uses."""
    a2a = ([("a2a", chip, NVLINK_RT)] if rt == "trtllm" and chip in NVLINK_CHIPS else []) \
        + [("a2a", chip, rt), ("a2a", chip, "deepep")]
    return {"ar_nccl": [("nccl", chip, None)], "ar_custom": [("custom", chip, rt)],
            **{f: a2a for f in FAMILIES if f.startswith("a2a_")}}


def entry_uncertainty(chip, rt, fits, loco_err) -> dict:
    """The ``uncertainty`` sub-tables of one catalog entry (module docstring, common.py)."""
    covs = fits.get("cov", {})
    out = {}
    for fam, names in FAMILIES.items():
        n = len(names)
        own_var, own_cov = {}, None
        for key in _cov_sources(chip, rt)[fam]:
            if key in covs and any(x in covs[key][0] for x in names):
                fn, c = covs[key]
                idx = [fn.index(x) if x in fn else -1 for x in names]
                own_cov = np.zeros((n, n))
                for i, a in enumerate(idx):
                    for j, b in enumerate(idx):
                        if a >= 0 and b >= 0:
                            own_cov[i, j] = c[a, b]
                own_var = {x for x, i in zip(names, idx) if i >= 0}
                break
        # donors: the fitted covariances of this family on other chips (same runtime first)
        cls = {"ar_nccl": "nccl", "ar_custom": "custom"}.get(fam, "a2a")
        pool = [(k, v) for k, v in covs.items() if k[0] == cls and k[1] != chip
                and all(x in v[0] for x in names)]
        same_rt = [(k, v) for k, v in pool if k[2] in (rt, None)]
        pool = same_rt or pool
        # the transfer rule's neighbours among them (as gemm/moe/attention take their donors)
        # (a host-staged chip's group-size terms: the fabric donors they were taken from)
        if own_cov is not None and chip in fits.get("staged", {}):
            near = set(fits["staged"][chip][1])
        elif chip in _accs():
            cand = sorted({k[1] for k, _ in pool})
            if cls == "a2a" and all(x.endswith("_latency_s") for x in names):
                cand = same_fabric(chip, cand, _accs())
            near = set(common.neighbours(chip, cand, _accs()))
        else:
            near = {k[1] for k, _ in pool}
        donors = [v for k, v in pool if k[1] in near] or [v for _, v in pool]
        dcov = [np.asarray(c)[np.ix_([fn.index(x) for x in names], [fn.index(x) for x in names])]
                for fn, c in donors]
        lo = loco_err.get(fam, common.LOCO_DEFAULT)
        tr = common.inflated_cov(dcov, lo) if dcov else np.eye(n) * np.log(lo) ** 2
        rule_t = f"transferred: donors' covariance + ln({lo:.4g})^2 (median leave-one-chip-out error)"
        if own_cov is None:
            out[fam] = common.uncertainty(names, tr, rule_t)
            continue
        free = [i for i, x in enumerate(names) if x not in own_var]
        for i in free:              # fixed by transfer inside a fitted family: uncorrelated
            own_cov[i, :] = 0.0
            own_cov[:, i] = 0.0
            own_cov[i, i] = tr[i, i]
        rule = "fitted: least-squares covariance"
        if free:
            rule += ("; " + "+".join(names[i] for i in free) + " transferred (donors' variance + "
                     f"ln({lo:.4g})^2)")
        out[fam] = common.uncertainty(names, own_cov, rule)
    return out


def catalog_entries(path=None):
    import tomllib
    path = path or common.CATALOG_DIR / f"{NAME}.toml"
    with open(path, "rb") as fh:
        return tomllib.load(fh)


def _rt(rt):
    """Catalog runtime whose entry predicts a table's rows."""
    return {"nccl": "sglang", "deepep": "sglang", NVLINK_RT: "trtllm"}.get(rt, rt)


def main(fit: bool = True, write: bool = False, loco: bool = False) -> pd.DataFrame:
    accs = _accs()
    frames = frames_with_holdout()
    nccl, custom, a2a, h800, staged = frames
    for chip, sizes in staged.items():
        print(f"comm: {chip} NCCL/custom all-reduce rows of {'/'.join(f'{g:g}' for g in sizes)} "
              "GPUs host-staged (no P2P), not fitted")
    h800 = h800.assign(_held=False)
    if fit:
        fits = fit_all(frames)

        def values_of(chip, rt):
            return entry_for(chip, _rt(rt), fits, accs)[0]
    else:
        cat = catalog_entries()

        def values_of(chip, rt):
            return cat.get(chip, {}).get(_rt(rt))
    rows = []
    rows += _report_rows("allreduce_nccl", pd.concat([nccl, h800], ignore_index=True),
                         predict_nccl, values_of)
    rows += _report_rows("allreduce_custom", custom, predict_custom, values_of)
    rows += _report_rows("alltoall", a2a, predict_a2a, values_of)
    if (loco or write) and fit:   # the transfer rule's error (also sizes transferred covariances)
        def loco_of(chip, rt):
            return entry_for(chip, _rt(rt), fits, accs, exclude=chip)[0]
        rows += _report_rows("allreduce_nccl", nccl, predict_nccl, loco_of, "/loco")
        rows += _report_rows("allreduce_custom", custom, predict_custom, loco_of, "/loco")
        rows += _report_rows("alltoall", a2a, predict_a2a, loco_of, "/loco")
    if write and fit:
        loco_err = loco_errors(rows)
        entries = {}
        for chip in accs:
            for rt in data.RUNTIMES:
                vals, how = entry_for(chip, rt, fits, accs)
                entries[(chip, rt)] = {**{p.name: vals[p.name] for p in PARAMS},
                                       "fitted_on": how,
                                       "uncertainty": entry_uncertainty(chip, rt, fits, loco_err)}
        common.write_tables(NAME, HEADER, entries)
    if not loco:
        rows = [r for r in rows if not r["op_class"].endswith("/loco")]
    return pd.DataFrame(rows, columns=["op_class", "chip", "runtime", "dtype", "shapes_fit",
                                       "shapes_held_out", "error_fit", "error_held_out",
                                       "bias_held_out"])


if __name__ == "__main__":
    pd.set_option("display.width", 200)
    print(main(fit=True, write=False, loco=False).to_string())
