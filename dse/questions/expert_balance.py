"""What do EPLB-style redundant experts buy at large expert parallelism?

The space sweeps the routing imbalance (``serving.expert_imbalance``, max/mean routed tokens
per EP rank: no sourced default exists in the catalog, so the question states the values it
assumes) and the redundant expert slots (``serving.redundant_experts``) with the batch. For each
(imbalance, redundant slots) the answer is the cheapest admissible design ($/Mtok output) within
the space's constraints (its TPOT SLO), and what the slots cost in HBM per chip and buy in
price against the same imbalance without them (dse/perf/imbalance.py: the busiest rank sets the
routed experts' step; ``r`` slots over ``ep`` ranks leave the excess ``(imb - 1) ep / (ep + r)``).
"""

from __future__ import annotations

from dse.questions import Answer, Context, Lead
from dse.questions._common import admissible, describe, md_table

COST = "usd_per_mtok_output"
IMB, RED = "serving.expert_imbalance", "serving.redundant_experts"


def answer(ctx: Context) -> Answer:
    df = ctx.score()
    df = df[admissible(ctx, df)].reset_index(drop=True)
    if df.empty or IMB not in df or RED not in df:
        return Answer("- no admissible design (the space must sweep expert_imbalance and "
                      "redundant_experts)")
    best = df.loc[df.groupby([IMB, RED])[COST].idxmin()].set_index([IMB, RED])
    rows, gains = [], {}
    for (imb, red), r in best.iterrows():
        none = best.loc[(imb, 0.0)] if (imb, 0.0) in best.index else None
        gain = None if none is None else none[COST] / r[COST]
        gains[f"{imb:g}/{int(red)}"] = gain
        extra = 0.0 if none is None else (r["weights_bytes_per_chip"]
                                          - none["weights_bytes_per_chip"])
        rows.append([f"{imb:g}", f"{int(red)}", f"${r[COST]:.3f}", r["tpot_s"] * 1e3,
                     f"{int(r['workload.concurrency']):,}", f"{extra / 1e9:.2f}",
                     "-" if gain is None else f"{gain:.2f}x"])
    table = md_table(["imbalance (max/mean)", "redundant slots", "$/Mtok output", "TPOT ms",
                      "batch", "extra HBM per chip GB", "cheaper than no slots"], rows)
    top_imb = float(best.index.get_level_values(0).max())
    at_top = best.loc[top_imb]
    reds = [float(at_top[COST].idxmin())]
    lo, hi = best.loc[(top_imb, float(at_top.index.min()))], best.loc[(top_imb, reds[-1])]
    bal = best.loc[(1.0, 0.0)] if (1.0, 0.0) in best.index else None
    head = "\n".join([
        f"- At imbalance {top_imb:g}, {int(reds[-1])} redundant slots cut the price from "
        f"${lo[COST]:.3f} to ${hi[COST]:.3f}/Mtok output ({lo[COST] / hi[COST]:.2f}x) for "
        f"{(hi['weights_bytes_per_chip'] - lo['weights_bytes_per_chip']) / 1e9:.2f} GB more "
        f"weights per chip.",
        *([] if bal is None else [
            f"- Perfect balance would cost ${bal[COST]:.3f}/Mtok: imbalance {top_imb:g} "
            f"without slots costs {lo[COST] / bal[COST]:.2f}x that, with {int(reds[-1])} slots "
            f"{hi[COST] / bal[COST]:.2f}x."]),
    ])
    details = f"""## Method

- Space: {ctx.space.size:,} designs ({', '.join(p.path for p in ctx.space.parameters)}); \
{len(df):,} admissible (feasible, {', '.join(f'{c.metric} <= {c.max:g}' for c in ctx.space.constraints if c.max is not None) or 'no constraint'}).
- Per (imbalance, redundant slots): the cheapest admissible design. The imbalance values are \
assumptions of the question (the catalog has no sourced routing statistic yet); the slots' \
effect is the model's stated rule, not a measurement.
- Cheapest design at the largest imbalance with the most slots: {describe(hi)}.

## Price by imbalance and redundant slots

{table}
"""
    numbers = {"by_imbalance_and_slots": gains, "top_imbalance": top_imb,
               "slots_at_top_imbalance": int(reds[-1]),
               "price_cut_at_top_imbalance": float(lo[COST] / hi[COST])}
    lead = (Lead("price_cut_at_top_imbalance", f"Price cut by the best redundant slots at "
                 f"imbalance {top_imb:g}", "x", pick="slots_at_top_imbalance",
                 pick_label="slot count", versus=1.0),)
    return Answer(head, details, numbers, [], lead)
