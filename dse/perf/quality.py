"""A quality proxy for MoE co-design: dense-equivalent parameters (Clark et al. 2022).

Unified scaling law for routed language models, S-BASE fit (reference/moe_scaling.md §1):
``log10 L(N, E) = a log10 N + b log10 Ê + c log10 N log10 Ê + d`` with the saturating expert
count ``1/Ê = 1/(E - 1 + (1/E_start - 1/E_max)^-1) + 1/E_max``. The dense-equivalent size of an
MoE with N active (non-embedding) parameters and E experts is the N' whose dense loss L(N', 1)
equals L(N, E); it reproduces the podcast's "64 experts at 370M active ~ dense 1.3B" (1.37B).
A coarse proxy: Clark fitted top-1/top-2 routing with at most 512 experts.
"""

from __future__ import annotations

import numpy as np

from dse.perf import arch
from dse.perf.batch import Batch

A, B, C, D = -0.082, -0.108, 0.009, 1.104
E_START, E_MAX = 1.847, 314.5


def _log_ehat(e: np.ndarray) -> np.ndarray:
    """log10 of the saturating expert count (as the natural log over ln 10: numpy's log10 has
    no SIMD loop, ~4x slower than log)."""
    k = 1.0 / (1.0 / E_START - 1.0 / E_MAX)
    return np.log(1.0 / (1.0 / (e - 1.0 + k) + 1.0 / E_MAX)) * (1.0 / LN10)


LN10 = float(np.log(10.0))


def dense_equivalent_params(b: Batch) -> np.ndarray:
    """Dense-equivalent parameter count (non-embedding) of each row's model."""
    n = np.maximum(arch.active_params(b) - arch.embedding_params(b), 1.0)
    x = np.log(n) * (1.0 / LN10)                     # log10 n
    le = _log_ehat(np.maximum(b.n_experts, 1.0))
    le1 = float(_log_ehat(np.float64(1.0)))          # a dense model (one expert)
    target = A * x + B * le + C * x * le + D
    return np.exp(LN10 / (A + C * le1) * (target - D - B * le1))
