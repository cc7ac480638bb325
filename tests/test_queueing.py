"""Request-rate serving (dse/perf/queueing.py): the M/D/1 approximation against a seeded
discrete-event simulation, formulas by hand, Little's law, goodput and saturation."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch, one

from dse.perf import queueing, score
from dse.perf.memory_fit import reason_text

L70 = {"accelerator.id": "h100-sxm", "model.id": "llama-3.1-70b", "model.weight_dtype": "fp8",
       "layout.tp": 4, "workload.isl": 2048, "workload.osl": 256}


def simulate_md1_waits(rate_per_s, service_s, n=200_000, seed=7):
    """FIFO single server, Poisson arrivals, deterministic service: each request's wait by
    Lindley's recursion W' = max(0, W + S - gap), the first 10% dropped (warm-up)."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate_per_s, n)
    w = np.empty(n)
    w[0] = 0.0
    for i in range(1, n):                     # an event per arrival: the simulation itself
        w[i] = max(0.0, w[i - 1] + service_s - gaps[i])
    return w[n // 10:]


@pytest.mark.parametrize("rho", [0.5, 0.7, 0.9])
def test_md1_percentiles_match_a_discrete_event_simulation(rho):
    s = 0.25
    w = simulate_md1_waits(rho / s, s)
    assert queueing.md1_mean_wait_s(rho, s) == pytest.approx(w.mean(), rel=0.05)
    assert queueing.md1_wait_quantile_s(0.9, rho, s) == pytest.approx(np.quantile(w, 0.9),
                                                                       rel=0.08)
    assert queueing.md1_wait_quantile_s(0.99, rho, s) == pytest.approx(np.quantile(w, 0.99),
                                                                        rel=0.06)


def test_md1_formulas_by_hand():
    # Pollaczek-Khinchine for M/D/1: rho S / (2 (1 - rho)); rho = 0.5, S = 2 s -> 1 s
    assert queueing.md1_mean_wait_s(0.5, 2.0) == pytest.approx(1.0, rel=1e-12)
    # decay rate: 0.5 (e^x - 1) = x, i.e. e^x = 1 + 2x: x = 1.25643
    assert queueing.md1_decay(0.5) == pytest.approx(1.256431, rel=1e-6)
    # quantile: c = W theta = 1 * 1.25643 / 2 = 0.6282; p90 = ln(0.6282 / 0.1) / 0.62822 s
    x = 1.2564312086
    assert queueing.md1_wait_quantile_s(0.9, 0.5, 2.0) == pytest.approx(
        np.log(x / 2 / 0.1) / (x / 2), rel=1e-6)
    # below the tail's prefactor the quantile is 0 (most requests do not wait at all)
    assert queueing.md1_wait_quantile_s(0.5, 0.2, 1.0) == 0.0
    assert np.isinf(queueing.md1_wait_quantile_s(0.9, 1.0, 1.0))


RATES = [0.5, 2.0, 4.0, 6.0]


def _at_rates(rates, **kw):
    rows = [{**L70, "workload.request_rate_per_s": r, "workload.ttft_slo_s": 2.0,
             "workload.tpot_slo_s": 0.05, **kw} for r in rates]
    return score(batch(rows))


def test_concurrency_follows_from_the_rate_by_littles_law():
    s = _at_rates(RATES)
    assert np.all(s["feasible"])
    np.testing.assert_allclose(s["requests_per_s_per_instance"], RATES)
    # C = lambda x time in the batch (the prompt's prefill and its 256 tokens; the mean queue
    # wait in ttft_s is spent outside it)
    in_batch = s["ttft_s"] - s["ttft_queue_wait_s"] + 256 * s["tpot_s"]
    np.testing.assert_allclose(s["concurrency"], np.array(RATES) * in_batch, rtol=1e-5)
    assert np.all(np.diff(s["concurrency"]) > 0)
    assert np.all(s["ttft_queue_wait_s"] > 0)
    # output tokens per chip = rate x osl / chips (everything that arrives is served)
    np.testing.assert_allclose(s["output_tokens_per_s_per_chip"], np.array(RATES) * 256 / 4,
                               rtol=2e-3)
    # the queue grows with the rate: every percentile rises, p99 above p90 above the mean
    assert np.all(np.diff(s["ttft_p90_s"]) > 0) and np.all(np.diff(s["tpot_p90_s"]) > 0)
    assert np.all(s["ttft_p99_s"] >= s["ttft_p90_s"])
    assert np.all(s["tpot_p90_s"] >= s["tpot_s"])


def test_saturation_runs_max_batch_size_per_scheduler_on_every_dp_rank():
    """dp = 2 ranks, each scheduler running at most max_batch_size = 8: the instance holds
    C = 2 x 8 = 16 sequences at most (not 8), and at short prompts the prefill queue is far from
    full there, so the saturation rate is Little's law at C = 16: 16 / R(16), R the time a
    request stays in the batch, ttft_unloaded + osl x tpot of the closed loop at 16 (about
    3.88 requests/s; at C = 8 it would be 8 / R(8), about 2.25)."""
    d = {**L70, "layout.dp": 2, "serving.max_batch_size": 8}
    s = score(batch([{**d, "workload.request_rate_per_s": 0.5}]))
    at16 = score(batch([{**d, "workload.concurrency": 16}]))
    r16 = float(at16["ttft_unloaded_s"][0] + 256 * at16["tpot_s"][0])
    assert float(at16["max_concurrent_sequences"][0]) == 16.0
    assert float(s["saturation_requests_per_s_per_instance"][0]) == pytest.approx(16.0 / r16,
                                                                                   rel=1e-5)


def test_above_saturation_is_infeasible_with_its_reason():
    s = _at_rates([1.0])
    sat = float(s["saturation_requests_per_s_per_instance"][0])
    over = _at_rates([sat * 1.5])
    assert not over["feasible"][0]
    assert "saturation rate" in reason_text(int(over["reason"][0]))
    # the bound is the saturation rate itself (to the root's precision), not a margin above it
    assert not _at_rates([sat * 1.05])["feasible"][0]
    under = _at_rates([sat * 0.95])
    assert under["feasible"][0]


@pytest.mark.parametrize("design", [
    L70,
    {**L70, "accelerator.id": "h200-sxm", "workload.isl": 8192, "workload.osl": 1024},
    {"accelerator.id": "gb200", "model.id": "deepseek-v3", "model.weight_dtype": "fp8",
     "layout.dp": 8, "layout.ep": 8, "workload.isl": 2048, "workload.osl": 1024},
])
def test_goodput_never_exceeds_saturation_and_meets_its_slos(design):
    rows = [{**design, "workload.ttft_slo_s": t, "workload.tpot_slo_s": p}
            for t, p in ((2.0, 0.05), (0.5, 0.03), (10.0, 0.2), (2.0, 0.0))]
    s = score(batch(rows))
    chips = s["num_chips"]
    good = s["goodput_requests_per_s_per_chip"] * chips
    assert np.all(good <= s["saturation_requests_per_s_per_instance"] * (1 + 1e-9))
    assert good[2] >= good[0] >= good[1]          # looser SLOs never buy less
    # at the goodput rate the p90s hold (to the bisection's precision)
    for i in np.flatnonzero(good > 0):
        m = one({**rows[i], "workload.request_rate_per_s": float(good[i]) * 0.999})
        assert m["ttft_p90_s"] <= rows[i]["workload.ttft_slo_s"] * 1.001
        if rows[i]["workload.tpot_slo_s"] > 0:
            assert m["tpot_p90_s"] <= rows[i]["workload.tpot_slo_s"] * 1.001


def test_off_by_default_and_nan_without_a_rate_or_slo():
    m = one({**L70, "workload.concurrency": 32})
    for k in queueing.NEW_METRICS:
        assert np.isnan(m[k]), k
    # an SLO alone gives goodput; a fixed-concurrency design has no queue: p90 = the value
    m = one({**L70, "workload.concurrency": 32, "workload.ttft_slo_s": 2.0})
    assert m["goodput_requests_per_s_per_chip"] > 0
    assert m["ttft_p90_s"] == m["ttft_s"] and m["tpot_p90_s"] == m["tpot_s"]
    # a rate without an SLO has a queue but no goodput (a row with one beside it or not)
    s = score(batch([{**L70, "workload.request_rate_per_s": 1.0},
                     {**L70, "workload.request_rate_per_s": 1.0, "workload.ttft_slo_s": 2.0}]))
    assert np.isnan(s["goodput_requests_per_s_per_chip"][0])
    assert s["goodput_requests_per_s_per_chip"][1] > 0


def test_a_space_or_design_giving_both_rate_and_concurrency_is_refused(tmp_path, capsys):
    # the rate sets the concurrency (Little's law): beside a swept or fixed concurrency one of
    # them would be silently dropped, so spaces and design files give one of them
    from helpers import ROOT

    from dse.cli import main
    quick = (ROOT / "spaces" / "quickstart.toml").read_text()
    sp = tmp_path / "s.toml"
    sp.write_text(quick.replace("[parameters]", '[parameters]\n"workload.request_rate_per_s" = '
                                "[0, 2]"))
    assert main(["run", str(sp), "--out", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "parameters.workload.concurrency" in err
    assert "workload.request_rate_per_s = 2 are both given" in err
    d = tmp_path / "d.toml"
    d.write_text('[accelerator]\nid = "h100-sxm"\n[model]\nid = "llama-3.1-70b"\n'
                 'weight_dtype = "fp8"\n[layout]\ntp = 4\n[workload]\nisl = 2048\nosl = 256\n'
                 "concurrency = 16\nrequest_rate_per_s = 2.0\n")
    assert main(["eval", str(d)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "workload.concurrency = 16 and workload.request_rate_per_s = 2 are both given" in err
    # without the concurrency: the rate's, as the scorer gives it
    d.write_text(d.read_text().replace("concurrency = 16\n", ""))
    assert main(["eval", str(d), "--json"]) == 0
    import json
    got = json.loads(capsys.readouterr().out)
    m = one({**L70, "workload.request_rate_per_s": 2.0})
    assert got["metrics"]["concurrency"] == pytest.approx(m["concurrency"], rel=1e-12)
    assert 1 < m["concurrency"] < 64


def test_an_instance_that_fits_one_sequence_saturates_at_its_rate_by_hand():
    # Llama-3.1-8B in bf16 on an 18.5 GB chip: 18.5 - 2 (reserve) - 16.06 (weights) = 0.44 GB
    # holds one 2048-token sequence (268.4 MB of KV / 0.9 + activations), not two; at most one
    # request is in the batch, so by Little's law the instance serves at most 1 / (TTFT + 1024
    # TPOT) requests/s, both at a batch of one
    d = {"accelerator.id": "h100-sxm", "model.id": "llama-3.1-8b", "model.weight_dtype": "bf16",
         "model.kv_dtype": "bf16", "layout.tp": 1, "accelerator.hbm_capacity_bytes": 18.5e9,
         "serving.runtime_reserve_bytes": 2e9, "serving.kv_memory_fraction": 0.9,
         "workload.isl": 1024, "workload.osl": 1024}
    at_one = one({**d, "workload.concurrency": 1})
    assert at_one["max_concurrent_sequences"] == 1
    m = one({**d, "workload.request_rate_per_s": 0.01})
    assert m["saturation_requests_per_s_per_instance"] == pytest.approx(
        1.0 / (at_one["ttft_s"] + 1024 * at_one["tpot_s"]), rel=1e-5)
