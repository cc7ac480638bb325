"""What an NVL72 rack is worth over 8-GPU nodes for training a fine-grained MoE.

The space crosses the scale-up domain (``topology.id``: an 8-GPU node and an NVL72 rack, the
same chip) with the layouts of a fixed number of chips. Per domain, the feasible design with
the most tokens/s per chip (the layout free); the rack's worth is the ratio of the two. The
same ratio per expert-parallel degree (``layout.ep``): where the expert group crosses nodes
(ep > 8) its all-to-all runs on the scale-out NICs of the 8-GPU nodes and on NVLink in the
rack, so the ratio at ``[answer] recipe_ep`` (64: DeepSeek-V3's recipe) is what the rack is
worth to a recipe that needs that much EP, and the ratio of the best layouts what it is worth
to one that can pick its layout. The parts of the two best steps say which model term sets it.
"""

from __future__ import annotations

from dse.questions.common import Picks, dress, fmt, md_table, save, subplots
from dse.questions.context import Answer, Context, Lead
from dse.questions.train_common import (
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
DOMAIN = "topology.id"


def answer(ctx: Context) -> Answer:
    s = Picks()
    s.node, s.rack = ctx.param("node", "hgx-8"), ctx.param("rack", "nvl72")
    s.recipe_ep = int(ctx.param("recipe_ep", 64))
    df = with_layout(ctx, ctx.score())
    ok = feasible(ctx, df)
    s.best = {t: best(df, ok & (df[DOMAIN] == t).to_numpy(), METRIC) for t in (s.node, s.rack)}
    s.per_ep = best_per(df, ok, [DOMAIN, "layout.ep"], METRIC)
    s.eps = sorted(int(e) for e in s.per_ep["layout.ep"].unique())
    s.ep_ratio = {}
    for e in s.eps:
        rows = {t: s.per_ep[(s.per_ep[DOMAIN] == t) & (s.per_ep["layout.ep"] == e)]
                for t in (s.node, s.rack)}
        if all(len(r) for r in rows.values()):
            s.ep_ratio[e] = (rows[s.rack].iloc[0], rows[s.node].iloc[0])
    if s.recipe_ep not in s.ep_ratio:
        raise ValueError(f"ep={s.recipe_ep} has no feasible design in both domains")
    nums = _numbers(s)
    return Answer(_headline(ctx, s, nums), _details(ctx, s, nums), nums,
                  _figures(ctx, s) if ctx.sample is None else [], _lead(s))


def _ratio(a, b) -> float:
    return float(a[METRIC]) / float(b[METRIC])


def _numbers(s) -> dict:
    rack, node = s.best[s.rack], s.best[s.node]
    r_ep, n_ep = s.ep_ratio[s.recipe_ep]
    return {
        "worth_best_layouts": _ratio(rack, node),
        "worth_at_recipe_ep": _ratio(r_ep, n_ep),
        "recipe_ep": s.recipe_ep,
        "rack_best": {METRIC: float(rack[METRIC]), "ep": int(rack["layout.ep"]),
                      "mfu": float(rack["mfu"]), "design_id": int(rack["design_id"])},
        "node_best": {METRIC: float(node[METRIC]), "ep": int(node["layout.ep"]),
                      "mfu": float(node["mfu"]), "design_id": int(node["design_id"])},
        "worth_per_ep": {f"ep{e}": _ratio(r, n) for e, (r, n) in s.ep_ratio.items()},
        "node_recipe_exposed_comm_share": float(n_ep["network_exposed_s"] / n_ep["step_time_s"]),
        "rack_recipe_exposed_comm_share": float(r_ep["network_exposed_s"] / r_ep["step_time_s"]),
    }


def _headline(ctx, s, n) -> str:
    r_ep, n_ep = s.ep_ratio[s.recipe_ep]
    rack, node = s.best[s.rack], s.best[s.node]
    return (
        f"At the recipe's {s.recipe_ep}-way expert parallelism the {s.rack} rack trains "
        f"**{n['worth_at_recipe_ep']:.2f}x** the tokens/s per GPU of {s.node} nodes "
        f"({fmt(r_ep[METRIC])} vs {fmt(n_ep[METRIC])}): the expert all-to-all leaves the 8-GPU "
        f"node and its exposed communication is {n['node_recipe_exposed_comm_share']:.0%} of "
        f"the step there, {n['rack_recipe_exposed_comm_share']:.0%} in the rack. With the "
        f"layout free the rack is worth **{n['worth_best_layouts']:.2f}x**: the best "
        f"{s.node} design keeps its experts inside the node (ep={int(node['layout.ep'])}, "
        f"{fmt(node[METRIC])} tokens/s per GPU, MFU {node['mfu']:.1%}) and the rack's best "
        f"(ep={int(rack['layout.ep'])}) gains only what its faster pipeline and data-parallel "
        f"traffic save. What sets the recipe ratio: {terms_text(r_ep, n_ep, s.rack, s.node)}.")


def _details(ctx, s, n) -> str:
    rows = [[f"ep={e}", float(r[METRIC]), float(nd[METRIC]), float(r[METRIC] / nd[METRIC]),
             layout_text(r), layout_text(nd)] for e, (r, nd) in s.ep_ratio.items()]
    r_ep, n_ep = s.ep_ratio[s.recipe_ep]
    return (
        "## Method\n\n"
        f"Every design of the space ({ctx.space.size:,}: {', '.join(p.path for p in ctx.space.parameters)}) "
        "is scored by the training model (`dse predict --train`'s, dse/perf/train_*.py); a "
        "design that does not fit in HBM or whose layout the model cannot take is left out. "
        f"Per scale-up domain ({s.node}, {s.rack}; the same chip) and per expert-parallel "
        "degree, the feasible design with the most tokens/s per chip. The model terms that set "
        "the ratio: the expert dispatch/combine all-to-all runs on the tier its group spans "
        "(NVLink inside the domain, the scale-out NICs across it) and only the part that the "
        "training fit's `overlap_fraction` does not hide under compute is exposed; the data- "
        "and pipeline-parallel traffic follow the same tiers; compute, HBM-bound work and the "
        "pipeline bubble depend on the layout, not on the domain.\n\n"
        "## Best design per expert-parallel degree (tokens/s per GPU)\n\n"
        + md_table(["EP", f"{s.rack}", f"{s.node}", "worth", f"{s.rack} layout",
                    f"{s.node} layout"], rows)
        + "\n\n## The steps compared (seconds per optimizer step)\n\n"
        + parts_table([s.best[s.rack], s.best[s.node], r_ep, n_ep],
                      [f"{s.rack} best", f"{s.node} best", f"{s.rack} ep={s.recipe_ep}",
                       f"{s.node} ep={s.recipe_ep}"])
        + "\n\nThe layouts: " + "; ".join(
            f"{lab}: {layout_text(r)}" for lab, r in
            ((f"{s.rack} best", s.best[s.rack]), (f"{s.node} best", s.best[s.node]),
             (f"{s.rack} ep={s.recipe_ep}", r_ep), (f"{s.node} ep={s.recipe_ep}", n_ep)))
        + ".\n")


def _figures(ctx, s) -> list[str]:
    fig, ax = subplots(figsize=(7, 4.5))
    for t, mk in ((s.rack, "o-"), (s.node, "s--")):
        sub = s.per_ep[s.per_ep[DOMAIN] == t].sort_values("layout.ep")
        ax.plot(sub["layout.ep"], sub[METRIC], mk, label=t)
    ax.axvline(8, color="grey", lw=0.8, ls=":")
    ax.set_xticks(s.eps, [str(e) for e in s.eps])
    dress(ax, "expert-parallel degree ep [GPUs]", "best tokens/s per GPU [tokens/s]",
          "Best layout per EP degree", xlog=2, grid="major")
    ax.set_xticks(s.eps, [str(e) for e in s.eps])
    a = save(fig, ctx, "worth_per_ep.png")
    r_ep, n_ep = s.ep_ratio[s.recipe_ep]
    b = parts_figure(ctx, [s.best[s.rack], s.best[s.node], r_ep, n_ep],
                     [f"{s.rack}\nbest", f"{s.node}\nbest", f"{s.rack}\nep={s.recipe_ep}",
                      f"{s.node}\nep={s.recipe_ep}"], "step_parts.png",
                     "Step time in its parts", per_token=True)
    return [a, b]


def _lead(s) -> tuple:
    return (Lead("worth_at_recipe_ep", f"NVL72 over 8-GPU nodes at ep={s.recipe_ep}", "x",
                 versus=1.0),
            Lead("worth_best_layouts", "NVL72 over 8-GPU nodes, each with its best layout",
                 "x", pick="rack_best.ep", pick_label="rack's best EP", versus=1.0))


