"""Pipelining across nodes: when does the scale-out hop stop limiting the step?

How dse models it (``dse/perf/step.py``, ``network.py``, ``serve.py``): with ``pp`` stages the
batch is split into ``pp`` micro-batches; every stage step of a micro-batch ends with a
point-to-point hand-off of its tokens' activations (``hidden x 2`` bytes per token, each of the
``tp`` ranks sending its ``1/tp`` slice) to the next stage: ``latency + bytes / bandwidth`` on the
scale-out tier when the instance (``tp x dp x pp`` chips) is larger than the scale-up domain. The
hand-off is its own op (``pipeline``) and is added to the stage step; a token of a sequence
takes ``pp`` stage steps (TPOT = ``pp`` x the mean stage step).

For every feasible design of the space (pipeline depth x scale-out bandwidth x batch) the
analysis computes the hop's share of the mean stage step from the per-op breakdown (the
decode-only and the prompt-carrying steps, weighted as ``serve.score`` weights them), and:

- per bandwidth, the largest batch at which the hop stays under ``hop_share_max`` (the share
  grows with the batch: the latency is fixed, the bytes grow with the tokens);
- the scale-out bandwidth at which the hop reaches ``hop_share_max`` for the most exposed
  design (deepest pipeline, largest batch) and for the cheapest design under the SLO, solved
  exactly (the hop is affine in 1/bandwidth and nothing else in the step depends on it);
- the cheapest design under the SLO per pipeline depth and bandwidth (cost, TPOT, hop share).
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

PP = "layout.pp"
BW = "topology.scaleout.link_bw_bytes_per_s"
LAT = "topology.scaleout_latency_s"
BATCH = "workload.concurrency"


def hop_times(ctx: Context, rows: pd.DataFrame, values: dict | None = None) -> pd.DataFrame:
    """The pipeline hop and the whole mean stage step (seconds) of ``rows``."""
    vals = values or param_values(ctx, rows)
    dec = op_times(ctx, vals, "decode")
    mix = op_times(ctx, vals, "mixed")
    t_mean = rows["tpot_s"].to_numpy() / rows[PP].to_numpy()
    spread = mix["total_s"].to_numpy() - dec["total_s"].to_numpy()
    # the share of steps that carry prompt tokens, as serve.score weighs them
    w = np.clip((t_mean - dec["total_s"].to_numpy()) / np.where(spread > 0, spread, np.inf), 0, 1)
    hop = w * mix["pipeline_s"].to_numpy() + (1 - w) * dec["pipeline_s"].to_numpy()
    return pd.DataFrame({"hop_s": hop, "stage_step_s": t_mean, "hop_share": hop / t_mean},
                        index=rows.index)


def bandwidth_for_share(ctx: Context, row: pd.Series, share: float) -> float:
    """The scale-out bandwidth (bytes/s per chip) at which ``row``'s hop is ``share`` of its
    stage step: hop = a + c / bw and the rest of the step does not depend on bw."""
    bws = np.array([row[BW], 2.0 * row[BW]])
    vals = {p.path: np.repeat(row[p.path], 2) for p in ctx.space.parameters}
    vals[BW] = bws
    sc = ctx.score(values=vals)
    h = hop_times(ctx, sc, vals)
    hop, step = h["hop_s"].to_numpy(), h["stage_step_s"].to_numpy()
    c = (hop[0] - hop[1]) / (1 / bws[0] - 1 / bws[1])
    a = hop[0] - c / bws[0]
    rest = step[0] - hop[0]
    target = share / (1.0 - share) * rest
    return float(c / (target - a)) if target > a else float("inf")


def latency_for_share(ctx: Context, row: pd.Series, share: float) -> float:
    """The scale-out hop latency (s) at which ``row``'s hop is ``share`` of its stage step: the
    hop is latency + bytes / bandwidth and the rest of the step does not depend on it."""
    lats = np.array([row[LAT], 2.0 * row[LAT] + 1e-6])
    vals = {p.path: np.repeat(row[p.path], 2) for p in ctx.space.parameters}
    vals[LAT] = lats
    h = hop_times(ctx, ctx.score(values=vals), vals)
    hop, step = h["hop_s"].to_numpy(), h["stage_step_s"].to_numpy()
    per_lat = (hop[1] - hop[0]) / (lats[1] - lats[0])      # hops per step (1 per stage step)
    rest = step[0] - hop[0]
    target = share / (1.0 - share) * rest
    return float(lats[0] + (target - hop[0]) / per_lat) if per_lat > 0 else float("inf")


def latency_sweep(ctx: Context, f: pd.DataFrame, ok: np.ndarray, share: float) -> pd.DataFrame:
    """Per hop latency: the cheapest design under the SLO, its depth, batch and hop share, and the
    largest hop share of any feasible design."""
    out = []
    for lat, g in f.groupby(LAT):
        sub = g[ok[g.index]]
        if sub.empty:
            continue
        b = sub.loc[sub["usd_per_mtok_output"].idxmin()]
        out.append({"hop_latency_us": lat * 1e6, "design_id": int(b["design_id"]),
                    "pp": int(b[PP]), "batch": int(b[BATCH]),
                    "scaleout_gbit_per_s": b[BW] * 8 / 1e9,
                    "usd_per_mtok_output": float(b["usd_per_mtok_output"]),
                    "tpot_ms": float(b["tpot_s"]) * 1e3, "hop_share": float(b["hop_share"]),
                    "max_hop_share_feasible": float(g["hop_share"].max()),
                    "designs_over_share": int((g["hop_share"] >= share).sum())})
    return pd.DataFrame(out)


def _max_batch_under(f: pd.DataFrame, share: float) -> pd.DataFrame:
    """Per (pp, bandwidth): the largest feasible batch whose hop share is under ``share``, and
    the largest feasible batch at all."""
    out = []
    for (pp, bw), g in f.groupby([PP, BW]):
        under = g[g["hop_share"] < share]
        out.append({"pp": int(pp), "scaleout_gbit_per_s": bw * 8 / 1e9,
                    "max_feasible_batch": int(g[BATCH].max()),
                    "max_batch_hop_under": int(under[BATCH].max()) if len(under) else 0,
                    "hop_share_at_max_batch": float(g.loc[g[BATCH].idxmax(), "hop_share"])})
    return pd.DataFrame(out)


def _figure(ctx: Context, s: Picks) -> str:
    f, best, share = s.f, s.best, s.share
    fig, axes = subplots(1, 2, figsize=(11, 4.5))
    deep = f[PP].max()
    ax = axes[0]
    for bw, g in f[f[PP] == deep].groupby(BW):
        g = g.sort_values(BATCH)
        ax.plot(g[BATCH], 100 * g["hop_share"], "o-", ms=3, label=f"{bw * 8 / 1e9:g} Gb/s")
    ax.axhline(100 * share, color="k", ls="--", lw=0.8, label=f"{100 * share:g}%")
    dress(ax, "batch (concurrent sequences)", "pipeline hop, % of the stage step",
          f"pp={int(deep)}: hop share vs batch, per scale-out bandwidth", xlog=2, ylog=10,
          legend=7)
    ax = axes[1]
    for pp, g in best.groupby(PP):
        g = g.sort_values(BW)
        ax.plot(g[BW] * 8 / 1e9, g["usd_per_mtok_output"], "o-", label=f"pp={int(pp)}")
    dress(ax, "scale-out bandwidth per GPU (Gb/s)", "best $ per Mtok output under the SLO",
          "cheapest design per pipeline depth", xlog=10, legend=7)
    return save(fig, ctx, "pipeline-hop.png")


def catalog_bw_bytes_per_s(ctx: Context) -> float:
    """The base design's scale-out bandwidth per chip from the catalog (chip NIC / fabric
    oversubscription), as dse derives it."""
    acc = catalog.accelerators()[ctx.space.base["accelerator.id"]]
    topo_id = ctx.space.base.get("topology.id") or acc.default_topology
    return acc.scaleout_link_bw_bytes_per_s / catalog.topologies()[topo_id].scaleout_oversubscription


def answer(ctx: Context) -> Answer:
    s = _at_first_latency(ctx, float(ctx.param("hop_share_max", 0.10)))
    s.ref_bw = catalog_bw_bytes_per_s(ctx)
    s.worst, s.best, s.cheapest = _picks(s)
    # the scale-out bandwidth below which the hop passes the share, and the batch above which
    s.bw_worst = bandwidth_for_share(ctx, s.worst, s.share)
    s.bw_cheap = bandwidth_for_share(ctx, s.cheapest, s.share)
    s.limits = _max_batch_under(s.f, s.share)
    # what the link is worth: the best cost at the slowest bandwidth against the catalog's
    s.lo_bw = float(s.f[BW].min())
    s.slow_pct, s.pp_pct, s.jump = _link_worth(s)
    # and where the space sweeps the hop latency, the same over it
    s.sweep, s.lat_cheap = _sweep(ctx, s) if len(s.lats) > 1 else (pd.DataFrame(), None)
    if s.lat_cheap is not None and not np.isfinite(s.lat_cheap):
        s.lat_cheap = None        # the cheapest design has no hop (pp = 1)
    return Answer(_headline(ctx, s), _details(ctx, s), _numbers(s), [_figure(ctx, s)],
                  _lead(s))


def _at_first_latency(ctx: Context, share: float) -> Picks:
    """The space scored, and its designs at the first (or the base design's) hop latency: all
    of them (``df``, ``ok`` the admissible ones), the feasible ones with their hop times
    (``f``) and the admissible ones among those (``sub``)."""
    s = Picks(share=share, full=ctx.score())
    s.ok_full = admissible(ctx, s.full)
    s.lats = sorted(s.full[LAT].unique()) if LAT in s.full else []
    if s.lats:
        s.ref_lat = float(s.lats[0])
    else:
        s.ref_lat = float(resolve(pd.DataFrame([ctx.space.base]))[LAT].iloc[0])
    df = s.full[s.full[LAT] == s.ref_lat] if s.lats else s.full
    s.ok = s.ok_full[df.index.to_numpy()]
    s.df = df.reset_index(drop=True)
    f = s.df[s.df["feasible"]].copy()
    s.f = f.join(hop_times(ctx, f))
    s.sub = s.f[s.ok[s.f.index]]
    return s


def _picks(s: Picks):
    """The most exposed design (the largest hop share of the deepest pipeline), the cheapest
    design under the SLO per depth and bandwidth, and the cheapest of those at the catalog's
    bandwidth."""
    f = s.f
    worst = f.loc[f[f[PP] == int(f[PP].max())]["hop_share"].idxmax()]
    best = best_per(s.sub, [PP, BW], "usd_per_mtok_output")
    at_ref = best[np.isclose(best[BW], s.ref_bw)]
    return worst, best, at_ref.loc[at_ref["usd_per_mtok_output"].idxmin()]


def _link_worth(s: Picks):
    """The best cost under the SLO at the slowest link against the catalog's bandwidth (%),
    the same per depth, and the depth that changes most (its designs by bandwidth)."""
    best, lo_bw, at = s.best, s.lo_bw, s.cheapest[BW]
    per_bw = best.groupby(BW)["usd_per_mtok_output"].min()
    slow_pct = float(100 * (per_bw.loc[lo_bw] / per_bw.loc[at] - 1))
    per_pp = best.pivot_table(index=PP, columns=BW, values="usd_per_mtok_output")
    pp_pct = 100 * (per_pp[lo_bw] / per_pp[at] - 1)
    return slow_pct, pp_pct, best[best[PP] == int(pp_pct.idxmax())].set_index(BW)


def _sweep(ctx: Context, s: Picks):
    """Over every hop latency of the space: the cheapest design under the SLO per latency, and
    the latency at which the cheapest design's hop reaches the share."""
    fa = s.full[s.full["feasible"]].copy()
    fa = fa.join(hop_times(ctx, fa))
    return (latency_sweep(ctx, fa, s.ok_full, s.share),
            latency_for_share(ctx, s.cheapest, s.share))


def _numbers(s: Picks) -> dict:
    f, worst, cheapest = s.f, s.worst, s.cheapest
    numbers = {
        "hop_share_max": s.share,
        "max_hop_share_feasible": float(f["hop_share"].max()),
        "max_hop_share_under_slo": float(s.sub["hop_share"].max()),
        "worst_design_id": int(worst["design_id"]), "worst_pp": int(worst[PP]),
        "worst_batch": int(worst[BATCH]), "worst_bw_bytes_per_s": float(worst[BW]),
        "bw_for_share_worst_bytes_per_s": s.bw_worst,
        "cheapest_design_id": int(cheapest["design_id"]), "cheapest_pp": int(cheapest[PP]),
        "cheapest_batch": int(cheapest[BATCH]),
        "cheapest_usd_per_mtok_output": float(cheapest["usd_per_mtok_output"]),
        "cheapest_hop_share": float(cheapest["hop_share"]),
        "bw_for_share_cheapest_bytes_per_s": s.bw_cheap if np.isfinite(s.bw_cheap) else None,
        "network_bound_designs": int((f["bound"] == 2).sum()), "feasible_designs": len(f),
        "reference_bw_bytes_per_s": s.ref_bw, "slowest_bw_bytes_per_s": s.lo_bw,
        "best_cost_increase_at_slowest_bw_pct": s.slow_pct,
        "max_cost_increase_one_pp_at_slowest_bw_pct": float(s.pp_pct.max()),
        "pp1_infeasible": _pp1_infeasible(s.df),
    }
    if len(s.lats) > 1:
        numbers["latency_sweep"] = s.sweep.to_dict(orient="records")
        numbers["latency_for_share_cheapest_s"] = s.lat_cheap
    return numbers


def _pp1_infeasible(df: pd.DataFrame) -> bool:
    return int((df[PP] == 1).sum()) > 0 and not bool(df.loc[df[PP] == 1, "feasible"].any())


def _gb(v):
    return v * 8 / 1e9


def _headline(ctx: Context, s: Picks) -> str:
    f, share, worst, cheapest, lo_bw = s.f, s.share, s.worst, s.cheapest, s.lo_bw
    stage = int(ctx.space.base.get("layout.tp", 1)) * int(ctx.space.base.get("layout.dp", 1))
    model = ctx.space.base.get("model.id", "the model")
    head = [
        f"- **At {s.ref_lat * 1e6:g} us per hop** ({model}): over all {len(f):,} feasible designs "
        f"(pp up to {int(f[PP].max())} stages of {stage} chips, batch up to "
        f"{int(f[BATCH].max())}, {_gb(lo_bw):g} to {_gb(f[BW].max()):g} Gb/s per GPU) the "
        f"stage-to-stage hop is at most **{100 * f['hop_share'].max():.1f}%** of the stage "
        f"step ({100 * s.sub['hop_share'].max():.1f}% among designs meeting {slo_text(ctx)}); "
        f"{int((f['bound'] == 2).sum())} designs are network-bound.",
        f"- **Bandwidth threshold:** the hop reaches {100 * share:g}% of the step only below "
        f"**{_gb(s.bw_worst):.1f} Gb/s per GPU** for the most exposed design (pp={int(worst[PP])}, "
        f"batch {int(worst[BATCH])}), " + _cheapest_text(s),
        "- **Batch threshold:** the hop's share grows with the batch (a fixed latency plus "
        "bytes per token); " + _batch_text(s),
        _link_line(s),
    ]
    if len(s.lats) > 1:
        head.append(_sweep_line(s))
    return "\n".join(head)


def _cheapest_text(s: Picks) -> str:
    """The cheapest design under the SLO and its bandwidth threshold (none without a hop)."""
    c = s.cheapest
    what = (f"(pp={int(c[PP])}, batch {int(c[BATCH])}, ${c['usd_per_mtok_output']:.2f}/Mtok "
            f"output")
    if int(c[PP]) == 1:
        return (f"while the cheapest design under the SLO at the catalog's {_gb(s.ref_bw):g} "
                f"Gb/s runs in one stage {what}): it has no stage-to-stage hop at all.")
    return (f"and below **{_gb(s.bw_cheap):.1f} Gb/s** for the cheapest design under the SLO at "
            f"the catalog's {_gb(s.ref_bw):g} Gb/s {what}; its hop is "
            f"{100 * c['hop_share']:.2f}% of the step).")


def _batch_text(s: Picks) -> str:
    """Whether the hop passes the share at the slowest link, and above which batch."""
    share, lo_bw = s.share, s.lo_bw
    low = s.limits[np.isclose(s.limits["scaleout_gbit_per_s"], _gb(lo_bw))]
    over = low[low["max_batch_hop_under"] < low["max_feasible_batch"]]
    if over.empty:
        return (f"even at the slowest link ({_gb(lo_bw):g} Gb/s) it stays under "
                f"{100 * share:g}% at every feasible batch (at most "
                f"{100 * low['hop_share_at_max_batch'].max():.1f}%, at the largest batch "
                f"of the deepest pipeline).")
    return (f"at the slowest link ({_gb(lo_bw):g} Gb/s) it passes {100 * share:g}% above "
            + ", ".join(f"batch {int(r['max_batch_hop_under'])} (pp={int(r['pp'])})"
                        for _, r in over.iterrows()) + ".")


def _link_line(s: Picks) -> str:
    """What the scale-out link is worth: the best cost at the slowest link, overall and for
    the depth that changes most."""
    lo_bw, at, jump = s.lo_bw, s.cheapest[BW], s.jump
    return (f"- **What the link is worth:** the best cost under the SLO is "
            f"**{s.slow_pct:+.1f}%** at {_gb(lo_bw):g} Gb/s vs {_gb(s.ref_bw):g} Gb/s. For a "
            f"fixed depth the change can be larger (pp={int(s.pp_pct.idxmax())}: "
            f"{s.pp_pct.max():+.0f}%, ${jump.loc[lo_bw, 'usd_per_mtok_output']:.2f} vs "
            f"${jump.loc[at, 'usd_per_mtok_output']:.2f})"
            + (f" when the hop's few percent push the TPOT over the SLO at one batch and the next "
               f"smaller batch of the grid ({int(jump.loc[lo_bw, BATCH])} instead of "
               f"{int(jump.loc[at, BATCH])}) is used."
               if int(jump.loc[lo_bw, BATCH]) != int(jump.loc[at, BATCH]) else ".")
            + (" Pipelining is needed only for capacity (pp=1 does not fit) and buys no "
               "speed: a token passes every stage in turn." if _pp1_infeasible(s.df) else ""))


def _sweep_line(s: Picks) -> str:
    lats, share, first, last = s.lats, s.share, s.sweep.iloc[0], s.sweep.iloc[-1]
    return (
        f"- **Hop latency {lats[0] * 1e6:g} us to {lats[-1] * 1e3:g} ms** (a rack-to-rack hop "
        f"through NIC, top-of-rack and data-centre switches: 'a few milliseconds, but it "
        f"could be off by an order of magnitude', `podcast.md`): the best cost under the SLO "
        f"goes ${first['usd_per_mtok_output']:.3f} -> ${last['usd_per_mtok_output']:.3f}/Mtok "
        f"({100 * (last['usd_per_mtok_output'] / first['usd_per_mtok_output'] - 1):+.0f}%; "
        f"pp={int(first['pp'])} -> pp={int(last['pp'])}, batch {int(first['batch'])} -> "
        f"{int(last['batch'])}); " + (
            f"the cheapest design's hop reaches {100 * share:g}% of its step at "
            f"**{s.lat_cheap * 1e3:.2f} ms** per hop" if s.lat_cheap is not None else
            "the cheapest design runs in one stage (pp=1): no hop latency reaches it") +
        f"; at {lats[-1] * 1e3:g} ms "
        f"{int(last['designs_over_share']):,} feasible designs have the hop above "
        f"{100 * share:g}% (largest share {100 * last['max_hop_share_feasible']:.0f}%).")


def _details(ctx: Context, s: Picks) -> str:
    slo, share = slo_text(ctx), s.share
    bt = in_units(s.best[[PP, BW, "design_id", BATCH, "usd_per_mtok_output", "tpot_s", "ttft_s",
                          "hop_s", "stage_step_s", "hop_share"]],
                  {BW: ("scaleout_gbit_per_s", _gb), "tpot_s": ("tpot_ms", 1e3),
                   "hop_s": ("hop_us", 1e6), "stage_step_s": ("stage_step_ms", 1e3)})
    return "\n".join([
        "## Method", "",
        f"- `{ctx.space.file}`: {len(s.df):,} designs, {len(s.f):,} feasible, {int(s.ok.sum()):,} "
        f"meet {slo}.",
        "- Hop share: the `pipeline` op of the per-op breakdown (`dse.perf.score(breakdown=True)`)"
        " of the decode-only and the prompt-carrying stage steps, weighted as the scorer weighs "
        "them into the mean stage step (TPOT / pp), divided by that mean step.",
        f"- Bandwidth thresholds: the design is re-scored at its bandwidth and twice it "
        f"(`ctx.score(values=...)`); the hop is `a + c / bw` and the rest of the step is "
        f"unchanged, so the bandwidth at which hop = {100 * share:g}% of the step is solved "
        f"exactly. Most exposed design: design {int(s.worst['design_id'])}; cheapest under the "
        f"SLO: design {int(s.cheapest['design_id'])}.",
        "", f"### Cheapest design per pipeline depth and bandwidth ({slo})", "", md_frame(bt), "",
        f"### Largest batch with the hop under {100 * share:g}% of the step "
        f"({s.ref_lat * 1e6:g} us per hop)", "",
        md_frame(s.limits), "",
        *(["### Per hop latency: the cheapest design under the SLO", "", md_frame(s.sweep), ""]
          if len(s.sweep) else []),
        *NOT_MODELLED,
    ])


NOT_MODELLED = [
    "## What dse does not model (pipelines across nodes and racks)", "",
    "- The hand-off is added to the stage step, never overlapped with the next "
    "micro-batch's compute (the `pipeline` op has no compute or memory time, so "
    "`network_overlap_fraction` cannot hide it): the shares above are upper bounds.",
    "- One flag decides the tier of every hop: if the whole instance (tp x dp x pp) is larger "
    "than the scale-up domain, every stage boundary pays the scale-out link, even the ones "
    "inside a domain (e.g. tp=2, pp=8 on 8-GPU nodes: 1 boundary of 7 really leaves a node). "
    "Where each stage is exactly one domain (tp x dp = the domain) this is exact.",
    "- There is one scale-out tier: a hop between nodes of the same rack and a hop between "
    "racks cost the same (`rack_chips` only scales the per-rack throughput), so 'across "
    "racks' means 'across scale-up domains'.",
    "- The number of micro-batches is fixed at pp (batch / pp sequences each), so the "
    "micro-batch size is not a free parameter; the pipeline bubble of a finite number of "
    "micro-batches and the receiving side's all-gather of the tp slices are not modelled.",
]


def _lead(s: Picks) -> tuple:
    return (Lead("max_hop_share_feasible", f"Largest hop share of the stage step at "
                 f"{s.ref_lat * 1e6:g} us per hop", "share", pick="worst_design_id",
                 pick_label="most exposed design"),
            Lead("best_cost_increase_at_slowest_bw_pct", f"Best cost under the SLO at "
                 f"{_gb(s.lo_bw):g} Gb/s vs {_gb(s.ref_bw):g} Gb/s", "%", pick="cheapest_design_id",
                 pick_label="cheapest design", versus=0.0))
