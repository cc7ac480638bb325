"""``dse predict --train``: score the training jobs of a case file (contracts/train-cases.md).

Each case is resolved against the training catalog (dse.catalog.training); blank layout
columns are filled by expanding every valid candidate (tp, pp, dp, ep, cp, vp, micro-batch,
recompute) into one table, scoring it in one call of the vectorized training model
(dse.perf.train_step) and keeping the fastest feasible row per case.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from dse import catalog
from dse.catalog import training as tcat
from dse.errors import InputError
from dse.perf.kernel_comm import AR_NCCL_KEYS
from dse.perf.train_batch import (
    BLOCK_SCALED_MMA,
    BOUNDS,
    GEMM_FAMILY,
    PEAK_DTYPE,
    PRECISIONS,
    REASONS,
    RECOMPUTE,
    SCHEDULES,
    TrainBatch,
)
from dse.perf.train_layout import layout_text
from dse.perf.train_step import score_train
from dse.perf.train_time import GEMM_KEYS, MOE_KEYS
from dse.scoring.predict import write_csv
from dse.scoring.train_cases import (
    KERNEL_COLUMN,
    OVERRIDES,
    SWITCHES,
    check_columns,
    parse,
    read_train_cases,
    where,
)
from dse.scoring.train_layouts import candidates

ATTN_KEYS = ("fraction", "half_tokens", "half_rows", "latency_s", "hbm_fraction", "dim_half",
             "per_seq_s", "per_seq_head_s", "window_pad_tokens")
A2A_KEYS = ("a2a_normal_dispatch_latency_s", "a2a_normal_dispatch_fraction",
            "a2a_normal_combine_latency_s", "a2a_normal_combine_fraction",
            "a2a_scaleout_latency_s", "a2a_scaleout_fraction")
FAMILY_FALLBACK = {"bf16": ("bf16",), "fp8": ("fp8", "bf16"),
                   "fp8_block": ("fp8_block", "fp8", "bf16"), "fp4": ("fp4", "fp8_block", "fp8",
                                                                      "bf16")}
PEAK_FALLBACK = {"bf16": ("bf16",), "fp16": ("fp16", "bf16"), "fp8": ("fp8", "bf16"),
                 "fp4": ("fp4", "fp8", "bf16")}
# Training GEMMs are large (thousands of rows, n and k in the thousands): the fp8 kernel fits'
# shape constants, fitted on inference shapes, put an 8192^3 fp8 GEMM on H100 at 0.61 of the
# fp8 peak, under the measured maximum achievable (MAMF 1402.6 of 1979 TFLOP/s, 0.71; the
# h100-sxm catalog entry). Training takes each family's large-GEMM fraction and the bf16 fit's
# shape constants (tile quantization in rows, edge waste in n, the K-loop prologue).
SHAPE_FROM_BF16 = ("half_rows", "n_half", "k_half", "wave_elements", "latency_s")
PARAMS = ("compute_fraction_scale", "overlap_fraction", "layer_overhead_s", "reserve_bytes",
          "fragmentation_fraction", "attention_bwd_ratio")
OUTPUT = ("case_id", "tp", "pp", "dp", "ep", "cp", "vp", "micro_batch_seqs", "recompute",
          "zero_stage", "step_time_s", "tokens_per_s_per_chip", "model_tflops_per_chip", "mfu",
          "hfu", "memory_per_chip_bytes", "bound", "feasible", "reason")
BREAKDOWN = ("pipeline_schedule", "sequence_parallel", "recompute_layer_fraction", "compute_s",
             "memory_s", "network_exposed_s", "network_total_s", "bubble_s", "optimizer_s",
             "weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes",
             "buffers_bytes", "chip_hours_per_trillion_tokens", "usd_per_trillion_tokens",
             "energy_j_per_token", "overhead_s")


def kernel_of(acc_id: str, precision: str, scale: dict | None = None) -> dict:
    """The kernel constants a case's GEMMs, attention and collectives use (``scale``: factors
    on the chip's catalog kernel parameters, by catalog key: an uncertainty sample)."""
    kp = tcat.kernel(acc_id)
    if scale:
        kp = {k: v * scale[k] if k in scale else v for k, v in kp.items()}
    fam = GEMM_FAMILY[PRECISIONS.index(precision)]
    use = next(f for f in FAMILY_FALLBACK[fam] if f"gemm_{f}_fraction" in kp)
    # the family's large-GEMM fraction, the bf16 fit's shape constants (SHAPE_FROM_BF16)
    out = {"gemm_" + k: kp[f"gemm_{'bf16' if k in SHAPE_FROM_BF16 else use}_{k}"]
           for k in GEMM_KEYS}
    out.update({"attn_prefill_" + k: kp.get("attn_prefill_" + k, 0.0) for k in ATTN_KEYS})
    out.update({k: kp[k] for k in (*AR_NCCL_KEYS, *A2A_KEYS)})
    moe = next(f for f in FAMILY_FALLBACK[fam] if f"moe_{f}_fraction" in kp)
    out.update({"moe_" + k: kp[f"moe_{moe}_{k}"] for k in MOE_KEYS})
    return out


def resolve_case(df: pd.DataFrame, i: int, p: dict, file: str, offset: int = 0) -> dict:
    """One case's model, chip and system numbers (a dict of scalars, TrainBatch names)."""
    m = tcat.lookup("models", df["model"].iloc[i], file=file,
                    where=where(df, i, "model", offset))
    acc, _ = tcat.lookup("accelerators", df["hardware"].iloc[i], file=file,
                         where=where(df, i, "hardware", offset))
    topo_id = df["topology"].iloc[i] if "topology" in df.columns else np.nan
    topo_id = acc.default_topology if isinstance(topo_id, float) else topo_id
    topo = tcat.lookup("topologies", topo_id, file=file, where=where(df, i, "topology", offset))
    prec = PRECISIONS[int(p["precision"][i])]
    given = {name: float(p[col][i]) for col, name in OVERRIDES.items()
             if col in p and np.isfinite(p[col][i])}
    given.update({name: float(p[col][i]) for col, (name, _) in SWITCHES.items()
                  if p[col][i] >= 0})
    code = int(p[KERNEL_COLUMN][i])
    kern = tcat.ATTENTION_KERNELS[code] if code >= 0 else None
    return design_numbers(m, acc, topo, prec, given, kern,
                          file=file, where=where(df, i, KERNEL_COLUMN, offset))


def design_numbers(m, acc, topo, prec: str, given: dict, attention_kernel: str | None = None,
                   *, file: str | None = None, where: str | None = None) -> dict:
    """A design's model, chip and system numbers (TrainBatch names) from its catalog entries,
    the precision, the attention kernel (None = the default) and the numbers ``given`` instead
    ({TrainBatch name: value})."""
    peaks = acc.peak_flops_per_s
    gated = 3.0 if m.mlp_gated else 2.0
    c = {"hidden_size": m.hidden_size, "num_layers": m.num_hidden_layers,
         "moe_layers": m.n_moe_layers, "heads": m.num_attention_heads,
         "kv_heads": m.num_key_value_heads, "head_dim": m.head_dim, "ffn": m.intermediate_size,
         "mlp_mats": gated, "vocab": m.vocab_size, "experts": m.num_experts,
         "topk": m.num_experts_per_tok, "expert_ffn": m.moe_intermediate_size,
         "shared_ffn": m.n_shared_experts * m.shared_expert_intermediate_size,
         "q_lora_rank": m.q_lora_rank, "kv_lora_rank": m.kv_lora_rank,
         "qk_nope_head_dim": m.qk_nope_head_dim, "qk_rope_head_dim": m.qk_rope_head_dim,
         "v_head_dim": m.v_head_dim, "tied": float(m.tie_word_embeddings),
         "sliding_window": float(m.sliding_window or 0),
         "local_layers": float(m.num_local_attention_layers or 0),
         "peak_bf16": peaks.bf16, "peak_fp16": peaks.fp16 or 0.0, "peak_fp8": peaks.fp8 or 0.0,
         "peak_fp4": peaks.fp4 or 0.0, "hbm_bw_bytes_per_s": acc.hbm_bw_bytes_per_s,
         "hbm_capacity_bytes": acc.hbm_capacity_bytes,
         "scaleup_bw_bytes_per_s": acc.scaleup_link_bw_bytes_per_s,
         "scaleout_bw_bytes_per_s": acc.scaleout_link_bw_bytes_per_s
         / topo.scaleout_oversubscription,
         "domain_chips": float(topo.domain_chips or acc.scaleup_domain_chips),
         "hbm_fraction": acc.efficiency.hbm_fraction, "usd_per_hour": acc.price.usd_per_hour,
         "all_in_power_w": acc.price.all_in_power_w, "kernel": kernel_of(acc.id, prec)}
    params = tcat.train_parameters()
    c.update({k: float(params[k]) for k in PARAMS})
    c["attention_fwd_rate"], c["attention_bwd_rate"] = tcat.attention_rates(
        acc.id, attention_kernel or tcat.document()["attention_kernels"]["default"],
        file=file, where=where)
    c["attention_unfused"] = float(attention_kernel == tcat.UNFUSED)
    # blank = overlapped, what Megatron-Core and NeMo run (the fields' defaults)
    c.update({"tp_comm_overlap": 0.0, "overlap_p2p_comm": 1.0, "overlap_grad_reduce": 1.0,
              "p2p_scatter_gather": 0.0, "cp_comm_type": 0.0, "moe_grouped_gemm": 0.0,
              "recompute_norms": 0.0, "recompute_moe_act": 0.0,
              "moe_router_force_load_balancing": 0.0,
              "expert_load_cv": catalog.expert_load_cv()})
    c.update(given)
    key = PEAK_DTYPE[PRECISIONS.index(prec)]
    # MXFP8 and NVFP4 need a block-scaled MMA, which the chips with an fp4 peak have
    # (train_batch.BLOCK_SCALED_MMA)
    block = BLOCK_SCALED_MMA[PRECISIONS.index(prec)]
    c["precision_native"] = float(c["peak_" + key] > 0 and (not block or c["peak_fp4"] > 0))
    # without native support the linear layers are timed at the best slower peak the chip has
    c["peak_flops_per_s"] = next(c["peak_" + d] for d in PEAK_FALLBACK[key] if c["peak_" + d] > 0)
    c["peak_bf16_flops_per_s"] = c["peak_bf16"]
    return c


def build(resolved: list[dict], layouts: pd.DataFrame, jobs: dict) -> TrainBatch:
    """The TrainBatch of every candidate row (``layouts['_case']`` indexes ``resolved``)."""
    idx = layouts["_case"].to_numpy()
    fields = {}
    skip = {"kernel", "peak_bf16", "peak_fp16", "peak_fp8", "peak_fp4"}
    for k in resolved[0]:
        if k not in skip:
            fields[k] = np.array([r[k] for r in resolved], float)[idx]
    kernel = {k: np.array([r["kernel"][k] for r in resolved], float)[idx]
              for k in resolved[0]["kernel"]}
    for k in ("tp", "pp", "dp", "ep", "cp", "vp", "micro_batch_seqs", "zero_stage",
              "recompute", "recompute_layer_fraction", "schedule", "sequence_parallel"):
        fields[k] = layouts[k].to_numpy(float)
    for k in ("global_batch_seqs", "seq_len", "precision", "mtp_layers"):
        fields[k] = np.asarray(jobs[k], float)[idx]
    return TrainBatch.of(kernel=kernel, **fields)


def select(cases: pd.DataFrame, layouts: pd.DataFrame, s: dict) -> pd.DataFrame:
    """The fastest feasible candidate per case (the least over memory where none fits)."""
    case = layouts["_case"].to_numpy()
    goal = np.where(s["feasible"], s["tokens_per_s_per_chip"],
                    -s["memory_per_chip_bytes"] / 1e30)
    goal = np.nan_to_num(goal, nan=-np.inf)
    order = np.lexsort((-goal, case))
    first = np.ones(len(order), bool)
    first[1:] = case[order][1:] != case[order][:-1]
    best = order[first]
    out = pd.DataFrame({"case_id": cases["case_id"].to_numpy()[case[best]]})
    for k in ("tp", "pp", "dp", "ep", "cp", "vp", "micro_batch_seqs", "zero_stage"):
        out[k] = layouts[k].to_numpy()[best].astype(int)
    out["recompute"] = np.array(RECOMPUTE, dtype=object)[layouts["recompute"].to_numpy()[best]]
    bits = s["layout_bits"][best]
    invalid = bits != 0           # an invalid layout is flagged, its numbers left blank
    for k in ("step_time_s", "tokens_per_s_per_chip", "model_tflops_per_chip", "mfu", "hfu",
              "memory_per_chip_bytes"):
        out[k] = np.where(invalid, np.nan, s[k][best])
    out["bound"] = np.where(invalid, "", np.array(BOUNDS, dtype=object)[s["bound"][best]])
    out["feasible"] = s["feasible"][best].astype(bool)
    out["reason"] = [REASONS[r] + (f": {layout_text(k)}" if k else "")
                     for r, k in zip(s["reason"][best], bits)]
    out["pipeline_schedule"] = np.array(SCHEDULES, dtype=object)[
        layouts["schedule"].to_numpy()[best]]
    out["sequence_parallel"] = layouts["sequence_parallel"].to_numpy()[best] > 0
    out["recompute_layer_fraction"] = np.where(out["recompute"] == "full",
                                               layouts["recompute_layer_fraction"].to_numpy()[best],
                                               0.0)
    for k in BREAKDOWN[3:]:
        out[k] = np.where(invalid, np.nan, s[k][best])
    return out[list(OUTPUT) + list(BREAKDOWN)]


def predict_train_frame(cases: pd.DataFrame, file: str = "cases") -> pd.DataFrame:
    """Predictions of a training case table (the CSV's columns, as strings or numbers)."""
    cases = cases.reset_index(drop=True).astype(object)
    cases = cases.where(cases.notna(), np.nan)
    cases = cases.map(lambda x: x if isinstance(x, float) else (str(x).strip() or np.nan))
    check_columns(cases, file)
    p = parse(cases, file)
    resolved = [resolve_case(cases, i, p, file) for i in range(len(cases))]
    layouts = candidates(cases, p, resolved, file)
    batch = build(resolved, layouts, {"global_batch_seqs": p["global_batch_seqs"],
                                      "seq_len": p["seq_len"], "precision": p["precision"],
                                      "mtp_layers": p["mtp_layers"]})
    with np.errstate(all="ignore"):          # an invalid layout's numbers are not shown
        scored = score_train(batch)
    return select(cases, layouts, scored)


def predict_train_file(path: str, out_path: str) -> pd.DataFrame:
    folder = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(folder):
        raise InputError("the output folder does not exist", file=out_path,
                         hint="create it or write the predictions elsewhere")
    pred = predict_train_frame(read_train_cases(path), file=path)
    tmp = out_path + ".tmp"
    write_csv(pred, tmp)
    os.replace(tmp, out_path)
    return pred

