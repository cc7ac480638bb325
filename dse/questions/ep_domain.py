"""MoE expert parallelism inside one scale-up domain vs across two.

The space crosses the scale-up domain size (``topology.scaleup.domain_chips``) with the instance
size (``layout.dp``, attention data-parallel, tp = 1), the expert-parallel degree (``layout.ep``)
and the batch. A design is *inside* when its instance fills exactly one domain (dp = domain: the
expert all-to-all stays on NVLink) and *across* when it fills two (dp = 2 x domain: half of the
all-to-all destinations are in the other domain, over the scale-out NICs). Other combinations are
scored but not used. For each domain size and placement the analysis takes, over every EP degree
and batch, the cheapest design that meets the space's constraints (cost, TPOT, tokens/s/chip of
that design) and the lowest TPOT of any feasible design. At equal chip counts (an instance of 2D
chips in one domain of 2D, or in two domains of D) it also compares the same layout and batch
directly, so the difference is only where the all-to-all runs. The decode step's network time
is split per op (``dse.perf.score(breakdown=True)``): ``moe_routed`` is the expert dispatch and
combine, ``mlp_dense`` the all-reduce of the dense layers over the instance.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse.questions import Answer, Context
from dse.questions._common import (admissible, md_frame, op_times, param_values, pyplot,
                                   save, slo_text)

DOMAIN = "topology.scaleup.domain_chips"
DP = "layout.dp"
EP = "layout.ep"
BATCH = "workload.concurrency"
PLACES = ("inside", "across")


def placement(df: pd.DataFrame) -> np.ndarray:
    """'inside' (the instance is one domain), 'across' (two domains) or 'other'."""
    d, dp = df[DOMAIN].to_numpy(), df[DP].to_numpy()
    return np.where(dp == d, "inside", np.where(dp == 2 * d, "across", "other"))


def _best(df: pd.DataFrame, ok: np.ndarray, metric: str) -> pd.DataFrame:
    """Per (domain, placement): the row with the lowest ``metric`` among ``ok`` rows."""
    sub = df[ok & (df["placement"] != "other")]
    idx = sub.groupby([DOMAIN, "placement"])[metric].idxmin()
    return df.loc[idx.to_numpy()].reset_index(drop=True)


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
    plt = pyplot()
    domains = sorted(table[DOMAIN].unique())
    x = np.arange(len(domains))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), dpi=110)
    for ax, data, metric, scale, label in (
            (axes[0], table, "usd_per_mtok_output", 1.0, f"best $ per Mtok output ({slo})"),
            (axes[1], fast, "tpot_s", 1e3, "lowest TPOT of a feasible design (ms)")):
        for j, place in enumerate(PLACES):
            v = data[data["placement"] == place].set_index(DOMAIN)[metric].reindex(domains)
            ax.bar(x + (j - 0.5) * 0.4, v.to_numpy() * scale, 0.4,
                   label=f"{place} ({'ep over 1 domain' if place == 'inside' else '2 domains'})")
        ax.set_xticks(x, [str(int(d)) for d in domains])
        ax.set_xlabel("scale-up domain (chips)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    fig.suptitle("DeepSeek-V3 expert parallelism: one domain vs two")
    return save(fig, ctx, "ep-inside-vs-across.png")


def answer(ctx: Context) -> Answer:
    df = ctx.score()
    df["placement"] = placement(df)
    ok = admissible(ctx, df)
    slo = slo_text(ctx)
    cheap = _with_network(ctx, _best(df, ok, "usd_per_mtok_output"))
    fast = _best(df, df["feasible"].to_numpy(bool), "tpot_s")
    pairs = equal_chip_pairs(ctx, df, ok)
    shown = [int(d) for d in ctx.param("headline_domains", sorted(cheap[DOMAIN].unique()))]
    c = cheap.set_index([DOMAIN, "placement"])
    f = fast.set_index([DOMAIN, "placement"])
    numbers = {"slo": slo, "domains": {}}
    lines = []
    for d in shown:
        n = {}
        for place in PLACES:
            if (d, place) in c.index:
                r = c.loc[(d, place)]
                n[place] = {"usd_per_mtok_output": float(r["usd_per_mtok_output"]),
                            "tpot_s": float(r["tpot_s"]), "ep": int(r[EP]), "batch": int(r[BATCH]),
                            "design_id": int(r["design_id"]),
                            "output_tokens_per_s_per_chip": float(r["output_tokens_per_s_per_chip"]),
                            "min_tpot_s": float(f.loc[(d, place), "tpot_s"])}
        numbers["domains"][str(d)] = n
        if "inside" in n and "across" in n:
            i, a = n["inside"], n["across"]
            lines.append(
                f"- **domain {d}:** inside **${i['usd_per_mtok_output']:.3f}/Mtok** at "
                f"{i['tpot_s'] * 1e3:.0f} ms TPOT ({d} chips, ep={i['ep']}, batch {i['batch']}); "
                f"across two domains **${a['usd_per_mtok_output']:.3f}/Mtok** at "
                f"{a['tpot_s'] * 1e3:.0f} ms ({2 * d} chips, ep={a['ep']}, batch {a['batch']}): "
                f"across costs **{a['usd_per_mtok_output'] / i['usd_per_mtok_output']:.1f}x**; "
                f"lowest TPOT {i['min_tpot_s'] * 1e3:.1f} ms inside vs "
                f"{a['min_tpot_s'] * 1e3:.1f} ms across.")
    ins = cheap[cheap["placement"] == "inside"]
    best_in = ins.loc[ins["usd_per_mtok_output"].idxmin()]
    numbers["cheapest_inside_domain"] = int(best_in[DOMAIN])
    numbers["cheapest_inside_usd_per_mtok_output"] = float(best_in["usd_per_mtok_output"])
    numbers["equal_chip_pairs"] = pairs.to_dict(orient="records")
    head = [f"Under {slo}, DeepSeek-V3 FP8 on GB200-class chips (cheapest design per domain size "
            "and placement, over every EP degree and batch):", ""] + lines
    if len(pairs):
        worst = pairs.loc[pairs["tpot_ratio"].idxmax()]
        head.append(
            f"- **At equal chips** the same layout and batch is always slower across two domains: "
            f"TPOT x{pairs['tpot_ratio'].min():.2f} to x{pairs['tpot_ratio'].max():.2f} "
            f"(worst at {int(worst['chips'])} chips: {worst['tpot_inside_ms']:.0f} -> "
            f"{worst['tpot_across_ms']:.0f} ms).")
    inside = cheap[cheap["placement"] == "inside"].sort_values(DOMAIN)
    big = inside.iloc[-1]
    modes = sorted(set(inside["layout.dense_mlp"])) if "layout.dense_mlp" in inside else []
    head.append(
        f"- The cheapest domain for this model is **{int(best_in[DOMAIN])} chips** "
        f"(${best_in['usd_per_mtok_output']:.3f}/Mtok)"
        + (f"; the cheapest inside designs keep the dense MLP layers {' or '.join(modes)}"
           if modes else "")
        + f". At {int(big[DOMAIN])} chips the decode step spends {big['a2a_network_ms']:.1f} ms "
        f"in the expert all-to-all and {big['dense_allreduce_ms']:.1f} ms in the dense "
        f"all-reduce (at {int(best_in[DOMAIN])}: {best_in['a2a_network_ms']:.1f} and "
        f"{best_in['dense_allreduce_ms']:.1f} ms).")
    dense_col = ["layout.dense_mlp"] if "layout.dense_mlp" in cheap else []
    t = cheap[[DOMAIN, "placement", "design_id", DP, EP, *dense_col, BATCH, "usd_per_mtok_output", "tpot_s",
               "ttft_s", "output_tokens_per_s_per_chip", "decode_step_ms", "a2a_network_ms",
               "dense_allreduce_ms"]].copy()
    t["tpot_s"] *= 1e3
    t = t.rename(columns={"tpot_s": "tpot_ms", DP: "chips (dp)"})
    ft = fast[[DOMAIN, "placement", "design_id", DP, EP, BATCH, "tpot_s",
               "usd_per_mtok_output"]].copy()
    ft["tpot_s"] *= 1e3
    ft = ft.rename(columns={"tpot_s": "tpot_ms", DP: "chips (dp)"})
    details = "\n".join([
        "## Method", "",
        f"- `{ctx.space.file}`: {len(df):,} designs scored; a design is *inside* when "
        "`layout.dp` (the instance, tp = 1) equals the domain and *across* when it is twice the "
        f"domain; {int(ok.sum()):,} designs meet {slo}. EP degrees above DeepSeek-V3's 256 "
        "experts are infeasible in dse, so the EP degree is the best of the listed ones that "
        "divide the instance (ep = domain where the domain is <= 256).",
        "- Cheapest: lowest `usd_per_mtok_output` among the designs that meet the SLO; lowest "
        "TPOT: the lowest `tpot_s` of any feasible design (no SLO).",
        "- Network columns: the decode-only step's `moe_routed` network time (dispatch + combine "
        "all-to-all and the expert-shard all-reduce) and `mlp_dense` network time (the dense "
        "layers' all-reduce), per stage step, from `dse.perf.score(breakdown=True)`.",
        "- Equal chips: the cheapest inside design of 2D chips (domain 2D) re-scored with the "
        "domain set to D (`ctx.score(values=...)`), everything else equal.",
        "", f"### Cheapest design per domain and placement ({slo})", "", md_frame(t), "",
        "### Lowest TPOT per domain and placement (feasible, no SLO)", "", md_frame(ft), "",
        "### Equal chips: one domain vs two, same layout and batch", "",
        md_frame(pairs) if len(pairs) else "(no pair)", "",
        "## Caveats (model)", "",
        "- The dense MLP layers (DeepSeek-V3's first 3) are either split over the whole tp x dp "
        "instance, all-reducing every token's activations over it (SGLang's default with "
        "attention data parallelism), or replicated on every attention-DP rank "
        "(`layout.dense_mlp`); the space searches both (column `layout.dense_mlp`).",
        "- The expert all-to-all always runs over the whole tp x dp group, even when "
        "ep < tp x dp (replicas of an expert could be placed so that dispatch stays in the "
        "domain).",
    ])
    fig = _figure(ctx, cheap, fast, slo)
    return Answer("\n".join(head), details, numbers, [fig])
