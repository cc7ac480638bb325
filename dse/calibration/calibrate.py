"""The model's error on ../shared/calibration, and the end-to-end refit on top of the kernel fits.

The error of a metric is the geometric mean over cases of ``max(pred/true, true/pred)``, each
case weighted so that every (source, hardware) pair counts equally within a source.

    python -m dse.calibration.calibrate              # error report of the current catalog
    python -m dse.calibration.calibrate --fit        # refit the per-layer and per-step times (dse.calibration.fit), report
    python -m dse.calibration.calibrate --fit --write  # ... and write dse/catalog/efficiency.toml
    python -m dse.calibration.calibrate --fit --write --boot 48  # ... with 48 bootstrap refits
    python -m dse.calibration.calibrate --cv         # ... and the leave-one-chip / one-family-out errors
    python -m dse.calibration.calibrate --cv model runtime decade   # ... leave one model / runtime /
                                                     # concurrency decade out
    python -m dse.calibration.calibrate --cv decade --held-out 100-999 --cv-params
                                                     # ... that decade only, with the numbers
                                                     # refitted without it
    python -m dse.calibration.calibrate --fit --cv decade --held-out 100-999 --hold frontend_token_s=2.19e-5
                                                     # ... with a number set, not fitted (what
                                                     # the others do if it came from a source)
    python -m dse.calibration.calibrate --by-kind    # ... error by runtime x model kind x metric
    python -m dse.calibration.calibrate --cv runtime --held-out sglang --cv-out cv.csv
                                                     # ... and every held-out prediction to CSV

The sets read, the open-loop rows and the groups reported apart (online rows at an infinite rate,
queue-suspect and cold-start TTFTs): dse.calibration.cases.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from dse import catalog
from dse.calibration.cases import (
    COLD_START,
    NO_CONCURRENCY,
    QUEUE_SUSPECT,
    joined,
    load,
    weights,
)
from dse.calibration.fit import (
    BOOT_N,
    CV_BY,
    bootstrap,
    cross_validate,
    fit,
    holdout_key,
    in_sample,
    tables,
    write_efficiency,
)
from dse.errors import InputError
from dse.scoring.predict import predict_frame, prepare


def report(j: pd.DataFrame, by=("source", "metric")) -> pd.DataFrame:
    """Error factor, worst and bias per group of ``by``. Each case weighs what it weighs in the
    fit (``cases.weights``: every (source, metric, hardware) equal within its source and
    metric): the column ``w`` where ``j`` carries it (``fit.cross_validate`` computes it over
    all the cases, so a held-out group's figure is the same reported alone, ``--held-out``, as
    beside the other groups), else over ``j``'s own rows."""
    w = j["w"].to_numpy(float) if "w" in j else weights(j)
    j = j.assign(w=w, logf=np.log(j["factor"]))
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


CV_DEFAULT = ("hardware", "family")
CV_WHAT = {"hardware": "leave one chip out", "family": "leave one model family out",
           "model": "leave one model out", "runtime": "leave one runtime out",
           "decade": "leave one concurrency decade out"}


def model_kind(model_id: str) -> str:
    """"mla" for a model with MLA attention (a KV low-rank projection), else "moe" for one with
    routed experts, else "dense" (the catalog model's fields)."""
    m = catalog.models().get(str(model_id))
    if m is None:
        return "unknown"
    if m.kv_lora_rank > 0:
        return "mla"
    return "moe" if m.num_experts > 0 else "dense"


def by_kind(j: pd.DataFrame, cases: pd.DataFrame) -> pd.DataFrame:
    """The error by runtime x model kind x metric, over the rows that are fitted (the groups
    reported apart, online rows at an infinite rate, queue-suspect and cold-start TTFTs, left
    out)."""
    rt = pd.Series(holdout_key(cases, "runtime").to_numpy(), index=cases["case_id"])
    apart = j["source"].str.endswith((NO_CONCURRENCY, QUEUE_SUSPECT, COLD_START))
    j = j[~apart].assign(runtime=lambda x: x["case_id"].map(rt),
                         kind=lambda x: x["model"].map(model_kind))
    return report(j, ("runtime", "kind", "metric"))


def _table(r: pd.DataFrame) -> str:
    return r.to_string(index=False, float_format=lambda v: f"{v:.3f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dse.calibration.calibrate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", help="calibration folder (default ../shared/calibration)")
    p.add_argument("--fit", action="store_true", help="fit the efficiency factors first")
    p.add_argument("--write", action="store_true", help="write dse/catalog/efficiency.toml")
    p.add_argument("--by-hardware", action="store_true", help="also break the error down by hardware")
    p.add_argument("--by-kind", action="store_true",
                   help="also break the error down by runtime x model kind (mla, moe, dense) x "
                        "metric")
    p.add_argument("--cv", nargs="*", choices=CV_BY, metavar="BY",
                   help="also cross-validate the end-to-end fit: refit without each group of "
                        "BY (" + ", ".join(CV_BY) + "; bare: " + " ".join(CV_DEFAULT)
                        + ") and predict the cases left out")
    p.add_argument("--held-out", nargs="+", metavar="GROUP",
                   help="with --cv: leave out only these groups (a chip, model, runtime, "
                        "decade ...; each BY takes the names that are its groups)")
    p.add_argument("--cv-params", action="store_true",
                   help="with --cv: also print the end-to-end numbers each group was predicted "
                        "with (refitted without it), beside the --fit numbers if given")
    p.add_argument("--cv-out", metavar="CSV",
                   help="with --cv: also write every held-out prediction to CSV (one row per "
                        "case and metric: by, held_out, case_id, metric, value, pred, w, the "
                        "case's model, hardware and runtime), to see where a fold's error sits")
    p.add_argument("--hold", nargs="+", metavar="NAME=VALUE", default=[],
                   help="with --fit or --cv: set these end-to-end numbers (dse.calibration.fit."
                        "PARAMS, in seconds) instead of fitting them; never with --write")
    p.add_argument("--boot", type=int, metavar="N",
                   help=f"bootstrap refits for the uncertainty --fit --write writes "
                        f"(default {BOOT_N})")
    a = p.parse_args(argv)
    if a.boot is not None and not (a.fit and a.write):
        print("error: --boot sizes the uncertainty that --fit --write writes: give both",
              file=sys.stderr)
        return 2
    if a.boot is not None and a.boot < 2:
        print(f"error: --boot {a.boot}: a covariance needs at least 2 refits", file=sys.stderr)
        return 2
    try:
        hold = _hold(a.hold)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if hold and (a.write or not (a.fit or a.cv is not None)):
        print("error: --hold sets numbers for a refit (--fit, --cv) that is not written: "
              "no --write", file=sys.stderr)
        return 2
    if (a.held_out or a.cv_params or a.cv_out) and a.cv is None:
        print("error: --held-out, --cv-params and --cv-out select and show cross-validation "
              "folds: give --cv too", file=sys.stderr)
        return 2
    if a.cv_out and (Path(a.cv_out).is_dir() or not Path(a.cv_out).parent.is_dir()):
        print(f"error: --cv-out {a.cv_out}: give a CSV file's path in an existing folder",
              file=sys.stderr)
        return 2
    try:
        cases, truth = load(a.dir)
        folds = _folds(cases, a.cv, a.held_out)
        j = None
        theta = None
        if a.fit:
            prep = prepare(cases, file="cases.csv")
            theta = fit(cases, truth, prep=prep, hold=hold)
            if not a.write:
                # the report below is the refit's (in sample), not the catalog's
                j = in_sample(prep, cases, truth, theta)
            else:
                unc = bootstrap(cases, truth, theta, n=a.boot or BOOT_N)
                print("  ".join(f"{k}: log sd {s:.3f}" for k, s in zip(unc["params"],
                                                                        unc["log_sd"])))
                write_efficiency(tables(theta, cases, unc))
                print("wrote dse/catalog/efficiency.toml")
                # the cases carry the fitted front ends' numbers (cases.apply_front_ends):
                # read them again so that the report below predicts with what was written
                cases, truth = load(a.dir)
        if j is None:
            j = joined(predict_frame(cases, file="cases.csv"), cases, truth)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    pd.set_option("display.width", 200)
    print("Error factor = geometric mean of max(pred/true, true/pred); bias = geometric mean of "
          "pred/true")
    print(_table(report(j)))
    if a.by_hardware:
        print()
        print(_table(report(j, ("source", "metric", "hardware"))))
    if a.by_kind:
        print()
        print("By runtime x model kind (the fitted rows: online rows at an infinite rate and "
              "queue-suspect and cold-start TTFTs left out)")
        print(_table(by_kind(j, cases)))
    rows = []
    for by, only in folds:
        print()
        print(f"Cross-validated ({CV_WHAT[by]}: the end-to-end numbers refitted without it)")
        params = {} if a.cv_params else None
        try:
            cv = cross_validate(cases, truth, by, only=only, params=params, hold=hold)
        except InputError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(_table(report(cv, ("source", "metric", "held_out"))))
        rows.append(cv.assign(by=by))
        if params:
            print()
            print(f"The end-to-end numbers each {by} was predicted with"
                  + (" (all: the --fit numbers)" if theta else ""))
            print(_params_table(params, theta))
    if a.cv_out and rows:
        _write_cv(pd.concat(rows, ignore_index=True), cases, a.cv_out)
    return 0


def _write_cv(cv: pd.DataFrame, cases: pd.DataFrame, path: str) -> None:
    """The held-out predictions of ``--cv`` as CSV: which grouping and group, the truth, the
    prediction, the weight the case has in the fit (``weights``) and the case's model,
    hardware and runtime."""
    out = cv if "runtime" in cv or "runtime" not in cases else \
        cv.merge(cases[["case_id", "runtime"]], on="case_id", how="left")
    cols = ["by", "held_out", "case_id", "source", "metric", "value", "pred", "w", "model",
            "hardware", "runtime"]
    out[[c for c in cols if c in out]].to_csv(path, index=False)
    print(f"wrote {path} ({len(out)} held-out predictions)")


def _hold(items) -> dict:
    """``--hold NAME=VALUE ...`` as {name: value in seconds}."""
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        try:
            v = float(value)
        except ValueError:
            v = float("nan")
        if not eq or not name or not np.isfinite(v) or v < 0:
            raise InputError(f"--hold {item}: give NAME=VALUE, a number of seconds >= 0",
                             hint="e.g. --hold frontend_token_s=2.19e-5")
        out[name] = v
    return out


def _folds(cases: pd.DataFrame, cv, held_out) -> list:
    """(BY, the groups of BY to leave out or None for all) for each --cv grouping; with
    ``held_out`` names, the groupings that have some of them (each name must be a group of one)."""
    if cv is None:
        return []
    bys = cv or list(CV_DEFAULT)
    if not held_out:
        return [(by, None) for by in bys]
    groups = {by: set(holdout_key(cases, by)) for by in bys}
    # a name as a user writes it (DeepSeek-V3, SGLang) is the group's name in any case
    named = {g.lower(): g for gs in groups.values() for g in gs}
    unknown = [g for g in held_out if g.lower() not in named]
    if unknown:
        raise InputError(f"--held-out {' '.join(unknown)}: no such group of --cv "
                         + " ".join(bys),
                         hint="; ".join(f"{by}: " + ", ".join(sorted(gs))
                                        for by, gs in groups.items()))
    wanted = [named[g.lower()] for g in held_out]
    return [(by, [g for g in wanted if g in groups[by]]) for by in bys
            if groups[by] & set(wanted)]


def _params_table(params: dict, theta: dict | None) -> str:
    """One row per end-to-end number, one column per group left out (and ``all``: the fit on
    every case, when given), in the units of the number (seconds)."""
    cols = ({"all": theta} if theta else {}) | params
    t = pd.DataFrame({g: pd.Series(th) for g, th in cols.items()})
    return t.to_string(float_format=lambda v: f"{v:.3g}")


if __name__ == "__main__":
    sys.exit(main())
