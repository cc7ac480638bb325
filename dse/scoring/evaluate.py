"""``dse eval``: one design, every metric and the per-op breakdown of each phase.

It runs the batch scorer on a one-row table: the same code path as every other command.
"""

from __future__ import annotations

import json
import math

import pandas as pd

from dse.build.designs import effective_dtypes, resolve, to_batch
from dse.errors import InputError
from dse.perf import score
from dse.perf.memory_fit import reason_text
from dse.scoring import breakdown
from dse.scoring.breakdown import STEPS
from dse.scoring.predict import FIELD_OF, predict_frame
from dse.spec.design import design_case, load_design

# a design's dotted keys under the case-table column names it is scored with
CASE_KEYS = FIELD_OF


def evaluate_flat(flat: dict, file: str = "design") -> dict:
    """Score one design given as {dotted path: value}; returns a JSON-ready result."""
    case = pd.DataFrame([design_case(flat)])
    try:
        chosen = predict_frame(case, file=file).iloc[0]
    except InputError as e:         # the design is one case of a table: name its key, not a row
        where = e.where or ""
        if where.startswith("row 2 (case_id design)"):
            col = where.partition(", column ")[2]
            where = CASE_KEYS.get(col, col) or None
        raise InputError(e.message, file=e.file, where=where, hint=e.hint) from None
    row = dict(flat)
    row.pop("layout.num_chips", None)
    for k in ("tp", "pp", "ep", "dp"):
        row[f"layout.{k}"] = int(chosen[k])
    # the 2D weight-stationary mesh and KV split the layout search chose (dse.perf.tp2d)
    if "tp_x" in chosen.index:
        row["layout.tp_x"] = int(chosen["tp_x"])
        row["layout.kv_sharding"] = str(chosen["kv_sharding"])
    row["workload.concurrency"] = int(chosen["concurrency"])
    table = resolve(pd.DataFrame([row]), file=file)
    metrics, steps = score(to_batch(table), breakdown=True)
    out_metrics = {}
    for k, v in metrics.items():
        x = v[0]
        if k == "bound":
            out_metrics[k] = str(chosen["bound"])
        elif k == "feasible":
            out_metrics[k] = bool(x)
        elif k == "reason":
            out_metrics[k] = reason_text(int(x), float(metrics["max_concurrent_sequences"][0]))
        else:
            x = float(x)
            out_metrics[k] = None if math.isnan(x) or math.isinf(x) else x
    per_op = breakdown.long(breakdown.wide(metrics, steps))
    table_ops = {}
    for name, _ in STEPS:
        rows = per_op[(per_op["step"] == name) & (per_op["op"] != "overhead")]
        table_ops[name] = {
            "ops": [{"op": r.op, **{q: float(getattr(r, q)) for q in breakdown.QUANTITIES},
                     "bound": r.bound} for r in rows.itertuples()],
            "overhead_s": float(getattr(steps, name).overhead_s[0]),
            "total_s": float(getattr(steps, name).total_s[0])}
    design = {}
    for k, v in table.iloc[0].items():
        v = v.item() if hasattr(v, "item") else v
        if isinstance(v, float) and not math.isfinite(v):
            v = None   # e.g. a dtype the chip lacks: JSON null, never NaN
        if not k.startswith("accelerator.default"):
            design[k] = v
    design.update(effective_dtypes(design))    # the KV, expert and attention dtypes, stated
    return {"design": design, "metrics": out_metrics, "breakdown": table_ops,
            "chosen": {"layout": {k: int(chosen[k]) for k in ("tp", "pp", "ep", "dp")},
                       "concurrency": int(chosen["concurrency"]),
                       "concurrency_given": "workload.concurrency" in flat}}


def evaluate_file(path: str) -> dict:
    return evaluate_flat(load_design(path), file=path)


def _fmt_s(x):
    return f"{x * 1e3:9.3f}"


UNITS = (  # display only: (name contains, scale, unit), first match wins
    ("tokens_per_s", 1.0, "tokens/s"), ("usd_per_mtok", 1.0, "$/Mtok"),
    ("usd_per_chip_hour", 1.0, "$/chip-h"), ("usd_per_hour", 1.0, "$/h"), ("joules", 1.0, "J"), ("fraction", 100.0, "%"),
    ("_bytes_per_chip", 1e-9, "GB"), ("_bytes_per_token", 1e-3, "kB"), ("_params", 1e-9, "B"),
)


def _display(name, v):
    if v is None:
        return "n/a"
    if isinstance(v, (bool, str)):
        return str(v) if v != "" else "-"
    for part, scale, unit in UNITS:
        if part in name:
            return f"{v * scale:,.4g} {unit}"
    if name.endswith("_s"):
        return f"{v * 1e3:,.4g} ms"
    return f"{v:,.6g}"


def render_text(res: dict, path: str) -> str:
    d, m = res["design"], res["metrics"]
    ch = res["chosen"]
    lay = ch["layout"]
    dts = f"{d['model.weight_dtype']} weights"
    if d.get("model.expert_dtype", d["model.weight_dtype"]) != d["model.weight_dtype"]:
        dts += f", {d['model.expert_dtype']} experts"
    if d.get("model.attention_dtype", d["model.weight_dtype"]) != d["model.weight_dtype"]:
        dts += f", {d['model.attention_dtype']} attention"
    dts += f", {d.get('model.kv_dtype')} KV cache"
    lines = [f"design {path}: {d['model.id']} ({dts}) on {int(m['num_chips'])} x "
             f"{d['accelerator.id']} ({d['topology.id']}), tp={lay['tp']} pp={lay['pp']} "
             f"ep={lay['ep']} dp={lay['dp']}"
             + (f" tp_x={int(d['layout.tp_x'])}" if (d.get("layout.tp_x") or 1) != 1 else "")
             + (" kv_sharding=batch" if d.get("layout.kv_sharding") == "batch" else "")
             + f", isl={int(d['workload.isl'])} "
             f"osl={int(d['workload.osl'])}, concurrency="
             f"{(m.get('concurrency') or 0) if (d.get('workload.request_rate_per_s') or 0) > 0 else ch['concurrency']:,.0f}"
             + (" (from the request rate, Little's law)"
                if (d.get("workload.request_rate_per_s") or 0) > 0
                else "" if ch["concurrency_given"] else " (chosen: offline maximum throughput)")]
    if not m["feasible"]:
        lines.append(f"INFEASIBLE: {m['reason']}")
    lines.append(f"decode bound: {m['bound']}")
    for name, title in STEPS:
        b = res["breakdown"][name]
        lines.append("")
        lines.append(f"{title}: {b['total_s'] * 1e3:.3f} ms per stage")
        lines.append(f"  {'op':<11}{'compute ms':>11}{'memory ms':>11}{'network ms':>11}"
                     f"{'time ms':>11}  {'bound':<8}{'GFLOP':>10}{'HBM MB':>10}{'net MB':>10}")
        for op in b["ops"]:
            lines.append(f"  {op['op']:<11}{_fmt_s(op['compute_s']):>11}{_fmt_s(op['memory_s']):>11}"
                         f"{_fmt_s(op['network_s']):>11}{_fmt_s(op['time_s']):>11}  "
                         f"{op['bound']:<8}{op['flops'] / 1e9:>10.4g}{op['hbm_bytes'] / 1e6:>10.4g}"
                         f"{op['net_bytes'] / 1e6:>10.4g}")
        lines.append(f"  {'overhead':<11}{'':>11}{'':>11}{'':>11}{_fmt_s(b['overhead_s']):>11}")
    lines.append("")
    lines.append("(per chip, one stage step of one micro-batch: FLOPs of the op's arithmetic, a "
                 "multiply-add = 2; HBM MB the bytes its memory terms stream; net MB the bytes "
                 "its collectives send)")
    lines.append("")
    lines.append("metrics:")
    for k, v in m.items():
        lines.append(f"  {k:<34} {_display(k, v)}")
    return "\n".join(lines)


def render_json(res: dict) -> str:
    return json.dumps(res, indent=2, sort_keys=False, default=str)
