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
                    progress: bool = False) -> dict:
    """The analysis ``mod.answer`` under ``n`` samples: {key: [value per sample]} of its
    flattened numbers. ``make_context(front, out, sample)`` builds each sample's Context."""
    d = B.draw(n, seed)
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
                sys.stderr.write(f"\rbands: sample {k + 1}/{n}, {rate:.2f} samples/s, "
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


__all__ = ["CACHE_CALLS", "SampleView", "Sampled", "VECTOR_ROWS", "markdown", "sampled_answers",
           "summarize"]
