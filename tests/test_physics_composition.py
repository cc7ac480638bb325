"""How the step times compose into the serving metrics, worked by hand: the TTFT's wait for the
running pass and the split of the instance's cost between output and input tokens.

Llama-3.1-8B (config.json): 32 layers, hidden 4096, 32 heads and 8 KV heads of dim 128, MLP
width 14336 (gated), vocab 128256, untied embeddings; bf16 weights and KV, one chip per stage.
The tests make every step compute-only (HBM, attention and the pipeline hand-off at 1e30 B/s and
FLOP/s, GEMMs at 1e15 FLOP/s, speed-of-light efficiencies otherwise: a step costs 2 FLOPs per
weight per row of each GEMM), so each step's time is a sum of token counts worked below. Each
of these formulas changed by 20% or by a one-line change of its shape (the wait's half pass or
its 1 - 1/C, the output's or the input's share of the cost) fails a test here
(``tests/mutation.py --operators``); before these tests only the goldens caught them.
"""

from __future__ import annotations

import pytest
from helpers import batch, design

from dse.perf import score

ATTN = 4096 * 32 * 128 * 2 + 4096 * 8 * 128 * 2     # q, o + k, v per layer: 41,943,040
MLP = 3 * 4096 * 14336                              # 176,160,768
BODY = 32 * (ATTN + MLP)                            # the layers' weights: 6,979,321,856
HEAD = 128256 * 4096                                # the output head: 525,336,576
FLOPS = 1e15


def _llama8b(**kw):
    return design(model="llama-3.1-8b", **{
        "model.weight_dtype": "bf16", "model.kv_dtype": "bf16", "layout.tp": 1,
        "serving.max_num_tokens": 8192, "serving.max_batch_size": 100000,
        "cost.mode": "rental", **kw})


def _compute_only(d):
    """The design's metrics and per-step breakdown with every step compute-only: GEMMs at
    1e15 FLOP/s; HBM, attention and the pipeline hand-off infinitely fast (1e30, no
    latency), and HBM large enough for every sequence's KV (1 PB: a batch the memory does not
    fit runs fewer sequences at once, dse.perf.memory_fit.running)."""
    b = batch(d, ideal=True).replace(
        matmul_flops_per_s=FLOPS, attn_matmul_flops_per_s=FLOPS, attn_flops_per_s=1e30,
        hbm_bw_bytes_per_s=1e30, hbm_capacity_bytes=1e15, scaleup_bw_bytes_per_s=1e30,
        scaleup_latency_s=0.0,
        scaleout_bw_bytes_per_s=1e30, scaleout_latency_s=0.0)
    m, steps = score(b, breakdown=True)
    return {k: v[0] for k, v in m.items()}, steps, b


def _stage_s(rows, logits_rows, pp=1):
    """A compute-only stage step: 2 FLOPs per weight of the stage's 32 / pp layers per row, and
    2 per output-head weight per row the head computes (the sequences that emit a token; the
    head is not split over the stages: the step of the last one sets the pace)."""
    return 2.0 * (BODY / pp * rows + HEAD * logits_rows) / FLOPS


# 64 sequences decoding, 1024-token prompts (no prefix hits), 256-token answers: on average
# 64 x 1024 / 256 = 256 prompt tokens per step, carried as one whole 1024-token prompt (below the
# 8192 - 64 tokens the decodes leave) in a quarter of the steps
C, ISL, OSL = 64, 1024, 256
T_DECODE = _stage_s(C, C)                        # a decode-only step: 64 rows, 64 logits
T_PROMPT = _stage_s(C + ISL, C + 1)              # ... and one with a whole prompt (+1 logit)
SHARE = (C * ISL / OSL) / ISL                    # 0.25 of the steps carry a prompt
T_MEAN = SHARE * T_PROMPT + (1 - SHARE) * T_DECODE


def test_mean_step_is_the_prompt_carrying_share_of_steps():
    """The precondition of the two tests below: decode-only steps take 64 rows through every
    GEMM, a prompt-carrying step 64 + 1024 rows (and one more logit, the prompt's first
    token), and a quarter of the steps carry a prompt: 0.25 x 15.0 ms + 0.75 x 0.96 ms."""
    m, steps, _ = _compute_only(_llama8b(**{"workload.isl": ISL, "workload.osl": OSL,
                                            "workload.concurrency": C}))
    assert steps.decode.total_s[0] == pytest.approx(T_DECODE, rel=1e-9)
    assert steps.mixed.total_s[0] == pytest.approx(T_PROMPT, rel=1e-9)
    assert m["step_s"] == pytest.approx(T_MEAN, rel=1e-9)
    assert m["tpot_s"] == pytest.approx(T_MEAN, rel=1e-9)


@pytest.mark.parametrize("pp, c, loop", [(1, C, 1.0), (2, C, 1.0), (1, 1, 1.0), (1, C, 0.0),
                                         (1, 1, 0.0)])
def test_ttft_waits_for_the_running_pass_and_the_one_the_loop_planned(pp, c, loop):
    """TTFT = the wait for the running pass (half of it on average), with an overlapped
    scheduler loop (``overlap_schedule`` 1) the pass it had already planned when the request
    came (a whole one), both only behind another sequence (x (1 - 1/C)), + the step that
    carries this prompt's one chunk next to the other sequences' decodes, on every stage; the
    first token goes out when that step ends. A pass is pp stage steps of a micro-batch of
    C / pp sequences; with one sequence the loop is idle and nothing is waited for."""
    m, _, _ = _compute_only(_llama8b(**{"workload.isl": ISL, "workload.osl": OSL,
                                        "workload.concurrency": c, "layout.pp": pp,
                                        "serving.overlap_schedule": loop}))
    share = (c * ISL / OSL) / ISL                   # the steps that carry a prompt
    t_mean = share * _stage_s((c + ISL) / pp, (c + 1) / pp, pp) \
        + (1 - share) * _stage_s(c / pp, c / pp, pp)
    chunk_step = _stage_s((c - 1) / pp + ISL, (c - 1) / pp + 1, pp)
    pass_s = pp * t_mean
    wait = (0.5 + loop) * pass_s * (1 - 1 / c)
    assert m["ttft_unloaded_s"] == pytest.approx(wait + pp * chunk_step, rel=1e-9)
    if (pp, c) == (1, C):      # the wait: 1.5 (0.5) x 4.5 ms x 63/64 = 6.6 (2.2) ms
        assert wait == pytest.approx((0.5 + loop) * 4.43e-3, rel=0.02)
        assert m["ttft_unloaded_s"] == pytest.approx(15.3e-3 + wait, rel=0.01)
    if c == 1:                 # one request in flight: the prompt's step alone
        assert m["ttft_unloaded_s"] == pytest.approx(chunk_step, rel=1e-9)
        assert m["ttft_s"] == pytest.approx(m["ttft_unloaded_s"], rel=1e-12)


@pytest.mark.parametrize("iters, frac, budget, held", [(20, 0.9, 16384, True),
                                                        (20, 0.9, 1100, False),
                                                        (20, 0.0, 16384, False),
                                                        (8, 0.9, 16384, True)])
def test_a_batch_wait_holds_a_prompt_for_its_timeout(iters, frac, budget, held):
    """TensorRT-LLM's batch waiting holds a prompt while decodes run until the waiting prompt
    tokens and the decodes reach frac x max_num_tokens (1024 + 64 tokens against 0.9 x 16384 =
    14,746: held; against 0.9 x 1100 = 990: not) or ``iters`` steps pass: the unloaded TTFT
    gains iters passes x (1 - 1/C), 20 x 4.53 ms x 63/64 = 89 ms; frac 0 (the runtime's
    default) never holds."""
    base = {"workload.isl": ISL, "workload.osl": OSL, "workload.concurrency": C,
            "serving.max_num_tokens": budget}
    m0, _, _ = _compute_only(_llama8b(**base))
    m, _, _ = _compute_only(_llama8b(**base, **{"serving.batch_wait_iters": iters,
                                                "serving.batch_wait_tokens_fraction": frac}))
    extra = m["ttft_unloaded_s"] - m0["ttft_unloaded_s"]
    if not held:
        assert extra == 0.0
        return
    assert extra == pytest.approx(iters * T_MEAN * (1 - 1 / C), rel=1e-9)
    if iters == 20:
        assert extra == pytest.approx(20 * 4.53e-3 * 63 / 64, rel=0.01)
    assert m["tpot_s"] == pytest.approx(m0["tpot_s"], rel=1e-12)   # the steps are unchanged


# a prompt served half from the prefix cache: 512 new tokens; attention is free here, so its
# step is 64 decodes + 512 prompt rows: 0.25 x 8.11 ms + 0.75 x 0.96 ms = 2.75 ms
T_MEAN_HALF_CACHED = SHARE * _stage_s(C + ISL // 2, C + 1) + (1 - SHARE) * T_DECODE


@pytest.mark.parametrize("budget, kw, held", [
    (2190, {}, True),          # 1024 new + 64 decodes = 1088 < 0.5 x 2190 = 1095: held
    (2160, {}, False),         # 1088 >= 0.5 x 2160 = 1080 (the decodes tip it: 1024 alone is below)
    (2160, {"workload.prefix_hit_fraction": 0.5}, True),   # 512 new + 64 = 576 < 1080
    (2190, {"layout.dp": 2}, False),   # attention DP: TensorRT-LLM never holds (no _waiting_requests)
])
def test_a_batch_wait_counts_the_new_prompt_tokens_and_the_decodes(budget, kw, held):
    """TensorRT-LLM's ``_waiting_requests`` stops waiting when the scheduled tokens (the prompt's
    tokens to compute and one per running decode) reach ``ratio x max_num_tokens``; it is only
    called without attention DP. At a mark between 1024 + 0.8 x 64 and 1024 + 1.2 x 64 tokens a
    20% change of the decodes' count flips the hold; at 0.5 x 2160 = 1080 the decodes alone decide
    it; with half the prompt cached only its 512 new tokens count. Held: 20 passes x 63/64, 20 x
    4.53 ms x 63/64 = 89.3 ms (half cached: 20 x 2.75 ms x 63/64 = 54.1 ms)."""
    base = {"workload.isl": ISL, "workload.osl": OSL, "workload.concurrency": C,
            "serving.max_num_tokens": budget, **kw}
    m0, _, _ = _compute_only(_llama8b(**base))
    m, _, _ = _compute_only(_llama8b(**base, **{"serving.batch_wait_iters": 20,
                                                "serving.batch_wait_tokens_fraction": 0.5}))
    extra = m["ttft_unloaded_s"] - m0["ttft_unloaded_s"]
    if not held:
        assert extra == 0.0
        return
    mean = T_MEAN_HALF_CACHED if kw else T_MEAN
    assert extra == pytest.approx(20 * mean * (1 - 1 / C), rel=1e-9)
    assert extra == pytest.approx((54.1e-3 if kw else 89.3e-3), rel=0.002)


@pytest.mark.parametrize("budget, held", [(2240, False), (2320, True)])
def test_a_batch_wait_counts_the_running_sequences_draft_tokens(budget, held):
    """With one draft token a sequence (speculative decoding) each running sequence schedules
    1 + 1 tokens (TensorRT-LLM ``_waiting_requests``: ``1 + gen_req.num_draft_tokens``): 1024 +
    64 x 2 = 1152 tokens reach 0.5 x 2240 = 1120 (no wait; counting one token a sequence, 1088,
    would hold) but not 0.5 x 2320 = 1160 (held: 20 mean steps x 63/64)."""
    base = {"workload.isl": ISL, "workload.osl": OSL, "workload.concurrency": C,
            "serving.max_num_tokens": budget, "serving.spec_tokens": 1,
            "serving.spec_method": "draft", "serving.spec_draft_model": "llama-3.1-8b"}
    m0, _, _ = _compute_only(_llama8b(**base))
    m, _, _ = _compute_only(_llama8b(**base, **{"serving.batch_wait_iters": 20,
                                                "serving.batch_wait_tokens_fraction": 0.5}))
    extra = m["ttft_unloaded_s"] - m0["ttft_unloaded_s"]
    assert extra == (pytest.approx(20 * m0["step_s"] * (1 - 1 / C), rel=1e-9) if held else 0.0)


def test_the_runtimes_default_loops_are_overlapped():
    """SGLang, TensorRT-LLM (PyTorch backend) and vLLM >= 0.14 plan the next step while the GPU
    runs this one by default (serving.toml [runtimes.*] overlap_schedule)."""
    from dse import catalog
    assert {r: v["overlap_schedule"] for r, v in catalog.runtime_defaults().items()} == \
        {"trtllm": 1, "sglang": 1, "vllm": 1}


@pytest.mark.parametrize("runtime", ["trtllm", "sglang", "vllm"])
def test_a_design_that_leaves_the_loop_blank_gets_its_runtimes(runtime):
    """serving.overlap_schedule left blank reaches the batch as the runtime's default (1, an
    overlapped loop: serving.toml [runtimes.*]); a design's own 0 wins."""
    kw = {"workload.isl": ISL, "workload.osl": OSL, "workload.concurrency": C,
          "serving.runtime": runtime}
    assert batch(_llama8b(**kw)).overlap_schedule.tolist() == [1.0]
    assert batch(_llama8b(**kw, **{"serving.overlap_schedule": 0})).overlap_schedule.tolist() \
        == [0.0]


@pytest.mark.parametrize("runtime", ["trtllm", "sglang", "vllm"])
def test_a_pipeline_parallel_design_runs_no_overlapped_loop(runtime):
    """At pp > 1 no runtime runs its overlapped loop (TensorRT-LLM ``_executor_loop_pp``, SGLang
    and vLLM turn overlap / async scheduling off): a blank loop is 0, so the unloaded TTFT at pp
    2 waits half a pass x 63/64, not 1.5 (the pass-and-chunk sum of
    test_ttft_waits_for_the_running_pass_and_the_one_the_loop_planned at loop 0); a design's
    own 1 still wins."""
    kw = {"workload.isl": ISL, "workload.osl": OSL, "workload.concurrency": C,
          "serving.runtime": runtime, "layout.pp": 2}
    assert batch(_llama8b(**kw)).overlap_schedule.tolist() == [0.0]
    assert batch(_llama8b(**kw, **{"serving.overlap_schedule": 1})).overlap_schedule.tolist() \
        == [1.0]
    if runtime != "trtllm":
        return
    m, _, _ = _compute_only(_llama8b(**{k: v for k, v in kw.items() if k != "serving.runtime"}))
    share = (C * ISL / OSL) / ISL
    t_mean = share * _stage_s((C + ISL) / 2, (C + 1) / 2, 2) \
        + (1 - share) * _stage_s(C / 2, C / 2, 2)
    chunk_step = _stage_s((C - 1) / 2 + ISL, (C - 1) / 2 + 1, 2)
    assert m["ttft_unloaded_s"] == pytest.approx(0.5 * 2 * t_mean * (1 - 1 / C) + 2 * chunk_step,
                                                 rel=1e-9)


@pytest.mark.parametrize("runtime, method, loop", [
    ("sglang", "mtp", 0.0), ("sglang", "draft", 0.0),      # no overlap with (non-V2) drafting
    ("vllm", "mtp", 1.0), ("vllm", "draft", 0.0),          # EAGLE/MTP keep async scheduling
    ("trtllm", "mtp", 1.0), ("trtllm", "draft", 1.0)])     # its overlap loop drafts itself
def test_speculative_decoding_keeps_the_loop_its_runtime_runs(runtime, method, loop):
    """A blank loop under speculative decoding is the runtime's for that method
    (serving.toml [runtimes.*] overlap_spec_methods); without drafts every runtime overlaps,
    and a design's own value wins."""
    kw = {"workload.isl": ISL, "workload.osl": OSL, "workload.concurrency": C,
          "serving.runtime": runtime, "serving.spec_method": method,
          "serving.spec_draft_model": "llama-3.1-8b" if method == "draft" else ""}
    d = "llama-3.1-8b" if method == "draft" else "deepseek-v3"
    got = batch(design(model=d, **kw, **{"serving.spec_tokens": 1})).overlap_schedule
    assert got.tolist() == [loop]
    assert batch(design(model=d, **kw)).overlap_schedule.tolist() == [1.0]
    own = batch(design(model=d, **kw, **{"serving.spec_tokens": 1,
                                         "serving.overlap_schedule": 1}))
    assert own.overlap_schedule.tolist() == [1.0]


T_CHUNK = _stage_s(C - 1 + ISL, C)               # this prompt's step next to 63 decodes
# S: one prompt's 1024 tokens at the rate of a step full of prompt tokens (the budget the
# decodes leave, 8192 - 64), the step affine between the decode-only and the chunk step
S_PROMPT = ISL * (T_DECODE / (8192 - C) + (T_CHUNK - T_DECODE) / ISL)


def _closed_loop(unloaded, n_requests):
    """The closed-loop mean TTFT of C = 64 requests on one scheduler, worked from its parts."""
    others = C - 1
    burst = 0.5 * others * S_PROMPT                      # the first 64 arrive together
    cycle = unloaded + (OSL - 1) * T_MEAN                # a user's TTFT and its other tokens
    a = cycle - others * S_PROMPT
    steady = others * S_PROMPT ** 2 / (a + (a * a + 2 * others * S_PROMPT ** 2) ** 0.5)
    # the steady wait solves W = rho S / (2 (1 - rho)) at rho = 63 S / (cycle + W) (M/D/1)
    rho = others * S_PROMPT / (cycle + steady)
    assert steady == pytest.approx(rho * S_PROMPT / (2 * (1 - rho)), rel=1e-9)
    first = min(C / n_requests, 1.0)
    return unloaded + first * burst + (1 - first) * steady, burst, steady, rho


@pytest.mark.parametrize("n_requests", [0, 64, 6400])
def test_closed_loop_ttft_adds_the_burst_and_the_steady_queue(n_requests):
    """``ttft_s`` is the mean a closed-loop benchmark measures: 64 in flight, ``num_requests``
    sent (0: 10 x 64, as InferenceX). The first 64 arrive at once and wait on average for half
    of the other 63 prompts (0.5 x 63 x S); the later ones for the prompts the other 63 users
    sent meanwhile (M/D/1 at the load the loop sets). S = 1024 x (0.96 ms / 8128 + (15.2 -
    0.96) ms / 1024) = 14.4 ms; burst 454 ms; steady 22 ms at rho 0.76: 22 + 0.1 x 454 + 0.9 x
    22 = 87.4 ms in all with 640 requests."""
    m, _, _ = _compute_only(_llama8b(**{"workload.isl": ISL, "workload.osl": OSL,
                                        "workload.concurrency": C,
                                        "workload.num_requests": n_requests}))
    expected, burst, steady, rho = _closed_loop(m["ttft_unloaded_s"], n_requests or 10 * C)
    assert m["ttft_s"] == pytest.approx(expected, rel=1e-9)
    if n_requests == 0:
        assert S_PROMPT == pytest.approx(14.4e-3, rel=0.01)
        assert burst == pytest.approx(0.454, rel=0.01)
        assert steady == pytest.approx(22.3e-3, rel=0.01)
        assert rho == pytest.approx(0.756, abs=0.002)
        assert m["ttft_s"] == pytest.approx(87.4e-3, rel=0.01)
    if n_requests == 64:       # the burst alone
        assert m["ttft_s"] == pytest.approx(m["ttft_unloaded_s"] + burst, rel=1e-9)


def test_closed_loop_wait_is_bounded_by_the_other_prompts():
    """However heavy the load (long prompts, short answers: the others' prompts alone exceed a
    user's cycle), a request never waits longer than for every other user's prompt: the steady
    wait stays below (m - 1) S, and the mean TTFT grows with the load."""
    ttfts = []
    for isl in (1024, 4096, 8000):
        m, _, _ = _compute_only(_llama8b(**{"workload.isl": isl, "workload.osl": 16,
                                            "workload.concurrency": C,
                                            "workload.num_requests": 100000}))
        t_dec = _stage_s(C, C)
        s = isl * (t_dec / (8192 - C) + (_stage_s(C - 1 + isl, C) - t_dec) / isl)
        wait = m["ttft_s"] - m["ttft_unloaded_s"]
        assert 0.0 < wait < (C - 1) * s
        ttfts.append(m["ttft_s"])
    assert ttfts == sorted(ttfts)


@pytest.mark.parametrize("isl, n_chunks", [(8128, 1), (8129, 2)])
def test_a_prompt_past_the_budget_runs_in_even_chunks(isl, n_chunks):
    """The budget is what 64 decodes leave of 8,192 tokens: 8,128. A prompt of 8,128 tokens is
    one chunk; one token more makes two chunks of 4,064.5 tokens each (its chunks share the
    tokens), not a full chunk and a one-token one, nor two full ones."""
    m, steps, _ = _compute_only(_llama8b(**{"workload.isl": isl, "workload.osl": OSL,
                                            "workload.concurrency": C}))
    per_chunk = isl / n_chunks
    chunk_step = _stage_s(C - 1 + per_chunk, C)
    assert steps.prefill.total_s[0] == pytest.approx(chunk_step, rel=1e-9)
    pass_s = m["tpot_s"]
    expected = 1.5 * pass_s * (1 - 1 / C) + n_chunks * chunk_step
    assert m["ttft_unloaded_s"] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("pp", [1, 2])
def test_output_tokens_pay_the_decode_steps_input_tokens_the_rest(pp):
    """The instance's $/s (its pp chips') is split by time: output tokens pay for the
    decode-only step's share of the mean step (T_DECODE / T_MEAN = 0.212 at pp = 1), input
    tokens for the rest, the prompts' extra time. 64 tokens per pass of pp mean stage steps,
    and 4x as many input tokens/s (1024 per 256)."""
    m, _, b = _compute_only(_llama8b(**{"workload.isl": ISL, "workload.osl": OSL,
                                        "workload.concurrency": C, "layout.pp": pp}))
    usd_s = m["usd_per_chip_hour"] * pp / 3600.0       # the instance's chips
    t_dec = _stage_s(C / pp, C / pp, pp)
    t_mean = SHARE * _stage_s((C + ISL) / pp, (C + 1) / pp, pp) + (1 - SHARE) * t_dec
    out_rate = C / (pp * t_mean)                        # the instance's
    in_rate = out_rate * ISL / OSL
    decode_share = t_dec / t_mean
    if pp == 1:
        assert decode_share == pytest.approx(0.2119, abs=1e-4)
    assert m["output_tokens_per_s_per_chip"] == pytest.approx(out_rate / pp, rel=1e-9)
    assert m["input_tokens_per_s_per_chip"] == pytest.approx(in_rate / pp, rel=1e-9)
    assert m["usd_per_mtok_output"] == pytest.approx(usd_s * decode_share / out_rate * 1e6,
                                                     rel=1e-9)
    assert m["usd_per_mtok_input"] == pytest.approx(usd_s * (1 - decode_share) / in_rate * 1e6,
                                                    rel=1e-9)
    # the two together pay for the instance; an output token's energy is the decode share of
    # the chips' (wall) power
    assert m["usd_per_mtok_output"] * out_rate + m["usd_per_mtok_input"] * in_rate \
        == pytest.approx(usd_s * 1e6, rel=1e-9)
    watts = b.power_w[0] * b.pue[0] * pp
    assert m["joules_per_output_token"] == pytest.approx(watts * decode_share / out_rate,
                                                         rel=1e-9)


@pytest.mark.parametrize("pp, rate", [(1, 50.0), (2, 60.0)])
def test_prefill_queue_serves_a_prompt_in_pp_stage_steps(pp, rate):
    """At a request rate, prompts queue for the steps' prompt budget (M/D/1, dse.perf.queueing):
    one prompt holds it for S = pp x its tokens at the rate of a full-budget step (the step
    affine between the decode-only and the chunk-carrying step) at the concurrency the rate
    sets (C, from Little's law), and waits
    on average rho S / (2 (1 - rho)) at rho = rate x S. The p90 TPOT is the mean step's at the
    Poisson p90 of the batch, C + 1.2816 sqrt(C) sequences (8.2 + 3.7 at pp = 1)."""
    m, _, _ = _compute_only(_llama8b(**{"workload.isl": ISL, "workload.osl": OSL,
                                        "workload.request_rate_per_s": rate, "layout.pp": pp}))
    c = m["concurrency"]
    assert c > 1.5                                     # set by the rate, not the floor of 1
    t_dec = _stage_s(c / pp, c / pp, pp)
    t_chunk = _stage_s((c - 1) / pp + ISL, (c - 1) / pp + 1, pp)
    s = pp * ISL * (t_dec / (8192 - c) + (t_chunk - t_dec) / ISL)
    rho = rate * s
    assert 0.2 < rho < 0.9
    # (rel 1e-7, was 1e-9: a row at a rate is scored with its coefficients rounded from
    # float32, ~6e-8 relative; dse/perf/roots.py, its sixth pass)
    assert m["ttft_queue_wait_s"] == pytest.approx(rho * s / (2 * (1 - rho)), rel=1e-7)
    if pp == 2:        # (its p90 batch lies past the saturation's, where it is capped)
        return
    c90 = c + 1.2815515655446004 * c ** 0.5
    share = (c90 * ISL / OSL) / ISL
    t90 = share * _stage_s((c90 + ISL) / pp, (c90 + 1) / pp, pp) \
        + (1 - share) * _stage_s(c90 / pp, c90 / pp, pp)
    # (rel 1e-6, was 1e-9: the p90 TPOT comes from the float32 probe since roots.py's sixth
    # pass)
    assert m["tpot_p90_s"] == pytest.approx(pp * t90, rel=1e-6)


def test_decode_bound_is_the_resource_bounding_the_most_op_time():
    """What bounds a decode step (``bound``: compute 0, memory 1, network 2) is the resource
    that bounds the largest share of its op time, each op bound by the largest of its compute,
    memory and network times (ties: memory over compute, network only when strictly largest),
    worked here from the per-op breakdown for Llama-3.1-70B at tp = 4 and Mixtral at ep = 8
    over batches from 1 to 4096 sequences (HBM large enough that no batch fills it; Mixtral
    with attention data parallelism, tp 1 x dp 8, so its experts' all-to-all runs): the
    scorer's own sums (``decode_*_s``) and bound must agree at every batch."""
    import numpy as np
    cs = [1, 4, 16, 64, 128, 192, 256, 320, 384, 512, 768, 1024, 2048, 4096]
    rows = [design("h100-sxm", model, **{
        "model.weight_dtype": "bf16", "layout.tp": tp, "layout.ep": ep, "layout.dp": dp,
        "workload.phase": "decode", "workload.isl": 2048, "workload.osl": 256,
        "workload.concurrency": c, "accelerator.hbm_capacity_bytes": 1e13,
        "serving.max_batch_size": 100000})
        for model, tp, ep, dp in (("llama-3.1-70b", 4, 1, 1), ("mixtral-8x7b", 1, 8, 8))
        for c in cs]
    b = batch(rows)
    fast = score(b)
    _, steps = score(b, breakdown=True)
    dec = steps.decode
    c, mem, net, t = dec.compute_s, dec.memory_s, dec.network_s, dec.op_s
    is_net = (net > c) & (net > mem)
    is_mem = (mem > c) & (mem >= net) & ~is_net
    shares = np.stack([(t * (~is_net & ~is_mem)).sum(0), (t * is_mem).sum(0),
                       (t * is_net).sum(0)])
    sc, sm, sn = shares
    expected = np.where((sn > sc) & (sn > sm), 2, np.where((sm > sc) & (sm >= sn), 1, 0))
    assert set(expected) == {0, 1, 2}                 # every resource bounds some batch
    np.testing.assert_array_equal(fast["bound"], expected)
    np.testing.assert_allclose(fast["decode_compute_s"], c.sum(0), rtol=1e-12)
    np.testing.assert_allclose(fast["decode_memory_s"], mem.sum(0), rtol=1e-12)
    np.testing.assert_allclose(fast["decode_network_s"], net.sum(0), rtol=1e-12)


def test_a_step_without_tokens_computes_nothing_in_its_token_ops():
    """A prefill-only instance decodes no token: its decode step carries none, so neither the
    attention projections, the dense MLP, the routed nor the shared experts compute anything
    (no row, no padded tile: 0 s; its weights' read is the step's fixed part). DeepSeek-V3 at
    its fitted efficiencies (their padding rows and tiles are > 0)."""
    from dse.perf import OPS
    d = design(acc="gb200", model="deepseek-v3", **{
        "model.weight_dtype": "fp8", "layout.dp": 8, "layout.ep": 8, "workload.isl": 1024,
        "workload.osl": 1, "workload.concurrency": 4, "workload.phase": "prefill"})
    st = score(batch(d), breakdown=True)[1]
    for op in ("attn_proj", "mlp_dense", "moe_routed", "moe_shared"):
        assert st.decode.compute_s[OPS.index(op), 0] == 0.0, op
        assert st.prefill.compute_s[OPS.index(op), 0] > 0.0, op
    # beside a row whose decode step carries tokens (the same design decoding), the empty row
    # is masked to 0 and the other keeps the time it has alone: the mask is per row
    both = {**d, "workload.phase": "decode"}
    alone = score(batch(both), breakdown=True)[1].decode.compute_s
    mixed = score(batch([d, both]), breakdown=True)[1].decode.compute_s
    for op in ("attn_proj", "mlp_dense", "moe_routed", "moe_shared"):
        i = OPS.index(op)
        assert mixed[i, 0] == 0.0, op
        assert alone[i, 0] > 0.0, op
        assert mixed[i, 1] == pytest.approx(alone[i, 0], rel=1e-12), op


def test_decode_bound_counts_every_op_on_pipelines_and_split_experts():
    """``test_decode_bound_is_the_resource_bounding_the_most_op_time`` on the layouts whose
    ops it does not reach: a pipeline (pp = 2, whose hand-off is a network-only op), one chip
    per stage (tp = 1: ops without a collective, compute-bound at large batches), and Mixtral's
    experts each split over 2 chips beside its all-to-all (tp 1 x dp 8, ep = 4: the routed op's
    network time is the experts' all-reduce plus the dispatch and combine)."""
    import numpy as np
    cs = [1, 16, 64, 256, 1024, 4096]
    rows = [design(acc, model, **{
        "model.weight_dtype": "bf16", "layout.tp": tp, "layout.ep": ep, "layout.dp": dp,
        "layout.pp": pp, "workload.phase": "decode", "workload.isl": 2048,
        "workload.osl": 256, "workload.concurrency": c, "accelerator.hbm_capacity_bytes": 1e13,
        "serving.max_batch_size": 100000})
        for acc, model, tp, ep, dp, pp in (("h100-sxm", "llama-3.1-70b", 4, 1, 1, 2),
                                           ("h100-sxm", "llama-3.1-8b", 1, 1, 1, 1),
                                           ("h100-sxm", "llama-3.1-8b", 1, 1, 1, 2),
                                           ("h100-sxm", "mixtral-8x7b", 1, 4, 8, 1),
                                           ("h100-sxm", "mixtral-8x7b", 1, 4, 8, 2))
        for c in cs]
    b = batch(rows)
    fast = score(b)
    dec = score(b, breakdown=True)[1].decode
    c, mem, net, t = dec.compute_s, dec.memory_s, dec.network_s, dec.op_s
    is_net = (net > c) & (net > mem)
    is_mem = (mem > c) & (mem >= net) & ~is_net
    sc, sm, sn = ((t * (~is_net & ~is_mem)).sum(0), (t * is_mem).sum(0), (t * is_net).sum(0))
    expected = np.where((sn > sc) & (sn > sm), 2, np.where((sm > sc) & (sm >= sn), 1, 0))
    np.testing.assert_array_equal(fast["bound"], expected)
    np.testing.assert_allclose(fast["decode_network_s"], net.sum(0), rtol=1e-12)
    assert set(expected) == {0, 1, 2}


def test_each_op_adds_its_time_to_the_share_of_what_bounds_it():
    """``step._share`` by hand, from shares (compute, memory, network) = (1, 2, 3) s: a
    network-only op (the pipeline hand-off) of 5 s adds to the network's (3 + 5 = 8); an op
    without a network term adds to memory where its memory time exceeds its compute time
    (2 > 1: 2 + 4 = 6), else to compute (3 > 2: 1 + 4 = 5); with all three, to the largest."""
    import numpy as np

    from dse.perf.step import _share
    shares = [np.array(1.0), np.array(2.0), np.array(3.0)]
    _share(shares, None, None, np.array(0.5), np.array(5.0))
    assert [float(v) for v in shares] == [1.0, 2.0, 8.0]
    _share(shares, np.array(1.0), np.array(2.0), None, np.array(4.0))
    assert [float(v) for v in shares] == [1.0, 6.0, 8.0]
    _share(shares, np.array(3.0), np.array(2.0), None, np.array(4.0))
    assert [float(v) for v in shares] == [5.0, 6.0, 8.0]
    _share(shares, np.array(1.0), np.array(2.0), np.array(3.0), np.array(1.0))
    assert [float(v) for v in shares] == [5.0, 6.0, 9.0]


def test_a_batch_that_fills_the_hbm_is_capacity_bound_unless_compute_bound():
    """Shares of op time (compute, memory, network): a batch of 97 sequences where the HBM
    holds 100 (97 >= 0.97 x 100) and the runtime would run 1000 is capacity-bound (3) when its
    step is memory-bound (shares 1, 3, 1) or network-bound (1, 1, 3): more HBM would serve
    more; compute-bound (3, 1, 1) it stays compute (0); at 96 sequences (under 97) the
    memory-bound step is memory (1), and so it is where the runtime's cap is the HBM's (100)."""
    import numpy as np

    from dse.perf.memory_fit import decode_bound
    one = lambda v: np.array([float(v)])
    zero = np.zeros(1, np.int64)
    mem, net, comp = (one(1), one(3), one(1)), (one(1), one(1), one(3)), (one(3), one(1), one(1))
    assert decode_bound(mem, zero, one(97), one(100), one(1000))[0] == 3
    assert decode_bound(net, zero, one(97), one(100), one(1000))[0] == 3
    assert decode_bound(comp, zero, one(97), one(100), one(1000))[0] == 0
    assert decode_bound(mem, zero, one(96), one(100), one(1000))[0] == 1
    assert decode_bound(mem, zero, one(97), one(100), one(100))[0] == 1
