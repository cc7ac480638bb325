"""Collective costs on a two-tier network (scale-up domain, scale-out fabric).

A group of ``g`` chips is placed contiguously; when it is larger than the scale-up domain it
spans ``g / domain_chips`` domains and the part of its traffic that leaves a domain pays the
scale-out tier. Bandwidths are per chip and per direction; ``bw_fraction`` is the share of the
scale-up bandwidth the group can use (from the topology graph: a 2-chip group on a full mesh
has one link, on a switch it has all of them).
"""

from __future__ import annotations

import numpy as np

from dse.perf.batch import Batch


def _log2(g: np.ndarray) -> np.ndarray:
    return np.log2(np.maximum(g, 1.0))


def allreduce_s(b: Batch, message_bytes: np.ndarray, g: np.ndarray,
                bw_fraction: np.ndarray) -> np.ndarray:
    """All-reduce of ``message_bytes`` over ``g`` chips (hierarchical when it spans domains)."""
    d = b.domain_chips
    inner = np.minimum(g, d)
    n_dom = np.maximum(g / d, 1.0)
    up_bw = b.scaleup_bw_bytes_per_s * b.scaleup_fraction * bw_fraction
    out_bw = b.scaleout_bw_bytes_per_s * b.scaleout_fraction
    t_up = 2.0 * (inner - 1.0) / inner * message_bytes / up_bw + 2.0 * _log2(inner) * b.scaleup_latency_s
    t_out = np.where(
        n_dom > 1.0,
        2.0 * (n_dom - 1.0) / n_dom * (message_bytes / inner) / out_bw
        + 2.0 * _log2(n_dom) * b.scaleout_latency_s,
        0.0)
    return np.where(g > 1.0, t_up + t_out, 0.0)


def alltoall_s(b: Batch, bytes_out: np.ndarray, g: np.ndarray,
               bw_fraction: np.ndarray) -> np.ndarray:
    """All-to-all where each chip sends ``bytes_out`` spread evenly over a group of ``g`` chips.

    The share of destinations outside the sender's domain goes over scale-out; both tiers run
    at once, so the slower one sets the time.
    """
    d = b.domain_chips
    out_share = np.where(g > d, 1.0 - d / np.maximum(g, 1.0), 0.0)
    up_bw = b.scaleup_bw_bytes_per_s * b.scaleup_fraction * bw_fraction
    out_bw = b.scaleout_bw_bytes_per_s * b.scaleout_fraction
    t_up = bytes_out * (1.0 - out_share) / up_bw + b.scaleup_latency_s
    t_out = np.where(out_share > 0, bytes_out * out_share / out_bw + b.scaleout_latency_s, 0.0)
    return np.where(g > 1.0, np.maximum(t_up, t_out), 0.0)


def p2p_s(b: Batch, message_bytes: np.ndarray, crosses_domain: np.ndarray) -> np.ndarray:
    """One point-to-point transfer between pipeline stages."""
    up = message_bytes / (b.scaleup_bw_bytes_per_s * b.scaleup_fraction * b.tp_bw_fraction) \
        + b.scaleup_latency_s
    out = message_bytes / (b.scaleout_bw_bytes_per_s * b.scaleout_fraction) + b.scaleout_latency_s
    return np.where(crosses_domain, out, up)
