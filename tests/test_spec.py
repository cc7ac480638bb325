"""Speculative decoding / MTP (dse/perf/spec.py): hand-worked formula, both roofline ends,
monotone in acceptance, the drafter's memory, and bad input."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch, one

from dse.errors import InputError
from dse.perf import phases, score, spec

DSV3 = {"accelerator.id": "h200-sxm", "model.id": "deepseek-v3", "model.weight_dtype": "fp8",
        "layout.tp": 8, "layout.ep": 8, "workload.isl": 2048, "workload.osl": 512}
L70 = {"accelerator.id": "h100-sxm", "model.id": "llama-3.1-70b", "model.weight_dtype": "fp8",
       "layout.tp": 4, "workload.isl": 2048, "workload.osl": 256}


def test_expected_accepted_tokens_by_hand():
    # (1 - a^(k+1)) / (1 - a): a = 0.5, k = 3: 1 + 0.5 + 0.25 + 0.125 = 1.875
    assert spec.expected_tokens(0.5, 3) == pytest.approx(1.875, rel=1e-12)
    # a = 0.8, k = 1: 1 + 0.8
    assert spec.expected_tokens(0.8, 1) == pytest.approx(1.8, rel=1e-12)
    # a = 0.85, k = 2: 1 + 0.85 + 0.7225
    assert spec.expected_tokens(0.85, 2) == pytest.approx(2.5725, rel=1e-12)
    assert spec.expected_tokens(1.0, 3) == 4.0          # every draft accepted
    assert spec.expected_tokens(0.0, 5) == 1.0          # only the verifier's own token
    assert spec.expected_tokens(0.7, 0) == 1.0          # no drafts


def test_tpot_is_the_pass_time_over_the_expected_tokens():
    # the same pass (verify k+1 tokens + k drafts) at two acceptances: tpot x E is the pass
    # time, which acceptance does not change on a decode instance (with prompts, answers that
    # finish sooner bring more prefill per step)
    rows = [{**DSV3, "workload.concurrency": 16, "serving.spec_tokens": 2,
             "workload.phase": "decode",
             "serving.spec_acceptance": a} for a in (0.3, 0.9)]
    s = score(batch(rows))
    e = spec.expected_tokens(np.array([0.3, 0.9]), 2)
    passes = s["tpot_s"] * e
    assert passes[0] == pytest.approx(passes[1], rel=1e-9)
    assert s["tpot_s"][1] < s["tpot_s"][0] / 1.3


def test_mtp_gain_at_batch_one_is_near_the_published_one():
    # DeepSeek-V3 at batch 1 with its MTP module at 85% acceptance: the report's 1.8x decoding
    # speed-up; dse prices the verification step (2 tokens touch up to 16 experts per layer)
    # and the draft layer, so a little less than E = 1.85
    lo0 = one({**DSV3, "workload.concurrency": 1})
    lo1 = one({**DSV3, "workload.concurrency": 1, "serving.spec_tokens": 1})
    assert 1.5 < lo0["tpot_s"] / lo1["tpot_s"] < 1.85


DRAFT = {"serving.spec_tokens": 3, "serving.spec_acceptance": 0.8, "serving.spec_method": "draft",
         "serving.spec_draft_model": "llama-3.1-8b"}


def test_speculation_helps_where_decode_is_memory_bound_not_where_compute_bound():
    # speed of light, Llama 70B drafted by Llama 8B, k = 3, a = 0.8: E = 2.952
    e = float(spec.expected_tokens(0.8, 3))
    d = {**L70, "accelerator.id": "h200-sxm", "workload.phase": "decode"}
    lo0 = one({**d, "workload.concurrency": 1}, ideal=True)
    lo1 = one({**d, "workload.concurrency": 1, **DRAFT}, ideal=True)
    assert lo0["decode_memory_s"] > 10 * lo0["decode_compute_s"]
    # memory-bound: verifying 4 tokens reads the same weights as 1; the 3 drafts read 3 x 8B
    # of weights next to 70B: pass ~ 1 + 3 * 8.03 / 70.6 = 1.34 steps -> gain ~ E / 1.34
    gain_lo = lo0["tpot_s"] / lo1["tpot_s"]
    assert gain_lo == pytest.approx(e / (1 + 3 * 8.03 / 70.6), rel=0.05)
    # compute-bound: a verification step costs ~4 decode steps of FLOPs and yields 2.95
    d = {**d, "workload.isl": 64, "workload.osl": 64}
    hi0 = one({**d, "workload.concurrency": 2048}, ideal=True)
    hi1 = one({**d, "workload.concurrency": 2048, **DRAFT}, ideal=True)
    assert hi0["decode_compute_s"] > hi0["decode_memory_s"]
    gain_hi = hi0["tpot_s"] / hi1["tpot_s"]
    assert gain_hi < 1.0 < 2.0 < gain_lo


@pytest.mark.parametrize("conc", [1, 32, 512])
def test_more_acceptance_never_slows_a_user(conc):
    acc = np.linspace(0.0, 1.0, 11)
    for method in ({"serving.spec_method": "mtp"},
                   {"serving.spec_method": "draft", "serving.spec_draft_model": "llama-3.1-8b"}):
        base = DSV3 if method["serving.spec_method"] == "mtp" else L70
        rows = [{**base, **method, "workload.concurrency": conc, "serving.spec_tokens": 3,
                 "serving.spec_acceptance": a} for a in acc]
        u = score(batch(rows))["output_tokens_per_s_per_user"]
        assert np.all(np.diff(u) >= -1e-12 * u[:-1]), u


def test_drafter_costs_memory():
    off = one({**DSV3, "workload.concurrency": 64})
    on = one({**DSV3, "workload.concurrency": 64, "serving.spec_tokens": 1})
    # the MTP module is one MoE layer (+ a 2d x d projection): DeepSeek-V3's is 14B parameters
    # with its embedding/head copies (685B - 671B); sharded 8 ways at 1 byte per fp8 weight
    extra = on["weights_bytes_per_chip"] - off["weights_bytes_per_chip"]
    assert 0.75 * 14e9 / 8 < extra < 14e9 / 8
    # its KV: one layer's latent per token next to the 61 layers'
    ratio = on["kv_bytes_per_chip"] / off["kv_bytes_per_chip"]
    assert ratio == pytest.approx(62 / 61, rel=1e-9)
    d = {**L70, "workload.concurrency": 8}
    small = one({**d, "serving.spec_tokens": 3, "serving.spec_method": "draft",
                 "serving.spec_draft_model": "llama-3.1-8b"})
    # an 8B draft at fp8, tp 4: 8.03e9 / 4 bytes per chip
    assert small["weights_bytes_per_chip"] - one(d)["weights_bytes_per_chip"] == \
        pytest.approx(8.03e9 / 4, rel=0.01)


def test_the_mtp_modules_weights_by_hand():
    """DeepSeek-V3's MTP module on tp = 8 x ep = 8, fp8 (1 B a weight), per chip: its MLA
    attention 187,105,280 / 8 = 23,388,160; its MoE layer's 256 experts of 3 x 7168 x 2048 =
    44,040,192 and the router's 7168 x 256 over the 8 chips, (11,274,289,152 + 1,835,008) / 8 =
    1,409,515,520, the shared expert's 44,040,192 / 8 = 5,505,024; the 2d x d projection
    2 x 7168^2 / 8 = 12,845,056: 1,451,253,760 B more than without drafting."""
    off = one({**DSV3, "workload.concurrency": 64})
    on = one({**DSV3, "workload.concurrency": 64, "serving.spec_tokens": 1})
    experts = (256 * 3 * 7168 * 2048 + 7168 * 256) / 8
    assert experts == 1_409_515_520
    want = 187_105_280 / 8 + experts + 3 * 7168 * 2048 / 8 + 2 * 7168 ** 2 / 8
    assert want == 1_451_253_760
    assert on["weights_bytes_per_chip"] - off["weights_bytes_per_chip"] \
        == pytest.approx(want, rel=1e-12)


def test_default_acceptance_is_the_published_one():
    a = batch({**DSV3, "serving.spec_tokens": 1}).spec_acceptance
    assert float(a[0]) == 0.85                # serving.toml [spec_acceptance] mtp
    a = batch({**L70, "serving.spec_tokens": 1, "serving.spec_method": "draft",
               "serving.spec_draft_model": "llama-3.1-8b"}).spec_acceptance
    assert float(a[0]) == 0.6


def test_bad_draft_model_is_one_clear_error():
    with pytest.raises(InputError, match="unknown draft model id 'llama-3.1-8bb'"):
        batch({**L70, "serving.spec_tokens": 2, "serving.spec_method": "draft",
               "serving.spec_draft_model": "llama-3.1-8bb"})
    with pytest.raises(InputError, match="needs serving.spec_draft_model"):
        batch({**L70, "serving.spec_tokens": 2, "serving.spec_method": "draft"})
    with pytest.raises(InputError):
        batch({**L70, "serving.spec_tokens": 2, "serving.spec_acceptance": 1.5})


def test_a_space_sweeping_draft_tokens_without_a_draft_model_is_refused(tmp_path, capsys):
    # the draft tokens are a parameter (written straight into the scorer's Batch): the space is
    # still refused when any of its values asks a drafter that is not named, in one line
    from helpers import ROOT

    from dse.cli import main
    text = (ROOT / "spaces" / "quickstart.toml").read_text().replace(
        "[parameters]", '[serving]\nspec_method = "draft"\n\n[parameters]\n'
        '"serving.spec_tokens" = [0, 2]')
    sp = tmp_path / "s.toml"
    sp.write_text(text)
    assert main(["run", str(sp), "--out", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert 'serving.spec_tokens = 2 needs serving.spec_draft_model' in err
    assert not (tmp_path / "r").exists()


def test_answers_that_finish_sooner_bring_more_prompt_tokens_per_step_by_hand():
    # 8 sequences of 2048-token prompts and 256-token answers: a step carries 8 x 2048 / 256 =
    # 64 prompt tokens on average; with 2.5 tokens a sequence a step (speculation) an answer
    # finishes in 256 / 2.5 steps and a step carries 2.5 times as many: 160
    b = batch({**L70, "workload.concurrency": 8})
    assert float(phases.prompt_load(b).avg[0]) == pytest.approx(64.0, rel=1e-12)
    assert float(phases.prompt_load(b, per_step=np.array([2.5])).avg[0]) \
        == pytest.approx(160.0, rel=1e-12)


def test_a_draft_model_drafts_for_one_micro_batch_per_stage_step_by_hand():
    # Llama-3.1-70B on tp 4, pp 2, 64 sequences: a stage step carries one micro-batch of 32;
    # the 8B drafter (8.03e9 fp8 weights; 32 layers x 2 x 8 x 128 fp8 KV = 65,536 B a token),
    # tp-sharded, reads its weights and the 32 sequences' KV at the mean context 2048 + 256/2
    # at 4 TB/s (memory-bound: 2 x 8.03e9 x 32 / 4 FLOPs at 1 PFLOP/s is 0.13 ms), plus 10 us
    # a layer, once per draft token (3)
    d = {**L70, "layout.pp": 2, "workload.concurrency": 64, "workload.phase": "decode",
         "serving.spec_tokens": 3, "serving.spec_method": "draft",
         "serving.spec_draft_model": "llama-3.1-8b"}
    b = batch(d, ideal=True).replace(matmul_flops_per_s=1e15, hbm_bw_bytes_per_s=4e12,
                                     layer_overhead_s=10e-6)
    draft = phases.steps(b, False, phases.prompt_load(b), q=np.array([4.0]))[2]
    one = (8.03e9 + 32 * 2176 * 65536) / 4 / 4e12 + 32 * 10e-6
    assert float(draft[0]) == pytest.approx(3 * one, rel=1e-9)


def test_an_mtp_draft_step_is_the_stage_steps_mean_layer_and_its_head_by_hand():
    # DeepSeek-V3 on tp 8, ep 8, pp 2 (61 layers: 30.5 a stage), 64 sequences decoding, one MTP
    # draft token, no fixed times, HBM and links out of the way (1e30 B/s): a draft step is one
    # layer of the model, priced as the 1-token stage step's mean layer, plus the output head
    # on the micro-batch's 32 rows: 2 x 129,280 / 8 x 7168 FLOPs a row at 1 PFLOP/s
    d = {**DSV3, "layout.pp": 2, "workload.concurrency": 64, "workload.phase": "decode"}
    pins = {"matmul_flops_per_s": 1e15, "hbm_bw_bytes_per_s": 1e30,
            "scaleup_bw_bytes_per_s": 1e30, "scaleout_bw_bytes_per_s": 1e30,
            "layer_overhead_s": 0.0, "step_overhead_s": 0.0}
    plain = batch(d, ideal=True).replace(**pins)
    t1 = float(score(plain, breakdown=True)[1].decode.total_s[0])   # the 1-token stage step
    b = batch({**d, "serving.spec_tokens": 1}, ideal=True).replace(**pins)
    draft = phases.steps(b, False, phases.prompt_load(b), q=np.array([2.0]))[2]
    head = 2 * 129280 / 8 * 7168 * 32 / 1e15
    assert float(draft[0]) == pytest.approx((t1 - head) / 30.5 + head, rel=1e-9)


def test_an_mtp_draft_step_is_the_mean_layer_plus_the_output_head_by_hand():
    """MTP prices a draft step as the decode step's mean layer plus the output head (spec.draft_s,
    a coefficient namespace standing in for dse.perf.step's). The head of 64 sequences over
    dp = 2 ranks, padded by 8 GEMM rows: compute 1 us x (64 / 2 + 8) + 200 us fixed = 240 us,
    above its memory roof 100 us + 0.1 us x 64 = 106.4 us. A 10 ms decode step less its 1 ms
    fixed overhead and that head over 30 layers: a layer of (10 - 1 - 0.24) / 30 = 0.292 ms; a
    draft step 0.292 + 0.02 (the layer's fixed time) + 0.24 = 0.552 ms; 3 of them 1.656 ms.
    With a 1 ms memory roof the head is 1 + 0.0064 = 1.0064 ms: a layer of (9 - 1.0064) / 30 =
    0.26645 ms, 3 draft steps 3 x (0.26645 + 0.02 + 1.0064) = 3.8786 ms."""
    from types import SimpleNamespace
    b = SimpleNamespace(spec_tokens=np.array([3.0]), layer_overhead_s=np.array([20e-6]),
                        has_on=lambda name: False)

    def k(mem_s):
        head = SimpleNamespace(c=1e-6, w=200e-6, mem_s=mem_s, embed_s=0.1e-6)
        return SimpleNamespace(head=head, dp=2.0, h=8.0, overhead=1e-3, layers_stage=30.0)
    decode = np.array([10e-3])
    assert spec.head_s(k(100e-6), 64.0) == pytest.approx(240e-6, rel=1e-12)
    assert spec.draft_s(b, k(100e-6), 64.0, decode, 2048.0)[0] \
        == pytest.approx(1.656e-3, rel=1e-12)
    assert spec.draft_s(b, k(1e-3), 64.0, decode, 2048.0)[0] \
        == pytest.approx(3 * ((9e-3 - 1.0064e-3) / 30 + 20e-6 + 1.0064e-3), rel=1e-12)
