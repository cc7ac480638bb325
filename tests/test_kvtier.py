"""KV memory tiers and prefix caching (dse/perf/kvtier.py): running sequences' KV stays in HBM,
the prefix cache holds the waiting conversations' prefixes in free HBM, then in the tier, a hit
held in the tier is fetched once (or recomputed, whichever is cheaper), evicted hits are
recomputed; the shared prefix; and a tier never slows a design."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch, one

from dse.perf import kvtier, score

L70 = {"accelerator.id": "h100-sxm", "model.id": "llama-3.1-70b", "model.weight_dtype": "fp8",
       "layout.tp": 4, "workload.isl": 2048, "workload.osl": 256, "workload.concurrency": 64}
# Llama 3.1 70B fp8 KV on tp 4: 2 of 8 KV heads x 128 x 2 (K, V) x 1 byte per layer = 512 B
KV_TOKEN_LAYER_CHIP = 2 * 128 * 2 * 1.0
LONG = {**L70, "workload.isl": 32768, "workload.osl": 1024, "workload.prefix_hit_fraction": 0.5}
KEYS = ("tpot_s", "ttft_s", "usd_per_mtok_output", "usd_per_mtok_input")


def _free_kv_bytes(m, hbm=85.5e9, reserve=2e9, frac=0.9):      # H100 SXM HBM (catalog)
    """The KV pool HBM has left at this concurrency, from the design's own outputs."""
    act = m["hbm_used_fraction"] * hbm - m["weights_bytes_per_chip"] - reserve \
        - m["kv_bytes_per_chip"]
    return (hbm - reserve - m["weights_bytes_per_chip"] - act) * frac - m["kv_bytes_per_chip"]


@pytest.mark.parametrize("design", [
    L70,
    {**L70, "workload.prefix_hit_fraction": 0.6, "workload.cached_conversations": 64},
    {**LONG, "workload.concurrency": 16, "workload.cached_conversations": 256},
    {**LONG, "workload.concurrency": 16, "workload.cached_conversations": 256,
     "accelerator.host_link_bw_bytes_per_s": 1e6},          # a link slower than recomputing
    {"accelerator.id": "gb200", "model.id": "deepseek-v3", "model.weight_dtype": "fp8",
     "layout.dp": 8, "layout.ep": 8, "workload.concurrency": 512,
     "workload.prefix_hit_fraction": 0.5, "workload.cached_conversations": 20000},
])
def test_a_tier_never_slows_a_design(design):
    a = one(design)
    for mode in ("host", "ssd"):
        b = one({**design, "serving.kv_offload": mode})
        assert a["feasible"] and b["feasible"]
        for k in KEYS:
            assert b[k] <= a[k] * (1 + 1e-12), (mode, k)
        # running sequences keep their KV in HBM: the tier does not buy concurrency
        assert b["max_concurrent_sequences"] == a["max_concurrent_sequences"]
        assert b["hbm_used_fraction"] == a["hbm_used_fraction"]


def test_a_design_whose_cache_fits_in_hbm_is_untouched_by_a_tier():
    d = {**L70, "workload.prefix_hit_fraction": 0.6, "workload.cached_conversations": 64}
    a, b = one(d), one({**d, "serving.kv_offload": "host"})
    assert a["prefix_cache_evicted_fraction"] == 0.0 and b["kv_offloaded_fraction"] == 0.0
    for k in KEYS:
        assert b[k] == a[k], k
    # and with every hit held, the design scores as dse's model before the prefix cache
    free = one({**L70, "workload.prefix_hit_fraction": 0.6})
    for k in KEYS:
        assert a[k] == pytest.approx(free[k], rel=1e-12), k


def test_the_cache_fills_free_hbm_then_the_tier_by_hand():
    d = {**LONG, "workload.concurrency": 16, "workload.cached_conversations": 256}
    off = one(d)
    free = _free_kv_bytes(off)
    # each waiting conversation keeps 0.5 x 32768 = 16384 tokens x 80 layers x 512 B per chip
    need = 256 * 16384 * 80 * KV_TOKEN_LAYER_CHIP
    assert free < need
    assert 1 - off["prefix_cache_evicted_fraction"] == pytest.approx(free / need, rel=1e-9)
    on = one({**d, "serving.kv_offload": "host"})
    host = 250e9                                # DGX H100: 2 TB for 8 GPUs (memory_tiers.toml)
    assert on["kv_offloaded_fraction"] == pytest.approx(min(host, need - free) / need, rel=1e-9)
    assert on["prefix_cache_evicted_fraction"] == pytest.approx(
        max(1 - free / need - host / need, 0.0), abs=1e-12)


def test_a_shared_prefix_leaves_the_cache_its_other_copies_by_hand():
    """A 4096-token shared prefix is stored once: of the 16 running sequences' copies, 15 leave
    the KV pool (16 x 4096 tokens fewer in the sequences, one 4096-token copy more), 15 x 4096
    tokens x 80 layers x 512 B = 2.516 GB per chip, so the waiting conversations' cache (need:
    256 x 16384 x 80 x 512 B = 171.8 GB) holds 15 x 4096 / (256 x 16384) = 1.465% more of
    them (the prefix neither changes a hit nor the activations)."""
    d = {**LONG, "workload.concurrency": 16, "workload.cached_conversations": 256}
    a, b = one(d), one({**d, "workload.prefix_tokens": 4096})
    assert a["prefix_cache_evicted_fraction"] - b["prefix_cache_evicted_fraction"] \
        == pytest.approx(15 * 4096 / (256 * 16384), rel=1e-9)
    assert a["kv_bytes_per_chip"] - b["kv_bytes_per_chip"] \
        == pytest.approx(16 * 4096 * 80 * KV_TOKEN_LAYER_CHIP, rel=1e-9)


def test_evicted_hits_are_recomputed():
    # far more waiting conversations than HBM holds: almost every hit is evicted and the design
    # prefills like one without a prefix cache
    d = {**LONG, "workload.concurrency": 16, "workload.cached_conversations": 1e9}
    a, cold = one(d), one({**LONG, "workload.concurrency": 16, "workload.prefix_hit_fraction": 0})
    assert a["prefix_cache_evicted_fraction"] == pytest.approx(1.0, abs=1e-6)
    assert a["ttft_s"] == pytest.approx(cold["ttft_s"], rel=1e-5)
    assert a["usd_per_mtok_input"] == pytest.approx(cold["usd_per_mtok_input"], rel=1e-5)


def test_a_hit_held_in_the_tier_is_fetched_once_over_its_link_by_hand():
    b = batch({**LONG, "serving.kv_offload": "host"})
    tokens = np.array([16384.0])
    t, fetched = kvtier.tier_hit(b, tokens, np.array([1e-3]))
    # 16384 tokens x 80 layers x 512 B = 0.67 GB over PCIe Gen5 (64 GB/s per direction)
    assert bool(fetched[0])
    assert float(t[0]) == pytest.approx(16384 * 80 * KV_TOKEN_LAYER_CHIP / 64e9, rel=1e-12)
    # a 20% faster link is a 20% shorter fetch; a link slower than recomputing is not used
    fast = batch({**LONG, "serving.kv_offload": "host",
                  "accelerator.host_link_bw_bytes_per_s": 1.2 * 64e9})
    assert float(kvtier.tier_hit(fast, tokens, np.array([1e-3]))[0][0]) \
        == pytest.approx(float(t[0]) / 1.2, rel=1e-12)
    t2, fetched2 = kvtier.tier_hit(b, tokens, np.array([1e-9]))
    assert not bool(fetched2[0]) and float(t2[0]) == pytest.approx(16384 * 1e-9, rel=1e-12)


def test_fetching_beats_recomputing_in_ttft_and_a_faster_link_more():
    d = {**LONG, "workload.concurrency": 16, "workload.cached_conversations": 256}
    none, pcie = one(d), one({**d, "serving.kv_offload": "host"})
    c2c = one({**d, "serving.kv_offload": "host", "accelerator.host_link_bw_bytes_per_s": 450e9})
    assert c2c["ttft_s"] < pcie["ttft_s"] < none["ttft_s"]
    # the TTFT a fetch adds over an all-held cache is at least the fetch of the tier's share
    held = one({**d, "workload.cached_conversations": 0})
    share = pcie["kv_offloaded_fraction"]
    fetch = share * 16384 * 80 * KV_TOKEN_LAYER_CHIP / 64e9
    assert pcie["ttft_unloaded_s"] - held["ttft_unloaded_s"] >= fetch * (1 - 1e-9)


def test_nvme_holds_more_but_fetches_slower_than_host_memory():
    d = {**LONG, "workload.concurrency": 16, "workload.cached_conversations": 4096}
    host, ssd = one({**d, "serving.kv_offload": "host"}), one({**d, "serving.kv_offload": "ssd"})
    # DGX H100: 250 GB of host DRAM vs one 3.84 TB NVMe drive per GPU (memory_tiers.toml)
    assert ssd["prefix_cache_evicted_fraction"] < host["prefix_cache_evicted_fraction"]
    assert ssd["kv_offloaded_fraction"] > host["kv_offloaded_fraction"]


def test_shared_prefix_is_stored_once():
    d = {**L70, "workload.isl": 8192, "workload.osl": 512}
    a, b = one(d), one({**d, "workload.prefix_tokens": 4096})
    # per sequence: 8192 + 512 tokens -> 4096 + 512 tokens of KV, plus one 4096-token copy
    per_token = 80 * KV_TOKEN_LAYER_CHIP
    assert a["kv_bytes_per_chip"] == pytest.approx(64 * 8704 * per_token, rel=1e-9)
    assert b["kv_bytes_per_chip"] == pytest.approx(64 * 4608 * per_token, rel=1e-9)
    assert b["max_concurrent_sequences"] > 1.8 * a["max_concurrent_sequences"]
    # attention still reads the whole context: decoding is not faster
    assert b["tpot_s"] == a["tpot_s"]


def test_rows_without_a_tier_are_untouched_beside_rows_with_one_in_float32():
    from dse.perf import score_chunked
    d = {**LONG, "workload.concurrency": 16}
    c = {**d, "workload.cached_conversations": 256}
    b = batch([d, {**c, "serving.kv_offload": "host"}, {**c, "serving.kv_offload": "ssd"}])
    with np.errstate(all="raise"):
        s = score_chunked(b, dtype=np.float32)
    alone = one(d)
    assert s["tpot_s"][0] == pytest.approx(alone["tpot_s"], rel=1e-5)
    assert np.isfinite(s["tpot_s"]).all()
    assert np.isnan(score(batch(d))["kv_offloaded_fraction"]).all()     # off: not a number


def test_rows_that_recompute_their_tier_score_as_without_it_beside_rows_that_fetch():
    """Where the link is slower than recomputing, a row scores as without its tier (the runtime
    keeps no hits there). Only those rows are scored again (tier_split.recomputing), so beside
    rows that fetch they get, bitwise, the numbers of the same rows without a tier: in the whole
    model and in the request-rate path's queue times, at one or several concurrencies a row."""
    from dse.perf import queue_probe
    from dse.perf.step import Coefficients
    c = {**LONG, "workload.concurrency": 16, "workload.cached_conversations": 256,
         "serving.kv_offload": "host"}
    slow = {**c, "accelerator.host_link_bw_bytes_per_s": 1e6}
    b = batch([c, slow, c, slow, c])
    b = b.replace(concurrency=np.array([16.0, 16.0, 64.0, 32.0, 8.0]))
    recompute = np.array([False, True, False, True, False])
    tier = np.broadcast_to(b.tier_bytes, (5,))
    off = b.replace(tier_bytes=np.where(recompute, 0.0, tier))
    m, ref, fetch = score(b), score(off), score(b.replace(tier_bytes=0.0))
    for k, v in m.items():
        if np.asarray(v).dtype.kind == "f":
            np.testing.assert_array_equal(np.asarray(v)[recompute], np.asarray(ref[k])[recompute],
                                          err_msg=k)
    # the fetching rows do use their tier (the batch mixes both kinds)
    assert np.all(m["ttft_s"][~recompute] < fetch["ttft_s"][~recompute])
    cc = np.array([[4.0, 8.0, 16.0, 32.0, 64.0], [16.0, 24.0, 48.0, 12.0, 2.0]])
    for conc in (cc, cc[0]):
        got = queue_probe.queue_times(b.replace(concurrency=conc), Coefficients(b))
        want = queue_probe.queue_times(off.replace(concurrency=conc), Coefficients(off))
        for g, w in zip(got, want):
            g, w = np.broadcast_to(g, np.shape(conc)), np.broadcast_to(w, np.shape(conc))
            np.testing.assert_array_equal(g[..., recompute], w[..., recompute])


def test_a_probes_later_passes_score_recomputing_rows_by_their_tier_off_twins():
    """Once a row recomputed its tier's hits in a pass of the request-rate path's probe, the
    rows the probe takes later carry a twin of it without its tier, scored in the same pass
    (queue_probe.probe): bitwise the numbers of those rows without a tier where they
    recompute, of the rows themselves where they fetch, and no pass of their own."""
    from dse.perf import queue_probe, tier_split
    from dse.perf.step import Coefficients
    c = {**LONG, "workload.concurrency": 16, "workload.cached_conversations": 256,
         "serving.kv_offload": "host"}
    slow = {**c, "accelerator.host_link_bw_bytes_per_s": 1e6}
    b = batch([c, slow, c, slow, c])
    recompute = np.array([False, True, False, True, False])
    off = b.replace(tier_bytes=np.where(recompute, 0.0, np.broadcast_to(b.tier_bytes, (5,))))
    at = queue_probe.probe(b, Coefficients(b), np.float32)
    at(None)(np.full(5, 16.0, np.float32))           # rows 1 and 3 recompute: a pass of their own
    calls = []
    orig = tier_split.recomputing
    tier_split.recomputing = lambda *a: calls.append(1) or orig(*a)
    try:
        rows = np.array([1, 2, 3])
        cc = np.array([[4.0, 8.0, 16.0], [24.0, 48.0, 12.0]], np.float32)
        got = at(rows)(cc)
    finally:
        tier_split.recomputing = orig
    assert calls == []
    o32 = off.astype(np.float32).take(rows)
    want = queue_probe.queue_times(o32.replace(concurrency=cc), Coefficients(o32))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.broadcast_to(g, cc.shape), np.broadcast_to(w, cc.shape))
    # (the fetching row in between does use its tier)
    with_tier = queue_probe.queue_times(b.astype(np.float32).take(rows).replace(concurrency=cc),
                                        Coefficients(b.astype(np.float32).take(rows)))
    assert np.all(np.broadcast_to(got[0], cc.shape)[:, 1] < np.broadcast_to(
        queue_probe.queue_times(o32.replace(concurrency=cc, tier_bytes=0.0),
                                Coefficients(o32))[0], cc.shape)[:, 1])
    np.testing.assert_array_equal(np.broadcast_to(got[0], cc.shape)[:, 1],
                                  np.broadcast_to(with_tier[0], cc.shape)[:, 1])


def test_a_taken_batch_whose_row_first_recomputes_in_a_pass_carries_its_twin_after_it():
    """A row of a taken probe batch that first recomputes in one of its passes runs a pass of
    its own in that pass only: the probe takes the batch again with the row's tier-off twin
    (queue_probe.probe; dse.perf.roots' eighth pass: one of dse.bench's rows ran five such
    passes), and the numbers stay those of the row without its tier."""
    from dse.perf import queue_probe, tier_split
    from dse.perf.step import Coefficients
    c = {**LONG, "workload.concurrency": 16, "workload.cached_conversations": 256,
         "serving.kv_offload": "host"}
    slow = {**c, "accelerator.host_link_bw_bytes_per_s": 1e6}
    b = batch([c, slow, c, slow, c])
    at = queue_probe.probe(b, Coefficients(b), np.float32)
    rows = np.array([1, 2, 3])
    cc = np.array([[4.0, 8.0, 16.0], [24.0, 48.0, 12.0]], np.float32)
    times = at(rows)                   # taken before any row recomputed: no twins
    calls = []
    orig = tier_split.recomputing
    tier_split.recomputing = lambda *a: calls.append(1) or orig(*a)
    try:
        first = times(cc)              # rows 1 and 3 recompute: a pass of their own
        assert len(calls) == 1
        again = times(cc)              # their twins now ride in the pass
        assert len(calls) == 1
    finally:
        tier_split.recomputing = orig
    for f, g in zip(first, again):
        np.testing.assert_array_equal(np.broadcast_to(f, cc.shape), np.broadcast_to(g, cc.shape))


def test_a_pool_the_running_sequences_or_weights_overfill_has_no_room_not_negative_room():
    # the KV pool left for cached prefixes at 64 sequences of 1 GB each on an 85.5 GB H100 with
    # 2 GB reserved, 40 GB of weights and no activations: (85.5 - 2 - 40) x 0.9 = 39.15 GB
    # less 64 GB of KV is no room (0), never -24.85 GB (which would put a negative share of
    # the waiting prefixes in HBM and push more of them into the tier)
    b = batch(L70).replace(hbm_capacity_bytes=85.5e9, runtime_reserve_bytes=2e9,
                           kv_memory_fraction=0.9)
    free = kvtier.free_kv_bytes(b, 40e9, 1e9, 0.0, np.array([64.0]))
    assert float(free[0]) == 0.0
    free = kvtier.free_kv_bytes(b, 40e9, 1e9, 0.0, np.array([32.0]))
    assert float(free[0]) == pytest.approx(39.15e9 - 32e9, rel=1e-12)

