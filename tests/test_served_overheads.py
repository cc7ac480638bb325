"""The runtime's host times, exactly: the front end's time per request (``serving.
request_overhead_s``: in both TTFTs, once) and the scheduler's time per running sequence per
step (``serving.seq_overhead_s``: every step, per attention-DP rank), and where their defaults
come from (the runtime's fitted numbers, efficiency.toml [runtimes])."""

from __future__ import annotations

import pytest
from helpers import batch, design, one

from dse import catalog
from dse.perf import score

L8 = {"model.weight_dtype": "fp8", "layout.tp": 1, "workload.isl": 2048, "workload.osl": 512,
      "workload.concurrency": 32, "serving.runtime": "trtllm"}


def test_the_front_end_adds_its_time_to_both_ttfts_once():
    """0.1 s per request: the unloaded TTFT grows by exactly 0.1 s, the steps do not move, and
    the closed loop's TTFT by at least 0.1 s (a longer cycle only lowers the queue's load, by
    less than it adds)."""
    d = design(model="llama-3.1-8b", **L8)
    base = one(d, request_overhead_s=0.0)
    more = one(d, request_overhead_s=0.1)
    assert more["ttft_unloaded_s"] - base["ttft_unloaded_s"] == pytest.approx(0.1, rel=1e-9)
    assert more["tpot_s"] == pytest.approx(base["tpot_s"], rel=1e-12)
    assert 0.09 < more["ttft_s"] - base["ttft_s"] <= 0.1 + 1e-9


@pytest.mark.parametrize("dp", [1, 2])
def test_the_scheduler_pays_per_running_sequence_on_each_rank(dp):
    """20 us per sequence per step: a decode-only step of 32 sequences grows by 32 / dp x 20 us
    (each attention-DP rank schedules its own share), 640 us at dp = 1, 320 us at dp = 2; every
    step carries it, so the TPOT grows by the same."""
    d = design(model="qwen3-30b-a3b" if dp > 1 else "llama-3.1-8b",
               **{**L8, "layout.dp": dp, "layout.ep": dp, "workload.phase": "decode"})
    b = batch(d).replace(seq_overhead_s=0.0)
    _, s0 = score(b, breakdown=True)
    m0 = score(b)
    _, s1 = score(b.replace(seq_overhead_s=20e-6), breakdown=True)
    m1 = score(b.replace(seq_overhead_s=20e-6))
    added = 32 / dp * 20e-6
    assert s1.decode.total_s[0] - s0.decode.total_s[0] == pytest.approx(added, rel=1e-9)
    assert m1["tpot_s"][0] - m0["tpot_s"][0] == pytest.approx(added, rel=1e-9)


def test_a_blank_host_time_is_the_runtimes_fitted_one():
    """A design that leaves them blank gets its runtime's numbers (efficiency.toml [runtimes],
    merged into catalog.runtime_defaults); a given value wins, 0 included."""
    table = catalog.runtime_defaults()
    for rt in ("trtllm", "sglang", "vllm"):
        b = batch(design(model="llama-3.1-8b", **{**L8, "serving.runtime": rt}))
        assert b.request_overhead_s[0] == pytest.approx(table[rt].get("request_overhead_s", 0.0))
        assert b.seq_overhead_s[0] == pytest.approx(table[rt].get("seq_overhead_s", 0.0))
    b = batch(design(model="llama-3.1-8b", **{**L8, "serving.request_overhead_s": 0.0,
                                              "serving.seq_overhead_s": 3e-6}))
    assert b.request_overhead_s[0] == 0.0 and b.seq_overhead_s[0] == 3e-6


def test_a_disaggregated_ttft_pays_the_front_end_once():
    """A disaggregated request passes the front end once, not once per pool: 1.5 prefill passes +
    the KV move + the front end's 0.25 s."""
    d = design("gb200", "deepseek-v3", **{
        "topology.id": "nvl72", "model.weight_dtype": "fp8", "layout.tp": 1, "layout.ep": 32,
        "layout.dp": 32, "layout.prefill_ep": 8, "layout.prefill_dp": 8, "workload.isl": 2048,
        "workload.osl": 1024, "workload.concurrency": 2048, "workload.prefill_concurrency": 4,
        "serving.mode": "disaggregated"})
    base = one(d, request_overhead_s=0.0)
    more = one(d, request_overhead_s=0.25)
    assert more["ttft_s"] - base["ttft_s"] == pytest.approx(0.25, rel=1e-9)
    assert more["ttft_unloaded_s"] == more["ttft_s"]
