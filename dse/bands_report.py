"""Uncertainty bands of what-ifs and comparisons (``dse.bands`` draws and scores the samples).

- ``whatif_bands``: every front design before and after the change under the same samples; per
  objective the median change over the front per sample, its median and 90% band, and per
  design its change's band (the page's ``<metric>_change_lo``/``_hi`` columns);
- ``compare_bands``: for each objective, the best design of each run re-scored under the same
  samples (each run in its own space): both values' bands and the probability that A's beats B's.

Both return JSON-able dicts (written as ``bands.json``) and the lines the pages show, with a
sign or a ranking that changes within the band said in words ("not resolved by the model").
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse.bands import (draw, p_better, ranking_words, sign_resolved, sign_words, space_samples,
                       summary, text)


def _pct(v) -> str:
    return f"{v * 100:+.1f}%" if np.isfinite(v) else "-"


def _band(x) -> dict:
    med, lo, hi = (float(v) for v in summary(np.asarray(x, float).reshape(len(x), -1)[:, 0]))
    return {"median": med, "lo": lo, "hi": hi}


def whatif_bands(space, ids, overrides: dict, n: int, seed: int = 0) -> dict:
    """The changes of a what-if under ``n`` parameter samples (one scorer call before, one
    after, each over samples x front designs)."""
    d = draw(n, seed)
    vals = space.values_at(np.asarray(ids, np.int64))
    metrics = tuple(o.metric for o in space.objectives)
    before = space_samples(space, vals, d, None, metrics)
    after = space_samples(space, vals, d, overrides, metrics)
    cols, objs = {}, {}
    for m in metrics:
        with np.errstate(divide="ignore", invalid="ignore"):
            ch = after[m] / before[m] - 1.0                       # (samples, designs)
        med, lo, hi = summary(ch)
        cols[f"{m}_change_median"], cols[f"{m}_change_lo"], cols[f"{m}_change_hi"] = med, lo, hi
        fin = np.where(np.isfinite(ch), ch, np.nan)
        per_sample = np.nanmedian(fin, axis=1) if np.isfinite(fin).any() else \
            np.full(len(ch), np.nan)
        b = _band(per_sample)
        unresolved = int(sum(not sign_resolved(a, z) for a, z in zip(lo, hi)
                             if np.isfinite(a) and np.isfinite(z)))
        objs[m] = {"median_change": b, "designs": int(ch.shape[1]),
                   "designs_sign_unresolved": unresolved,
                   "words": sign_words(b["lo"], b["hi"], f"the sign of the change of {m}")}
    return {"samples": int(n), "seed": int(seed), "note": d.note, "objectives": objs,
            "columns": pd.DataFrame(cols)}


def whatif_lines(band: dict) -> list[str]:
    """The what-if page's band section (Markdown lines)."""
    lines = ["", f"## Uncertainty bands ({band['samples']} parameter samples, seed "
             f"{band['seed']}; median [5th..95th percentile])", "", band["note"] + ".", ""]
    for m, o in band["objectives"].items():
        b = o["median_change"]
        line = f"- {m}: median change over the front {text(b['median'], b['lo'], b['hi'], _pct)}"
        if o["words"]:
            line += f"; {o['words']}"
        if o["designs_sign_unresolved"]:
            line += (f"; for {o['designs_sign_unresolved']} of {o['designs']} front designs the "
                     "sign of the change is not resolved by the model")
        lines.append(line)
    return lines


def _best_samples(run_dir, front: pd.DataFrame, metric: str, direction: str, d) -> tuple:
    """The best design of a run's front for ``metric`` and its values under the samples."""
    from dse.api import open_run
    col = pd.to_numeric(front[metric], errors="coerce")
    i = col.idxmin() if direction == "minimize" else col.idxmax()
    did = int(front.loc[i, "design_id"])
    space = open_run(run_dir).space
    s = space_samples(space, space.values_at(np.array([did])), d, None, (metric,))
    return did, float(col.loc[i]), s[metric][:, 0]


def compare_bands(c, dir_a, dir_b, n: int, seed: int = 0) -> dict:
    """For each objective of a Comparison ``c``: both runs' best designs under the same ``n``
    samples, their bands and P(A's best beats B's best)."""
    d = draw(n, seed)
    objs = {}
    for o in c.objectives:
        ia, va, sa = _best_samples(dir_a, c.front_a, o.metric, o.direction, d)
        ib, vb, sb = _best_samples(dir_b, c.front_b, o.metric, o.direction, d)
        p = p_better(sa, sb, o.direction)
        with np.errstate(divide="ignore", invalid="ignore"):
            diff = sb / sa - 1.0
        objs[o.metric] = {"direction": o.direction,
                          "a": {"design_id": ia, "run_value": va, **_band(sa)},
                          "b": {"design_id": ib, "run_value": vb, **_band(sb)},
                          "b_vs_a_change": _band(diff), "p_a_better": p,
                          "words": ranking_words(p)}
    return {"samples": int(n), "seed": int(seed), "note": d.note, "objectives": objs}


def compare_lines(band: dict) -> list[str]:
    """The compare page's band section (Markdown lines)."""
    lines = ["", f"Uncertainty bands of the best designs ({band['samples']} parameter samples, "
             f"seed {band['seed']}, the same samples for both runs; median [5th..95th "
             "percentile]): " + band["note"] + ".", ""]
    for m, o in band["objectives"].items():
        a, b, ch = o["a"], o["b"], o["b_vs_a_change"]
        line = (f"- {o['direction']} {m}: A {text(a['median'], a['lo'], a['hi'])}, "
                f"B {text(b['median'], b['lo'], b['hi'])}, B vs A "
                f"{text(ch['median'], ch['lo'], ch['hi'], _pct)}; P(A better) = "
                f"{o['p_a_better']:.2f}")
        if o["words"]:
            line += f"; {o['words']}"
        lines.append(line)
    return lines


__all__ = ["compare_bands", "compare_lines", "whatif_bands", "whatif_lines"]
