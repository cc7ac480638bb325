"""Uncertainty bands: designs re-scored under samples of the fitted parameters.

The kernel fits write, per catalog entry (an accelerator and a serving runtime) and per family
of parameters fitted together, the covariance of the log parameters (``uncertainty.<family>``:
``params``, ``log_sd``, ``log_corr``; ``dse/calibration/kernels/common.py``). ``draw(n, seed)`` draws ``n``
samples of every family, ``ln(value) ~ N(ln(fitted), diag(sd) C diag(sd))``, as multiplicative
factors on the catalog values. Each entry's draws are seeded by ``(seed, entry, family)``: one
draw per catalog entry, shared by every design that uses the entry, whichever designs, runs or
calls ask for it, so two designs on the same chip (or the two runs of a compare) are compared
under the same parameters and their difference is banded, not their sum of noises.

``score_table`` scores ``n`` samples x designs in ONE scorer call: the designs' resolved
columns are repeated ``n`` times (sample-major rows ``k * m + i``) with the kernel parameter
columns (``accelerator.kernel.<key>``) and the end-to-end ones
(``accelerator.efficiency.{layer,step}_overhead_s``, the runtime's host times
``serving.{request,seq}_overhead_s``) multiplied by the sample's factors; the
family selection (dtype, attention kind, fallbacks) then happens in ``dse.build.designs.to_batch`` as
for any design. Reports give each metric's median and 90% band (5th..95th percentile).

What the bands cover: the parameters' fit uncertainty (least-squares covariance; transferred
chips: the donors' covariance plus the leave-one-chip-out error), for the groups whose catalog
files carry it (``coverage()``; end-to-end: ``[<table>.uncertainty.<family>]`` in
efficiency.toml, as the kernels write it, or ``<field>_log_sd = x`` beside a field); a group without uncertainty tables is held exact and every
report says so. What they do not cover: model-form error (a term the model lacks), the error of
transferring the end-to-end remainder to a runtime or chip it was not fitted on, and a value a
design or what-if sets by hand (it keeps the catalog's relative uncertainty: a ``--scale`` of a
kernel parameter scales an uncertain value, a ``--set`` one is treated the same way).
"""

from __future__ import annotations

import tomllib
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from dse import catalog
from dse.build import tables
from dse.build.designs import to_batch
from dse.build.runtimes import HOST_TIMES
from dse.build.select import KERNEL, encode
from dse.build.tables import EFF_AS, EFF_FIELDS
from dse.errors import InputError
from dse.perf import score_chunked

DEFAULT_SAMPLES = 64          # `--bands N`'s default; 0 turns bands off
GROUP_SAMPLES = 8             # samples per group for "what would change it" (draw_groups)
PERCENTILES = (5.0, 50.0, 95.0)   # the 90% band and the median
EFF = "accelerator.efficiency."
# A fitted parameter whose log sd exceeds this (a factor e per sd) is one the data do not pin
# down: the fit writes its prior spread there (dse/calibration/kernels/common.py ``bounded_cov``: the sd of
# a uniform draw within its log bounds, e.g. 4.65 for a per-sequence time fitted at 3e-8 s
# within [1e-10, 1e-3] s). A normal draw of it would put the model at values (x10^4) that the
# measured kernels rule out but the local covariance cannot see, so it is held at its fitted
# value, and the bands' note counts such parameters.
MAX_LOG_SD = 1.0
GROUPS = ("gemm", "moe", "attention", "comm", "e2e")
GROUP_NAMES = {"gemm": "GEMM", "moe": "MoE grouped-GEMM", "attention": "attention",
               "comm": "collective", "e2e": "end-to-end overhead (layer, front end, scheduler)"}
CATALOG = Path(catalog.__file__).resolve().parent


@dataclass(frozen=True)
class Family:
    """One family's log-normal uncertainty in one catalog entry."""

    group: str            # gemm, moe, attention, comm (kernels/<group>.toml) or e2e
    entry: tuple          # (accelerator, runtime) for kernels, (efficiency table,) for e2e
    name: str
    params: tuple         # catalog keys
    log_sd: np.ndarray
    log_corr: np.ndarray
    rule: str

    def free(self) -> np.ndarray:
        """The parameters the data leave free (log_sd > MAX_LOG_SD): held at their values."""
        return self.log_sd > MAX_LOG_SD

    def root(self) -> np.ndarray:
        """A matrix ``R`` with ``R R^T`` the log covariance of the sampled parameters (the free
        ones' rows zero; negative eigenvalues of the rounded correlation clipped to zero)."""
        sd = np.where(self.free(), 0.0, self.log_sd)
        cov = np.outer(sd, sd) * self.log_corr
        w, v = np.linalg.eigh(0.5 * (cov + cov.T))
        return v * np.sqrt(np.clip(w, 0.0, None))


def _family(group, entry, name, u) -> Family:
    params = tuple(u["params"])
    sd = np.asarray(u.get("log_sd", [0.0] * len(params)), float)
    corr = np.asarray(u.get("log_corr", np.eye(len(params))), float)
    if sd.shape != (len(params),) or corr.shape != (len(params),) * 2 \
            or not np.isfinite(sd).all() or (sd < 0).any():
        raise InputError(f"uncertainty.{name} of {'/'.join(entry)}: log_sd/log_corr do not "
                         f"match its {len(params)} params", file=f"dse/catalog/{group}",
                         hint="rewrite it with the fit that writes it")
    return Family(group, tuple(entry), name, params, sd, corr, str(u.get("rule", "")))


@lru_cache(maxsize=1)
def _families_cached(stamp) -> tuple[Family, ...]:
    out = []
    # a family whose parameters a chip's architecture now sets (kernels/architecture.toml) no
    # longer describes them: catalog.kernel_params drops it, and so do the bands
    kept = {e: set(v.get("uncertainty", {})) for e, v in catalog.kernel_params().items()}
    for f in sorted((CATALOG / "kernels").glob("*.toml")):
        doc = tomllib.loads(f.read_text())
        for chip, runtimes in doc.items():
            for rt, vals in runtimes.items():
                for name, u in (vals.get("uncertainty") or {}).items():
                    if name in kept.get((chip, rt), {name}):
                        out.append(_family(f.stem, (chip, rt), name, u))
    eff = tomllib.loads((CATALOG / "efficiency.toml").read_text())
    # a top-level [uncertainty.<name>] (as dse.calibration.fit writes it) belongs to the shared default
    for name, u in (eff.pop("uncertainty", None) or {}).items():
        out.append(_family("e2e", ("default",), name, u))
    for table, vals in eff.items():
        for name, u in (vals.get("uncertainty") or {}).items():
            out.append(_family("e2e", (table,), name, u))
        # the plain form: ``<field>_log_sd = x`` next to the field (independent parameters)
        plain = {k[:-7]: float(v) for k, v in vals.items()
                 if k.endswith("_log_sd") and k[:-7] in EFF_FIELDS}
        if plain and not vals.get("uncertainty"):
            out.append(_family("e2e", (table,), "e2e", {"params": list(plain),
                                                         "log_sd": list(plain.values()),
                                                         "rule": "efficiency.toml log_sd"}))
    return tuple(out)


def families() -> tuple[Family, ...]:
    """Every uncertainty family in the catalog (re-read when the catalog is reloaded)."""
    return _families_cached(_stamp())


def _stamp() -> tuple:
    """Changes when the catalog is reloaded (a fit clears its caches after writing)."""
    return id(catalog.kernel_params()), id(catalog.accelerators())


def coverage(fams=None) -> dict[str, int]:
    """Per group (GROUPS), the number of catalog entries that carry uncertainty tables."""
    fams = families() if fams is None else fams
    return {g: len({f.entry for f in fams if f.group == g}) for g in GROUPS}


def coverage_note(fams=None) -> str:
    """One sentence: which parameter groups the bands sample and which are held exact."""
    fams = families() if fams is None else fams
    cov = coverage(fams)
    on = [GROUP_NAMES[g] for g in GROUPS if cov[g]]
    off = [GROUP_NAMES[g] for g in GROUPS if not cov[g]]
    text = ("bands sample the fitted " + (", ".join(on) or "(no)") + " parameters")
    if off:
        text += ("; " + ", ".join(off) + " parameters have no uncertainty in the catalog and "
                 "are held exact")
    free = sum(int(f.free().sum()) for f in fams)
    if free:
        total = sum(len(f.params) for f in fams)
        text += (f"; {free} of {total} catalog parameters that their data leave free (log sd "
                 f"> {MAX_LOG_SD:g}: the fit's prior spread) are held at their fitted values")
    return text + "; model-form error is not included"


@dataclass(frozen=True)
class Draws:
    """``n`` parameter samples as factors on the catalog values: ``kernel[k, accelerator,
    runtime (+1: unknown), key]`` (``tables.Tables.kernel``'s axes),
    ``eff[k, accelerator, field]`` (EFF_FIELDS) and ``host[k, runtime (+1), time]`` (the
    runtime's host times, HOST_TIMES: ``request_overhead_s.<runtime>``, ``seq_overhead_s.<runtime>``
    of the end-to-end fit, a plain name such as ``frontend_prompt_token_s`` on every runtime)."""

    n: int
    seed: int
    kernel: np.ndarray
    eff: np.ndarray
    note: str
    host: np.ndarray

    def only(self, k: int) -> "Draws":
        """Sample ``k`` alone (the same numbers as in the whole draw)."""
        return Draws(1, self.seed, self.kernel[k:k + 1], self.eff[k:k + 1], self.note,
                     self.host[k:k + 1])


def log_draws(fam: Family, n: int, seed: int) -> np.ndarray:
    """``n`` draws (n x params) of the family's log deviations, seeded by the entry and name:
    the same numbers whichever designs or calls ask for them."""
    key = zlib.crc32("|".join((fam.group, *fam.entry, fam.name)).encode())
    rng = np.random.default_rng([int(seed), key])
    return rng.standard_normal((n, len(fam.params))) @ fam.root().T


def check_samples(n) -> int:
    """``--bands N``: None gives DEFAULT_SAMPLES; 0 turns bands off; else a whole number >= 2."""
    if n is None:
        return DEFAULT_SAMPLES
    if isinstance(n, bool) or not float(n) == int(n) or int(n) < 0 or int(n) == 1:
        raise InputError(f"--bands {n}: needs a whole number of samples >= 2, or 0",
                         hint=f"e.g. --bands {DEFAULT_SAMPLES}; --bands 0 turns bands off")
    return int(n)


def draw(n: int = DEFAULT_SAMPLES, seed: int = 0, fams=None) -> Draws:
    """``n`` samples of every catalog family (``fams``: a chosen list of Family instead)."""
    if n < 1:
        raise ValueError("draw needs n >= 1 (bands off: do not draw)")
    if fams is None:
        return _draw_cached(int(n), int(seed), _stamp())
    return _draw(n, seed, tuple(fams))


def check_sets(n: int, sets: tuple, groups: tuple) -> None:
    """``draw_sets``' arguments: ``n`` >= 1 and non-empty sets of known ``groups``."""
    if n < 1 or not sets or not all(sets):
        raise ValueError("draw_sets needs n >= 1 and non-empty sets of groups")
    unknown = {g for s in sets for g in s} - set(groups)
    if unknown:
        raise ValueError(f"unknown parameter groups {sorted(unknown)} (known: {groups})")


def draw_sets(n: int, seed: int = 0, sets=None, fams=None) -> tuple[tuple, Draws]:
    """For each set of parameter groups (a tuple of GROUPS names; default: each group that the
    catalog samples, alone), ``n`` samples with only those groups' families varied, every other
    parameter held at its fitted value: (the sets, one Draws of ``len(sets) x n`` samples, set
    ``i``'s in samples ``i*n .. i*n+n-1``). Each family draws the same numbers as in ``draw(n,
    seed)`` (``log_draws`` is seeded by the family, and its first ``n`` rows do not depend on how
    many more are drawn), so a set's samples are the full samples with the other groups switched
    off, and the set of every sampled group is the full draw's first ``n`` samples."""
    fams = families() if fams is None else tuple(fams)
    sampled = tuple(g for g in GROUPS if any(f.group == g for f in fams))
    sets = tuple((g,) for g in sampled) if sets is None else tuple(tuple(s) for s in sets)
    check_sets(n, sets, GROUPS)
    parts = [_draw(n, seed, tuple(f for f in fams if f.group in s)) for s in sets]
    kernel, eff, host = (np.concatenate([getattr(p, a) for p in parts])
                         for a in ("kernel", "eff", "host"))
    for v in (kernel, eff, host):
        v.setflags(write=False)
    return sets, Draws(n * len(sets), int(seed), kernel, eff, coverage_note(fams), host)


def draw_groups(n: int, seed: int = 0, fams=None) -> tuple[tuple[str, ...], Draws]:
    """For each group (GROUPS) that the catalog samples, ``n`` samples of that group's families
    alone (``draw_sets`` of single groups): (the groups, one Draws of ``len(groups) x n``
    samples, group ``i``'s in samples ``i*n .. i*n+n-1``). Scoring them says which group moves
    a result most (what would change it)."""
    fams = families() if fams is None else tuple(fams)
    if not any(f.group in GROUPS for f in fams):
        raise ValueError("draw_groups needs n >= 1 and a sampled group")
    sets, d = draw_sets(n, seed, None, fams)
    return tuple(s[0] for s in sets), d


def greedy_unions(groups, evaluate, targets, cache: dict | None = None) -> list[dict]:
    """For each target, the smallest union of parameter ``groups`` that meets it, grown
    greedily: the best single group, then the best group added to it, and so on (at most
    ``len(groups) - 1`` rounds, not ``2^len(groups)`` sets). ``targets``: ``(score, enough)``
    pairs, ``score(result)`` a tuple (larger is better), ``enough(result)`` a bool;
    ``evaluate(sets)`` -> {frozenset of groups: result}, called once per round with every set
    that the unfinished targets need and ``cache`` (pre-filled results, e.g. of the single groups
    or of all of them) does not hold: one vectorized call per round for all targets. Returns per
    target {"groups": the union in the order it grew, "result", "met"}."""
    groups = tuple(groups)
    cache = {} if cache is None else cache

    def fetch(sets):
        need = [s for s in dict.fromkeys(sets) if s not in cache]
        if need:
            cache.update(evaluate(need))
        return {s: cache[s] for s in sets}

    singles = [frozenset((g,)) for g in groups]
    got = fetch(singles)
    state = []
    for score, enough in targets:
        ok = [s for s in singles if enough(got[s])]
        best = max(ok or singles, key=lambda s: score(got[s]))
        state.append({"order": [next(iter(best))], "set": best, "met": bool(ok)})
    while True:
        open_ = [i for i, st in enumerate(state) if not st["met"] and len(st["set"]) < len(groups)]
        if not open_:
            break
        cands = {i: [state[i]["set"] | {g} for g in groups if g not in state[i]["set"]]
                 for i in open_}
        got = fetch([s for i in open_ for s in cands[i]])
        for i in open_:
            score, enough = targets[i]
            ok = [s for s in cands[i] if enough(got[s])]
            best = max(ok or cands[i], key=lambda s: score(got[s]))
            state[i]["order"].append(next(iter(best - state[i]["set"])))
            state[i]["set"], state[i]["met"] = best, bool(ok)
    return [{"groups": tuple(st["order"]), "result": cache[st["set"]], "met": st["met"]}
            for st in state]


@lru_cache(maxsize=4)
def _draw_cached(n, seed, stamp) -> Draws:
    return _draw(n, seed, families())


def _draw(n: int, seed: int, fams: tuple) -> Draws:
    T = tables.tables()
    kernel = np.ones((n, *T.kernel.shape))
    eff = np.ones((n, len(T.ids["accelerator"]), len(EFF_FIELDS)))
    host = np.ones((n, len(T.runtimes) + 1, len(HOST_TIMES)))
    hpos = {f"{h.split('.')[1]}.{rt}": (r, i) for i, h in enumerate(HOST_TIMES)
            for r, rt in enumerate(T.runtimes)}
    shared = {h.split(".")[1]: i for i, h in enumerate(HOST_TIMES)}
    kpos = {k: j for j, k in enumerate(T.kernel_keys)}
    rpos = {r: j for j, r in enumerate(T.runtimes)}
    epos = {k: j for j, k in enumerate(EFF_FIELDS)}
    eff_tables = tomllib.loads((CATALOG / "efficiency.toml").read_text())
    own = {a: (a if a in eff_tables else "default") for a in T.ids["accelerator"]}
    for fam in fams:
        z = np.exp(log_draws(fam, n, seed))
        if fam.group == "e2e":
            accs = [T.index["accelerator"][a] for a, t in own.items() if t == fam.entry[0]]
            for j, p in enumerate(fam.params):
                if p in epos and accs:
                    eff[:, accs, epos[p]] *= z[:, j:j + 1]
                    # a field that takes this one's value where blank (EFF_AS: the CUDA-graph
                    # per-layer time) takes its draw too, unless the family samples it itself
                    for f in (f for f, src in EFF_AS.items() if src == p and f not in fam.params):
                        eff[:, accs, epos[f]] *= z[:, j:j + 1]
                elif p in hpos and fam.entry[0] == "default":
                    host[:, hpos[p][0], hpos[p][1]] *= z[:, j]
                elif p in shared and fam.entry[0] == "default":   # one number, every runtime
                    host[:, :, shared[p]] *= z[:, j:j + 1]
            continue
        # the family's part and its variants (``kernel_base``): one draw, as one set of fits
        a = [T.index["accelerator"][x] for x in T.ids["accelerator"]
             if catalog.kernel_chip(x) == fam.entry[0]]
        r = rpos.get(fam.entry[1])
        if not a or r is None:
            continue
        for j, p in enumerate(fam.params):
            if p in kpos:
                kernel[:, a, r, kpos[p]] *= z[:, j:j + 1]
    for v in (kernel, eff, host):         # cached and shared: read-only
        v.setflags(write=False)
    return Draws(n, int(seed), kernel, eff, coverage_note(fams), host)


def _rows(v, m: int) -> np.ndarray:
    v = v.to_numpy() if isinstance(v, pd.Series) else np.asarray(v)
    return np.broadcast_to(v, (m,)) if v.size <= 1 else v


def _tile(v, n: int):
    """A column repeated for ``n`` samples (length-1 columns stay length-1)."""
    if isinstance(v, pd.Series):
        v = v.array if isinstance(v.dtype, pd.CategoricalDtype) else v.to_numpy()
    if isinstance(v, pd.Categorical):
        return pd.Categorical.from_codes(np.tile(v.codes, n), dtype=v.dtype)
    v = np.asarray(v)
    return v if v.size <= 1 else np.tile(v, n)


def stack(table, m: int, draws: Draws) -> dict:
    """The resolved columns of ``m`` designs (a DataFrame, or a dict of length-1 or length-m
    columns) repeated for every sample, rows ``k * m + i``, with the kernel and end-to-end
    parameter columns multiplied by sample ``k``'s factors for each design's entry."""
    T = tables.tables()
    cols = list(table.columns) if isinstance(table, pd.DataFrame) else list(table)
    a = _rows(encode(table["accelerator.id"], T.ids["accelerator"]), m)
    r = _rows(encode(table["serving.runtime"], T.runtimes), m)   # -1: the unknown slot
    kpos = {KERNEL + k: j for j, k in enumerate(T.kernel_keys)}
    epos = {EFF + k: j for j, k in enumerate(EFF_FIELDS)}
    hpos = {h: j for j, h in enumerate(HOST_TIMES)}
    out = {}
    for c in cols:
        if c in kpos or c in epos or c in hpos:
            f = (draws.kernel[:, a, r, kpos[c]] if c in kpos else draws.eff[:, a, epos[c]]
                 if c in epos else draws.host[:, r, hpos[c]])
            if not np.any(f != 1.0):
                out[c] = _tile(table[c], draws.n)
                continue
            v = _rows(np.asarray(table[c], float), m)
            out[c] = (f * v[None, :]).reshape(-1)
        else:
            out[c] = _tile(table[c], draws.n)
    return out


def score_table(table, m: int, draws: Draws, rows: np.ndarray | None = None,
                direct: dict | None = None, metrics: tuple | None = None) -> dict:
    """Every metric (or ``metrics``) of the designs under every sample, ONE scorer call over
    ``draws.n x designs`` rows: {metric: array (samples, designs)}. ``table``: the resolved
    columns of ``m`` distinct rows; ``rows``/``direct``: each design's row among them and the
    fields written straight into the Batch (``Space.batch_parts``); default one design per row."""
    rows = np.arange(m) if rows is None else np.asarray(rows, np.int64)
    n, N = len(rows), draws.n
    b = to_batch(stack(table, m, draws), compact=True)
    every = (np.arange(N)[:, None] * m + rows[None, :]).reshape(-1)
    d = {k: np.tile(np.broadcast_to(np.asarray(v, float), (n,)), N)
         for k, v in (direct or {}).items()}
    s = score_chunked(b, rows=every, direct=d, metrics=metrics)
    return {k: np.broadcast_to(np.asarray(v), (N * n,)).reshape(N, n) for k, v in s.items()}


def space_samples(space, values: dict, draws: Draws, overrides: dict | None = None,
                  metrics: tuple | None = None) -> dict:
    """``score_table`` for designs of a space given by parameter ``values`` ({path: values},
    as ``Space.batch_from_values``), under what-if ``overrides`` {path: (op, value)}."""
    sp, vals, ov = space.with_strings(values, overrides)
    _, rows, direct, table = sp.batch_from_values(vals, ov, parts=True)
    m = int(np.max(rows)) + 1 if len(rows) else 1
    return score_table(table, m, draws, rows, direct, metrics)


def frame_samples(resolved: pd.DataFrame, draws: Draws, metrics: tuple | None = None) -> dict:
    """``score_table`` for a resolved design table (``dse.build.designs.resolve``)."""
    return score_table({c: resolved[c].to_numpy() for c in resolved.columns}, len(resolved),
                       draws, metrics=metrics)


# ------------------------------------------------------------------ summaries and words

def summary(x) -> tuple:
    """(median, 5th, 95th percentile) over the samples (axis 0), NaN-aware."""
    x = np.asarray(x, float)
    if x.size == 0 or not np.isfinite(x).any():
        nan = np.full(x.shape[1:], np.nan)
        return nan, nan, nan
    lo, med, hi = np.nanpercentile(x, PERCENTILES, axis=0)
    return med, lo, hi


def sig(v, digits: int = 4) -> str:
    """``v`` to ``digits`` significant digits, thousands separated when it has more integer
    digits than that (``11,585``, not ``1.16e+04``)."""
    v = float(v)
    if not np.isfinite(v):
        return "-"
    if abs(v) >= 10 ** digits:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}"


def pct(v, decimals: int = 1) -> str:
    """A fraction as a signed percent with ``decimals`` decimals: ``+6.7%``."""
    v = float(v)
    return f"{v * 100:+.{decimals}f}%" if np.isfinite(v) else "-"


def band_strings(values, render=sig, start: int = 4, most: int = 4) -> list[str]:
    """``values`` (a median and its band bounds, or just the bounds) rendered with the fewest
    digits ``d >= start`` (``render(v, d)``, at most ``start + most``) at which values that
    differ print as different strings: a band that moves never prints as ``1.2 [1.2..1.2]``.
    Values within 1e-9 (relative) of each other count as equal. The one band formatter of
    every page and terminal line."""
    vals = [float(v) for v in values]
    pairs = [(i, j) for i in range(len(vals)) for j in range(i + 1, len(vals))
             if np.isfinite(vals[i]) and np.isfinite(vals[j])
             and abs(vals[i] - vals[j]) > 1e-9 * max(abs(vals[i]), abs(vals[j]))]
    d = start
    while True:
        out = [render(v, d) for v in vals]
        if d >= start + most or all(out[i] != out[j] for i, j in pairs):
            return out
        d += 1


def text(med, lo, hi, render=sig, start: int = 4) -> str:
    """``median [lo..hi]`` (``band_strings``: enough digits that they do not collapse)."""
    m, a, b = band_strings((med, lo, hi), render, start)
    return f"{m} [{a}..{b}]"


RESOLVED_SHARE = 0.95      # a pick (or a ranking) is resolved when it holds in this share


def share_text(s: float) -> str:
    """A share of the samples as a whole percent, rounded down (``0.949`` is ``94%``, never a
    ``95%`` that reads as resolved)."""
    return f"{int(np.floor(s * 100 + 1e-9))}%"


def pick_resolved(share: float) -> bool:
    """Whether a pick holds in at least RESOLVED_SHARE of the samples."""
    return bool(np.isfinite(share) and share >= RESOLVED_SHARE - 1e-12)


def shares_words(shares: dict, nominal: str, verb: str = "is picked", others: int = 2) -> str:
    """The one wording of a choice under the samples (an answer's pick, a text value): held in
    at least RESOLVED_SHARE of them, ``design 7 is picked in >= 95% of the samples (100%)``;
    else its share and the next ``others`` values', ``design 7 is picked in 60% of the samples,
    9 in 40%``. ``shares``: {value: share}; ``nominal``: the value the answer states."""
    s = float(shares.get(nominal, 0.0))
    lead = " ".join(w for w in (str(nominal), verb, "in") if w)
    if pick_resolved(s):
        return f"{lead} >= {RESOLVED_SHARE:.0%} of the samples ({share_text(s)})"
    rest = [(v, x) for v, x in sorted(shares.items(), key=lambda kv: -kv[1]) if v != nominal]
    tail = "".join(f", {v} in {share_text(x)}" for v, x in rest[:others])
    return f"{lead} {share_text(s)} of the samples{tail}"


def sign_resolved(lo, hi, tol: float = 1e-9, versus: float = 0.0) -> bool:
    """Whether the band keeps one sign, or one side of ``versus`` (it not inside the band by
    more than ``tol``: values within ``tol`` of it are rounding, e.g. a change of 1e-16)."""
    return bool(lo >= versus - tol or hi <= versus + tol)


# ---------------------------------------------------------- groups together: what they reproduce

BAND_SHARE = 0.5      # a set of groups "reproduces the band": this share of its width


def needs(ref: dict, full: dict, versus: float | None = None, pick: bool = False) -> dict:
    """What a set of parameter groups must reproduce of a number's band for "what would change
    it" to name it: "band", BAND_SHARE of the width of ``ref`` (the band with every group
    varied, in as many samples as each set gets); "sign", its side of ``versus`` when the
    ``full`` band does not resolve it; "pick" (``pick``: the number has one), a changed pick
    when the full samples leave it unresolved. ``ref``/``full``: {lo, hi, spread,
    pick_changes}."""
    need = {}
    if ref["spread"] > 0:
        need["band"] = BAND_SHARE * ref["spread"]
    if versus is not None and np.isfinite(full["lo"]) and np.isfinite(full["hi"]) \
            and not sign_resolved(full["lo"], full["hi"], versus=versus):
        need["sign"] = versus
    if pick and not pick_resolved(1.0 - full.get("pick_changes", 0.0)):
        need["pick"] = True
    return need


def needs_met(st: dict, need: dict) -> int:
    """How many of ``need`` (``needs``) a set's band ``st`` reproduces."""
    n = 0
    if "band" in need:
        n += st["spread"] >= need["band"] * (1 - 1e-9)
    if "sign" in need:
        n += bool(np.isfinite(st["lo"])) and not sign_resolved(st["lo"], st["hi"],
                                                               versus=need["sign"])
    if "pick" in need:
        n += not pick_resolved(1.0 - st.get("pick_changes", 0.0))
    return int(n)


def and_words(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def needs_words(need, sign: str = "its unresolved sign", pick: str = "the unresolved pick") -> str:
    """``its unresolved sign and 50% of its band's width``."""
    out = ([sign] if "sign" in need else []) + ([pick] if "pick" in need else []) \
        + ([f"{BAND_SHARE:.0%} of its band's width"] if "band" in need else [])
    return and_words(out)


def together_words(groups, met: bool, what: str, moves: str, n: int, k: int) -> str:
    """``; no group alone reproduces <what>: the GEMM and attention parameters together do
    (together they <moves>)``; when only all groups together do (``met`` false: not in ``k``
    samples per set), said so."""
    names = and_words([GROUP_NAMES.get(g, g) for g in groups])
    lead = f"; no group alone reproduces {what}"
    if met:
        return f"{lead}: the {names} parameters together do (together they {moves})"
    return (f"{lead}, nor does any union of fewer than all {len(groups)} groups: only all of "
            f"them together, as in the full {n} samples (in {k} samples they {moves})")


NOT_RESOLVED = "not resolved by the model"


def sign_words(lo, hi, what: str = "the sign") -> str:
    """"" when the band keeps one sign, else ``"<what> is not resolved by the model (...)"``."""
    if sign_resolved(lo, hi):
        return ""
    return f"{what} is {NOT_RESOLVED} (the 90% band crosses zero)"


def p_better(a, b, direction: str) -> float:
    """The share of samples in which ``a`` beats ``b`` (ties count half)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    ok = np.isfinite(a) & np.isfinite(b)
    if not ok.any():
        return float("nan")
    a, b = a[ok], b[ok]
    win = (a < b) if direction == "minimize" else (a > b)
    return float(np.mean(win) + 0.5 * np.mean(a == b))


def ranking_words(p: float, a: str = "A", b: str = "B") -> str:
    """"" when one side wins in at least RESOLVED_SHARE of the samples, else the words."""
    if not np.isfinite(p) or pick_resolved(p) or pick_resolved(1.0 - p):
        return ""
    return (f"which of {a} and {b} is better is {NOT_RESOLVED}: {a} is better in "
            f"{share_text(p)} of the samples (P({a} better) = {p:.2f})")


__all__ = ["BAND_SHARE", "DEFAULT_SAMPLES", "Draws", "Family", "GROUPS", "GROUP_NAMES",
           "GROUP_SAMPLES", "MAX_LOG_SD", "NOT_RESOLVED", "PERCENTILES", "RESOLVED_SHARE",
           "and_words", "band_strings", "needs", "needs_met", "together_words",
           "check_samples", "coverage", "coverage_note", "draw", "draw_groups", "draw_sets",
           "families", "frame_samples", "greedy_unions", "log_draws", "p_better", "pct",
           "pick_resolved", "ranking_words", "score_table", "share_text", "shares_words", "sig",
           "sign_resolved", "sign_words", "space_samples", "stack", "summary", "text"]
