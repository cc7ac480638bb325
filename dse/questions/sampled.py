"""Bands on the worked questions' answers: the analysis applied per parameter sample.

``dse answer --bands N`` answers the question once as it always has (the published numbers and
figures), then again under each of ``N`` parameter samples (``dse.scoring.bands``) with a Context whose
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

import tempfile
import time
from pathlib import Path

import numpy as np

from dse.build.designs import to_batch
from dse.questions.common import fmt
from dse.scoring import bands as B
from dse.scoring import train_bands as TB
from dse.scoring.bands import GROUP_NAMES as SERVING_GROUPS
from dse.search.progress import Ticker
from dse.spec.fields import label, metric_unit

GROUP_NAMES = {**SERVING_GROUPS, **TB.GROUP_NAMES}   # parameter groups in words
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
        sp, vals, ov = space.with_strings(vals, overrides)
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
    train = getattr(space, "task", "serve") == "train"
    if draws is None:
        draws = TB.draw(n, seed) if train else B.draw(n, seed)
    d = draws
    n = d.n
    shared = TB.TrainSampled(d) if train else Sampled(d)
    metrics = tuple(o.metric for o in space.objectives)
    fronts = None
    if len(front) and "design_id" in front:
        ids = front["design_id"].to_numpy(dtype=np.int64)
        fronts = (TB.space_samples if train else B.space_samples)(
            space, space.values_at(ids), d, None, metrics)
    values: dict = {}
    t0 = time.perf_counter()
    tick = Ticker()                  # a terminal: one line rewritten; a log: a line every 5 s
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
                tick.say(f"{what}: sample {k + 1}/{n}, {rate:.2f} samples/s, "
                         f"ETA {(n - k - 1) / rate:.0f} s ", final=k + 1 == n)
    if progress:
        tick.close()
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
            words = "" if not seen or B.pick_resolved(share.get(base, 0.0)) else \
                f"which value it takes is {B.NOT_RESOLVED}"
            out[key] = {"nominal": base, "shares": share, "words": words}
    return {"samples": int(n), "seed": int(seed), "note": note, "numbers": out}


def _num(v, digits: int = 3) -> str:
    return fmt(v, digits)


def _moves(b: dict) -> bool:
    if "median" in b:
        return bool(np.isfinite(b["lo"]) and np.isfinite(b["hi"]) and b["hi"] > b["lo"])
    return len(b["shares"]) > 1


# the last part of an answer number's key, in words (a metric's name and unit: dse.spec.fields)
_WORDS = {"design_id": "design", "batch": "batch [sequences]", "tp": "tensor parallel (tp)",
          "dp": "attention data parallel (dp)", "ep": "expert parallel (ep)",
          "pp": "pipeline stages (pp)", "multiple": "multiple [x]"}


# a rate or price inside a name (``goodput_requests_per_s_per_rack``): its words and unit
_RATES = (("usd_per_mtok", "price", "$/Mtok"), ("requests_per_s", "requests", "requests/s"),
          ("tokens_per_s", "tokens", "tokens/s"), ("bytes_per_s", "bytes", "bytes/s"),
          ("usd_per_hour", "price", "$/h"))
# ... else a unit at its end (``ttft_s``, ``capacity_bytes``)
_SUFFIXES = (("_s", "s"), ("_bytes", "bytes"), ("_usd", "$"), ("_fraction", "fraction"),
             ("_share", "fraction"), ("_w", "W"), ("_chips", "chips"), ("_tokens", "tokens"))


def _with_unit(name: str) -> str:
    """``goodput_requests_per_s_per_rack`` -> ``goodput requests per rack [requests/s]``,
    ``usd_per_mtok_at_goodput`` -> ``price at goodput [$/Mtok]``."""
    for part, words, unit in _RATES:
        if part in name:
            return f"{name.replace(part, words).replace('_', ' ').strip()} [{unit}]"
    for suf, unit in _SUFFIXES:
        if name.endswith(suf) and len(name) > len(suf):
            return f"{name[:-len(suf)].replace('_', ' ')} [{unit}]"
    return name.replace("_", " ")


def number_name(key: str) -> str:
    """An answer number's key (``fast.usd_per_mtok_output``) in words with its unit:
    ``fast: output cost [$/Mtok]``; a metric is named by ``dse.spec.fields.label``, any other
    part with its underscores as spaces."""
    parts = key.split(".")
    last = parts[-1]
    if last in _WORDS:
        name = _WORDS[last]
    elif metric_unit(last) or label(last) != last:
        name = label(last)
    else:
        name = _with_unit(last)
    head = " ".join(p.replace("_", " ") for p in parts[:-1])
    return f"{head}: {name}" if head else name


def markdown(band: dict, limit: int = 24) -> str:
    """The answer's band block: the numbers not resolved by the model first, then the others
    that move under the samples (``limit`` lines at most), then a count of those that do not
    move (prices, caps, counts the fitted parameters do not touch). Each number is named in
    words with its unit (``number_name``; answer.json keeps the keys)."""
    lines = [f"**Uncertainty bands** ({band['samples']} parameter samples, seed {band['seed']}; "
             f"each number: the model at its fitted parameters, then the samples' median "
             f"[5th..95th percentile]; {band['note']}):", ""]
    items = list(band["numbers"].items())
    moving = [kv for kv in items if _moves(kv[1])]
    moving.sort(key=lambda kv: not kv[1]["words"])      # stable: unresolved first
    for key, b in moving[:limit]:
        if "median" in b:
            line = (f"- {number_name(key)}: {_num(b['nominal'])}; under the samples "
                    f"{B.text(b['median'], b['lo'], b['hi'], _num, 3)}")
        else:
            line = (f"- {number_name(key)}: {b['nominal']}; "
                    + B.shares_words(b["shares"], b["nominal"], ""))
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


def _part(values: dict, i: int, k: int) -> dict:
    return {key: vs[i * k:(i + 1) * k] for key, vs in values.items()}


def attribution(mod, make_context, space, front, n: int, seed: int = 0,
                progress: bool = False, ans=None, values: dict | None = None) -> dict:
    """The analysis under each parameter group alone (``dse.scoring.bands.draw_groups``: the group's
    first ``min(n, ATTR_SAMPLES)`` samples of the full draw, every other group at its fitted
    value), all groups' samples scored together: {"samples_per_group", "groups": {group:
    {key: [value per sample]}}}.

    With the answer ``ans`` and its full samples' ``values``: for each lead number that no
    single group reproduces (its unresolved sign or pick, or ``dse.scoring.bands.BAND_SHARE`` of its
    band's width: ``dse.scoring.bands.needs``), the smallest union of groups that together do, grown
    greedily (``dse.scoring.bands.greedy_unions``; each round's sets drawn by ``dse.scoring.bands.draw_sets`` and
    answered in one ``sampled_answers`` call): "together": {lead key: {"groups", "met",
    "needs", "values"}}. The set of every group is the full draw's first samples (no re-run)."""
    k = min(int(n), ATTR_SAMPLES)
    train = getattr(space, "task", "serve") == "train"
    groups, d = TB.draw_groups(k, seed) if train else B.draw_groups(k, seed)
    got = sampled_answers(mod, make_context, space, front, d.n, seed, progress, draws=d,
                          what="what would change it")
    per = {g: _part(got["values"], i, k) for i, g in enumerate(groups)}
    out = {"samples_per_group": k, "groups": per}
    # a training answer: each group alone (its groups are not drawn by bands.draw_sets)
    if train or ans is None or values is None or len(groups) < 2:
        return out
    nominal = _flat(ans.numbers)
    todo = []
    for ld in ans.lead:
        if not isinstance(nominal.get(ld.key), float):
            continue
        pick = nominal.get(ld.pick) if ld.pick else None
        needs = _needs(ld, pick, values, k)
        if needs:
            todo.append((ld, pick, needs))
    if not todo:
        return out
    cache = {frozenset((g,)): per[g] for g in groups}
    cache[frozenset(groups)] = {key: vs[:k] for key, vs in values.items()}

    def evaluate(sets):
        ordered = [tuple(g for g in groups if g in s) for s in sets]
        _, dd = B.draw_sets(k, seed, ordered)
        r = sampled_answers(mod, make_context, space, front, dd.n, seed, progress, draws=dd,
                            what="parameter groups together")
        return {s: _part(r["values"], i, k) for i, s in enumerate(sets)}

    targets = [(lambda v, ld=ld, pk=pk, nd=nd: _score(_stats(ld, v, pk), nd),
                lambda v, ld=ld, pk=pk, nd=nd: B.needs_met(_stats(ld, v, pk), nd) == len(nd))
               for ld, pk, nd in todo]
    found = B.greedy_unions(groups, evaluate, targets, cache)
    out["together"] = {ld.key: {"groups": list(f["groups"]), "met": f["met"],
                                "needs": sorted(nd), "values": f["result"]}
                       for (ld, _, nd), f in zip(todo, found) if len(f["groups"]) > 1}
    return out


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (np.isnan(a) and np.isnan(b))
    return str(a) == str(b)


def _stats(lead, vals: dict, pick_nominal) -> dict:
    """A lead number's band under some samples (``vals``: {key: [value per sample]}) and the
    share of them in which its pick differs from ``pick_nominal``."""
    y = np.array([u if isinstance(u, float) else np.nan for u in vals.get(lead.key, [])])
    med, lo, hi = (float(u) for u in B.summary(y))
    flips = 0.0
    if lead.pick and lead.pick in vals:
        ps = [u for u in vals[lead.pick] if u is not None]
        flips = float(np.mean([not _same(u, pick_nominal) for u in ps])) if ps else 0.0
    return {"median": med, "lo": lo, "hi": hi,
            "spread": float(hi - lo) if np.isfinite(hi - lo) else 0.0, "pick_changes": flips}


def _side_resolved(st: dict, v: float) -> bool:
    return B.sign_resolved(st["lo"], st["hi"], versus=v)


def _needs(lead, pick_nominal, values: dict, k: int) -> dict:
    """What a set of parameter groups must reproduce of a lead number's full band
    (``dse.scoring.bands.needs``): the band with every group varied is the full draw's first ``k``
    samples, as many as each set gets."""
    ref = _stats(lead, {key: vs[:k] for key, vs in values.items()}, pick_nominal)
    return B.needs(ref, _stats(lead, values, pick_nominal), lead.versus, bool(lead.pick))


def _score(st: dict, needs: dict) -> tuple:
    """Larger is better: the needs met, then the band's width, then how often the pick moves."""
    return (B.needs_met(st, needs), st["spread"], st["pick_changes"])


def _label(v) -> str:
    if isinstance(v, float) and v.is_integer():
        return f"{int(v):,}"
    return str(v) if not isinstance(v, float) else _num(v)


def value_text(v, unit: str = "", digits: int = 3) -> str:
    """A lead number with its unit: ``3.01x``, ``-9.5%``, ``85.4%`` (a share), ``$0.317/Mtok``,
    ``136 requests/s per rack``; ``digits`` significant digits (percentages: ``digits - 2``
    decimals)."""
    if v is None or not np.isfinite(v):
        return "-"
    if unit == "x":
        return f"{fmt(v, digits)}x"
    if unit == "%":
        return f"{v:+.{max(digits - 2, 0)}f}%"
    if unit == "share":
        return f"{v * 100:.{max(digits - 2, 0)}f}%"
    if unit == "$/Mtok":
        return f"${fmt(v, digits)}/Mtok"
    return f"{fmt(v, digits)} {unit}".strip()


def _join(lo: str, hi: str, unit: str) -> str:
    """``lo..hi``, a unit written after the numbers once (``135..142 requests/s per rack``)."""
    tail = f" {unit}" if unit not in ("", "x", "%", "share", "$/Mtok") else ""
    if tail and lo.endswith(tail):
        lo = lo[:-len(tail)]
    return f"{lo}..{hi}"


def band_text(med, lo, hi, unit: str = "") -> tuple[str, str]:
    """(the median, ``lo..hi``) with the unit, from ``dse.scoring.bands.band_strings``: enough digits that
    a band that moves does not print as ``x..x`` or its median as one of its bounds."""
    m, a, b = B.band_strings((med, lo, hi), lambda v, d: value_text(v, unit, d), 3)
    return m, _join(a, b, unit)


def range_text(lo, hi, unit: str = "") -> str:
    """``2.9x..3.1x``, ``$0.31/Mtok..$0.33/Mtok``, ``135..142 requests/s per rack``."""
    a, b = B.band_strings((lo, hi), lambda v, d: value_text(v, unit, d), 3)
    return _join(a, b, unit)


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
        out["side_resolved"] = _side_resolved({"lo": lo, "hi": hi}, lead.versus)
    if lead.pick and lead.pick in values:
        sh = _shares(values[lead.pick])
        out["pick_shares"] = sh
        out["pick_share"] = float(sh.get(_label(out["pick_nominal"]), 0.0)) \
            if out["pick_nominal"] is not None else 0.0
    if attr:
        pn = out.get("pick_nominal")
        groups = {g: _stats(lead, vals, pn) for g, vals in attr["groups"].items()}
        out["groups"] = dict(sorted(groups.items(), key=lambda kv: -kv[1]["spread"]))
        out["samples_per_group"] = attr["samples_per_group"]
        tog = (attr.get("together") or {}).get(lead.key)
        if tog:
            out["together"] = {"groups": list(tog["groups"]), "met": bool(tog["met"]),
                               "needs": list(tog["needs"]), **_stats(lead, tog["values"], pn)}
    return out


def leads(ans, values: dict | None = None, attr: dict | None = None) -> list[dict]:
    """The answer's lead numbers (``Answer.lead``) as JSON-able dicts: the nominal value, and
    with bands its median and 90% band, whether its side of ``versus`` and its pick hold in the
    samples, per parameter group alone (``attribution``) its band and how often the pick
    changes, widest first, and where no group alone reproduces what the band says, the union
    of groups that together do ("together"). One helper for every question."""
    nominal = _flat(ans.numbers)
    out = [_one(ld, nominal, values, attr) for ld in ans.lead]
    return [x for x in out if x is not None]


def _ref(x: dict) -> str:
    return value_text(x["versus"], x["unit"]) if x["unit"] not in ("%",) else f"{x['versus']:g}%"


def _resolution(x: dict) -> list[str]:
    parts = []
    if x.get("pick") and "pick_shares" in x:
        words = B.shares_words(x["pick_shares"], _label(x["pick_nominal"]), "is picked")
        if B.pick_resolved(x.get("pick_share", 0.0)):
            parts.append(f"the ranking is resolved: {x['pick_label']} {words}")
        else:
            parts.append(f"which {x['pick_label']} wins is {B.NOT_RESOLVED}: "
                         f"{x['pick_label']} {words}")
    if x.get("versus") is not None and "side_resolved" in x:
        ref = _ref(x)
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


def _together(x: dict) -> str:
    """``; no group alone reproduces <what>: the GEMM and attention parameters together do
    (together they move it ...)``, from ``attribution``'s greedy union."""
    t = x.get("together")
    if not t:
        return ""
    moves = f"move it {range_text(t['lo'], t['hi'], x['unit'])}"
    if x.get("pick") and t["pick_changes"]:
        moves += (f" and change the {x['pick_label']} in {B.share_text(t['pick_changes'])} of "
                  "the samples")
    sign = "its unresolved sign" if x.get("versus") == 0 else \
        f"its unresolved side of {_ref(x)}" if x.get("versus") is not None else ""
    what = B.needs_words(t["needs"], sign, f"the unresolved {x['pick_label']}")
    return B.together_words(t["groups"], t["met"], what, moves, x["samples"],
                            x["samples_per_group"])


def _changes(x: dict) -> str:
    if "groups" not in x:
        return ""
    moving = [(g, b) for g, b in x["groups"].items() if b["spread"] > 0 or b["pick_changes"]]
    if not moving:
        return ("what would change it: no fitted parameter group moves it on its own "
                f"({x['samples_per_group']} samples per group)" + _together(x))
    said = []
    for g, b in moving[:2]:
        t = (f"the {GROUP_NAMES.get(g, g)} parameters (alone they move it "
             f"{range_text(b['lo'], b['hi'], x['unit'])}")
        if b["pick_changes"]:
            t += (f" and change the {x['pick_label']} in {B.share_text(b['pick_changes'])} of "
                  "the samples")
        said.append(t + ")")
    return "what would change it: " + ", then ".join(said) + _together(x)


WHY_MEDIAN = (
    "- Quote the median with its band: the model at its fitted parameters is one draw of the "
    "parameters, and it sits off the band's centre where the answer bends with them (a ratio, "
    "a best design that switches, a limit that starts to bind); the median is the middle of "
    "what the fits allow.")


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
        med, span = band_text(x["median"], x["lo"], x["hi"], x["unit"])
        still = x["lo"] == x["hi"]
        if still:
            parts = [f"- **{x['label']}: {v}** ({x['samples']} parameter samples); the fitted "
                     "parameters do not move it"]
        else:
            parts = [f"- **{x['label']}: {med}**, the median of {x['samples']} parameter "
                     f"samples, 90% band {span} (the model at its fitted parameters: {v})"]
        parts += _resolution(x)
        if not still:
            c = _changes(x)
            if c:
                parts.append(c)
        lines.append("; ".join(parts) + ".")
    if any("median" in x and x["lo"] != x["hi"] and value_text(x["median"], x["unit"]) !=
           value_text(x["nominal"], x["unit"]) for x in items):
        lines.append(WHY_MEDIAN)
    if band is not None:
        n = sum(1 for b in band["numbers"].values() if b.get("words"))
        total = len(band["numbers"])
        if n:
            which = (f"All {n} of the answer's numbers are" if n == total else
                     f"{n} of the answer's {total} numbers {'is' if n == 1 else 'are'}")
            lines.append(f"- {which} {B.NOT_RESOLVED} (listed under Uncertainty bands).")
    return "\n".join(lines)


__all__ = ["ATTR_SAMPLES", "CACHE_CALLS", "SampleView", "Sampled", "VECTOR_ROWS",
           "attribution", "band_text", "lead_markdown", "leads", "markdown", "range_text",
           "sampled_answers", "summarize", "value_text"]
