"""Disaggregated serving: a decode instance fed by a prefill pool with its own layout."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import batch, design, one

from dse.perf import score

DSV3 = dict(acc="gb200", model="deepseek-v3", **{
    "topology.id": "nvl72", "model.weight_dtype": "fp8", "layout.tp": 1, "layout.ep": 32,
    "layout.dp": 32, "layout.prefill_ep": 8, "layout.prefill_dp": 8, "workload.isl": 2048,
    "workload.osl": 1024, "workload.concurrency": 2048, "workload.prefill_concurrency": 4,
    # (no front end: the worked TTFTs below are the pools' own; tests/test_served_overheads.py
    # adds it)
    "serving.request_overhead_s": 0.0, "serving.frontend_prompt_token_s": 0.0,
    "serving.frontend_token_s": 0.0, "serving.frontend_text_token_s": 0.0})


def _disagg(**kw):
    return design(**{**DSV3, "serving.mode": "disaggregated", **kw})


def _phase(phase, **kw):
    """The same design scored as one instance of a single phase."""
    d = {**DSV3, "workload.phase": phase, **kw}
    return one(design(**d))


def test_balanced_pools_match_the_two_phase_instances():
    """With the balanced ratio the prefill pool's request rate equals what the decodes take:
    output per chip = decode rate / (1 + ratio), worked from the single-phase instances."""
    dec = _phase("decode")
    pre = _phase("prefill", **{"layout.ep": 8, "layout.dp": 8, "workload.concurrency": 4})
    need = dec["output_tokens_per_s_per_chip"] / 1024          # requests/s per decode chip
    give = pre["output_tokens_per_s_per_chip"]                 # requests/s per prefill chip
    ratio = need / give
    m = one(_disagg())
    assert m["feasible"]
    assert m["tpot_s"] == pytest.approx(dec["tpot_s"], rel=1e-9)
    assert m["output_tokens_per_s_per_chip"] == pytest.approx(need * 1024 / (1 + ratio), rel=1e-9)
    assert m["num_chips"] == pytest.approx(32 * (1 + ratio), rel=1e-9)
    # an instance is the 32 decode chips running flat out (and their prefill share)
    assert m["output_tokens_per_s_per_instance"] == pytest.approx(need * 1024 * 32, rel=1e-9)
    assert m["ttft_s"] > 1.5 * pre["ttft_s"]                   # plus the KV transfer


def test_fixed_ratio_limits_by_the_smaller_pool():
    bal = one(_disagg())
    ratio = bal["num_chips"] / 32 - 1
    few = one(_disagg(**{"serving.prefill_chip_ratio": ratio / 2}))      # prefill-bound
    many = one(_disagg(**{"serving.prefill_chip_ratio": ratio * 2}))     # decode-bound
    assert few["output_tokens_per_s_per_chip"] < bal["output_tokens_per_s_per_chip"]
    assert many["output_tokens_per_s_per_chip"] < bal["output_tokens_per_s_per_chip"]
    # decode-bound: the decodes run flat out, the extra prefill chips only dilute
    assert many["output_tokens_per_s_per_chip"] * (1 + 2 * ratio) == pytest.approx(
        bal["output_tokens_per_s_per_chip"] * (1 + ratio), rel=1e-9)
    # prefill-bound: half the prefill chips, half the requests
    assert few["output_tokens_per_s_per_chip"] * (1 + ratio / 2) == pytest.approx(
        0.5 * bal["output_tokens_per_s_per_chip"] * (1 + ratio), rel=1e-9)


@pytest.mark.parametrize("ratio", [0.0, 0.3, 3.0])
def test_token_prices_pay_for_every_chip(ratio):
    """$/Mtok out x output rate + $/Mtok in x input rate = the cost of all chips."""
    m = one(_disagg(**{"serving.prefill_chip_ratio": ratio}))
    usd_per_chip_s = m["usd_per_chip_hour"] / 3600
    spent = (m["usd_per_mtok_output"] * m["output_tokens_per_s_per_chip"]
             + m["usd_per_mtok_input"] * m["input_tokens_per_s_per_chip"]) / 1e6
    assert spent == pytest.approx(usd_per_chip_s, rel=1e-9)


def test_prefill_layout_defaults_to_the_decode_layout():
    a = one(_disagg(**{"layout.prefill_ep": 0, "layout.prefill_dp": 0}))
    b = one(_disagg(**{"layout.prefill_ep": 32, "layout.prefill_dp": 32}))
    for k in a:
        np.testing.assert_equal(a[k], b[k], err_msg=k)


def test_kv_transfer_uses_scale_up_inside_one_domain():
    """Both instances in one NVL72 domain move the prompt's KV over NVLink; a decode instance of
    64 plus a prefill instance of 16 chips do not fit in 72 and use the scale-out NICs."""
    inside = one(_disagg(**{"layout.prefill_ep": 8, "layout.prefill_dp": 8}), ideal=True)
    b = batch(_disagg(**{"layout.ep": 64, "layout.dp": 64, "layout.prefill_ep": 16,
                         "layout.prefill_dp": 16}), ideal=True)
    outside = {k: v[0] for k, v in score(b).items()}
    kv = inside["kv_bytes_per_token"] * 2048
    assert inside["kv_bytes_per_token"] == pytest.approx(outside["kv_bytes_per_token"])
    bw_in = b.scaleup_bw_bytes_per_s[0]
    bw_out = b.scaleout_bw_bytes_per_s[0]
    assert bw_in > bw_out
    # TTFT - 1.5 prefill pass = latency + KV bytes / (link x shards): recompute the prefill pass
    pre = one(design(**{**DSV3, "workload.phase": "prefill", "layout.ep": 16, "layout.dp": 16,
                        "workload.concurrency": 4}), ideal=True)
    kv_s = outside["ttft_s"] - 1.5 * pre["ttft_s"]
    assert kv_s == pytest.approx(b.scaleout_latency_s[0] + kv / (bw_out * 16), rel=1e-6)
    assert math.isfinite(inside["ttft_s"])


def test_mixed_batch_equals_its_rows():
    rows = [_disagg(), design(**DSV3), _disagg(**{"serving.prefill_chip_ratio": 2.0}),
            design(**{**DSV3, "workload.concurrency": 64})]
    together = score(batch(rows))
    for i, r in enumerate(rows):
        alone = one(r)
        for k, v in together.items():
            np.testing.assert_allclose(v[i], alone[k], rtol=1e-12, err_msg=k)


def test_mixed_batch_breakdown_picks_each_rows_steps():
    rows = [_disagg(), design(**DSV3)]
    m, steps = score(batch(rows), breakdown=True)
    m0, s0 = score(batch(rows[0]), breakdown=True)
    m1, s1 = score(batch(rows[1]), breakdown=True)
    np.testing.assert_allclose(steps.prefill.total_s, [s0.prefill.total_s[0], s1.prefill.total_s[0]])
    np.testing.assert_allclose(steps.decode.op_s[:, 1], s1.decode.op_s[:, 0])


def test_disaggregation_removes_prefill_interference():
    """The decode instance's step carries no prompt tokens: TPOT below the aggregated one."""
    assert one(_disagg())["tpot_s"] < one(design(**DSV3))["tpot_s"]


def test_bad_disaggregation_values_are_input_errors():
    from dse.errors import InputError
    with pytest.raises(InputError, match="serving.mode"):
        batch(_disagg(**{"serving.mode": "split"}))
    with pytest.raises(InputError, match="layout.prefill_tp"):
        batch(_disagg(**{"layout.prefill_tp": -1}))
    with pytest.raises(InputError, match="serving.prefill_chip_ratio"):
        batch(_disagg(**{"serving.prefill_chip_ratio": -0.5}))


@pytest.mark.parametrize("domain, link, frac, lat", [(72, "scaleup", 0.8, 1e-6),
                                                     (32, "scaleout", 0.5, 5e-6)])
def test_kv_transfer_by_hand_from_the_smaller_instance(domain, link, frac, lat):
    """A decode instance of tp 1 x pp 2 x dp 8 = 16 chips fed by prefill instances of tp 2 x
    pp 2 x dp 8 = 32 chips. A prompt's KV, 2048 tokens x 61 layers x (512 latent + 64 rope) x
    1 B (fp8 KV) = 71,958,528 B, moves with every chip of the smaller instance (16) sending its
    shard at once: inside a 72-chip domain over scale-up at its achievable fraction (0.8), in a
    32-chip domain (16 + 32 chips do not fit) over the scale-out NICs (0.5), after one latency.
    TTFT = 1.5 prefill passes (half a pass of waiting, the pass) + that transfer. An output
    token's energy is the decode pool's: a decode chip's wall power over the output tokens/s
    one decode chip serves (the prefill chips' energy goes with the input tokens)."""
    d = _disagg(**{"layout.pp": 2, "layout.dp": 8, "layout.ep": 8, "layout.prefill_tp": 2,
                   "layout.prefill_pp": 2, "layout.prefill_dp": 8, "layout.prefill_ep": 16,
                   "model.kv_dtype": "fp8", "workload.concurrency": 256})
    pins = {"domain_chips": float(domain), f"{link}_bw_bytes_per_s": 800e9,
            f"{link}_fraction": frac, f"{link}_latency_s": lat}
    b = batch(d, ideal=True).replace(**pins)
    m = {k: v[0] for k, v in score(b).items()}
    pre = one(design(**{**DSV3, "workload.phase": "prefill", "layout.tp": 2, "layout.pp": 2,
                        "layout.dp": 8, "layout.ep": 16, "model.kv_dtype": "fp8",
                        "workload.concurrency": 4}), ideal=True, **pins)
    kv = 2048 * 61 * (512 + 64) * 1.0
    assert kv == 71_958_528
    assert m["ttft_s"] - 1.5 * pre["ttft_s"] == pytest.approx(lat + kv / (800e9 * frac * 16),
                                                              rel=1e-6)
    per_decode_chip = m["output_tokens_per_s_per_chip"] * m["num_chips"] / 16
    assert m["joules_per_output_token"] == pytest.approx(
        b.power_w[0] * b.pue[0] / per_decode_chip, rel=1e-9)
