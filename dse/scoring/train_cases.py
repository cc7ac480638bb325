"""Reading and checking a ``dse predict --train`` case file (contracts/train-cases.md): the
columns, their values, the dotted overrides; every refusal one line naming row and column."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from dse.catalog.training import ATTENTION_KERNELS
from dse.errors import InputError, suggest
from dse.perf.train_batch import (
    CP_COMM_TYPES,
    MOE_GROUPED_GEMM,
    PRECISIONS,
    RECOMPUTE,
    SCHEDULES,
    TP_COMM_OVERLAP,
)
from dse.spec import validate

REQUIRED = ("case_id", "model", "hardware", "num_chips", "global_batch_seqs", "seq_len",
            "precision")
LAYOUT = ("tp", "pp", "dp", "ep", "cp")
OPTIONAL = ("topology", *LAYOUT, "vp", "zero_stage", "micro_batch_seqs", "recompute",
            "pipeline_schedule", "sequence_parallel", "mtp_layers")
# columns case files carry for the record (never read)
ANNOTATIONS = ("source", "measurement_id", "citation", "derived_inputs", "split", "note")
COUNTS = ("num_chips", "global_batch_seqs", "seq_len", *LAYOUT, "vp", "micro_batch_seqs")
# dotted overrides a training case may set, and what they set
OVERRIDES = {
    "topology.scaleout.link_bw_bytes_per_s": "scaleout_bw_bytes_per_s",
    "accelerator.scaleout_link_bw_bytes_per_s": "scaleout_bw_bytes_per_s",
    "topology.scaleup.link_bw_bytes_per_s": "scaleup_bw_bytes_per_s",
    "accelerator.scaleup_link_bw_bytes_per_s": "scaleup_bw_bytes_per_s",
    "topology.domain_chips": "domain_chips", "topology.scaleup.domain_chips": "domain_chips",
    "accelerator.scaleup_domain_chips": "domain_chips",
    "accelerator.hbm_bw_bytes_per_s": "hbm_bw_bytes_per_s",
    "accelerator.hbm_capacity_bytes": "hbm_capacity_bytes",
    "accelerator.peak_flops_per_s.bf16": "peak_bf16",
    "accelerator.peak_flops_per_s.fp16": "peak_fp16",
    "accelerator.peak_flops_per_s.fp8": "peak_fp8",
    "accelerator.peak_flops_per_s.fp4": "peak_fp4",
    "accelerator.efficiency.hbm_fraction": "hbm_fraction",
    "train.compute_fraction_scale": "compute_fraction_scale",
    "train.overlap_fraction": "overlap_fraction",
    "train.layer_overhead_s": "layer_overhead_s",
    "train.reserve_bytes": "reserve_bytes",
    "train.fragmentation_fraction": "fragmentation_fraction",
    "train.attention_bwd_ratio": "attention_bwd_ratio",
}
BOOL = {"true": 1, "1": 1, "yes": 1, "false": 0, "0": 0, "no": 0}
# a dotted choice column a training case may set: the attention kernel the job ran
# (dse.catalog.training.ATTENTION_KERNELS; blank = the default)
KERNEL_COLUMN = "training.attention_kernel"
# dotted columns a training case may set for the communication of the job's software (blank =
# what Megatron-Core / NeMo run; dse.spec.train_fields): the TrainBatch field each sets and its
# choices (their codes)
SWITCHES = {"training.tp_comm_overlap": ("tp_comm_overlap",
                                         {k: i for i, k in enumerate(TP_COMM_OVERLAP)}),
            "training.overlap_p2p_comm": ("overlap_p2p_comm", BOOL),
            "training.overlap_grad_reduce": ("overlap_grad_reduce", BOOL),
            "training.p2p_scatter_gather": ("p2p_scatter_gather", BOOL),
            "training.recompute_norms": ("recompute_norms", BOOL),
            "training.recompute_moe_act": ("recompute_moe_act", BOOL),
            "training.moe_router_force_load_balancing": ("moe_router_force_load_balancing",
                                                         BOOL),
            "training.cp_comm_type": ("cp_comm_type",
                                      {k: i for i, k in enumerate(CP_COMM_TYPES)}),
            "training.moe_grouped_gemm": ("moe_grouped_gemm",
                                          {k: i for i, k in enumerate(MOE_GROUPED_GEMM)})}
# overrides that may be 0 (the others must be > 0)
ZERO_OK = ("train.overlap_fraction", "train.layer_overhead_s", "train.reserve_bytes",
           "train.fragmentation_fraction")
ZERO = {"0": 0, "1": 1, "2": 2, "3": 3, "fsdp": 3}


def where(df: pd.DataFrame, i: int, col: str, offset: int = 0) -> str:
    return f"row {i + offset + 2} (case_id {df['case_id'].iloc[i]}), column {col}"


def read_train_cases(path: str) -> pd.DataFrame:
    """The case table of ``path`` (strings), its header and required cells checked."""
    if os.path.isdir(path):
        raise InputError("is a directory, not a case file", file=path,
                         hint="give the path of a training case CSV")
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
    except FileNotFoundError:
        raise InputError("file not found", file=path,
                         hint="give the path of a training case CSV") from None
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as e:
        raise InputError(f"not a readable CSV ({str(e).splitlines()[0]})", file=path) from None
    check_columns(df, path)
    return df


def check_columns(df: pd.DataFrame, file: str) -> None:
    known = (*REQUIRED, *OPTIONAL)
    validate.typo_columns(df.columns, known, file=file)
    validate.field_part_columns(df.columns, (*known, *ANNOTATIONS), file=file)
    for c in map(str, df.columns):
        if "." in c and c not in OVERRIDES and c != KERNEL_COLUMN and c not in SWITCHES:
            raise InputError(f"unknown dotted column {c!r}: not a field a training case sets",
                             file=file, where=f"header, column {c}",
                             hint=suggest(c, (*OVERRIDES, KERNEL_COLUMN, *SWITCHES),
                                          "settable fields"))
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise InputError(f"missing required column {missing[0]!r}", file=file,
                         hint="contracts/train-cases.md lists the columns")
    if len(df) == 0:
        raise InputError("no cases: the file has a header but no rows", file=file,
                         hint="add one row per training job")
    for c in REQUIRED:
        blank = df[c].isna().to_numpy()
        if blank.any():
            i = int(np.flatnonzero(blank)[0])
            raise InputError(f"required column {c!r} is blank", file=file, where=where(df, i, c))
    dup = df["case_id"].duplicated().to_numpy()
    if dup.any():
        i = int(np.flatnonzero(dup)[0])
        raise InputError(f"duplicate case_id {df['case_id'].iloc[i]!r}", file=file,
                         where=f"row {i + 2}", hint="case ids must be unique")


def numbers(df: pd.DataFrame, col: str, file: str, *, count=True, offset=0,
            zero=False) -> np.ndarray:
    """A numeric column as floats (NaN = blank); a count must be a whole number >= 1, any other
    value finite and > 0 (>= 0 with ``zero``)."""
    if col not in df.columns:
        return np.full(len(df), np.nan)
    raw = df[col]
    v = pd.to_numeric(raw, errors="coerce").to_numpy(float)
    bad = raw.notna().to_numpy() & ~(np.isfinite(v) & ((v >= 0) if zero else (v > 0)))
    if count:
        bad |= raw.notna().to_numpy() & (np.mod(np.where(np.isfinite(v), v, 0.0), 1.0) != 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        what = "a whole number >= 1" if count else f"a finite number {'>=' if zero else '>'} 0"
        raise InputError(f"{col} = {raw.iloc[i]!r} is not valid", file=file,
                         where=where(df, i, col, offset), hint=f"{col} must be {what}")
    return v


def choices(df: pd.DataFrame, col: str, table: dict, file: str, offset=0) -> np.ndarray:
    """A choice column as codes (-1 = blank)."""
    if col not in df.columns:
        return np.full(len(df), -1)
    out = np.full(len(df), -1)
    for i, x in enumerate(df[col]):
        if isinstance(x, float) and np.isnan(x):
            continue
        key = str(x).strip().lower()
        if key not in table:
            raise InputError(f"{col} = {x!r} is not valid", file=file,
                             where=where(df, i, col, offset),
                             hint=suggest(key, table, f"valid {col}"))
        out[i] = table[key]
    return out


def parse(df: pd.DataFrame, file: str, offset: int = 0) -> dict:
    """Every contract column of the table, parsed: numbers (NaN blank) and codes (-1 blank)."""
    out = {c: numbers(df, c, file, offset=offset) for c in COUNTS}
    out["mtp_layers"] = np.zeros(len(df))
    if "mtp_layers" in df.columns:          # 0 is allowed here
        v = pd.to_numeric(df["mtp_layers"], errors="coerce").to_numpy(float)
        bad = df["mtp_layers"].notna().to_numpy() & ~(np.isfinite(v) & (v >= 0) & (
            np.mod(np.where(np.isfinite(v), v, 0.0), 1.0) == 0))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(f"mtp_layers = {df['mtp_layers'].iloc[i]!r} is not valid",
                             file=file, where=where(df, i, "mtp_layers", offset),
                             hint="a whole number >= 0")
        out["mtp_layers"] = np.nan_to_num(v)
    out["precision"] = choices(df, "precision", {p: i for i, p in enumerate(PRECISIONS)}, file,
                               offset)
    out["recompute"] = choices(df, "recompute", {p: i for i, p in enumerate(RECOMPUTE)}, file,
                               offset)
    out["pipeline_schedule"] = choices(df, "pipeline_schedule",
                                       {p: i for i, p in enumerate(SCHEDULES)}, file, offset)
    out["sequence_parallel"] = choices(df, "sequence_parallel", BOOL, file, offset)
    out["zero_stage"] = choices(df, "zero_stage", ZERO, file, offset)
    out[KERNEL_COLUMN] = choices(df, KERNEL_COLUMN,
                                 {k: i for i, k in enumerate(ATTENTION_KERNELS)}, file, offset)
    for c, (_, table) in SWITCHES.items():
        out[c] = choices(df, c, table, file, offset)
    for c in OVERRIDES:
        if c in df.columns:
            out[c] = numbers(df, c, file, count=False, offset=offset, zero=c in ZERO_OK)
    return out
