"""Expert load imbalance and redundant experts (dse/perf/imbalance.py): the busiest EP rank
sets the step, redundant slots cost HBM and cut the excess."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch, one

from dse.perf import OPS, imbalance, score

MOE = OPS.index("moe_routed")
DSV3 = {"accelerator.id": "gb200", "model.id": "deepseek-v3", "model.weight_dtype": "fp8",
        "layout.dp": 8, "layout.ep": 8, "workload.isl": 2048, "workload.osl": 1024,
        "workload.concurrency": 1024}


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
