"""What does a "fast mode" cost? The price multiple of serving at ``speedup`` x the tokens/s/user.

The space is one model on one rack: layouts (tp x attention-dp x ep) x a log grid of batch sizes.
Every admissible design (feasible, within the space's constraints) is scored again in float64
(``ctx.score``). The *baseline* is the cheapest design ($/Mtok output) that streams at least
``baseline_min_tokens_per_s_per_user`` (the normal offering; 0 means the unconstrained cost
optimum); the *fast mode* is the cheapest design with at least ``speedup`` x the baseline's
tokens/s/user. The answer is the ratio of their $/Mtok output, the designs behind both, and the
same multiple for the ``speedups`` table, from the baseline and from the unconstrained optimum.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse import pareto
from dse.questions.common import (
    Picks,
    admissible_designs,
    describe,
    dress,
    layout_pairs,
    limits_text,
    md_table,
    save,
    space_text,
    subplots,
)
from dse.questions.context import Answer, Context, Lead

COST = "usd_per_mtok_output"
SPEED = "output_tokens_per_s_per_user"
BATCH = "workload.concurrency"
LAYOUT = ("layout.tp", "layout.dp", "layout.ep")


def front_of(df: pd.DataFrame, x: str = SPEED, y: str = COST) -> pd.DataFrame:
    """The designs of ``df`` no other beats on both higher ``x`` and lower ``y``, sorted by x."""
    F = np.column_stack([-df[x].to_numpy(float), df[y].to_numpy(float)])
    return df[pareto.nondominated(F)].sort_values(x).reset_index(drop=True)


# ---------------------------------------------------------------- the fast-mode question

def cheapest(df: pd.DataFrame, min_speed: float):
    """The cheapest design streaming at least ``min_speed`` tokens/s/user (None if none does)."""
    ok = df[df[SPEED] >= min_speed * (1.0 - 1e-12)]
    return None if ok.empty else ok.loc[ok[COST].idxmin()]


def multiple(df: pd.DataFrame, base, speedup: float):
    fast = cheapest(df, speedup * base[SPEED])
    return fast, (np.nan if fast is None else fast[COST] / base[COST])


def speedup_for(df: pd.DataFrame, base, price_multiple: float):
    """The fastest design whose $/Mtok output is at most ``price_multiple`` x the baseline's."""
    ok = df[df[COST] <= price_multiple * base[COST]]
    return ok.loc[ok[SPEED].idxmax()]


def _figure_front(ctx: Context, s: Picks) -> str:
    df, front, base, fast, opt = s.df, front_of(s.df), s.base, s.fast, s.opt
    fig, ax = subplots(figsize=(7, 5))
    ax.scatter(df[SPEED], df[COST], s=5, c="#cccccc", label="admissible designs")
    ax.plot(front[SPEED], front[COST], "-o", ms=3, c="#d62728", lw=1,
            label="front: cheapest at each speed")
    ax.scatter([opt[SPEED]], [opt[COST]], s=90, marker="s", facecolors="none", edgecolors="k",
               label=f"cost optimum (batch {int(opt[BATCH])})")
    ax.scatter([base[SPEED]], [base[COST]], s=120, marker="*", c="#1f77b4", zorder=5,
               label=f"baseline (batch {int(base[BATCH])})")
    if fast is not None:
        ax.scatter([fast[SPEED]], [fast[COST]], s=120, marker="*", c="#ff7f0e", zorder=5,
                   label=f"fast mode {s.speedup:g}x (batch {int(fast[BATCH])})")
    ax.axvline(s.speedup * base[SPEED], c="#ff7f0e", ls=":", lw=1)
    dress(ax, "output tokens/s per user", "$ per million output tokens",
          "fast mode: cost vs interactivity", xlog=10, ylog=10,
          legend={"fontsize": 8, "loc": "upper left"})
    return save(fig, ctx, "fast-mode-front.png")


def _figure_multiple(ctx: Context, s: Picks) -> str:
    df = s.df
    bases = {f"baseline: cheapest at >= {s.floor:g} tok/s/user": s.base,
             "baseline: unconstrained cost optimum": s.opt}
    fig, ax = subplots(figsize=(7, 4.5))
    for label, base in bases.items():
        top = df[SPEED].max() / base[SPEED]
        xs = np.geomspace(1.0, max(top, 1.0), 200)
        ys = [multiple(df, base, x)[1] for x in xs]
        ax.plot(xs, ys, label=label)
    ax.scatter(s.speedups, [multiple(df, s.base, x)[1] for x in s.speedups],
               c="k", s=15, zorder=5)
    dress(ax, "speedup: tokens/s/user over the baseline's",
          "price multiple ($/Mtok output over the baseline's)", xlog=10, ylog=10)
    return save(fig, ctx, "fast-mode-multiple.png")


def answer(ctx: Context) -> Answer:
    s = Picks(speedup=float(ctx.param("speedup", 2.5)),
              floor=float(ctx.param("baseline_min_tokens_per_s_per_user", 0.0)),
              speedups=[float(x) for x in ctx.param("speedups", [1.5, 2.0, 2.5, 3.0, 4.0])],
              ref_mult=float(ctx.param("reference_multiple", 6.0)))
    s.df = df = admissible_designs(ctx)
    s.opt, s.base = cheapest(df, 0.0), cheapest(df, s.floor)
    if s.base is None:
        return Answer(f"- no admissible design streams {s.floor:g} tokens/s/user or more")
    s.fast, s.mult = multiple(df, s.base, s.speedup)        # the fast mode and its price multiple
    s.bought = speedup_for(df, s.base, s.ref_mult)          # what the reference multiple buys
    s.spec, s.spec_numbers = _by_draft_tokens(df, s.floor, s.speedup, s.fast)
    figs = [_figure_front(ctx, s), _figure_multiple(ctx, s)]
    return Answer(_headline(s), _details(ctx, s), _numbers(s), figs, _lead(s))


def _headline(s: Picks) -> str:
    df, base, fast, opt, bought = s.df, s.base, s.fast, s.opt, s.bought
    if fast is None:
        return (f"- no admissible design reaches {s.speedup:g}x the baseline's "
                f"{base[SPEED]:.1f} tokens/s/user (max {df[SPEED].max():.1f})")
    return "\n".join([
        (f"- **Fast mode costs {s.mult:.2f}x** the normal price per output token: "
         f"${fast[COST]:.3f}/Mtok vs ${base[COST]:.3f}/Mtok."),
        (f"- Normal (baseline): {base[SPEED]:.1f} tokens/s/user at ${base[COST]:.3f}/Mtok "
         f"output, batch {int(base[BATCH]):,} sequences per instance "
         f"({layout_pairs(base, LAYOUT)}), "
         f"{base['output_tokens_per_s_per_rack']:,.0f} output tokens/s per rack."),
        (f"- Fast ({s.speedup:g}x, >= {s.speedup * base[SPEED]:.1f} tokens/s/user): "
         f"{fast[SPEED]:.1f} tokens/s/user at ${fast[COST]:.3f}/Mtok output, batch "
         f"{int(fast[BATCH]):,} ({layout_pairs(fast, LAYOUT)}), "
         f"{fast['output_tokens_per_s_per_rack']:,.0f} output tokens/s per rack "
         f"({fast[BATCH] / fast['num_chips']:.0f} sequences per chip vs "
         f"{base[BATCH] / base['num_chips']:.0f} for the baseline)."),
        (f"- From the unconstrained cost optimum ({opt[SPEED]:.1f} tokens/s/user, "
         f"${opt[COST]:.3f}/Mtok, batch {int(opt[BATCH]):,}) "
         f"{s.speedup:g}x the speed costs {multiple(df, opt, s.speedup)[1]:.2f}x."),
        (f"- Conversely, {s.ref_mult:g}x the baseline's price buys at most "
         f"{bought[SPEED] / base[SPEED]:.2f}x its speed ({bought[SPEED]:.1f} tokens/s/user, "
         f"batch {int(bought[BATCH]):,})."),
        *_without_speculation(s.spec_numbers, s.speedup),
    ])


def _multiples_table(s: Picks) -> str:
    """The price multiple for each of ``speedups``, from the baseline and the cost optimum."""
    rows = []
    for x in s.speedups:
        f1, m1 = multiple(s.df, s.base, x)
        f0, m0 = multiple(s.df, s.opt, x)
        rows.append([f"{x:g}x", m1, "-" if f1 is None else f1[SPEED],
                     "-" if f1 is None else f"{int(f1[BATCH]):,}",
                     m0, "-" if f0 is None else f0[SPEED],
                     "-" if f0 is None else f"{int(f0[BATCH]):,}"])
    return md_table(["speedup", f"multiple (from >= {s.floor:g} tok/s/user)", "tok/s/user",
                     "batch", "multiple (from cost optimum)", "tok/s/user", "batch"], rows)


def _details(ctx: Context, s: Picks) -> str:
    cols = ("bound", "ttft_s", "output_tokens_per_s_per_rack")
    return f"""## Method

- Space: {space_text(ctx)}; \
{len(s.df):,} are admissible (feasible: weights and KV fit, ep divides tp*dp, batch within the \
runtime's per-rank limit; and {limits_text(ctx, "no constraint")}), \
scored again in float64 with the run's scorer.
- Baseline: the cheapest `{COST}` among designs with `{SPEED}` >= {s.floor:g} \
(the normal offering, a typical public-API streaming speed; `baseline_min_tokens_per_s_per_user` \
in [answer]): {describe(s.base, cols)}.
- Fast mode: the cheapest `{COST}` among designs with `{SPEED}` >= {s.speedup:g} x the baseline's: \
{'none' if s.fast is None else describe(s.fast, cols)}.
- Unconstrained cost optimum (cheapest admissible design): {describe(s.opt, cols)}.
- What {s.ref_mult:g}x the price buys (`reference_multiple` in [answer]): the fastest design with \
`{COST}` <= {s.ref_mult:g} x the baseline's: {describe(s.bought, cols)}.
- Multiple = fast $/Mtok output / baseline $/Mtok output. Batches are a grid of 4 points per \
doubling, so a speed target is met by the next grid point above it (the multiple is slightly \
pessimistic). Costs are the space's cost mode (ownership by default), decode share only.
- The reference point (podcast [P 00:00], `shared/reference/podcast.md` 1.0): fast modes are \
said to charge about 6x for about 2.5x the streaming speed. In this model the batch trade-off \
alone costs much less than that at 2.5x; the price of a fast mode covers more than the lost \
batch ({'speculative decoding is not in this space' if not s.spec else 'with speculative decoding in the space, see below'}, \
nor is headroom for bursts at small batch).
{s.spec}
## Price multiple for other speedups

{_multiples_table(s)}

bound: 0 compute, 1 memory, 2 network, 3 capacity (decode step).
"""


def _numbers(s: Picks) -> dict:
    df, base, opt = s.df, s.base, s.opt
    numbers = {"speedup": s.speedup, "baseline_min_tokens_per_s_per_user": s.floor,
               "multiple": s.mult,
               "baseline": _design_numbers(base),
               "fast": None if s.fast is None else _design_numbers(s.fast),
               "cost_optimum": _design_numbers(opt),
               "reference_multiple": s.ref_mult,
               "speedup_at_reference_multiple": float(s.bought[SPEED] / base[SPEED]),
               "multiple_from_cost_optimum": multiple(df, opt, s.speedup)[1],
               "table": {f"{x:g}": {"multiple": multiple(df, base, x)[1],
                                    "multiple_from_cost_optimum": multiple(df, opt, x)[1]}
                         for x in s.speedups}}
    if s.spec_numbers:
        numbers["speculation"] = s.spec_numbers
    return numbers


def _lead(s: Picks) -> tuple:
    lead = (Lead("multiple", f"Fast mode ({s.speedup:g}x the speed) costs", "x",
                 pick="fast.design_id", pick_label="fast design"),)
    if "price_cut_fast" in s.spec_numbers:
        lead += (Lead("speculation.price_cut_fast", "Speculative decoding cuts the fast "
                      "mode's price", "x", pick="speculation.draft_tokens_fast",
                      pick_label="draft tokens", versus=1.0),)
    return lead


def _design_numbers(row) -> dict:
    return {"design_id": int(row["design_id"]), "usd_per_mtok_output": float(row[COST]),
            "output_tokens_per_s_per_user": float(row[SPEED]),
            "output_tokens_per_s_per_rack": float(row["output_tokens_per_s_per_rack"]),
            "batch": int(row[BATCH]), "tp": int(row["layout.tp"]),
            "dp": int(row["layout.dp"]), "ep": int(row["layout.ep"]),
            "ttft_s": float(row["ttft_s"]), "tpot_s": float(row["tpot_s"])}


SPEC = "serving.spec_tokens"


def _by_draft_tokens(df: pd.DataFrame, floor_tps: float, speedup: float, fast) \
        -> tuple[str, dict]:
    """Where the space has ``serving.spec_tokens``: the baseline and the fast mode within each
    number of draft tokens per step, and with the draft tokens free (the headline), as a
    Markdown section and its numbers (price and tokens/s per user with and without
    speculation: ``("", {})`` otherwise)."""
    if SPEC not in df.columns or df[SPEC].nunique() < 2:
        return "", {}
    rows, by_k = [], {}
    for k in sorted(df[SPEC].unique()):
        sub = df[df[SPEC] == k]
        base = cheapest(sub, floor_tps)
        fk = None if base is None else cheapest(sub, speedup * base[SPEED])
        per_step = float(fk["spec_expected_tokens"]) if fk is not None and \
            "spec_expected_tokens" in fk.index and np.isfinite(fk["spec_expected_tokens"]) \
            else 1.0
        by_k[f"{int(k)}"] = {
            "baseline": None if base is None else _design_numbers(base),
            "fast": None if fk is None else _design_numbers(fk),
            "multiple": None if fk is None else float(fk[COST] / base[COST]),
            "tokens_per_step_fast": None if fk is None else per_step}
        rows.append([f"{int(k)}", "-" if base is None else f"${base[COST]:.3f}",
                     "-" if base is None else f"{base[SPEED]:.1f}",
                     "-" if fk is None else f"${fk[COST]:.3f}",
                     "-" if fk is None else f"{fk[SPEED]:.1f}",
                     "-" if fk is None else f"{int(fk[BATCH]):,}",
                     "-" if fk is None else f"{fk[COST] / base[COST]:.2f}x",
                     "-" if fk is None else f"{per_step:.2f}"])
    table = md_table(["draft tokens", f"baseline $/Mtok (>= {floor_tps:g} tok/s/user)",
                      "tok/s/user", f"fast ({speedup:g}x) $/Mtok", "tok/s/user", "batch",
                      "multiple", "tokens per step (fast)"], rows)
    return f"""
## With speculative decoding (MTP)

The baseline and the {speedup:g}x fast mode with each number of draft tokens per step held \
fixed (0 = the fast-mode question without speculation); the headline above lets each pick its \
own. Verification steps carry k+1 tokens per sequence and yield (1 - a^(k+1)) / (1 - a) tokens \
(`dse/perf/spec.py`).

{table}
""", {"by_draft_tokens": by_k, **_with_and_without(df, fast, by_k.get("0"))}


def _with_and_without(df: pd.DataFrame, fast, off: dict | None) -> dict:
    """The fast mode (draft tokens free) against the one without speculation (``off``: the
    numbers at 0 draft tokens), and the price of its own speed without speculation."""
    if fast is None or off is None or off["fast"] is None:
        return {}
    # the with-speculation fast mode's own speed target, without speculation
    same = cheapest(df[df[SPEC] == 0], float(fast[SPEED]))
    return {
        "same_speed_usd_per_mtok_without": None if same is None else float(same[COST]),
        "same_speed_price_cut": None if same is None else float(same[COST] / fast[COST]),
        "draft_tokens_fast": int(fast[SPEC]),
        "fast_usd_per_mtok_with": float(fast[COST]),
        "fast_usd_per_mtok_without": off["fast"]["usd_per_mtok_output"],
        "fast_tokens_per_s_per_user_with": float(fast[SPEED]),
        "fast_tokens_per_s_per_user_without": off["fast"]["output_tokens_per_s_per_user"],
        "baseline_usd_per_mtok_without": off["baseline"]["usd_per_mtok_output"],
        "baseline_tokens_per_s_per_user_without":
            off["baseline"]["output_tokens_per_s_per_user"],
        "multiple_without": off["multiple"],
        "price_cut_fast": off["fast"]["usd_per_mtok_output"] / float(fast[COST])}


def _without_speculation(n: dict, speedup: float) -> list:
    """The headline's lines for a space with draft tokens: the fast mode's price and tokens/s
    per user with and without speculation (``_by_draft_tokens``'s numbers)."""
    if "price_cut_fast" not in n:
        return []
    return [f"- Speculation chosen: {n['draft_tokens_fast']} draft tokens per step in the fast "
            f"mode, ${n['fast_usd_per_mtok_with']:.3f}/Mtok output at "
            f"{n['fast_tokens_per_s_per_user_with']:.1f} tokens/s per user. Without speculative "
            f"decoding the {speedup:g}x fast mode costs ${n['fast_usd_per_mtok_without']:.3f}/Mtok "
            f"at {n['fast_tokens_per_s_per_user_without']:.1f} tokens/s per user (its baseline "
            f"${n['baseline_usd_per_mtok_without']:.3f}/Mtok at "
            f"{n['baseline_tokens_per_s_per_user_without']:.1f} tokens/s per user: "
            f"{n['multiple_without']:.2f}x): speculation cuts the fast mode's price "
            f"{n['price_cut_fast']:.1f}x. "
            + (f"Without it no design streams {n['fast_tokens_per_s_per_user_with']:.1f} tokens/s "
               "per user." if n["same_speed_usd_per_mtok_without"] is None else
               f"At the same {n['fast_tokens_per_s_per_user_with']:.1f} tokens/s per user "
               f"without it: ${n['same_speed_usd_per_mtok_without']:.3f}/Mtok "
               f"({n['same_speed_price_cut']:.1f}x).")]
