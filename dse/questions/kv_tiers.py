"""The memory wall: cost per request vs context with and without a KV tier for the prefix cache.

Per (accelerator, prompt length, ``serving.kv_offload``) the answer is the cheapest admissible
design ($ per request: input and output tokens at their $/Mtok, within the space's
constraints), its concurrency, TTFT and where the waiting conversations' prefixes are
(dse/perf/kvtier.py: running sequences' KV stays in HBM; the prefix cache keeps the
``workload.cached_conversations`` waiting conversations' reusable prefixes in the HBM the batch
leaves free, then in the tier, fetched once per returning request or recomputed; what neither
holds is evicted and recomputed). The tier is worth the price ratio without / with it; it stops
helping at the first context where the cheapest design with it is not cheaper. KV bytes per
token are the model's, at the KV dtype the design states.
"""

from __future__ import annotations

import numpy as np

from dse.questions import Answer, Context, Lead
from dse.questions._common import admissible, md_table

COST = "usd_per_request"
KEYS = ["accelerator.id", "workload.isl", "serving.kv_offload"]


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
    if df.empty:
        return Answer("- no admissible design")
    best = df.loc[df.groupby(KEYS)[COST].idxmin()].set_index(KEYS)
    rows, lines, worth = [], [], {}
    for acc in best.index.get_level_values(0).unique():
        for isl in sorted(best.loc[acc].index.get_level_values(0).unique()):
            sub = best.loc[(acc, isl)]
            no = sub.loc["none"] if "none" in sub.index else None
            tiers = [(m, sub.loc[m]) for m in ("host", "ssd") if m in sub.index]
            best_tier = min((r[COST] for _, r in tiers), default=np.nan)
            ratio = np.nan if no is None or not tiers else no[COST] / best_tier
            worth[f"{acc}/{int(isl)}"] = None if np.isnan(ratio) else float(ratio)
            for mode, r in [("none", no)] + tiers:
                if r is None:
                    rows.append([acc, f"{int(isl):,}", mode, "infeasible"] + ["-"] * 6)
                    continue
                rows.append([acc, f"{int(isl):,}", mode, f"${r[COST]:.4f}",
                             f"{int(r['workload.concurrency']):,}", f"{r['ttft_s']:.2f}",
                             r["tpot_s"] * 1e3,
                             f"{np.nan_to_num(r.get('kv_offloaded_fraction', 0.0)):.0%}",
                             f"{np.nan_to_num(r.get('prefix_cache_evicted_fraction', 0.0)):.0%}",
                             "-" if mode == "none" or no is None else
                             f"{no[COST] / r[COST]:.2f}x"])
        kvt = float(df[df["accelerator.id"] == acc]["kv_bytes_per_token"].iloc[0])
        pays = [(isl, w) for key, w in worth.items() if key.startswith(f"{acc}/") and w
                for isl in [int(key.split("/")[1])] if w > 1.0 + 1e-3]
        lines.append(f"- **{acc}**: {kvt / 1e3:,.0f} kB of KV per token "
                     f"({kvt * 200_000 / 1e9:,.1f} GB for a 200k-token context); a KV tier "
                     + ("never pays here" if not pays else
                        "pays from " + f"{min(i for i, _ in pays):,}-token prompts (up to "
                        + f"{max(w for _, w in pays):.2f}x cheaper per request)") + ".")
    table = md_table(["accelerator", "prompt tokens", "KV offload", "$ per request", "batch",
                      "TTFT s", "TPOT ms", "prefixes in the tier", "prefixes evicted",
                      "tier worth"], rows)
    details = f"""## Method

- Space: {ctx.space.size:,} designs ({', '.join(p.path for p in ctx.space.parameters)}); \
{len(df):,} admissible ({', '.join(f'{c.metric} <= {c.max:g}' for c in ctx.space.constraints if c.max is not None) or 'no constraint'}).
- Per (accelerator, prompt length, offload): the cheapest admissible design by $ per request \
(input tokens x $/Mtok input + output tokens x $/Mtok output). "tier worth" = $ per request \
without a tier / with it (>1: the tier pays). Host memory, NVMe and their links per chip: \
`dse/catalog/memory_tiers.toml` (Grace LPDDR over NVLink-C2C on GB200, host DRAM over PCIe \
Gen5 on H200; one NVMe data drive per GPU).
- The physics (`dse/perf/kvtier.py`), as vLLM's KV offloading / LMCache, SGLang HiCache and \
Dynamo KVBM use a second tier: the running batch's KV stays in HBM (a tier buys no \
concurrency, and no decode step streams KV over the host link); the prefix cache must keep \
the reusable prefix (prefix hit x prompt tokens) of every conversation waiting for its next \
turn (`workload.cached_conversations` per instance) -- in the HBM the batch leaves free, then in \
the tier; a hit held in the tier is fetched once per returning request (its TTFT, and the \
link bounds the steps when busier than them) or recomputed when that is cheaper; a hit \
neither holds is evicted and its tokens are prefilled again. The tier pays where the waiting \
prefixes outgrow free HBM: long contexts and large batches.

## Cheapest design by context

{table}
"""
    longest = {}
    for key in worth:
        acc, isl = key.rsplit("/", 1)
        longest[acc] = max(longest.get(acc, 0), int(isl))
    lead = tuple(Lead(f"tier_worth.{a}/{i}", f"{a}: a KV tier at {i:,}-token prompts (cost per "
                      "request without / with it)", "x", versus=1.0) for a, i in longest.items())
    return Answer("\n".join(lines), details, {"tier_worth": worth}, [], lead)
