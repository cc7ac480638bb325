"""The memory wall: cost per token vs context with and without a KV tier for the prefix cache.

Per (accelerator, prompt length, ``serving.kv_offload``) the answer is the cheapest admissible
design ($ per request: input and output tokens at their $/Mtok, within the space's
constraints), its concurrency, TTFT and where the waiting conversations' prefixes are
(dse/perf/kvtier.py: running sequences' KV stays in HBM; the prefix cache keeps the
``workload.cached_conversations`` waiting conversations' reusable prefixes in the HBM the batch
leaves free, then in the tier, fetched once per returning request or recomputed; what neither
holds is evicted and recomputed). Cost per token is that $ per request over the request's
tokens (prompt + answer), per million.

Per accelerator and tier: the tier's worth is the cost without it over the cost with it; it
*pays from* the first context where that exceeds 1; it *stops helping* where it is full: the
first context at which the cheapest design with it still evicts waiting prefixes (a longer
context gains nothing more from it, and its worth falls back toward 1); the context at which
its bytes alone fill is given beside it. A table and a figure (``kv-tiers-wall.png``) give the
wall. KV bytes per token are the model's, at the KV dtype the design states.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse.build.designs import kv_dtype_text
from dse.questions.common import admissible, md_table, param_values, pyplot, save
from dse.questions.context import Answer, Context, Lead

COST = "usd_per_request"
PER_TOKEN = "usd_per_mtok_request"          # $ per million request tokens (prompt + answer)
KEYS = ["accelerator.id", "workload.isl", "serving.kv_offload"]
TIERS = ("host", "ssd")
PAYS = 1.0 + 1e-3                           # a worth above this is a tier that pays
EVICTED = 0.005                             # a share of prefixes evicted above this: tier full


def _tier_story(contexts, worth, evicted, fills_at) -> dict:
    """Where one tier pays, is full (stops helping) and peaks, over the sorted contexts."""
    contexts = [int(c) for c in contexts]
    pays = [c for c, w in zip(contexts, worth) if w is not None and w > PAYS]
    full = next((c for c, e in zip(contexts, evicted) if e is not None and e > EVICTED), None)
    known = [(w, c) for c, w in zip(contexts, worth) if w is not None]
    peak_w, peak_c = max(known) if known else (None, None)
    return {"pays_from": pays[0] if pays else None, "stops_helping": full,
            "fills_at_tokens": fills_at, "peak_worth": peak_w, "peak_context": peak_c,
            "worth_at_longest": known[-1][0] if known else None}


def _fills_at(ctx: Context, rows: pd.DataFrame) -> float | None:
    """The prompt length at which the waiting conversations' reusable prefixes fill the tier
    by themselves (the HBM the batch leaves free adds a little): tier bytes per chip x chips /
    (cached_conversations x prefix hit x KV bytes per token); None without a tier."""
    r = rows.iloc[:1]
    b = ctx.batch(param_values(ctx, r))
    tier = float(np.ravel(b.tier_bytes)[0]) * float(r["num_chips"].iloc[0])
    per = (float(np.ravel(b.cached_conversations)[0]) * float(np.ravel(b.prefix_hit_fraction)[0])
           * float(r["kv_bytes_per_token"].iloc[0]))
    return None if tier <= 0 or per <= 0 else tier / per


def _figure(ctx, wall: pd.DataFrame, stories: dict) -> str:
    plt = pyplot()
    accs = list(dict.fromkeys(wall["accelerator.id"]))
    fig, axes = plt.subplots(1, len(accs), figsize=(6.2 * len(accs), 4.6),
                             squeeze=False)
    styles = {"none": ("k", "-"), "host": ("#1f77b4", "--"), "ssd": ("#d62728", ":")}
    for ax, acc in zip(axes[0], accs):
        sub = wall[wall["accelerator.id"] == acc]
        for mode, (color, ls) in styles.items():
            s = sub[sub["serving.kv_offload"] == mode].sort_values("workload.isl")
            if s.empty:
                continue
            label = {"none": "no tier (HBM only)", "host": "host-memory tier",
                     "ssd": "NVMe tier"}[mode]
            st = stories.get(acc, {}).get(mode)
            if st and st["stops_helping"] is None and st["fills_at_tokens"] is not None:
                label += f" (fills at {st['fills_at_tokens']:,.0f} tokens: beyond the sweep)"
            ax.plot(s["workload.isl"], s[PER_TOKEN], ls, color=color, marker="o", ms=3,
                    label=label)
            if st and st["stops_helping"] is not None:
                x = st["stops_helping"]
                y = float(s.loc[s["workload.isl"] == x, PER_TOKEN].iloc[0])
                ax.scatter([x], [y], s=90, marker="x", color=color, zorder=5,
                           label=f"{label} full: stops helping ({x:,} tokens)")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v / 1024:g}k"))
        ax.set_yscale("log")
        ax.set_xlabel("prompt tokens (context)")
        ax.set_ylabel("$ per million request tokens (cheapest admissible)")
        ax.set_title(f"{acc}: the memory wall")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    return save(fig, ctx, "kv-tiers-wall.png")


def answer(ctx: Context) -> Answer:
    df = ctx.score()
    for k in KEYS:
        if k not in df:
            df[k] = ctx.space.base.get(k, "none")
    df = df[admissible(ctx, df)].reset_index(drop=True)
    tokens = {k: df[k] if k in df else float(ctx.space.base.get(k))
              for k in ("workload.isl", "workload.osl")}
    df[COST] = (df["usd_per_mtok_input"] * tokens["workload.isl"]
                + df["usd_per_mtok_output"] * tokens["workload.osl"]) / 1e6
    df[PER_TOKEN] = df[COST] / (tokens["workload.isl"] + tokens["workload.osl"]) * 1e6
    if df.empty:
        return Answer("- no admissible design")
    best = df.loc[df.groupby(KEYS)[COST].idxmin()].reset_index(drop=True)
    kv_dtypes = ctx.space.kv_dtypes(best["design_id"].to_numpy(np.int64))
    rows, lines, worth, stories, per_token, contexts_max = [], [], {}, {}, {}, {}
    for acc in dict.fromkeys(best["accelerator.id"]):
        sub = best[best["accelerator.id"] == acc].set_index(["workload.isl",
                                                             "serving.kv_offload"])
        contexts = sorted(sub.index.get_level_values(0).unique())
        contexts_max[acc] = int(contexts[-1])
        cols = {m: [] for m in ("none", *TIERS)}
        evicted = {m: [] for m in ("none", *TIERS)}
        pts = {m: [] for m in ("none", *TIERS)}
        for isl in contexts:
            for m in cols:
                r = sub.loc[(isl, m)] if (isl, m) in sub.index else None
                cols[m].append(None if r is None else float(r[COST]))
                pts[m].append(None if r is None else float(r[PER_TOKEN]))
                evicted[m].append(None if r is None else float(np.nan_to_num(
                    r.get("prefix_cache_evicted_fraction", 0.0))))
        tier_worth = {m: [None if n is None or t is None else n / t
                          for n, t in zip(cols["none"], cols[m])] for m in TIERS}
        stories[acc] = {m: _tier_story(contexts, tier_worth[m], evicted[m], _fills_at(
            ctx, best[(best["accelerator.id"] == acc) & (best["serving.kv_offload"] == m)]))
            for m in TIERS if any(v is not None for v in cols[m])}
        for i, isl in enumerate(contexts):
            ws = [w[i] for w in tier_worth.values() if w[i] is not None]
            worth[f"{acc}/{int(isl)}"] = max(ws) if ws else None
            per_token[f"{acc}/{int(isl)}"] = {m: pts[m][i] for m in cols}
            pt = per_token[f"{acc}/{int(isl)}"]
            rows.append([acc, f"{int(isl):,}"]
                        + ["infeasible" if pt[m] is None else f"${pt[m]:.3f}" for m in cols]
                        + ["-" if tier_worth[m][i] is None else f"{tier_worth[m][i]:.2f}x"
                           for m in TIERS]
                        + ["-" if evicted[m][i] is None else f"{evicted[m][i]:.0%}"
                           for m in cols])
        kvt = float(df[df["accelerator.id"] == acc]["kv_bytes_per_token"].iloc[0])
        parts = []
        for m, st in stories[acc].items():
            name = {"host": "Host memory", "ssd": "NVMe"}[m]
            if st["pays_from"] is None:
                parts.append(f"{name} never pays here")
                continue
            fills = "" if st["fills_at_tokens"] is None else \
                f"; by its bytes alone it fills at {st['fills_at_tokens']:,.0f}-token prompts"
            parts.append(
                f"{name} pays from {st['pays_from']:,}-token prompts and peaks at "
                f"{st['peak_worth']:.2f}x at {st['peak_context']:,}; "
                + (f"it stops helping from {st['stops_helping']:,} tokens (full: the waiting "
                   f"prefixes outgrow it, {st['worth_at_longest']:.2f}x at {contexts[-1]:,})"
                   if st["stops_helping"] is not None else
                   f"it holds every waiting prefix up to {contexts[-1]:,} tokens "
                   f"({st['worth_at_longest']:.2f}x there)") + fills)
        kv = kv_dtype_text(kv_dtypes[(best["accelerator.id"] == acc).to_numpy()])
        lines.append(f"- **{acc}**: {kvt / 1e3:,.0f} kB of KV per token, "
                     f"{kvt * 200_000 / 1e9:,.1f} GB for a 200k-token context; KV cache: {kv}. "
                     + ". ".join(parts) + ".")
    table = md_table(["accelerator", "prompt tokens", "$/Mtok, no tier", "$/Mtok, host tier",
                      "$/Mtok, NVMe tier", "host worth", "NVMe worth",
                      "prefixes evicted, no tier", "evicted, host", "evicted, NVMe"], rows)
    srows = [[acc, {"host": "host memory", "ssd": "NVMe"}[m],
              "never" if st["pays_from"] is None else f"{st['pays_from']:,}",
              "-" if st["peak_worth"] is None else f"{st['peak_worth']:.2f}x at "
              f"{st['peak_context']:,}",
              f"beyond {contexts_max[acc]:,}" if st["stops_helping"] is None
              else f"{st['stops_helping']:,}",
              "-" if st["fills_at_tokens"] is None else f"{st['fills_at_tokens']:,.0f}",
              "-" if st["worth_at_longest"] is None else f"{st['worth_at_longest']:.2f}x"]
             for acc, by in stories.items() for m, st in by.items()]
    stable = md_table(["accelerator", "tier", "pays from (prompt tokens)", "peak worth",
                       "stops helping: full from (prompt tokens)",
                       "fills by its bytes alone at (prompt tokens)",
                       "worth at the longest context"], srows)
    wall = best.copy()
    fig = _figure(ctx, wall, stories)
    details = f"""## Method

- Space: {ctx.space.size:,} designs ({', '.join(p.path for p in ctx.space.parameters)}); \
{len(df):,} admissible ({', '.join(f'{c.metric} <= {c.max:g}' for c in ctx.space.constraints if c.max is not None) or 'no constraint'}).
- Per (accelerator, prompt length, offload): the cheapest admissible design by $ per request \
(input tokens x $/Mtok input + output tokens x $/Mtok output); cost per token = $ per \
request / (prompt + answer tokens), per million. "worth" = cost without a tier / with it (>1: \
the tier pays). A tier *pays from* the first context it is worth more than 1 at; it *stops \
helping* where it is full: the first context at which the cheapest design with it still evicts \
over {EVICTED:.1%} of the waiting prefixes. From there a longer context gains nothing more from \
the tier (it holds a fixed number of bytes while the prefixes grow), so its worth falls back \
toward 1. "fills by its bytes alone" = tier bytes per chip x chips / (cached conversations x \
prefix hit x KV bytes per token): the same wall from the catalog's figures, without the HBM \
the batch leaves free. Host memory, NVMe and their links \
per chip: `dse/catalog/memory_tiers.toml` (Grace LPDDR over NVLink-C2C on GB200, host DRAM \
over PCIe Gen5 on H200; one NVMe data drive per GPU). KV cache: {kv_dtype_text(kv_dtypes)}.
- The physics (`dse/perf/kvtier.py`), as vLLM's KV offloading / LMCache, SGLang HiCache and \
Dynamo KVBM use a second tier: the running batch's KV stays in HBM (a tier buys no \
concurrency, and no decode step streams KV over the host link); the prefix cache must keep \
the reusable prefix (prefix hit x prompt tokens) of every conversation waiting for its next \
turn (`workload.cached_conversations` per instance) -- in the HBM the batch leaves free, then in \
the tier; a hit held in the tier is fetched once per returning request (its TTFT, and the \
link bounds the steps when busier than them) or recomputed when that is cheaper; a hit \
neither holds is evicted and its tokens are prefilled again. The tier pays where the waiting \
prefixes outgrow free HBM: long contexts and large batches; it stops paying as fully where they \
outgrow the tier too.

## Where each tier pays, fills and stops helping

{stable}

## The memory wall: cost per token by context

{table}
"""
    longest = {}
    for key in worth:
        acc, isl = key.rsplit("/", 1)
        longest[acc] = max(longest.get(acc, 0), int(isl))
    lead = tuple(Lead(f"tier_worth.{a}/{i}", f"{a}: a KV tier at {i:,}-token prompts (cost per "
                      "request without / with it)", "x", versus=1.0) for a, i in longest.items())
    numbers = {"tier_worth": worth, "tiers": stories, "usd_per_mtok_request": per_token,
               "kv_dtype": kv_dtype_text(kv_dtypes)}
    return Answer("\n".join(lines), details, numbers, [fig], lead)
