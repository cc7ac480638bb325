"""Request-rate serving of disaggregated rows (dse/perf/queueing.py, serve_disaggregated): the
decode pool by Little's law, the prefill pool as an M/D/1 queue, worked by hand from the
single-phase instances."""

from __future__ import annotations

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
    "serving.frontend_token_s": 0.0, "serving.frontend_text_token_s": 0.0,
    "serving.mode": "disaggregated", "serving.expert_imbalance": 1.0})


def _d(**kw):
    return design(**{**DSV3, **kw})


def test_decode_concurrency_follows_the_rate_by_littles_law():
    sat = one(_d(**{"workload.request_rate_per_s": 1.0}))["saturation_requests_per_s_per_instance"]
    lam = 0.5 * sat
    m = one(_d(**{"workload.request_rate_per_s": lam}))
    assert m["feasible"]
    c = m["concurrency"]
    at_c = one(_d(), concurrency=c)              # the same decode batch, no rate
    assert c == pytest.approx(lam * 1024 * at_c["tpot_s"], rel=1e-5)
    assert m["tpot_s"] == pytest.approx(at_c["tpot_s"], rel=1e-9)
    # every request that arrives is served
    assert m["output_tokens_per_s_per_instance"] == pytest.approx(lam * 1024, rel=1e-9)


def test_prefill_pool_wait_is_md1_by_hand():
    ratio = 1.0                                 # prefill chips per decode chip, fixed
    sat = one(_d(**{"workload.request_rate_per_s": 1.0, "serving.prefill_chip_ratio": ratio}))[
        "saturation_requests_per_s_per_instance"]
    lam = 0.6 * sat
    m = one(_d(**{"workload.request_rate_per_s": lam, "serving.prefill_chip_ratio": ratio}))
    pre = one(design(**{**DSV3, "serving.mode": "aggregated", "workload.phase": "prefill",
                        "layout.ep": 8, "layout.dp": 8, "workload.concurrency": 4}))
    plain = one(_d(**{"serving.prefill_chip_ratio": ratio}))
    t_pass = pre["ttft_s"]                      # one pass prefills 4 prompts
    kv = plain["ttft_s"] - 1.5 * t_pass         # the no-rate TTFT: 1.5 passes + the KV move
    instances = ratio * 32 / 8                  # 32 prefill chips in instances of 8
    s = t_pass / (4 * instances)
    rho = lam * s
    assert 0 < rho < 1
    wait = rho * s / (2 * (1 - rho))            # Pollaczek-Khinchine, M/D/1
    assert m["ttft_s"] == pytest.approx(t_pass + kv + wait, rel=1e-6)
    assert m["ttft_queue_wait_s"] == pytest.approx(wait, rel=1e-9)
    assert m["ttft_p99_s"] >= m["ttft_p90_s"] >= t_pass + kv


def test_saturation_goodput_and_overload():
    base = _d(**{"workload.request_rate_per_s": 1.0, "workload.ttft_slo_s": 2.0,
                 "workload.tpot_slo_s": 0.05})
    m = one(base)
    sat = m["saturation_requests_per_s_per_instance"]
    assert 0 < m["goodput_requests_per_s_per_chip"] * m["num_chips"] <= sat * (1 + 1e-9)
    over = one({**base, "workload.request_rate_per_s": 1.5 * sat})
    assert not over["feasible"] and int(over["reason"]) & 128
    # more load never shortens the p90 TTFT
    lo = one({**base, "workload.request_rate_per_s": 0.3 * sat})
    hi = one({**base, "workload.request_rate_per_s": 0.9 * sat})
    assert hi["ttft_p90_s"] > lo["ttft_p90_s"]


def test_rows_without_a_rate_are_unchanged_beside_rows_with_one():
    rows = [_d(), _d(**{"workload.request_rate_per_s": 5.0}), design(**{**DSV3,
            "serving.mode": "aggregated"})]
    s = score(batch(rows))
    for i in (0, 2):
        alone = one(rows[i])
        assert s["tpot_s"][i] == pytest.approx(alone["tpot_s"], rel=1e-12)
        assert s["ttft_s"][i] == pytest.approx(alone["ttft_s"], rel=1e-12)
    assert np.isnan(s["ttft_p90_s"][0]) and np.isfinite(s["ttft_p90_s"][1])


# ------------------------------------------------ a rate where it cannot be served (issue 11)

@pytest.mark.parametrize("phase", ["prefill", "decode"])
@pytest.mark.parametrize("field", ["workload.request_rate_per_s", "workload.ttft_slo_s",
                                   "workload.tpot_slo_s"])
def test_a_rate_or_slo_on_one_pool_is_refused(phase, field):
    # a prefill-only or decode-only instance has no request stream of its own: the rate was
    # silently ignored (concurrency 1, no percentiles); now one clear error
    from dse.errors import InputError
    d = design(**{**DSV3, "serving.mode": "aggregated", "workload.phase": phase,
                  "layout.ep": 8, "layout.dp": 8, "workload.concurrency": 64, field: 2.0})
    with pytest.raises(InputError, match=f"{field} = 2 on a {phase}-only instance"):
        one(d)
    # the whole disaggregated system takes the same rate
    whole = one(_d(**{field: 2.0}))
    assert whole["feasible"]


def test_a_grid_pairing_one_pool_with_a_rate_is_refused(tmp_path, capsys):
    # the phase and the rate swept together: (prefill, 5) is in the grid although each value
    # passes against the other parameter's first value; refused in one line, exit 2
    from dse.cli import main
    space = tmp_path / "s.toml"
    space.write_text('''name = "phase-rate"
[accelerator]
id = "gb200"
[model]
id = "llama-3.1-8b"
[workload]
isl = 1024
osl = 256
[parameters]
"workload.phase" = ["both", "prefill"]
"workload.request_rate_per_s" = [0, 5]
[objectives]
usd_per_mtok_output = "minimize"
''')
    assert main(["run", str(space), "--out", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "workload.request_rate_per_s = 5 with workload.phase = 'prefill'" \
        in err[0] and "s.toml" in err[0]
    assert not (tmp_path / "r").exists()
    # with the rate fixed at 0 the same phases load
    space.write_text(space.read_text().replace("[0, 5]", "[0]"))
    from dse.build.space import load_space
    assert len(load_space(str(space)).parameters) == 2


def test_a_ttft_slo_bounds_goodput_where_the_prefill_queue_meets_it():
    # a TTFT SLO of 1.2x the no-rate TTFT (1.5 prefill passes and the KV move) binds before
    # saturation: goodput is the rate whose p90 TTFT (a pass, the KV move and the prefill
    # queue's p90 wait) is the SLO: just below it the p90 holds, 2% above it it does not
    slo = 1.2 * one(_d())["ttft_s"]
    base = _d(**{"workload.ttft_slo_s": slo})
    m = one({**base, "workload.request_rate_per_s": 1.0})
    good = m["goodput_requests_per_s_per_chip"] * m["num_chips"]
    assert 0 < good < 0.99 * m["saturation_requests_per_s_per_instance"]
    below = one({**base, "workload.request_rate_per_s": 0.999 * good})
    above = one({**base, "workload.request_rate_per_s": 1.02 * good})
    assert below["ttft_p90_s"] <= slo * 1.001 < above["ttft_p90_s"]


def test_a_tpot_slo_alone_that_never_binds_leaves_goodput_at_saturation():
    # a 1 s TPOT SLO, far above any TPOT of the decode pool, and no TTFT SLO (a queue's p90
    # TTFT is not held to any number, however long near saturation): goodput is the
    # saturation rate
    m = one(_d(**{"workload.request_rate_per_s": 1.0, "workload.tpot_slo_s": 1.0}))
    assert m["goodput_requests_per_s_per_chip"] * m["num_chips"] == pytest.approx(
        m["saturation_requests_per_s_per_instance"], rel=1e-6)


def test_a_blank_prefill_ratio_feeds_the_decodes_at_their_saturation():
    # with a rate and no prefill_chip_ratio the prefill pool is sized to keep the decode pool
    # fed at its largest batch: the chips of the balanced instance at that concurrency
    m = one(_d(**{"workload.request_rate_per_s": 1.0}))
    cap = m["max_concurrent_sequences"]
    at_cap = one(_d(), concurrency=cap)
    assert m["num_chips"] == pytest.approx(at_cap["num_chips"], rel=1e-9)
    assert m["num_chips"] > 32


def test_a_rate_without_an_slo_has_no_goodput():
    m = one(_d(**{"workload.request_rate_per_s": 1.0}))
    assert np.isfinite(m["saturation_requests_per_s_per_instance"])
    assert np.isnan(m["goodput_requests_per_s_per_chip"])
