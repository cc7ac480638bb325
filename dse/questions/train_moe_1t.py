"""The best layout of a ~1T-parameter MoE on a large job: expert parallelism inside the rack or
across racks.

The space crosses the layouts (tp, pp, ep, micro-batch, recomputation) of a fixed number of
chips in scale-up domains of ``domain`` chips (the topology's; ``[answer] domain``, 72 for
NVL72). An expert group's ranks are consecutive chips, so it stays inside a domain while
``ep <= domain`` and its dispatch/combine all-to-all crosses the scale-out NICs beyond. Per
expert-parallel degree the fastest feasible design (tokens/s per GPU); the answer: the fastest
overall, the fastest with the expert group inside a rack and across racks, their ratio, and the
parts of their steps that set it.
"""

from __future__ import annotations

from dse.questions.common import Picks, dress, fmt, md_table, save, subplots
from dse.questions.context import Answer, Context, Lead
from dse.questions.train_common import (
    PARTS,
    best,
    best_per,
    feasible,
    layout_text,
    parts_figure,
    parts_table,
    terms_text,
    with_layout,
)

METRIC = "tokens_per_s_per_chip"
EP = "layout.ep"


def answer(ctx: Context) -> Answer:
    s = Picks(domain=int(ctx.param("domain", 72)))
    df = with_layout(ctx, ctx.score())
    ok = feasible(ctx, df)
    inside = (df[EP] <= s.domain).to_numpy()
    s.best = best(df, ok, METRIC)
    s.inside = best(df, ok & inside, METRIC)
    s.across = best(df, ok & ~inside, METRIC)
    s.per_ep = best_per(df, ok, EP, METRIC)
    nums = _numbers(s)
    return Answer(_headline(s, nums), _details(ctx, s), nums,
                  _figures(ctx, s) if ctx.sample is None else [], _lead())


def _design(r) -> dict:
    return {METRIC: float(r[METRIC]), "mfu": float(r["mfu"]), "tp": int(r["layout.tp"]),
            "pp": int(r["layout.pp"]), "ep": int(r[EP]), "design_id": int(r["design_id"]),
            "memory_per_chip_gb": float(r["memory_per_chip_bytes"]) / 1e9,
            "exposed_comm_share": float(r["network_exposed_s"] / r["step_time_s"])}


def _numbers(s) -> dict:
    return {"best": _design(s.best), "inside": _design(s.inside), "across": _design(s.across),
            "inside_over_across": float(s.inside[METRIC] / s.across[METRIC]),
            "best_ep": int(s.best[EP]), "domain": s.domain,
            "per_ep": {f"ep{int(r[EP])}": float(r[METRIC]) for _, r in s.per_ep.iterrows()}}


def _headline(s, n) -> str:
    b, i, a = s.best, s.inside, s.across
    where = "inside a rack" if int(b[EP]) <= s.domain else "across racks"
    return (
        f"The fastest layout keeps the experts {where}: **{layout_text(b)}**, "
        f"{fmt(b[METRIC])} tokens/s per GPU (MFU {b['mfu']:.1%}, "
        f"{b['memory_per_chip_bytes'] / 1e9:.0f} GB per GPU). With the expert group inside the "
        f"{s.domain}-GPU rack the best is {fmt(i[METRIC])} tokens/s per GPU (ep="
        f"{int(i[EP])}); across racks {fmt(a[METRIC])} (ep={int(a[EP])}, {layout_text(a)}): "
        f"**inside is {n['inside_over_across']:.2f}x across**. What sets the ratio: "
        f"{terms_text(a, i, f'ep={int(a[EP])}', f'ep={int(i[EP])}')}; the exposed "
        f"communication is {n['across']['exposed_comm_share']:.0%} of the step across racks and "
        f"{n['inside']['exposed_comm_share']:.0%} inside (the training fit hides the all-to-all "
        f"under compute, `overlap_fraction`){_why(a, i)}. A wider EP group needs less memory "
        f"per GPU ({n['across']['memory_per_chip_gb']:.0f} vs "
        f"{n['inside']['memory_per_chip_gb']:.0f} GB).")


def _why(a, i) -> str:
    """Which kind of term sets the ratio: the part of the step that differs most."""
    part = max(PARTS, key=lambda k: abs(float(a[k]) - float(i[k])))
    if part == "compute_s":
        return ("; the part that differs most is compute: the routed experts' grouped GEMMs "
                "(the kernel fits' MoE model over the EP group's tokens), not the links")
    if part == "network_exposed_s":
        return "; the part that differs most is the exposed communication: the links"
    return f"; the part that differs most is the {PARTS[part]}"


def _details(ctx, s) -> str:
    rows = [[int(r[EP]), "inside" if int(r[EP]) <= s.domain else "across", float(r[METRIC]),
             float(r["mfu"]), float(r["network_exposed_s"] / r["step_time_s"]),
             float(r["memory_per_chip_bytes"]) / 1e9, layout_text(r)]
            for _, r in s.per_ep.iterrows()]
    return (
        "## Method\n\n"
        f"Every design of the space ({ctx.space.size:,}) is scored by the training model; a "
        "design that does not fit in HBM or whose layout the model cannot take (ep must divide "
        "the experts and tp x cp x dp) is left out. The model terms: the expert all-to-all on "
        "NVLink while the group fits in the domain, on the scale-out NICs for the part that "
        "leaves it, hidden under compute by the training fit's `overlap_fraction`; the grouped "
        "GEMMs' efficiency at the tokens each expert gets (the kernel fits' MoE parameters); "
        "weights, gradients and optimizer state per GPU shrink with ep.\n\n"
        "## Fastest design per expert-parallel degree\n\n"
        + md_table(["EP", "group", "tokens/s per GPU", "MFU", "exposed comm share",
                    "memory per GPU [GB]", "layout"], rows)
        + "\n\n## The steps compared (seconds per optimizer step)\n\n"
        + parts_table([s.best, s.inside, s.across], ["fastest", "fastest inside a rack",
                                                     "fastest across racks"]) + "\n")


def _figures(ctx, s) -> list[str]:
    fig, ax = subplots(figsize=(7, 4.5))
    ax.plot(s.per_ep[EP], s.per_ep[METRIC], "o-")
    ax.axvline(s.domain, color="grey", lw=0.8, ls=":", label=f"rack ({s.domain} GPUs)")
    dress(ax, "expert-parallel degree ep [GPUs]", "best tokens/s per GPU [tokens/s]",
          "Fastest layout per EP degree", xlog=2, grid="major")
    eps = [int(e) for e in s.per_ep[EP]]
    ax.set_xticks(eps, [str(e) for e in eps])
    a = save(fig, ctx, "best_per_ep.png")
    b = parts_figure(ctx, [s.inside, s.across], [f"inside\nep={int(s.inside[EP])}",
                                                 f"across\nep={int(s.across[EP])}"],
                     "step_parts.png", "Fastest step inside a rack and across racks")
    return [a, b]


def _lead() -> tuple:
    return (Lead("best.tokens_per_s_per_chip", "fastest layout's tokens/s per GPU",
                 "tokens/s", pick="best_ep", pick_label="fastest EP degree"),
            Lead("inside_over_across", "EP inside the rack over EP across racks", "x",
                 versus=1.0))
