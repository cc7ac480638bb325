"""The scale-up domain size that minimises cost per token, for a dense and a sparse model.

The space crosses the domain size (``topology.scaleup.domain_chips``, 8 .. 576) with the model,
every tensor-parallel, attention data-parallel and expert-parallel layout, the batch and the
prefill chunk. A domain larger than one rack pays for a second switch tier per chip
(``cost.scaleup_tier_*``, ``dse/catalog/cost_model.toml [scaleup_tier]``); an instance larger
than the domain runs its collectives over the scale-out NICs where they leave it. For each model
and domain size the analysis takes the cheapest design that meets the space's constraints (any
layout and instance size, a domain hosting as many instances as fit), scores everything again with
the tier free (the domain's cost held constant) and gives the tier price at which the cheapest
multi-rack domain would tie with the cheapest single-rack one (``ep_domain.tier_price_to_tie``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse.questions.common import (
    Picks,
    admissible,
    best_per,
    dress,
    in_units,
    md_frame,
    save,
    slo_text,
    subplots,
)
from dse.questions.context import Answer, Context, Lead
from dse.questions.ep_domain import (
    score_tier_free,
    system,
    tie_lines,
    tier_price,
    tier_price_to_tie,
)

DOMAIN = "topology.scaleup.domain_chips"
MODEL = "model.id"
LAYOUT = ("layout.tp", "layout.dp", "layout.ep", "workload.concurrency", "serving.max_num_tokens")


def cheapest_per_domain(df: pd.DataFrame, ok: np.ndarray) -> pd.DataFrame:
    """Per (model, domain): the admissible design with the lowest cost per output token."""
    out = best_per(df, [MODEL, DOMAIN], "usd_per_mtok_output", ok)
    out["instance_chips"] = out["layout.tp"] * out["layout.dp"]
    return out


def _figure(ctx: Context, s: Picks) -> str:
    fig, ax = subplots(figsize=(8, 4.5))
    for i, (m, g) in enumerate(s.best.groupby(MODEL)):
        g = g.sort_values(DOMAIN)
        f = s.best_free[s.best_free[MODEL] == m].sort_values(DOMAIN)
        line, = ax.plot(g[DOMAIN], g["usd_per_mtok_output"], "o-", label=f"{m} (tier priced)")
        ax.plot(f[DOMAIN], f["usd_per_mtok_output"], "s--", color=line.get_color(), alpha=0.6,
                label=f"{m} (tier free)")
    ax.axvline(s.rack, color="k", lw=0.8, ls=":", label=f"one rack ({s.rack} chips)")
    dress(ax, "scale-up domain (chips)", "best cost per output token (USD per Mtok)",
          "cheapest design under the SLO per domain size", xlog=2, ylog=10, legend=7)
    return save(fig, ctx, "rack-size.png")


def answer(ctx: Context) -> Answer:
    s = Picks(df=ctx.score(), free=score_tier_free(ctx), slo=slo_text(ctx), price=tier_price())
    s.ok, s.ok_free = admissible(ctx, s.df), admissible(ctx, s.free)
    s.best = cheapest_per_domain(s.df, s.ok)
    s.best_free = cheapest_per_domain(s.free, s.ok_free)
    s.rack, s.tier_chip = system(ctx)
    numbers = {"slo": s.slo, "rack_chips": s.rack, "tier_usd_per_800g": s.price,
               "tier_usd_per_chip": s.tier_chip, "models": {}}
    head = [f"Under {s.slo}, GB200-class chips, a domain beyond one rack ({s.rack} chips) paying "
            f"a second switch tier of ${s.tier_chip:,.0f} per chip (${s.price:,.0f} per 800 Gb/s, "
            "a sourced estimate in `dse/catalog/cost_model.toml`):", ""]
    for m in s.best[MODEL].unique():
        numbers["models"][m] = n = _model_numbers(s, m)
        head.append(_model_line(m, n))
        head += ["  " + line for line in tie_lines(n, s.price)]
    head.append("- What would change it: the second tier's price (the tie prices above), the "
                "prefill chunk and serving mode (aggregated here; see ep-domain and "
                "context-length), and the model's size relative to one rack's HBM.")
    lead = tuple(Lead(f"models.{m}.best_usd_per_mtok_output", f"{m}: price at the cheapest "
                      "domain", "$/Mtok", pick=f"models.{m}.best_domain",
                      pick_label="domain (chips)") for m in numbers["models"])
    return Answer("\n".join(head), _details(ctx, s), numbers, [_figure(ctx, s)], lead)


def _model_numbers(s: Picks, m: str) -> dict:
    """One model: its cheapest domain, the domains within 1% of it, the cheapest with the tier
    free, the smallest domain's cost, every domain's cost and the tie prices."""
    b = s.best[s.best[MODEL] == m].sort_values(DOMAIN)
    f = s.best_free[s.best_free[MODEL] == m].sort_values(DOMAIN)
    win = b.loc[b["usd_per_mtok_output"].idxmin()]
    win_f = f.loc[f["usd_per_mtok_output"].idxmin()]
    smallest = b.iloc[0]
    tie = tier_price_to_tie(b.assign(placement="inside"), f.assign(placement="inside"), s.rack,
                            s.price)
    within = b[b["usd_per_mtok_output"] <= win["usd_per_mtok_output"] * 1.01][DOMAIN]
    return {
        "best_domain": int(win[DOMAIN]),
        "best_usd_per_mtok_output": float(win["usd_per_mtok_output"]),
        "best_layout": {k: (int(win[k]) if k in win else None) for k in LAYOUT},
        "best_instance_chips": int(win["instance_chips"]),
        "domains_within_1pct": [int(x) for x in within],
        "best_domain_tier_free": int(win_f[DOMAIN]),
        "best_usd_per_mtok_output_tier_free": float(win_f["usd_per_mtok_output"]),
        "smallest_domain": int(smallest[DOMAIN]),
        "smallest_domain_usd_per_mtok_output": float(smallest["usd_per_mtok_output"]),
        "per_domain_usd_per_mtok_output": {str(int(r[DOMAIN])): float(r["usd_per_mtok_output"])
                                           for _, r in b.iterrows()},
        **tie}


def _model_line(m: str, n: dict) -> str:
    """One model's cheapest domain, in words."""
    lay = n["best_layout"]
    return (f"- **{m}: the cheapest domain is {n['best_domain']} chips** "
            f"(${n['best_usd_per_mtok_output']:.3f}/Mtok; instance of {n['best_instance_chips']} "
            f"chips, tp={lay['layout.tp']} dp={lay['layout.dp']} "
            f"ep={lay['layout.ep']}, batch {lay['workload.concurrency']}, chunk "
            f"{lay['serving.max_num_tokens']}); domains within 1% of it: "
            f"{', '.join(str(x) for x in n['domains_within_1pct'])}"
            + (f"; the smallest ({n['smallest_domain']} chips) costs "
               f"{n['smallest_domain_usd_per_mtok_output'] / n['best_usd_per_mtok_output']:.2f}x"
               if n["smallest_domain"] != n["best_domain"] else "")
            + ". With the "
            f"domain's cost held constant the cheapest is {n['best_domain_tier_free']} chips "
            f"(${n['best_usd_per_mtok_output_tier_free']:.3f}/Mtok).")


def _details(ctx: Context, s: Picks) -> str:
    show = in_units(s.best[[MODEL, DOMAIN, "design_id", "instance_chips", *LAYOUT,
                            "usd_per_mtok_output", "tpot_s", "ttft_s",
                            "output_tokens_per_s_per_chip", "usd_per_chip_hour"]],
                    {"tpot_s": ("tpot_ms", 1e3)})
    showf = s.best_free[[MODEL, DOMAIN, "design_id", "instance_chips", *LAYOUT,
                         "usd_per_mtok_output"]]
    return "\n".join([
        "## Method", "",
        f"- `{ctx.space.file}`: {len(s.df):,} designs scored, {int(s.ok.sum()):,} meet {s.slo} "
        f"({int(s.ok_free.sum()):,} with the tier free). A layout whose expert-parallel degree "
        "does not divide its instance, or a dense model with ep > 1, is infeasible.",
        "- Cheapest per domain: lowest `usd_per_mtok_output` among the designs that meet the SLO,"
        " over every layout, batch and chunk; an instance smaller than the domain leaves the rest "
        "of the domain to other instances (cost is per chip-hour, so it does not matter how many).",
        "- Tier free: every design scored again with `cost.scaleup_tier_usd_per_800g` and "
        "`cost.scaleup_tier_w_per_800g` set to 0 (`ctx.score(overrides=...)`).",
        "", f"### Cheapest design per model and domain ({s.slo}, tier priced)", "",
        md_frame(show), "",
        "### The same with the tier free", "", md_frame(showf), "",
        "## Caveats (model)", "",
        "- Domains of one rack or less cost the catalog system's price per chip whatever their "
        "size; the tier price is an Ethernet-class estimate (switch ports and 800G optics).",
        "- One serving mode (aggregated, chunked prefill) and fixed request lengths "
        "(2048 in, 1024 out).",
    ])
