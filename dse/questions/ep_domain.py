"""MoE expert parallelism inside one scale-up domain vs across two, with the domain's cost.

The space crosses the scale-up domain size (``topology.scaleup.domain_chips``) with the instance
size (``layout.dp``, attention data-parallel, tp = 1), the expert-parallel degree (``layout.ep``)
and the batch. A design is *inside* when its instance fits in one domain (the domain is a whole
number of instances: a 576-chip domain hosts four 144-chip instances, the expert all-to-all stays
on NVLink) and *across* when it spans two (dp = 2 x domain: half of the all-to-all destinations
are in the other domain, over the scale-out NICs). Other combinations are scored but not used.
A domain larger than one rack pays for a second switch tier per chip (``cost.scaleup_tier_*``,
``dse/catalog/cost_model.toml [scaleup_tier]``: leaf + spine ports and optics per 800 Gb/s of
scale-up bandwidth); the analysis also scores every design with that price at zero (the domain's
cost held constant, as the first version of this answer did) and gives the tier price at which the
cheapest multi-rack domain would tie with the cheapest single-rack one.

For each domain size and placement the analysis takes, over every instance size, EP degree and
batch, the cheapest design that meets the space's constraints and the lowest TPOT of any feasible
design. At equal chip counts (an instance of 2D chips in one domain of 2D, or in two domains of D)
it also compares the same layout and batch directly, so the difference is only where the
all-to-all runs. The decode step's network time is split per op
(``dse.perf.score(breakdown=True)``): ``moe_routed`` is the expert dispatch and combine,
``mlp_dense`` the all-reduce of the dense layers over the instance.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse import catalog
from dse.build.designs import resolve
from dse.questions.common import (
    Picks,
    admissible,
    best_per,
    dress,
    in_units,
    md_frame,
    op_times,
    param_values,
    save,
    slo_text,
    subplots,
)
from dse.questions.context import Answer, Context, Lead

DOMAIN = "topology.scaleup.domain_chips"
DP = "layout.dp"
EP = "layout.ep"
BATCH = "workload.concurrency"
FE = "serving.frontend_processes"
PLACES = ("inside", "across")
TIER = ("cost.scaleup_tier_usd_per_800g", "cost.scaleup_tier_w_per_800g")


def placement(df: pd.DataFrame) -> np.ndarray:
    """'inside' (the instance fits in one domain, the domain a whole number of instances),
    'across' (the instance spans two domains) or 'other'."""
    d, dp = df[DOMAIN].to_numpy(), df[DP].to_numpy()
    inside = (dp <= d) & (d % dp == 0)
    return np.where(inside, "inside", np.where(dp == 2 * d, "across", "other"))


def tier_price_to_tie(cheap: pd.DataFrame, cheap_free: pd.DataFrame, rack_chips: int,
                      price: float) -> dict:
    """The second-tier price (USD per 800G per chip) at which the cheapest multi-rack inside
    design would cost what the cheapest single-rack one costs. Cost per token is linear in the
    tier price (capex and its optics' power scale together), so two points give the line."""
    ins = lambda t: t[t["placement"] == "inside"].set_index(DOMAIN)["usd_per_mtok_output"]  # noqa: E731
    at, free = ins(cheap), ins(cheap_free)
    one = at[at.index <= rack_chips]
    multi = [d for d in at.index if d > rack_chips]
    if one.empty or not multi:
        return {}
    best_one = float(one.min())
    out = {"single_rack_best_usd_per_mtok_output": best_one,
           "single_rack_best_domain": int(one.idxmin())}
    ties = {}
    for d in multi:
        slope = (at[d] - free[d]) / price if price > 0 else 0.0
        ties[str(int(d))] = (float((best_one - free[d]) / slope) if slope > 0 and best_one > free[d]
                             else (None if best_one <= free[d] else float("inf")))
    out["tie_price_usd_per_800g"] = ties
    return out


def _best(df: pd.DataFrame, ok: np.ndarray, metric: str) -> pd.DataFrame:
    """Per (domain, placement): the row with the lowest ``metric`` among ``ok`` rows."""
    return best_per(df, [DOMAIN, "placement"], metric, ok & (df["placement"] != "other"))


def _with_network(ctx: Context, rows: pd.DataFrame) -> pd.DataFrame:
    """Add the decode step's per-op network times of ``rows``."""
    t = op_times(ctx, param_values(ctx, rows))
    rows = rows.copy()
    rows["a2a_network_ms"] = t["moe_routed_network_s"].to_numpy() * 1e3
    rows["dense_allreduce_ms"] = t["mlp_dense_network_s"].to_numpy() * 1e3
    rows["decode_step_ms"] = t["total_s"].to_numpy() * 1e3
    return rows


def equal_chip_pairs(ctx: Context, df: pd.DataFrame, ok: np.ndarray) -> pd.DataFrame:
    """For every instance size 2D that exists both inside (domain 2D) and across (domain D): the
    cheapest inside design, and the same layout and batch scored across two domains."""
    out = []
    domains = sorted(df[DOMAIN].unique())
    for d in domains:
        if 2 * d not in domains:
            continue
        inside = df[ok & (df["placement"] == "inside") & (df[DOMAIN] == 2 * d)]
        if inside.empty:
            continue
        row = df.loc[inside["usd_per_mtok_output"].idxmin()]
        vals = {p.path: np.repeat(row[p.path], 1) for p in ctx.space.parameters}
        vals[DOMAIN] = np.array([d])
        acr = ctx.score(values=vals).iloc[0]
        out.append({"chips": int(2 * d), "ep": int(row[EP]), "batch": int(row[BATCH]),
                    "inside_design_id": int(row["design_id"]),
                    "tpot_inside_ms": row["tpot_s"] * 1e3, "tpot_across_ms": acr["tpot_s"] * 1e3,
                    "usd_per_mtok_inside": row["usd_per_mtok_output"],
                    "usd_per_mtok_across": acr["usd_per_mtok_output"],
                    "tpot_ratio": acr["tpot_s"] / row["tpot_s"]})
    return pd.DataFrame(out)


def _figure(ctx: Context, table: pd.DataFrame, fast: pd.DataFrame, slo: str) -> str:
    domains = sorted(table[DOMAIN].unique())
    x = np.arange(len(domains))
    fig, axes = subplots(1, 2, figsize=(11, 4.5))
    for ax, data, metric, scale, label in (
            (axes[0], table, "usd_per_mtok_output", 1.0, f"best $ per Mtok output ({slo})"),
            (axes[1], fast, "tpot_s", 1e3, "lowest TPOT of a feasible design (ms)")):
        for j, place in enumerate(PLACES):
            v = data[data["placement"] == place].set_index(DOMAIN)[metric].reindex(domains)
            ax.bar(x + (j - 0.5) * 0.4, v.to_numpy() * scale, 0.4,
                   label=f"{place} ({'ep over 1 domain' if place == 'inside' else '2 domains'})")
        ax.set_xticks(x, [str(int(d)) for d in domains])
        dress(ax, "scale-up domain (chips)", label, grid="y")
    fig.suptitle("DeepSeek-V3 expert parallelism: one domain vs two")
    return save(fig, ctx, "ep-inside-vs-across.png")


def tie_lines(tie: dict, price: float) -> list[str]:
    """The tie prices of ``tier_price_to_tie`` in words."""
    ties = tie.get("tie_price_usd_per_800g", {})
    never = [d for d, p in sorted(ties.items(), key=lambda kv: int(kv[0])) if p is None]
    out = []
    if never:
        out.append(f"- Domains of {', '.join(never)} chips never beat the best single-rack "
                   "design, even with the second tier free.")
    for d, p in sorted(ties.items(), key=lambda kv: int(kv[0])):
        if p is not None and np.isfinite(p):
            out.append(f"- A {d}-chip domain beats one rack below a tier price of ${p:,.0f} per "
                       f"800 Gb/s ({p / price:.0%} of the estimate).")
        elif p is not None:
            out.append(f"- A {d}-chip domain beats one rack at any tier price.")
    return out


def system(ctx: Context) -> tuple[int, float]:
    """The space's rack size (chips) and the second tier's capex per chip at the catalog price,
    from its base design resolved against the catalog."""
    base = {**{p.path: p.values[0] for p in ctx.space.parameters}, **ctx.space.base}
    t = resolve(pd.DataFrame([base]))
    units = float(t["topology.scaleup.link_bw_bytes_per_s"].iloc[0]) * 8 / 800e9
    return (int(t["topology.rack_chips"].iloc[0]),
            units * float(t["cost.scaleup_tier_usd_per_800g"].iloc[0]))


def tier_price() -> float:
    """The second switch tier's catalog price, USD per 800 Gb/s of scale-up bandwidth."""
    return float(catalog.cost_model()["scaleup_tier"]["usd_per_800g"])


def score_tier_free(ctx: Context) -> pd.DataFrame:
    """Every design of the space scored with the second tier free (its price and power 0): the
    domain's cost held constant."""
    return ctx.score(overrides={TIER[0]: ("set", 0.0), TIER[1]: ("set", 0.0)})


def answer(ctx: Context) -> Answer:
    s = _select(ctx)
    numbers = _numbers(ctx, s)
    return Answer(_headline(s, numbers), _details(ctx, s), numbers,
                  [_figure(ctx, s.cheap, s.fast, s.slo)], LEAD)


def _select(ctx: Context) -> Picks:
    """Per domain and placement: the cheapest design under the SLO (``cheap``, with its network
    times), the same with the tier free (``cheap_free``) and the fastest feasible one
    (``fast``); the equal-chip pairs; the tie prices; the cheapest inside design of all."""
    s = Picks(df=ctx.score(), slo=slo_text(ctx), price=tier_price())
    s.df["placement"] = placement(s.df)
    s.ok = admissible(ctx, s.df)
    free = score_tier_free(ctx)
    free["placement"] = s.df["placement"]
    s.cheap = _with_network(ctx, _best(s.df, s.ok, "usd_per_mtok_output"))
    s.cheap_free = _best(free, admissible(ctx, free), "usd_per_mtok_output")
    s.fast = _best(s.df, s.df["feasible"].to_numpy(bool), "tpot_s")
    s.pairs = equal_chip_pairs(ctx, s.df, s.ok)
    s.rack, s.tier_chip = system(ctx)
    s.tie = tier_price_to_tie(s.cheap, s.cheap_free, s.rack, s.price)
    s.best_in, s.best_free = _cheapest_inside(s.cheap), _cheapest_inside(s.cheap_free)
    s.one_fe = _one_front_end(s)
    return s


def _one_front_end(s: Picks) -> pd.Series | None:
    """The cheapest inside design when every instance runs a single front-end process (the
    runtime's default), where the space also offers more (None otherwise)."""
    if FE not in s.df or s.df[FE].nunique() < 2:
        return None
    one = s.ok & (s.df[FE].to_numpy() == s.df[FE].min())
    return _cheapest_inside(_best(s.df, one, "usd_per_mtok_output"))


def _cheapest_inside(table: pd.DataFrame) -> pd.Series:
    ins = table[table["placement"] == "inside"]
    return ins.loc[ins["usd_per_mtok_output"].idxmin()]


def _numbers(ctx: Context, s: Picks) -> dict:
    numbers = {"slo": s.slo, "rack_chips": s.rack, "tier_usd_per_800g": s.price,
               "tier_usd_per_chip": s.tier_chip, "domains": {}, **s.tie}
    shown = [int(d) for d in ctx.param("headline_domains", sorted(s.cheap[DOMAIN].unique()))]
    c = s.cheap.set_index([DOMAIN, "placement"])
    f = s.fast.set_index([DOMAIN, "placement"])
    cf = s.cheap_free.set_index([DOMAIN, "placement"])
    for d in shown:
        numbers["domains"][str(d)] = {place: _domain_numbers(d, place, c.loc[(d, place)], f, cf)
                                      for place in PLACES if (d, place) in c.index}
    best_in, best_free = s.best_in, s.best_free
    numbers["cheapest_inside_domain"] = int(best_in[DOMAIN])
    numbers["cheapest_inside_usd_per_mtok_output"] = float(best_in["usd_per_mtok_output"])
    numbers["cheapest_inside_instance_chips"] = int(best_in[DP])
    numbers["cheapest_inside_domain_tier_free"] = int(best_free[DOMAIN])
    numbers["cheapest_inside_instance_chips_tier_free"] = int(best_free[DP])
    numbers["cheapest_inside_usd_per_mtok_output_tier_free"] = float(best_free["usd_per_mtok_output"])
    numbers["equal_chip_pairs"] = s.pairs.to_dict(orient="records")
    if FE in best_in:
        numbers["cheapest_inside_frontend_processes"] = int(best_in[FE])
    if s.one_fe is not None:
        numbers["one_frontend_cheapest_inside_domain"] = int(s.one_fe[DOMAIN])
        numbers["one_frontend_cheapest_inside_usd_per_mtok_output"] = float(
            s.one_fe["usd_per_mtok_output"])
        numbers["one_frontend_cheapest_inside_instance_chips"] = int(s.one_fe[DP])
    return numbers


def _domain_numbers(d: int, place: str, r: pd.Series, f: pd.DataFrame, cf: pd.DataFrame) -> dict:
    """One domain size and placement's cheapest design (``r``), lowest TPOT (from ``f``) and
    cheapest with the tier free (from ``cf``)."""
    return {"usd_per_mtok_output": float(r["usd_per_mtok_output"]),
            "tpot_s": float(r["tpot_s"]), "ep": int(r[EP]), "batch": int(r[BATCH]),
            "instance_chips": int(r[DP]),
            "instances_per_domain": int(d // r[DP]) if place == "inside" else 0,
            "design_id": int(r["design_id"]),
            "output_tokens_per_s_per_chip": float(r["output_tokens_per_s_per_chip"]),
            "min_tpot_s": float(f.loc[(d, place), "tpot_s"]),
            "usd_per_mtok_output_tier_free": float(cf.loc[(d, place), "usd_per_mtok_output"])
            if (d, place) in cf.index else None}


def _headline(s: Picks, numbers: dict) -> str:
    best_in, best_free, cheap_free = s.best_in, s.best_free, s.cheap_free
    same = cheap_free[(cheap_free["placement"] == "inside")
                      & (cheap_free["usd_per_mtok_output"]
                         <= best_free["usd_per_mtok_output"] * (1 + 1e-9))]
    head = [
        f"Under {s.slo}, DeepSeek-V3 FP8 on GB200-class chips, a domain hosting as many instances "
        "as fit (cheapest design per domain size and placement, over every instance size, EP "
        "degree and batch):", "",
        f"- **The cheapest domain is {int(best_in[DOMAIN])} chips** "
        f"(${best_in['usd_per_mtok_output']:.3f}/Mtok, instances of {int(best_in[DP])} chips, "
        f"ep={int(best_in[EP])}), with a domain beyond one rack ({s.rack} chips) paying a second "
        f"switch tier of ${s.tier_chip:,.0f} per chip (${s.price:,.0f} per 800 Gb/s: leaf and "
        "spine ports and optics, a sourced estimate in `dse/catalog/cost_model.toml`).",
        f"- **With the domain's cost held constant** (tier price 0) the cheapest instance is "
        f"{int(best_free[DP])} chips (${best_free['usd_per_mtok_output']:.3f}/Mtok), which every "
        f"domain of {', '.join(str(int(x)) for x in sorted(same[DOMAIN].unique()))} chips hosts "
        "equally well: the domain size no longer decides, only whether the best instance fits in it "
        "(an earlier version made one instance fill the domain and held its cost constant)."]
    head += tie_lines(s.tie, s.price)
    head += front_end_lines(s)
    head += [_domain_line(int(d), n) for d, n in numbers["domains"].items()
             if "inside" in n and "across" in n]
    if len(s.pairs):
        pairs = s.pairs
        worst = pairs.loc[pairs["tpot_ratio"].idxmax()]
        head.append(
            f"- **At equal chips** the same layout and batch is slower across two domains: "
            f"TPOT x{pairs['tpot_ratio'].min():.2f} to x{pairs['tpot_ratio'].max():.2f} "
            f"(worst at {int(worst['chips'])} chips: {worst['tpot_inside_ms']:.0f} -> "
            f"{worst['tpot_across_ms']:.0f} ms).")
    big = s.cheap[s.cheap["placement"] == "inside"].sort_values(DOMAIN).iloc[-1]
    head.append(
        f"- What would change it: the second tier's price (above), and instances larger than one "
        f"rack getting cheaper per token. At {int(big[DOMAIN])} chips the cheapest decode step "
        f"spends {big['a2a_network_ms']:.1f} ms in the expert all-to-all and "
        f"{big['dense_allreduce_ms']:.1f} ms in the dense all-reduce.")
    return "\n".join(head)


def front_end_lines(s: Picks) -> list[str]:
    """What the runtime's front end does to the answer, where the space offers more than one
    front-end process per instance."""
    one, best = s.one_fe, s.best_in
    if one is None:
        return []
    k = int(best[FE])
    if int(one[DP]) == int(best[DP]):
        return [f"- The front end does not decide it: with one front-end process per instance "
                f"the cheapest instance is the same ({int(one[DP])} chips, "
                f"${one['usd_per_mtok_output']:.3f}/Mtok)."]
    return [f"- **The front end decides between instance sizes**: the cheapest design runs "
            f"{k} front-end processes; with one per instance (the runtime's default) a large "
            f"instance's requests queue behind one tokenizer and miss the TTFT limit, and the "
            f"cheapest instance is {int(one[DP])} chips (${one['usd_per_mtok_output']:.3f}/Mtok, "
            f"domain {int(one[DOMAIN])}) (`serving.frontend_processes`, dse/perf/frontend.py)."]


def _domain_line(d: int, n: dict) -> str:
    """One domain size: inside against across, in words."""
    i, a = n["inside"], n["across"]
    host = (f"{i['instances_per_domain']} instances of {i['instance_chips']} chips"
            if i["instances_per_domain"] > 1 else f"one instance of {i['instance_chips']} chips")
    return (f"- **domain {d}:** inside **${i['usd_per_mtok_output']:.3f}/Mtok** at "
            f"{i['tpot_s'] * 1e3:.0f} ms TPOT ({host}, ep={i['ep']}, batch {i['batch']}); "
            f"across two domains **${a['usd_per_mtok_output']:.3f}/Mtok** at "
            f"{a['tpot_s'] * 1e3:.0f} ms ({2 * d} chips, ep={a['ep']}, batch {a['batch']}): "
            f"across costs **{a['usd_per_mtok_output'] / i['usd_per_mtok_output']:.1f}x**; "
            f"lowest TPOT {i['min_tpot_s'] * 1e3:.1f} ms inside vs "
            f"{a['min_tpot_s'] * 1e3:.1f} ms across.")


TABLE_UNITS = {"tpot_s": ("tpot_ms", 1e3), DP: ("instance chips (dp)", None)}


def _details(ctx: Context, s: Picks) -> str:
    slo, cheap = s.slo, s.cheap
    dense_col = ["layout.dense_mlp"] if "layout.dense_mlp" in cheap else []
    fe_col = [FE] if FE in cheap else []
    t = in_units(cheap[[DOMAIN, "placement", "design_id", DP, EP, *dense_col, *fe_col, BATCH,
                        "usd_per_mtok_output", "tpot_s", "ttft_s", "output_tokens_per_s_per_chip",
                        "usd_per_chip_hour", "decode_step_ms", "a2a_network_ms",
                        "dense_allreduce_ms"]], TABLE_UNITS)
    tf = s.cheap_free[[DOMAIN, "placement", "design_id", DP, EP, BATCH, "usd_per_mtok_output",
                       "usd_per_chip_hour"]].rename(columns={DP: "instance chips (dp)"})
    ft = in_units(s.fast[[DOMAIN, "placement", "design_id", DP, EP, BATCH, "tpot_s",
                          "usd_per_mtok_output"]], TABLE_UNITS)
    return "\n".join([
        "## Method", "",
        f"- `{ctx.space.file}`: {len(s.df):,} designs scored; a design is *inside* when its "
        "instance (`layout.dp` chips, tp = 1) fits in one domain a whole number of times and "
        f"*across* when it is twice the domain; {int(s.ok.sum()):,} designs meet {slo}. EP degrees "
        "above DeepSeek-V3's 256 experts are infeasible in dse.",
        "- Domain cost: a domain larger than the rack (and than the catalog system's own domain) "
        "adds `cost.scaleup_tier_usd_per_800g` x the chip's scale-up bandwidth in 800 Gb/s units "
        "to its capex and `cost.scaleup_tier_w_per_800g` to its power; every design is scored "
        "again with both at zero (`ctx.score(overrides=...)`) for the constant-cost view, and the "
        "tie price is where the two straight lines (cost per token is linear in the price) cross "
        "the best single-rack cost.",
        "- Cheapest: lowest `usd_per_mtok_output` among the designs that meet the SLO; lowest "
        "TPOT: the lowest `tpot_s` of any feasible design (no SLO).",
        "- Network columns: the decode-only step's `moe_routed` network time (dispatch + combine "
        "all-to-all and the expert-shard all-reduce) and `mlp_dense` network time (the dense "
        "layers' all-reduce), per stage step, from `dse.perf.score(breakdown=True)`.",
        "- Equal chips: the cheapest inside design of 2D chips (domain 2D) re-scored with the "
        "domain set to D (`ctx.score(values=...)`), everything else equal.",
        "", f"### Cheapest design per domain and placement ({slo}, sourced tier price)", "",
        md_frame(t), "",
        "### The same with the domain's cost held constant (tier price 0)", "", md_frame(tf), "",
        "### Lowest TPOT per domain and placement (feasible, no SLO)", "", md_frame(ft), "",
        "### Equal chips: one domain vs two, same layout and batch", "",
        md_frame(s.pairs) if len(s.pairs) else "(no pair)", "",
        *CAVEATS,
    ])


CAVEATS = [
    "## Caveats (model)", "",
    "- The tier price is an Ethernet-class estimate (switch ports and 800G optics); NVLink "
    "switch silicon and copper backplanes (as Rubin's NVL576 plans) may cost less. Domains "
    "within one rack cost the catalog system's price whatever their size (a smaller domain "
    "in the same rack saves nothing).",
    "- The dense MLP layers (DeepSeek-V3's first 3) are either split over the whole tp x dp "
    "instance or replicated on every attention-DP rank (`layout.dense_mlp`); the space "
    "searches both.",
    "- The expert all-to-all always runs over the whole tp x dp group, even when "
    "ep < tp x dp.",
    "- The runtime's front end (tokenizing, streaming) is a serial server per process "
    "(dse/perf/frontend.py, fitted end to end on 8-GPU deployments); the space offers one "
    "process per instance (TensorRT-LLM's default) or several behind a router "
    "(`serving.frontend_processes`), whose cost is not counted.",
]
LEAD = (Lead("cheapest_inside_usd_per_mtok_output", "Price at the cheapest domain", "$/Mtok",
             pick="cheapest_inside_domain", pick_label="domain (chips)"),)
