"""What a long context costs: cost per token against context length, and where the KV cache
takes over the decode step.

Every design of the space (prompt length ``workload.isl`` x layout x batch) is scored; for each
prompt length the cheapest feasible design that meets the space's constraints (the TPOT/TTFT
SLO) gives the cost per output and per input token, and the cheapest one with the SLO dropped
gives the capacity-limited floor. The decode step of each of those designs is then re-scored
with the per-op breakdown (``dse.perf.score(..., breakdown=True)``): the ``attn_core`` op's
memory time is the KV-cache read, everything else in the step (the other ops' weight reads,
compute and collectives, and the fixed overhead) is "the rest". The KV read grows linearly in
the context and the rest does not depend on it, so the context at which the two are equal (the
crossover) is found by bracketing on a log grid of prompt lengths and refining the bracket.
The price step of a long-context tier is the ratio of the best costs at the long and the short
prompt length (``[answer] long_context_tokens`` / ``short_context_tokens``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse.perf import OPS
from dse.questions.common import (
    Picks,
    admissible,
    best_per,
    dress,
    in_units,
    layout_text,
    md_frame,
    op_times,
    param_values,
    save,
    slo_text,
    subplots,
)
from dse.questions.context import Answer, Context, Lead
from dse.spec.csvsafe import spreadsheet_safe

ISL = "workload.isl"
OSL = "workload.osl"
BATCH = "workload.concurrency"
KV_OP = OPS.index("attn_core")
MODE = "serving.mode"


# ---------------------------------------------------------------- this question

def kv_split(ctx: Context, rows: pd.DataFrame) -> pd.DataFrame:
    """KV-read time and the rest of the decode step for ``rows`` at their own context."""
    t = op_times(ctx, param_values(ctx, rows))
    kv_s = t[f"{OPS[KV_OP]}_memory_s"].to_numpy()
    return pd.DataFrame({"kv_read_s": kv_s, "rest_s": t["total_s"].to_numpy() - kv_s,
                         "decode_step_s": t["total_s"].to_numpy()}).join(t)


def crossover_isl(ctx: Context, row: pd.Series) -> float:
    """The prompt length at which this design's decode-step KV read equals the rest of the step
    (layout and batch held fixed), found on a log grid of prompt lengths and refined in the
    bracket where the difference changes sign (the rest of the step grows with the prompt too:
    attention compute and per-sequence costs), to a relative 1e-9 (NaN if none below 2^24)."""
    lo, hi = 2.0 ** 6, 2.0 ** 24
    for _ in range(8):
        grid = np.geomspace(lo, hi, 33)
        vals = {p.path: np.repeat(row[p.path], len(grid)) for p in ctx.space.parameters}
        vals[ISL] = grid
        t = op_times(ctx, vals)
        kv = t[f"{OPS[KV_OP]}_memory_s"].to_numpy()
        diff = kv - (t["total_s"].to_numpy() - kv)
        above = np.flatnonzero(diff >= 0)
        if len(above) == 0:
            return float("nan")
        i = int(above[0])
        if i == 0:
            return float(grid[0])
        lo, hi = float(grid[i - 1]), float(grid[i])
        if hi / lo - 1 < 1e-9:
            break
    d0, d1 = diff[i - 1], diff[i]
    return float(lo + (hi - lo) * (-d0) / (d1 - d0))


def _best_per_isl(df: pd.DataFrame, ok: np.ndarray, metric: str) -> pd.DataFrame:
    """Per prompt length, the admissible (``ok``) design with the lowest ``metric``."""
    return df[ok] if not ok.any() else best_per(df, ISL, metric, ok)


def _with_split(ctx: Context, best: pd.DataFrame):
    """``best`` with its decode-step KV split, KV share, crossover and prompt-time share."""
    split = kv_split(ctx, best)
    best = pd.concat([best, split[["kv_read_s", "rest_s", "decode_step_s"]]], axis=1)
    best["kv_share"] = best["kv_read_s"] / best["decode_step_s"]
    best["crossover_isl"] = [crossover_isl(ctx, r) for _, r in best.iterrows()]
    # the mean step (tpot / pp) minus the decode-only step: time spent on prompt tokens
    best["prompt_time_share"] = 1.0 - best["decode_step_s"] / (best["tpot_s"] / best["layout.pp"])
    return best, split


def _curve(ctx: Context, df: pd.DataFrame, ok: np.ndarray):
    """Best design per prompt length under the SLO and with no SLO, each with its KV split."""
    best, split = _with_split(ctx, _best_per_isl(df, ok, "usd_per_mtok_output"))
    free, _ = _with_split(ctx, _best_per_isl(df, df["feasible"].to_numpy(bool),
                                             "usd_per_mtok_output"))
    best["input_usd_per_mtok_best"] = best[ISL].map(
        _best_per_isl(df, ok, "usd_per_mtok_input").set_index(ISL)["usd_per_mtok_input"])
    return best, split, free


def disaggregated_curve(df: pd.DataFrame, ok: np.ndarray) -> pd.DataFrame:
    """Per prompt length, the cheapest admissible design with a disaggregated decode pool
    (prefill on its own chips, sized by the scorer to keep the decodes fed): its output and
    input cost, batch, TPOT and TTFT."""
    b = _best_per_isl(df, ok, "usd_per_mtok_output")
    cols = [ISL, "design_id", "layout.tp", "layout.pp", BATCH, "usd_per_mtok_output",
            "usd_per_mtok_input", "tpot_s", "ttft_s"]
    return b[[c for c in cols if c in b]]


def _first_kv_dominated(best: pd.DataFrame):
    """The shortest prompt at which the SLO-best design's KV read exceeds the rest of its step."""
    dom = best[best["kv_read_s"] > best["rest_s"]]
    return None if dom.empty else dom.iloc[0]


def _crossover_vs_batch(ctx: Context, row: pd.Series, batches) -> pd.DataFrame:
    """Crossover prompt length of ``row``'s layout at several batch sizes."""
    out = []
    for c in batches:
        r = row.copy()
        r[BATCH] = c
        out.append((c, crossover_isl(ctx, r)))
    return pd.DataFrame(out, columns=["batch", "crossover_isl"])


MS = {"tpot_s": ("tpot_ms", 1e3), "kv_read_s": ("kv_read_ms", 1e3),
      "rest_s": ("rest_of_step_ms", 1e3)}          # seconds columns shown in milliseconds
TP_PP = ("layout.tp", "layout.pp")


def _figure_cost(ctx: Context, s: Picks) -> str:
    best, free, slo = s.best, s.free, s.slo
    fig, ax = subplots(figsize=(7, 4.5))
    ax.plot(best[ISL], best["usd_per_mtok_output"], "o-", label=f"output, best under {slo}")
    ax.plot(free[ISL], free["usd_per_mtok_output"], "s--", label="output, best with no SLO")
    ax.plot(best[ISL], best["input_usd_per_mtok_best"], "^-", label=f"input, best under {slo}")
    dress(ax, "prompt length (tokens)", "$ per million tokens", "cost per token vs context",
          xlog=2, ylog=10)
    return save(fig, ctx, "cost-vs-context.png")


def _figure_ops(ctx: Context, s: Picks) -> str:
    split = s.split
    fig, ax = subplots(figsize=(7, 4.5))
    labels = [f"{int(v / 1024)}k" for v in s.best[ISL].to_numpy()]
    bottom = np.zeros(len(s.best))
    parts = [("KV read (attn_core memory)", split[f"{OPS[KV_OP]}_memory_s"].to_numpy())]
    parts += [(op, split[f"{op}_s"].to_numpy()) for op in OPS if op != "attn_core"]
    parts += [("attn_core compute beyond KV read",
               split["attn_core_s"].to_numpy() - split["attn_core_memory_s"].to_numpy()),
              ("fixed overhead", split["overhead_s"].to_numpy())]
    for name, v in parts:
        v = np.maximum(v, 0.0)
        if v.max() <= 0:
            continue
        ax.bar(labels, v * 1e3, bottom=bottom * 1e3, label=name)
        bottom += v
    dress(ax, "prompt length (best design under the SLO at each)",
          "decode step time per stage (ms)", "decode step, op by op", grid="y", legend=7)
    return save(fig, ctx, "op-split-vs-context.png")


def _figure_crossover(ctx: Context, s: Picks) -> str:
    fig, ax = subplots(figsize=(7, 4.5))
    cross = s.sweep["crossover_isl"].to_numpy(dtype=float)
    ok = np.isfinite(cross) & (cross > 0)         # no crossover in the swept range: not drawn
    ax.plot(s.sweep["batch"].to_numpy()[ok], cross[ok], "o-")
    if not ok.any():
        ax.text(0.5, 0.5, "no crossover in the swept prompt lengths", ha="center",
                transform=ax.transAxes)
    dress(ax, "batch (concurrent sequences)", "prompt length where KV read = rest of step",
          f"crossover vs batch ({layout_text(s.ref, TP_PP).rsplit(' ', 1)[0]})",
          xlog=2, ylog=2 if ok.any() else None, legend=None)
    return save(fig, ctx, "crossover-vs-batch.png")


def answer(ctx: Context) -> Answer:
    # the cheapest design per prompt length, with and without the SLO, and its KV split
    s = _select(ctx, int(ctx.param("short_context_tokens", 8192)),
                int(ctx.param("long_context_tokens", 131072)))
    numbers = _numbers(s)               # the price steps from the short to the long prompt
    details = _details(ctx, s)
    figs = [_figure_cost(ctx, s), _figure_ops(ctx, s), _figure_crossover(ctx, s)]
    ctx.out.mkdir(parents=True, exist_ok=True)
    spreadsheet_safe(in_units(s.best[COLS], MS)).to_csv(ctx.out / "best-per-context.csv",
                                                        index=False)
    return Answer(_headline(ctx, s, numbers), details, numbers, figs, _lead(numbers))


def _select(ctx: Context, short: int, long: int) -> Picks:
    """The cheapest aggregated design per prompt length under the SLO (``best``) and with none
    (``free``), each with its decode step's KV split; the short and long prompts' rows of both;
    the crossover of the short-prompt design against the batch; the disaggregated curve."""
    s = Picks(short=short, long=long, slo=slo_text(ctx))
    full = ctx.score()
    ok_full = admissible(ctx, full)
    modes = full[MODE] if MODE in full else pd.Series("aggregated", index=full.index)
    agg = (modes == "aggregated").to_numpy()
    s.df, s.ok = full[agg], ok_full[agg]
    s.dis = disaggregated_curve(full[~agg], ok_full[~agg]) if (~agg).any() else None
    s.best, s.split, s.free = _curve(ctx, s.df, s.ok)
    by, fby = s.best.set_index(ISL), s.free.set_index(ISL)
    if short not in by.index or long not in by.index:
        raise ValueError(f"no admissible design at {short} or {long} prompt tokens")
    s.s, s.lg, s.fs, s.flg = by.loc[short], by.loc[long], fby.loc[short], fby.loc[long]
    s.ref = s.best[s.best[ISL] == short].iloc[0]
    s.first, s.first_free = _first_kv_dominated(s.best), _first_kv_dominated(s.free)
    s.sweep = _crossover_vs_batch(ctx, s.ref, sorted({1, 4, 16, 64, 256, int(s.ref[BATCH])}))
    s.edge = ttft_edge(ctx, s)
    return s


def ttft_edge(ctx: Context, s: Picks, factors=(1.0, 1.1, 1.2, 1.5)) -> list[dict]:
    """The cheapest aggregated design at the long prompt as the space's TTFT limit is relaxed by
    ``factors``, every other constraint held: where the limit sits on a knife edge (one more
    sequence's prompt work just over it), the price moves by the batch it admits."""
    lim = next((c.max for c in ctx.space.constraints
                if c.metric == "ttft_s" and c.max is not None), None)
    if lim is None:
        return []
    df = s.df[s.df[ISL] == s.long]
    ok = df["feasible"].to_numpy(bool) & np.isfinite(df["usd_per_mtok_output"].to_numpy(float))
    for c in ctx.space.constraints:
        if c.metric != "ttft_s":
            v = df[c.metric].to_numpy(float)
            ok &= (v <= c.max if c.max is not None else True) & \
                (v >= c.min if c.min is not None else True)
    out = []
    for f in factors:
        m = ok & (df["ttft_s"].to_numpy(float) <= lim * f)
        if m.any():
            r = df[m].loc[df[m]["usd_per_mtok_output"].idxmin()]
            out.append({"ttft_limit_s": float(lim * f), "batch": int(r[BATCH]),
                        "ttft_s": float(r["ttft_s"]),
                        "usd_per_mtok_output": float(r["usd_per_mtok_output"]),
                        "output_price_step": float(r["usd_per_mtok_output"]
                                                   / s.s["usd_per_mtok_output"])})
    return out


def _edge_line(edge: list[dict], long: int) -> str:
    """The TTFT limit's edge in words."""
    first, rest = edge[0], edge[1:]
    return (f"- **What sets the long-prompt price is the TTFT limit**: at {_k(long)} the cheapest "
            f"design meets {first['ttft_limit_s']:g} s at batch {first['batch']} (TTFT "
            f"{first['ttft_s']:.2f} s); "
            + "; ".join(f"{e['ttft_limit_s']:g} s admits batch {e['batch']} "
                        f"(${e['usd_per_mtok_output']:.2f}/Mtok, {e['output_price_step']:.1f}x)"
                        for e in rest)
            + " (the prompt's own prefill and the front end's tokenizing take most of the "
            "limit: the answer sits on its edge).")


def _numbers(s: Picks) -> dict:
    sh, lg, fs, flg, first, first_free = s.s, s.lg, s.fs, s.flg, s.first, s.first_free
    numbers = {
        "short_context_tokens": s.short, "long_context_tokens": s.long,
        "usd_per_mtok_output_short": float(sh["usd_per_mtok_output"]),
        "usd_per_mtok_output_long": float(lg["usd_per_mtok_output"]),
        "output_price_step": float(lg["usd_per_mtok_output"] / sh["usd_per_mtok_output"]),
        "usd_per_mtok_input_short": float(sh["input_usd_per_mtok_best"]),
        "usd_per_mtok_input_long": float(lg["input_usd_per_mtok_best"]),
        "input_price_step": float(lg["input_usd_per_mtok_best"] / sh["input_usd_per_mtok_best"]),
        "output_price_step_no_slo": float(flg["usd_per_mtok_output"] / fs["usd_per_mtok_output"]),
        "crossover_isl_at_short_best": float(s.ref["crossover_isl"]),
        "short_best_design_id": int(sh["design_id"]), "long_best_design_id": int(lg["design_id"]),
        "short_best_batch": int(sh[BATCH]), "long_best_batch": int(lg[BATCH]),
        "first_kv_dominated_isl": None if first is None else int(first[ISL]),
        "kv_share_short": float(sh["kv_share"]), "kv_share_long": float(lg["kv_share"]),
        "max_kv_share_under_slo": float(s.best["kv_share"].max()),
        "prompt_time_share_long": float(lg["prompt_time_share"]),
        "usd_per_mtok_output_short_no_slo": float(fs["usd_per_mtok_output"]),
        "usd_per_mtok_output_long_no_slo": float(flg["usd_per_mtok_output"]),
        "first_kv_dominated_isl_no_slo": None if first_free is None else int(first_free[ISL]),
        "kv_share_long_no_slo": float(flg["kv_share"]),
        "ttft_edge": s.edge,
    }
    if _has_disaggregated(s):
        d = s.dis.set_index(ISL)
        ds, dl = d.loc[s.short], d.loc[s.long]
        numbers.update({
            "disaggregated_usd_per_mtok_output_short": float(ds["usd_per_mtok_output"]),
            "disaggregated_usd_per_mtok_output_long": float(dl["usd_per_mtok_output"]),
            "disaggregated_output_price_step": float(dl["usd_per_mtok_output"]
                                                     / ds["usd_per_mtok_output"]),
            "disaggregated_long_batch": int(dl[BATCH])})
    return numbers


def _has_disaggregated(s: Picks) -> bool:
    return s.dis is not None and {s.short, s.long} <= set(s.dis[ISL])


def _k(v) -> str:
    return f"{v / 1024:.0f}k"


def _headline(ctx: Context, s: Picks, n: dict) -> str:
    sh, lg, fs, flg, ref, sweep = s.s, s.lg, s.fs, s.flg, s.ref, s.sweep
    short, long, slo = s.short, s.long, s.slo
    osl = int(s.df[OSL].iloc[0]) if OSL in s.df else int(ctx.space.base.get(OSL, 0))
    headline = [
        f"- **Price step of a long-context tier** (aggregated serving: chunked prefill shares "
        f"the decode steps): the cheapest {_k(long)}-token prompt "
        f"({_k(long + osl)} context with the answer) costs "
        f"**${lg['usd_per_mtok_output']:.2f} per million output tokens** vs "
        f"**${sh['usd_per_mtok_output']:.3f}** at {_k(short)}: "
        f"**{n['output_price_step']:.1f}x** (under {slo}); input tokens "
        f"**{n['input_price_step']:.1f}x** (${lg['input_usd_per_mtok_best']:.3f} vs "
        f"${sh['input_usd_per_mtok_best']:.3f} per million).",
        f"- With no latency SLO (batch limited only by HBM) the output step is "
        f"**{n['output_price_step_no_slo']:.1f}x** (${flg['usd_per_mtok_output']:.2f} vs "
        f"${fs['usd_per_mtok_output']:.3f} per million output tokens, batch "
        f"{int(flg[BATCH])} vs {int(fs[BATCH])}).",
        f"- **KV overtakes the rest of the decode step** at a "
        f"**{float(ref['crossover_isl']) / 1024:.1f}k-token** prompt for the {_k(short)}-optimal "
        f"design ({layout_text(ref, TP_PP)}): there the KV read "
        f"is half of the step. The crossover moves inversely with the batch: "
        f"{sweep['crossover_isl'].iloc[0] / 1024:.0f}k tokens at batch "
        f"{int(sweep['batch'].iloc[0])}, {sweep['crossover_isl'].iloc[-1] / 1024:.1f}k at batch "
        f"{int(sweep['batch'].iloc[-1])}.",
    ]
    if s.first_free is not None:
        headline.append(
            f"- Throughput-optimal designs (no SLO, HBM full of KV) are KV-dominated from "
            f"**{_k(s.first_free[ISL])}-token** prompts on ({layout_text(s.first_free, TP_PP)}; "
            f"the KV read is {100 * flg['kv_share']:.0f}% of the decode step at {_k(long)}).")
    headline.append(
        "- Under the SLO the cheapest design "
        + (f"is KV-dominated from {_k(s.first[ISL])} on" if s.first is not None else
           "never lets the KV read pass half of its decode step (at most "
           f"{100 * s.best['kv_share'].max():.0f}%)")
        + f": the price step comes from the batch falling from {int(sh[BATCH])} to "
        f"{int(lg[BATCH])}, because at {_k(long)} the prompt work (chunked prefill sharing every "
        f"step) takes **{100 * lg['prompt_time_share']:.0f}%** of the step time and the TPOT "
        f"limit leaves room for fewer sequences to share each weight read.")
    if len(s.edge) > 1 and s.edge[1]["usd_per_mtok_output"] < 0.9 * s.edge[0]["usd_per_mtok_output"]:
        headline.append(_edge_line(s.edge, long))
    if _has_disaggregated(s):
        headline.append(_disaggregated_line(s, n))
    if ctx.param("public_long_tier_output_ratio"):
        headline.append(_public_tier_line(ctx))
    return "\n".join(headline)


def _disaggregated_line(s: Picks, n: dict) -> str:
    dratio = n["disaggregated_output_price_step"]
    return (f"- **With a disaggregated decode pool** (prompts prefilled on their own chips, sized "
            f"to keep the decodes fed, their cost counted) the step is **{dratio:.1f}x** "
            f"(${n['disaggregated_usd_per_mtok_output_long']:.2f} vs "
            f"${n['disaggregated_usd_per_mtok_output_short']:.3f} per million "
            f"output tokens; batch {n['disaggregated_long_batch']} vs "
            f"{int(s.dis.set_index(ISL).loc[s.short, BATCH])}): "
            + ("the prompt work no longer shares the decode steps, so much of the aggregated "
               "step was chunked prefill, not the KV cache."
               if dratio < 0.8 * n["output_price_step"] else
               "about the same as aggregated serving: the KV cache, not the shared prompt work, "
               "sets the step."))


def _public_tier_line(ctx: Context) -> str:
    pub_out = ctx.param("public_long_tier_output_ratio")
    pub_in = ctx.param("public_long_tier_input_ratio")
    pub_at = ctx.param("public_long_tier_above_tokens")
    return (f"- Public long-context tiers charge only {pub_out:g}x for output and {pub_in:g}x for "
            f"input above {_k(pub_at)} tokens (Gemini 2.5/3.1 Pro, Claude Sonnet 4.x; "
            f"`reference/pricing.csv`): on this model that covers the cost of long prompts only "
            f"if most traffic is short (the flat price cross-subsidises the long tail) or the "
            f"KV cache and prompt work are much smaller (MLA, sliding windows, prefix caching).")


COLS = [ISL, "design_id", "layout.tp", "layout.pp", BATCH, "usd_per_mtok_output",
        "usd_per_mtok_input", "tpot_s", "ttft_s", "kv_read_s", "rest_s", "kv_share",
        "prompt_time_share", "crossover_isl"]


def _details(ctx: Context, s: Picks) -> str:
    slo, short, long = s.slo, s.short, s.long
    return "\n".join([
        "## Method", "",
        f"- Space: every prompt length x tp x pp x batch of `{ctx.space.file}` is scored "
        f"({len(s.df):,} designs, {int(s.ok.sum()):,} feasible under {slo}).",
        f"- Costs: per prompt length, the design with the lowest `usd_per_mtok_output` among "
        f"the feasible ones that meet {slo} (`usd_per_mtok_input` is minimised separately). "
        f"The {_k(short)} figures are design {int(s.s['design_id'])} "
        f"({layout_text(s.s, TP_PP)}), the {_k(long)} figures design "
        f"{int(s.lg['design_id'])} ({layout_text(s.lg, TP_PP)}). 'No SLO' "
        "drops the constraints and keeps only feasibility (the KV cache must fit).",
        "- KV split: the decode-only step of each best design, per op "
        "(`dse.perf.score(breakdown=True)`): `kv_read` is the `attn_core` memory time (reading "
        "the KV cache, plus writing the new token's KV); `rest` is the step's total minus it. "
        "The crossover holds the layout and batch fixed and solves for the prompt length at which "
        "the two are equal (decode context = prompt + half the answer).",
        "- The output cost counts the share of the step time spent on decode tokens; the input "
        "cost the share spent on prompt tokens (chunked prefill in the same steps).",
        "", f"### Best design per prompt length under {slo}", "",
        md_frame(in_units(s.best[COLS], MS)), "",
        "### Best design per prompt length with no SLO (feasible only)", "",
        md_frame(in_units(s.free[COLS], MS)), "",
        f"### Crossover prompt length vs batch ({layout_text(s.ref, TP_PP)})",
        "", md_frame(s.sweep.round(0), 6), "",
        *([f"### Best design per prompt length with a disaggregated decode pool ({slo})", "",
           md_frame(in_units(s.dis, {"tpot_s": MS["tpot_s"]})), ""]
          if s.dis is not None else []),
    ])


def _lead(numbers: dict) -> tuple:
    return (Lead("output_price_step", f"Output price step of a "
                 f"{numbers['long_context_tokens'] / 1024:.0f}k-token prompt over "
                 f"{numbers['short_context_tokens'] / 1024:.0f}k", "x",
                 pick="long_best_design_id", pick_label="long-context design", versus=1.0),)
