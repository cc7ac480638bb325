"""The best layout of a ~1T-parameter MoE on a large job: expert parallelism inside the rack or
across racks.

The space crosses the layouts (tp, pp, ep, micro-batch, recomputation) of a fixed number of
chips in scale-up domains of ``domain`` chips (the topology's; ``[answer] domain``, 72 for
NVL72). An expert group's ranks are consecutive chips, so it stays inside a domain while
``ep <= domain`` and its dispatch/combine all-to-all crosses the scale-out NICs beyond. Per
expert-parallel degree the fastest feasible design (tokens/s per GPU); the answer: the fastest
overall, the fastest with the expert group inside a rack and across racks, their ratio, and the
parts of their steps that set it.

Where the space varies ``training.moe_grouped_gemm`` (how the software launches the routed
experts' GEMMs: one per local expert, what Transformer Engine 2.9 runs and the training fit was
fitted on, or one grouped kernel per fc1 and fc2), the answer gives each software case: the
fixed time per linear layer (``dse.perf.train_time.layer_linears``) makes many local experts
cost a narrow EP group only where each expert is a launch of its own. The top-level numbers are
the field's default (the calibrated software's); ``software`` holds every case's.
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
from dse.spec import train_fields

METRIC = "tokens_per_s_per_chip"
EP = "layout.ep"
SW = "training.moe_grouped_gemm"
SW_TEXT = {"per_expert": "one GEMM per local expert (Transformer Engine 2.9's GroupedLinear, the "
                         "calibrated software)",
           "single": "one grouped kernel per fc1 and fc2 (TE's opt-in grouped GEMMs)"}


def answer(ctx: Context) -> Answer:
    domain = int(ctx.param("domain", 72))
    df = with_layout(ctx, ctx.score())
    if SW not in df:
        df[SW] = ctx.space.base.get(SW, train_fields.REGISTRY[SW].default)
    ok = feasible(ctx, df)
    inside = (df[EP] <= domain).to_numpy()
    cases = {}
    for sw in train_fields.MOE_GROUPED_GEMM:
        on = ok & (df[SW] == sw).to_numpy()
        if on.any():
            cases[sw] = _picks(df, on, inside, domain, sw)
    default = train_fields.REGISTRY[SW].default
    s = cases.get(default) or next(iter(cases.values()))
    s.cases = cases
    nums = {**_numbers(s), "grouped_gemm": s.sw,
            "software": {sw: _numbers(c) for sw, c in cases.items()}}
    return Answer(_headline(s, nums), _details(ctx, s), nums,
                  _figures(ctx, s) if ctx.sample is None else [], _lead(cases, default))


def _picks(df, on, inside, domain: int, sw: str) -> Picks:
    s = Picks(domain=domain, sw=sw)
    s.best = best(df, on, METRIC)
    s.inside = best(df, on & inside, METRIC)
    s.across = best(df, on & ~inside, METRIC)
    s.per_ep = best_per(df, on, EP, METRIC)
    return s


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
    several = len(s.cases) > 1
    text = (f"With {SW_TEXT.get(s.sw, s.sw)}: " if several else "") + _case_text(s, n)
    if several:
        for sw, c in s.cases.items():
            if c is not s:
                m = n["software"][sw]
                text += (f"\n\nWith {SW_TEXT.get(sw, sw)} (`{SW} = \"{sw}\"`): "
                         + _case_text(c, m, short=True))
    return text


def _case_text(s, n, short: bool = False) -> str:
    b, i, a = s.best, s.inside, s.across
    where = "inside a rack" if int(b[EP]) <= s.domain else "across racks"
    head = (f"The fastest layout keeps the experts {where}: **{layout_text(b)}**, "
            f"{fmt(b[METRIC])} tokens/s per GPU (MFU {b['mfu']:.1%}, "
            f"{b['memory_per_chip_bytes'] / 1e9:.0f} GB per GPU). With the expert group inside "
            f"the {s.domain}-GPU rack the best is {fmt(i[METRIC])} tokens/s per GPU (ep="
            f"{int(i[EP])}); across racks {fmt(a[METRIC])} (ep={int(a[EP])}, {layout_text(a)}): "
            f"**inside is {n['inside_over_across']:.2f}x across**. What sets the ratio: "
            f"{terms_text(a, i, f'ep={int(a[EP])}', f'ep={int(i[EP])}')}")
    if short:
        return head + f"{_why(a, i)}."
    return (head + f"; the exposed communication is {n['across']['exposed_comm_share']:.0%} of "
            f"the step across racks and {n['inside']['exposed_comm_share']:.0%} inside (the "
            f"training fit hides the all-to-all under compute, `overlap_fraction`){_why(a, i)}. "
            f"A wider EP group needs less memory per GPU "
            f"({n['across']['memory_per_chip_gb']:.0f} vs "
            f"{n['inside']['memory_per_chip_gb']:.0f} GB).")


def _why(a, i) -> str:
    """Which kind of term sets the ratio: the part of the step that differs most."""
    part = max(PARTS, key=lambda k: abs(float(a[k]) - float(i[k])))
    if part == "compute_s":
        return ("; the part that differs most is compute: the routed experts' grouped GEMMs "
                "(the kernel fits' MoE model over the EP group's tokens), not the links")
    if part == "network_exposed_s":
        return "; the part that differs most is the exposed communication: the links"
    if part == "overhead_s":
        return ("; the part that differs most is the fixed per-layer time, paid per linear layer "
                "(dse.perf.train_time.layer_linears): a software launch count, not the links")
    return f"; the part that differs most is the {PARTS[part]}"


def _details(ctx, s) -> str:
    rows, picks, labels = [], [], []
    for sw, c in s.cases.items():
        rows += [[sw, int(r[EP]), "inside" if int(r[EP]) <= c.domain else "across",
                  float(r[METRIC]), float(r["mfu"]),
                  float(r["network_exposed_s"] / r["step_time_s"]),
                  float(r["overhead_s"] / r["step_time_s"]),
                  float(r["memory_per_chip_bytes"]) / 1e9, layout_text(r)]
                 for _, r in c.per_ep.iterrows()]
        picks += [c.best, c.inside, c.across]
        labels += [f"{sw}: fastest", f"{sw}: fastest inside a rack",
                   f"{sw}: fastest across racks"]
    return (
        "## Method\n\n"
        f"Every design of the space ({ctx.space.size:,}) is scored by the training model; a "
        "design that does not fit in HBM or whose layout the model cannot take (ep must divide "
        "the experts and tp x cp x dp) is left out. The model terms: the expert all-to-all on "
        "NVLink while the group fits in the domain, on the scale-out NICs for the part that "
        "leaves it, hidden under compute by the training fit's `overlap_fraction`; the grouped "
        "GEMMs' efficiency at the tokens each expert gets (the kernel fits' MoE parameters); "
        "weights, gradients and optimizer state per GPU shrink with ep; the fitted fixed time "
        "per layer, paid per linear layer the layer runs (`dse.perf.train_time.layer_linears`): "
        f"with `{SW} = \"per_expert\"` (Transformer Engine 2.9, what the fit's MoE rows ran) "
        "two per local expert (384 / ep of them), with `\"single\"` two per MoE layer.\n\n"
        "## Fastest design per expert-parallel degree\n\n"
        + md_table(["software", "EP", "group", "tokens/s per GPU", "MFU", "exposed comm share",
                    "fixed-time share", "memory per GPU [GB]", "layout"], rows)
        + "\n\n## The steps compared (seconds per optimizer step)\n\n"
        + parts_table(picks, labels) + "\n")


def _figures(ctx, s) -> list[str]:
    fig, ax = subplots(figsize=(7, 4.5))
    for sw, c in s.cases.items():
        ax.plot(c.per_ep[EP], c.per_ep[METRIC], "o-", label=f"{SW.split('.')[-1]} = {sw}")
    ax.axvline(s.domain, color="grey", lw=0.8, ls=":", label=f"rack ({s.domain} GPUs)")
    dress(ax, "expert-parallel degree ep [GPUs]", "best tokens/s per GPU [tokens/s]",
          "Fastest layout per EP degree", xlog=2, grid="major", legend=8)
    eps = sorted({int(e) for c in s.cases.values() for e in c.per_ep[EP]})
    ax.set_xticks(eps, [str(e) for e in eps])
    a = save(fig, ctx, "best_per_ep.png")
    rows, labels = [], []
    for sw, c in s.cases.items():
        rows += [c.inside, c.across]
        labels += [f"{sw}\ninside ep={int(c.inside[EP])}", f"{sw}\nacross ep={int(c.across[EP])}"]
    b = parts_figure(ctx, rows, labels, "step_parts.png",
                     "Fastest step inside a rack and across racks")
    return [a, b]


def _lead(cases, default) -> tuple:
    out = (Lead("best.tokens_per_s_per_chip", "fastest layout's tokens/s per GPU",
                "tokens/s", pick="best_ep", pick_label="fastest EP degree"),
           Lead("inside_over_across", "EP inside the rack over EP across racks", "x",
                versus=1.0))
    return out + tuple(Lead(f"software.{sw}.inside_over_across", f"EP inside the rack over "
                            f"across racks, {SW} = {sw}", "x", versus=1.0)
                       for sw in cases if sw != default)
