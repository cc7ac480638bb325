"""Bands on the worked questions' answers: the analysis applied per parameter sample.

``dse answer --bands N`` answers the question once as it always has (the published numbers and
figures), then again under each of ``N`` parameter samples (``dse.bands``) with a Context whose
``score`` and ``batch`` use that sample and whose ``front`` is the run's front re-scored under it.
No question is edited for this: every analysis that scores through its Context gets bands.
Where the designs a call scores fit (samples x designs <= ``VECTOR_ROWS``), the first sample's
call scores every sample at once (one scorer call) and the others read their slice of it; a
bigger call (a whole large space) is scored one sample at a time.

Each numeric ``[answer]`` number (``Answer.numbers``, flattened) gets its median and 90% band; a
number whose band crosses zero and a text value (a chosen design, a "best" label) that differs
between samples are said in words: "not resolved by the model".
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from dse import bands as B

VECTOR_ROWS = 1 << 18      # samples x designs scored in one call (about 80 MB of metrics)
CACHE_CALLS = 16           # distinct vectorized calls kept while the samples run


class Sampled:
    """The draws of an answer's bands and the vectorized calls shared by its samples."""

    def __init__(self, draws: B.Draws):
        self.draws = draws
        self.cache: dict = {}

    def view(self, k: int) -> "SampleView":
        return SampleView(self, k)


def _key(vals: dict, overrides) -> tuple:
    parts = []
    for k in sorted(vals):
        v = np.asarray(vals[k])
        parts.append((k, v.dtype.str, v.shape, hash(v.tobytes()) if v.dtype.kind != "O"
                      else hash(tuple(map(str, v.ravel())))))
    return tuple(parts), repr(sorted((overrides or {}).items()))


class SampleView:
    """Sample ``k`` of a Sampled: what a Context scores with under bands."""

    def __init__(self, shared: Sampled, k: int):
        self.shared, self.k = shared, k

    def score(self, space, vals: dict, overrides=None) -> dict:
        """Every metric of the designs under this sample: {metric: array (designs,)}."""
        d = self.shared.draws
        n = len(next(iter(vals.values()))) if vals else 1
        if n * d.n <= VECTOR_ROWS:
            key = _key(vals, overrides)
            cache = self.shared.cache
            if key not in cache:
                if len(cache) >= CACHE_CALLS:
                    cache.pop(next(iter(cache)))
                cache[key] = B.space_samples(space, vals, d, overrides)
            return {m: v[self.k] for m, v in cache[key].items()}
        s = B.space_samples(space, vals, d.only(self.k), overrides)
        return {m: v[0] for m, v in s.items()}

    def batch(self, space, vals: dict, overrides=None):
        """The scorer Batch of the designs under this sample (for per-op breakdowns)."""
        from dse.build import to_batch
        from dse.whatif import with_strings
        sp, vals, ov = with_strings(space, vals, overrides)
        _, rows, direct, table = sp.batch_from_values(vals, ov, parts=True)
        m = int(np.max(rows)) + 1 if len(rows) else 1
        b = to_batch(B.stack(table, m, self.shared.draws.only(self.k)), compact=True)
        return b.gather(np.asarray(rows, np.int64), direct)


def _flat(d, prefix="") -> dict:
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        elif isinstance(v, (bool, np.bool_, str)):
            out[f"{prefix}{k}"] = str(v)
        elif isinstance(v, (int, float, np.integer, np.floating)):
            out[f"{prefix}{k}"] = float(v)
    return out


def sampled_answers(mod, make_context, space, front, n: int, seed: int = 0,
                    progress: bool = False, draws: B.Draws | None = None,
                    what: str = "bands") -> dict:
    """The analysis ``mod.answer`` under ``n`` samples (or the given ``draws``): {key: [value
    per sample]} of its flattened numbers. ``make_context(front, out, sample)`` builds each
    sample's Context."""
    d = B.draw(n, seed) if draws is None else draws
    n = d.n
    shared = Sampled(d)
    metrics = tuple(o.metric for o in space.objectives)
    fronts = None
    if len(front) and "design_id" in front:
        ids = front["design_id"].to_numpy(dtype=np.int64)
        fronts = B.space_samples(space, space.values_at(ids), d, None, metrics)
    values: dict = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dse-bands-") as tmp:
        for k in range(n):
            f = front.copy()
            if fronts is not None:
                for m in metrics:
                    if m in f:
                        f[m] = fronts[m][k]
            ans = mod.answer(make_context(f, Path(tmp), shared.view(k)))
            for key, v in _flat(ans.numbers).items():
                values.setdefault(key, [None] * n)[k] = v
            if progress:
                el = time.perf_counter() - t0
                rate = (k + 1) / el if el > 0 else float("inf")
                sys.stderr.write(f"\r{what}: sample {k + 1}/{n}, {rate:.2f} samples/s, "
                                 f"ETA {(n - k - 1) / rate:.0f} s ")
                sys.stderr.flush()
    if progress:
        sys.stderr.write("\n")
    return {"draws": d, "values": values}


def summarize(nominal: dict, values: dict, n: int, seed: int, note: str) -> dict:
    """Per flattened answer number: the nominal value, median, 5th and 95th percentile and
    words; per text value: the share of samples giving each value."""
    nom = _flat(nominal)
    out = {}
    for key, vs in values.items():
        base = nom.get(key)
        if isinstance(base, float):
            x = np.array([v if isinstance(v, float) else np.nan for v in vs], float)
            med, lo, hi = (float(v) for v in B.summary(x))
            out[key] = {"nominal": base, "median": med, "lo": lo, "hi": hi,
                        "words": B.sign_words(lo, hi, "its sign")
                        if np.isfinite(lo) and np.isfinite(hi) else ""}
        elif isinstance(base, str):
            seen = [str(v) for v in vs if v is not None]
            share = {v: seen.count(v) / max(len(seen), 1) for v in dict.fromkeys(seen)}
            words = "" if len(share) <= 1 or max(share.values()) >= 0.95 else \
                f"which value it takes is {B.NOT_RESOLVED}"
            out[key] = {"nominal": base, "shares": share, "words": words}
    return {"samples": int(n), "seed": int(seed), "note": note, "numbers": out}


def _num(v) -> str:
    from dse.questions._common import fmt
    return fmt(v, 3)


def _moves(b: dict) -> bool:
    if "median" in b:
        return bool(np.isfinite(b["lo"]) and np.isfinite(b["hi"]) and b["hi"] > b["lo"])
    return len(b["shares"]) > 1


def markdown(band: dict, limit: int = 24) -> str:
    """The answer's band block: the numbers not resolved by the model first, then the others
    that move under the samples (``limit`` lines at most), then a count of those that do not
    move (prices, caps, counts the fitted parameters do not touch)."""
    lines = [f"**Uncertainty bands** ({band['samples']} parameter samples, seed {band['seed']}; "
             f"median [5th..95th percentile]; {band['note']}):", ""]
    items = list(band["numbers"].items())
    moving = [kv for kv in items if _moves(kv[1])]
    moving.sort(key=lambda kv: not kv[1]["words"])      # stable: unresolved first
    for key, b in moving[:limit]:
        if "median" in b:
            line = (f"- `{key}`: {_num(b['nominal'])}; under the samples "
                    f"{B.text(b['median'], b['lo'], b['hi'], _num)}")
        else:
            shares = ", ".join(f"{v} in {s:.0%}" for v, s in b["shares"].items())
            line = f"- `{key}`: {b['nominal']}; under the samples {shares}"
        if b["words"]:
            line += f" — {b['words']}"
        lines.append(line)
    if len(moving) > limit:
        lines.append(f"- ... {len(moving) - limit} more that move, in answer.json (`bands`)")
    still = len(items) - len(moving)
    if still:
        lines.append(f"- {still} of the {len(items)} answer numbers do not move under the "
                     "samples (each in answer.json)")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the first lines

ATTR_SAMPLES = B.GROUP_SAMPLES   # samples per parameter group, "what would change it"


def attribution(mod, make_context, space, front, n: int, seed: int = 0,
                progress: bool = False) -> dict:
    """The analysis under each parameter group alone (``dse.bands.draw_groups``: the group's
    first ``min(n, ATTR_SAMPLES)`` samples of the full draw, every other group at its fitted
    value), all groups' samples scored together: {"samples_per_group", "groups": {group:
    {key: [value per sample]}}}."""
    k = min(int(n), ATTR_SAMPLES)
    groups, d = B.draw_groups(k, seed)
    got = sampled_answers(mod, make_context, space, front, d.n, seed, progress, draws=d,
                          what="what would change it")
    per = {g: {key: vs[i * k:(i + 1) * k] for key, vs in got["values"].items()}
           for i, g in enumerate(groups)}
    return {"samples_per_group": k, "groups": per}


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (np.isnan(a) and np.isnan(b))
    return str(a) == str(b)


def _label(v) -> str:
    if isinstance(v, float) and v.is_integer():
        return f"{int(v):,}"
    return str(v) if not isinstance(v, float) else _num(v)


def value_text(v, unit: str = "") -> str:
    """A lead number with its unit: ``3.01x``, ``-9.5%``, ``85.4%`` (a share), ``$0.317/Mtok``,
    ``136 requests/s per rack``."""
    from dse.questions._common import fmt
    if v is None or not np.isfinite(v):
        return "-"
    if unit == "x":
        return f"{fmt(v)}x"
    if unit == "%":
        return f"{v:+.1f}%"
    if unit == "share":
        return f"{v * 100:.1f}%"
    if unit == "$/Mtok":
        return f"${fmt(v)}/Mtok"
    return f"{fmt(v)} {unit}".strip()


def range_text(lo, hi, unit: str = "") -> str:
    """``2.9x..3.1x``, ``$0.31/Mtok..$0.33/Mtok``, ``135..142 requests/s per rack`` (a unit
    written after the numbers once)."""
    from dse.questions._common import fmt
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return f"{value_text(lo, unit)}..{value_text(hi, unit)}"
    digits = 3            # enough digits that a band that moves does not print as x..x
    while digits < 6 and lo != hi and fmt(lo, digits) == fmt(hi, digits):
        digits += 1
    if unit == "x":
        return f"{fmt(lo, digits)}x..{fmt(hi, digits)}x"
    if unit == "$/Mtok":
        return f"${fmt(lo, digits)}/Mtok..${fmt(hi, digits)}/Mtok"
    if unit in ("%", "share"):
        return f"{value_text(lo, unit)}..{value_text(hi, unit)}"
    return f"{fmt(lo, digits)}..{fmt(hi, digits)} {unit}".strip()


def _shares(vs) -> dict:
    seen = [v for v in vs if v is not None]
    out: dict = {}
    for v in seen:
        key = _label(v) if isinstance(v, float) else str(v)
        out[key] = out.get(key, 0) + 1 / len(seen)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _one(lead, nominal: dict, values: dict | None, attr: dict | None) -> dict | None:
    v = nominal.get(lead.key)
    if not isinstance(v, float):
        return None
    out = {"key": lead.key, "label": lead.label, "unit": lead.unit, "nominal": v,
           "versus": lead.versus, "pick": lead.pick or None, "pick_label": lead.pick_label}
    if lead.pick:
        out["pick_nominal"] = nominal.get(lead.pick)
    if values is None:
        return out
    x = np.array([u if isinstance(u, float) else np.nan for u in values.get(lead.key, [])])
    med, lo, hi = (float(u) for u in B.summary(x))
    out.update(samples=len(x), median=med, lo=lo, hi=hi)
    if lead.versus is not None and np.isfinite(lo):
        out["side_resolved"] = bool(lo >= lead.versus - 1e-9 or hi <= lead.versus + 1e-9)
    if lead.pick and lead.pick in values:
        sh = _shares(values[lead.pick])
        out["pick_shares"] = sh
        out["pick_share"] = float(sh.get(_label(out["pick_nominal"]), 0.0))             if out["pick_nominal"] is not None else 0.0
    if attr:
        groups = {}
        for g, vals in attr["groups"].items():
            y = np.array([u if isinstance(u, float) else np.nan for u in vals.get(lead.key, [])])
            gm, gl, gh = (float(u) for u in B.summary(y))
            flips = 0.0
            if lead.pick and lead.pick in vals:
                ps = [u for u in vals[lead.pick] if u is not None]
                flips = float(np.mean([not _same(u, out.get("pick_nominal")) for u in ps]))                     if ps else 0.0
            groups[g] = {"median": gm, "lo": gl, "hi": gh,
                         "spread": float(gh - gl) if np.isfinite(gh - gl) else 0.0,
                         "pick_changes": flips}
        out["groups"] = dict(sorted(groups.items(), key=lambda kv: -kv[1]["spread"]))
        out["samples_per_group"] = attr["samples_per_group"]
    return out


def leads(ans, values: dict | None = None, attr: dict | None = None) -> list[dict]:
    """The answer's lead numbers (``Answer.lead``) as JSON-able dicts: the nominal value, and
    with bands its median and 90% band, whether its side of ``versus`` and its pick hold in the
    samples, and per parameter group alone (``attribution``) its band and how often the pick
    changes, widest first. One helper for every question."""
    nominal = _flat(ans.numbers)
    out = [_one(ld, nominal, values, attr) for ld in ans.lead]
    return [x for x in out if x is not None]


def _resolution(x: dict) -> list[str]:
    parts = []
    if x.get("pick"):
        share = x.get("pick_share", 0.0)
        what = f"{x['pick_label']} {_label(x['pick_nominal'])}"
        if share >= 0.95:
            parts.append(f"the ranking is resolved ({what} wins in {share:.0%} of the samples)")
        else:
            alts = ", ".join(f"{k} in {s:.0%}" for k, s in list(x["pick_shares"].items())[:3])
            parts.append(f"which {x['pick_label']} wins is {B.NOT_RESOLVED} ({alts} of the "
                         "samples)")
    if x.get("versus") is not None and "side_resolved" in x:
        ref = value_text(x["versus"], x["unit"]) if x["unit"] not in ("%",) else \
            f"{x['versus']:g}%"
        if x["side_resolved"]:
            v, tol = x["versus"], 1e-9
            side = ("above" if x["lo"] > v + tol else "at or above" if x["hi"] > v + tol
                    else "below" if x["hi"] < v - tol else "at or below" if x["lo"] < v - tol
                    else "at")
            what = "its sign" if v == 0 else f"its side of {ref}"
            parts.append(f"{what} is resolved (the band stays {side} {ref})")
        else:
            parts.append(f"whether it is above or below {ref} is {B.NOT_RESOLVED} (the band "
                         f"spans {ref})")
    return parts


def _changes(x: dict) -> str:
    from dse.bands import GROUP_NAMES
    if "groups" not in x:
        return ""
    moving = [(g, b) for g, b in x["groups"].items() if b["spread"] > 0 or b["pick_changes"]]
    if not moving:
        return ("what would change it: no fitted parameter group moves it on its own "
                f"({x['samples_per_group']} samples per group)")
    said = []
    for g, b in moving[:2]:
        t = (f"the {GROUP_NAMES.get(g, g)} parameters (alone they move it "
             f"{range_text(b['lo'], b['hi'], x['unit'])}")
        if b["pick_changes"]:
            t += f" and change the {x['pick_label']} in {b['pick_changes']:.0%} of the samples"
        said.append(t + ")")
    text = "what would change it: " + ", then ".join(said)
    if x.get("pick") and x.get("pick_share", 1.0) < 0.95 \
            and not any(b["pick_changes"] for b in x["groups"].values()):
        text += (f"; no group alone changes the {x['pick_label']}: it changes when they move "
                 "together")
    return text


def lead_markdown(items: list[dict], band: dict | None) -> str:
    """The answer's first lines: each lead number with its 90% band, whether its ranking or
    sign is resolved, and what would change it; with bands off, the numbers and that they are
    off."""
    if not items:
        return ""
    lines = []
    for x in items:
        v = value_text(x["nominal"], x["unit"])
        if "median" not in x:
            lines.append(f"- **{x['label']}: {v}** (uncertainty bands off, `--bands 0`: no "
                         "band, no resolution, no attribution)")
            continue
        med = value_text(x["median"], x["unit"])
        still = x["lo"] == x["hi"]
        parts = [f"- **{x['label']}: {v}**, 90% band {range_text(x['lo'], x['hi'], x['unit'])}"
                 f" (median {med}, "
                 f"{x['samples']} parameter samples)"
                 + ("; the fitted parameters do not move it" if still else "")]
        parts += _resolution(x)
        if not still:
            c = _changes(x)
            if c:
                parts.append(c)
        lines.append("; ".join(parts) + ".")
    if band is not None:
        n = sum(1 for b in band["numbers"].values() if b.get("words"))
        total = len(band["numbers"])
        if n:
            which = (f"All {n} of the answer's numbers are" if n == total else
                     f"{n} of the answer's {total} numbers {'is' if n == 1 else 'are'}")
            lines.append(f"- {which} {B.NOT_RESOLVED} (listed under Uncertainty bands).")
    return "\n".join(lines)


__all__ = ["ATTR_SAMPLES", "CACHE_CALLS", "SampleView", "Sampled", "VECTOR_ROWS", "attribution",
           "lead_markdown", "leads", "markdown", "range_text", "sampled_answers", "summarize", "value_text"]
