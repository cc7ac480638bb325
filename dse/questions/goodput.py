"""Goodput of one rack under p90 latency SLOs: the request rate an operator buys by.

Every admissible design (feasible, one instance within one rack) is scored in float64 with the
space's SLOs (``workload.ttft_slo_s``, ``workload.tpot_slo_s``): its goodput is the highest
Poisson request rate at which the p90 TTFT (the instance's TTFT plus an M/D/1 prefill queue)
and the p90 TPOT (at the batch a Poisson load puts in flight) meet them (dse/perf/queueing.py).
A rack holds ``floor(rack_chips / num_chips)`` whole instances; its goodput is theirs summed.
The answer is the layout with the most goodput per rack, its saturation rate, and the price of
an output token when the rack runs at its goodput (chip-hours over the tokens it serves).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse.questions.common import admissible, describe, md_table, space_text
from dse.questions.context import Answer, Context, Lead

GOOD = "goodput_requests_per_s_per_chip"


def answer(ctx: Context) -> Answer:
    df = ctx.score()
    df = df[admissible(ctx, df) & np.isfinite(df[GOOD])].reset_index(drop=True)
    if df.empty:
        return Answer("- no admissible design has a goodput under these SLOs")
    osl = float(ctx.space.base.get("workload.osl", 1024))
    df = _per_rack(df, osl)
    best = df.loc[df["goodput_per_rack"].idxmax()]
    numbers = {"goodput_requests_per_s_per_rack": float(best["goodput_per_rack"]),
               "saturation_requests_per_s_per_rack": float(best["saturation_per_rack"]),
               "usd_per_mtok_at_goodput": float(best["usd_per_mtok_at_goodput"]),
               "design_id": int(best["design_id"])}
    lead = (Lead("goodput_requests_per_s_per_rack", "Goodput of one rack",
                 "requests/s per rack", pick="design_id", pick_label="design"),)
    return Answer(_headline(ctx, best, osl), _details(ctx, df), numbers, [], lead)


def _per_rack(df: pd.DataFrame, osl: float) -> pd.DataFrame:
    """Goodput and saturation per rack, and the price of an output token at the goodput."""
    # "per rack" is defined once, in the model (dse.perf.serve.instances_per_rack)
    df["goodput_per_rack"] = df[GOOD] * df["num_chips"] * df["instances_per_rack"]
    df["saturation_per_rack"] = (df["saturation_requests_per_s_per_instance"]
                                 * df["instances_per_rack"])
    df["usd_per_mtok_at_goodput"] = (df["usd_per_chip_hour"] / 3600.0
                                     / (df[GOOD] * osl) * 1e6)
    return df


def _headline(ctx: Context, best: pd.Series, osl: float) -> str:
    slos = f"p90 TTFT <= {ctx.space.base.get('workload.ttft_slo_s')} s and p90 TPOT <= " \
           f"{ctx.space.base.get('workload.tpot_slo_s')} s"
    return "\n".join([
        f"- **Goodput {best['goodput_per_rack']:,.1f} requests/s per rack** under {slos} "
        f"({best['goodput_per_rack'] * osl:,.0f} output tokens/s): {describe(best)}, "
        f"{int(best['instances_per_rack'])} instance(s) of {int(best['num_chips'])} chips.",
        f"- Its saturation rate is {best['saturation_per_rack']:,.1f} requests/s per rack: the "
        f"SLOs leave {best['goodput_per_rack'] / best['saturation_per_rack']:.0%} of it usable.",
        f"- At its goodput an output token costs ${best['usd_per_mtok_at_goodput']:.3f}/Mtok "
        f"(chip-hours over the tokens served).",
    ])


def _details(ctx: Context, df: pd.DataFrame) -> str:
    top = df.sort_values("goodput_per_rack", ascending=False).head(8)
    rows = [[describe(r), r["goodput_per_rack"], r["saturation_per_rack"],
             r["goodput_per_rack"] / max(r["saturation_per_rack"], 1e-30),
             f"${r['usd_per_mtok_at_goodput']:.3f}"] for _, r in top.iterrows()]
    table = md_table(["design", "goodput req/s per rack", "saturation req/s per rack",
                      "goodput / saturation", "$/Mtok output at goodput"], rows)
    return f"""## Method

- Space: {space_text(ctx)}; \
{len(df):,} are admissible with a goodput. Scored in float64 with the run's scorer.
- Goodput: the highest Poisson request rate per instance whose p90 TTFT and p90 TPOT meet the \
SLOs, by bisection on the concurrency that Little's law gives the rate (`dse/perf/queueing.py`: \
M/D/1 prefill queue with the exact decay rate, M/G/inf batch for the TPOT percentile); per rack \
= whole instances per rack x instance goodput. Saturation: the rate at the largest \
concurrency that fits with a stable prefill queue.
- The percentiles are of the model's steady state (Poisson arrivals), not of bursts.

## Layouts with the most goodput

{table}
"""
