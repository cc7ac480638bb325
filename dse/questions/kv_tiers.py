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
from dse.questions.common import (
    Picks,
    admissible_designs,
    best_per,
    dress,
    limits_text,
    md_table,
    param_values,
    pyplot,
    save,
    space_text,
    subplots,
)
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


MODES = ("none", *TIERS)
LABEL = {"none": "no tier (HBM only)", "host": "host-memory tier", "ssd": "NVMe tier"}
NAME = {"host": "host memory", "ssd": "NVMe"}
TITLE = {"host": "Host memory", "ssd": "NVMe"}


def _figure(ctx: Context, s: Picks) -> str:
    wall, stories = s.best, {acc: a.stories for acc, a in s.accs.items()}
    accs = list(dict.fromkeys(wall["accelerator.id"]))
    fig, axes = subplots(1, len(accs), figsize=(6.2 * len(accs), 4.6), squeeze=False)
    styles = {"none": ("k", "-"), "host": ("#1f77b4", "--"), "ssd": ("#d62728", ":")}
    for ax, acc in zip(axes[0], accs):
        sub = wall[wall["accelerator.id"] == acc]
        for mode, (color, ls) in styles.items():
            c = sub[sub["serving.kv_offload"] == mode].sort_values("workload.isl")
            if c.empty:
                continue
            label = LABEL[mode]
            st = stories.get(acc, {}).get(mode)
            if st and st["stops_helping"] is None and st["fills_at_tokens"] is not None:
                label += f" (fills at {st['fills_at_tokens']:,.0f} tokens: beyond the sweep)"
            ax.plot(c["workload.isl"], c[PER_TOKEN], ls, color=color, marker="o", ms=3,
                    label=label)
            if st and st["stops_helping"] is not None:
                x = st["stops_helping"]
                y = float(c.loc[c["workload.isl"] == x, PER_TOKEN].iloc[0])
                ax.scatter([x], [y], s=90, marker="x", color=color, zorder=5,
                           label=f"{label} full: stops helping ({x:,} tokens)")
        dress(ax, "prompt tokens (context)", "$ per million request tokens (cheapest admissible)",
              f"{acc}: the memory wall", xlog=2, ylog=10, legend=7)
        ax.xaxis.set_major_formatter(pyplot().FuncFormatter(lambda v, _: f"{v / 1024:g}k"))
    return save(fig, ctx, "kv-tiers-wall.png")


def answer(ctx: Context) -> Answer:
    s = Picks(df=_priced(ctx))
    if s.df.empty:
        return Answer("- no admissible design")
    s.best = best_per(s.df, KEYS, COST)      # per (accelerator, prompt length, offload)
    s.kv_dtypes = ctx.space.kv_dtypes(s.best["design_id"].to_numpy(np.int64))
    # per accelerator: the wall by context, what each tier is worth, where it pays and fills
    s.accs = {acc: _accelerator(ctx, s.best, acc)
              for acc in dict.fromkeys(s.best["accelerator.id"])}
    fig = _figure(ctx, s)
    return Answer("\n".join(_accelerator_line(s, acc, a) for acc, a in s.accs.items()),
                  _details(ctx, s), _numbers(s), [fig], _lead(s))


def _priced(ctx: Context) -> pd.DataFrame:
    """The admissible designs with their $ per request and per million request tokens."""
    df = ctx.score()
    for k in KEYS:
        if k not in df:
            df[k] = ctx.space.base.get(k, "none")
    df = admissible_designs(ctx, df)
    tokens = {k: df[k] if k in df else float(ctx.space.base.get(k))
              for k in ("workload.isl", "workload.osl")}
    df[COST] = (df["usd_per_mtok_input"] * tokens["workload.isl"]
                + df["usd_per_mtok_output"] * tokens["workload.osl"]) / 1e6
    df[PER_TOKEN] = df[COST] / (tokens["workload.isl"] + tokens["workload.osl"]) * 1e6
    return df


def _accelerator(ctx: Context, best: pd.DataFrame, acc: str) -> Picks:
    """One accelerator's wall: per offload mode and context (sorted) the cheapest design's $ per
    request (``cost``), per million request tokens and share of prefixes evicted; each tier's
    worth per context and its story (where it pays, is full, peaks)."""
    sub = best[best["accelerator.id"] == acc].set_index(["workload.isl", "serving.kv_offload"])
    a = Picks(contexts=sorted(sub.index.get_level_values(0).unique()))
    a.cost, a.per_token, a.evicted = ({m: [] for m in MODES} for _ in range(3))
    for isl in a.contexts:
        for m in MODES:
            r = sub.loc[(isl, m)] if (isl, m) in sub.index else None
            a.cost[m].append(None if r is None else float(r[COST]))
            a.per_token[m].append(None if r is None else float(r[PER_TOKEN]))
            a.evicted[m].append(None if r is None else float(np.nan_to_num(
                r.get("prefix_cache_evicted_fraction", 0.0))))
    a.worth = {m: [None if n is None or t is None else n / t
                   for n, t in zip(a.cost["none"], a.cost[m])] for m in TIERS}
    a.stories = {m: _tier_story(a.contexts, a.worth[m], a.evicted[m], _fills_at(
        ctx, best[(best["accelerator.id"] == acc) & (best["serving.kv_offload"] == m)]))
        for m in TIERS if any(v is not None for v in a.cost[m])}
    return a


def _numbers(s: Picks) -> dict:
    """Per ``accelerator/context``: the best tier's worth and the $/Mtok of each mode; each
    tier's story."""
    worth, per_token = {}, {}
    for acc, a in s.accs.items():
        for i, isl in enumerate(a.contexts):
            ws = [w[i] for w in a.worth.values() if w[i] is not None]
            worth[f"{acc}/{int(isl)}"] = max(ws) if ws else None
            per_token[f"{acc}/{int(isl)}"] = {m: a.per_token[m][i] for m in MODES}
    return {"tier_worth": worth, "tiers": {acc: a.stories for acc, a in s.accs.items()},
            "usd_per_mtok_request": per_token, "kv_dtype": kv_dtype_text(s.kv_dtypes)}


def _lead(s: Picks) -> tuple:
    """Each accelerator's tier worth at its longest context."""
    return tuple(Lead(f"tier_worth.{acc}/{int(a.contexts[-1])}", f"{acc}: a KV tier at "
                      f"{int(a.contexts[-1]):,}-token prompts (cost per request without / with "
                      "it)", "x", versus=1.0) for acc, a in s.accs.items())


def _accelerator_line(s: Picks, acc: str, a: Picks) -> str:
    """One accelerator's KV bytes and where each tier pays and stops helping, in words."""
    kvt = float(s.df[s.df["accelerator.id"] == acc]["kv_bytes_per_token"].iloc[0])
    longest, parts = a.contexts[-1], []
    for m, st in a.stories.items():
        name = TITLE[m]
        if st["pays_from"] is None:
            parts.append(f"{name} never pays here")
            continue
        fills = "" if st["fills_at_tokens"] is None else \
            f"; by its bytes alone it fills at {st['fills_at_tokens']:,.0f}-token prompts"
        parts.append(
            f"{name} pays from {st['pays_from']:,}-token prompts and peaks at "
            f"{st['peak_worth']:.2f}x at {st['peak_context']:,}; "
            + (f"it stops helping from {st['stops_helping']:,} tokens (full: the waiting "
               f"prefixes outgrow it, {st['worth_at_longest']:.2f}x at {longest:,})"
               if st["stops_helping"] is not None else
               f"it holds every waiting prefix up to {longest:,} tokens "
               f"({st['worth_at_longest']:.2f}x there)") + fills)
    kv = kv_dtype_text(s.kv_dtypes[(s.best["accelerator.id"] == acc).to_numpy()])
    return (f"- **{acc}**: {kvt / 1e3:,.0f} kB of KV per token, "
            f"{kvt * 200_000 / 1e9:,.1f} GB for a 200k-token context; KV cache: {kv}. "
            + ". ".join(parts) + ".")


def _wall_table(s: Picks) -> str:
    rows = []
    for acc, a in s.accs.items():
        for i, isl in enumerate(a.contexts):
            rows.append([acc, f"{int(isl):,}"]
                        + ["infeasible" if a.per_token[m][i] is None
                           else f"${a.per_token[m][i]:.3f}" for m in MODES]
                        + ["-" if a.worth[m][i] is None else f"{a.worth[m][i]:.2f}x"
                           for m in TIERS]
                        + ["-" if a.evicted[m][i] is None else f"{a.evicted[m][i]:.0%}"
                           for m in MODES])
    return md_table(["accelerator", "prompt tokens", "$/Mtok, no tier", "$/Mtok, host tier",
                     "$/Mtok, NVMe tier", "host worth", "NVMe worth",
                     "prefixes evicted, no tier", "evicted, host", "evicted, NVMe"], rows)


def _story_table(s: Picks) -> str:
    rows = [[acc, NAME[m],
             "never" if st["pays_from"] is None else f"{st['pays_from']:,}",
             "-" if st["peak_worth"] is None else f"{st['peak_worth']:.2f}x at "
             f"{st['peak_context']:,}",
             f"beyond {int(a.contexts[-1]):,}" if st["stops_helping"] is None
             else f"{st['stops_helping']:,}",
             "-" if st["fills_at_tokens"] is None else f"{st['fills_at_tokens']:,.0f}",
             "-" if st["worth_at_longest"] is None else f"{st['worth_at_longest']:.2f}x"]
            for acc, a in s.accs.items() for m, st in a.stories.items()]
    return md_table(["accelerator", "tier", "pays from (prompt tokens)", "peak worth",
                     "stops helping: full from (prompt tokens)",
                     "fills by its bytes alone at (prompt tokens)",
                     "worth at the longest context"], rows)


def _details(ctx: Context, s: Picks) -> str:
    return f"""## Method

- Space: {space_text(ctx)}; \
{len(s.df):,} admissible ({limits_text(ctx, "no constraint")}).
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
over PCIe Gen5 on H200; one NVMe data drive per GPU). KV cache: {kv_dtype_text(s.kv_dtypes)}.
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

{_story_table(s)}

## The memory wall: cost per token by context

{_wall_table(s)}
"""
