"""Tokens/s of one optimally loaded rack within an SLO, and racks for a global demand.

The podcast's arithmetic (``shared/reference/podcast.md`` 1.3): a rack running batch ~2000 at a
15-20 ms step serves ~10^5 tokens/s, so "hundreds of millions of tokens per second" worldwide is
~1000 racks. Here every admissible design (feasible, one instance within one rack, the space's
TTFT limit) is scored in float64 (``ctx.score``); per model and rack the answer is the design
with the most output tokens/s per rack among those streaming at least
``slo_tokens_per_s_per_user``. A rack holds ``floor(rack_chips / num_chips)`` whole instances
(an instance cannot straddle two NVLink domains), so rack tokens/s = whole instances x instance
tokens/s; racks = ceil(demand / rack tokens/s); the fleet's $/Mtok output = racks x rack chips
x $/chip-hour / output tokens, all-in (prefill share, idle chips and the last partial rack
included), next to the scorer's ``usd_per_mtok_output`` (decode share of a busy design).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dse.questions.common import (
    Picks,
    admissible_designs,
    describe,
    dress,
    layout_pairs,
    limits_text,
    md_table,
    save,
    subplots,
)
from dse.questions.context import Answer, Context, Lead

SPEED = "output_tokens_per_s_per_user"
BATCH = "workload.concurrency"
LAYOUT = ("layout.tp", "layout.dp", "layout.ep")
GROUP = ("model.id", "accelerator.id")


def with_rack_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Rack chips, whole instances per rack and the rack's output tokens/s from them."""
    df = df.copy()
    # "per rack" is defined once, in the model (dse.perf.serve.instances_per_rack)
    df["rack_tokens_per_s"] = df["output_tokens_per_s_per_rack"]
    return df


def best_rack(df: pd.DataFrame, slo: float):
    """The design serving the most output tokens/s per rack at >= ``slo`` tokens/s/user."""
    ok = df[df[SPEED] >= slo]
    return None if ok.empty else ok.loc[ok["rack_tokens_per_s"].idxmax()]


def fleet(row, demand: float) -> dict:
    racks = math.ceil(demand / row["rack_tokens_per_s"])
    usd_per_s = racks * row["rack_chips"] * row["usd_per_chip_hour"] / 3600.0
    return {"racks": racks, "usd_per_hour": usd_per_s * 3600.0,
            "usd_per_mtok_output_all_in": usd_per_s / demand * 1e6}


def groups(df: pd.DataFrame):
    keys = [c for c in GROUP if c in df]
    if not keys:
        yield "design", df
        return
    for k, g in df.groupby(keys, sort=False):
        yield " on ".join(k) if isinstance(k, tuple) else str(k), g


def _figure(ctx: Context, df: pd.DataFrame, picks: dict, slo: float) -> str:
    fig, ax = subplots(figsize=(7.5, 5))
    for i, (name, g) in enumerate(groups(df)):
        xs = np.sort(g[SPEED].unique())
        grid = np.geomspace(max(xs.min(), 1.0), xs.max(), 120)
        ys = [g.loc[g[SPEED] >= x, "rack_tokens_per_s"].max() for x in grid]
        ax.plot(grid, ys, c=f"C{i}", label=name)
        p = picks.get(name)
        if p is not None:
            ax.scatter([p[SPEED]], [p["rack_tokens_per_s"]], c=f"C{i}", s=60, edgecolors="k",
                       zorder=5)
    ax.axvline(slo, c="k", ls=":", lw=1, label=f"SLO {slo:g} tokens/s/user")
    dress(ax, "output tokens/s per user (at least)", "output tokens/s per rack (whole instances)",
          "most a rack serves at a given interactivity", xlog=10, ylog=10)
    return save(fig, ctx, "rack-throughput.png")


def _pick_numbers(p, f) -> dict:
    return {"design_id": int(p["design_id"]), "rack_output_tokens_per_s": float(p["rack_tokens_per_s"]),
            "output_tokens_per_s_per_rack_metric": float(p["output_tokens_per_s_per_rack"]),
            "instances_per_rack": int(p["instances_per_rack"]), "num_chips": int(p["num_chips"]),
            "batch": int(p[BATCH]), "tp": int(p["layout.tp"]),
            "dp": int(p["layout.dp"]), "ep": int(p["layout.ep"]),
            "output_tokens_per_s_per_user": float(p[SPEED]), "ttft_s": float(p["ttft_s"]),
            "usd_per_mtok_output": float(p["usd_per_mtok_output"]), **f}


def answer(ctx: Context) -> Answer:
    s = Picks(slo=float(ctx.param("slo_tokens_per_s_per_user", 20.0)),
              demand=float(ctx.param("demand_output_tokens_per_s", 1e8)),
              slos=[float(x) for x in ctx.param("slos", [10.0, 20.0, 50.0, 100.0])])
    s.df = with_rack_columns(admissible_designs(ctx))
    s.picks = {name: best_rack(g, s.slo) for name, g in groups(s.df)}
    figs = [_figure(ctx, s.df, s.picks, s.slo)]
    s.fleets = {name: fleet(p, s.demand) for name, p in s.picks.items() if p is not None}
    numbers = {name: _pick_numbers(s.picks[name], f) for name, f in s.fleets.items()}
    lead = tuple(Lead(f"picks.{n}.rack_output_tokens_per_s", f"{n}: one rack at >= {s.slo:g} "
                      "tokens/s/user", "output tokens/s", pick=f"picks.{n}.design_id",
                      pick_label="design") for n in numbers)
    return Answer(_headline(s), _details(ctx, s), {"slo_tokens_per_s_per_user": s.slo,
                                                   "demand_output_tokens_per_s": s.demand,
                                                   "picks": numbers}, figs, lead)


def _headline(s: Picks) -> str:
    head = []
    for name, p in s.picks.items():
        if p is None:
            head.append(f"- {name}: no admissible design streams {s.slo:g} tokens/s/user")
            continue
        f = s.fleets[name]
        head.append(
            f"- **{name}**: one rack serves **{p['rack_tokens_per_s']:,.0f} output tokens/s** at "
            f">= {s.slo:g} tokens/s/user ({p[SPEED]:.1f}, TTFT {p['ttft_s']:.2f} s): "
            f"{int(p['instances_per_rack'])} x {int(p['num_chips'])}-chip instance(s) at batch "
            f"{int(p[BATCH]):,}. {s.demand:.0e} output tokens/s needs "
            f"**{f['racks']:,} racks**, ${f['usd_per_mtok_output_all_in']:.3f}/Mtok output all-in "
            f"(${p['usd_per_mtok_output']:.3f}/Mtok decode share).")
    return "\n".join(head)


def _slos_table(s: Picks) -> str:
    """Per model and rack and per SLO of ``slos``: the best rack, its racks and costs."""
    rows = []
    for name, g in groups(s.df):
        for slo in s.slos:
            p = best_rack(g, slo)
            if p is None:
                rows.append([name, f"{slo:g}", "-", "-", "-", "-", "-"])
                continue
            f = fleet(p, s.demand)
            rows.append([name, f"{slo:g}", p["rack_tokens_per_s"],
                         (f"{int(p['instances_per_rack'])} x {int(p['num_chips'])} chips, batch "
                          f"{int(p[BATCH]):,} ({layout_pairs(p, LAYOUT)})"),
                         f"{f['racks']:,}", f["usd_per_mtok_output_all_in"], p["usd_per_mtok_output"]])
    return md_table(["model on rack", "SLO tok/s/user", "rack output tok/s", "design",
                     f"racks for {s.demand:.0e} tok/s", "$/Mtok output all-in",
                     "$/Mtok output (decode share)"], rows)


def _details(ctx: Context, s: Picks) -> str:
    cols = (SPEED, "ttft_s", "output_tokens_per_s_per_instance", "usd_per_chip_hour")
    method = [f"- {name}: {describe(p, cols)}; "
              f"{int(p['instances_per_rack'])} whole instance(s) per {int(p['rack_chips'])}-chip "
              f"rack; fleet {s.fleets[name]['racks']:,} racks, "
              f"${s.fleets[name]['usd_per_hour']:,.0f}/hour."
              for name, p in s.picks.items() if p is not None]
    demand = s.demand
    return f"""## Method

- {len(s.df):,} admissible designs of {ctx.space.size:,} (feasible; \
{limits_text(ctx)}), \
scored in float64. SLO: `{SPEED}` >= {s.slo:g} (`slo_tokens_per_s_per_user` in [answer]).
- Rack tokens/s = floor(rack chips / instance chips) x `output_tokens_per_s_per_instance` (whole \
instances; the scorer's `output_tokens_per_s_per_rack` = per-chip rate x rack chips also counts \
a fraction of an instance when the instance size does not divide the rack). Racks = \
ceil({demand:.0e} / rack tokens/s), each prompt of the workload (isl / osl tokens per output \
token) is processed on the same racks.
- $/Mtok output all-in = racks x rack chips x `usd_per_chip_hour` / output tokens; the decode \
share column is the scorer's `usd_per_mtok_output` of the same design.
- For reference (not computed here): the podcast's blackboard estimate is ~64 x batch ~2000 = \
~128,000 tokens/s per rack, and "hundreds of millions of tokens per second" worldwide \
(`shared/reference/podcast.md` 1.3).
{chr(10).join(method)}

## Racks and cost at other SLOs

{_slos_table(s)}
"""
