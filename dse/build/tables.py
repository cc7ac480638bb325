"""The catalog as integer-coded numpy tables, built once per process.

Each kind of entry (accelerator, topology, model) is numbered in catalog order: an entry's
*code* is its position in ``Tables.ids[kind]``. Every numeric field is one float64 array over
the entries of its kind (``Tables.columns["accelerator.hbm_bw_bytes_per_s"][codes]`` gives the
value of every design at once; NaN where an entry lacks the field, e.g. a dtype the chip has no
native support for). The fitted kernel parameters (dse/catalog/kernels/*.toml) are one array
``Tables.kernel[accelerator, runtime, key]``; a chip with no entry for a runtime takes, per key,
the mean of every entry that has it (none is missing today: the fit writes every chip), and the
extra runtime slot ``-1`` (an unknown runtime) holds those means too; a GEMM's fixed time is the
smallest any runtime's table fits on the chip (``_served_gemm_latency``). A named MoE kernel
backend (``serving.moe_backend``) overlays its own parameters,
``Tables.backend_kernel[accelerator, runtime, backend, key]`` (NaN: the key is auto's).

The tables are rebuilt when the catalog's cached entries are (``dse.calibration.fit`` and
``dse.calibration.calibrate`` clear them after writing a fit), so they never serve stale numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dse import catalog
from dse.catalog.specs import DTYPES
from dse.perf import kernel_attention
from dse.spec import fields

ACC_FIELDS = ("hbm_capacity_bytes", "hbm_bw_bytes_per_s", "tdp_w", "scaleup_link_bw_bytes_per_s",
              "scaleup_domain_chips", "scaleout_link_bw_bytes_per_s")
EFF_FIELDS = ("hbm_fraction", "scaleup_fraction", "scaleout_fraction", "layer_overhead_s",
              "graph_layer_overhead_s", "step_overhead_s", "network_overlap_fraction")
# an efficiency field left blank in the catalog takes another's value
EFF_AS = {"graph_layer_overhead_s": "layer_overhead_s"}
MODEL_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "intermediate_size", "vocab_size", "tie_word_embeddings", "mlp_gated",
                "num_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
                "shared_expert_intermediate_size", "first_k_dense_replace", "moe_layer_step",
                "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                "sliding_window", "num_local_attention_layers", "num_nextn_predict_layers")
TOPO_FIELDS = ("rack_chips", "scaleup_base_latency_s", "scaleup_hop_latency_s",
               "scaleout_latency_s", "scaleout_oversubscription", "link_collectives")
KIND_OF = {"accelerator": "accelerators", "topology": "topologies", "model": "models"}


def _float(v) -> float:
    return np.nan if v is None else float(v)


def _accelerator_row(a) -> dict[str, float]:
    r = {f"accelerator.{f}": _float(getattr(a, f)) for f in ACC_FIELDS}
    for d in DTYPES:
        r[f"accelerator.peak_flops_per_s.{d}"] = _float(getattr(a.peak_flops_per_s, d))
    r["accelerator.price_usd_per_hour"] = _float(a.price.usd_per_hour)
    r["accelerator.capex_usd"] = _float(a.price.capex_usd)
    r["accelerator.all_in_power_w"] = _float(a.price.all_in_power_w)
    for f in EFF_FIELDS:
        v = getattr(a.efficiency, f)
        r[f"accelerator.efficiency.{f}"] = _float(getattr(a.efficiency, EFF_AS[f])
                                                  if v is None and f in EFF_AS else v)
    return r


def _topology_row(t) -> dict[str, float]:
    return {**{f"topology.{f}": _float(getattr(t, f)) for f in TOPO_FIELDS},
            "topology.domain_chips": _float(t.domain_chips)}


def _model_row(m) -> dict[str, float]:
    return {f"model.{f}": _float(getattr(m, f)) for f in MODEL_FIELDS}


def _stack(rows: list[dict]) -> dict[str, np.ndarray]:
    return {k: np.array([r[k] for r in rows], dtype=np.float64) for k in rows[0]}


@dataclass(frozen=True, eq=False)
class Tables:
    ids: dict              # kind -> tuple of ids (an entry's code is its position)
    index: dict            # kind -> {id: code}
    columns: dict          # dotted path -> float64 array over the entries of its kind
    default_topology: np.ndarray   # accelerator code -> its default topology's id (object)
    runtimes: tuple        # serving.runtime choices (a runtime's code is its position)
    kernel_keys: tuple     # catalog.kernel_keys()
    kernel: np.ndarray     # float64 [accelerator, runtime (+1: unknown), key]
    moe_backends: tuple    # serving.moe_backend choices ("auto" first: no override)
    backend_kernel: np.ndarray   # float64 [accelerator, runtime (+1), backend, key]; NaN: auto's
    built_from: tuple      # the catalog objects these tables were built from

    def paths(self, kind: str) -> list[str]:
        """The numeric columns of one kind ("accelerator", "topology", "model"), in order."""
        return [p for p in self.columns if p.startswith(kind + ".")]


def _build() -> Tables:
    accs, topos, mods = catalog.accelerators(), catalog.topologies(), catalog.models()
    params = catalog.kernel_params()
    ids = {"accelerator": tuple(accs), "topology": tuple(topos), "model": tuple(mods)}
    index = {k: {e: i for i, e in enumerate(v)} for k, v in ids.items()}
    columns = {**_stack([_accelerator_row(a) for a in accs.values()]),
               **_stack([_topology_row(t) for t in topos.values()]),
               **_stack([_model_row(m) for m in mods.values()])}
    default_topology = np.array([a.default_topology for a in accs.values()], dtype=object)
    runtimes = tuple(fields.REGISTRY["serving.runtime"].choices)
    keys = catalog.kernel_keys()
    # the mean over every (chip, runtime) entry that has the key: a missing entry's value
    # (a variant part's entries are its base's: counted once)
    mean = np.array([np.mean([v[k] for v in params.values() if k in v and "kernel_base" not in v])
                     for k in keys])
    kernel = np.empty((len(accs), len(runtimes) + 1, len(keys)))
    # a variant part (``kernel_base``) reads its base part's fits
    kchip = {acc_id: accs[acc_id].kernel_base or acc_id for acc_id in ids["accelerator"]}
    for a, acc_id in enumerate(ids["accelerator"]):
        for r, rt in enumerate(runtimes):
            entry = params.get((kchip[acc_id], rt), {})
            kernel[a, r] = [entry.get(k, m) for k, m in zip(keys, mean)]
        kernel[a, -1] = mean
    have = [[(kchip[acc_id], rt) in params for rt in runtimes] for acc_id in ids["accelerator"]]
    _served_gemm_latency(kernel, keys, have)
    _served_mla(kernel, keys, have, columns)
    backends = tuple(fields.REGISTRY["serving.moe_backend"].choices)
    over = np.full((len(accs), len(runtimes) + 1, len(backends), len(keys)), np.nan)
    kpos = {k: j for j, k in enumerate(keys)}
    for a, acc_id in enumerate(ids["accelerator"]):
        for r, rt in enumerate(runtimes):
            for b, sec in params.get((kchip[acc_id], rt), {}).get("backend", {}).items():
                if b not in backends:
                    continue
                for k, v in sec.items():
                    if k in kpos:
                        over[a, r, backends.index(b), kpos[k]] = v
    return Tables(ids, index, columns, default_topology, runtimes, keys, kernel, backends, over,
                  (accs, topos, mods, params))


def _served_gemm_latency(kernel: np.ndarray, keys, have) -> None:
    """A serving step's GEMMs pay the kernel's own fixed time: per chip and GEMM family, every
    runtime takes the smallest fitted ``gemm_<family>_latency_s`` of the runtimes measured on
    that chip (in place). A runtime's table may time a GEMM through its Python op wrapper and
    activation quantization (vLLM's block-fp8 table fits 82-194 us per call where SGLang's runs
    the same DeepGEMM/CUTLASS kernels in 4-6 us; TensorRT-LLM's fp8 table includes dynamic
    activation scaling, 12-15 us): under CUDA graphs and fused quantization a step does not pay
    that. The kernel fits and their report keep their own values."""
    have = np.asarray(have, bool)                       # [accelerator, runtime]
    n_rt = have.shape[1]
    for j, k in enumerate(keys):
        if not (k.startswith("gemm_") and k.endswith("_latency_s")):
            continue
        vals = np.where(have, kernel[:, :n_rt, j], np.inf)
        best = vals.min(axis=1)
        ok = np.isfinite(best)
        kernel[ok, :n_rt, j] = best[ok, None]


# MLA kernel families and the parameters each passes to its kernel function (dse.perf)
MLA_FAMILIES = {"mla_prefill": "prefill", "mla_prefill_kv_fp8": "prefill",
                "mla_decode": "decode", "mla_decode_kv_fp8": "decode"}
_PREFILL_ARGS = ("fraction", "half_tokens", "half_rows", "latency_s", "hbm_fraction", "per_seq_s",
                 "per_seq_head_s")
_DECODE_ARGS = ("hbm_fraction", "compute_fraction", "group_min_heads", "latency_s", "per_seq_s",
                "half_items")
# The reference shapes a served MLA kernel is ranked on: DeepSeek-V3's attention (128 heads)
# split over 1-8 ranks; decode: batches of 1-512 at 1k-16k context; prefill: 1-8 prompts of
# 512-8k tokens
_HEADS = np.array([16.0, 32.0, 64.0, 128.0])
_DEC_BATCH, _DEC_CTX = np.array([1.0, 8.0, 64.0, 512.0]), np.array([1024.0, 4096.0, 16384.0])
_PRE_BATCH, _PRE_TOKENS = np.array([1.0, 2.0, 8.0]), np.array([512.0, 2048.0, 8192.0])


def _mla_times(kind: str, fam: str, p: dict, peak: float, bw: float) -> np.ndarray:
    """One runtime's fitted MLA kernel on the reference shapes (seconds)."""
    if kind == "prefill":
        h, b, s = np.meshgrid(_HEADS, _PRE_BATCH, _PRE_TOKENS, indexing="ij")
        return kernel_attention.mla_prefill_attention_s(b, s, 0.0, h, 2.0, peak, bw, **p)
    h, b, c = np.meshgrid(_HEADS, _DEC_BATCH, _DEC_CTX, indexing="ij")
    kvb = 1.0 if fam.endswith("kv_fp8") else 2.0
    return kernel_attention.mla_decode_attention_s(b, c, h, kvb, peak, bw, **p)


def _served_mla(kernel: np.ndarray, keys, have, columns) -> None:
    """A serving step runs the fastest MLA kernel the chip's tables show (in place): per chip
    and MLA family (prefill and decode, bf16 or fp8 cache) every runtime takes the parameter
    set of the runtime whose fitted kernel is fastest on the reference shapes (geometric mean
    time). The runtimes share the MLA kernel libraries (FlashMLA, FlashInfer, TensorRT-LLM's
    generation kernels: SGLang runs ``trtllm_mla`` on Blackwell and matches TensorRT-LLM's table
    there), while a table can time a slower backend than the one served: SGLang's Hopper tables
    (``flash_attention`` backend) reach 0.19 of peak in prefill where TensorRT-LLM's reach 0.66,
    and 0.12-0.13 on the fp8-cache decode MMAs (0.70). The kernel fits and their report keep
    their own values; the served choice is checked on the Hopper serving set's MLA rows."""
    have = np.asarray(have, bool)                       # [accelerator, runtime]
    n_rt = have.shape[1]
    pos = {k: j for j, k in enumerate(keys)}
    peak_bf16 = columns["accelerator.peak_flops_per_s.bf16"]
    peak_fp8 = columns["accelerator.peak_flops_per_s.fp8"]
    bw = columns["accelerator.hbm_bw_bytes_per_s"]
    for fam, kind in MLA_FAMILIES.items():
        args = _PREFILL_ARGS if kind == "prefill" else _DECODE_ARGS
        cols = [pos[f"{fam}_{a}"] for a in args if f"{fam}_{a}" in pos]
        names = [a for a in args if f"{fam}_{a}" in pos]
        for a in range(kernel.shape[0]):
            peak = peak_fp8[a] if fam == "mla_decode_kv_fp8" and np.isfinite(peak_fp8[a]) \
                else peak_bf16[a]
            if not (np.isfinite(peak) and np.isfinite(bw[a])):
                continue
            score = np.full(n_rt, np.inf)
            for r in np.flatnonzero(have[a]):
                p = dict(zip(names, kernel[a, r, cols]))
                score[r] = np.exp(np.mean(np.log(_mla_times(kind, fam, p, peak, bw[a]))))
            if np.isfinite(score).any():
                served = kernel[a, :n_rt]                   # a view: assigned in place
                served[:, cols] = kernel[a, int(np.argmin(score)), cols]


def backend_available(T: "Tables") -> np.ndarray:
    """bool [runtime (+1), backend]: some chip has fitted or transferred parameters of that
    MoE backend for that runtime (auto, backend 0, always)."""
    avail = np.isfinite(T.backend_kernel).any(axis=(0, 3))
    avail[:, 0] = True
    return avail


def backend_runtimes(T: "Tables") -> dict[str, set[str]]:
    """{moe backend: runtimes with any fitted or transferred parameters for it}."""
    avail = backend_available(T)
    return {name: {rt for r, rt in enumerate(T.runtimes) if avail[r, b]}
            for b, name in enumerate(T.moe_backends) if avail[:len(T.runtimes), b].any()}


_TABLES: Tables | None = None


def tables() -> Tables:
    """The catalog's tables, built on first use and whenever the catalog was reloaded."""
    global _TABLES
    now = (catalog.accelerators(), catalog.topologies(), catalog.models(), catalog.kernel_params())
    if _TABLES is None or any(a is not b for a, b in zip(_TABLES.built_from, now)):
        _TABLES = _build()
    return _TABLES


__all__ = ["ACC_FIELDS", "EFF_FIELDS", "KIND_OF", "MODEL_FIELDS", "TOPO_FIELDS", "Tables", "tables"]
