"""The model's error on ../shared/calibration, and the end-to-end refit on top of the kernel fits.

The error of a metric is the geometric mean over cases of ``max(pred/true, true/pred)``, each
case weighted so that every (source, hardware) pair counts equally within a source.

    python -m dse.calibration.calibrate              # error report of the current catalog
    python -m dse.calibration.calibrate --fit        # refit the per-layer and per-step times (dse.calibration.fit), report
    python -m dse.calibration.calibrate --fit --write  # ... and write dse/catalog/efficiency.toml
    python -m dse.calibration.calibrate --cv         # ... and the leave-one-chip / one-family-out errors
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

from dse.calibration.cases import joined, load, weights
from dse.calibration.fit import bootstrap, cross_validate, fit, tables, write_efficiency
from dse.errors import InputError
from dse.scoring.predict import predict_frame


def report(j: pd.DataFrame, by=("source", "metric")) -> pd.DataFrame:
    j = j.assign(w=weights(j), logf=np.log(j["factor"]))
    g = j.groupby(list(by))
    out = pd.DataFrame({
        "cases": g.size(),
        "error_factor": np.exp(g.apply(lambda x: np.average(x["logf"], weights=x["w"]),
                                       include_groups=False)),
        "worst": g["factor"].max(),
        "bias": np.exp(g.apply(lambda x: np.average(np.log(x["pred"] / x["value"]), weights=x["w"]),
                               include_groups=False)),
    })
    return out.reset_index()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dse.calibration.calibrate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", help="calibration folder (default ../shared/calibration)")
    p.add_argument("--fit", action="store_true", help="fit the efficiency factors first")
    p.add_argument("--write", action="store_true", help="write dse/catalog/efficiency.toml")
    p.add_argument("--by-hardware", action="store_true", help="also break the error down by hardware")
    p.add_argument("--cv", action="store_true",
                   help="also cross-validate the end-to-end fit: refit without each chip, and "
                        "without each model family, and predict the cases left out")
    a = p.parse_args(argv)
    try:
        cases, truth = load(a.dir)
        if a.fit:
            theta = fit(cases, truth)
            if a.write:
                unc = bootstrap(cases, truth, theta)
                print("  ".join(f"{k}: log sd {s:.3f}" for k, s in zip(unc["params"],
                                                                        unc["log_sd"])))
                write_efficiency(tables(theta, cases, unc))
                print("wrote dse/catalog/efficiency.toml")
        pred = predict_frame(cases, file="cases.csv")
        j = joined(pred, cases, truth)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    pd.set_option("display.width", 200)
    print("Error factor = geometric mean of max(pred/true, true/pred); bias = geometric mean of "
          "pred/true")
    print(report(j).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if a.by_hardware:
        print()
        print(report(j, ("source", "metric", "hardware")).to_string(
            index=False, float_format=lambda v: f"{v:.3f}"))
    if a.cv:
        for by, what in (("hardware", "leave one chip out"), ("family", "leave one model family out")):
            print()
            print(f"Cross-validated ({what}: the end-to-end numbers refitted without it)")
            print(report(cross_validate(cases, truth, by), ("source", "metric", "held_out"))
                  .to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
