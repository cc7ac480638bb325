"""Fit the per-op kernel models on the measured kernel tables and print the per-op error report.

    python -m dse.calibration.kernels                 # error report of the catalog's parameters (held-out shapes)
    python -m dse.calibration.kernels --fit           # refit, report
    python -m dse.calibration.kernels --fit --write   # ... and write dse/catalog/kernels/<op>.toml
    python -m dse.calibration.kernels --loco          # leave-one-chip-out: the transfer rule's error per chip
    python -m dse.calibration.kernels --only gemm,moe # some op classes only
    python -m dse.calibration.kernels --loco --out reports/kernels   # ... and write the report as Markdown

Needs the optional extra: pip install -e ".[kernels]".
"""

from __future__ import annotations

import argparse
import importlib
import sys

import numpy as np
import pandas as pd

from dse.errors import InputError
from dse.spec.csvsafe import spreadsheet_safe

# op-class modules of dse.calibration.kernels; each has NAME and main(fit, write, loco) -> DataFrame with
# the columns of REPORT_COLUMNS
OP_MODULES = ("gemm", "moe", "attention", "comm")
REPORT_COLUMNS = ("op_class", "chip", "runtime", "dtype", "shapes_fit", "shapes_held_out",
                  "error_fit", "error_held_out", "bias_held_out")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dse.calibration.kernels", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fit", action="store_true")
    p.add_argument("--write", action="store_true")
    p.add_argument("--loco", action="store_true")
    p.add_argument("--only", default="")
    p.add_argument("--out", help="folder to write the report to (README.md, report.csv)")
    a = p.parse_args(argv)
    names = [n for n in (a.only.split(",") if a.only else OP_MODULES) if n]
    frames = []
    try:
        for name in names:
            if name not in OP_MODULES:
                raise InputError(f"unknown op class {name!r}", where="--only",
                                 hint="one of " + ", ".join(OP_MODULES))
            try:
                mod = importlib.import_module(f"dse.calibration.kernels.{name}")
            except ModuleNotFoundError as e:
                if e.name == f"dse.calibration.kernels.{name}":
                    print(f"{name}: no fit yet", file=sys.stderr)
                    continue
                raise
            frames.append(mod.main(fit=a.fit or a.write, write=a.write, loco=a.loco))
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if frames:
        rep = pd.concat(frames, ignore_index=True)
        print(_table(rep))
        if a.out:
            write_report(rep, a.out)
    return 0


def summary(rep: pd.DataFrame) -> pd.DataFrame:
    """Per op class: groups, median and worst held-out error, share of groups <= 1.15, and the
    pooled error (geometric mean over every held-out shape of the class: the groups' errors
    weighted by their held-out shapes)."""
    r = rep.dropna(subset=["error_held_out"])
    g = r.groupby("op_class")["error_held_out"]
    pooled = r.groupby("op_class").apply(
        lambda x: float(np.exp(np.average(np.log(x["error_held_out"]),
                                          weights=x["shapes_held_out"]))), include_groups=False)
    return pd.DataFrame({"groups": g.size(), "median": g.median(), "worst": g.max(),
                         "share_le_1.15": g.apply(lambda x: float((x <= 1.15).mean())),
                         "pooled": pooled}).reset_index()


def write_report(rep: pd.DataFrame, folder: str) -> None:
    """The per-op error report as Markdown (summary per op class, then every group) and CSV."""
    from pathlib import Path
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    spreadsheet_safe(rep).to_csv(out / "report.csv", index=False)
    lines = ["# Per-op error of the kernel models (`python -m dse.calibration.kernels --loco --out ...`)", "",
             "Error = geometric mean of max(pred/true, true/pred) over a group's measured kernel",
             "times (aiconfigurator-core's tables; the DeepEP/NCCL rows of",
             "../shared/calibration). `held_out`: shapes the fit never saw (crc32 of the shape",
             "key % 5 == 0, the same shapes on every chip); `/loco` rows: the chip predicted with",
             "parameters transferred from the other chips only (dse/calibration/kernels/common.py).",
             "`moe` scores each shape with the fit of the kernel backend that measured it",
             "(`serving.moe_backend`); `moe/auto` rows: the joint fit over all of a group's",
             "backends (`auto`, the default) on the groups where each has its own fit",
             "(dse/calibration/kernels/moe.py).", "",
             "## Summary per op class (held-out shapes)", "",
             _table(summary(rep)), "", "## Every chip x runtime x dtype", "", _table(rep), ""]
    (out / "README.md").write_text("\n".join(lines))


def _table(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    rows += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in df.itertuples(index=False)]
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
