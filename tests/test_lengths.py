"""Request lengths as distributions (dse/perf/lengths.py): in-flight context, KV packing and
the attention-DP straggler, by hand and against seeded sampling."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch, one

from dse.perf import OPS, lengths, phases, score
from dse.perf.step import Coefficients

CORE = OPS.index("attn_core")
L70 = {"accelerator.id": "h200-sxm", "model.id": "llama-3.1-70b", "model.weight_dtype": "fp8",
       "layout.tp": 4, "workload.isl": 1024, "workload.osl": 1024, "workload.concurrency": 64}
DSV3 = {"accelerator.id": "gb200", "model.id": "deepseek-v3", "model.weight_dtype": "fp8",
        "layout.dp": 8, "layout.ep": 8, "workload.isl": 2048, "workload.osl": 1024,
        "workload.concurrency": 512}


def test_expected_max_of_normals_against_sampling():
    rng = np.random.default_rng(3)
    for n in (2, 8, 72):
        sampled = rng.standard_normal((200_000, n)).max(axis=1).mean()
        assert float(lengths.expected_max_normal(n)) == pytest.approx(sampled, rel=0.045)
    assert float(lengths.expected_max_normal(1)) == 0.0


def test_length_biased_context_against_sampling():
    # in-flight sequences are sampled in proportion to their answer length, at a uniform age
    rng = np.random.default_rng(5)
    cv, m = 0.8, 500.0
    o = rng.gamma(1 / cv ** 2, m * cv ** 2, 2_000_000)
    pick = rng.choice(o, 400_000, p=o / o.sum())
    age = rng.uniform(0, 1, pick.size) * pick
    b = batch({**L70, "workload.isl": 1000, "workload.osl": 500, "workload.osl_cv": cv})
    assert float(lengths.decode_context_tokens(b)[0]) == pytest.approx(1000 + age.mean(),
                                                                       rel=0.01)
    # the spread beyond the age spread of uniform answers (osl^2 / 12)
    sd = float(lengths.context_sd_tokens(b)[0])
    assert sd ** 2 == pytest.approx(age.var() - 500 ** 2 / 12, rel=0.03)


def test_kv_packing_by_hand():
    # osl_cv = 1: the in-flight mean final length is isl + 2 osl = 3072 tokens (vs 2048), and
    # its sd sqrt(osl^2 (1 + 1) 1) = 1448 tokens; 64 sequences on one scheduler at p99:
    # 3072 (1 + 2.326 x 1448 / 3072 / 8) = 3493 tokens per sequence
    base, var = one(L70), one({**L70, "workload.osl_cv": 1.0})
    want = (1024 + 2 * 1024) * (1 + 2.3263479 * np.sqrt(2 * 1024 ** 2) / 3072 / 8) / 2048
    assert var["kv_bytes_per_chip"] / base["kv_bytes_per_chip"] == pytest.approx(want, rel=1e-6)
    assert var["max_concurrent_sequences"] < base["max_concurrent_sequences"]


def test_the_busiest_attention_rank_sets_the_step():
    _, st = score(batch([DSV3, {**DSV3, "workload.isl_cv": 1.0}], ideal=True), breakdown=True)
    kv = st.decode.memory_s[CORE]
    # isl_cv = 1: context sd 2048 around a mean of 2560; z(8) = 1.4338; 64 sequences per rank
    z = float(lengths.expected_max_normal(8))
    assert z == pytest.approx(1.4338, rel=1e-3)
    want = 1 + z * 2048 / 2560 / 8
    # the KV read is all of attn_core's memory time but a small prefill-write term and the
    # queries' and outputs' bytes, which do not grow with the context: 61 layers x 128 heads x
    # (512 + 64 + 512) bf16 per token, 64 tokens per rank
    b = batch(DSV3)
    qo = (61 * 128 * 1088 * 2 * 64 / (b.hbm_bw_bytes_per_s * b.attn_decode_hbm_fraction))[0]
    assert (kv[1] - qo) / (kv[0] - qo) == pytest.approx(want, rel=0.01)
    # one attention rank: no straggler, and the mean context does not move with isl_cv
    d1 = {**DSV3, "layout.dp": 1, "layout.tp": 8, "workload.concurrency": 64}
    a, b = one(d1), one({**d1, "workload.isl_cv": 1.0})
    assert a["tpot_s"] == pytest.approx(b["tpot_s"], rel=1e-12)


def test_more_spread_never_speeds_up_decoding():
    rows = [{**DSV3, "workload.osl_cv": c, "workload.isl_cv": c} for c in (0, 0.3, 0.8, 1.5)]
    s = score(batch(rows))
    assert np.all(np.diff(s["tpot_s"]) > 0)
    assert np.all(np.diff(s["max_concurrent_sequences"]) <= 0)


# --- prefill: the busiest attention-DP rank's prompt tokens, a long prompt's TTFT ---

def test_gamma_quantile_against_sampling():
    rng = np.random.default_rng(11)
    # Wilson-Hilferty: within 3% for cv <= 1, 7% low at cv = 2 (shape 1/4)
    for cv, tol in ((0.3, 0.03), (1.0, 0.03), (2.0, 0.08)):
        b = batch({**L70, "workload.isl": 4096, "workload.isl_cv": cv})
        k = 1.0 / cv ** 2
        sampled = np.quantile(rng.gamma(k, 4096 / k, 400_000), 0.9)
        assert float(lengths.isl_quantile(b)[0]) == pytest.approx(sampled, rel=tol), cv
    assert float(lengths.isl_quantile(batch(L70))[0]) == 1024.0       # uniform lengths


def test_decode_straggler_by_hand():
    """The busiest of dp = 8 attention ranks over the mean: 1 + z(8) x sd / mean / sqrt(C / 8),
    sd / mean = 2048 / 2560 (isl_cv 1, the context's mean 2048 + 1024 / 2): 64 sequences a
    rank, 1 + 1.4345 x 0.8 / 8 = 1.1435; 4 sequences over 8 ranks count as one a rank (a
    rank runs whole sequences): 1 + 1.4345 x 0.8 = 2.1476, not the 1 + 1.4345 x 0.8 / sqrt(0.5)
    of half a sequence; uniform prompts and answers: no straggler."""
    b = batch({**DSV3, "workload.isl_cv": 1.0})
    assert float(lengths.straggler(b, np.array([512.0]))[0]) \
        == pytest.approx(1.0 + 1.4345 * 0.8 / 8.0, abs=2e-5)
    assert float(lengths.straggler(b, np.array([4.0]))[0]) \
        == pytest.approx(1.0 + 1.4345 * 0.8, abs=2e-4)
    assert float(lengths.straggler(batch(DSV3), np.array([4.0]))[0]) == 1.0


def test_prefill_straggler_by_hand():
    # dp 8, cv 1, 4 prompts per rank per step: 1 + z(8) x 1 / sqrt(4) = 1 + 1.4345 / 2
    b = batch({**DSV3, "workload.isl_cv": 1.0})
    assert float(lengths.prefill_straggler(b, np.array([4.0]))[0]) \
        == pytest.approx(1.0 + 1.4345 / 2.0, abs=2e-4)
    # fewer than one prompt per rank counts as one; uniform prompts balance
    assert float(lengths.prefill_straggler(b, np.array([0.2]))[0]) \
        == pytest.approx(1.0 + 1.4345, abs=2e-4)
    assert float(lengths.prefill_straggler(batch(DSV3), np.array([4.0]))[0]) == 1.0


def test_prompt_spread_slows_the_prompt_carrying_step_under_attention_dp():
    a = one({**DSV3, "workload.osl_cv": 1e-9})      # the lengths hook on, prompts uniform
    b = one({**DSV3, "workload.isl_cv": 1.0})
    assert b["step_s"] > a["step_s"]
    # without attention DP there is no busiest rank: the prompt spread only moves the KV
    c = one({**L70, "workload.osl_cv": 1e-9})
    d = one({**L70, "workload.isl_cv": 1.0, "workload.concurrency": 1})
    e = one({**L70, "workload.osl_cv": 1e-9, "workload.concurrency": 1})
    assert d["step_s"] == pytest.approx(e["step_s"], rel=1e-12)
    assert np.isfinite(c["ttft_p90_length_s"])


def test_a_long_prompt_waits_longer_by_hand():
    # the p90 prompt's extra uncached tokens at the step's per-token prefill time:
    # ttft_p90_length - ttft = pp x t_prefill x (isl_90 - isl)(1 - hit) / chunk
    d = {**L70, "workload.isl": 4096, "workload.isl_cv": 1.0, "workload.concurrency": 8,
         "workload.prefix_hit_fraction": 0.5}
    m, steps = score(batch(d), breakdown=True)
    isl90 = float(lengths.isl_quantile(batch(d))[0])
    new = 2048.0
    chunk = min(new, 8192 - 8)                     # the whole uncached prompt fits in one step
    t_prefill = float(steps.total("prefill")[0])
    extra = t_prefill * (isl90 - 4096) * 0.5 / chunk
    assert float(m["ttft_p90_length_s"][0] - m["ttft_s"][0]) == pytest.approx(extra, rel=1e-9)
    # uniform prompts: the p90 prompt is the mean one
    u = one({**d, "workload.isl_cv": 0.0, "workload.osl_cv": 0.5})
    assert u["ttft_p90_length_s"] == pytest.approx(u["ttft_s"], rel=1e-12)
    # more spread never shortens a long prompt's wait
    w = one({**d, "workload.isl_cv": 2.0})
    assert w["ttft_p90_length_s"] > float(m["ttft_p90_length_s"][0])


def test_a_long_prompt_on_a_prefill_only_instance_waits_in_proportion_by_hand():
    # a prefill-only instance's TTFT is one pass of its batch of prompts (no front end here);
    # the p90-length prompt's pass runs its extra uncached tokens at the pass's per-token time:
    # ttft_p90_length - ttft = pass x (isl_90 - isl)(1 - hit) / (isl (1 - hit)) = pass x
    # (isl_90 - isl) / isl, so ttft_p90_length / ttft = isl_90 / isl
    d = {**L70, "workload.phase": "prefill", "workload.isl": 4096, "workload.isl_cv": 1.0,
         "workload.concurrency": 8, "workload.prefix_hit_fraction": 0.5,
         "serving.request_overhead_s": 0.0, "serving.frontend_prompt_token_s": 0.0,
         "serving.frontend_token_s": 0.0, "serving.frontend_text_token_s": 0.0}
    m = one(d)
    isl90 = float(lengths.isl_quantile(batch(d))[0])
    assert isl90 > 4096 * 1.5                   # cv 1: the p90 prompt is well above the mean
    assert m["ttft_p90_length_s"] == pytest.approx(m["ttft_s"] * isl90 / 4096, rel=1e-9)


def test_the_busiest_rank_carries_the_straggler_share_of_the_prompt_tokens_by_hand(monkeypatch):
    # 512 sequences of 128-token prompts and 16-token answers: 512 x 128 / 16 = 4096 prompt
    # tokens a step (more than one 128-token prompt, so a step carries the average load);
    # 8 attention-DP ranks hold 512 each on average, 4 prompts of spread isl_cv = 1 each: the
    # busiest rank's sum is 512 (1 + z(8) x 1 / sqrt(4)), z(8) = 1.43447 the expected max of 8
    # standard normals (tabulated); it is more than one prompt (128), so it sets the step
    d = {**DSV3, "workload.isl": 128, "workload.osl": 16, "workload.isl_cv": 1.0}
    b = batch(d)
    seen = {}

    def spy(*args, **kw):
        seen["pre_rank"] = kw["pre_rank"]
        return "step"

    monkeypatch.setattr(phases, "step", spy)
    load = phases.prompt_load(b)
    x = phases.context(b, Coefficients(b))
    phases.prompt_step(b, Coefficients(b), x, load.decoding, load, False)
    assert float(seen["pre_rank"][0]) == pytest.approx(512 * (1 + 1.43447 / 2), rel=1e-5)


def test_kv_packing_of_a_prefill_only_instance_by_hand():
    # a prefill-only instance holds prompts only: its fit is the prompt's mean with the
    # prompts' spread alone, isl (1 + 2.326 x isl_cv / sqrt(C / dp)), whatever the answers'
    # spread: isl 1024, isl_cv 0.5, osl_cv 1, 16 prompts on one scheduler:
    # 1024 (1 + 2.3263 x 0.5 / 4) = 1321.8 tokens
    b = batch({**L70, "workload.phase": "prefill", "workload.isl_cv": 0.5,
               "workload.osl_cv": 1.0, "workload.concurrency": 16})
    got = lengths.fit_context_tokens(b, 0.0, np.array([16.0]))
    assert float(got[0]) == pytest.approx(1024 * (1 + 2.3263479 * 0.5 / 4), rel=1e-6)


@pytest.mark.parametrize("dp", [1, 2])
def test_kv_packing_with_both_spreads_by_hand(dp):
    # isl 1024 (isl_cv 0.25), osl 1024 (osl_cv 0.5, c2 = 0.25), 64 sequences on one scheduler:
    # the in-flight mean final length is 1024 + 1024 x 1.25 = 2304 tokens, its sd
    # sqrt((0.25 x 1024)^2 + 1024^2 x 1.25 x 0.25) = sqrt(65,536 + 327,680) = 627.1 tokens;
    # at p99 over sqrt(64) = 8: 2304 (1 + 2.3263 x 627.1 / 2304 / 8) = 2486.3 tokens; over two
    # attention-DP ranks each scheduler packs 32: over sqrt(32)
    b = batch({**L70, "layout.dp": dp, "workload.isl_cv": 0.25, "workload.osl_cv": 0.5})
    got = lengths.fit_context_tokens(b, 1.0, np.array([64.0]))
    sd = np.sqrt(0.25 ** 2 * 1024 ** 2 + 1024 ** 2 * 1.25 * 0.25)
    want = 2304 * (1 + 2.3263479 * sd / 2304 / np.sqrt(64 / dp))
    assert float(got[0]) == pytest.approx(want, rel=1e-6)
    # one sequence over dp ranks is one on its rank (never half): the full p99 margin
    one_seq = lengths.fit_context_tokens(b, 1.0, np.array([1.0]))
    assert float(one_seq[0]) == pytest.approx(2304 + 2.3263479 * sd, rel=1e-6)

