"""What do EPLB-style redundant experts buy at large expert parallelism?

The space sweeps the routing imbalance (``serving.expert_imbalance``, max/mean routed tokens
per EP rank: a grid of values the question assumes) and the redundant expert slots
(``serving.redundant_experts``, every count from 0 up) with the batch. The answer also scores the
same designs at the catalog's published routing model's imbalance for the space's EP size and
experts (``dse.perf.imbalance.published_imbalance``, ``expert_load_cv`` in
dse/catalog/serving.toml [expert_routing], with its source): the imbalance a design gets when it
leaves the field blank.

For each imbalance and slot count the answer is the cheapest admissible design ($/Mtok output)
within the space's constraints (its TPOT SLO); per imbalance it gives the price without slots,
at the published default slot count (``[answer] published_redundant_experts``, with its
``published_source``) and at the optimum, and what the slots cost in HBM per chip
(dse/perf/imbalance.py: the busiest rank sets the routed experts' step; every rank holds
``ceil((E + r) / ep)`` slots per layer, the ``replicas = slots - E`` leave the excess
``(imb - 1) ep / (ep + replicas)``). A figure draws the price against the slot count.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse import catalog
from dse.perf.imbalance import published_imbalance
from dse.questions.common import (
    Picks,
    admissible_designs,
    best_per,
    describe,
    dress,
    limits_text,
    md_table,
    save,
    space_text,
    subplots,
)
from dse.questions.context import Answer, Context, Lead

COST = "usd_per_mtok_output"
IMB, RED = "serving.expert_imbalance", "serving.redundant_experts"
PUBLISHED = "published"          # the key of the published routing model's imbalance


def _published_rows(ctx: Context, imb: float) -> pd.DataFrame:
    """Every design of the space with its imbalance replaced by ``imb``, scored (design ids
    are those of the first imbalance value's designs)."""
    first = ctx.space.parameters[[p.path for p in ctx.space.parameters].index(IMB)].values[0]
    grid = ctx.values()
    grid = grid[grid[IMB] == first].reset_index(drop=True)
    vals = {p.path: grid[p.column].to_numpy() for p in ctx.space.parameters}
    vals[IMB] = np.full(len(grid), imb)
    df = ctx.score(values=vals)
    df.insert(0, "design_id", grid["design_id"].to_numpy())
    return df


def _slots(red: np.ndarray, experts: float, ep: float) -> np.ndarray:
    """Expert slots per MoE layer (``dse.perf.arch.expert_slots``): ceil((E + r) / ep) ep."""
    return np.ceil((experts + np.asarray(red, float)) / ep) * ep


def _figure(ctx: Context, s: Picks) -> str:
    fig, ax = subplots(figsize=(7, 4.5))
    for label in s.order:
        c = s.cheapest.loc[label][COST].sort_index()
        line, = ax.plot(c.index, c.to_numpy(), "-", lw=1.5 if label == PUBLISHED else 1,
                        label=(f"published routing model ({s.imb_pub:.2f})" if label == PUBLISHED
                               else f"imbalance {label} (assumed)"))
        r = s.per[label]["best_slots"]
        ax.scatter([r], [c.loc[r]], s=40, color=line.get_color(), zorder=5)
    ax.axvline(s.pub_r, c="k", ls=":", lw=1,
               label=f"published default: {s.pub_r} redundant experts")
    dress(ax, "redundant expert slots per EP group (serving.redundant_experts)",
          "$ per million output tokens (cheapest admissible)",
          "EPLB redundant experts: price vs slot count (dots: optimum)", grid="major")
    return save(fig, ctx, "eplb-slots.png")


def answer(ctx: Context) -> Answer:
    s = Picks(pub_r=int(ctx.param("published_redundant_experts", 32)),
              source=str(ctx.param("published_source", "")))
    df = ctx.score()
    if IMB not in df or RED not in df:
        return Answer("- the space must sweep serving.expert_imbalance and "
                      "serving.redundant_experts")
    model = catalog.models()[str(ctx.space.base.get("model.id"))]
    s.experts, s.ep = float(model.num_experts), float(ctx.space.base.get("layout.ep", 1))
    s.imb_pub = float(published_imbalance(s.ep, s.experts, catalog.expert_load_cv()))
    s.df = _with_published(ctx, df, s.imb_pub)
    if s.df.empty:
        return Answer("- no admissible design")
    # the cheapest design per imbalance and slot count; the imbalances in order, published last
    s.cheapest = best_per(s.df, [IMB, RED], COST).set_index([IMB, RED])
    order = [k for k in dict.fromkeys(s.df[IMB]) if k != PUBLISHED] + [PUBLISHED]
    s.order = [k for k in order if k in s.cheapest.index.get_level_values(0)]
    s.per = {key: _per_imbalance(s, key) for key in s.order}
    s.top = max((k for k in s.order if k != PUBLISHED), key=float)
    fig = _figure(ctx, s)
    return Answer(_headline(s), _details(ctx, s), _numbers(s), [fig], _lead(s))


def _with_published(ctx: Context, df: pd.DataFrame, imb_pub: float) -> pd.DataFrame:
    """The admissible designs of the space, imbalances as text, and again at the published
    routing model's imbalance (``PUBLISHED``)."""
    pub = _published_rows(ctx, imb_pub)
    pub[IMB] = PUBLISHED
    df = pd.concat([df.assign(**{IMB: df[IMB].map(lambda v: f"{v:g}")}), pub],
                   ignore_index=True)
    return admissible_designs(ctx, df)


def _per_imbalance(s: Picks, key: str) -> dict:
    """One imbalance: the price without slots, at the published default and at the optimum
    (the fewest slots at the lowest price), and the optimum's extra HBM per chip."""
    sub = s.cheapest.loc[key]
    r_best = int(sub[COST].sort_index().idxmin())      # the first (fewest slots) at the lowest price
    none, p, b = (sub.loc[r] if r in sub.index else None for r in (0, s.pub_r, r_best))

    def price(r):
        return None if r is None else float(r[COST])

    def hbm(r):
        return None if r is None or none is None else float(
            (r["weights_bytes_per_chip"] - none["weights_bytes_per_chip"]) / 1e9)
    return {
        "imbalance": s.imb_pub if key == PUBLISHED else float(key),
        "usd_per_mtok_no_slots": price(none), "usd_per_mtok_published_slots": price(p),
        "usd_per_mtok_best": price(b), "best_slots": r_best,
        "best_replicas_per_layer": int(_slots(r_best, s.experts, s.ep) - s.experts),
        "cut_best": None if none is None else price(none) / price(b),
        "cut_published": None if none is None or p is None else price(none) / price(p),
        "best_vs_published": None if p is None else price(p) / price(b),
        "extra_hbm_gb_per_chip_best": hbm(b),
    }


def _headline(s: Picks) -> str:
    t, pd_, pub_r, ep, experts = s.per[s.top], s.per.get(PUBLISHED), s.pub_r, s.ep, s.experts
    head = []
    if pd_ is not None:
        head.append(
            f"- At the published routing model's imbalance for EP {ep:g} over {experts:g} "
            f"experts ({s.imb_pub:.2f} max/mean), the cheapest is **{pd_['best_slots']} redundant "
            f"slots** ({pd_['best_replicas_per_layer']} replicas per layer): "
            f"${pd_['usd_per_mtok_best']:.3f}/Mtok output, {pd_['cut_best']:.3f}x cheaper than "
            f"no slots (${pd_['usd_per_mtok_no_slots']:.3f})"
            + ("" if pd_["usd_per_mtok_published_slots"] is None else
               f"; the published default of {pub_r} redundant experts costs "
               f"${pd_['usd_per_mtok_published_slots']:.3f} ({pd_['best_vs_published']:.3f}x "
               "the optimum's price)") + ".")
    head.append(
        f"- At the largest assumed imbalance ({t['imbalance']:g}) the optimum is {t['best_slots']} "
        f"slots: ${t['usd_per_mtok_best']:.3f} vs ${t['usd_per_mtok_no_slots']:.3f}/Mtok "
        f"without ({t['cut_best']:.3f}x) for {t['extra_hbm_gb_per_chip_best']:.2f} GB more "
        "weights per chip"
        + ("" if t["usd_per_mtok_published_slots"] is None else
           f"; {pub_r} slots (the published default) give ${t['usd_per_mtok_published_slots']:.3f}")
        + ".")
    head.append(f"- Published default: {pub_r} redundant experts"
                + (f" ({s.source})" if s.source else "") + f". At EP {ep:g}, {experts:g} experts "
                f"already leave {int(_slots(0, experts, ep) - experts)} spare slots per layer "
                f"(ceil({experts:g}/{ep:g}) = {int(_slots(0, experts, ep) / ep)} per rank) that "
                "hold replicas, and slots come a whole one per rank at a time: see the levels "
                "below.")
    bal = s.per.get("1")
    if bal is not None:
        head.append(f"- Perfect balance would cost ${bal['usd_per_mtok_best']:.3f}/Mtok: "
                    f"imbalance {t['imbalance']:g} without slots costs "
                    f"{t['usd_per_mtok_no_slots'] / bal['usd_per_mtok_best']:.2f}x that, at its "
                    f"optimum {t['usd_per_mtok_best'] / bal['usd_per_mtok_best']:.2f}x.")
    return "\n".join(head)


def _prices_table(s: Picks) -> str:
    """Per imbalance: the price without slots, at the published default and at the optimum."""
    rows = []
    for key in s.order:
        n = s.per[key]
        b = s.cheapest.loc[(key, n["best_slots"])]
        rows.append([("published routing model " if key == PUBLISHED else "")
                     + f"{n['imbalance']:.3g}",
                     "-" if n["usd_per_mtok_no_slots"] is None
                     else f"${n['usd_per_mtok_no_slots']:.3f}",
                     "-" if n["usd_per_mtok_published_slots"] is None
                     else f"${n['usd_per_mtok_published_slots']:.3f}",
                     f"{n['best_slots']} ({n['best_replicas_per_layer']} replicas)",
                     f"${n['usd_per_mtok_best']:.3f}",
                     "-" if n["cut_best"] is None else f"{n['cut_best']:.3f}x",
                     "-" if n["best_vs_published"] is None else f"{n['best_vs_published']:.3f}x",
                     "-" if n["extra_hbm_gb_per_chip_best"] is None
                     else f"{n['extra_hbm_gb_per_chip_best']:.2f}", b["tpot_s"] * 1e3,
                     f"{int(b['workload.concurrency']):,}"])
    return md_table(["imbalance (max/mean)", "$/Mtok, no slots",
                     f"$/Mtok, {s.pub_r} slots (published default)", "optimal slots",
                     "$/Mtok at the optimum", "optimum vs no slots",
                     f"optimum vs {s.pub_r} slots", "extra HBM per chip GB (optimum)",
                     "TPOT ms (optimum)", "batch (optimum)"], rows)


def _levels_table(s: Picks) -> str:
    """The expert slots per layer each swept count of redundant experts gives."""
    reds = np.array(sorted(s.df[RED].unique()), dtype=float)
    levels = pd.DataFrame({"r": reds, "slots": _slots(reds, s.experts, s.ep)})
    rows = [[f"{int(g['r'].min())}..{int(g['r'].max())}", f"{int(slots):,}",
             f"{int(slots / s.ep)}", f"{int(slots - s.experts)}"]
            for slots, g in levels.groupby("slots")]
    return md_table(["redundant_experts", "expert slots per layer", "per EP rank",
                     "replicas of hot experts"], rows)


def _details(ctx: Context, s: Picks) -> str:
    t, pub_r, ep, experts = s.per[s.top], s.pub_r, s.ep, s.experts
    hi = s.cheapest.loc[(s.top, t["best_slots"])]
    return f"""## Method

- Space: {space_text(ctx)}, and \
the same designs again at the published routing model's imbalance {s.imb_pub:.3f} \
(`1 + z(ep) cv sqrt(ep / E)`, cv = {catalog.expert_load_cv():g} from \
dse/catalog/serving.toml [expert_routing]); {len(s.df):,} admissible (feasible, \
{limits_text(ctx, "no constraint")}).
- Per (imbalance, redundant slots): the cheapest admissible design; per imbalance the \
optimum is the fewest slots at the lowest price. The swept imbalances are assumptions of the \
question; the slots' effect is the model's stated rule (a replica splits one hot expert's load \
in two), not a measurement.
- Published default slot count: {pub_r} redundant experts ({s.source or 'see the space file'}).
- Cheapest design at imbalance {t['imbalance']:g} with its optimal slots: {describe(hi)}.

## Price without slots, at the published default and at the optimum

{_prices_table(s)}

## Expert slots the swept counts give (EP {ep:g}, {experts:g} experts)

Every EP rank holds the same whole number of slots per layer, so `serving.redundant_experts` \
rounds up to a multiple of {ep:g} slots per layer:

{_levels_table(s)}
"""


def _numbers(s: Picks) -> dict:
    t = s.per[s.top]
    return {"published_redundant_experts": s.pub_r, "published_imbalance": s.imb_pub,
            "by_imbalance": s.per, "top_imbalance": float(t["imbalance"]),
            "slots_at_top_imbalance": int(t["best_slots"]),
            "price_cut_at_top_imbalance": float(t["cut_best"])}


def _lead(s: Picks) -> tuple:
    if PUBLISHED in s.per:
        return (Lead(f"by_imbalance.{PUBLISHED}.cut_best", "Price cut by the best redundant "
                     f"slots at the published routing imbalance {s.imb_pub:.2f} (EP {s.ep:g})",
                     "x", pick=f"by_imbalance.{PUBLISHED}.best_slots", pick_label="slot count",
                     versus=1.0),)
    t = s.per[s.top]
    return (Lead("price_cut_at_top_imbalance", f"Price cut by the best redundant slots at "
                 f"imbalance {t['imbalance']:g}", "x", pick="slots_at_top_imbalance",
                 pick_label="slot count", versus=1.0),)
