"""What it costs to train a dense model per trillion tokens on each chip.

The space crosses ``accelerator.id`` with the layouts of a fixed number of chips. Per chip, the
feasible design with the lowest ``usd_per_trillion_tokens`` (chip-hours per trillion tokens x
the catalog's rental $/chip-hour); its chip-hours, tokens/s per chip, MFU and step parts, and
its cost over the ``[answer] reference`` chip's. The cost is ``price / (tokens/s per chip)``:
the price is a catalog number (no band), the throughput the model's, so what sets a ratio is
the price ratio times the throughput ratio, and the parts of the two steps say where the
throughput ratio comes from.
"""

from __future__ import annotations

from dse.questions.common import Picks, dress, fmt, md_table, save, subplots
from dse.questions.context import Answer, Context, Lead
from dse.questions.train_common import (
    best_per,
    feasible,
    layout_text,
    parts_figure,
    parts_table,
    terms_text,
    with_layout,
)

COST = "usd_per_trillion_tokens"
CHIP = "accelerator.id"


def answer(ctx: Context) -> Answer:
    s = Picks()
    df = with_layout(ctx, ctx.score())
    s.ref = ctx.param("reference", "h100-sxm")
    s.per = best_per(df, feasible(ctx, df), CHIP, COST, maximize=False)
    s.chips = [c for c in ctx.space.parameters[0].values if c in set(s.per[CHIP])] \
        if ctx.space.parameters[0].path == CHIP else list(s.per[CHIP])
    s.rows = {c: s.per[s.per[CHIP] == c].iloc[0] for c in s.chips}
    s.missing = [c for c in dict.fromkeys(df[CHIP]) if c not in s.rows]
    if s.ref not in s.rows:
        raise ValueError(f"the reference chip {s.ref} has no feasible design")
    s.cheapest = min(s.rows, key=lambda c: float(s.rows[c][COST]))
    nums = _numbers(s)
    return Answer(_headline(s, nums), _details(ctx, s), nums,
                  _figures(ctx, s) if ctx.sample is None else [], _lead(s))


def _numbers(s) -> dict:
    ref = float(s.rows[s.ref][COST])
    out = {"cheapest_chip": s.cheapest, "cheapest_usd_per_trillion_tokens":
           float(s.rows[s.cheapest][COST]),
           "cheapest_musd_per_trillion_tokens": float(s.rows[s.cheapest][COST]) / 1e6}
    for c, r in s.rows.items():
        out[c] = {"usd_per_trillion_tokens": float(r[COST]),
                  "chip_hours_per_trillion_tokens": float(r["chip_hours_per_trillion_tokens"]),
                  "tokens_per_s_per_chip": float(r["tokens_per_s_per_chip"]),
                  "mfu": float(r["mfu"]), "cost_over_reference": float(r[COST]) / ref,
                  "usd_per_chip_hour": float(r[COST] / r["chip_hours_per_trillion_tokens"]),
                  "train_time_days": float(r["train_time_s"]) / 86400.0}
    return out


def _headline(s, n) -> str:
    ref = s.rows[s.ref]
    parts = []
    for c in s.chips:
        x = n[c]
        parts.append(f"{c} ${x['usd_per_trillion_tokens'] / 1e6:.2f}M "
                     f"({fmt(x['chip_hours_per_trillion_tokens'] / 1e6)}M chip-hours at "
                     f"${x['usd_per_chip_hour']:.2f}/h, MFU {x['mfu']:.0%})")
    # what sets the cheapest chip's lead: its step against the reference's (or, where the
    # reference is the cheapest, the runner-up's against it), per token, and the price ratio
    other = s.cheapest if s.cheapest != s.ref else \
        sorted(s.rows, key=lambda c: float(s.rows[c][COST]))[1] if len(s.rows) > 1 else None
    why = ""
    if other is not None:
        o = s.rows[other]
        why = (f" {other} against {s.ref}: {n[other]['usd_per_chip_hour'] / n[s.ref]['usd_per_chip_hour']:.2f}x "
               f"the price per chip-hour for {float(o['tokens_per_s_per_chip'] / ref['tokens_per_s_per_chip']):.2f}x "
               f"the tokens/s per chip; per step (the same tokens per chip in both): "
               f"{terms_text(ref, o, s.ref, other)}.")
    miss = (f" {', '.join(s.missing)}: no layout of the space fits in HBM or is valid."
            if s.missing else "")
    return ("Per trillion training tokens, each chip at its cheapest layout: "
            + "; ".join(parts) + f". **The cheapest is {s.cheapest}, "
            f"${n['cheapest_usd_per_trillion_tokens'] / 1e6:.2f}M per trillion tokens**; the "
            "cost is the catalog's rental price (no band) over the model's tokens/s per chip "
            "(banded)." + why + miss)


def _details(ctx, s) -> str:
    rows = [[c, layout_text(r), float(r[COST]) / 1e6, float(r["chip_hours_per_trillion_tokens"]) / 1e3,
             float(r["tokens_per_s_per_chip"]), float(r["mfu"]),
             float(r["train_time_s"]) / 86400.0, float(r[COST]) / float(s.rows[s.ref][COST])]
            for c, r in s.rows.items()]
    tokens = float(ctx.space.base.get("training.tokens", 0.0))
    return (
        "## Method\n\n"
        f"Every design of the space ({ctx.space.size:,}) is scored by the training model; per "
        "chip the feasible design (fits in HBM, valid layout) with the lowest dollars per "
        "trillion tokens. Dollars per trillion tokens = chip-hours per trillion tokens x the "
        "catalog's $/chip-hour (dse/catalog/accelerators.toml `[*.price]`: rental estimates; "
        "the TPU's is Google Cloud's on-demand list price, the GPUs' market rental rates, so "
        "the comparison is of those prices). The model terms that set a chip's throughput: "
        "its peak FLOP/s and the kernel fits' large-GEMM fraction (times the training fit's "
        "`compute_fraction_scale`), the per-layer time, the collectives on its scale-up "
        "domain (an 8-GPU node, an NVL72 rack, the TPU's ICI torus) and the pipeline bubble."
        "\n\n## Cheapest design per chip\n\n"
        + md_table(["chip", "layout", "$M per T tokens", "k chip-hours per T tokens",
                    "tokens/s per chip", "MFU", f"days for {tokens / 1e12:g}T tokens",
                    f"cost over {s.ref}"], rows)
        + "\n\n## Their steps (seconds per optimizer step)\n\n"
        + parts_table(list(s.rows.values()), list(s.rows)) + "\n")


def _figures(ctx, s) -> list[str]:
    fig, ax = subplots(figsize=(7, 4.5))
    v = [float(s.rows[c][COST]) / 1e6 for c in s.chips]
    ax.bar(range(len(v)), v, 0.6, color="#4a7")
    ax.set_xticks(range(len(v)), s.chips)
    dress(ax, "chip", "training cost [$M per trillion tokens]",
          "Cheapest layout per chip", grid="y", legend=None)
    a = save(fig, ctx, "cost_per_chip.png")
    b = parts_figure(ctx, [s.rows[c] for c in s.chips], s.chips, "step_parts.png",
                     "Time per token per chip, in the step's parts", per_token=True)
    return [a, b]


def _lead(s) -> tuple:
    out = [Lead("cheapest_musd_per_trillion_tokens", "cheapest chip's cost per trillion tokens",
                "million USD", pick="cheapest_chip", pick_label="cheapest chip")]
    out += [Lead(f"{c}.cost_over_reference", f"{c} cost over {s.ref}", "x", versus=1.0)
            for c in s.chips if c != s.ref]
    return tuple(out)
