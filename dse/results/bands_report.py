"""Uncertainty bands of what-ifs and comparisons (``dse.scoring.bands`` draws and scores the samples).

- ``whatif_bands``: every front design before and after the change under the same samples; per
  objective the median change over the front per sample, its median and 90% band, and per
  design its change's band (the page's ``<metric>_change_lo``/``_hi`` columns);
- ``compare_bands``: for each objective, the best design of each run re-scored under the same
  samples (each run in its own space): both values' bands and the probability that A's beats B's.

A training run (``space.task == "train"``) is sampled the same way through the training draws
(``dse.scoring.train_bands``: the training fit's covariance and the kernel fits' the training
model reuses); the statistics, words and pages are the same code.

Both return JSON-able dicts (written as ``bands.json``) and the lines the pages show, with a
sign or a ranking that changes within the band said in words ("not resolved by the model"), and
what would change it: each parameter group alone (``by_group``) and, where no group alone
reproduces the band, the smallest union of groups that together do (``together``).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd

from dse.results.reader import open_run
from dse.scoring import bands as B
from dse.scoring import train_bands as TB
from dse.scoring.bands import (
    GROUP_SAMPLES,
    NOT_RESOLVED,
    RESOLVED_SHARE,
    band_strings,
    greedy_unions,
    needs,
    needs_met,
    needs_words,
    p_better,
    pct,
    pick_resolved,
    ranking_words,
    sign_resolved,
    sign_words,
    summary,
    text,
    together_words,
)
from dse.spec.fields import label

GROUP_NAMES = {**B.GROUP_NAMES, **TB.GROUP_NAMES}     # serving's and training's groups in words
SERVING = SimpleNamespace(draw=B.draw, draw_groups=B.draw_groups, draw_sets=B.draw_sets,
                          space_samples=B.space_samples)
TRAINING = SimpleNamespace(draw=TB.draw, draw_groups=TB.draw_groups, draw_sets=TB.draw_sets,
                           space_samples=TB.space_samples)


def sampler(space) -> SimpleNamespace:
    """The draws and the sample scorer of a space's task: serving's (``dse.scoring.bands``) or
    training's (``dse.scoring.train_bands``), with the same calls."""
    return TRAINING if getattr(space, "task", "serve") == "train" else SERVING


def _pcts(*values) -> list[str]:
    """Changes as percents, with the decimals it takes for a band not to collapse
    (``band_strings``)."""
    return band_strings(values, pct, 1)


def _band(x) -> dict:
    med, lo, hi = (float(v) for v in summary(np.asarray(x, float).reshape(len(x), -1)[:, 0]))
    return {"median": med, "lo": lo, "hi": hi}


def by_group(x, groups: tuple, k: int) -> dict:
    """Per parameter group (``draw_groups``: ``k`` samples each, in order), the band of a
    per-sample statistic ``x`` with that group alone sampled, widest first: {group: {median,
    lo, hi, spread}}."""
    x = np.asarray(x, float)
    out = {}
    for i, g in enumerate(groups):
        out[g] = _spread(_band(x[i * k:(i + 1) * k]))
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["spread"]))


def changes_words(groups: dict, together: dict | None = None, n: int = 0, k: int = 0,
                  sign: str = "its unresolved sign") -> str:
    """``what would change it: the MoE grouped-GEMM parameters (alone -9.9%..-8.7%), then ...``
    from ``by_group`` (the two widest groups that move it), and from ``together`` the union of
    groups that reproduces what no group alone does (``sign``: how its unresolved sign reads)."""
    moving = [(g, b) for g, b in (groups or {}).items() if b["spread"] > 0]
    if not moving:
        text = "what would change it: no fitted parameter group moves it on its own"
    else:
        text = "what would change it: " + ", then ".join(
            f"the {GROUP_NAMES.get(g, g)} parameters (alone {'..'.join(_pcts(b['lo'], b['hi']))})"
            for g, b in moving[:2])
    if together:
        t = together
        text += together_words(t["groups"], t["met"], needs_words(t["needs"], sign),
                               f"move it {'..'.join(_pcts(t['lo'], t['hi']))}", n, k)
    return text


def together(groups: tuple, k: int, seed: int, stat_of, full: dict, single: dict,
             draw_sets=B.draw_sets) -> dict:
    """Per metric whose per-sample statistic no parameter group alone reproduces (``dse.scoring.bands
    .needs``: half its band with every group varied, the first ``k`` of ``full``'s samples, or
    its unresolved sign), the smallest union of groups that together do (``greedy_unions``):
    {metric: {groups, met, needs, median, lo, hi, spread}}. ``full``/``single``: {metric:
    statistic per sample} under the full draw / ``draw_groups(k)``; ``stat_of(draws)`` scores
    the sets of one round (``draw_sets``: serving's, or training's) in one go."""
    todo = []
    for m, x in full.items():
        ref, fb = _spread(_band(np.asarray(x)[:k])), _spread(_band(x))
        need = needs(ref, fb, versus=0.0)
        if need:
            todo.append((m, need))
    if not todo or len(groups) < 2:
        return {}
    cache = {frozenset((g,)): {m: np.asarray(v)[i * k:(i + 1) * k] for m, v in single.items()}
             for i, g in enumerate(groups)}
    cache[frozenset(groups)] = {m: np.asarray(v)[:k] for m, v in full.items()}

    def evaluate(sets):
        _, d = draw_sets(k, seed, [tuple(g for g in groups if g in s) for s in sets])
        st = stat_of(d)
        return {s: {m: v[i * k:(i + 1) * k] for m, v in st.items()} for i, s in enumerate(sets)}

    targets = [(lambda r, m=m, nd=nd: (needs_met(_spread(_band(r[m])), nd),
                                       _spread(_band(r[m]))["spread"]),
                lambda r, m=m, nd=nd: needs_met(_spread(_band(r[m])), nd) == len(nd))
               for m, nd in todo]
    found = greedy_unions(groups, evaluate, targets, cache)
    return {m: {"groups": list(f["groups"]), "met": f["met"], "needs": sorted(nd),
                **_spread(_band(f["result"][m]))}
            for (m, nd), f in zip(todo, found) if len(f["groups"]) > 1}


def _spread(b: dict) -> dict:
    s = b["hi"] - b["lo"]
    return {**b, "spread": float(s) if np.isfinite(s) else 0.0}


def _median_change(after, before):
    with np.errstate(divide="ignore", invalid="ignore"):
        ch = after / before - 1.0                                   # (samples, designs)
    fin = np.where(np.isfinite(ch), ch, np.nan)
    ok = np.isfinite(fin).any(axis=1)
    per = np.full(len(ch), np.nan)
    per[ok] = np.nanmedian(fin[ok], axis=1)
    return ch, per


def whatif_bands(space, ids, overrides: dict, n: int, seed: int = 0) -> dict:
    """The changes of a what-if under ``n`` parameter samples (one scorer call before, one
    after, each over samples x front designs), and under each parameter group alone
    (``GROUP_SAMPLES`` samples per group, two more calls): what would change it."""
    S = sampler(space)
    space_samples = S.space_samples
    d = S.draw(n, seed)
    groups, dg = S.draw_groups(min(n, GROUP_SAMPLES), seed)
    k = dg.n // len(groups)
    vals = space.values_at(np.asarray(ids, np.int64))
    metrics = tuple(o.metric for o in space.objectives)
    before = space_samples(space, vals, d, None, metrics)
    after = space_samples(space, vals, d, overrides, metrics)
    gb = space_samples(space, vals, dg, None, metrics)
    ga = space_samples(space, vals, dg, overrides, metrics)
    cols, objs, full, single = {}, {}, {}, {}
    for m in metrics:
        ch, per_sample = _median_change(after[m], before[m])
        full[m], single[m] = per_sample, _median_change(ga[m], gb[m])[1]
        med, lo, hi = summary(ch)
        cols[f"{m}_change_median"], cols[f"{m}_change_lo"], cols[f"{m}_change_hi"] = med, lo, hi
        b = _band(per_sample)
        unresolved = int(sum(not sign_resolved(a, z) for a, z in zip(lo, hi)
                             if np.isfinite(a) and np.isfinite(z)))
        objs[m] = {"median_change": b, "designs": int(ch.shape[1]),
                   "designs_sign_unresolved": unresolved,
                   "words": sign_words(b["lo"], b["hi"],
                                       f"the sign of the change of {label(m)}"),
                   "groups": by_group(single[m], groups, k),
                   "samples_per_group": k}

    def stat_of(dd):
        b, a = (space_samples(space, vals, dd, ov, metrics) for ov in (None, overrides))
        return {m: _median_change(a[m], b[m])[1] for m in metrics}
    for m, t in together(groups, k, seed, stat_of, full, single, S.draw_sets).items():
        objs[m]["together"] = t
    return {"samples": int(n), "seed": int(seed), "note": d.note, "objectives": objs,
            "columns": pd.DataFrame(cols)}


def whatif_headline(space, moved: pd.DataFrame, band: dict | None) -> list[str]:
    """The what-if's first lines, one per objective: the median change over the front (its
    range over the designs), with bands its 90% band, whether its sign is resolved and what
    would change it; without, that bands are off."""
    out = []
    for ob in space.objectives:
        ch = moved[f"{ob.metric}_change"]
        line = (f"- {label(ob.metric)}: median change **{np.nanmedian(ch) * 100:+.1f}%** "
                f"(range {np.nanmin(ch) * 100:+.1f}% to {np.nanmax(ch) * 100:+.1f}% over the "
                "front)")
        o = (band or {}).get("objectives", {}).get(ob.metric)
        if o is None:
            out.append(line + "; uncertainty bands off (`--bands 0`)")
            continue
        b = o["median_change"]
        med, lo, hi = _pcts(b["median"], b["lo"], b["hi"])
        sign = (o["words"] if o["words"] else "its sign is resolved (the band keeps one sign)")
        out.append(f"{line}; with parameter uncertainty 90% band {lo}..{hi}"
                   f" (median {med}, {band['samples']} samples); {sign}; "
                   + changes_words(o.get("groups"), o.get("together"), band["samples"],
                                   o.get("samples_per_group", 0)))
    return out


def whatif_lines(band: dict) -> list[str]:
    """The what-if page's band section (Markdown lines)."""
    lines = ["", f"## Uncertainty bands ({band['samples']} parameter samples, seed "
             f"{band['seed']}; median [5th..95th percentile])", "", band["note"] + ".", ""]
    for m, o in band["objectives"].items():
        b = o["median_change"]
        line = (f"- {label(m)}: median change over the front "
                f"{text(b['median'], b['lo'], b['hi'], pct, 1)}")
        if o["words"]:
            line += f"; {o['words']}"
        if o["designs_sign_unresolved"]:
            line += (f"; for {o['designs_sign_unresolved']} of {o['designs']} front designs the "
                     "sign of the change is not resolved by the model")
        lines.append(line)
    return lines


def _best_samples(run_dir, front: pd.DataFrame, metric: str, direction: str, d) -> tuple:
    """The best design of a run's front for ``metric`` and its values under the samples."""
    col = pd.to_numeric(front[metric], errors="coerce")
    i = col.idxmin() if direction == "minimize" else col.idxmax()
    did = int(front.loc[i, "design_id"])
    space = open_run(run_dir).space
    s = sampler(space).space_samples(space, space.values_at(np.array([did])), d, None,
                                     (metric,))
    return did, float(col.loc[i]), s[metric][:, 0]


def compare_bands(c, dir_a, dir_b, n: int, seed: int = 0) -> dict:
    """For each objective of a Comparison ``c``: both runs' best designs under the same ``n``
    samples, their bands and P(A's best beats B's best); and B vs A under each parameter group
    alone (what would change it). Both runs are of one task (``compare_runs`` checks it)."""
    S = sampler(open_run(dir_a).space)
    d = S.draw(n, seed)
    groups, dg = S.draw_groups(min(n, GROUP_SAMPLES), seed)
    k = dg.n // len(groups)
    objs, full, single = {}, {}, {}
    for o in c.objectives:
        ia, va, sa = _best_samples(dir_a, c.front_a, o.metric, o.direction, d)
        ib, vb, sb = _best_samples(dir_b, c.front_b, o.metric, o.direction, d)
        ga = _best_samples(dir_a, c.front_a, o.metric, o.direction, dg)[2]
        gb = _best_samples(dir_b, c.front_b, o.metric, o.direction, dg)[2]
        p = p_better(sa, sb, o.direction)
        with np.errstate(divide="ignore", invalid="ignore"):
            diff = sb / sa - 1.0
            gdiff = gb / ga - 1.0
        objs[o.metric] = {"direction": o.direction,
                          "a": {"design_id": ia, "run_value": va, **_band(sa)},
                          "b": {"design_id": ib, "run_value": vb, **_band(sb)},
                          "b_vs_a_change": _band(diff), "p_a_better": p,
                          "words": ranking_words(p),
                          "groups": by_group(gdiff, groups, k), "samples_per_group": k}
        full[o.metric], single[o.metric] = diff, gdiff

    def stat_of(dd):
        out = {}
        for o in c.objectives:
            a = _best_samples(dir_a, c.front_a, o.metric, o.direction, dd)[2]
            b = _best_samples(dir_b, c.front_b, o.metric, o.direction, dd)[2]
            with np.errstate(divide="ignore", invalid="ignore"):
                out[o.metric] = b / a - 1.0
        return out
    for m, t in together(groups, k, seed, stat_of, full, single, S.draw_sets).items():
        objs[m]["together"] = t
    return {"samples": int(n), "seed": int(seed), "note": d.note, "objectives": objs}


def compare_headline(c) -> list[str]:
    """The comparison's first lines, one per objective: each run's best, B vs A, and with bands
    their 90% bands, whether the ranking is resolved (P(A better)) and what would change it."""
    out = []
    for x in c.objectives:
        a, b = c.best[x.metric]
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = b / a - 1.0 if a else np.nan
        line = (f"- best {label(x.metric)} ({x.direction}): A **{a:.4g}**, B **{b:.4g}** "
                f"(B vs A {pct(rel)})")
        o = (c.bands or {}).get("objectives", {}).get(x.metric)
        if o is None:
            out.append(line + "; uncertainty bands off (`--bands 0`)")
            continue
        ch, p = o["b_vs_a_change"], o["p_a_better"]
        med, lo, hi = _pcts(ch["median"], ch["lo"], ch["hi"])
        rank = o["words"] or (f"the ranking is resolved: {'A' if pick_resolved(p) else 'B'} "
                              f"is better in >= {RESOLVED_SHARE:.0%} of the samples (P(A better)"
                              f" = {p:.2f})" if np.isfinite(p) else "")
        out.append(f"{line}; with parameter uncertainty B vs A 90% band {lo}..{hi}"
                   f" (median {med}, {c.bands['samples']} "
                   f"samples); {rank}; "
                   + changes_words(o.get("groups"), o.get("together"), c.bands["samples"],
                                   o.get("samples_per_group", 0), "the unresolved ranking"))
    return out


def compare_lines(band: dict) -> list[str]:
    """The compare page's band section (Markdown lines)."""
    lines = ["", f"Uncertainty bands of the best designs ({band['samples']} parameter samples, "
             f"seed {band['seed']}, the same samples for both runs; median [5th..95th "
             "percentile]): " + band["note"] + ".", ""]
    for m, o in band["objectives"].items():
        a, b, ch = o["a"], o["b"], o["b_vs_a_change"]
        line = (f"- {o['direction']} {label(m)}: A {text(a['median'], a['lo'], a['hi'])}, "
                f"B {text(b['median'], b['lo'], b['hi'])}, B vs A "
                f"{text(ch['median'], ch['lo'], ch['hi'], pct, 1)}; P(A better) = "
                f"{o['p_a_better']:.2f}")
        if o["words"]:
            line += f"; {o['words']}"
        lines.append(line)
    return lines


__all__ = ["NOT_RESOLVED", "by_group", "changes_words", "compare_bands", "compare_headline",
           "compare_lines", "together", "whatif_bands", "whatif_headline", "whatif_lines"]
