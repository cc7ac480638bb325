"""What an output token costs next to an input token, against public API price ratios.

Decode is memory-bound at small batch and prefill compute-bound, so an output token costs more
than an input token (``shared/reference/podcast.md`` 1.10: APIs charge ~3-5x). Under continuous
batching with chunked prefill the scorer splits each step's cost between decode and prefill by
the time the prompt tokens add to the decode-only step: ``usd_per_mtok_output`` and
``usd_per_mtok_input``. Their ratio falls as the batch grows (the weight fetch that makes decode
expensive is amortized), so the answer is given per model at its cost-optimal design, at the
cheapest design streaming ``interactive_tokens_per_s_per_user``, and along the batch on the
cost-optimal layout. The public ratios are read at analysis time from ``pricing_csv`` (each
row's output / input $/Mtok; a row with time-of-day prices "a / b" gives one ratio per pair).
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import pandas as pd

from dse.questions.common import (
    Picks,
    admissible_designs,
    describe,
    dress,
    layout_curve,
    layout_pairs,
    limits_text,
    md_table,
    save,
    subplots,
)
from dse.questions.context import Answer, Context, Lead

OUT, IN = "usd_per_mtok_output", "usd_per_mtok_input"
SPEED = "output_tokens_per_s_per_user"
BATCH = "workload.concurrency"
LAYOUT = ("layout.tp", "layout.dp", "layout.ep")
ROOT = Path(__file__).resolve().parents[2]


# public API prices shipped with the package (a copy of ../shared/reference/pricing.csv; every
# row cites its source and the date it was observed)
PACKAGED = Path(__file__).resolve().parents[1] / "catalog" / "pricing.csv"


def find_pricing(name: str) -> Path | None:
    """The packaged price list when ``name`` is blank, else ``name`` as given (from the working
    directory) or relative to the repository root."""
    if not name:
        return PACKAGED if PACKAGED.is_file() else None
    for p in (Path(name), ROOT / name):
        if p.is_file():
            return p
    return None


def _prices(text: str) -> list[float] | None:
    nums = re.findall(r"\d+(?:\.\d+)?", text or "")
    parts = [t.strip() for t in (text or "").split("/")]
    if not nums or len(nums) != len(parts):
        return None
    return [float(x) for x in nums]


def public_ratios(path: Path) -> tuple[pd.DataFrame, list[str]]:
    """Each price row's output/input ratio; the rows that carry no usable pair of prices."""
    rows, skipped = [], []
    with path.open(newline="") as f:
        for r in csv.DictReader(f):
            i, o = _prices(r.get("input_usd_per_Mtok", "")), _prices(r.get("output_usd_per_Mtok", ""))
            name = f"{r.get('provider', '')} {r.get('model', '')} ({r.get('tier_or_condition', '')})"
            if not i or not o or len(i) != len(o) or min(i) <= 0:
                skipped.append(name)
                continue
            for a, b in zip(i, o):
                rows.append({"provider": r.get("provider", ""), "model": r.get("model", ""),
                             "tier": r.get("tier_or_condition", ""), "input_usd_per_mtok": a,
                             "output_usd_per_mtok": b, "ratio": b / a})
    return pd.DataFrame(rows), skipped


def crossing_batch(c: pd.DataFrame, target: float):
    """The smallest batch on the curve whose ratio is at most ``target`` (None if none is)."""
    below = c[c["ratio"] <= target]
    return None if below.empty else below.iloc[0]


def _figure(ctx: Context, res: list[dict], pub: pd.DataFrame) -> str:
    fig, (a1, a2) = subplots(1, 2, figsize=(12, 5), gridspec_kw={"width_ratios": [3, 2]})
    for i, r in enumerate(res):
        c, o = r["curve"], r["opt"]
        a1.plot(c[BATCH], c["ratio"], c=f"C{i}", label=f"{r['model']} ({layout_pairs(o, LAYOUT)})")
        a1.scatter([o[BATCH]], [o["ratio"]], c=f"C{i}", s=50, edgecolors="k", zorder=5)
        if r["fast"] is not None:
            a1.scatter([r["fast"][BATCH]], [r["fast"]["ratio"]], c=f"C{i}", marker="^", s=50,
                       edgecolors="k", zorder=5)
    if len(pub):
        a1.axhspan(pub["ratio"].min(), pub["ratio"].max(), color="#999999", alpha=0.15,
                   label="public APIs: range")
        a1.axhline(pub["ratio"].median(), c="k", ls="--", lw=1, label="public APIs: median")
        lab = (pub["provider"] + " " + pub["model"] + " " + pub["tier"].str.slice(0, 18)).tolist()
        order = np.argsort(pub["ratio"].to_numpy())
        a2.barh(range(len(pub)), pub["ratio"].to_numpy()[order], color="#888888")
        a2.set_yticks(range(len(pub)))
        a2.set_yticklabels([lab[j] for j in order], fontsize=5)
        a2.axvline(pub["ratio"].median(), c="k", ls="--", lw=1)
        a2.set_xlabel("output / input price")
        a2.set_title("public API price ratios (pricing.csv)", fontsize=9)
    else:
        a2.text(0.5, 0.5, "pricing.csv not found", ha="center", transform=a2.transAxes)
    dress(a1, "batch (concurrent sequences per instance)", r"\$/Mtok output / \$/Mtok input",
          "cost ratio of an output to an input token (dot: cost optimum; "
          "triangle: interactive design)", xlog=10, ylog=10, legend=7, title_size=9)
    return save(fig, ctx, "token-prices.png")


def answer(ctx: Context) -> Answer:
    s = Picks(fast_tps=float(ctx.param("interactive_tokens_per_s_per_user", 30.0)),
              csv_name=str(ctx.param("pricing_csv", "")))
    s.df = admissible_designs(ctx)
    s.df["ratio"] = s.df[OUT] / s.df[IN]
    s.res = [_per_model(s.df[s.df["model.id"] == m], m, s.fast_tps)
             for m in dict.fromkeys(s.df["model.id"])]
    s.path = find_pricing(s.csv_name)
    s.pub, s.skipped = public_ratios(s.path) if s.path else (pd.DataFrame(), [])
    figs = [_figure(ctx, s.res, s.pub)]
    s.med = float(s.pub["ratio"].median()) if len(s.pub) else None
    for r in s.res:
        r["cross"] = None if s.med is None else crossing_batch(r["curve"], s.med)
    s.opt_ratios = np.array([r["opt"]["ratio"] for r in s.res])
    return Answer(_headline(s), _details(ctx, s), _numbers(s), figs, LEAD)


def _per_model(g: pd.DataFrame, model: str, fast_tps: float) -> dict:
    """One model's cost optimum, its layout over every batch (``curve``), its cheapest design
    streaming ``fast_tps`` (``fast``) and the range of its ratios."""
    opt = g.loc[g[OUT].idxmin()]
    fg = g[g[SPEED] >= fast_tps]
    return {"model": model, "opt": opt, "curve": layout_curve(g, opt, LAYOUT),
            "fast": None if fg.empty else fg.loc[fg[OUT].idxmin()],
            "range": (g["ratio"].min(), g["ratio"].max())}


def _headline(s: Picks) -> str:
    res, opt_ratios, med, pub = s.res, s.opt_ratios, s.med, s.pub
    fast_ratios = np.array([r["fast"]["ratio"] for r in res if r["fast"] is not None])
    head = [f"- At each model's cost-optimal design an **output token costs "
            f"{opt_ratios.min():.1f}x to {opt_ratios.max():.1f}x an input token** "
            f"(median {np.median(opt_ratios):.1f}x): "
            + "; ".join(f"{r['model']} {r['opt']['ratio']:.1f}x (${r['opt'][OUT]:.3f} vs "
                        f"${r['opt'][IN]:.3f}/Mtok, batch {int(r['opt'][BATCH]):,})" for r in res) + "."]
    if len(fast_ratios):
        head.append(f"- At the cheapest design streaming >= {s.fast_tps:g} tokens/s/user: "
                    f"{fast_ratios.min():.1f}x to {fast_ratios.max():.1f}x ("
                    + "; ".join(f"{r['model']} {r['fast']['ratio']:.1f}x at batch "
                                f"{int(r['fast'][BATCH]):,}" for r in res if r["fast"] is not None)
                    + ").")
    if med is None:
        head.append(f"- Public API ratios: the price file `{s.csv_name}` was not found, so there "
                    "is no comparison.")
    else:
        head.append(f"- **Public APIs charge a median {med:.1f}x** (range {pub['ratio'].min():.1f}x"
                    f" to {pub['ratio'].max():.1f}x over {len(pub)} prices of "
                    f"{pub['provider'].nunique()} providers in `{s.path.name}`), "
                    f"{'above' if med > np.median(opt_ratios) else 'at or below'} the modelled "
                    f"median at the cost optimum; on the cost-optimal layout the modelled ratio is at most "
                    f"{med:.1f}x from batch: "
                    + "; ".join(f"{r['model']} batch {int(r['cross'][BATCH]):,}" if r["cross"] is not None
                                else f"{r['model']} never" for r in res) + ".")
    return "\n".join(head)


def _models_table(s: Picks) -> str:
    rows = [[r["model"], layout_pairs(r["opt"], LAYOUT),
             int(r["opt"][BATCH]), r["opt"][OUT], r["opt"][IN], r["opt"]["ratio"],
             "-" if r["fast"] is None else f"{r['fast']['ratio']:.3g} (batch {int(r['fast'][BATCH]):,})",
             f"{r['range'][0]:.3g} - {r['range'][1]:.3g}",
             "-" if r["cross"] is None else f"{int(r['cross'][BATCH]):,}"] for r in s.res]
    return md_table(["model", "cost-optimal layout", "batch", "$/Mtok output", "$/Mtok input",
                     "output/input", f"output/input at >= {s.fast_tps:g} tok/s/user",
                     "output/input over all admissible designs",
                     "batch where the ratio falls to the public median"], rows)


def _details(ctx: Context, s: Picks) -> str:
    path, pub = s.path, s.pub
    pub_table = "" if not len(pub) else md_table(
        ["provider", "model", "tier", "input $/Mtok", "output $/Mtok", "output/input"],
        [[p.provider, p.model, p.tier, p.input_usd_per_mtok, p.output_usd_per_mtok, p.ratio]
         for p in pub.itertuples()])
    cols = (OUT, IN, "ratio", SPEED)
    method = "\n".join(
        f"- {r['model']}: cost optimum {describe(r['opt'], cols)}; "
        f"interactive {'none' if r['fast'] is None else describe(r['fast'], cols)}."
        for r in s.res)
    return f"""## Method

- {len(s.df):,} admissible designs of {ctx.space.size:,} (feasible; \
{limits_text(ctx)}), \
scored in float64. Ratio = `{OUT}` / `{IN}` of the same design (the same chips serve both: \
the cost of a step is split by the time its prompt tokens add to the decode-only step).
- Cost optimum: each model's cheapest `{OUT}`; interactive: the cheapest with `{SPEED}` >= \
{s.fast_tps:g} (`interactive_tokens_per_s_per_user` in [answer]); the curve in the figure is the \
cost optimum's layout over every admissible batch.
- Public ratios: `{("dse/catalog/pricing.csv (a copy of ../shared/reference/pricing.csv)" if path == PACKAGED else path) if path else s.csv_name}`, each row's `output_usd_per_Mtok` / \
`input_usd_per_Mtok` computed here (time-of-day rows "a / b" give one ratio per pair; rows \
without a usable pair skipped: {'; '.join(s.skipped) if s.skipped else 'none'}). Prices are not \
costs: margins, cache discounts and demand shape them too.
{method}

## Per model

{_models_table(s)}

## Public prices

{pub_table or 'pricing file not found'}
"""


def _numbers(s: Picks) -> dict:
    pub = s.pub
    return {"interactive_tokens_per_s_per_user": s.fast_tps,
            "models": {r["model"]: _model_numbers(r) for r in s.res},
            "model_ratio_median": float(np.median(s.opt_ratios)),
            "pricing_file_found": s.path is not None,
            "public_ratio_median": s.med,
            "public_ratio_min": float(pub["ratio"].min()) if len(pub) else None,
            "public_ratio_max": float(pub["ratio"].max()) if len(pub) else None,
            "public_prices_used": len(pub)}


def _model_numbers(r: dict) -> dict:
    o, f = r["opt"], r["fast"]
    return {"design_id": int(o["design_id"]), "batch": int(o[BATCH]),
            "usd_per_mtok_output": float(o[OUT]), "usd_per_mtok_input": float(o[IN]),
            "output_over_input": float(o["ratio"]),
            "interactive_output_over_input": None if f is None else float(f["ratio"]),
            "interactive_batch": None if f is None else int(f[BATCH]),
            "batch_at_public_median": None if r["cross"] is None else int(r["cross"][BATCH])}


LEAD = (Lead("model_ratio_median", "Output over input token cost at the cost-optimal "
             "designs (median over the models)", "x", versus=1.0),)
