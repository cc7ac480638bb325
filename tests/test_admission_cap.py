"""A closed loop above the runtime's running cap, worked by hand: C requests in flight, at most K
running (the memory fit or ``serving.max_batch_size`` per scheduler), the others waiting for a
slot (dse.perf.phases.admission_wait_s, dse.perf.memory_fit.running).

Llama-3.1-8B with every step compute-only, as in test_physics_composition (GEMMs at 1e15 FLOP/s,
HBM, attention and links infinitely fast, HBM large enough for any batch unless a test says
otherwise), so the running batch's step times are the ones that test works; here only how they
compose with the wait: a slot is held R = the running batch's loaded TTFT (no front end here)
plus the answer's other tokens; K slots finish K / R requests/s, so a client's cycle is C R / K.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch, design

from dse.perf import score
from dse.perf.phases import admission_wait_s

C, ISL, OSL = 64, 1024, 256


def _llama8b(**kw):
    return design(model="llama-3.1-8b", **{
        "model.weight_dtype": "bf16", "model.kv_dtype": "bf16", "layout.tp": 1,
        "serving.max_num_tokens": 8192, "workload.isl": ISL, "workload.osl": OSL,
        "cost.mode": "rental", **kw})


def _compute_only(d, hbm_bytes=1e15):
    b = batch(d, ideal=True).replace(
        matmul_flops_per_s=1e15, attn_matmul_flops_per_s=1e15, attn_flops_per_s=1e30,
        hbm_bw_bytes_per_s=1e30, hbm_capacity_bytes=hbm_bytes, scaleup_bw_bytes_per_s=1e30,
        scaleup_latency_s=0.0, scaleout_bw_bytes_per_s=1e30, scaleout_latency_s=0.0)
    return {k: v[0] for k, v in score(b).items()}


def test_admission_wait_by_enumeration():
    """10 clients, 4 slots, each held 2 s. Steady state: (10/4 - 1) x 2 = 3 s. The first 10,
    submitted at once: 4 start, the next 4 wait one hold (2 s), the last 2 two holds (4 s):
    (4 x 2 + 2 x 4) / 10 = 1.6 s on average over the 10. A tenth of the requests are the
    first: 0.1 x 1.6 + 0.9 x 3 = 2.86 s."""
    assert admission_wait_s(10.0, 4.0, 2.0, 0.0) == pytest.approx(3.0, rel=1e-12)
    assert admission_wait_s(10.0, 4.0, 2.0, 1.0) == pytest.approx(1.6, rel=1e-12)
    assert admission_wait_s(10.0, 4.0, 2.0, 0.1) == pytest.approx(2.86, rel=1e-12)
    # every client runs: no wait, whatever the hold
    assert np.all(admission_wait_s(np.array([4.0, 3.0]), 4.0, 2.0, 0.5) == 0.0)


@pytest.mark.parametrize("n_requests", [0, C])
def test_a_running_cap_below_concurrency_queues_for_a_slot(n_requests):
    """C = 64 clients on a runtime that runs 16 (max_batch_size): the 16 run as a batch of 16
    does (the same steps, TPOT and tokens/s; its prompt queue's burst weighed by 16 of the 640
    requests sent), and each request first waits for a slot. R = TTFT_16 + 255 x TPOT_16; 48
    wait behind 16 slots: steady 3 R; the first 64: 16 wait R, 16 2R, 16 3R, 1.5 R on average.
    With 640 requests (0: 10 x 64) 0.1 x 1.5 R + 0.9 x 3 R = 2.85 R; with 64, the burst alone."""
    n_sent = n_requests or 10 * C
    capped = _compute_only(_llama8b(**{"workload.concurrency": C, "serving.max_batch_size": 16,
                                       "workload.num_requests": n_requests}))
    ref = _compute_only(_llama8b(**{"workload.concurrency": 16, "serving.max_batch_size": 16,
                                    "workload.num_requests": n_sent}))
    assert capped["tpot_s"] == pytest.approx(ref["tpot_s"], rel=1e-12)
    assert capped["output_tokens_per_s_per_chip"] == pytest.approx(
        ref["output_tokens_per_s_per_chip"], rel=1e-12)
    assert capped["ttft_unloaded_s"] == pytest.approx(ref["ttft_unloaded_s"], rel=1e-12)
    hold = ref["ttft_s"] + (OSL - 1) * ref["tpot_s"]
    factor = 2.85 if n_requests == 0 else 1.5
    assert capped["ttft_s"] == pytest.approx(ref["ttft_s"] + factor * hold, rel=1e-9)
    if n_requests == 0:
        # 16 decodes and on average 16 x 1024 / 256 prompt tokens a step: 0.0625 of the steps
        # carry a whole prompt, 14.5 ms, the others 0.24 ms: TPOT 1.13 ms; R = 33 ms + 255 x
        # 1.13 ms = 0.322 s; TTFT 33 ms + 2.85 x 0.322 s = 0.951 s
        assert ref["tpot_s"] == pytest.approx(1.1336e-3, rel=1e-3)
        assert hold == pytest.approx(0.3222, rel=1e-3)
        assert capped["ttft_s"] == pytest.approx(0.9513, rel=1e-3)
    # the design cannot run its 64 at once: still infeasible (max_batch_size, bit 32)
    assert not capped["feasible"] and int(capped["reason"]) & 32
    assert capped["concurrency"] == C and capped["max_concurrent_sequences"] == 16


def test_a_cap_that_does_not_bind_changes_nothing():
    """max_batch_size = C: every request runs at once, the same numbers as without a cap."""
    at = _compute_only(_llama8b(**{"workload.concurrency": C, "serving.max_batch_size": C}))
    free = _compute_only(_llama8b(**{"workload.concurrency": C,
                                     "serving.max_batch_size": 100000}))
    for k in ("ttft_s", "ttft_unloaded_s", "tpot_s", "output_tokens_per_s_per_chip"):
        assert at[k] == free[k]
    assert at["feasible"]


def test_the_memory_fit_caps_the_running_batch():
    """Without a max_batch_size cap, HBM sets it: 24 GB per chip less 16.06 GB of bf16 weights
    (8.03 B parameters) and 2 GB of runtime reserve leaves 5.94 GB; a sequence takes its
    1280 tokens' KV (128 KiB each: 167.8 MB) over the 0.9 the KV cache gets, 186.4 MB, and
    5 tokens' activations a step (1 + 1024 / 256) of 578,560 B (hidden x 16 + vocab x 4): 31
    of the 64 run (5.94 GB / 189.3 MB = 31.4), the others queue as above, at the running
    batch's steps."""
    capped = _compute_only(_llama8b(**{"workload.concurrency": C,
                                       "serving.max_batch_size": 100000}), hbm_bytes=24e9)
    k = capped["max_concurrent_sequences"]
    assert k == 31
    ref = _compute_only(_llama8b(**{"workload.concurrency": k,
                                    "workload.num_requests": 10 * C,
                                    "serving.max_batch_size": 100000}), hbm_bytes=24e9)
    assert capped["tpot_s"] == pytest.approx(ref["tpot_s"], rel=1e-12)
    hold = ref["ttft_s"] + (OSL - 1) * ref["tpot_s"]
    q = C - k
    w = np.floor(q / k)
    burst = (k * w * (w + 1) / 2 + (q - w * k) * (w + 1)) / C
    wait = 0.1 * burst * hold + 0.9 * q / k * hold
    assert capped["ttft_s"] == pytest.approx(ref["ttft_s"] + wait, rel=1e-9)
    assert int(capped["reason"]) & 16
