"""The memory wall: cost per token vs context with and without a host-memory KV tier.

Per (accelerator, prompt length, ``serving.kv_offload``) the answer is the cheapest admissible
design ($/Mtok output, within the space's constraints), its concurrency and the share of its KV
in the tier (dse/perf/kvtier.py: the KV beyond HBM lives in host memory, its share of every
step's KV read comes over the chip's host link, prefix hits are fetched or recomputed once the
design offloads). The tier is worth the price ratio without / with it; it stops helping at the
first context where the cheapest design with it is not cheaper. KV bytes per token are the
model's, at the KV dtype the design states.
"""

from __future__ import annotations

import numpy as np

from dse.questions import Answer, Context
from dse.questions._common import admissible, md_table

COST = "usd_per_mtok_output"
KEYS = ["accelerator.id", "workload.isl", "serving.kv_offload"]


def answer(ctx: Context) -> Answer:
    df = ctx.score()
    for k in KEYS:
        if k not in df:
            df[k] = ctx.space.base.get(k, "none")
    df = df[admissible(ctx, df)].reset_index(drop=True)
    if df.empty:
        return Answer("- no admissible design")
    best = df.loc[df.groupby(KEYS)[COST].idxmin()].set_index(KEYS)
    rows, lines, worth = [], [], {}
    for acc in best.index.get_level_values(0).unique():
        stop = None
        for isl in sorted(best.loc[acc].index.get_level_values(0).unique()):
            sub = best.loc[(acc, isl)]
            no = sub.loc["none"] if "none" in sub.index else None
            yes = sub.loc["host"] if "host" in sub.index else None
            ratio = np.nan if no is None or yes is None else no[COST] / yes[COST]
            worth[f"{acc}/{int(isl)}"] = None if np.isnan(ratio) else float(ratio)
            if stop is None and (no is not None and (yes is None or ratio <= 1.0 + 1e-9)):
                stop = isl
            for mode, r in (("none", no), ("host", yes)):
                if r is None:
                    rows.append([acc, f"{int(isl):,}", mode, "infeasible", "-", "-", "-", "-"])
                    continue
                rows.append([acc, f"{int(isl):,}", mode, f"${r[COST]:.3f}",
                             f"{int(r['workload.concurrency']):,}", r["tpot_s"] * 1e3,
                             f"{np.nan_to_num(r.get('kv_offloaded_fraction', 0.0)):.0%}",
                             "-" if mode == "none" or np.isnan(ratio) else f"{ratio:.2f}x"])
        kvt = float(df[df["accelerator.id"] == acc]["kv_bytes_per_token"].iloc[0])
        lines.append(f"- **{acc}**: {kvt / 1e3:,.0f} kB of KV per token "
                     f"({kvt * 200_000 / 1e9:,.1f} GB for a 200k-token context); the host tier "
                     + ("helps at every context in the space" if stop is None else
                        f"stops helping at {int(stop):,}-token prompts"
                        if stop != min(best.loc[acc].index.get_level_values(0)) else
                        "never helps here") + ".")
    table = md_table(["accelerator", "prompt tokens", "KV offload", "$/Mtok output", "batch",
                      "TPOT ms", "KV in the tier", "tier worth"], rows)
    details = f"""## Method

- Space: {ctx.space.size:,} designs ({', '.join(p.path for p in ctx.space.parameters)}); \
{len(df):,} admissible ({', '.join(f'{c.metric} <= {c.max:g}' for c in ctx.space.constraints if c.max is not None) or 'no constraint'}).
- Per (accelerator, prompt length, offload): the cheapest admissible design. "tier worth" = \
$/Mtok without the tier / with it (>1: the tier pays). Host memory and link per chip: \
`dse/catalog/memory_tiers.toml` (Grace LPDDR over NVLink-C2C on GB200, host DRAM over PCIe \
Gen5 on H200); the link time of the offloaded KV overlaps the step (layer-by-layer prefetch).
- Why a tier that streams the offloaded KV every step buys so little: it can hold at most \
(host link bandwidth / HBM bandwidth) as many sequences as HBM before its link, not HBM, sets \
the step, a few percent on these chips, below this space's batch grid. What a host tier holds \
beyond that is priced by the link, so past HBM capacity cost per token rises with context at \
the link's speed, not HBM's (`tests/test_kvtier.py`).

## Cheapest design by context

{table}
"""
    return Answer("\n".join(lines), details, {"tier_worth": worth}, [])
