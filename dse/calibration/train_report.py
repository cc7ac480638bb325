"""The training model's calibration report (issue 25, points 3 and 6): ``README.md`` and
``report.json`` (every figure of the page, so the docs can quote them) in one folder.

Written by ``python -m dse.calibration.train_fit [--fit] [--loso] --report [DIR]`` (default
``reports/training``). On the public training set (``../shared/calibration/training_*``): the
error factor in sample per source and metric, leave-one-source-out per source (with
``--loso``), and dse next to a hand roofline and llm-analysis on the same cases
(``dse.calibration.train_compare``), each with its one efficiency fitted on the cases it is
scored on. Error factor = geometric mean of ``max(pred/true, true/pred)``, sources weighted
equally (``train_fit.error_factor``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from dse.calibration import train_compare as tc

TARGETS = {"in_sample": 1.10, "left_out_each": 1.25, "memory_fraction": 0.10}
LICENSE = "Apache-2.0"


def _ef(frame: pd.DataFrame, col: str) -> float:
    """Error factor of the step times in ``col`` against ``true_step_s`` (sources equal)."""
    e = np.abs(np.log(frame[col] / frame["true_step_s"]))
    per = frame.assign(e=e).groupby(["source", "metric"])["e"].mean()
    return float(np.exp(per.mean()))


def _per_source(frame: pd.DataFrame, col: str) -> dict:
    e = np.abs(np.log(frame[col] / frame["true_step_s"]))
    return {k: round(float(v), 4) for k, v in np.exp(frame.assign(e=e).groupby("source")["e"]
                                                     .mean()).items()}


def side_by_side(j: pd.DataFrame, la: pd.DataFrame | None) -> tuple[pd.DataFrame, dict]:
    """Per truth the step time of dse, the hand roofline and llm-analysis (each one efficiency
    fitted), and the summary figures. ``j``: ``train_fit.joined``'s frame; ``la``:
    ``train_compare.llm_analysis_frame`` or None (not installed)."""
    f = j.copy()
    f["true_step_s"] = tc.true_step_s(f)
    f["dse_step_s"] = f["step_time_s"].astype(float)
    flops_chip = f["model_tflops_per_chip"] * 1e12 * f["step_time_s"]
    f["at_peak_s"] = flops_chip / (f["model_tflops_per_chip"] * 1e12 / f["mfu"])
    u = tc.roofline_u(f["at_peak_s"], f["true_step_s"])
    f["roofline_step_s"] = f["at_peak_s"] / u
    out = {"dse": {"error_factor": round(_ef(f, "dse_step_s"), 4),
                   "per_source": _per_source(f, "dse_step_s")},
           "roofline": {"mfu": round(u, 4), "error_factor": round(_ef(f, "roofline_step_s"), 4),
                        "per_source": _per_source(f, "roofline_step_s")}}
    if la is None:
        out["llm_analysis"] = {"installed": False,
                               "note": "pip install 'dse-llm[compare]' to add llm-analysis"}
        return f, out
    f = f.merge(la, on="case_id", how="left")
    cov = f["llm_analysis_covered"].fillna(False).astype(bool)
    c = f[cov].copy()
    eff = tc.roofline_u(c["llm_analysis_step_at_1_s"], c["true_step_s"])
    f["llm_analysis_step_s"] = np.where(cov, f["llm_analysis_step_at_1_s"] / eff, np.nan)
    c["llm_analysis_step_s"] = c["llm_analysis_step_at_1_s"] / eff
    u_c = tc.roofline_u(c["at_peak_s"], c["true_step_s"])
    c["roofline_covered_s"] = c["at_peak_s"] / u_c
    out["llm_analysis"] = {
        "installed": True, "version": tc.version(), "license": LICENSE,
        "flops_efficiency": round(eff, 4), "covered": int(cov.sum()), "cases": len(f),
        "coverage": round(float(cov.mean()), 4),
        "error_factor": round(_ef(c, "llm_analysis_step_s"), 4),
        "per_source": _per_source(c, "llm_analysis_step_s"),
        "dse_on_covered": round(_ef(c, "dse_step_s"), 4),
        "roofline_on_covered": round(_ef(c, "roofline_covered_s"), 4),
        "roofline_mfu_on_covered": round(u_c, 4),
        "not_covered": {r.case_id: r.llm_analysis_note for r in f[~cov].itertuples()}}
    return f, out


def build(j: pd.DataFrame, params: dict, fitted_on: str, loso: dict | None,
          la: pd.DataFrame | None, command: str) -> tuple[dict, pd.DataFrame]:
    """The report's figures (``report.json``) and its per-case table."""
    f, sbs = side_by_side(j, la)
    per_metric = {}
    for (src, metric), g in j.groupby(["source", "metric"]):
        per_metric.setdefault(src, {})[metric] = {
            "error_factor": round(float(np.exp(g["log_err"].mean())), 4), "cases": len(g)}
    mem = j[j["metric"] == "memory_per_chip_bytes"]
    report = {
        "command": command, "truths": len(j),
        "sources": {k: int(v) for k, v in j.groupby("source").size().items()},
        "parameters": {k: float(v) for k, v in params.items()}, "fitted_on": fitted_on,
        "targets": TARGETS,
        "in_sample": {"error_factor": round(float(np.exp(
                          j.groupby(["source", "metric"])["log_err"].mean().mean())), 4),
                      "per_source": {k: round(float(v), 4) for k, v in
                                     np.exp(j.groupby("source")["log_err"].mean()).items()},
                      "per_source_metric": per_metric},
        "leave_one_source_out": (None if loso is None else
                                 {k: round(float(v), 4) for k, v in loso.items()}),
        "left_out_worst": (None if not loso else
                           {"source": max(loso, key=loso.get),
                            "error_factor": round(float(max(loso.values())), 4)}),
        "memory": {"truths": len(mem),
                   "within_10pct": int((np.abs(mem["pred"] / mem["value"] - 1) <= 0.10).sum()),
                   "note": ("no source of the public set states memory per chip"
                            if mem.empty else "")},
        "side_by_side": sbs}
    cols = ["case_id", "source", "metric", "value", "pred", "true_step_s", "dse_step_s",
            "roofline_step_s"]
    if "llm_analysis_step_s" in f:
        cols += ["llm_analysis_step_s", "llm_analysis_note"]
    return report, f[cols]


def _num(x, fmt=".3f"):
    return "–" if x is None or (isinstance(x, float) and not np.isfinite(x)) else format(x, fmt)


def markdown(r: dict, table: pd.DataFrame) -> str:
    """The report page."""
    ins, sbs, lo = r["in_sample"], r["side_by_side"], r["leave_one_source_out"]
    t = r["targets"]
    lines = ["# Training model: calibration report", "",
             (f"Written by `{r['command']}` (dse.calibration.train_report): the training model "
             f"(`dse predict --train`) on the {r['truths']} published measurements of "
             "`../shared/calibration/training_*`. Error factor = geometric mean of "
             "max(pred/true, true/pred), sources weighted equally. Targets (issue 25): "
             f"<= {t['in_sample']:.2f} in sample, every left-out source <= "
             f"{t['left_out_each']:.2f}, memory within {t['memory_fraction']:.0%} where a "
             "source states it."), "",
             f"**In sample: {ins['error_factor']:.3f}**"
             + ("" if lo is None else f"; leave one source out: worst "
                f"**{max(lo.values()):.3f}** ({max(lo, key=lo.get)})")
             + f"; hand roofline {sbs['roofline']['error_factor']:.3f}"
             + (f"; llm-analysis {sbs['llm_analysis']['error_factor']:.3f} "
                f"({sbs['llm_analysis']['coverage']:.0%} of the cases)"
                if sbs["llm_analysis"].get("installed") else "") + ".", "",
             "## Parameters", "",
             ("The training-specific parameters (`[training]` of dse/catalog/training.toml), "
             f"fitted on: {r['fitted_on']}"), "", "| parameter | value |", "|---|---|"]
    lines += [f"| `{k}` | {v:.6g} |" for k, v in r["parameters"].items()]
    lines += ["", "## Per source", "",
              "| source | truths | metric | in sample | left out |", "|---|---|---|---|---|"]
    for src, metrics in ins["per_source_metric"].items():
        for metric, v in metrics.items():
            lines.append(f"| {src} | {v['cases']} | {metric} | {v['error_factor']:.3f} | "
                         f"{_num(None if lo is None else lo.get(src))} |")
    lines.append(f"| **all** | {r['truths']} | | **{ins['error_factor']:.3f}** | |")
    mem = r["memory"]
    lines += ["", f"Memory: {mem['truths']} truths"
              + (f", {mem['within_10pct']} within 10 %." if mem["truths"] else
                 f" ({mem['note']}).")]
    la = sbs["llm_analysis"]
    lines += ["", "## Side by side: dse, a hand roofline, llm-analysis", "",
              (f"Hand roofline: every step at one MFU ({sbs['roofline']['mfu']:.3f}, fitted), "
              "`F / (chips x peak x MFU)`. ")]
    if la.get("installed"):
        lines[-1] += (
            f"llm-analysis {la['version']} ({la['license']}): its training latency with the "
            f"case's layout (blanks: dse's choice) on dse's chip numbers, its "
            f"`flops_efficiency` fitted on the same cases ({la['flops_efficiency']:.3f}). It "
            f"expresses {la['covered']} of {la['cases']} cases ({la['coverage']:.0%}); on those,"
            " every column is scored on the same truths (the roofline's MFU refitted on them, "
            f"{la['roofline_mfu_on_covered']:.3f}).")
        lines += ["", "| estimator | all cases | the cases llm-analysis expresses |",
                  "|---|---|---|",
                  f"| dse | {sbs['dse']['error_factor']:.3f} | {la['dse_on_covered']:.3f} |",
                  (f"| hand roofline | {sbs['roofline']['error_factor']:.3f} | "
                  f"{la['roofline_on_covered']:.3f} |"),
                  f"| llm-analysis | – | {la['error_factor']:.3f} ({la['coverage']:.0%}) |",
                  "", "| source | dse | hand roofline | llm-analysis |", "|---|---|---|---|"]
        for src in sbs["dse"]["per_source"]:
            lines.append(f"| {src} | {sbs['dse']['per_source'][src]:.3f} | "
                         f"{sbs['roofline']['per_source'][src]:.3f} | "
                         f"{_num(la['per_source'].get(src))} |")
    else:
        lines[-1] += la["note"] + "."
    lines += ["", "## Every case", "",
              ("Step times (s): the truth (a throughput converted through the predicted "
              "tokens per step), dse, the roofline, llm-analysis."), "",
              "| case | truth | dse | roofline | llm-analysis | dse / truth |",
              "|---|---|---|---|---|---|"]
    for row in table.itertuples():
        la_cell = _num(getattr(row, "llm_analysis_step_s", None), ".3g")
        note = getattr(row, "llm_analysis_note", "")
        if la_cell == "–" and isinstance(note, str) and note:
            la_cell = f"– ({note})"
        lines.append(f"| {row.case_id} | {row.true_step_s:.3g} | {row.dse_step_s:.3g} | "
                     f"{row.roofline_step_s:.3g} | {la_cell} | "
                     f"{row.dse_step_s / row.true_step_s:.2f} |")
    return "\n".join(lines) + "\n"


def write(folder: Path, report: dict, table: pd.DataFrame) -> Path:
    """Write ``README.md`` and ``report.json`` into ``folder`` (created)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (folder / "README.md").write_text(markdown(report, table))
    return folder
