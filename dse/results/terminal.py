"""What the terminal shows at the end of ``dse run`` and for ``dse status``: short tables with
each metric's name and unit (``dse.spec.fields.label``), numbers from the run's front and progress."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse.pareto import knee
from dse.search.loop import reference_words
from dse.spec.fields import SCALE_SUFFIX, is_scale_column, label


def _fmt(v) -> str:
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.4g}"
    return str(v)


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    w = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    last = len(headers) - 1
    line = lambda cells: "  ".join(c.ljust(w[i]) if i < 2 or i == last  # noqa: E731
                                   else c.rjust(w[i]) for i, c in enumerate(cells)).rstrip()
    return [line(headers), line(["-" * x for x in w])] + [line(r) for r in rows]


def _short(path: str) -> str:
    """``accelerator.id`` -> ``accelerator``, ``layout.tp`` -> ``tp``; a scale-factor column
    keeps its path (``accelerator.hbm_bw_bytes_per_s.scale``: several knobs scale, each is
    named)."""
    if is_scale_column(path) or path.endswith(SCALE_SUFFIX):
        return path
    parts = path.split(".")
    return parts[-2] if parts[-1] == "id" and len(parts) > 1 else parts[-1]


def front_lines(front: pd.DataFrame, objectives, params: list[str], kv=None) -> list[str]:
    """The front's best design of each objective and its knee, ranked by the first objective:
    one row each, the objectives with units, then the design's parameters, and the KV cache's
    element type of each (``kv``: aligned with ``front``, ``Space.kv_dtypes``) when given."""
    if front is None or not len(front):
        return []
    front = front.reset_index(drop=True)
    picks: dict[int, list[str]] = {}
    for ob in objectives:
        i = int(front[ob.metric].idxmin() if ob.direction == "minimize"
                else front[ob.metric].idxmax())
        picks.setdefault(i, []).append(f"best {label(ob.metric).split(' [')[0]}")
    picks.setdefault(knee(front, objectives), []).append("knee")
    first = objectives[0]
    order = sorted(picks, key=lambda i: front.loc[i, first.metric]
                   * (1 if first.direction == "minimize" else -1))
    headers = ["#", "design"] + [label(ob.metric) for ob in objectives] + ["parameters"] \
        + ([] if kv is None else ["KV cache"])
    rows = []
    for r, i in enumerate(order, 1):
        ps = " ".join(f"{_short(p)}={_fmt(front.loc[i, p])}" for p in params
                      if p in front.columns)
        rows.append([str(r), ", ".join(picks[i])] + [_fmt(front.loc[i, ob.metric])
                                                      for ob in objectives] + [ps]
                    + ([] if kv is None else [str(np.asarray(kv)[i])]))
    return _table(headers, rows)


def completed_words(st: dict, unit: str) -> str:
    """``180 of 200``; past the target (workers that ask at the same moment may each start up
    to one batch more), the overshoot is said, so the counts add up."""
    done, total = st["trials_completed"], st.get("trials_total")
    if not total:
        return f"{done:,}"
    if done > total:
        return (f"{done:,} (the target {total:,} and {done - total:,} more: workers asking at "
                f"the same moment each start up to one batch)")
    return f"{done:,} of {total:,}"


def status_lines(st: dict, manifest: dict) -> list[str]:
    """``dse status`` as a readable table (``--json`` prints ``st`` as it is)."""
    unit = "chunks" if st["strategy"] == "exhaustive" else "trials"
    size = st.get("space_size")
    rows = [("state", st["state"]), ("strategy", st["strategy"]),
            (f"{unit} completed", completed_words(st, unit)),
            (f"{unit} failed", f"{st['trials_failed']:,}"),
            ("designs scored", f"{st['designs_scored']:,}" + (f" of a space of {size:,}"
                                                              if size else "")),
            ("elapsed", f"{st['elapsed_s']:.1f} s"),
            ("front", f"{st['front_size']:,} designs")]
    by = st.get("trials_by_worker")
    if by:
        rows.append(("trials by worker", ", ".join(f"{w} {n:,}" for w, n in by.items())
                     + f" (sum {sum(by.values()):,} = {unit} completed)"))
    hv = st.get("hypervolume")
    rows.append(("hypervolume", "not computed yet" if hv is None else
                 f"{hv:.6g} ({reference_words(st['objectives'], manifest.get('reference'))})"))
    rows.append(("objectives", "; ".join(f"{o['direction']} {label(o['name'])}"
                                         for o in st["objectives"])))
    for k, v in st.items():
        if k not in {"state", "strategy", "trials_completed", "trials_failed", "designs_scored",
                     "elapsed_s", "front_size", "hypervolume", "objectives", "space_size",
                     "trials_total", "run_dir", "trials_by_worker"}:
            rows.append((k.replace("_", " "), str(v)))
    rows.append(("run folder", st["run_dir"]))
    w = max(len(k) for k, _ in rows)
    return [f"{k:<{w}}  {v}" for k, v in rows]
