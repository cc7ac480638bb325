"""Shared helpers: build scorer batches from dotted designs, with ideal efficiencies on demand."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from dse.build import resolve, to_batch
from dse.perf import Batch, score

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"

IDEAL = {  # speed of light: peak FLOP/s, full bandwidths, no fixed costs
    "matmul_fraction": 1.0, "matmul_half_rows": 0.0, "attention_fraction": 1.0,
    "hbm_fraction": 1.0, "scaleup_fraction": 1.0, "scaleout_fraction": 1.0,
    "layer_overhead_s": 0.0, "step_overhead_s": 0.0, "network_overlap_fraction": 0.0,
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
