"""KV memory tiers and prefix caching (dse/perf/kvtier.py): capacity, the per-step link time,
the shared prefix, and the property that a tier never slows a design that fits in HBM."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch, one

from dse.perf import score

L70 = {"accelerator.id": "h100-sxm", "model.id": "llama-3.1-70b", "model.weight_dtype": "fp8",
       "layout.tp": 4, "workload.isl": 2048, "workload.osl": 256, "workload.concurrency": 64}
# Llama 3.1 70B fp8 KV on tp 4: 2 of 8 KV heads x 128 x 2 (K, V) x 1 byte per layer = 512 B
KV_TOKEN_LAYER_CHIP = 2 * 128 * 2 * 1.0


@pytest.mark.parametrize("design", [
    L70,
    {**L70, "workload.prefix_hit_fraction": 0.6},
    {"accelerator.id": "gb200", "model.id": "deepseek-v3", "model.weight_dtype": "fp8",
     "layout.dp": 8, "layout.ep": 8, "workload.concurrency": 512},
])
def test_a_tier_never_slows_a_design_that_fits_in_hbm(design):
    a, b = one(design), one({**design, "serving.kv_offload": "host"})
    assert a["feasible"] and b["feasible"]
    for k in ("tpot_s", "ttft_s", "usd_per_mtok_output", "usd_per_mtok_input",
              "hbm_used_fraction"):
        assert b[k] == pytest.approx(a[k], rel=1e-12), k
    assert b["kv_offloaded_fraction"] == 0.0
    assert b["max_concurrent_sequences"] > a["max_concurrent_sequences"]


def test_host_tier_capacity_and_link_time_by_hand():
    long = {**L70, "workload.isl": 32768, "workload.osl": 1024, "workload.phase": "decode"}
    hbm = one(long)
    c_hbm = hbm["max_concurrent_sequences"]
    c = 2 * c_hbm
    off = one({**long, "workload.concurrency": c})
    assert not off["feasible"]                           # the KV does not fit in HBM
    on = one({**long, "workload.concurrency": c, "serving.kv_offload": "host"}, ideal=True)
    assert on["feasible"]
    assert on["kv_offloaded_fraction"] == pytest.approx(0.5, rel=1e-12)
    # half the sequences' KV comes over PCIe Gen5 (64 GB/s) every step: the mean context
    # 32768 + 512 tokens x 80 layers x 512 B on each chip, for c sequences
    link = 0.5 * c * (32768 + 512) * 80 * KV_TOKEN_LAYER_CHIP / 64e9
    assert on["tpot_s"] == pytest.approx(link, rel=1e-9)  # the link, not HBM, sets the step
    # a faster link (NVLink-C2C class) is worth it exactly in proportion
    fast = one({**long, "workload.concurrency": c, "serving.kv_offload": "host",
                "accelerator.host_link_bw_bytes_per_s": 256e9}, ideal=True)
    assert fast["tpot_s"] == pytest.approx(link / 4, rel=1e-9)


def test_the_tier_stops_helping_as_context_grows():
    # cost per output token vs context at the largest concurrency each variant fits: the tier
    # buys concurrency, its link taxes every step; the ratio (tier / HBM-only) rises with
    # context while the HBM-only step still reads the weights, then levels off once both steps
    # are KV reads (HBM vs the link), below the bandwidth bound: with 3/4 of 4c sequences'
    # KV over the link and the HBM-only step reading c sequences' KV at most at full HBM
    # bandwidth, ratio <= (3c K / link) / (4 c K / hbm) = 0.75 hbm / link
    rows = []
    for isl in (8192, 32768, 131072):
        d = {**L70, "workload.isl": isl, "workload.osl": 1024, "workload.phase": "decode"}
        c = one(d)["max_concurrent_sequences"]
        rows += [{**d, "workload.concurrency": c},
                 {**d, "workload.concurrency": 4 * c, "serving.kv_offload": "host"}]
    s = score(batch(rows))
    usd = s["usd_per_mtok_output"].reshape(-1, 2)
    ratio = usd[:, 1] / usd[:, 0]
    assert ratio[0] > 1.0                     # the tier never pays on this chip and model
    assert ratio[1] > 1.05 * ratio[0]          # rises while the weights weigh in
    assert ratio[2] == pytest.approx(ratio[1], rel=0.05)   # then levels off
    assert np.all(ratio < 0.75 * 3.35e12 / 64e9)


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


def test_prefix_hits_cost_the_cheaper_of_fetch_and_recompute_once_offloading():
    d = {**L70, "workload.isl": 32768, "workload.osl": 1024, "workload.prefix_hit_fraction": 0.6,
         "serving.kv_offload": "host"}
    c = one({**d, "serving.kv_offload": "none"})["max_concurrent_sequences"]
    slow = one({**d, "workload.concurrency": 2 * c})
    fast = one({**d, "workload.concurrency": 2 * c,
                "accelerator.host_link_bw_bytes_per_s": 450e9})
    # fetching 19,661 tokens x 80 layers x 512 B: 0.81 GB per chip, 12.6 ms over PCIe,
    # 1.8 ms over NVLink-C2C; either is far cheaper than recomputing 19,661 prompt tokens
    assert slow["ttft_s"] > fast["ttft_s"]
    fetch = 0.6 * 32768 * 80 * KV_TOKEN_LAYER_CHIP
    assert slow["ttft_s"] - fast["ttft_s"] > 0.5 * (fetch / 64e9 - fetch / 450e9)


def test_rows_without_a_tier_are_untouched_beside_rows_with_one_in_float32():
    import numpy as np
    from dse.perf import score_chunked
    d = {**L70, "workload.isl": 32768, "workload.osl": 1024, "workload.concurrency": 80}
    b = batch([d, {**d, "serving.kv_offload": "host"}, {**d, "serving.kv_offload": "ssd"}])
    with np.errstate(all="raise"):
        s = score_chunked(b, dtype=np.float32)
    alone = one(d)
    assert s["tpot_s"][0] == pytest.approx(alone["tpot_s"], rel=1e-5)
    assert np.isfinite(s["tpot_s"]).all()
