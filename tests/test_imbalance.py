"""Expert load imbalance and redundant experts (dse/perf/imbalance.py): the busiest EP rank
sets the step, redundant slots cost HBM and cut the excess."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch, one

from dse import catalog
from dse.perf import OPS, imbalance, score

MOE = OPS.index("moe_routed")
DSV3 = {"accelerator.id": "gb200", "model.id": "deepseek-v3", "model.weight_dtype": "fp8",
        "layout.dp": 8, "layout.ep": 8, "workload.isl": 2048, "workload.osl": 1024,
        "workload.concurrency": 1024, "serving.expert_imbalance": 1.0}


def _decode(rows, ideal=True):
    _, steps = score(batch(rows, ideal=ideal), breakdown=True)
    return steps.decode


def test_the_busiest_rank_sets_the_routed_experts_time():
    # speed of light (no tile padding, no per-layer latency): the routed experts' compute and
    # the all-to-all bytes are per token, so 1.5x the tokens on the busiest rank is 1.5x both
    d = _decode([DSV3, {**DSV3, "serving.expert_imbalance": 1.5}])
    c = d.compute_s[MOE]
    n = d.network_s[MOE]
    assert c[1] / c[0] == pytest.approx(1.5, rel=1e-12)
    assert n[1] / n[0] == pytest.approx(1.5, rel=1e-9)
    assert d.memory_s[MOE][1] == d.memory_s[MOE][0]        # the same experts are read
    # the other ops do not change
    for i, op in enumerate(OPS):
        if op != "moe_routed":
            assert d.op_s[i][1] == pytest.approx(d.op_s[i][0], rel=1e-12), op


def test_redundant_experts_cut_the_excess_and_cost_memory():
    # one replica per rank (8 over ep 8) halves the excess: 1.5 -> 1.25 (by hand)
    b = batch({**DSV3, "serving.expert_imbalance": 1.5, "serving.redundant_experts": 8})
    assert float(imbalance.effective(b)[0]) == pytest.approx(1.25, rel=1e-12)
    d = _decode([DSV3, {**DSV3, "serving.expert_imbalance": 1.5, "serving.redundant_experts": 8}])
    assert d.compute_s[MOE][1] / d.compute_s[MOE][0] == pytest.approx(1.25, rel=1e-12)
    # memory: 256 + 8 slots over 8 ranks = 33 experts per rank instead of 32; each expert is
    # 3 x 7168 x 2048 fp8 weights, 58 MoE layers
    off, on = one(DSV3), one({**DSV3, "serving.redundant_experts": 8})
    extra = on["weights_bytes_per_chip"] - off["weights_bytes_per_chip"]
    assert extra == pytest.approx(58 * 3 * 7168 * 2048 * 1.0, rel=1e-9)


def test_imbalance_never_speeds_up_and_dense_models_ignore_it():
    rows = [{**DSV3, "serving.expert_imbalance": x} for x in (1.0, 1.2, 1.6, 2.4)]
    t = score(batch(rows))["tpot_s"]
    assert np.all(np.diff(t) > 0)
    dense = {"accelerator.id": "h100-sxm", "model.id": "llama-3.1-70b", "layout.tp": 8,
             "workload.concurrency": 64}
    a, b = one(dense), one({**dense, "serving.expert_imbalance": 2.0,
                            "serving.redundant_experts": 16})
    assert a["tpot_s"] == b["tpot_s"] and a["weights_bytes_per_chip"] == b["weights_bytes_per_chip"]


def test_spare_slots_are_replicas_too():
    # 256 experts on 72 ranks: 4 slots per rank, 288 slots, 32 spare replicas already; asking
    # for 32 more adds none (ceil(288 / 72) = 4) and the excess is 0.5 x 72 / (72 + 32)
    d = {**DSV3, "layout.dp": 72, "layout.ep": 72, "serving.expert_imbalance": 1.5}
    for r in (0, 32):
        b = batch({**d, "serving.redundant_experts": r})
        assert float(imbalance.effective(b)[0]) == pytest.approx(1 + 0.5 * 72 / 104, rel=1e-12)
    b = batch({**d, "serving.redundant_experts": 72})      # 328 -> 5 per rank, 360 slots
    assert float(imbalance.effective(b)[0]) == pytest.approx(1 + 0.5 * 72 / 176, rel=1e-12)


# --- the default: the published routing model (serving.toml [expert_routing]) ---
BLANK = {k: v for k, v in DSV3.items() if k != "serving.expert_imbalance"}


def test_default_imbalance_by_hand():
    # DeepSeek-V3, 256 experts, ep 8: z(8) = Phi^-1((8 - 0.375) / 8.25) = Phi^-1(0.92424) =
    # 1.4345 (Blom), cv = 0.292: 1 + 1.4345 * 0.292 * sqrt(8 / 256) = 1 + 0.07405
    assert float(imbalance.raw(batch(BLANK))[0]) == pytest.approx(1.07405, abs=2e-4)
    # ep 72: z(72) = Phi^-1(71.625 / 72.25) = 2.381: 1 + 2.381 * 0.292 * sqrt(72 / 256) = 1.3687
    b = batch({**BLANK, "layout.dp": 72, "layout.ep": 72, "workload.concurrency": 8192})
    assert float(imbalance.raw(b)[0]) == pytest.approx(1.3687, abs=5e-4)
    # ... which the 32 spare slots of 288 on 72 ranks cut to 1 + 0.3687 x 72 / 104
    assert float(imbalance.effective(b)[0]) == pytest.approx(1 + 0.3687 * 72 / 104, abs=5e-4)


def test_default_fits_the_published_measurement():
    # the source: max/mean 1.069 at 16 EP ranks over 896 experts (vLLM PR #50647, Kimi K3)
    cv = catalog.expert_load_cv()
    assert float(imbalance.published_imbalance(16, 896, cv)) == pytest.approx(1.069, abs=1e-3)
    # a 20% larger skew is a 20% larger excess
    assert (imbalance.published_imbalance(72, 256, 1.2 * cv) - 1.0) \
        / (imbalance.published_imbalance(72, 256, cv) - 1.0) == pytest.approx(1.2, rel=1e-12)


def test_default_is_one_without_expert_parallelism_and_grows_with_ep():
    cv = catalog.expert_load_cv()
    assert float(imbalance.published_imbalance(1, 256, cv)) == 1.0
    assert float(imbalance.published_imbalance(8, 0, cv)) == 1.0          # dense model
    eps = np.array([2, 4, 8, 16, 32, 64, 128, 256.0])
    assert np.all(np.diff(imbalance.published_imbalance(eps, 256, cv)) > 0)
    dense = batch({"accelerator.id": "h100-sxm", "model.id": "llama-3.1-70b", "layout.tp": 4})
    assert not dense.has_on("expert_imbalance")          # dense rows stay "off": unchanged


def test_a_given_imbalance_overrides_the_default_and_the_default_slows_the_step():
    given = batch({**BLANK, "serving.expert_imbalance": 1.25})
    assert float(given.expert_imbalance[0]) == 1.25
    d = _decode([DSV3, BLANK])
    c = d.compute_s[MOE]
    assert c[1] / c[0] == pytest.approx(float(imbalance.raw(batch(BLANK))[0]), rel=1e-9)
