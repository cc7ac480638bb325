"""Request lengths as distributions: in-flight context, KV packing, the attention-DP straggler.

Input and output lengths are gamma distributed with means ``isl``, ``osl`` and coefficients of
variation ``isl_cv``, ``osl_cv`` (0: every request the same, dse's model before issue 11),
independent of each other. Under continuous batching a sequence is in flight for a time
proportional to its output length, so the sequences in flight are length-biased:

- **Decode context.** An in-flight sequence has decoded a uniform share of its (length-biased)
  answer: mean context ``isl + E[O^2] / (2 E[O]) = isl + osl (1 + cv_o^2) / 2``.
- **KV packing.** Each sequence holds KV for its prompt and its whole answer (dse reserves the
  final length), whose in-flight mean is ``isl + osl (1 + cv_o^2)``; the C/dp sequences of one
  scheduler must fit at the 99th percentile of their sum (normal approximation):
  ``mean * (1 + 2.326 cv_sum / sqrt(C / dp))``.
- **Attention-DP straggler.** Requests go to the ``dp`` attention ranks round-robin (SGLang's
  default load-balance method), so each rank's KV is a sum of C/dp random contexts; the
  busiest of dp ranks sits ``z_dp`` standard deviations above the mean, ``z_dp`` the expected
  maximum of dp standard normals (Blom's approximation ``Phi^-1((dp - 0.375) / (dp + 0.25))``).
  Only the spread from length variation counts: with uniform lengths a rank's sequences are
  evenly staggered in age and the ranks balance.

- **Prefill of the busiest attention-DP rank.** A step's prompt tokens are split over the dp
  ranks by whole prompts (chunks), so a rank's share is a sum of about ``n`` random prompt
  lengths (``n`` = prompts per rank per step, at least 1): the busiest of dp ranks carries
  ``1 + z_dp cv_i / sqrt(n)`` times the mean share (``prefill_straggler``).
- **TTFT of a long prompt.** ``ttft_p90_length_s`` is the TTFT of a prompt at the 90th
  percentile of the input lengths (the gamma quantile by Wilson and Hilferty,
  ``isl_quantile``): its prefill steps take the step's per-token prefill time for its own
  uncached tokens (no queueing; the queue's own percentiles are dse.perf.queueing's).

Gamma moments used: ``E[O^2] = m^2 (1 + c^2)``, ``E[O^3] = m^3 (1 + c^2)(1 + 2 c^2)``.
"""

from __future__ import annotations

import numpy as np

from dse.perf.batch import Batch, as_floating

Z99 = 2.3263478740408408


def on(b: Batch) -> bool:
    return b.has_on("isl_cv") or b.has_on("osl_cv")


def norm_ppf(p) -> np.ndarray:
    """Standard normal quantile for p in [0.5, 1) (Abramowitz and Stegun 26.2.23, |err| <
    4.5e-4)."""
    q = 1.0 - as_floating(p)
    t = np.sqrt(-2.0 * np.log(np.maximum(q, np.finfo(q.dtype).tiny)))
    t2 = t * t                                    # (np.power has no SIMD loop)
    x = t - (2.515517 + 0.802853 * t + 0.010328 * t2) \
        / (1.0 + 1.432788 * t + 0.189269 * t2 + 0.001308 * (t2 * t))
    return np.where(np.asarray(p) <= 0.5, 0.0, x)


def expected_max_normal(n) -> np.ndarray:
    """E[max of n standard normals] (Blom): 0 for n = 1, 0.59 for 2 (exact 0.56), 1.43 for 8
    (exact 1.42)."""
    n = np.maximum(as_floating(n), 1.0)
    return norm_ppf((n - 0.375) / (n + 0.25)) * (n > 1)


def decode_context_tokens(b: Batch) -> np.ndarray:
    """Mean context of an in-flight decoding sequence: isl + osl (1 + cv_o^2) / 2 (once per
    batch)."""
    return b.memo("lengths_decode_context",
                  lambda: b.isl + 0.5 * b.osl * (1.0 + b.osl_cv ** 2))


def context_sd_tokens(b: Batch) -> np.ndarray:
    """Standard deviation of an in-flight sequence's context from length variation alone (the
    age spread of uniform answers, osl^2 / 12, excluded)."""
    c2 = b.osl_cv ** 2
    age = b.osl ** 2 * ((1.0 + c2) * (1.0 + 2.0 * c2) / 3.0 - 0.25 * (1.0 + c2) ** 2 - 1.0 / 12.0)
    return np.sqrt(np.maximum((b.isl_cv * b.isl) ** 2 + age, 0.0))


def _z_dp(b: Batch) -> np.ndarray:
    """``expected_max_normal(dp)``, once per batch (the decode and prefill stragglers use it)."""
    return b.memo("lengths_z_dp", lambda: expected_max_normal(b.dp))


def straggler(b: Batch, c) -> np.ndarray:
    """The busiest attention-DP rank's decode KV over the mean rank's (the concurrency-free
    factor once per batch: the request-rate path scores a batch at many concurrencies)."""
    per_rank = np.maximum(c / b.dp, 1.0)
    spread = b.memo("lengths_decode_spread",
                    lambda: _z_dp(b) * (context_sd_tokens(b) / decode_context_tokens(b)))
    return 1.0 + spread / np.sqrt(per_rank)


def fit_context_tokens(b: Batch, decodes, c) -> np.ndarray:
    """KV tokens one sequence must have room for: the in-flight mean of the final length
    (``decodes`` = 1 where answers are decoded, 0 on a prefill-only instance) with the packing
    margin of the C/dp sequences of one scheduler."""
    c2 = b.osl_cv ** 2
    # (no concurrency in the mean and the margin: once per batch)
    mean = b.memo("lengths_fit_mean", lambda: b.isl + decodes * b.osl * (1.0 + c2))
    margin = b.memo("lengths_fit_margin", lambda: Z99 * np.sqrt(
        (b.isl_cv * b.isl) ** 2 + decodes * b.osl ** 2 * (1.0 + c2) * c2) / mean)
    per_rank = np.maximum(c / b.dp, 1.0)
    return mean * (1.0 + margin / np.sqrt(per_rank))


Z90 = 1.2815515655446004


def isl_quantile(b: Batch, z=Z90) -> np.ndarray:
    """Input length at the standard-normal quantile ``z`` of its gamma distribution (Wilson and
    Hilferty: k theta (1 - 1/(9k) + z sqrt(1/(9k)))^3, shape k = 1/cv^2; isl where cv = 0).
    At the 90th percentile: within 3% of the exact quantile for cv <= 1, 7% low at cv = 2."""
    v = b.isl_cv ** 2 / 9.0                               # 1 / (9 k)
    return b.isl * np.maximum(1.0 - v + z * np.sqrt(v), 0.0) ** 3


def prefill_straggler(b: Batch, prompts_per_rank) -> np.ndarray:
    """The busiest attention-DP rank's prompt tokens in a step over the mean rank's."""
    n = np.maximum(prompts_per_rank, 1.0)
    return 1.0 + _z_dp(b) * b.isl_cv / np.sqrt(n)
