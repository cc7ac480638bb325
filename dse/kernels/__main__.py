"""Fit the per-op kernel models on the measured kernel tables and print the per-op error report.

    python -m dse.kernels                 # error report of the catalog's parameters (held-out shapes)
    python -m dse.kernels --fit           # refit, report
    python -m dse.kernels --fit --write   # ... and write dse/catalog/kernels/<op>.toml
    python -m dse.kernels --loco          # leave-one-chip-out: the transfer rule's error per chip
    python -m dse.kernels --only gemm,moe # some op classes only

Needs the optional extra: pip install -e ".[kernels]".
"""

from __future__ import annotations

import argparse
import importlib
import sys

import pandas as pd

from dse.errors import InputError

# op-class modules of dse.kernels; each has NAME and main(fit, write, loco) -> DataFrame with
# the columns of REPORT_COLUMNS
OP_MODULES = ("gemm", "moe", "attention", "comm")
REPORT_COLUMNS = ("op_class", "chip", "runtime", "dtype", "shapes_fit", "shapes_held_out",
                  "error_fit", "error_held_out", "bias_held_out")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dse.kernels", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fit", action="store_true")
    p.add_argument("--write", action="store_true")
    p.add_argument("--loco", action="store_true")
    p.add_argument("--only", default="")
    a = p.parse_args(argv)
    names = [n for n in (a.only.split(",") if a.only else OP_MODULES) if n]
    frames = []
    try:
        for name in names:
            if name not in OP_MODULES:
                raise InputError(f"unknown op class {name!r}", where="--only",
                                 hint="one of " + ", ".join(OP_MODULES))
            try:
                mod = importlib.import_module(f"dse.kernels.{name}")
            except ModuleNotFoundError as e:
                if e.name == f"dse.kernels.{name}":
                    print(f"{name}: no fit yet", file=sys.stderr)
                    continue
                raise
            frames.append(mod.main(fit=a.fit or a.write, write=a.write, loco=a.loco))
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if frames:
        rep = pd.concat(frames, ignore_index=True)
        print(rep.to_markdown(index=False, floatfmt=".3f") if _has_tabulate() else rep.to_string())
    return 0


def _has_tabulate() -> bool:
    return importlib.util.find_spec("tabulate") is not None


if __name__ == "__main__":
    sys.exit(main())
