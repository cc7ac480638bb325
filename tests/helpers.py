"""Shared helpers: build scorer batches from dotted designs, with ideal efficiencies on demand."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from dse.build.designs import resolve, to_batch
from dse.perf import Batch, score

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"

IDEAL = {  # speed of light: peak FLOP/s, full bandwidths, no fixed costs, no padding
    "hbm_fraction": 1.0, "scaleup_fraction": 1.0, "scaleout_fraction": 1.0,
    "layer_overhead_s": 0.0, "graph_layer_overhead_s": 0.0, "step_overhead_s": 0.0,
    "network_overlap_fraction": 0.0,
    "request_overhead_s": 0.0, "seq_overhead_s": 0.0, "frontend_prompt_token_s": 0.0,
    "frontend_token_s": 0.0, "frontend_text_token_s": 0.0, "frontend_request_s": 0.0,
    "gemm_fraction": 1.0, "gemm_half_rows": 0.0, "gemm_n_half": 0.0, "gemm_k_half": 0.0,
    "gemm_wave_elements": 0.0, "gemm_hbm_fraction": 1.0, "gemm_latency_s": 0.0,
    "moe_fraction": 1.0, "moe_half_rows": 0.0, "moe_width_half": 0.0, "moe_hbm_fraction": 1.0,
    "moe_token_bytes": 0.0, "moe_latency_s": 0.0, "moe_hidden_half": 0.0, "moe_batch_bytes": 0.0,
    "moe_route_bytes": 0.0, "moe_nongated_slowdown": 1.0, "moe_wave_elements": 0.0,
    "moe_remote_fraction": 0.0,
    "attn_prefill_fraction": 1.0, "attn_prefill_half_tokens": 0.0, "attn_prefill_half_rows": 0.0,
    "attn_prefill_latency_s": 0.0, "attn_prefill_hbm_fraction": 1.0,
    "attn_prefill_per_seq_s": 0.0, "attn_prefill_per_seq_head_s": 0.0,
    "attn_prefill_dim_half": 0.0,
    "attn_decode_hbm_fraction": 1.0, "attn_decode_compute_fraction": 1.0,
    "attn_decode_group_min_heads": 0.0, "attn_decode_latency_s": 0.0,
    "attn_decode_per_seq_s": 0.0, "attn_decode_per_seq_kv_head_s": 0.0,
    "attn_decode_group_max_heads": 1e4, "attn_decode_fallback_fraction": 1.0,
    "attn_decode_window_group_max_heads": 1e4,
    "attn_decode_half_items": 0.0,
    # collectives: NCCL Simple at the full link, no latency (LL and custom kernels never win)
    "ar_nccl_latency_s": 1.0, "ar_nccl_latency_per_log2_s": 0.0, "ar_nccl_ll_fraction": 1.0,
    "ar_nccl_bulk_latency_s": 0.0, "ar_nccl_fraction": 1.0, "ar_nccl_fraction_per_doubling": 1.0,
    "ar_custom_latency_s": 1.0, "ar_custom_latency_per_log2_s": 0.0, "ar_custom_fraction": 1.0,
    # no runtime selection rule (it would pick the one-shot kernel these pins make never win)
    "ar_oneshot_below_2_bytes": 0.0, "ar_oneshot_below_4_bytes": 0.0, "ar_oneshot_below_bytes": 0.0,
    **{f"a2a_{k}_{p}_{w}": (0.0 if w == "latency_s" else 1.0) for k in ("ll", "normal")
       for p in ("dispatch", "combine") for w in ("latency_s", "fraction")},
    "a2a_scaleout_latency_s": 0.0, "a2a_scaleout_fraction": 1.0, "scaleup_extra_latency_s": 0.0,
    "tp_bw_rel": 1.0, "ffn_bw_rel": 1.0, "a2a_bw_rel": 1.0,
}


def batch(rows: list[dict] | dict, ideal: bool = False) -> Batch:
    rows = [rows] if isinstance(rows, dict) else rows
    b = to_batch(resolve(pd.DataFrame(rows)))
    if ideal:
        b = b.replace(**IDEAL)
    return b


def one(design: dict, ideal: bool = False, **updates) -> dict:
    """Score one design; returns {metric: float}."""
    b = batch(design, ideal)
    if updates:
        b = b.replace(**updates)
    return {k: (v[0].item() if hasattr(v[0], "item") else v[0]) for k, v in score(b).items()}


def design(acc="h100-sxm", model="llama-3.1-70b", **kw) -> dict:
    d = {"accelerator.id": acc, "model.id": model}
    d.update(kw)
    return d


CASE_COLUMNS = ["case_id", "model", "hardware", "topology", "num_chips", "tp", "pp", "ep", "dp",
                "weight_dtype", "kv_dtype", "isl", "osl", "concurrency", "prefix_hit_fraction",
                "phase"]


def run_cli(capsys, *args):
    """``dse ARGS`` in-process: (exit code, stdout, stderr)."""
    from dse.cli import main
    capsys.readouterr()
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def run_subprocess(*args, cwd=ROOT):
    env = {k: v for k, v in os.environ.items() if k != "DSE_DEBUG"}
    return subprocess.run([sys.executable, "-m", "dse", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def write_cases(path: Path, rows, columns=CASE_COLUMNS) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in columns})
    return path


__all__ = ["CASE_COLUMNS", "IDEAL", "ROOT", "SHARED", "batch", "design", "np", "one", "run_cli",
           "run_subprocess", "write_cases"]


SMALL_SPACE = """
name = "t"
[accelerator]
id = "h100-sxm"
[model]
id = "llama-3.1-8b"
[parameters]
"accelerator.id" = ["h100-sxm", "h200-sxm", "a100-sxm-80g"]
"layout.tp" = [1, 2, 4]
"workload.concurrency" = { low = 1, high = 512, num = 10, log = true }
"accelerator.hbm_bw_bytes_per_s" = { scale = [1.0, 1.5] }
[objectives]
usd_per_mtok_output = "minimize"
tpot_s = "minimize"
[constraints]
ttft_s = { max = 2.0 }
"""


def brute_front(space) -> set:
    """Design ids of the exact Pareto front of a space, scored all at once."""
    from dse import pareto
    from dse.perf import score_chunked
    idx = np.arange(space.size)
    b, _ = space.batch(idx)
    s = score_chunked(b, dtype=np.float32)
    ok = pareto.admissible(s, space.objectives, space.constraints)
    F = pareto.objective_matrix(s, space.objectives)[ok]
    return set(idx[ok][pareto.nondominated(F)].tolist())



def check_first_lines(out: Path) -> None:
    """A worked answer written with bands off (``tests/conftest.py`` ``answered``) leads with its
    Lead numbers: each is the flattened answer number it names, the README's, summary.md's and
    the terminal's first lines give it, and they say that bands are off."""
    import json

    from dse.questions.answer import first_lines
    from dse.questions.sampled import _flat, value_text
    doc = json.loads((out / "answer.json").read_text())
    flat = _flat(doc["numbers"])
    assert doc["lead"], "the answer names no Lead number"
    lines = first_lines(out).splitlines()
    assert len(lines) == len(doc["lead"])
    for x, line in zip(doc["lead"], lines):
        assert x["nominal"] == flat[x["key"]], x["key"]
        assert line.startswith(f"- **{x['label']}: {value_text(x['nominal'], x['unit'])}**")
        assert "uncertainty bands off, `--bands 0`" in line
    readme = (out / "README.md").read_text()
    assert readme.split("## Answer\n\n", 1)[1].startswith(lines[0])
    assert (out / "summary.md").read_text().startswith("## Answer\n\n" + lines[0])


# a space of 24 designs (two chips, two TPs, three batch sizes, a scale factor of the HBM
# bandwidth) with a TTFT bound, as a dict: what dse.run and dse.load_space take
API_SPACE = {
    "name": "api-small",
    "accelerator": {"id": "h100-sxm"},
    "model": {"id": "llama-3.1-70b", "weight_dtype": "fp8"},
    "workload": {"isl": 2048, "osl": 256},
    "parameters": {"accelerator.id": ["h100-sxm", "h200-sxm"], "layout.tp": [4, 8],
                   "workload.concurrency": [8, 64, 512],
                   "accelerator.hbm_bw_bytes_per_s": {"scale": [1.0, 1.5]}},
    "objectives": {"usd_per_mtok_output": "minimize", "tpot_s": "minimize"},
    "constraints": {"ttft_s": {"max": 5.0}},
}


def check_w4a16_decode_by_hand(st, moe_op: int, p: dict, acc, c: float, experts: int, topk: int,
                               hidden: int, width: int, layers: int, weight_bytes: float) -> None:
    """A W4A16 MoE family's decode step by hand (int4 Marlin, MXFP4): the touched experts'
    4-bit weights (``weight_bytes`` per weight) at the family's HBM fraction, and the compute
    at the bf16 peak with the family's tile padding, wave and edge terms (``p``: the family's
    parameters without their prefix; ``width``: an expert's width on one rank)."""
    import pytest
    touched = experts * (1.0 - (1.0 - topk / experts) ** c)
    bytes_ = touched * 3 * hidden * width * weight_bytes * layers
    assert st.decode.memory_s[moe_op][0] == pytest.approx(
        bytes_ / (acc.hbm_bw_bytes_per_s * p["hbm_fraction"]), rel=1e-9)
    shape = 1.0 + p["width_half"] / width + p["hidden_half"] / hidden
    rows = c * topk + p["half_rows"] * touched + p["wave_elements"] / width
    flops = 2.0 * 3 * hidden * width * layers * rows
    assert st.decode.compute_s[moe_op][0] == pytest.approx(
        flops * shape / (acc.peak_flops_per_s.bf16 * p["fraction"]), rel=1e-9)
