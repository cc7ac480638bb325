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

from dse import catalog
from dse.questions.common import admissible, md_frame, pyplot, save, slo_text
from dse.questions.context import Answer, Context, Lead
from dse.questions.ep_domain import TIER, system, tie_lines, tier_price_to_tie

DOMAIN = "topology.scaleup.domain_chips"
MODEL = "model.id"
LAYOUT = ("layout.tp", "layout.dp", "layout.ep", "workload.concurrency", "serving.max_num_tokens")


def cheapest_per_domain(df: pd.DataFrame, ok: np.ndarray) -> pd.DataFrame:
    """Per (model, domain): the admissible design with the lowest cost per output token."""
    sub = df[ok]
    idx = sub.groupby([MODEL, DOMAIN])["usd_per_mtok_output"].idxmin()
    out = df.loc[idx.to_numpy()].reset_index(drop=True)
    out["instance_chips"] = out["layout.tp"] * out["layout.dp"]
    return out


def _figure(ctx: Context, best: pd.DataFrame, free: pd.DataFrame, rack: int) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (m, g) in enumerate(best.groupby(MODEL)):
        g = g.sort_values(DOMAIN)
        f = free[free[MODEL] == m].sort_values(DOMAIN)
        line, = ax.plot(g[DOMAIN], g["usd_per_mtok_output"], "o-", label=f"{m} (tier priced)")
        ax.plot(f[DOMAIN], f["usd_per_mtok_output"], "s--", color=line.get_color(), alpha=0.6,
                label=f"{m} (tier free)")
    ax.axvline(rack, color="k", lw=0.8, ls=":", label=f"one rack ({rack} chips)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("scale-up domain (chips)")
    ax.set_ylabel("best cost per output token (USD per Mtok)")
    ax.set_title("cheapest design under the SLO per domain size")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return save(fig, ctx, "rack-size.png")


def answer(ctx: Context) -> Answer:
    df = ctx.score()
    ok = admissible(ctx, df)
    free = ctx.score(overrides={TIER[0]: ("set", 0.0), TIER[1]: ("set", 0.0)})
    ok_free = admissible(ctx, free)
    slo = slo_text(ctx)
    best = cheapest_per_domain(df, ok)
    best_free = cheapest_per_domain(free, ok_free)
    rack, tier_chip = system(ctx)
    price = float(catalog.cost_model()["scaleup_tier"]["usd_per_800g"])
    numbers = {"slo": slo, "rack_chips": rack, "tier_usd_per_800g": price,
               "tier_usd_per_chip": tier_chip, "models": {}}
    head = [f"Under {slo}, GB200-class chips, a domain beyond one rack ({rack} chips) paying a "
            f"second switch tier of ${tier_chip:,.0f} per chip (${price:,.0f} per 800 Gb/s, a "
            "sourced estimate in `dse/catalog/cost_model.toml`):", ""]
    for m in best[MODEL].unique():
        b = best[best[MODEL] == m].sort_values(DOMAIN)
        f = best_free[best_free[MODEL] == m].sort_values(DOMAIN)
        win = b.loc[b["usd_per_mtok_output"].idxmin()]
        win_f = f.loc[f["usd_per_mtok_output"].idxmin()]
        smallest = b.iloc[0]
        tb = b.assign(placement="inside")
        tf = f.assign(placement="inside")
        tie = tier_price_to_tie(tb, tf, rack, price)
        within = b[b["usd_per_mtok_output"] <= win["usd_per_mtok_output"] * 1.01][DOMAIN]
        numbers["models"][m] = {
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
        head.append(
            f"- **{m}: the cheapest domain is {int(win[DOMAIN])} chips** "
            f"(${win['usd_per_mtok_output']:.3f}/Mtok; instance of {int(win['instance_chips'])} "
            f"chips, tp={int(win['layout.tp'])} dp={int(win['layout.dp'])} "
            f"ep={int(win['layout.ep'])}, batch {int(win['workload.concurrency'])}, chunk "
            f"{int(win['serving.max_num_tokens'])}); domains within 1% of it: "
            f"{', '.join(str(int(x)) for x in within)}"
            + (f"; the smallest ({int(smallest[DOMAIN])} chips) costs "
               f"{smallest['usd_per_mtok_output'] / win['usd_per_mtok_output']:.2f}x"
               if int(smallest[DOMAIN]) != int(win[DOMAIN]) else "")
            + ". With the "
            f"domain's cost held constant the cheapest is {int(win_f[DOMAIN])} chips "
            f"(${win_f['usd_per_mtok_output']:.3f}/Mtok).")
        head += ["  " + line for line in tie_lines(tie, price)]
    head.append("- What would change it: the second tier's price (the tie prices above), the "
                "prefill chunk and serving mode (aggregated here; see ep-domain and "
                "context-length), and the model's size relative to one rack's HBM.")
    show = best[[MODEL, DOMAIN, "design_id", "instance_chips", *LAYOUT, "usd_per_mtok_output",
                 "tpot_s", "ttft_s", "output_tokens_per_s_per_chip", "usd_per_chip_hour"]].copy()
    show["tpot_s"] *= 1e3
    show = show.rename(columns={"tpot_s": "tpot_ms"})
    showf = best_free[[MODEL, DOMAIN, "design_id", "instance_chips", *LAYOUT,
                       "usd_per_mtok_output"]]
    details = "\n".join([
        "## Method", "",
        f"- `{ctx.space.file}`: {len(df):,} designs scored, {int(ok.sum()):,} meet {slo} "
        f"({int(ok_free.sum()):,} with the tier free). A layout whose expert-parallel degree "
        "does not divide its instance, or a dense model with ep > 1, is infeasible.",
        "- Cheapest per domain: lowest `usd_per_mtok_output` among the designs that meet the SLO,"
        " over every layout, batch and chunk; an instance smaller than the domain leaves the rest "
        "of the domain to other instances (cost is per chip-hour, so it does not matter how many).",
        "- Tier free: every design scored again with `cost.scaleup_tier_usd_per_800g` and "
        "`cost.scaleup_tier_w_per_800g` set to 0 (`ctx.score(overrides=...)`).",
        "", f"### Cheapest design per model and domain ({slo}, tier priced)", "", md_frame(show), "",
        "### The same with the tier free", "", md_frame(showf), "",
        "## Caveats (model)", "",
        "- Domains of one rack or less cost the catalog system's price per chip whatever their "
        "size; the tier price is an Ethernet-class estimate (switch ports and 800G optics).",
        "- One serving mode (aggregated, chunked prefill) and fixed request lengths "
        "(2048 in, 1024 out).",
    ])
    fig = _figure(ctx, best, best_free, rack)
    lead = tuple(Lead(f"models.{m}.best_usd_per_mtok_output", f"{m}: price at the cheapest "
                      "domain", "$/Mtok", pick=f"models.{m}.best_domain",
                      pick_label="domain (chips)") for m in numbers["models"])
    return Answer("\n".join(head), details, numbers, [fig], lead)
