"""Short runs' model-based proposals: an additive surrogate of every objective and constraint.

A run of a few dozen trials cannot afford a sampler that learns from hundreds (TPE at 24
trials: 0.70 of the exact front's hypervolume on the quickstart). Serving metrics are close to
additive in log space over the grid's parameters (a cost per token is chips x price / tokens per
second; the KV cache per chip is the batch over the tensor-parallel degree), so each metric is
modelled as a Bayesian linear model of the trial's grid position:

    log |metric| = b + sum_d w_d[x_d] + noise

one weight per value of each parameter (a chip's also through its specs, ``value_features``:
a chip seen once in a bad corner is judged by what bandwidth, compute and price did for the
others; quickstart worst of 100 seeds 0.968 -> 0.983); an ordered parameter's weights (batch
sizes, TP degrees, bandwidth scales: values on a grid) have a second-difference prior, so the
model is close to a straight line in the grid position (a power law in a log-spaced grid) unless
the data bend it, and a categorical one's a ridge prior. How straight, and how large the
residual, is chosen per metric and per trial from a small grid by the model's evidence (its
marginal likelihood, as a Gaussian process's hyperparameters are fitted): few or straight data
keep the line, a knee (a batch past the memory-bound regime) bends it. Feasibility is modelled
the same way on the memory margin each scored design reports (the first constraint column: log
of HBM needed over HBM available, ``optuna_strategy.fit_margin``; a 0/1 label cannot say how far
the memory wall is: quickstart 0.77 against 0.99 on seeds 0-9), times the odds of a layout the
model can serve at all (+1/-1 labels), and each constraint on the log of its value over its
bound, from the feasible designs. The run starts from designs that cover pairs of parameter
levels (``start_designs``), so no value is judged from one corner. The next design is the
untried grid point near the current front (at most ``RADIUS`` grid steps from one of its
members; a categorical change is one step) of the largest optimistic hypervolume gain (each
objective at its mean plus ``KAPPA`` posterior standard deviations toward better, against the
current front's nadir plus its range) times the probability that it is admissible.

Constants by measurement with ``python -m dse.search.replay`` (README "Speed and quality");
a probit (logistic) feasibility model, pairwise interaction terms, Thompson sampling, a
balanced (Latin) start, radii of 3-12 and a weaker categorical prior measured worse or no better.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import norm

from dse import pareto
from dse.search.optuna.study import is_ordered

LEVEL = 3.0        # prior precision of a categorical parameter's weights (ordered: 5% of it)
EVIDENCE = True    # each metric's curvature prior and residual: the grids' of largest evidence
SMOOTH_GRID = (10.0, 100.0, 1000.0, 10000.0)   # prior precisions of an ordered one's 2nd diffs
NOISE_GRID = (0.02, 0.05, 0.1, 0.2)            # residuals, in standard deviations of the metric
SMOOTH = 1000.0    # without the evidence: the curvature prior
NOISE = 0.05       # and the residual
KAPPA = 1.0        # optimism: posterior standard deviations toward better
RADIUS = 4         # candidates: grid steps from the current front
MARGIN = 1.0       # gains against the front's nadir plus this share of its range
MAX_CANDIDATES = 20_000   # a larger outer grid: candidates drawn by random walks from the front
SPEC_LEVEL = 1.0   # prior precision of the weights of a categorical parameter's spec columns
SPEC_FIELDS = ("matmul_flops_per_s", "hbm_bw_bytes_per_s", "hbm_capacity_bytes",
               "scaleup_bw_bytes_per_s", "rental_usd_per_hour", "capex_usd", "power_w")
START_BINS = 3     # the start: an ordered parameter's levels (low, middle, high)
START_POOL = 4096  # the start: random grid points it picks from
BIG = 1e29         # told values at or above this stand for non-finite metrics


class Additive:
    """A Bayesian linear model over one-hot grid positions (one column per parameter value),
    plus, for a categorical parameter with ``features`` (``value_features``), columns of its
    values' hardware specs: the value's effect is a function of its specs (prior precision
    ``SPEC_LEVEL``) plus its own residual, so values with close specs have close effects."""

    def __init__(self, shape, ordered, features: dict | None = None):
        self.shape = tuple(int(n) for n in shape)
        self.off = np.concatenate([[0], np.cumsum(self.shape)]).astype(int)
        self.features = sorted((features or {}).items())
        k = sum(f.shape[1] for _, f in self.features)
        m = int(self.off[-1]) + 1 + k        # one-hot columns, the intercept, the spec columns
        self.icpt = int(self.off[-1])
        P, Q = np.zeros((m, m)), np.zeros((m, m))
        P[self.icpt, self.icpt] = 1e-6
        P[self.icpt + 1:, self.icpt + 1:] = SPEC_LEVEL * np.eye(k)
        for d, n in enumerate(self.shape):
            a = self.off[d]
            smooth = ordered[d] and n > 2
            P[a:a + n, a:a + n] += LEVEL * (0.05 if smooth else 1.0) * np.eye(n)
            if smooth:
                D = np.diff(np.eye(n), 2, axis=0)
                Q[a:a + n, a:a + n] += D.T @ D
        self.base, self.curv = P, Q
        self._logdets: dict[float, float] = {}

    def design(self, coords: np.ndarray) -> np.ndarray:
        coords = np.asarray(coords, np.int64).reshape(-1, len(self.shape))
        X = np.zeros((len(coords), self.base.shape[0]))
        X[:, self.icpt] = 1.0
        rows = np.arange(len(coords))
        for d in range(len(self.shape)):
            X[rows, self.off[d] + coords[:, d]] = 1.0
        j = self.icpt + 1
        for d, f in self.features:
            X[:, j:j + f.shape[1]] = f[coords[:, d]]
            j += f.shape[1]
        return X

    def _logdet_prior(self, smooth: float) -> float:
        if smooth not in self._logdets:
            self._logdets[smooth] = float(np.linalg.slogdet(self.base + smooth * self.curv)[1])
        return self._logdets[smooth]

    def evidence(self, XtX, Xtz, zz: float, n: int, smooth: float, noise: float) -> float:
        """log p(z) (up to a constant) of the linear model with curvature prior ``smooth`` and
        residual ``noise``, from the data's sufficient statistics X'X, X'z, z'z."""
        A = XtX / noise ** 2 + self.base + smooth * self.curv
        b = Xtz / noise ** 2
        return float(-0.5 * (zz / noise ** 2 - b @ np.linalg.solve(A, b) + 2 * n * np.log(noise)
                             + np.linalg.slogdet(A)[1] - self._logdet_prior(smooth)))

    def predict(self, X: np.ndarray, y: np.ndarray, Xc: np.ndarray):
        """Posterior mean and standard deviation at ``Xc`` of the model fitted to (X, y), its
        curvature prior and residual those of ``SMOOTH_GRID`` x ``NOISE_GRID`` of the largest
        evidence (``EVIDENCE``; else ``SMOOTH`` and ``NOISE``)."""
        mu0, s0 = float(y.mean()), float(y.std()) + 1e-9
        z = (y - mu0) / s0
        XtX, Xtz = X.T @ X, X.T @ z
        smooth, noise = SMOOTH, NOISE
        if EVIDENCE:
            zz = float(z @ z)
            _, smooth, noise = max((self.evidence(XtX, Xtz, zz, len(z), sm, nz), sm, nz)
                                   for sm in SMOOTH_GRID for nz in NOISE_GRID)
        A = XtX / noise ** 2 + self.base + smooth * self.curv
        L = np.linalg.cholesky(A)
        w = np.linalg.solve(A, Xtz / noise ** 2)
        V = np.linalg.solve(L, Xc.T)
        sd = np.sqrt((V ** 2).sum(axis=0) + noise ** 2)
        return mu0 + s0 * (Xc @ w), s0 * sd


def value_features(space, outer) -> dict[int, np.ndarray]:
    """Spec columns of each categorical outer parameter of at least 3 values whose values set
    hardware specs (``SPEC_FIELDS``: an accelerator id, a rack): the logs of the specs that
    differ between its values (at the space's base for the other parameters), standardized,
    rotated onto their principal axes and scaled by their share of the variance, so the prior
    covariance of two values' effects is the correlation of their spec vectors. {position in
    ``outer``: (values x components)}; parameters without such specs are left out. Cached per
    space object and outer parameters (a run asks for them once per trial)."""
    if space.task == "train":       # (the serving Batch's spec columns; training: none)
        return {}
    key = (id(space), tuple(outer))
    if key in _FEATURES and _FEATURES[key][0] is space:
        return _FEATURES[key][1]
    out = {}
    for j, i in enumerate(outer):
        p, n = space.parameters[i], int(space.shape[i])
        if is_ordered(p) or n < 3:
            continue
        coords = np.zeros((n, len(space.shape)), np.int64)
        coords[:, i] = np.arange(n)
        b = space.batch_from_values(space.values_at(np.ravel_multi_index(tuple(coords.T),
                                                                           space.shape)))[0]
        cols = []
        for k in SPEC_FIELDS:
            v = np.broadcast_to(np.asarray(b.columns.get(k, [np.nan]), np.float64), (n,))
            if np.isfinite(v).all() and (v > 0).all() and np.ptp(np.log(v)) > 1e-9:
                cols.append(np.log(v))
        if not cols:
            continue
        F = np.column_stack(cols)
        F = (F - F.mean(axis=0)) / F.std(axis=0)
        U, sv, _ = np.linalg.svd(F, full_matrices=False)
        keep = sv > 1e-6 * sv[0]
        out[j] = U[:, keep] * sv[keep] / np.sqrt(F.shape[1])
    if len(_FEATURES) > 64:
        _FEATURES.clear()
    _FEATURES[key] = (space, out)        # the space held: its id is not reused meanwhile
    return out


_FEATURES: dict = {}


def constraint_bounds(space) -> list[tuple[str, float]]:
    """(kind, bound) of each constraint column after the feasibility one, in the order
    ``optuna_strategy.violations`` writes them."""
    out = []
    for c in space.constraints:
        if c.max is not None:
            out.append(("max", float(c.max)))
        if c.min is not None:
            out.append(("min", float(c.min)))
    return out


def _constraint_target(c: np.ndarray, kind: str, bound: float) -> np.ndarray:
    """A constraint's violation (<= 0 admissible) as a log ratio to its bound where the bound is
    positive (violations are relative: (v - max) / |max|, (min - v) / |min|), else as given."""
    if bound <= 0:
        return c
    if kind == "max":
        return np.log(np.maximum(1.0 + c, 1e-12))
    return -np.log(np.maximum(1.0 - c, 1e-12))


def _levels(shape, ordered) -> np.ndarray:
    """Levels per parameter for the start's pairs: an ordered parameter of more than
    ``START_BINS`` values in that many bins of its grid (low, middle, high), others by value."""
    return np.array([START_BINS if o and n > START_BINS else n for n, o in zip(shape, ordered)])


def start_designs(shape, ordered, n: int, seed: int) -> list[tuple]:
    """``n`` distinct grid points (coordinate tuples) that cover as many pairs of two parameters'
    levels as they can: the greedy covering of AETG (Cohen et al., IEEE TSE 23(7), 1997), each
    pick the point of a random pool that covers the most pairs not yet covered (then the most
    single levels; ties at random). Every chip meets the low, middle and high batch sizes and
    both precisions at least once where ``n`` allows, so a value seen once in a bad corner is not
    written off (quickstart at 24 trials, 100 seeds, against a random start: 0.9871 / 0.571 ->
    0.9938 / 0.968 of the exact front; at 32 trials deepseek-racks 0.580 -> 0.634,
    disaggregated 0.918 -> 0.903, the others within 0.005). Deterministic in ``seed``."""
    shape = tuple(int(v) for v in shape)
    size = int(np.prod(shape))
    n = min(int(n), size)
    rng = np.random.default_rng(seed)
    flat = (rng.permutation(size)[:START_POOL] if size <= 4 * START_POOL
            else np.unique(rng.integers(0, size, START_POOL)))
    flat = rng.permutation(flat)
    coords = np.array(np.unravel_index(flat, shape)).T
    lv_n = _levels(shape, ordered)
    sh = np.asarray(shape)
    lv = np.minimum(coords * lv_n // sh, lv_n - 1)             # each coordinate's level
    pairs = [(a, b) for a in range(len(shape)) for b in range(a + 1, len(shape))]
    codes = [lv[:, a] * lv_n[b] + lv[:, b] for a, b in pairs]
    seen_pair = [np.zeros(lv_n[a] * lv_n[b], bool) for a, b in pairs]
    seen_one = [np.zeros(m, bool) for m in lv_n]
    taken = np.zeros(len(flat), bool)
    out = []
    for _ in range(min(n, len(flat))):
        gain = np.zeros(len(flat))
        for code, seen in zip(codes, seen_pair):
            gain += ~seen[code]
        for d, seen in enumerate(seen_one):
            gain += 1e-3 * ~seen[lv[:, d]]
        gain[taken] = -np.inf
        j = int(np.argmax(gain))                               # the pool is shuffled: ties at random
        taken[j] = True
        out.append(tuple(int(c) for c in coords[j]))
        for code, seen in zip(codes, seen_pair):
            seen[code[j]] = True
        for d, seen in enumerate(seen_one):
            seen[lv[j, d]] = True
    return out


def start_points(space, outer, n: int, seed: int) -> list[tuple]:
    """``start_designs`` on a space's outer grid (what a short run and its replay enqueue)."""
    return start_designs(tuple(space.shape[i] for i in outer),
                         [is_ordered(space.parameters[i]) for i in outer], n, seed)


def candidates(shape, ordered, known: np.ndarray, front: np.ndarray, rng) -> np.ndarray:
    """Untried grid points (coordinates) at most ``RADIUS`` steps from a front member: all of
    them in a grid of at most ``MAX_CANDIDATES`` points, else random walks from the front."""
    n = int(np.prod(shape))
    cat = ~np.asarray(ordered, bool)
    if n <= MAX_CANDIDATES:
        free = np.setdiff1d(np.arange(n), known)
        coords = np.array(np.unravel_index(free, shape)).T
        if len(front) and len(coords):
            dist = np.abs(coords[:, None, :] - front[None, :, :])
            dist[:, :, cat] = np.minimum(dist[:, :, cat], 1)
            near = dist.sum(axis=2).min(axis=1) <= RADIUS
            if near.any():
                coords = coords[near]
        return coords
    start = front if len(front) else np.array(np.unravel_index(
        rng.integers(0, n, MAX_CANDIDATES), shape)).T
    walk = start[rng.integers(0, len(start), MAX_CANDIDATES)].copy()
    steps = rng.integers(1, RADIUS + 1, MAX_CANDIDATES)
    sh = np.asarray(shape)
    for s in range(RADIUS):
        move = steps > s
        d = rng.integers(0, len(shape), MAX_CANDIDATES)
        delta = np.where(cat[d], rng.integers(1, np.maximum(sh[d], 2)), rng.choice([-1, 1], MAX_CANDIDATES))
        new = np.where(cat[d], (walk[np.arange(MAX_CANDIDATES), d] + delta) % sh[d],
                       np.clip(walk[np.arange(MAX_CANDIDATES), d] + delta, 0, sh[d] - 1))
        walk[np.arange(MAX_CANDIDATES)[move], d[move]] = new[move]
    flat = np.unique(np.ravel_multi_index(tuple(walk.T), shape))
    flat = np.setdiff1d(flat, known)
    return np.array(np.unravel_index(flat, shape)).T


def propose(space, outer, keys, values, cons, k: int = 1, seed: int = 0) -> list[tuple]:
    """Up to ``k`` untried outer grid points (coordinate tuples) for a short run's next trials.

    ``keys``: the scored designs as flat indices of the outer grid; ``values``: their told
    objective values (in each objective's own direction, as told to Optuna; non-finite ones at
    +-BIG); ``cons``: their constraint values (<= 0 satisfied; the first column is
    feasibility). Several points at once are the best ``k`` of one model."""
    shape = tuple(space.shape[i] for i in outer)
    ordered = [is_ordered(space.parameters[i]) for i in outer]
    keys = np.asarray(keys, np.int64)
    if k <= 0 or not outer or not len(keys):
        return []
    values = np.asarray(values, np.float64).reshape(len(keys), -1)
    cons = np.asarray(cons, np.float64).reshape(len(keys), -1)
    rng = np.random.default_rng(seed)
    direction = np.array([1.0 if ob.direction == "minimize" else -1.0 for ob in space.objectives])
    coords = np.array(np.unravel_index(keys, shape)).T
    finite = (np.abs(values) < BIG).all(axis=1)
    feasible = cons[:, 0] <= 0
    ok = feasible & finite & (cons <= 0).all(axis=1)
    Fm = values * direction                                  # minimisation form
    front = np.zeros((0, len(shape)), np.int64)
    if ok.any():
        front = coords[ok][pareto.nondominated(Fm[ok])]
    cand = candidates(shape, ordered, keys, front, rng)
    if not len(cand):
        return []
    model = Additive(shape, ordered, value_features(space, outer))
    Xc = model.design(cand)
    logp = np.zeros(len(cand))
    # feasibility: the memory margin (log HBM need over capacity, the first constraint column)
    # regressed on every design whose margin is known, times the odds of a layout that can be
    # served at all (designs infeasible for another reason carry BIG)
    sized = np.abs(cons[:, 0]) < BIG
    if sized.any() and not sized.all():
        mu, sd = model.predict(model.design(coords), np.where(sized, 1.0, -1.0), Xc)
        logp += norm.logcdf(mu / sd)
    if sized.sum() >= 2 and feasible[sized].any() and not feasible[sized].all():
        mu, sd = model.predict(model.design(coords[sized]), cons[sized, 0], Xc)
        logp += norm.logcdf(-mu / sd)
    fit = feasible & finite
    if not fit.any():            # nothing feasible yet: the likeliest to fit (none: at random)
        order = np.argsort(-(logp + rng.random(len(cand)) * 1e-9))
        return [tuple(int(c) for c in cand[j]) for j in order[:k]]
    X = model.design(coords[fit])
    for j, (kind, bound) in enumerate(constraint_bounds(space), start=1):
        c = cons[fit, j]
        good = np.abs(c) < BIG
        if good.sum() >= 2:
            mu, sd = model.predict(X[good], _constraint_target(c[good], kind, bound), Xc)
            logp += norm.logcdf(-mu / sd)
    opt = np.zeros((len(cand), len(direction)))
    spread = np.zeros(len(cand))
    for j in range(len(direction)):
        v = values[fit, j]
        sign = np.sign(v[0]) if (v != 0).all() and (np.sign(v) == np.sign(v[0])).all() else 0.0
        y = np.log(np.abs(v)) if sign else v
        mu, sd = model.predict(X, y, Xc)
        spread += np.log(sd)
        if sign:                 # the metric is sign * exp(y); better is smaller direction * metric
            better = -1.0 if direction[j] * sign > 0 else 1.0
            opt[:, j] = direction[j] * sign * np.exp(mu + better * KAPPA * sd)
        else:
            opt[:, j] = direction[j] * (mu - direction[j] * KAPPA * sd)
    if ok.any():
        F = Fm[ok][pareto.nondominated(Fm[ok])]
        ref, scale = pareto.reference(F, MARGIN)
        h0 = pareto.hypervolume(F, ref, scale)
        gain = np.zeros(len(cand))
        # a point some front member weakly dominates, or outside the reference box, adds nothing
        open_ = (opt < ref).all(axis=1) & ~(F[None, :, :] <= opt[:, None, :]).all(axis=2).any(axis=1)
        for j in np.flatnonzero(open_):
            gain[j] = pareto.hypervolume(np.vstack([F, opt[j]]), ref, scale) - h0
    else:
        gain = np.ones(len(cand))
    acq = np.log(np.maximum(gain, 1e-300)) + logp
    if gain.max() <= 0:          # no gain anywhere: the likeliest admissible, the least known
        acq = logp + spread
    order = np.lexsort((rng.random(len(cand)), -acq))
    return [tuple(int(c) for c in cand[j]) for j in order[:k]]
