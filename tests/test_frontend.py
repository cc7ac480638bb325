"""The runtime's serial front end (dse.perf.frontend), by hand: its work per request, the TPOT it
bounds, the closed loop's queue for it (none with one client; a throughput of 1 / S with many),
and the request-rate path's saturation at most 1 / S."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers import design, one

from dse.perf import frontend

L8 = {"model.weight_dtype": "fp8", "layout.tp": 1, "workload.isl": 1000, "workload.osl": 100,
      "serving.runtime": "trtllm"}
OFF = {"request_overhead_s": 0.0, "frontend_prompt_token_s": 0.0, "frontend_token_s": 0.0,
       "frontend_text_token_s": 0.0, "frontend_request_s": 0.0}


def fe(**kw):
    return SimpleNamespace(**{"isl": 1000.0, "osl": 100.0, "frontend_prompt_token_s": 0.0,
                              "frontend_token_s": 0.0, "frontend_text_token_s": 0.0,
                              "frontend_request_s": 0.0, **kw})


def test_the_work_per_request_by_hand():
    """S = p isl + t osl + x osl (osl + 1) / 2: 2 us x 1000 + 50 us x 100 + 10 ns x 5050 =
    2 + 5 + 0.0505 ms; streaming alone 5.0505 ms."""
    b = fe(frontend_prompt_token_s=2e-6, frontend_token_s=50e-6, frontend_text_token_s=10e-9)
    assert frontend.stream_s(b) == pytest.approx(5.0505e-3, rel=1e-12)
    assert frontend.serial_s(b) == pytest.approx(7.0505e-3, rel=1e-12)


def test_a_stream_interval_streams_chunks_by_hand():
    """Every 10th token streamed (the first at once): n = (100 - 1) / 10 + 1 = 10.9 chunks, so
    t n + x n (osl + 1) / 2 = 50 us x 10.9 + 10 ns x 10.9 x 50.5 = 0.545 + 0.0055045 ms; at an
    interval of 1 the 100 tokens of the by-hand case above (5.0505 ms)."""
    b = fe(frontend_token_s=50e-6, frontend_text_token_s=10e-9, stream_interval=10.0)
    assert frontend.chunks(b) == pytest.approx(10.9, rel=1e-12)
    assert frontend.stream_s(b) == pytest.approx(0.5505045e-3, rel=1e-12)
    b1 = fe(frontend_token_s=50e-6, frontend_text_token_s=10e-9, stream_interval=1.0)
    assert frontend.chunks(b1) == 100.0
    assert frontend.stream_s(b1) == pytest.approx(5.0505e-3, rel=1e-12)


def test_a_recipes_stream_interval_reaches_the_model():
    """serving.stream_interval flows from a design to the batch (blank: the runtime's 1), and
    at 20 a 100-token answer goes out in 99 / 20 + 1 = 5.95 chunks."""
    from dse.build.designs import resolve, to_batch
    import pandas as pd
    rows = pd.DataFrame([{"accelerator.id": "h100-sxm", "model.id": "llama-3.1-8b", **L8},
                         {"accelerator.id": "h100-sxm", "model.id": "llama-3.1-8b", **L8,
                          "serving.stream_interval": 20}])
    b = to_batch(resolve(rows))
    assert list(b.stream_interval) == [1.0, 20.0]
    assert frontend.chunks(b)[1] == pytest.approx(99.0 / 20.0 + 1.0, rel=1e-12)


def test_the_work_per_request_with_a_fixed_part_by_hand():
    """S = r + p isl + t osl: 10 ms + 2 us x 1000 + 50 us x 100 = 17 ms, so at most 1 / 17 ms =
    58.8 requests/s; the streaming part (5 ms) alone does not see r."""
    b = fe(frontend_request_s=10e-3, frontend_prompt_token_s=2e-6, frontend_token_s=50e-6)
    assert frontend.serial_s(b) == pytest.approx(17e-3, rel=1e-12)
    assert frontend.stream_s(b) == pytest.approx(5e-3, rel=1e-12)


def test_the_burst_waits_for_the_others_fixed_work_by_hand():
    """The first C, submitted at once, wait for half the other requests' work before their
    first token: 0.5 x 2 x (10 ms + 1000 x 1 ms) = 1.01 s with three clients (streaming, done
    after the first token, not counted)."""
    b = fe(frontend_request_s=10e-3, frontend_prompt_token_s=1e-3, frontend_token_s=0.01)
    assert frontend.wait_s(b, 3.0, 2.0, 1.0) == pytest.approx(1.01, rel=1e-12)


def test_the_closed_loop_wait_by_hand():
    """Three clients, S = 1 s, each returning every 2 s plus its wait: W = 2 / (0 + sqrt(0 + 4))
    = 1 s, the M/D/1 mean wait at rho = 2 x 1 / (2 + 1) = 2/3 (rho S / (2 (1 - rho)) = 1 s);
    with one client no wait; the first C, submitted at once, wait for half the other prompts'
    tokenization (0.5 x 2 x 1000 x 1 ms = 1 s at p = 1 ms)."""
    b = fe(frontend_token_s=0.01)                        # S = 100 x 10 ms = 1 s
    assert frontend.wait_s(b, 3.0, 2.0, 0.0) == pytest.approx(1.0, rel=1e-12)
    rho = 2.0 / 3.0
    assert rho * 1.0 / (2.0 * (1.0 - rho)) == pytest.approx(1.0, rel=1e-12)
    assert frontend.wait_s(b, 1.0, 2.0, 0.0) == 0.0
    burst = fe(frontend_prompt_token_s=1e-3)
    assert frontend.wait_s(burst, 3.0, 2.0, 1.0) == pytest.approx(1.0, rel=1e-12)


def test_one_client_pays_the_tokenizer_once_and_never_queues():
    """C = 1: the TTFT (closed loop and unloaded) grows by exactly p x isl (5 us x 1000 = 5 ms),
    the TPOT not at all (one stream's 100 us per token is far below the step)."""
    d = design(model="llama-3.1-8b", **{**L8, "workload.concurrency": 1})
    base = one(d, **OFF)
    more = one(d, **{**OFF, "frontend_prompt_token_s": 5e-6, "frontend_token_s": 100e-6})
    assert more["ttft_s"] - base["ttft_s"] == pytest.approx(5e-3, rel=1e-6)
    assert more["ttft_unloaded_s"] - base["ttft_unloaded_s"] == pytest.approx(5e-3, rel=1e-6)
    assert more["tpot_s"] == pytest.approx(base["tpot_s"], rel=1e-12)


def test_one_client_pays_the_fixed_work_once_and_never_queues():
    """C = 1: the TTFT (closed loop and unloaded) grows by exactly r (20 ms), the TPOT not at
    all."""
    d = design(model="llama-3.1-8b", **{**L8, "workload.concurrency": 1})
    base = one(d, **OFF)
    more = one(d, **{**OFF, "frontend_request_s": 20e-3})
    assert more["ttft_s"] - base["ttft_s"] == pytest.approx(20e-3, rel=1e-6)
    assert more["ttft_unloaded_s"] - base["ttft_unloaded_s"] == pytest.approx(20e-3, rel=1e-6)
    assert more["tpot_s"] == pytest.approx(base["tpot_s"], rel=1e-12)


@pytest.mark.parametrize("term,value,stream_s", [
    ("frontend_token_s", 1e-3, 0.1),                    # 100 x 1 ms
    ("frontend_text_token_s", 2e-5, 0.101),             # 2e-5 x 100 x 101 / 2
])
def test_many_streams_get_tokens_at_the_front_ends_pace(term, value, stream_s):
    """64 streams of 100 tokens through one server that takes ``stream_s`` per answer: a token
    every 64 x stream_s / 100 seconds (64 ms, 64.64 ms), far above the engine's step; the
    instance delivers 64 / TPOT tokens/s."""
    d = design(model="llama-3.1-8b", **{**L8, "workload.concurrency": 64})
    m = one(d, **{**OFF, term: value})
    tpot = 64 * stream_s / 100
    assert one(d, **OFF)["tpot_s"] < 0.5 * tpot
    assert m["tpot_s"] == pytest.approx(tpot, rel=1e-9)
    assert m["output_tokens_per_s_per_instance"] == pytest.approx(64 / tpot, rel=1e-9)


@pytest.mark.parametrize("c", [256, 1024])
def test_many_clients_are_served_at_one_over_s(c):
    """Tokenizing dominates (S = 2 ms x 1000 = 2 s per request): in steady state (a benchmark
    of 1000 x C requests: the start-up burst, when the first C wait for half the others, is
    0.1% of them) the closed loop's cycle (TTFT + the other 99 tokens) tends to (C - 1/2) S
    (the M/D/1 wait at rho -> 1: (C - 1) S - cycle + S / 2), so C clients are served at 1 / S
    = 0.5 requests/s, C / (C - 1/2) of it (within 0.3%), whatever the GPU."""
    d = design(model="llama-3.1-8b", **{**L8, "workload.concurrency": c,
                                        "workload.num_requests": 1000 * c})
    m = one(d, **{**OFF, "frontend_prompt_token_s": 2e-3})
    cycle = m["ttft_s"] + 99 * m["tpot_s"]
    assert c / cycle == pytest.approx(0.5 * c / (c - 0.5), rel=3e-3)


def test_the_rate_path_saturates_at_most_at_one_over_s():
    """At a request rate the front end is the queue where it is busier than the prompt budget:
    S = 100 x 2 ms = 0.2 s, so the instance serves at most 5 requests/s, however many sequences
    fit."""
    d = design(model="llama-3.1-8b", **{**L8, "workload.concurrency": 1,
                                        "workload.request_rate_per_s": 1.0})
    base = one(d, **OFF)
    m = one(d, **{**OFF, "frontend_token_s": 2e-3})
    assert base["saturation_requests_per_s_per_instance"] > 10.0
    assert m["saturation_requests_per_s_per_instance"] <= 5.0 * (1 + 1e-6)
    assert m["saturation_requests_per_s_per_instance"] == pytest.approx(5.0, rel=0.05)


def test_a_negligible_front_end_scores_as_none():
    """The serial front end's code path with a negligible server (1 ps per token) gives the
    numbers of none."""
    d = design(model="llama-3.1-8b", **{**L8, "workload.concurrency": 32})
    a = one(d, **OFF)
    b = one(d, **{**OFF, "frontend_token_s": 1e-12})
    for k in ("ttft_s", "ttft_unloaded_s", "tpot_s", "output_tokens_per_s_per_chip"):
        assert b[k] == pytest.approx(a[k], rel=1e-6)


def test_k_processes_serve_c_over_k_clients_each():
    """Four processes: the closed loop's wait of 9 clients is that of 9 / 4 = 2.25 per process
    (m = 1.25, S = 1 s, cycle 2 s: W = 1.25 / (0.75 + sqrt(0.5625 + 2.5)) = 1.25 / 2.5 = 0.5 s); the first
    C wait for half the 1.25 other prompts of their process (0.625 s at 1 ms x 1000); the
    streaming bound of 64 streams is that of 16 (16 x 0.1 s / 100 = 16 ms); at a request rate the
    four act as one server of S / 4."""
    b = fe(frontend_token_s=0.01, frontend_processes=4.0)
    m = 1.25
    want = m / (2.0 - m + (((2.0 - m) ** 2 + 2.0 * m) ** 0.5))
    assert frontend.wait_s(b, 9.0, 2.0, 0.0) == pytest.approx(want, rel=1e-12)
    assert want == pytest.approx(0.5, rel=1e-12)
    burst = fe(frontend_prompt_token_s=1e-3, frontend_processes=4.0)
    assert frontend.wait_s(burst, 9.0, 2.0, 1.0) == pytest.approx(0.625, rel=1e-12)
    s = fe(frontend_token_s=1e-3, frontend_processes=4.0, has_on=lambda name: True)
    assert frontend.streamed_tpot(s, 1e-3, 64.0) == pytest.approx(0.016, rel=1e-12)
    assert frontend.serial_service_s(s, 0.0) == pytest.approx(0.1 / 4, rel=1e-12)


def test_fewer_clients_than_processes_never_queue():
    """Two clients over four processes: C / k = 0.5, so no other client shares a process
    (m = max(0.5 - 1, 0) = 0): neither the steady wait nor the first C's burst waits for
    anything (0 s, not the -0.5 x 1000 x 1 ms / 2 = -0.25 s of a negative share), and three
    clients over two processes still wait for the half client they share with (m = 0.5,
    burst 0.5 x 0.5 x 1 s = 0.25 s)."""
    b = fe(frontend_prompt_token_s=1e-3, frontend_processes=4.0)       # S = 1 s
    assert frontend.wait_s(b, 2.0, 2.0, 0.0) == 0.0
    assert frontend.wait_s(b, 2.0, 2.0, 1.0) == 0.0
    two = fe(frontend_prompt_token_s=1e-3, frontend_processes=2.0)
    assert frontend.wait_s(two, 3.0, 2.0, 1.0) == pytest.approx(0.25, rel=1e-12)


def test_the_runtimes_default_process_counts():
    """Blank serving.frontend_processes: one for TensorRT-LLM and SGLang, one per data-parallel
    rank for vLLM (its API servers scale with --data-parallel-size); a design's own value wins."""
    import pandas as pd

    from dse.build.designs import resolve
    rows = pd.DataFrame({"accelerator.id": ["h100-sxm"] * 4, "model.id": ["llama-3.1-8b"] * 4,
                         "layout.tp": [1] * 4, "layout.dp": [4] * 4,
                         "serving.runtime": ["trtllm", "sglang", "vllm", "vllm"],
                         "serving.frontend_processes": [None, None, None, 2]})
    out = resolve(rows)
    assert list(out["serving.frontend_processes"]) == [1.0, 1.0, 4.0, 2.0]


def test_more_processes_lift_the_front_ends_ceiling_on_a_large_instance():
    """A serial front end caps an instance at 1 / S requests a second: 256 clients of 2 s
    prompts' tokenization wait about (C - 1) S; spread over 8 processes they wait about an
    eighth of it (the TTFT falls by more than 5x), and the TPOT, the engine's, does not move."""
    d = design(model="llama-3.1-8b", **{**L8, "workload.concurrency": 256})
    one_p = one(d, **{**OFF, "frontend_prompt_token_s": 2e-3})
    eight = one(d, **{**OFF, "frontend_prompt_token_s": 2e-3, "frontend_processes": 8.0})
    assert eight["ttft_s"] < one_p["ttft_s"] / 5.0
    assert eight["tpot_s"] == pytest.approx(one_p["tpot_s"], rel=1e-12)
