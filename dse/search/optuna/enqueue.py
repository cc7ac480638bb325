"""Trials enqueued into a study, besides what its sampler proposes: warm starts from a front,
the nested strategy's local search next to the front, work re-queued after ``dse repair``, and
unscored designs when the sampler only proposes designs already scored."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse import pareto
from dse.search.optuna.study import coords_of, is_ordered, params_of


def enqueue_designs(study, ids, space, outer) -> int:
    """Enqueue the designs ``ids`` (flat grid indices of ``space``) as the study's next trials:
    their points on the sampled (``outer``) parameters, each distinct point once. Returns how
    many trials were enqueued."""
    coords = np.unravel_index(np.asarray(ids, dtype=np.int64), space.shape)
    points = list(dict.fromkeys(zip(*[coords[i].tolist() for i in outer])))
    for row in points:
        study.enqueue_trial(params_of(space, row, outer))
    return len(points)


LOCAL_SHARE = 2 / 3   # nested: share of trials spent next to the front's points (the rest: sampler)


def _tried(study, space, outer) -> set:
    seen = set()
    for t in study.get_trials(deepcopy=False):    # tried, running, or enqueued (fixed params)
        c = coords_of(space, t.params or t.system_attrs.get("fixed_params") or {}, outer)
        if c is not None:
            seen.add(tuple(c))
    return seen


def enqueue_neighbours(study, space, outer, front: pd.DataFrame, k: int, ref: dict | None,
                       seed: int = 0, known=(), adjacent: bool = False,
                       margin: float | None = None, diagonal: bool = False) -> int:
    """Enqueue up to ``k`` untried outer points next to the front's (one grid step along one
    ordered parameter, or another value of a categorical one; ``adjacent``: the next or previous
    value in the space file's list, as for an ordered one), neighbours of the points that add
    the most hypervolume to the front first. ``known``: points scored already. ``margin``: the
    contributions are taken against the current front's nadir plus ``margin`` times its range
    (not the run's reference ``ref``, set from its first front), so that the ends of the front
    are extended too. ``diagonal``: after a point's one-step neighbours, its two-step ones (one
    grid step along each of two parameters), which reach a front design whose one-step
    neighbours are all dominated or inadmissible."""
    if k <= 0 or not outer or not len(front):
        return 0
    coords = np.array(np.unravel_index(front["design_id"].to_numpy(np.int64), space.shape)).T
    coords = coords[:, outer]
    points, owner = np.unique(coords, axis=0, return_inverse=True)
    owner = owner.reshape(-1)
    gain = np.zeros(len(points))
    if (ref is not None or margin is not None) and len(points) > 1:
        F = pareto.objective_matrix(front, space.objectives)
        r, sc = pareto.reference(F, margin) if margin is not None else (
            np.array(ref["point"]), np.array(ref["scale"]))
        total = pareto.hypervolume(F, r, sc)
        gain = np.array([total - pareto.hypervolume(F[owner != j], r, sc)
                         for j in range(len(points))])
    seen = _tried(study, space, outer) | set(known)
    rng = np.random.default_rng(seed)
    cand = {}
    for j in np.lexsort((rng.random(len(points)), -gain)):    # biggest contribution first
        point = tuple(int(c) for c in points[j])
        moves = []
        for d, i in enumerate(outer):
            p = space.parameters[i]
            steps = (-1, 1) if adjacent or is_ordered(p) else range(-len(p.values) + 1, len(p.values))
            moves += [point[:d] + (point[d] + s,) + point[d + 1:] for s in steps
                      if s and 0 <= point[d] + s < len(p.values)]
        for q in rng.permutation(len(moves)):
            if moves[q] not in seen:
                cand.setdefault(moves[q], None)
        if diagonal:
            two = [point[:a] + (point[a] + sa,) + point[a + 1:b] + (point[b] + sb,) + point[b + 1:]
                   for a in range(len(outer)) for b in range(a + 1, len(outer))
                   for sa in (-1, 1) for sb in (-1, 1)
                   if 0 <= point[a] + sa < len(space.parameters[outer[a]].values)
                   and 0 <= point[b] + sb < len(space.parameters[outer[b]].values)]
            for q in rng.permutation(len(two)):
                if two[q] not in seen:
                    cand.setdefault(two[q], None)
        if len(cand) >= k:
            break
    for q in list(cand)[:k]:
        study.enqueue_trial(params_of(space, q, outer))
    return min(k, len(cand))


def unscored_points(shape_outer: tuple, known: set, k: int, rng) -> list[tuple]:
    """Up to ``k`` random points of the outer grid that are not in ``known`` (flat keys), for
    when the sampler keeps proposing points already scored. Empty when every point is known."""
    n = int(np.prod(shape_outer)) if shape_outer else 1
    if len(known) >= n:
        return []
    if n <= 2_000_000:
        free = np.setdiff1d(np.arange(n, dtype=np.int64), np.fromiter(known, np.int64, len(known)))
        pick = rng.permutation(free)[:k]
    else:                                    # a huge grid, sparsely scored: draw and reject
        draw = rng.integers(0, n, size=4 * k)
        pick = [int(x) for x in dict.fromkeys(draw.tolist()) if int(x) not in known][:k]
    return [tuple(int(c) for c in np.unravel_index(int(x), shape_outer)) for x in pick] \
        if shape_outer else [()]


def requeue_lost(study, segment, told, front, space, outer, population, known_keys,
                 key_of) -> None:
    """A local run's study after ``dse repair``: trials the journal holds as complete whose
    score table was quarantined (their design is not among those scored) are enqueued again
    (once); a fresh segment (its journal quarantined) is warm-started from the front."""
    from optuna.trial import TrialState
    trials = study.get_trials(deepcopy=False)
    again = {t.user_attrs.get("requeue_of") for t in trials}
    for t in trials:
        if t.state == TrialState.COMPLETE and (segment, t.number) not in told and \
                t.number not in again and t.params and key_of(t.params) not in known_keys:
            study.enqueue_trial(t.params, user_attrs={"requeue_of": t.number})
    if segment > 0 and not trials and len(front):
        enqueue_designs(study, front["design_id"].to_numpy()[: 2 * population], space, outer)
