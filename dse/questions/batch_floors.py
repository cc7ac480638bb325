"""The floors of latency and cost as the batch grows, and where the optimal batch lands.

Blackboard math (``shared/reference/podcast.md`` 1.1-1.2): a decode step takes at least the time
to stream the weights (the latency floor: weights bytes per chip / HBM bandwidth); per token the
weight fetch is amortized by the batch, so the cost falls toward a floor set by compute (or by
the KV fetch at long context). The balance batch is where compute time equals weight-fetch time:

    B* = (FLOP/s / HBM byte/s) x (bytes per weight / 2 FLOP per weight) x (total / active params)

which is ~300 x sparsity on most GPUs: hundreds of sequences for a dense model, thousands for a
sparse frontier MoE.

Method: every admissible design of the space (models x layouts x batch) is scored in float64
(``ctx.score``). Per model, the cost floor is its cheapest design ($/Mtok output); the curves are
that design's layout (tp, dp, ep) over every batch. The *optimal batch* is the smallest batch on
that curve whose $/Mtok is within ``within_fraction`` of the floor. The formula's B* comes from the
same designs' resolved catalog values (peak FLOP/s of the weight dtype, HBM bandwidth, bytes per
weight, total and active parameters). The floor design's decode step is broken into compute,
weight fetch, KV fetch and network per op (``dse.perf.score(breakdown=True)``).
"""

from __future__ import annotations

import pandas as pd

from dse.perf import OPS, score
from dse.questions.common import (
    admissible_designs,
    describe,
    dress,
    layout_curve,
    layout_pairs,
    limits_text,
    md_table,
    param_values,
    save,
    subplots,
)
from dse.questions.context import Answer, Context, Lead

COST = "usd_per_mtok_output"
BATCH = "workload.concurrency"
LAYOUT = ("layout.tp", "layout.dp", "layout.ep")


def spec(ctx: Context, rows: pd.DataFrame) -> pd.DataFrame:
    """Resolved catalog values and the per-op decode breakdown of ``rows`` (designs of the space)."""
    b = ctx.batch(param_values(ctx, rows)).expanded()
    m, steps = score(b, breakdown=True)
    dec = steps.decode
    kv_s = dec.memory_s[OPS.index("attn_core")]
    moe = OPS.index("moe_routed")
    out = pd.DataFrame({
        "peak_flops_per_s": b.matmul_flops_per_s, "hbm_bw_bytes_per_s": b.hbm_bw_bytes_per_s,
        "matmul_fraction": b.moe_fraction, "hbm_fraction": b.moe_hbm_fraction,
        "weight_bytes": b.weight_bytes, "total_params": m["total_params"],
        "active_params": m["active_params"], "weights_bytes_per_chip": m["weights_bytes_per_chip"],
        "compute_s": dec.compute_s.sum(0), "kv_s": kv_s, "weights_s": dec.memory_s.sum(0) - kv_s,
        "network_s": dec.network_s.sum(0), "overhead_s": dec.overhead_s, "step_s": dec.total_s,
        "moe_compute_s": dec.compute_s[moe], "moe_memory_s": dec.memory_s[moe]})
    out["sparsity"] = out["total_params"] / out["active_params"]
    out["hw_ratio"] = out["peak_flops_per_s"] / out["hbm_bw_bytes_per_s"] * out["weight_bytes"] / 2
    out["formula_batch"] = out["hw_ratio"] * out["sparsity"]
    out["formula_batch_eff"] = out["formula_batch"] * out["matmul_fraction"] / out["hbm_fraction"]
    out["latency_floor_s"] = out["weights_bytes_per_chip"] / out["hbm_bw_bytes_per_s"]
    return out


def summarize(ctx: Context, df: pd.DataFrame, within: float) -> dict:
    """Floors, optimal batch and formula of one model's admissible designs."""
    floor = df.loc[df[COST].idxmin()]
    c = layout_curve(df, floor, LAYOUT)
    opt = c[c[COST] <= (1.0 + within) * floor[COST]].iloc[0]
    fastest = c.loc[c["tpot_s"].idxmin()]
    fastest_any = df.loc[df["tpot_s"].idxmin()]
    compute_bound = c[c["bound"] == 0]
    sp = spec(ctx, pd.DataFrame([floor, fastest, fastest_any]))
    f, lat, lat_any = sp.iloc[0], sp.iloc[1], sp.iloc[2]
    per_tok = {k: f[k] / floor[BATCH] for k in ("compute_s", "weights_s", "kv_s", "network_s")}
    return {
        "model": floor["model.id"], "floor": floor, "curve": c, "opt": opt, "fastest": fastest,
        "fastest_any": fastest_any,
        "balance": None if compute_bound.empty else compute_bound.iloc[0],
        "spec": f, "lat": lat, "lat_any": lat_any, "per_token_s": per_tok,
        "floor_limit": max(("compute", "KV fetch", "weight fetch", "network"), key=lambda k: {
            "compute": per_tok["compute_s"], "KV fetch": per_tok["kv_s"],
            "weight fetch": per_tok["weights_s"], "network": per_tok["network_s"]}[k]),
    }


def _figure(ctx: Context, res: list[dict]) -> str:
    fig, (a1, a2) = subplots(1, 2, figsize=(12, 4.8))
    for i, r in enumerate(res):
        col = f"C{i}"
        c = r["curve"]
        lay = layout_pairs(r["floor"], LAYOUT)
        a1.plot(c[BATCH], c["tpot_s"] * 1e3, "-", c=col, label=f"{r['model']} ({lay})")
        a1.axhline(r["lat"]["latency_floor_s"] * 1e3, c=col, ls=":", lw=1)
        a2.plot(c[BATCH], c[COST], "-", c=col, label=f"{r['model']} ({lay})")
        a2.axhline(r["floor"][COST], c=col, ls=":", lw=1)
        a2.scatter([r["opt"][BATCH]], [r["opt"][COST]], c=col, s=50, zorder=5, edgecolors="k")
        a2.axvline(r["spec"]["formula_batch"], c=col, ls="--", lw=1)
    x = "batch (concurrent sequences per instance)"
    dress(a1, x, "TPOT (ms)", "TPOT vs batch (dotted: weights per chip / HBM bandwidth)",
          xlog=10, ylog=10, legend=7, title_size=9)
    dress(a2, x, "$ per million output tokens",
          f"$/Mtok output vs batch (dotted: floor; dot: within "
          f"{100 * ctx.param('within_fraction', 0.1):g}%; dashed: formula B*)",
          xlog=10, ylog=10, legend=7, title_size=9)
    return save(fig, ctx, "batch-floors.png")


def _number(r: dict) -> dict:
    f, s = r["floor"], r["spec"]
    return {"cost_floor_usd_per_mtok_output": float(f[COST]),
            "floor_design_id": int(f["design_id"]), "floor_batch": int(f[BATCH]),
            "layout": {k.split(".")[1]: int(f[k]) for k in LAYOUT},
            "optimal_batch": int(r["opt"][BATCH]), "optimal_design_id": int(r["opt"]["design_id"]),
            "optimal_usd_per_mtok_output": float(r["opt"][COST]),
            "first_compute_bound_batch": None if r["balance"] is None else int(r["balance"][BATCH]),
            "formula_batch": float(s["formula_batch"]),
            "formula_batch_with_efficiencies": float(s["formula_batch_eff"]),
            "optimal_over_formula": float(r["opt"][BATCH] / s["formula_batch"]),
            "sparsity_total_over_active": float(s["sparsity"]),
            "hardware_ratio": float(s["hw_ratio"]),
            "latency_floor_s": float(r["lat"]["latency_floor_s"]),
            "min_tpot_s": float(r["fastest"]["tpot_s"]),
            "min_tpot_any_layout_s": float(r["fastest_any"]["tpot_s"]),
            "cost_floor_limited_by": r["floor_limit"],
            "floor_per_token_s": {k: float(v) for k, v in r["per_token_s"].items()}}


def _moe_caveat(res: list[dict]) -> str:
    """What the routed experts' compute does to the MoE's small-batch TPOT (a model caveat)."""
    lines = []
    for r in res:
        lat = r["lat"]
        if lat["moe_compute_s"] > lat["moe_memory_s"] > 0:
            lines.append(f"{r['model']} at batch {int(r['fastest'][BATCH])}: routed-expert compute "
                         f"{lat['moe_compute_s'] * 1e3:.2f} ms vs their weight fetch "
                         f"{lat['moe_memory_s'] * 1e3:.2f} ms")
    if not lines:
        return ""
    return ("- Caveat on the MoE's small-batch TPOT and its first compute-bound batch: the scorer "
            "pads the routed-expert matmuls of every expert to `matmul_half_rows` rows, also the "
            "experts a small step does not touch (whose weights it does not read), so at small "
            "batch the MoE decode step shows as compute-bound: " + "; ".join(lines)
            + ". The cost floors and optimal batches (all experts touched) are not affected.\n")


def answer(ctx: Context) -> Answer:
    within = float(ctx.param("within_fraction", 0.10))
    df = admissible_designs(ctx)
    res = [summarize(ctx, df[df["model.id"] == m], within) for m in dict.fromkeys(df["model.id"])]
    res.sort(key=lambda r: r["spec"]["sparsity"])            # dense first, the sparsest last
    figs = [_figure(ctx, res)]
    dense, sparse = res[0], res[-1]
    numbers = {"within_fraction": within, "models": {r["model"]: _number(r) for r in res},
               "dense_model": dense["model"], "sparse_model": sparse["model"],
               "sparse_over_dense_optimal_batch": float(sparse["opt"][BATCH] / dense["opt"][BATCH])}
    lead = tuple(Lead(f"models.{r['model']}.optimal_batch", f"{r['model']}: cost within "
                      f"{within:.0%} of its floor from batch", "sequences",
                      pick=f"models.{r['model']}.optimal_design_id", pick_label="design")
                 for r in res)
    return Answer(_headline(res, within), _details(ctx, df, res, within), numbers, figs, lead)


def _headline(res: list[dict], within: float) -> str:
    head = []
    for r in res:
        s, f, o = r["spec"], r["floor"], r["opt"]
        head.append(
            f"- **{r['model']}** (total/active {s['sparsity']:.1f}): cost within "
            f"{within:.0%} of its floor (${f[COST]:.3f}/Mtok output) from **batch {int(o[BATCH]):,}**;"
            f" the formula gives B* = {s['formula_batch']:,.0f} ({s['hw_ratio']:.0f} x "
            f"{s['sparsity']:.1f}); ratio {o[BATCH] / s['formula_batch']:.2f}. Latency floor "
            f"{r['lat']['latency_floor_s'] * 1e3:.1f} ms (all weights per chip / HBM bandwidth"
            f"{'; a small MoE batch reads only the experts it touches' if s['sparsity'] > 1.5 else ''}"
            f") vs smallest TPOT {r['fastest']['tpot_s'] * 1e3:.1f} ms on the same "
            f"{int(f['num_chips'])} chips; the cost floor is {r['floor_limit']}-limited.")
    dense, sparse = res[0], res[-1]
    head.append(f"- The sparse model's optimal batch is {sparse['opt'][BATCH] / dense['opt'][BATCH]:.1f}x"
                f" the dense one's ({sparse['model']} vs {dense['model']}); the formula predicts "
                f"{sparse['spec']['formula_batch'] / dense['spec']['formula_batch']:.1f}x.")
    return "\n".join(head)


def _table(res: list[dict], within: float) -> str:
    rows = []
    for r in res:
        s, f = r["spec"], r["floor"]
        pt = r["per_token_s"]
        rows.append([r["model"], f"{s['sparsity']:.1f}", layout_pairs(f, LAYOUT),
                     f[COST], int(f[BATCH]), int(r["opt"][BATCH]),
                     "-" if r["balance"] is None else int(r["balance"][BATCH]),
                     s["formula_batch"], s["formula_batch_eff"],
                     r["lat"]["latency_floor_s"] * 1e3, r["fastest"]["tpot_s"] * 1e3,
                     r["fastest_any"]["tpot_s"] * 1e3,
                     " / ".join(f"{pt[k] * 1e6:.2f}" for k in ("compute_s", "weights_s", "kv_s",
                                                               "network_s"))])
    return md_table(["model", "total/active", "floor layout", "cost floor $/Mtok", "floor batch",
                     f"optimal batch (<= +{within:.0%})", "first compute-bound batch",
                     "formula B*", "B* with efficiencies", "latency floor ms",
                     "min TPOT ms (layout)", "min TPOT ms (any layout)",
                     "floor us/token: compute / weights / KV / network"], rows)


def _method(r: dict) -> str:
    """One model's designs and the formula's inputs."""
    s = r["spec"]
    return (f"- {r['model']}: floor {describe(r['floor'], ('tpot_s', 'bound'))}; optimal batch "
            f"{describe(r['opt'], (COST,))}; smallest TPOT on that layout "
            f"{describe(r['fastest'], ('tpot_s',))}, on any layout "
            f"{describe(r['fastest_any'], ('tpot_s',))}. Formula inputs: peak "
            f"{s['peak_flops_per_s']:.3g} FLOP/s (weight dtype), HBM {s['hbm_bw_bytes_per_s']:.3g} B/s, "
            f"{s['weight_bytes']:g} byte/weight, {s['total_params']:.4g} total / "
            f"{s['active_params']:.4g} active params; latency floor = "
            f"{r['lat']['weights_bytes_per_chip']:.4g} B per chip / HBM bandwidth.")


def _details(ctx: Context, df: pd.DataFrame, res: list[dict], within: float) -> str:
    return f"""## Method

- {len(df):,} admissible designs of {ctx.space.size:,} (feasible, one instance within one \
rack: {limits_text(ctx)}), \
scored in float64.
- Cost floor: the model's cheapest design ($/Mtok output, decode share of the cost). Curves: \
that design's layout over every batch. Optimal batch: the smallest batch on the curve with \
$/Mtok <= (1 + {within:g}) x the floor (`within_fraction` in [answer]); a pure roofline with \
max(compute, memory) reaches its floor exactly at B*, so this definition lands near B*.
- Formula: B* = (peak FLOP/s / HBM B/s) x (bytes per weight / 2) x total/active, from the \
catalog values the scorer resolved for the floor design; "with efficiencies" multiplies by the \
catalog's matmul_fraction / hbm_fraction.
- Latency floor: weights bytes per chip (the scorer's `weights_bytes_per_chip`) / spec HBM \
bandwidth, for the floor layout. The model's TPOT also pays achievable-bandwidth efficiency, \
per-layer and per-step overheads, collectives and, for an MoE at small batch, reads only the \
experts the step touches (so it can go below the all-weights floor).
- First compute-bound batch: the smallest batch on the curve whose decode step has compute \
time above memory and network time (the scorer's `bound`).
{chr(10).join(_method(r) for r in res)}
{_moe_caveat(res)}
## Table

{_table(res, within)}
"""
