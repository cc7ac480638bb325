"""The optuna and nested strategies: Optuna's samplers propose designs, asked and told in batches.

optuna: the sampler proposes every parameter; each trial is one design.
nested: the sampler proposes the hardware/topology/model point; every layout and batch size under
it is enumerated and scored in the same call, the point's non-dominated designs are kept, and
the trial's value is their hypervolume (against the run's fixed reference point).

The numpy model is the engine and Optuna the driver and bookkeeper: a batch of trials (a
population) is asked, scored in one vectorized call, written to a Parquet score table, then told
back with its objective values and constraint values (a trial is feasible when every value is
<= 0). A design (a nested point) already scored is never scored again: the sampler's proposal is
told its stored values at no cost and the sampler is asked for another (at most
``REPEATS_PER_TRIAL`` times per trial, then unscored designs are drawn at random; when none is
left the space is spent and the run ends). The study lives in the run folder (an Optuna journal
file) unless ``--storage`` names an RDB URL.

Resume: trials a killed process left RUNNING are told from the score table when their batch was
written (nothing is lost), else failed so the sampler asks again (nothing counted twice).
"""

from __future__ import annotations

import numpy as np

from dse.errors import InputError
from dse.search.optuna import segments
from dse.search.optuna.enqueue import LOCAL_SHARE
from dse.search.optuna.study import finished_elsewhere, with_retry

SAMPLERS = ("nsga2", "nsga3", "tpe", "random", "qmc", "gp")
# Defaults by measurement (python -m dse.search.bench, README "Speed and quality"): with 5% of
# each shipped space's designs as trials, TPE at population 2 (below) whose first max(2, trials/50)
# trials (at most 10) are random reaches >= 0.98 of the exact front's hypervolume on
# dense-70b-nodes, moe-codesign and hypothetical-accelerator, and deepseek-racks in the replay
# (python -m dse.search.replay; NSGA-II at 32, the long-run default, on disaggregated: 1.0)
# (population 16 with 10 random trials: 0.976-0.999, worst 0.93; NSGA-II at 32: 0.84 on
# dense-70b-nodes). Budgets of a few
# dozen trials (the quickstart's 24) stay short of it whatever the sampler. A multi-objective TPE
# trial costs ~0.1-1 s at 10^3 trials and grows with the study, so runs of more than
# TPE_MAX_TRIALS trials (overnight runs) keep NSGA-II, whose trials stay cheap.
# Short runs (at most SHORT_RUN_TRIALS trials, sampler and population not given): SHORT_RUN_START
# designs (random; pairs-covering since 2026-12-04, below), then one trial at a time the proposal of
# an additive surrogate of every objective and constraint fitted to what the run scored
# (dse/search/optuna/surrogate.py: the untried grid point within 4 steps of the front of the largest
# optimistic hypervolume gain times its probability of being admissible). Measured with the replay
# (README "Speed and quality"), 2026-12-03: quickstart at 24 trials 0.939 mean over 60 seeds (p10
# 0.84, worst 0.55) where the grid-neighbour local search it replaced reached 0.888 (worst 0.62) and
# TPE ~0.70; at 32 trials, 20 seeds, surrogate vs neighbours: hypothetical-accelerator 0.942 vs
# 0.886, moe-codesign 0.968 vs 0.850, dense-70b-nodes 0.859 vs 0.793, deepseek-racks 0.567 vs 0.362,
# disaggregated 0.887 vs 0.906. A run whose manifest predates it (no ``local_model``) resumes with
# the neighbour search it started with. SHORT_RUN_TRIALS 96 (was 32): the surrogate beats TPE at its
# defaults at 48, 64 and 96 trials on hypothetical-accelerator, moe-codesign and dense-70b-nodes (10
# seeds each); at 112 (moe-codesign's 5%) they tie, so longer runs keep TPE.
# SHORT_RUN_START 8 (was 4), measured 2026-12-02 over 20 seeds each with the neighbour search.
# 2026-12-04: the feasibility column a memory margin (``fit_margin``) and the start pairs-covering
# (``surrogate.start_designs``, manifest ``local_start = "pairs"``; a run without the key keeps its
# random start on resume): quickstart at 24 trials over 100 seeds 0.9871 / 0.571 (random start) ->
# 0.9938 / 0.968 (99 seeds >= 0.98); at 32 trials over 40 seeds, random start in brackets:
# moe-codesign 0.955 (0.950), hypothetical-accelerator 0.969 (0.969), dense-70b-nodes 0.881 (0.883),
# disaggregated 0.903 (0.918), deepseek-racks (20 seeds) 0.634 (0.580); 6, 10 or 12 start designs no
# better (quickstart 0.984, 0.993, 0.979). Then a categorical parameter's values also through their
# hardware specs (``surrogate.value_features``): quickstart 0.9937 / 0.983 over 100 seeds (all >=
# 0.98); dense-70b-nodes (the other space with a chip parameter) 0.867 (0.881) at 32 trials over 40
# seeds, 0.979 / 0.949 (0.977 / 0.959) at 64 and 0.991 / 0.983 (0.990 / 0.970) at 96 over 10.
SHORT_RUN_TRIALS = 96
SHORT_RUN_START = 8
SHORT_RUN = {"sampler": "random", "population": 1, "local_share": 1.0,
             "local_after": SHORT_RUN_START, "local_model": "additive", "local_start": "pairs"}
# Polish: a default optuna run given a trial count (no --sampler) spends its last POLISH_SHARE
# of the trials on a grid-neighbour local search of the current front (its keys, from trial
# ``local_after`` on), two-step neighbours after one-step ones; a budget run without a trial
# count has no last share and is not polished. Measured with the replay (README "Speed and
# quality", 5 seeds): deepseek-racks' worst seed 0.9656 -> 0.9997 (the cheapest design sits two
# steps from the found front), moe-codesign 0.9776 -> 0.9802 (worst 0.9624 -> 0.9682),
# dense-70b-nodes and hypothetical-accelerator unchanged within 0.001; 20% gains nothing more.
POLISH_SHARE = 0.1


def polish(total: int, share: float | None = None) -> dict:
    """The manifest keys of a polished run of ``total`` trials: the sampler's for the first
    ``total - round(share * total)``, then grid neighbours of the front (the short runs' search)."""
    share = POLISH_SHARE if share is None else share
    k = int(round(share * total))
    if k <= 0:
        return {}
    return {"polish_share": share, "local_share": 1.0, "local_after": int(total - k),
            "local_adjacent": True, "local_margin": 1.0, "local_diagonal": True}

DEFAULT_SAMPLER = {"optuna": "tpe", "nested": "tpe"}
# optuna at population 2 (was 4), measured 2026-12-03 with the replay over 20 seeds (mean /
# worst; 5% of the designs, polish 10%): moe-codesign 0.9888 / 0.9795 (population 4: 0.9832 /
# 0.9615; 1: 0.9885 / 0.9801 over 10 seeds but hypothetical-accelerator's worst 0.9793; 3:
# 0.9679 worst), hypothetical-accelerator 0.9902 / 0.9846 (0.9904 / 0.9838), dense-70b-nodes
# 0.9974 / 0.9933 (0.9974 / 0.9907), deepseek-racks 0.9999 / 0.9998 over 5 (0.9998); TPE's
# n_ei_candidates 64 or 128, prior_weight 0.5 and 5-10 random trials gained nothing on both
DEFAULT_POPULATION = {"optuna": 2, "nested": 4}
TPE_MAX_TRIALS = 2_000
LONG_RUN = ("nsga2", 32)      # optuna runs of more than TPE_MAX_TRIALS trials
# share of each batch spent on untried grid neighbours of the front (local search)
DEFAULT_LOCAL_SHARE = {"optuna": 0.0, "nested": LOCAL_SHARE}
BIG = 1e30
SEGMENT_TRIALS = 10_000   # a study's history is capped: then a new one, warm-started from the front
REPEATS_PER_TRIAL = 4     # proposals of scored designs told back per trial before drawing unscored
INNER_PREFIXES = ("layout.", "workload.concurrency")


def tpe_startup(trials: int | None, nested: bool = False) -> int:
    """TPE's random trials before it models: 2% of the run's trials, at least 2, at most 10
    (measured: a short run spends its few trials better modelled); nested runs ask few, costly
    trials: 5."""
    if nested:
        return 5
    return 10 if trials is None else int(min(10, max(2, trials // 50)))


def make_sampler(name: str, seed: int, population: int, nested: bool = False,
                 trials: int | None = None):
    """An Optuna sampler for a run of ``trials`` trials (TPE's random start scales with it);
    Optuna's warnings that a sampler is experimental are not shown."""
    import warnings

    import optuna
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return _sampler(optuna.samplers, name, seed, population, nested, trials)


def _sampler(s, name: str, seed: int, population: int, nested: bool, trials: int | None):
    if name == "nsga2":
        return s.NSGAIISampler(population_size=population, seed=seed)
    if name == "nsga3":
        return s.NSGAIIISampler(population_size=population, seed=seed)
    if name == "tpe":
        return s.TPESampler(seed=seed, multivariate=True, constant_liar=True,
                            n_startup_trials=tpe_startup(trials, nested))
    if name == "random":
        return s.RandomSampler(seed=seed)
    if name == "qmc":
        return s.QMCSampler(seed=seed, warn_independent_sampling=False)
    if name == "gp":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise InputError("--sampler gp needs PyTorch", hint="pip install torch, or use nsga2") from None
        return s.GPSampler(seed=seed)
    raise InputError(f"unknown sampler {name!r}", hint="one of " + ", ".join(SAMPLERS))


def split_parameters(space, nested: bool):
    """(outer, inner) parameter positions: nested enumerates layouts and batch sizes under each
    proposed hardware/topology/model point; flat lets the sampler propose everything."""
    idx = range(len(space.parameters))
    if not nested:
        return list(idx), []
    inner = [i for i in idx if space.parameters[i].path.startswith(INNER_PREFIXES)]
    return [i for i in idx if i not in inner], inner


MEMORY_BITS = 8 | 16      # perf.serve reasons: the weights, or the requested batch's KV, do not fit
FIT_EDGE = 1e-3           # the margin of a design that does not fit although its fraction is <= 1


def fit_margin(s: dict) -> np.ndarray:
    """The first constraint column: the log of HBM needed over HBM available
    (``hbm_used_fraction``), <= 0 exactly where the design is feasible (clamped at the edge, where
    the scorer's block rounding and the batch's activations decide), > 0 by how far the memory
    does not fit; ``BIG`` where the design is infeasible for another reason (a layout the model
    cannot take, a runtime cap). A margin rather than a 0/1 label: the short runs' surrogate
    learns where the memory wall is from every design it scored (quickstart at 24 trials with a
    random start: 0.949 over 60 seeds -> 0.987 over 100 of the exact front), and Optuna's
    samplers rank infeasible trials by how far they miss. A disaggregated design's fraction is
    its decode pool's: a prefill pool that does not fit reads at the edge (``FIT_EDGE``)."""
    bits = np.asarray(s["reason"]).astype(np.int64)
    used = s.get("hbm_used_fraction")
    if used is None:
        return np.where(bits == 0, 0.0, BIG)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.log(np.asarray(used, np.float64))
    v = np.where(bits == 0, np.minimum(np.nan_to_num(v, nan=0.0, neginf=-BIG, posinf=0.0), 0.0),
                 np.maximum(np.nan_to_num(v, nan=BIG, neginf=FIT_EDGE, posinf=BIG), FIT_EDGE))
    return np.where((bits & ~MEMORY_BITS) != 0, BIG, v)



def violations(s: dict, space) -> np.ndarray:
    """Constraint values per row (<= 0 feasible): the memory margin (``fit_margin``), then each
    bound as its relative excess."""
    cols = [fit_margin(s)]
    for c in space.constraints:
        v = np.asarray(s[c.metric], dtype=np.float64)
        v = np.where(np.isfinite(v), v, BIG)
        if c.max is not None:
            cols.append((v - c.max) / max(abs(c.max), 1e-30))
        if c.min is not None:
            cols.append((c.min - v) / max(abs(c.min), 1e-30))
    return np.column_stack(cols)


def constraint_names(space, nested: bool) -> list[str]:
    if nested:
        return ["has_admissible_design"]
    names = ["feasible (log HBM need / capacity)"]
    for c in space.constraints:
        if c.max is not None:
            names.append(f"{c.metric}<={c.max}")
        if c.min is not None:
            names.append(f"{c.metric}>={c.min}")
    return names


# --- score tables of batches ------------------------------------------------------------------

def segment_name(manifest: dict, segment: int) -> str:
    return manifest["study_name"] if segment == 0 else f"{manifest['study_name']}-s{segment}"


def admit(trials, ask, segs, segment, total, storage):
    """The asked trials within the run's total; any beyond it (workers asking at the same
    moment) are pruned unscored, so a shared run completes exactly ``total`` trials. Trials are
    ranked by the moment they started running (then segment and number) among every running
    and completed trial of every segment: a trial admitted once stays admitted (those before
    it can only leave, by failing), so the admitted never exceed the total. The segments are
    found again first: a worker that rotated since this one last looked may already run
    trials in a segment this one has not seen (uncounted, they let both admit past the total)."""
    from optuna.trial import TrialState
    with_retry(segs.refresh)
    counts = with_retry(segments.state_counts, storage, segs.ids)
    if sum(c["COMPLETE"] + c["RUNNING"] for c in counts.values()) <= total:
        return trials
    order = []
    for k in sorted(segs.ids):
        st = with_retry(segs.study, k)
        order += [(t.datetime_start, k, t.number) for t in with_retry(
            st.get_trials, deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
            if t.datetime_start is not None]
    rank = {(k, n): i for i, (_, k, n) in enumerate(sorted(order))}
    keep = []
    for t in trials:
        if rank.get((segment, t.number), total) < total:
            keep.append(t)
        else:
            try:
                with_retry(ask.tell, t, state=TrialState.PRUNED)
            except Exception as e:
                if not finished_elsewhere(e):
                    raise
    return keep
