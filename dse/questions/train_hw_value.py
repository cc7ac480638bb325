"""What a hardware upgrade is worth for training, next to what it is worth for serving.

Every design of the training space is scored at the baseline and again under each upgrade of
``[answer] upgrades`` (``[name, dotted path, factor]``: the path scaled in every design, the chip
price unchanged), and the space re-optimized: the feasible design with the most tokens/s per
GPU (at a fixed number of GPUs and price, also the cheapest training run). The upgrade's worth
for training is the change of that best throughput, and of the training cost.

The serving side is read, not re-run: ``[answer] serving_answer`` (the hardware-value
question's published answer.json, the same model, chip and rack) gives, for the upgrade of the
same name under its first service level, the change of the best cost per output token and of
the best output tokens/s per chip, with their 90% bands. The ratio of the two says whether the
upgrade is worth more to training or to serving.
"""

from __future__ import annotations

import json
from pathlib import Path

from dse.questions.common import Picks, dress, md_table, save, subplots
from dse.questions.context import Answer, Context, Lead
from dse.questions.train_common import (
    best,
    feasible,
    layout_text,
    parts_figure,
    parts_table,
    terms_text,
    with_layout,
)

METRIC = "tokens_per_s_per_chip"
ROOT = Path(__file__).resolve().parents[2]


def answer(ctx: Context) -> Answer:
    s = Picks()
    s.ups = [("baseline", None, 1.0)] + [tuple(u) for u in ctx.param("upgrades", [])]
    s.best = {}
    for name, path, f in s.ups:
        df = with_layout(ctx, ctx.score(overrides=None if path is None else
                                        {path: ("scale", float(f))}))
        s.best[name] = best(df, feasible(ctx, df), METRIC)
    s.serving = serving_side(ctx.param("serving_answer", ""), [u[0] for u in s.ups[1:]])
    nums = _numbers(s)
    return Answer(_headline(s, nums), _details(ctx, s), nums,
                  _figures(ctx, s) if ctx.sample is None else [], _lead(s))


def serving_side(path: str, names: list[str]) -> dict:
    """Per upgrade name, the serving answer's change of the best cost and throughput under its
    first service level, nominal and band ({} when the file is not there)."""
    if not path:
        return {}
    p = Path(path) if Path(path).is_absolute() else ROOT / path
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError):
        return {}
    slo = doc["numbers"]["scenarios"][0]
    bands = (doc.get("bands") or {}).get("numbers", {})
    out = {"file": str(path), "slo": slo}
    for name in names:
        row = next((r for r in doc["numbers"]["rows"] if r["slo"] == slo and r["upgrade"] == name),
                   None)
        if row is None:
            continue
        out[name] = {}
        for k in ("cost_change_pct", "throughput_change_pct"):
            b = bands.get(f"{slo}.{name}.{k}", {})
            out[name][k] = {"nominal": row[k], "median": b.get("median"), "lo": b.get("lo"),
                            "hi": b.get("hi")}
    return out


def _numbers(s) -> dict:
    base = s.best["baseline"]
    out = {"baseline": {METRIC: float(base[METRIC]), "mfu": float(base["mfu"]),
                        "design_id": int(base["design_id"])}}
    for name, _, _ in s.ups[1:]:
        r = s.best[name]
        gain = float(r[METRIC] / base[METRIC]) - 1.0
        x = {"throughput_change_pct": 100 * gain,
             "train_cost_change_pct": 100 * (float(r["train_cost_usd"] / base["train_cost_usd"])
                                             - 1.0),
             METRIC: float(r[METRIC]), "design_id": int(r["design_id"])}
        sv = s.serving.get(name)
        if sv:
            x["serving_cost_change_pct"] = float(sv["cost_change_pct"]["nominal"])
            x["serving_throughput_change_pct"] = float(sv["throughput_change_pct"]["nominal"])
            sc = -x["serving_cost_change_pct"]
            x["training_over_serving_saving"] = (-x["train_cost_change_pct"] / sc if sc > 0
                                                 else None)
        out[name] = x
    return out


def _band(b: dict) -> str:
    if b.get("median") is None:
        return f"{b['nominal']:+.1f}%"
    return f"{b['median']:+.1f}% (90% band {b['lo']:+.1f}%..{b['hi']:+.1f}%)"


def _headline(s, n) -> str:
    parts = []
    for name, _, _ in s.ups[1:]:
        x, r = n[name], s.best[name]
        t = (f"**{name}** makes training **{x['throughput_change_pct']:+.1f}%** faster per GPU "
             f"({x['train_cost_change_pct']:+.1f}% training cost; best layout "
             f"{layout_text(r)}; {terms_text(s.best['baseline'], r, 'baseline', 'upgraded')})")
        sv = s.serving.get(name)
        if sv:
            t += (f", against {_band(sv['cost_change_pct'])} cost per output token for serving "
                  f"({s.serving['slo']}, the hardware-value answer's median and band)")
            if x.get("training_over_serving_saving") is not None:
                t += (f": training saves {x['training_over_serving_saving']:.2f}x what serving "
                      "saves")
        parts.append(t)
    tail = ("" if s.serving else " The serving answer file is not there: the serving side is "
            "left out.")
    return "; ".join(parts) + "." + tail


def _details(ctx, s) -> str:
    base = s.best["baseline"]
    rows = [[name, f"{path or ''} x{f:g}", float(s.best[name][METRIC]),
             100 * (float(s.best[name][METRIC] / base[METRIC]) - 1), layout_text(s.best[name])]
            for name, path, f in s.ups]
    sv_rows = [[name, _band(s.serving[name]["cost_change_pct"]),
                _band(s.serving[name]["throughput_change_pct"])]
               for name, _, _ in s.ups[1:] if name in s.serving]
    serving = ("\n\n## Serving, from the published answer\n\n"
               f"`{s.serving['file']}` under {s.serving['slo']} (its median and 90% band, read "
               "from the file; regenerate it with `python -m dse.questions hardware-value`):\n\n"
               + md_table(["upgrade", "best cost per output token",
                           "best output tokens/s per chip"], sv_rows)) if s.serving else ""
    return (
        "## Method\n\n"
        f"Every design of the space ({ctx.space.size:,}) is scored by the training model at the "
        "baseline and under each upgrade (the dotted path scaled in every design, the chip "
        "price unchanged), and the feasible design with the most tokens/s per GPU taken. "
        "The model terms an upgrade moves: HBM bandwidth sets the HBM-bound work (elementwise "
        "ops, the optimizer's update, the grouped GEMMs' weight reads at few tokens per "
        "expert); scale-up bandwidth sets the collectives inside the rack (expert all-to-all, "
        "tensor- and data-parallel reductions) that compute does not hide. A training step at "
        "thousands of tokens per micro-batch is mostly compute, which neither upgrade touches; "
        "a serving decode step reads every weight and the KV cache per token.\n\n"
        "## Best training design per upgrade\n\n"
        + md_table(["upgrade", "change", "tokens/s per GPU", "change [%]", "layout"], rows)
        + "\n\n## Their steps (seconds per optimizer step)\n\n"
        + parts_table([s.best[u[0]] for u in s.ups], [u[0] for u in s.ups]) + serving + "\n")


def _figures(ctx, s) -> list[str]:
    names = [u[0] for u in s.ups[1:]]
    base = s.best["baseline"]
    fig, ax = subplots(figsize=(7, 4.5))
    tr = [100 * (float(s.best[n][METRIC] / base[METRIC]) - 1) for n in names]
    ax.bar([i - 0.2 for i in range(len(names))], tr, 0.4, label="training: tokens/s per GPU")
    if s.serving:
        sv = [s.serving[n]["throughput_change_pct"]["nominal"] if n in s.serving else 0.0
              for n in names]
        ax.bar([i + 0.2 for i in range(len(names))], sv, 0.4,
               label=f"serving: output tokens/s per chip ({s.serving['slo']})")
    ax.set_xticks(range(len(names)), names)
    dress(ax, "upgrade", "best throughput per chip, change [%]", "What an upgrade is worth",
          grid="y", legend=8)
    a = save(fig, ctx, "upgrade_value.png")
    b = parts_figure(ctx, [s.best[u[0]] for u in s.ups], [u[0].replace(" ", "\n", 1)
                                                          for u in s.ups],
                     "step_parts.png", "Best training step per upgrade")
    return [a, b]


def _lead(s) -> tuple:
    return tuple(Lead(f"{name}.throughput_change_pct", f"{name}: training tokens/s per GPU",
                      "%", versus=0.0) for name, _, _ in s.ups[1:])


