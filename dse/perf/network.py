"""Collective costs on a two-tier network (scale-up domain, scale-out fabric).

A group of ``g`` chips is placed contiguously; when it is larger than the scale-up domain it
spans ``g / domain_chips`` domains and the part of its traffic that leaves a domain pays the
scale-out tier. Bandwidths are per chip and per direction; ``bw_fraction`` is the share of the
scale-up bandwidth the group can use (from the topology graph: a 2-chip group on a full mesh
has one link, on a switch it has all of them). All-reduce and all-to-all run the fitted
collective kernels (``dse.perf.kernel_comm``); the pipeline hand-off is one point-to-point
transfer at the tier's efficiency.

Every cost is affine in the bytes moved: ``(latency_s, seconds_per_byte)`` (all-reduce: one
pair per kernel branch, the runtime taking the fastest).
"""

from __future__ import annotations

import numpy as np

from dse.perf import kernel_comm
from dse.perf.arch import blend, flag
from dse.perf.batch import Batch


def _log2(g: np.ndarray) -> np.ndarray:
    return np.log2(np.maximum(g, 1.0))


def p2p_coef(b: Batch, crosses_domain: np.ndarray):
    """One point-to-point transfer between pipeline stages."""
    up = 1.0 / (b.scaleup_bw_bytes_per_s * b.scaleup_fraction * b.tp_bw_fraction)
    out = 1.0 / (b.scaleout_bw_bytes_per_s * b.scaleout_fraction)
    f = flag(crosses_domain, up)
    return blend(f, b.scaleout_latency_s, b.scaleup_latency_s), blend(f, out, up)


# --- fitted collective kernels (dse.perf.kernel_comm, dse/catalog/kernels/comm.toml) ---------

def _kernel_params(b: Batch, keys) -> dict:
    return {k: b.columns[k] for k in keys}


RULE_KEYS = ("ar_oneshot_below_2_bytes", "ar_oneshot_below_4_bytes", "ar_oneshot_below_bytes")


def kernel_allreduce(b: Batch, g: np.ndarray, bw_fraction: np.ndarray):
    """All-reduce over ``g`` chips with the fitted kernels: ``(latency_s[n_branch, n],
    seconds_per_byte[n_branch, n])``, ``t = min over branches``; under a runtime's selection
    rule (``ar_oneshot_below_*_bytes`` > 0) also ``(below_bytes, penalty_s)``: one-shot below
    ``below_bytes``, NCCL above (``penalty_s`` 1e30 on the rule's rows, 0 elsewhere; the step's
    ``forms.fastest``); with the rule on every row, the three branches NCCL LL, NCCL Simple and
    one-shot and ``below_bytes`` alone (two-shot is never selected).
    The link is the chip's scale-up bandwidth times the group's share on the design's topology graph relative to its
    share on the system the kernels were measured on (``*_bw_rel``); the topology's
    latency beyond the measured system's (``scaleup_extra_latency_s``) is added."""
    keys = kernel_comm.AR_NCCL_KEYS + kernel_comm.AR_CUSTOM_KEYS + kernel_comm.SCALEOUT_KEYS
    lat, spb = kernel_comm.allreduce_branches(
        g, b.scaleup_bw_bytes_per_s * bw_fraction, domain_chips=b.domain_chips,
        scaleout_bw_bytes_per_s=b.scaleout_bw_bytes_per_s, custom=True,
        extra_latency_per_log2_s=b.scaleup_extra_latency_s, **_kernel_params(b, keys))
    # a branch the group cannot take (custom kernels across domains) has an infinite latency:
    # keep it finite so that a zero coefficient (a dense model's MoE terms) stays zero
    lat = np.clip(lat, 0.0, 1e30, out=lat)
    if not any(b.has_on(k) for k in RULE_KEYS):
        return lat, spb
    # the runtime's selection by message size (kernel_comm.allreduce_rule): two-shot off (an
    # added latency, once per design), one-shot below the threshold and NCCL above (the step's
    # forms.fastest); a group across domains has no custom kernel and runs NCCL at every size
    below, rule = kernel_comm.allreduce_rule(g, b.ar_oneshot_below_2_bytes,
                                             b.ar_oneshot_below_4_bytes, b.ar_oneshot_below_bytes)
    shape = np.broadcast_shapes(lat.shape[1:], below.shape)   # (a compact batch's length-1 rows)
    if lat.shape[1:] != shape:
        lat, spb = (np.ascontiguousarray(np.broadcast_to(a, lat.shape[:1] + shape))
                    for a in (lat, spb))
    below = np.where(lat[2] >= 1e30, 0.0, np.broadcast_to(below, shape))
    if bool(np.all(rule > 0.0)):
        # every row under the rule (one runtime with thresholds, the usual batch): two-shot is
        # never taken, so the step selects between one-shot and NCCL alone (``forms.fastest``'s
        # three-entry form: no penalty, no two-shot branch evaluated per step)
        return lat[:3], spb[:3], below
    lat[3] += 1e30 * rule
    return lat, spb, below, 1e30 * np.broadcast_to(rule, shape)


def kernel_alltoall(b: Batch, ep: np.ndarray, dispatch_bytes, combine_bytes,
                    kinds=("ll", "normal"), sent: dict | None = None) -> dict:
    """EP dispatch plus combine with the fitted kernels (per-rank and per-node deduplication for
    the normal kernels): ``{kind: (latency_s, seconds_per_token)}`` for the tokens one chip
    sends. The bytes per token are computed once for both phases (they differ only in element
    bytes), what the kinds share once for all of them. ``sent``: a dict that receives, per
    kind, the ``(scale-up, scale-out)`` bytes one token sends per element byte in one phase
    (``kernel_comm.alltoall_bytes``), what the per-byte costs are charged on."""
    ranks = np.minimum(ep, b.domain_chips)
    ep_ = np.maximum(ep, 1.0)
    spans = flag(ep_ / np.minimum(ranks, ep_) > 1.0, ep_)
    up_bw = b.scaleup_bw_bytes_per_s * b.a2a_bw_rel
    out_bw = b.scaleout_bw_bytes_per_s * b.a2a_scaleout_fraction
    on = flag(ep > 1.0, ep_)
    lat0 = 2.0 * spans * b.a2a_scaleout_latency_s                # once per phase
    extra = 2.0 * on * b.scaleup_extra_latency_s
    experts = np.maximum(b.n_experts, 1.0)
    out = {}
    for kind in kinds:
        up, across = kernel_comm.alltoall_bytes(1.0, b.hidden, b.top_k, experts, ep, ranks, 1.0,
                                                kind)
        if sent is not None:
            sent[kind] = (up, across)
        # the kernels' issue rate per token and element byte (kernel_comm.alltoall_rate_s):
        # normal per message, ll per expert
        if kind == "ll":
            per_eb = b.hidden * b.top_k / experts
        else:
            per_eb = 1.0 + (up + across) / np.maximum(b.hidden, 1e-30)
        lat, spt = lat0, 0.0
        for phase, eb in (("dispatch", dispatch_bytes), ("combine", combine_bytes)):
            lat = lat + b.columns[f"a2a_{kind}_{phase}_latency_s"]
            frac = b.columns[f"a2a_{kind}_{phase}_fraction"]
            rate = per_eb * eb / b.columns[f"a2a_ll_{phase}_expert_bytes_per_s"] \
                if kind == "ll" else per_eb * b.columns[f"a2a_normal_{phase}_message_s"]
            spt = spt + eb * np.maximum(up / (up_bw * frac), across / out_bw) + rate
        out[kind] = (np.maximum(on * lat + extra, 0.0), on * spt)
    return out
