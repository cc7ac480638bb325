"""What a hardware upgrade is worth: +50% HBM bandwidth, 2x scale-up bandwidth, 2x HBM capacity.

Every design of the space (layout x batch) is scored at the baseline and again under each
upgrade of ``[answer] upgrades`` (a list of ``[name, dotted path, factor]``; the path is scaled by
the factor in every design, ``ctx.score(overrides={path: ("scale", factor)})``, chip price
unchanged). Under each service level (the space's constraints; the same with the tighter TPOT
``tight_tpot_s``; and with no TPOT limit, keeping the other constraints) the whole space is
re-optimized: the cheapest feasible design (``usd_per_mtok_output``) and the one with the most
``output_tokens_per_s_per_chip``. The value of an upgrade is the change of those best values
against the baseline, and the price premium per chip-hour that would cancel the saving
(``cost_before / cost_after - 1``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse import catalog, pareto
from dse.build.designs import resolve, to_batch
from dse.build.space import Constraint
from dse.perf import BOUNDS, score
from dse.questions.common import dress, layout_text, md_frame, save, subplots
from dse.questions.context import Answer, Context, Lead
from dse.spec.csvsafe import spreadsheet_safe

COST = "usd_per_mtok_output"
THRU = "output_tokens_per_s_per_chip"
LAYOUT = ("layout.tp", "layout.pp", "layout.dp", "layout.ep")
# serving settings a space may search; a design's values are shown beside its layout
SETTINGS = {"serving.max_num_tokens": "chunk", "serving.ep_overlap": "overlap",
            "serving.max_batch_size": "cap"}


def setting_text(row) -> str:
    """``chunk=1024 overlap=tbo cap=4096``: the searched serving settings of a design."""
    return " ".join(f"{k}={row[p] if isinstance(row[p], str) else int(row[p])}"
                    for p, k in SETTINGS.items() if p in row.index)


def design_text(row) -> str:
    return " ".join(x for x in (layout_text(row, LAYOUT), setting_text(row)) if x)


def scenarios(ctx: Context) -> list[tuple[str, tuple]]:
    """Service levels: (label, constraints) -- the space's, a tighter TPOT, no TPOT limit."""
    base = tuple(ctx.space.constraints)
    others = tuple(c for c in base if c.metric != "tpot_s")
    tpot = next((c.max for c in base if c.metric == "tpot_s" and c.max is not None), None)
    out = [(f"TPOT <= {tpot * 1e3:g} ms" if tpot else "space constraints", base)]
    tight = ctx.param("tight_tpot_s")
    if tight:
        out.append((f"TPOT <= {tight * 1e3:g} ms", others + (Constraint("tpot_s", max=tight),)))
    if tpot:
        out.append(("no TPOT limit", others))
    return out


def best_designs(df: pd.DataFrame, constraints, objectives) -> tuple[pd.Series, pd.Series]:
    """The cheapest and the highest-throughput admissible design of ``df``."""
    ok = pareto.admissible(df, objectives, constraints)
    if not ok.any():
        raise ValueError("no design meets the constraints")
    sub = df[ok]
    return df.loc[sub[COST].idxmin()], df.loc[sub[THRU].idxmax()]


def component_premium_pct(ctx: Context, path: str | None, factor: float) -> float:
    """What the component cost model (dse/catalog/cost_model.toml) charges for the upgrade:
    the % change of the base chip's $/chip-hour when ``path`` is scaled by ``factor``."""
    if path is None:
        return 0.0
    row = {**ctx.space.base, "cost.capex_model": "components"}
    res = resolve(pd.DataFrame([row, row]))
    res.loc[1, path] = float(res.loc[1, path]) * float(factor)
    usd = score(to_batch(res))["usd_per_chip_hour"]
    return float(100 * (usd[1] / usd[0] - 1))


def value_table(ctx: Context) -> pd.DataFrame:
    """One row per (scenario, upgrade incl. baseline): best cost and throughput, their designs,
    and the change against the baseline."""
    ups = [("baseline", None, 1.0)] + [tuple(u) for u in ctx.param("upgrades", [])]
    scored = {name: ctx.score(overrides=None if path is None else {path: ("scale", float(f))})
              for name, path, f in ups}
    premium = {name: component_premium_pct(ctx, path, f) for name, path, f in ups}
    rows = []
    for label, cons in scenarios(ctx):
        base_cost = base_thru = None
        for name, path, f in ups:
            c, t = best_designs(scored[name], cons, ctx.space.objectives)
            if base_cost is None:
                base_cost, base_thru = c[COST], t[THRU]
            rows.append({
                "slo": label, "upgrade": name, "path": path or "", "factor": float(f),
                "usd_per_mtok_output": c[COST], "cost_change_pct": 100 * (c[COST] / base_cost - 1),
                "break_even_price_premium_pct": 100 * (base_cost / c[COST] - 1),
                "component_price_premium_pct": premium[name],
                "net_cost_change_pct": 100 * (c[COST] / base_cost * (1 + premium[name] / 100) - 1),
                "cheapest_design_id": int(c["design_id"]), "cheapest_layout": design_text(c),
                "cheapest_tpot_ms": c["tpot_s"] * 1e3, "cheapest_bound": int(c["bound"]),
                "cheapest_hbm_used_fraction": c["hbm_used_fraction"],
                "cheapest_batch_per_dp_rank": c["workload.concurrency"] / c["layout.dp"],
                "tokens_per_s_per_chip": t[THRU],
                "throughput_change_pct": 100 * (t[THRU] / base_thru - 1),
                "fastest_design_id": int(t["design_id"]), "fastest_layout": design_text(t),
            })
    return pd.DataFrame(rows)


def _figure(ctx: Context, tab: pd.DataFrame) -> str:
    ups = [u for u in tab["upgrade"].unique() if u != "baseline"]
    slos = list(tab["slo"].unique())
    x = np.arange(len(ups))
    w = 0.8 / len(slos)
    fig, axes = subplots(1, 2, figsize=(11, 4.5))
    for ax, col, title in ((axes[0], "cost_change_pct", "best $ per Mtok output, % change"),
                           (axes[1], "throughput_change_pct", "best tokens/s per chip, % change")):
        for j, slo in enumerate(slos):
            v = tab[tab["slo"] == slo].set_index("upgrade")[col].reindex(ups).to_numpy()
            bars = ax.bar(x + (j - (len(slos) - 1) / 2) * w, v, w, label=slo)
            ax.bar_label(bars, fmt="%.1f", fontsize=7)
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xticks(x, ups, fontsize=8)
        dress(ax, title=title, grid="y", legend=7)
    fig.suptitle("value of each upgrade, whole space re-optimized (same chip price)")
    return save(fig, ctx, "upgrade-value.png")


def answer(ctx: Context) -> Answer:
    tab = value_table(ctx)
    slos = list(tab["slo"].unique())
    numbers = {"scenarios": slos, "rows": tab.to_dict(orient="records")}
    head = []
    for slo in slos:
        t = tab[tab["slo"] == slo].set_index("upgrade")
        head.append(_slo_line(slo, t))
        numbers[slo] = {name: {k: float(r[k]) for k in SLO_NUMBERS} for name, r in t.iterrows()}
    base = tab[tab["upgrade"] == "baseline"]
    head.append(_why_line(ctx, base))
    numbers["baseline_hbm_used_fraction_max"] = float(base["cheapest_hbm_used_fraction"].max())
    fig = _figure(ctx, tab)
    spreadsheet_safe(tab).to_csv(ctx.out / "upgrade-value.csv", index=False)
    first = tab[(tab["slo"] == slos[0]) & (tab["upgrade"] != "baseline")]["upgrade"] \
        if slos else []
    lead = tuple(Lead(f"{slos[0]}.{u}.cost_change_pct", f"{u} at {slos[0]}: cost per token",
                      "%", versus=0.0) for u in first)
    return Answer("\n".join(head), _details(ctx, tab), numbers, [fig], lead)


SLO_NUMBERS = ("cost_change_pct", "net_cost_change_pct", "component_price_premium_pct",
               "throughput_change_pct", "usd_per_mtok_output")


def _slo_line(slo: str, t: pd.DataFrame) -> str:
    """One service level: the baseline and what each upgrade changes, in words."""
    b = t.loc["baseline"]
    parts = []
    for name, r in t.drop(index="baseline").iterrows():
        won = ("same design" if r["cheapest_design_id"] == b["cheapest_design_id"]
               else r["cheapest_layout"])
        parts.append(f"{name} **{r['cost_change_pct']:+.1f}%** cost "
                     f"(worth {r['break_even_price_premium_pct']:+.1f}% per chip-hour, priced "
                     f"{r['component_price_premium_pct']:+.1f}% by the component cost model: "
                     f"net {r['net_cost_change_pct']:+.1f}%; {won}), "
                     f"{r['throughput_change_pct']:+.1f}% tokens/s/chip")
    return (f"- **{slo}:** baseline **${b['usd_per_mtok_output']:.4f}/Mtok** "
            f"({b['cheapest_layout']}, {b['tokens_per_s_per_chip']:.0f} best tokens/s/chip); "
            + "; ".join(parts) + ".")


def _why_line(ctx: Context, base: pd.DataFrame) -> str:
    """What limits the cheapest baseline designs' batch."""
    rt = catalog.serving_defaults()["runtime"]
    searched = {p.path: p.values for p in ctx.space.parameters}
    cap = (f"the space searches a runtime cap of "
           f"{' and '.join(str(int(v)) for v in searched['serving.max_batch_size'])} per rank"
           if "serving.max_batch_size" in searched else
           f"the runtime caps it at {catalog.runtime_defaults()[rt]['max_batch_size']}")
    bounds = sorted({BOUNDS[int(b)] for b in base["cheapest_bound"]})
    return (
        f"- **Why:** the cheapest baseline designs are {'/'.join(bounds)}-bound in decode, use "
        f"{100 * base['cheapest_hbm_used_fraction'].min():.0f}-"
        f"{100 * base['cheapest_hbm_used_fraction'].max():.0f}% of HBM, and run "
        f"{base['cheapest_batch_per_dp_rank'].min():.0f}-{base['cheapest_batch_per_dp_rank'].max():.0f}"
        f" sequences per attention-DP rank ({cap}): the batch is limited "
        "by the TPOT limit (prompt work and all-to-all in every step) or by the runtime cap, not "
        "by HBM capacity; faster NVLink shortens the expert all-to-all and the dense all-reduce, "
        "so a larger batch and a larger expert-parallel group fit under the same TPOT.")


TABLE = ["slo", "upgrade", "usd_per_mtok_output", "cost_change_pct",
         "break_even_price_premium_pct", "component_price_premium_pct", "net_cost_change_pct",
         "cheapest_design_id", "cheapest_layout",
         "cheapest_tpot_ms", "cheapest_bound", "cheapest_hbm_used_fraction",
         "cheapest_batch_per_dp_rank", "tokens_per_s_per_chip",
         "throughput_change_pct", "fastest_design_id", "fastest_layout"]


def _details(ctx: Context, tab: pd.DataFrame) -> str:
    ups = "; ".join(f"{n}: `{p}` x{f:g}" for n, p, f in ctx.param("upgrades", []))
    return "\n".join([
        "## Method", "",
        f"- `{ctx.space.file}`: all {ctx.space.size:,} designs scored at the baseline and under "
        f"each upgrade ({ups}) with `ctx.score(overrides=...)`; the chip price is unchanged.",
        "- Per service level, the cheapest admissible design (feasible, meets the constraints) "
        "and the admissible design with the most output tokens/s per chip; `cheapest_bound` is "
        "the decode bound of the cheapest design (0 compute, 1 memory, 2 network, 3 capacity).",
        "- 'priced ... by the component cost model': the base chip's $/chip-hour with "
        "`cost.capex_model = \"components\"` (dse/catalog/cost_model.toml: each component's share "
        "of capex and power scales with its spec) under the upgrade; 'net' = the cost change at "
        "that price.\n"
        "- 'worth ... per chip-hour': the price premium that would cancel the saving, "
        "`cost_before / cost_after - 1`.",
        "- Batch sizes are a grid (the space's `workload.concurrency`), so a change smaller "
        "than one grid step of the batch can show as 0%.",
        "", "### Best designs under each upgrade", "", md_frame(tab[TABLE]), "",
    ])
