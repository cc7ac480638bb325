"""Uncertainty bands of training designs: the training model re-scored under samples of its
fitted parameters, as ``dse.scoring.bands`` does for serving.

Two kinds of parameters are sampled, each as multiplicative factors on its catalog value:

- the training fit's (``[training]`` of dse/catalog/training.toml: ``compute_fraction_scale``,
  ``overlap_fraction``, ``layer_overhead_s``), from the covariance of their logs that
  ``python -m dse.calibration.train_fit --write`` stores beside them (``uncertainty``: the
  Jacobian of the training truths' log errors); a draw is clipped to the fit's bounds
  (``train_fit.FITTED``: an overlap above 1 is not a share), so a parameter the fit left at a
  bound (``overlap_fraction = 1``) moves to one side only;
- the kernel fits' the training model reuses (GEMM, MoE grouped GEMM, attention, collectives of
  the chip's ``KERNEL_RUNTIME`` tables: ``dse.scoring.bands.families``), drawn with the same
  seeds as serving's, so a serving and a training answer on one chip share their kernel draws.

Every design on one chip and every call sees the same draw of that chip (seeded by the family),
so two designs are compared under the same parameters. What is not covered: model-form error,
the training priors (reserve, fragmentation, attention backward ratio), and the correlation of
the training fit with the kernel fits (the training fit is conditional on the kernels' fitted
values: sampling both counts the GEMM fraction's uncertainty twice on the chips the training
truths cover; on the others it is the only uncertainty the kernels carry).

    draw(n, seed, groups=None) -> TrainDraws          n samples (a subset of GROUPS varied)
    draw_groups(k, seed) -> (groups, TrainDraws)      k samples per group alone, group-major
    draw_sets(k, seed, sets) -> (sets, TrainDraws)    k samples per union of groups, set-major
    score(space, vals, draws, k, overrides, metrics)  sample k's metrics of the designs
    space_samples(space, vals, draws, ...)            every sample's: {metric: (n, designs)}
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from dse.catalog import training as tcat
from dse.scoring import bands as B
from dse.scoring import train_space

TRAIN = "train"
GROUPS = (TRAIN, "gemm", "moe", "attention", "comm")
GROUP_NAMES = {TRAIN: "training fit (compute fraction, overlap, per-layer time)",
               **{g: B.GROUP_NAMES[g] for g in GROUPS[1:]}}
# the bounds a drawn training parameter is clipped to (dse.calibration.train_fit.FITTED)
BOUNDS = {"compute_fraction_scale": (0.3, 1.5), "overlap_fraction": (0.0, 1.0),
          "layer_overhead_s": (0.0, 5e-3)}


def fit_uncertainty() -> dict:
    """The training fit's ``uncertainty`` table (params, log_sd, log_corr, rule); an empty one
    (nothing sampled) where the catalog has none."""
    u = tcat.train_parameters().get("uncertainty") or {}
    return {"params": list(u.get("params", [])), "log_sd": list(u.get("log_sd", [])),
            "log_corr": u.get("log_corr"), "rule": str(u.get("rule", ""))}


def _train_root(u: dict) -> np.ndarray:
    sd = np.asarray(u["log_sd"], float)
    corr = np.asarray(u["log_corr"] if u["log_corr"] is not None else np.eye(len(sd)), float)
    cov = np.outer(sd, sd) * corr
    w, v = np.linalg.eigh(0.5 * (cov + cov.T))
    return v * np.sqrt(np.clip(w, 0.0, None))


def kernel_families() -> tuple:
    """The kernel fits' uncertainty families of the runtime training reuses, every chip."""
    return tuple(f for f in B.families() if len(f.entry) == 2
                 and f.entry[1] == tcat.KERNEL_RUNTIME)


@dataclass(frozen=True)
class TrainDraws:
    """``n`` samples: ``train`` (n x training parameters, factors) and, per chip (the serving
    catalog's base part), {catalog kernel key: n factors} (``kernel``)."""

    n: int
    seed: int
    params: tuple
    train: np.ndarray
    kernel: dict = field(repr=False)
    note: str = ""

    def only(self, k: int) -> TrainDraws:
        return TrainDraws(1, self.seed, self.params, self.train[k:k + 1],
                          {c: {p: f[k:k + 1] for p, f in v.items()} for c, v in
                           self.kernel.items()}, self.note)


def _train_log(u: dict, n: int, seed: int) -> np.ndarray:
    if not u["params"]:
        return np.zeros((n, 0))
    rng = np.random.default_rng([int(seed), zlib.crc32(b"training|fit")])
    return rng.standard_normal((n, len(u["params"]))) @ _train_root(u).T


def _kernel_log(n: int, seed: int, groups) -> dict:
    out: dict = {}
    for fam in kernel_families():
        if fam.group not in groups:
            continue
        d = B.log_draws(fam, n, seed)
        chip = out.setdefault(fam.entry[0], {})
        for i, p in enumerate(fam.params):
            chip[p] = d[:, i]
    return out


def note(groups=GROUPS) -> str:
    u = fit_uncertainty()
    on = [GROUP_NAMES[g] for g in GROUPS if g in groups]
    text = "bands sample the " + ", ".join(on) + " parameters"
    if TRAIN in groups:
        text += (" (the training fit's: " + (u["rule"] or "no uncertainty in the catalog, held "
                                             "exact") + "; clipped to the fit's bounds)")
    return (text + "; the kernel parameters of the chip's " + tcat.KERNEL_RUNTIME + " tables; "
            "model-form error and the training priors (reserve, fragmentation, attention "
            "backward) are not included")


def draw(n: int = B.DEFAULT_SAMPLES, seed: int = 0, groups=GROUPS) -> TrainDraws:
    """``n`` samples of the ``groups`` (GROUPS; every other parameter at its fitted value).
    A family's draws do not depend on which other groups are drawn (seeded by the family)."""
    if n < 1:
        raise ValueError("draw needs n >= 1 (bands off: do not draw)")
    groups = tuple(groups)
    u = fit_uncertainty()
    tr = _train_log(u, n, seed) if TRAIN in groups else np.zeros((n, len(u["params"])))
    kern = _kernel_log(n, seed, groups)
    return TrainDraws(n, int(seed), tuple(u["params"]), np.exp(tr),
                      {c: {p: np.exp(v) for p, v in d.items()} for c, d in kern.items()},
                      note(groups))


def draw_sets(k: int, seed: int = 0, sets=None) -> tuple[tuple, TrainDraws]:
    """For each set of groups (tuples of GROUPS names; default each group alone), ``k``
    samples with only those groups varied, every other parameter at its fitted value: (the
    sets, one TrainDraws of ``len(sets) x k`` samples, set-major). Each group draws what it
    draws in ``draw(k, seed)`` (seeded by the group or family), so a set's samples are the
    full draw's first ``k`` with the other groups switched off (``dse.scoring.bands.draw_sets``
    for training)."""
    sets = tuple((g,) for g in GROUPS) if sets is None else tuple(tuple(s) for s in sets)
    B.check_sets(k, sets, GROUPS)
    parts = [draw(k, seed, s) for s in sets]
    chips = sorted({c for p in parts for c in p.kernel})

    def kern(c, key):
        return np.concatenate([p.kernel.get(c, {}).get(key, np.ones(k)) for p in parts])
    keys = {c: sorted({q for p in parts for q in p.kernel.get(c, {})}) for c in chips}
    kernel = {c: {q: kern(c, q) for q in keys[c]} for c in chips}
    d = TrainDraws(k * len(sets), int(seed), parts[0].params,
                   np.concatenate([p.train for p in parts]), kernel, note(GROUPS))
    return sets, d


def draw_groups(k: int, seed: int = 0) -> tuple[tuple, TrainDraws]:
    """Per group alone, ``k`` samples (the full draw's first ``k`` with every other group at its
    fitted value): (the groups, one TrainDraws of ``len(groups) x k`` samples, group-major)."""
    sets, d = draw_sets(k, seed)
    return tuple(s[0] for s in sets), d


def sample_overrides(draws: TrainDraws, k: int, overrides: dict | None = None) -> dict:
    """The design overrides of sample ``k``: each training parameter set to its fitted value
    times the sample's factor, clipped to the fit's bounds (an analysis's own override of it
    is kept and multiplied by the factor)."""
    out = dict(overrides or {})
    fitted = tcat.train_parameters()
    for i, p in enumerate(draws.params):
        f = float(draws.train[k, i])
        path = "train." + p
        op = out.get(path)
        if op is None:
            lo, hi = BOUNDS.get(p, (-np.inf, np.inf))
            out[path] = ("set", float(np.clip(float(fitted[p]) * f, lo, hi)))
        else:
            out[path] = (op[0], op[1] * f)
    return out


def kernel_scale(draws: TrainDraws, k: int):
    """{catalog kernel key: factor} of sample ``k`` per chip: ``train_space.score_values``'
    ``kernel_scale``."""
    def of(base_chip: str) -> dict:
        return {p: float(f[k]) for p, f in draws.kernel.get(base_chip, {}).items()}
    return of


def score(space, vals: dict, draws: TrainDraws, k: int, overrides: dict | None = None,
          metrics=None) -> dict:
    """Every training metric (or ``metrics``) of the designs under sample ``k`` (float64)."""
    return train_space.score_values(space, vals, sample_overrides(draws, k, overrides),
                                    metrics=metrics, dtype=np.float64,
                                    kernel_scale=kernel_scale(draws, k))


def space_samples(space, vals: dict, draws: TrainDraws, overrides: dict | None = None,
                  metrics=None) -> dict:
    """Every sample's metrics of the designs: {metric: array (samples, designs)}."""
    per = [score(space, vals, draws, k, overrides, metrics) for k in range(draws.n)]
    return {m: np.stack([np.asarray(p[m], float) for p in per]) for m in per[0]}


class TrainSampled:
    """The draws of a training answer's bands (``dse.questions.sampled``'s Sampled for
    training spaces): ``view(k)`` scores designs under sample ``k``."""

    def __init__(self, draws: TrainDraws):
        self.draws = draws

    def view(self, k: int) -> TrainView:
        return TrainView(self.draws, k)


class TrainView:
    def __init__(self, draws: TrainDraws, k: int):
        self.draws, self.k = draws, k

    def score(self, space, vals: dict, overrides=None) -> dict:
        return score(space, vals, self.draws, self.k, overrides)
