"""The candidate layouts of training cases: every (tp, pp, dp, ep, cp, vp, micro-batch,
recompute) that agrees with what a case gives, and the checks of a layout written out.

A blank is filled from the valid values: tp a divisor of the chips that divides the heads and
stays inside the scale-up domain; pp at most the layers; cp dividing the sequence into whole
halves per rank (load-balanced causal split); dp what is left; ep a divisor of ``tp cp dp``
that divides the experts (1 for a dense model); micro-batches of 1 to 8 sequences that divide
the data-parallel share of the batch; every recompute policy (full also on a quarter, half or
three quarters of the layers); vp 1, or 2 to 8 virtual stages
when the schedule is interleaved (``virtual_stages``: whole chunks of layers first); ZeRO
stage 1. A layout the case gives is taken as given: one that breaks a rule
(dse.perf.train_layout) is scored infeasible, its reason naming the rule.
"""

from __future__ import annotations

import itertools
from functools import lru_cache

import numpy as np
import pandas as pd

from dse.errors import InputError
from dse.perf.train_layout import a2a_splits
from dse.scoring.train_cases import where

COLUMNS = ("tp", "pp", "dp", "ep", "cp", "vp", "micro_batch_seqs", "recompute",
           "recompute_layer_fraction", "zero_stage", "schedule", "sequence_parallel")
# a blank recompute: none, selective, or full on a share of the layers (Megatron's block method)
RECOMPUTE_CHOICES = ((0, 1.0), (1, 1.0), (2, 0.25), (2, 0.5), (2, 0.75), (2, 1.0))
MICRO_BATCHES = (1, 2, 4, 8)
VIRTUAL = (2, 3, 4, 5, 6, 8)


@lru_cache(maxsize=256)
def divisors(n: int) -> tuple[int, ...]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return tuple(sorted({*small, *(n // d for d in small)}))


def virtual_stages(layers: int, pp: int) -> tuple[int, ...]:
    """The vp a blank picks from: those that split the layers into whole chunks (Megatron's
    even split, ``layers % (pp x vp) == 0``), else those that leave every chunk a layer
    (``pp x vp <= layers``: an uneven split, train_layout), else 2 (flagged invalid)."""
    even = tuple(v for v in VIRTUAL if layers % (pp * v) == 0)
    return even or tuple(v for v in VIRTUAL if pp * v <= layers) or (2,)


def options(given, values) -> tuple:
    return (int(given),) if np.isfinite(given) else tuple(values)


def ulysses_splits(r: dict, tp: float, cp: float) -> bool:
    """Whether a case's a2a context parallelism (``training.cp_comm_type``) can split the heads
    at ``tp`` x ``cp`` (``train_layout.a2a_splits``); any other exchange always can."""
    if r.get("cp_comm_type", 0) != 1 or cp <= 1:
        return True
    return bool(a2a_splits(r["heads"], r["kv_heads"], r.get("kv_lora_rank", 0), tp, cp))


def case_layouts(i: int, p: dict, r: dict) -> list[tuple]:
    """Every candidate layout row of case ``i`` (``COLUMNS`` order)."""
    n = int(p["num_chips"][i])
    g = {k: p[k][i] for k in ("tp", "pp", "dp", "ep", "cp", "vp", "micro_batch_seqs")}
    # a blank the given degrees fix takes that value
    for k in ("tp", "pp", "dp", "cp"):
        others = [g[o] for o in ("tp", "pp", "dp", "cp") if o != k]
        if not np.isfinite(g[k]) and all(np.isfinite(o) for o in others):
            g[k] = n / np.prod(others)
    heads, layers, experts = r["heads"], r["num_layers"], r["experts"]
    seq = p["seq_len"][i]
    gbs = p["global_batch_seqs"][i]
    sched_given = int(p["pipeline_schedule"][i])
    rc = ((int(p["recompute"][i]), 1.0),) if p["recompute"][i] >= 0 else RECOMPUTE_CHOICES
    zero = int(p["zero_stage"][i]) if p["zero_stage"][i] >= 0 else 1
    out = []
    tps = [t for t in divisors(n) if heads % t == 0 and t <= r["domain_chips"]]
    for tp in options(g["tp"], tps):
        for pp in options(g["pp"], [q for q in divisors(n // tp if n % tp == 0 else 1)
                                    if q <= layers]):
            rest = n / (tp * pp)
            cps = [c for c in divisors(int(rest)) if rest % 1 == 0 and seq % (2 * c) == 0
                   and ulysses_splits(r, tp, c)]
            for cp in options(g["cp"], cps or [1]):
                dp = g["dp"] if np.isfinite(g["dp"]) else n / (tp * pp * cp)
                if dp < 1 or dp % 1:
                    continue
                # a searched degree only takes splits a2a can use; a given layout that cannot
                # is a row infeasible with its reason (train_layout.bad_a2a)
                if not (np.isfinite(g["tp"]) and np.isfinite(g["cp"])) \
                        and not ulysses_splits(r, tp, cp):
                    continue
                eps = [e for e in divisors(int(tp * cp * dp)) if experts and experts % e == 0] \
                    if experts else [1]
                mbs = [m for m in MICRO_BATCHES if (gbs / dp) % m == 0] or [1]
                sched = sched_given if sched_given >= 0 else (
                    1 if np.isfinite(g["vp"]) and g["vp"] > 1 else 0)
                vps = virtual_stages(layers, pp) if sched == 1 and pp > 1 else (1,)
                sp = p["sequence_parallel"][i]
                sp = int(sp) if sp >= 0 else int(tp > 1)
                for ep, mb, vp, rec in itertools.product(
                        options(g["ep"], eps), options(g["micro_batch_seqs"], mbs),
                        options(g["vp"], vps), rc):
                    out.append((tp, pp, dp, ep, cp, vp, mb, *rec, zero, sched, sp))
    return out


def check_explicit(df: pd.DataFrame, i: int, p: dict, r: dict, file: str) -> None:
    """The degrees a case writes out must multiply to its num_chips; the message names the row
    and column."""
    n = p["num_chips"][i]
    v = {k: p[k][i] for k in ("tp", "pp", "dp", "cp")}
    deg = [v[k] for k in ("tp", "pp", "dp", "cp")]
    if all(np.isfinite(deg)) and np.prod(deg) != n:
        raise InputError(f"tp x pp x cp x dp = {int(np.prod(deg))} but num_chips = {int(n)}",
                         file=file, where=where(df, i, "num_chips"),
                         hint="make tp x pp x cp x dp equal num_chips")
    fin = [d for d in deg if np.isfinite(d)]
    if fin and n % np.prod(fin):
        raise InputError(f"the given degrees ({int(np.prod(fin))} chips) do not divide "
                         f"num_chips = {int(n)}", file=file, where=where(df, i, "num_chips"),
                         hint="num_chips = tp x pp x cp x dp")
    # the rules a layout breaks (tp and the heads, ep, vp, cp, DualPipe, whole micro-batches)
    # make that row infeasible with its reason, not the file refused (train_layout)


def candidates(df: pd.DataFrame, p: dict, resolved: list[dict], file: str) -> pd.DataFrame:
    """One row per (case, candidate layout), ``_case`` the case's index."""
    rows, case = [], []
    for i, r in enumerate(resolved):
        check_explicit(df, i, p, r, file)
        c = case_layouts(i, p, r)
        if not c:
            raise InputError(f"no valid layout uses exactly num_chips = {int(p['num_chips'][i])}"
                             " with the given degrees", file=file, where=where(df, i, "num_chips"),
                             hint="num_chips = tp x pp x cp x dp; ep divides tp x cp x dp")
        rows.extend(c)
        case.extend([i] * len(c))
    out = pd.DataFrame(rows, columns=list(COLUMNS))
    out["_case"] = case
    return out
