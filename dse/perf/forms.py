"""The forms a step term takes, and the arithmetic that keeps them cheap.

Almost every time of the step model is affine in the step's tokens: a GEMM pads small row
counts up by ``gemm_half_rows`` (``gemm_form``), a collective has a latency and a per-byte cost
per kernel branch, the runtime taking the fastest (``per_unit``, ``fastest``). The op modules
(``dse.perf.op_attention``, ``op_mlp``, ``op_head``) build these forms once per design; the step
(``dse.perf.step``) evaluates them for any token mix.

The byte conventions of the work table (``StepTimes.net_bytes``) are here too:
``allreduce_bytes`` and ``allgather_bytes``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dse.perf.batch import Batch
from dse.perf.network import kernel_allreduce


def gemm_form(b: Batch, gemms, layers, inv_eff):
    """An op made of dense GEMMs ``[(n, k), ...]`` per chip per layer over ``layers`` layers:
    ``(a, w)`` with compute time ``a * (rows + gemm_half_rows) + w`` (dse.perf.kernel_gemm's
    form summed exactly over the GEMMs: shape factor per GEMM, one wave of tiles each).
    ``n`` and ``k`` are at least 1 (``floor1``); ``inv_eff = 2 / (peak * gemm_fraction)``,
    computed once for the ops that share a peak.

    Per GEMM ``k * shape = k (1 + n_half / n) + k_half``; the factors every GEMM shares (2,
    the wave, layers over the efficiency) are applied once to the sums. With every shape
    factor at its ideal (``n_half = k_half = wave = 0``) the time is ``2 n k layers rows /
    (peak gemm_fraction)``: the op's FLOPs over the achievable rate."""
    a = s = None
    for n, k in gemms:
        ks = (b.gemm_n_half / n + 1.0) * k + b.gemm_k_half       # k * shape
        s = ks if s is None else s + ks
        a = ks * n if a is None else a + ks * n
    r = layers * inv_eff
    return a * r, s * (r * b.gemm_wave_elements)


def floor1(x):
    return np.maximum(x, 1.0)


def log1m(x):
    """``log(1 - x)`` for ``0 <= x < 1``, accurate for small ``x`` like ``np.log1p(-x)`` but with
    numpy's vectorised ``log`` (log1p has no SIMD loop: ~6x slower): Goldberg's
    ``log(u) * x / (1 - u)`` with ``u = 1 - x`` (rounding of ``u`` cancels); ``x = 0`` gives 0."""
    u = 1.0 - x
    den = np.maximum(1.0 - u, np.finfo(u.dtype).tiny if hasattr(u, "dtype") else 1e-300)
    return np.log(u) * (x / den)


def iadd(a, x):
    """``a + x``, in place when ``a`` (a fresh array) already has the broadcast shape (a compact
    batch's length-1 terms may not)."""
    if type(a) is np.ndarray:
        sx, sa = x.shape if type(x) is np.ndarray else np.shape(x), a.shape
        # (the usual cases first, in Python: np.broadcast_shapes costs more than a small
        # chunk's addition; ``x`` fits ``a`` where each of its trailing axes is ``a``'s or 1:
        # a row's terms on a (points, rows) array, ``sa[-1:]``, the most common)
        if sx == sa or (len(sx) <= len(sa) and (not sx or sx == sa[-len(sx):] or all(
                d == 1 or d == e for d, e in zip(reversed(sx), reversed(sa))))):
            a += x
            return a
    return a + x


def affine(form, x):
    """``slope * x + intercept`` for ``form = (slope, intercept)`` (in place on the product)."""
    return iadd(form[0] * x, form[1])


def per_unit(branches, n_lat, n_spb, bytes_per_unit):
    """A collective's kernel branches ``(latency_s, seconds_per_byte[, below_bytes, penalty_s])``
    as a step term in units of the step's tokens or rows: ``n_lat`` latencies (calls per step),
    ``n_spb * bytes_per_unit`` per-byte costs per unit, and a runtime's one-shot threshold in
    units (one call's message is ``bytes_per_unit`` per unit)."""
    out = (n_lat * branches[0], branches[1] * (n_spb * bytes_per_unit))
    if len(branches) == 2:
        return out
    return out + (branches[2] / np.maximum(bytes_per_unit, 1e-30),) + tuple(branches[3:])


def fastest(branches, x):
    """``min_i latency[i] + per_unit[i] * x`` over a collective's kernel branches (row by row:
    contiguous arrays are faster than a broadcast over the branch axis). With a runtime's
    selection rule ``(below, penalty)`` (network.kernel_allreduce): on the rule's rows
    (``penalty`` 1e30, two-shot already off) one-shot below ``below`` units and NCCL's faster
    protocol from there on; elsewhere (``penalty`` 0) the fastest of the four. With the rule on
    every row, ``(lat, per, below)`` of the three branches NCCL LL, Simple and one-shot: the same
    selection without the penalty and the two-shot branch (never selected under the rule)."""
    lat, per = branches[:2]
    t = lat[0] + per[0] * x
    u = np.empty_like(t)
    if len(branches) == 3:                 # the rule on every row: (NCCL LL, Simple, one-shot)
        np.multiply(per[1], x, out=u)
        u += lat[1]
        np.minimum(t, u, out=t)            # NCCL
        np.multiply(per[2], x, out=u)
        u += lat[2]
        return select(x < branches[2], u, t)
    if len(branches) == 4:                 # (NCCL LL, NCCL Simple, one-shot, two-shot)
        below, penalty = branches[2:]
        np.multiply(per[1], x, out=u)
        u += lat[1]
        np.minimum(t, u, out=t)            # NCCL
        one = lat[2] + per[2] * x
        np.minimum(one, t + penalty, out=one)
        one = select(x < below, one, t)
        np.multiply(per[3], x, out=u)
        u += lat[3]
        return np.minimum(one, u, out=one)
    for i in range(1, len(lat)):
        np.multiply(per[i], x, out=u)
        u += lat[i]
        np.minimum(t, u, out=t)
    return t


def select(mask, yes, no):
    """``np.where(mask, yes, no)`` for fresh float arrays ``yes`` and ``no`` of the mask's shape
    (``yes`` is overwritten with the result, ``no`` too): a blend of their bits under the mask
    as all-ones or zeros, the same numbers (inf and NaN too) at ~3x np.where's speed, which
    branches per element (the request-rate path's collectives select a kernel branch ~16 times
    a point). Other shapes or dtypes: np.where."""
    if not (type(yes) is np.ndarray and type(no) is np.ndarray and yes.shape == no.shape
            == np.shape(mask) and yes.dtype == no.dtype and yes.dtype.itemsize in _BITS):
        return np.where(mask, yes, no)
    bits = _BITS[yes.dtype.itemsize]
    m = mask.astype(bits)
    np.negative(m, out=m)                  # all ones where the mask holds
    out = yes.view(bits)
    out &= m
    np.invert(m, out=m)
    m &= no.view(bits)
    out |= m
    return yes


_BITS = {4: np.int32, 8: np.int64}


def allreduce_bytes(group, message):
    """Bytes one chip sends in an all-reduce of ``message`` bytes over ``group`` chips, the
    ring's ``2 (g - 1) / g`` of the buffer (nccl-tests' bus bytes, doc/PERFORMANCE.md): the
    work, whichever fitted kernel branch (NCCL LL/Simple, one-shot, two-shot) the time takes."""
    return 2.0 * (group - 1.0) / np.maximum(group, 1.0) * message


def allgather_bytes(group, gathered):
    """Bytes one chip sends in a ring all-gather of a ``gathered``-byte result over ``group``
    chips: ``(g - 1) / g`` of it, half an all-reduce's."""
    return (group - 1.0) / np.maximum(group, 1.0) * gathered


class AllReduces:
    """``network.kernel_allreduce`` of one batch for several (group, bandwidth share) pairs,
    each distinct pair computed once (a step has up to three all-reduces, often over the same
    group)."""

    def __init__(self, b: Batch):
        self.b = b
        self.done = []

    def __call__(self, g, bw_rel):
        for g_, bw_, out in self.done:
            if np.array_equal(g, g_) and np.array_equal(bw_rel, bw_):
                return out
        out = kernel_allreduce(self.b, g, bw_rel)
        self.done.append((g, bw_rel, out))
        return out


WORK = {"work": True}


def work_field():
    """A field of an op's terms that only its ``work`` (the work table) and the construction
    read: ``Coefficients.gather`` (the search's path, which asks for no breakdown) leaves it
    out, and a breakdown from gathered coefficients rebuilds the terms from its batch."""
    return dataclasses.field(metadata=WORK)


_TIME_FIELDS: dict = {}


def _time_fields(cls) -> tuple:
    """The fields of an op's terms class that its ``time`` may read (not ``work_field``s)."""
    if cls not in _TIME_FIELDS:
        _TIME_FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls)
                                  if not f.metadata.get("work"))
    return _TIME_FIELDS[cls]


def map_terms(leaf, arg, v, *w):
    """``leaf(x, *y, arg)`` on each array or number of a per-design term (an array, a form's
    tuple, a dict, an op's terms: their time's fields), the structure kept: what
    ``Coefficients`` holds (``take``, ``cast``, ``blend``). ``w``: the same term of other
    coefficients of the batch, read beside ``v``. None, flags and batches stay as they are."""
    if type(v) is not np.ndarray:
        if v is None or isinstance(v, (bool, Batch)):
            return v
        if isinstance(v, tuple):
            return tuple(map_terms(leaf, arg, *x) for x in zip(v, *w))
        if isinstance(v, dict):
            return {k: map_terms(leaf, arg, x, *(o[k] for o in w)) for k, x in v.items()}
        if dataclasses.is_dataclass(v):          # an op's terms: its time's fields
            out = object.__new__(type(v))
            out.__dict__.update({k: map_terms(leaf, arg, v.__dict__[k],
                                              *(o.__dict__[k] for o in w))
                                 for k in _time_fields(type(v))})
            return out
    return leaf(v, *w, arg)


def take(v, rows):
    """Rows ``rows`` of a per-design term (array, form tuple, dict, op terms): ``Coefficients``
    of a gathered batch. Length-1 (compact) and scalar terms stay as they are; ``(branch,
    design)`` arrays are taken along the design axis."""
    return map_terms(_take_rows, rows, v)


def _take_rows(v, rows):
    if type(v) is not np.ndarray and isinstance(v, (int, float)):
        return v
    a = np.asarray(v)
    ints = isinstance(rows, np.ndarray) and rows.dtype.kind in "iu"   # (ndarray.take: faster)
    if a.ndim == 2:                    # (branch, design)
        return a if a.shape[1] == 1 else (a.take(rows, axis=1) if ints else a[:, rows])
    return a if a.ndim == 0 or len(a) == 1 else (a.take(rows, axis=0) if ints else a[rows])


def cast(v, dtype):
    """A per-design term (as ``take`` reads them) with its floating arrays and numpy floats in
    ``dtype`` (``Coefficients.astype``: the probe's float32 coefficients rounded from the
    batch's float64 ones, not computed again); the op terms' time fields only."""
    return map_terms(_cast, dtype, v)


def _cast(v, dtype):
    if type(v) is not np.ndarray:
        return dtype(v) if isinstance(v, np.floating) else v
    return v.astype(dtype) if v.dtype.kind == "f" and v.dtype != dtype else v


def blend(v, w, mask):
    """A per-design term (as ``take`` reads them): ``v``'s rows where ``mask``, ``w``'s
    elsewhere (``v`` and ``w`` the same term of two ``Coefficients`` of one batch; a term equal
    in both stays as it is, a length-1 or scalar one that differs becomes a row each)."""
    return map_terms(_blend, mask, v, w)


def _blend(v, w, mask):
    if type(v) is not np.ndarray and type(w) is not np.ndarray and v == w:
        return v
    a, b = np.asarray(v), np.asarray(w)
    if a.dtype.kind != "f" or (a.shape == b.shape and np.array_equal(a, b)):
        return v
    m = mask if max(a.ndim, b.ndim) < 2 else mask[None, :]
    return np.where(m, a, b)
