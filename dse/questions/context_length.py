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
    admissible,
    layout_text,
    md_frame,
    op_times,
    param_values,
    pyplot,
    save,
    slo_text,
)
from dse.questions.context import Answer, Context, Lead

ISL = "workload.isl"
OSL = "workload.osl"
BATCH = "workload.concurrency"
KV_OP = OPS.index("attn_core")
MODE = "serving.mode"


def best_per(df: pd.DataFrame, ok: np.ndarray, by: str, metric: str,
             minimize: bool = True) -> pd.DataFrame:
    """For each value of ``by``, the admissible row with the best ``metric``."""
    sub = df[ok]
    if sub.empty:
        return sub
    pick = sub.groupby(by)[metric].idxmin() if minimize else sub.groupby(by)[metric].idxmax()
    return df.loc[pick.to_numpy()].sort_values(by).reset_index(drop=True)


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
    best, split = _with_split(ctx, best_per(df, ok, ISL, "usd_per_mtok_output"))
    free, _ = _with_split(ctx, best_per(df, df["feasible"].to_numpy(bool), ISL,
                                        "usd_per_mtok_output"))
    best["input_usd_per_mtok_best"] = best[ISL].map(
        best_per(df, ok, ISL, "usd_per_mtok_input").set_index(ISL)["usd_per_mtok_input"])
    return best, split, free


def disaggregated_curve(df: pd.DataFrame, ok: np.ndarray) -> pd.DataFrame:
    """Per prompt length, the cheapest admissible design with a disaggregated decode pool
    (prefill on its own chips, sized by the scorer to keep the decodes fed): its output and
    input cost, batch, TPOT and TTFT."""
    b = best_per(df, ok, ISL, "usd_per_mtok_output")
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


def _ms(t: pd.DataFrame) -> pd.DataFrame:
    """Seconds columns of a table shown in milliseconds."""
    for c in ("tpot_s", "kv_read_s", "rest_s"):
        t[c] = t[c] * 1e3
    return t.rename(columns={"tpot_s": "tpot_ms", "kv_read_s": "kv_read_ms",
                             "rest_s": "rest_of_step_ms"})


def _ms_tpot(t: pd.DataFrame) -> pd.DataFrame:
    t["tpot_s"] = t["tpot_s"] * 1e3
    return t.rename(columns={"tpot_s": "tpot_ms"})


def _figures(ctx: Context, best: pd.DataFrame, split: pd.DataFrame, free: pd.DataFrame,
             sweep: pd.DataFrame,
             row_ref: pd.Series, slo: str) -> list[str]:
    plt = pyplot()
    x = best[ISL].to_numpy()
    names = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(x, best["usd_per_mtok_output"], "o-", label=f"output, best under {slo}")
    ax.plot(free[ISL], free["usd_per_mtok_output"], "s--", label="output, best with no SLO")
    ax.plot(x, best["input_usd_per_mtok_best"], "^-", label=f"input, best under {slo}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("$ per million tokens")
    ax.set_title("cost per token vs context")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    names.append(save(fig, ctx, "cost-vs-context.png"))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = [f"{int(v / 1024)}k" for v in x]
    bottom = np.zeros(len(best))
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
    ax.set_xlabel("prompt length (best design under the SLO at each)")
    ax.set_ylabel("decode step time per stage (ms)")
    ax.set_title("decode step, op by op")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    names.append(save(fig, ctx, "op-split-vs-context.png"))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    cross = sweep["crossover_isl"].to_numpy(dtype=float)
    ok = np.isfinite(cross) & (cross > 0)         # no crossover in the swept range: not drawn
    ax.plot(sweep["batch"].to_numpy()[ok], cross[ok], "o-")
    ax.set_xscale("log", base=2)
    if ok.any():
        ax.set_yscale("log", base=2)
    else:
        ax.text(0.5, 0.5, "no crossover in the swept prompt lengths", ha="center",
                transform=ax.transAxes)
    ax.set_xlabel("batch (concurrent sequences)")
    ax.set_ylabel("prompt length where KV read = rest of step")
    ax.set_title(f"crossover vs batch ({layout_text(row_ref, ('layout.tp', 'layout.pp')).rsplit(' ', 1)[0]})")
    ax.grid(alpha=0.3, which="both")
    names.append(save(fig, ctx, "crossover-vs-batch.png"))
    return names


def answer(ctx: Context) -> Answer:
    short = int(ctx.param("short_context_tokens", 8192))
    long = int(ctx.param("long_context_tokens", 131072))
    full = ctx.score()
    ok_full = admissible(ctx, full)
    modes = full[MODE] if MODE in full else pd.Series("aggregated", index=full.index)
    agg = (modes == "aggregated").to_numpy()
    df, ok = full[agg], ok_full[agg]
    dis = disaggregated_curve(full[~agg], ok_full[~agg]) if (~agg).any() else None
    best, split, free = _curve(ctx, df, ok)
    by, fby = best.set_index(ISL), free.set_index(ISL)
    if short not in by.index or long not in by.index:
        raise ValueError(f"no admissible design at {short} or {long} prompt tokens")
    s, lg = by.loc[short], by.loc[long]
    fs, flg = fby.loc[short], fby.loc[long]
    slo = slo_text(ctx)
    ratio_out = lg["usd_per_mtok_output"] / s["usd_per_mtok_output"]
    ratio_in = lg["input_usd_per_mtok_best"] / s["input_usd_per_mtok_best"]
    ratio_free = flg["usd_per_mtok_output"] / fs["usd_per_mtok_output"]
    ref = best[best[ISL] == short].iloc[0]
    cross_ref = float(ref["crossover_isl"])
    first = _first_kv_dominated(best)
    first_free = _first_kv_dominated(free)
    sweep = _crossover_vs_batch(ctx, ref, sorted({1, 4, 16, 64, 256, int(ref[BATCH])}))
    pub_out = ctx.param("public_long_tier_output_ratio")
    pub_in = ctx.param("public_long_tier_input_ratio")
    pub_at = ctx.param("public_long_tier_above_tokens")
    numbers = {
        "short_context_tokens": short, "long_context_tokens": long,
        "usd_per_mtok_output_short": float(s["usd_per_mtok_output"]),
        "usd_per_mtok_output_long": float(lg["usd_per_mtok_output"]),
        "output_price_step": float(ratio_out),
        "usd_per_mtok_input_short": float(s["input_usd_per_mtok_best"]),
        "usd_per_mtok_input_long": float(lg["input_usd_per_mtok_best"]),
        "input_price_step": float(ratio_in),
        "output_price_step_no_slo": float(ratio_free),
        "crossover_isl_at_short_best": cross_ref,
        "short_best_design_id": int(s["design_id"]), "long_best_design_id": int(lg["design_id"]),
        "short_best_batch": int(s[BATCH]), "long_best_batch": int(lg[BATCH]),
        "first_kv_dominated_isl": None if first is None else int(first[ISL]),
        "kv_share_short": float(s["kv_share"]), "kv_share_long": float(lg["kv_share"]),
        "max_kv_share_under_slo": float(best["kv_share"].max()),
        "prompt_time_share_long": float(lg["prompt_time_share"]),
        "usd_per_mtok_output_short_no_slo": float(fs["usd_per_mtok_output"]),
        "usd_per_mtok_output_long_no_slo": float(flg["usd_per_mtok_output"]),
        "first_kv_dominated_isl_no_slo": None if first_free is None else int(first_free[ISL]),
        "kv_share_long_no_slo": float(flg["kv_share"]),
    }
    k = lambda v: f"{v / 1024:.0f}k"
    tpl = ("layout.tp", "layout.pp")
    osl = int(df[OSL].iloc[0]) if OSL in df else int(ctx.space.base.get(OSL, 0))
    headline = [
        f"- **Price step of a long-context tier** (aggregated serving: chunked prefill shares "
        f"the decode steps): the cheapest {k(long)}-token prompt "
        f"({k(long + osl)} context with the answer) costs "
        f"**${lg['usd_per_mtok_output']:.2f} per million output tokens** vs "
        f"**${s['usd_per_mtok_output']:.3f}** at {k(short)}: **{ratio_out:.1f}x** (under {slo}); "
        f"input tokens **{ratio_in:.1f}x** (${lg['input_usd_per_mtok_best']:.3f} vs "
        f"${s['input_usd_per_mtok_best']:.3f} per million).",
        f"- With no latency SLO (batch limited only by HBM) the output step is "
        f"**{ratio_free:.1f}x** (${flg['usd_per_mtok_output']:.2f} vs "
        f"${fs['usd_per_mtok_output']:.3f} per million output tokens, batch "
        f"{int(flg[BATCH])} vs {int(fs[BATCH])}).",
        f"- **KV overtakes the rest of the decode step** at a **{cross_ref / 1024:.1f}k-token** "
        f"prompt for the {k(short)}-optimal design ({layout_text(ref, tpl)}): there the KV read "
        f"is half of the step. The crossover moves inversely with the batch: "
        f"{sweep['crossover_isl'].iloc[0] / 1024:.0f}k tokens at batch "
        f"{int(sweep['batch'].iloc[0])}, {sweep['crossover_isl'].iloc[-1] / 1024:.1f}k at batch "
        f"{int(sweep['batch'].iloc[-1])}.",
    ]
    if first_free is not None:
        headline.append(
            f"- Throughput-optimal designs (no SLO, HBM full of KV) are KV-dominated from "
            f"**{k(first_free[ISL])}-token** prompts on ({layout_text(first_free, tpl)}; the KV "
            f"read is {100 * flg['kv_share']:.0f}% of the decode step at {k(long)}).")
    headline.append(
        "- Under the SLO the cheapest design "
        + (f"is KV-dominated from {k(first[ISL])} on" if first is not None else
           "never lets the KV read pass half of its decode step (at most "
           f"{100 * best['kv_share'].max():.0f}%)")
        + f": the price step comes from the batch falling from {int(s[BATCH])} to "
        f"{int(lg[BATCH])}, because at {k(long)} the prompt work (chunked prefill sharing every "
        f"step) takes **{100 * lg['prompt_time_share']:.0f}%** of the step time and the TPOT "
        f"limit leaves room for fewer sequences to share each weight read.")
    if dis is not None and {short, long} <= set(dis[ISL]):
        d = dis.set_index(ISL)
        ds, dl = d.loc[short], d.loc[long]
        dratio = dl["usd_per_mtok_output"] / ds["usd_per_mtok_output"]
        numbers.update({
            "disaggregated_usd_per_mtok_output_short": float(ds["usd_per_mtok_output"]),
            "disaggregated_usd_per_mtok_output_long": float(dl["usd_per_mtok_output"]),
            "disaggregated_output_price_step": float(dratio),
            "disaggregated_long_batch": int(dl[BATCH])})
        headline.append(
            f"- **With a disaggregated decode pool** (prompts prefilled on their own chips, sized "
            f"to keep the decodes fed, their cost counted) the step is **{dratio:.1f}x** "
            f"(${dl['usd_per_mtok_output']:.2f} vs ${ds['usd_per_mtok_output']:.3f} per million "
            f"output tokens; batch {int(dl[BATCH])} vs {int(ds[BATCH])}): "
            + ("the prompt work no longer shares the decode steps, so much of the aggregated "
               "step was chunked prefill, not the KV cache."
               if dratio < 0.8 * ratio_out else
               "about the same as aggregated serving: the KV cache, not the shared prompt work, "
               "sets the step."))
    if pub_out:
        headline.append(
            f"- Public long-context tiers charge only {pub_out:g}x for output and {pub_in:g}x for "
            f"input above {k(pub_at)} tokens (Gemini 2.5/3.1 Pro, Claude Sonnet 4.x; "
            f"`reference/pricing.csv`): on this model that covers the cost of long prompts only "
            f"if most traffic is short (the flat price cross-subsidises the long tail) or the "
            f"KV cache and prompt work are much smaller (MLA, sliding windows, prefix caching).")
    cols = [ISL, "design_id", "layout.tp", "layout.pp", BATCH, "usd_per_mtok_output",
            "usd_per_mtok_input", "tpot_s", "ttft_s", "kv_read_s", "rest_s", "kv_share",
            "prompt_time_share", "crossover_isl"]
    table = _ms(best[cols].copy())
    table_free = _ms(free[cols].copy())
    details = "\n".join([
        "## Method", "",
        f"- Space: every prompt length x tp x pp x batch of `{ctx.space.file}` is scored "
        f"({len(df):,} designs, {int(ok.sum()):,} feasible under {slo}).",
        f"- Costs: per prompt length, the design with the lowest `usd_per_mtok_output` among "
        f"the feasible ones that meet {slo} (`usd_per_mtok_input` is minimised separately). "
        f"The {k(short)} figures are design {int(s['design_id'])} "
        f"({layout_text(s, ('layout.tp', 'layout.pp'))}), the {k(long)} figures design "
        f"{int(lg['design_id'])} ({layout_text(lg, ('layout.tp', 'layout.pp'))}). 'No SLO' "
        "drops the constraints and keeps only feasibility (the KV cache must fit).",
        "- KV split: the decode-only step of each best design, per op "
        "(`dse.perf.score(breakdown=True)`): `kv_read` is the `attn_core` memory time (reading "
        "the KV cache, plus writing the new token's KV); `rest` is the step's total minus it. "
        "The crossover holds the layout and batch fixed and solves for the prompt length at which "
        "the two are equal (decode context = prompt + half the answer).",
        "- The output cost counts the share of the step time spent on decode tokens; the input "
        "cost the share spent on prompt tokens (chunked prefill in the same steps).",
        "", f"### Best design per prompt length under {slo}", "",
        md_frame(table), "",
        "### Best design per prompt length with no SLO (feasible only)", "",
        md_frame(table_free), "",
        f"### Crossover prompt length vs batch ({layout_text(ref, ('layout.tp', 'layout.pp'))})",
        "", md_frame(sweep.round(0), 6), "",
        *([f"### Best design per prompt length with a disaggregated decode pool ({slo})", "",
           md_frame(_ms_tpot(dis.copy())), ""] if dis is not None else []),
    ])
    figs = _figures(ctx, best, split, free, sweep, ref, slo)
    ctx.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(ctx.out / "best-per-context.csv", index=False)
    lead = (Lead("output_price_step", f"Output price step of a "
                 f"{numbers['long_context_tokens'] / 1024:.0f}k-token prompt over "
                 f"{numbers['short_context_tokens'] / 1024:.0f}k", "x",
                 pick="long_best_design_id", pick_label="long-context design", versus=1.0),)
    return Answer("\n".join(headline), details, numbers, figs, lead)
