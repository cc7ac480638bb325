"""Collective kernel cost models fitted on measured collective tables (``dse.calibration.kernels.comm``).

Pure numpy, vectorized over designs, no per-hardware branches. Every branch is affine in the
bytes moved, ``t = latency_s + seconds_per_byte * bytes``; where a runtime picks the fastest of
several kernels or protocols the time is the ``min`` over branches, and ``*_branches`` return the
stacked ``(latency_s, seconds_per_byte)`` so a scorer can precompute them per design.
Parameter names are the keys of ``dse/catalog/kernels/comm.toml``.

All-reduce of ``B`` bytes (the full buffer on every rank) over ``g`` ranks of one scale-up
domain with per-direction link bandwidth ``W``:

    r(g)          = ar_nccl_fraction_per_doubling ** (log2 g - 1)      # busbw vs group size
    NCCL LL       = ar_nccl_latency_s + ar_nccl_latency_per_log2_s log2 g
                    + 2 (g-1)/g B / (W ar_nccl_ll_fraction r(g))
    NCCL Simple   = ar_nccl_bulk_latency_s + ar_nccl_latency_per_log2_s log2 g
                    + 2 (g-1)/g B / (W ar_nccl_fraction r(g))
    custom 1-shot = ar_custom_latency_s + ar_custom_latency_per_log2_s log2 g
                    + (g-1) B / (W ar_custom_fraction)         # every rank pulls g-1 peers' B
    custom 2-shot = 2 (ar_custom_latency_s + ar_custom_latency_per_log2_s log2 g)
                    + 2 (g-1)/g B / (W ar_custom_fraction)
    t             = min(all four)                                       (g = 1: 0)

A group larger than the domain (``domain_chips``) runs hierarchically: NCCL inside each domain
over ``inner = min(g, domain)`` ranks plus an all-reduce of ``B / inner`` over ``n = g / inner``
domains on the scale-out NICs (bandwidth ``S``):

    + 2 log2(n) a2a_scaleout_latency_s + 2 (n-1)/n (B / inner) / (S a2a_scaleout_fraction)

(no custom kernel across domains).

A runtime that picks its kernel by message size rather than by speed (``serving.runtime``'s
``allreduce_rule``, ``dse/catalog/serving.toml``) restricts every branch to a window of message
sizes (:func:`allreduce_rule`): TensorRT-LLM's AUTO strategy (the TensorRT engine path that
v0.14-v0.17 ran, ``AllreducePlugin::selectImplementation``) takes the one-shot custom kernel
below ``t(g)`` bytes (16 MB for 2 ranks, 1 MB for 3-4, 500 kB beyond), NCCL from there on, and
never two-shot (disabled pending NVIDIA bug 4718747). Without a rule ``t = min(all four)``.
 The scale-out parameters are the ones fitted on DeepEP's
RDMA rows (no multi-node all-reduce table exists).

All-to-all (MoE expert-parallel dispatch or combine, one phase) of ``T`` tokens per rank, hidden
``h``, ``eb`` bytes per element, top-``k`` of ``E`` experts spread evenly over ``ep`` ranks in
``N = ep / R`` nodes of ``R`` ranks:

    p_rank  = 1 - prod_{i<k} (E - E/ep - i) / (E - i)    # a token hits a given rank
    p_node  = 1 - prod_{i<k} (E - E/N  - i) / (E - i)    # a token hits a given node
    normal (dedup: a token crosses to a rank / node once, then is fanned out locally):
        scale-up bytes  = T h eb (R-1) p_rank
        scale-out bytes = T h eb (N-1) p_node
    ll (no dedup: one message per (token, expert) pair):
        scale-up bytes  = T h eb k (R-1) / ep
        scale-out bytes = T h eb k (N-1) / N
    t = latency_s + [N > 1] a2a_scaleout_latency_s
        + max(up_bytes / (W fraction), out_bytes / (S a2a_scaleout_fraction))
        + messages * message_s + all_bytes / (E expert_bytes_per_s)          (ep = 1: 0)

with ``latency_s, fraction`` = ``a2a_<kind>_<phase>_latency_s, a2a_<kind>_<phase>_fraction``.
The last two terms are the kernels' issue rate, in series with the links (fitted on the
single-node tables, where they are what the link term alone misses):

- normal kernels (a fixed number of SMs/channels, ``a2a_normal_<phase>_message_s``): a fixed
  cost per token message, ``messages = T (1 + (R-1) p_rank + (N-1) p_node)`` (the local copy,
  one per destination rank in the node, one per destination node), so that small rows reach a
  lower share of the link (TensorRT-LLM's bf16 and fp4 dispatch: 1.4x off without it);
- low-latency kernels (one warp group per expert, so the SMs the kernel runs on scale with
  ``E``, ``a2a_ll_<phase>_expert_bytes_per_s``): every (token, expert) row, ``all_bytes = T h
  eb k`` (local ones included: they go through the per-expert receive buffers too), moves at
  ``E x`` one expert's rate (Mixtral's 8 experts on 8 ranks: 5x slower than 256 experts).

Dispatch is usually fp8 (``eb = 1 + 4/128``: one fp32 scale per 128 elements), combine bf16.
"""

from __future__ import annotations

import numpy as np

AR_NCCL_KEYS = ("ar_nccl_latency_s", "ar_nccl_latency_per_log2_s", "ar_nccl_ll_fraction",
                "ar_nccl_bulk_latency_s", "ar_nccl_fraction", "ar_nccl_fraction_per_doubling")
AR_CUSTOM_KEYS = ("ar_custom_latency_s", "ar_custom_latency_per_log2_s", "ar_custom_fraction")
SCALEOUT_KEYS = ("a2a_scaleout_latency_s", "a2a_scaleout_fraction")
A2A_KEYS = tuple(f"a2a_{kind}_{phase}_{what}" for kind in ("ll", "normal")
                 for phase in ("dispatch", "combine") for what in ("latency_s", "fraction"))
# the kernels' issue-rate terms (module docstring): per message (normal), per expert (ll)
A2A_RATE_KEYS = ("a2a_ll_dispatch_expert_bytes_per_s", "a2a_ll_combine_expert_bytes_per_s",
                 "a2a_normal_dispatch_message_s", "a2a_normal_combine_message_s")
KEYS = AR_NCCL_KEYS + AR_CUSTOM_KEYS + A2A_KEYS + SCALEOUT_KEYS + A2A_RATE_KEYS

FP8_ELEM_BYTES = 1.0 + 4.0 / 128.0     # fp8 payload + one fp32 scale per 128 elements
BF16_ELEM_BYTES = 2.0
NVFP4_ELEM_BYTES = 0.5 + 1.0 / 16.0    # 4-bit payload + one fp8 scale per 16 elements


def _a(x) -> np.ndarray:
    """``x`` as a floating array, keeping a float32 batch in float32 (a Python number stays a
    Python float, which numpy treats as weakly typed)."""
    if isinstance(x, (int, float)):
        return float(x)
    x = np.asarray(x)
    return x if x.dtype.kind == "f" else x.astype(float)


def _log2(g) -> np.ndarray:
    return np.log2(np.maximum(_a(g), 1.0))


def _out(n: int, *args):
    """Uninitialised ``(latency_s, seconds_per_byte)`` arrays of ``n`` branches, broadcast over
    ``args`` (their float dtype: a float32 batch stays float32)."""
    shape = (n,) + np.broadcast_shapes(*(np.shape(a) for a in args))
    dtype = np.result_type(*args, 1.0)
    return np.empty(shape, dtype), np.empty(shape, dtype)


def nccl_allreduce_branches(group, link_bw_bytes_per_s, *, ar_nccl_latency_s,
                            ar_nccl_latency_per_log2_s, ar_nccl_ll_fraction,
                            ar_nccl_bulk_latency_s, ar_nccl_fraction,
                            ar_nccl_fraction_per_doubling, added_latency_s=0.0, log2_group=None,
                            out=None):
    """NCCL ring all-reduce inside one domain: the LL and Simple protocol branches, stacked as
    ``(latency_s[2, ...], seconds_per_byte[2, ...])`` (``t = min_i lat_i + spb_i * bytes``);
    ``added_latency_s``: latency every branch adds once; ``log2_group``: ``log2 g`` when the
    caller has it; ``out``: two such arrays to fill.

    Example (H100, W = 450 GB/s, fraction 0.9, per-doubling 1, g = 8, B = 1 GB): the Simple
    branch's per-byte cost is ``2*7/8 / (450e9*0.9) = 4.32e-12 s/B``, i.e. 4.32 ms for 1 GB.
    """
    g = _a(group)
    lg = _log2(g) if log2_group is None else log2_group
    # r = f ** (log2 g - 1) as exp((log2 g - 1) log f): np.power has no SIMD loop (2x slower)
    r = np.exp((lg - 1.0) * np.log(_a(ar_nccl_fraction_per_doubling)))
    base = 2.0 * (g - 1.0) / np.maximum(g, 1.0) / (_a(link_bw_bytes_per_s) * r)  # ring / bw
    lat_step = _a(ar_nccl_latency_per_log2_s) * lg + added_latency_s
    params = (ar_nccl_latency_s, ar_nccl_bulk_latency_s, ar_nccl_ll_fraction, ar_nccl_fraction)
    lat, spb = _out(2, base, lat_step, *params) if out is None else out
    np.add(ar_nccl_latency_s, lat_step, out=lat[0, ...])
    np.add(ar_nccl_bulk_latency_s, lat_step, out=lat[1, ...])
    np.divide(base, ar_nccl_ll_fraction, out=spb[0, ...])
    np.divide(base, ar_nccl_fraction, out=spb[1, ...])
    return lat, spb


def custom_allreduce_branches(group, link_bw_bytes_per_s, *, ar_custom_latency_s,
                              ar_custom_latency_per_log2_s, ar_custom_fraction,
                              added_latency_s=0.0, log2_group=None, out=None):
    """A runtime's custom all-reduce (one-shot and two-shot), stacked like the NCCL branches.

    one-shot: ``lat + (g-1) * B / (W f)``; two-shot: ``2 lat + 2 (g-1)/g * B / (W f)`` with
    ``lat = ar_custom_latency_s + ar_custom_latency_per_log2_s log2 g``.
    Example (g = 8, W = 450 GB/s, f = 0.8, lat = 4 us, B = 64 kB): one-shot
    ``4e-6 + 7 * 65536 / 360e9 = 5.27 us``; two-shot ``8e-6 + 1.75 * 65536 / 360e9 = 8.32 us``.
    """
    g = _a(group)
    lg = _log2(g) if log2_group is None else log2_group
    lat1 = _a(ar_custom_latency_s) + _a(ar_custom_latency_per_log2_s) * lg
    peers = (g - 1.0) / (_a(link_bw_bytes_per_s) * _a(ar_custom_fraction))
    lat, spb = _out(2, lat1, peers, added_latency_s) if out is None else out
    np.add(lat1, added_latency_s, out=lat[0, ...])
    np.add(2.0 * lat1, added_latency_s, out=lat[1, ...])
    spb[0] = peers
    np.divide(peers, 0.5 * np.maximum(g, 1.0), out=spb[1, ...])
    return lat, spb


def allreduce_branches(group, link_bw_bytes_per_s, *, domain_chips=None,
                       scaleout_bw_bytes_per_s=None, custom=True, extra_latency_per_log2_s=0.0,
                       **p):
    """Every branch of an all-reduce over ``group`` ranks as ``(latency_s[n, ...],
    seconds_per_byte[n, ...])``; ``t = min_i latency_s[i] + seconds_per_byte[i] * bytes``.

    ``p`` holds the ``ar_nccl_*`` keys, the ``ar_custom_*`` keys when ``custom`` (the runtime's
    custom kernel competes with NCCL inside one domain), and the ``a2a_scaleout_*`` keys when
    ``domain_chips`` is given (groups larger than the domain add the inter-domain all-reduce of
    ``B / inner`` on the NICs to every branch, and custom branches are disabled there: their
    latency is infinite). ``extra_latency_per_log2_s``: latency every branch adds per
    ``log2`` of the ranks inside one domain, twice (a topology slower than the measured one).
    """
    g = _a(group)
    if domain_chips is None:
        inner, n_dom = g, None
        lg = _log2(inner)
    else:
        inner = np.minimum(g, _a(domain_chips))
        n_dom = np.maximum(g / inner, 1.0)
        # log2 of the ranks per domain and of the domains from log2 g and log2 D (log2 is
        # monotone: log2 min(g, D) = min(log2 g, log2 D)), two logs instead of three
        lg_g = _log2(g)
        lg = np.minimum(lg_g, _log2(domain_chips))
    added = 0.0                      # latency every branch adds once
    if not (np.ndim(extra_latency_per_log2_s) == 0 and extra_latency_per_log2_s == 0.0):
        added = 2.0 * lg * _a(extra_latency_per_log2_s)
    across = 0.0                     # per-byte cost of the inter-domain all-reduce
    spans = n_dom is not None and bool(np.any(n_dom > 1.0))
    if spans:
        # log2(1) = 0 and (1 - 1) = 0: a group inside one domain adds nothing
        added = added + 2.0 * (lg_g - lg) * _a(p["a2a_scaleout_latency_s"])
        across = 2.0 * (n_dom - 1.0) / n_dom / inner \
            / (_a(scaleout_bw_bytes_per_s) * _a(p["a2a_scaleout_fraction"]))
    nccl = {k: _a(p[k]) for k in AR_NCCL_KEYS}
    cust = {k: _a(p[k]) for k in AR_CUSTOM_KEYS} if custom else {}
    # (the output broadcasts over every input: a compact batch's columns may be length 1)
    lat, spb = _out(4 if custom else 2, g, inner, link_bw_bytes_per_s, added, across,
                    *nccl.values(), *cust.values())
    nccl_allreduce_branches(inner, link_bw_bytes_per_s, **nccl, added_latency_s=added,
                            log2_group=lg, out=(lat[:2], spb[:2]))
    if custom:
        custom_allreduce_branches(inner, link_bw_bytes_per_s, **cust, added_latency_s=added,
                                  log2_group=lg, out=(lat[2:], spb[2:]))
    if spans:
        spb += across
        if custom:                   # (an added infinity: faster than a masked copy)
            lat[2:] += np.asarray(np.where(n_dom > 1.0, np.inf, 0.0), dtype=lat.dtype)
    # one rank: no collective (the per-byte costs are 0 there already: (g - 1) factors)
    lat *= np.asarray(g > 1.0, dtype=lat.dtype)
    return lat, spb


def allreduce_rule(group, oneshot_below_2_bytes, oneshot_below_4_bytes, oneshot_below_bytes):
    """A runtime's all-reduce selection by message size over the four branches of
    :func:`allreduce_branches` (NCCL LL, NCCL Simple, one-shot, two-shot): ``(below_bytes,
    rule)``, one-shot for messages below ``below_bytes``, NCCL (the faster protocol) from there
    on, two-shot never, where ``rule`` is 1; the fastest branch where it is 0 (a threshold of 0:
    no rule). ``below_bytes`` is the first threshold for ``g <= 2`` ranks, the second for
    ``g <= 4``, the third beyond.

    Example (TensorRT-LLM v0.14-v0.17, thresholds 16e6 / 1e6 / 5e5): ``g = 8`` and a 2 MB
    message runs NCCL even where two-shot would be faster; ``g = 2`` and 8 MB runs one-shot.
    """
    g = _a(group)
    ts = [_a(x) for x in (oneshot_below_2_bytes, oneshot_below_4_bytes, oneshot_below_bytes)]
    if all(np.size(x) == 1 for x in ts) and np.ndim(g) == 1:
        # one threshold each (a compact batch's constant columns): a table lookup by group
        # class (0: g <= 2, 1: g <= 4, 2: beyond) instead of two selections over the designs
        table = np.array([np.ravel(x)[0] for x in ts], dtype=np.result_type(*ts))
        t = table[2 - (g <= 2.0).view(np.int8) - (g <= 4.0).view(np.int8)]
    else:
        t = np.where(g <= 2.0, ts[0], np.where(g <= 4.0, ts[1], ts[2]))
    rule = (t > 0.0).astype(t.dtype)
    return np.where(t > 0.0, t, np.inf), rule


def allreduce_s(message_bytes, group, link_bw_bytes_per_s, **kw) -> np.ndarray:
    """All-reduce time (s): ``min`` over the branches of :func:`allreduce_branches`.

    Hand-worked: g = 8, W = 450 GB/s, ``ar_nccl_fraction`` = 0.9, per-doubling 1, bulk latency
    30 us, per-log2 latency 3 us, B = 1 GB -> 30 us + 9 us + 1e9 * 2*7/8 / 405e9 = 4.360 ms;
    at B = 1 kB the LL branch's ``ar_nccl_latency_s + 3 * ar_nccl_latency_per_log2_s`` (~ 15 us
    on H100) or the custom one-shot latency (~ 4 us) wins: small messages are latency-bound.
    """
    lat, spb = allreduce_branches(group, link_bw_bytes_per_s, **kw)
    b = _a(message_bytes)
    pad = (1,) * max(np.ndim(b) - (lat.ndim - 1), 0)
    lat = lat.reshape(lat.shape[:1] + pad + lat.shape[1:])
    spb = spb.reshape(spb.shape[:1] + pad + spb.shape[1:])
    return np.min(lat + spb * b, axis=0)


def _hit_probability(experts, topk, *shares):
    """P(a token's ``topk`` distinct experts, drawn from ``experts``, include at least one of the
    ``experts * share`` experts of one rank/node) = 1 - prod_{i<k} (E - E s - i) / (E - i),
    one array per share."""
    e = _a(experts)
    k = _a(topk)
    ms = [e * _a(s) for s in shares]
    dtype = np.result_type(e, *ms, 1.0)
    misses = [np.ones(np.broadcast(e, k, m).shape, dtype=dtype) for m in ms]
    for i in range(int(np.max(k)) if np.size(k) else 0):
        # (E - m - i) / (E - i) = 1 - m / (E - i), at least 0; draws past a row's own top-k
        # multiply by 1 (w = 0)
        w = (k > i) / np.maximum(e - i, 1.0)
        for m, miss in zip(ms, misses):
            t = np.asarray(m * w)
            np.subtract(1.0, t, out=t)
            miss *= np.maximum(t, 0.0, out=t)
    return [1.0 - miss for miss in misses]


def alltoall_bytes(tokens, hidden, topk, experts, ep, ranks_per_node, elem_bytes, kind="normal"):
    """(scale-up bytes, scale-out bytes) one rank sends in one dispatch (or receives in one
    combine); see the module docstring. ``kind`` ``"normal"`` deduplicates per destination rank
    (NVLink) and per destination node (RDMA); ``"ll"`` sends one message per (token, expert).

    Hand-worked (T = 128, h = 7168, fp8 1.03125 B, k = 8, E = 256, ep = 32, R = 8, N = 4):
    one token row is 7392 B; ll: scale-out 8 * 3/4 = 6 copies -> 128*7392*6 = 5.68 MB,
    scale-up 8 * 7/32 = 1.75 copies; normal: p_node = 1 - prod_{i<8} (192-i)/(256-i) = 0.9036,
    scale-out 3 * 0.9036 = 2.71 copies -> 2.56 MB (2.2x less than without dedup).
    """
    t = _a(tokens) * _a(hidden) * _a(elem_bytes)
    ep = np.maximum(_a(ep), 1.0)
    r = np.minimum(_a(ranks_per_node), ep)
    n = ep / r
    if kind == "ll":
        k = _a(topk)
        up = t * k * (r - 1.0) / ep
        out = t * k * (n - 1.0) / n
    elif kind == "normal":
        p_rank, p_node = _hit_probability(experts, topk, 1.0 / ep, 1.0 / n)
        up = t * (r - 1.0) * p_rank
        out = t * (n - 1.0) * p_node
    else:
        raise ValueError(f"kind must be 'll' or 'normal', not {kind!r}")
    return up, out


def alltoall_rate_s(hidden, topk, experts, elem_bytes, up_bytes, out_bytes, *, kind="normal",
                    message_s=0.0, expert_bytes_per_s=np.inf):
    """Seconds per token of the kernels' issue rate (module docstring), from the per-token
    bytes of :func:`alltoall_bytes` (``tokens = 1``): normal ``(1 + (up + out) / row) *
    message_s`` (``row = h eb``: the messages of one token), ll ``h eb k / (E
    expert_bytes_per_s)``.

    Hand-worked (h = 7168, bf16, k = 8, E = 256, one node of 8, p_rank = 0.6618 -> 1 + 7 p_rank
    = 5.633 messages): normal at 20 ns a message 112.7 ns a token; ll at 1 GB/s an expert
    7168 * 2 * 8 / 256e9 = 448 ns a token (E = 8: 32x that)."""
    if kind == "ll":
        return _a(hidden) * _a(elem_bytes) * _a(topk) / (
            np.maximum(_a(experts), 1.0) * _a(expert_bytes_per_s))
    row = np.maximum(_a(hidden) * _a(elem_bytes), 1e-30)
    return (1.0 + (up_bytes + out_bytes) / row) * _a(message_s)


def alltoall_coef(tokens, hidden, topk, experts, ep, ranks_per_node, elem_bytes,
                  scaleup_bw_bytes_per_s, scaleout_bw_bytes_per_s, *, latency_s, fraction,
                  a2a_scaleout_latency_s, a2a_scaleout_fraction, kind="normal", message_s=0.0,
                  expert_bytes_per_s=np.inf):
    """``(latency_s, seconds_per_token)``: the phase's time is affine in tokens,
    ``latency_s + seconds_per_token * tokens`` (the bytes are linear in ``tokens``);
    ``message_s`` (normal) and ``expert_bytes_per_s`` (ll): the issue-rate terms (defaults:
    none)."""
    up, out = alltoall_bytes(1.0, hidden, topk, experts, ep, ranks_per_node, elem_bytes, kind)
    ep_ = np.maximum(_a(ep), 1.0)
    spans = ep_ / np.minimum(_a(ranks_per_node), ep_) > 1.0
    t_up = up / (_a(scaleup_bw_bytes_per_s) * _a(fraction))
    t_out = out / (_a(scaleout_bw_bytes_per_s) * _a(a2a_scaleout_fraction))
    rate = alltoall_rate_s(hidden, topk, experts, elem_bytes, up, out, kind=kind,
                           message_s=message_s, expert_bytes_per_s=expert_bytes_per_s)
    lat = _a(latency_s) + np.where(spans, _a(a2a_scaleout_latency_s), 0.0)
    on = _a(ep) > 1.0
    return np.where(on, lat, 0.0), np.where(on, np.maximum(t_up, t_out) + rate, 0.0)


def alltoall_s(tokens, hidden, topk, experts, ep, ranks_per_node, elem_bytes,
               scaleup_bw_bytes_per_s, scaleout_bw_bytes_per_s, *, latency_s, fraction,
               a2a_scaleout_latency_s, a2a_scaleout_fraction, kind="normal", message_s=0.0,
               expert_bytes_per_s=np.inf) -> np.ndarray:
    """One EP dispatch or combine (s); pass the kind's and phase's ``a2a_<kind>_<phase>_*``
    values as ``latency_s`` and ``fraction``.

    Hand-worked (H800-like: W = 200 GB/s, fraction 0.8, S = 50 GB/s, scale-out fraction 0.9,
    latency 30 us, scale-out latency 10 us, normal, T = 4096, h = 7168, fp8 (7392 B a row),
    k = 8, E = 256, ep = 32, R = 8): scale-out bytes = 4096 * 7392 * 3 * 0.9036 = 82.1 MB ->
    82.1e6 / 45e9 = 1.824 ms; scale-up bytes = 4096 * 7392 * 7 * 0.2271 = 48.1 MB -> 0.301 ms;
    t = 30 us + 10 us + max(...) = 1.864 ms.
    """
    lat, spt = alltoall_coef(tokens, hidden, topk, experts, ep, ranks_per_node, elem_bytes,
                             scaleup_bw_bytes_per_s, scaleout_bw_bytes_per_s,
                             latency_s=latency_s, fraction=fraction,
                             a2a_scaleout_latency_s=a2a_scaleout_latency_s,
                             a2a_scaleout_fraction=a2a_scaleout_fraction, kind=kind,
                             message_s=message_s, expert_bytes_per_s=expert_bytes_per_s)
    return lat + spt * _a(tokens)


def phase_params(p, kind: str, phase: str) -> dict:
    """The keyword arguments of :func:`alltoall_s` for one kind and phase from a catalog entry
    (an entry without the issue-rate key of the kind: none)."""
    rate = {"ll": ("expert_bytes_per_s", np.inf), "normal": ("message_s", 0.0)}[kind]
    return {"latency_s": p[f"a2a_{kind}_{phase}_latency_s"],
            "fraction": p[f"a2a_{kind}_{phase}_fraction"],
            "a2a_scaleout_latency_s": p["a2a_scaleout_latency_s"],
            "a2a_scaleout_fraction": p["a2a_scaleout_fraction"], "kind": kind,
            rate[0]: p.get(f"a2a_{kind}_{phase}_{rate[0]}", rate[1])}
