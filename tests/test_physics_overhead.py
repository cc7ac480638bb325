"""Fixed times worked by hand through the scorer: per layer, per step, per GEMM launch; and
the rack a design's chips are packed into.

Llama-3.1-70B (config.json): 80 layers, all dense. The fixed times are pinned to round numbers
(``Batch.replace``) on top of the speed-of-light efficiencies, so a refit does not move the
expected values; changing ``layer_overhead_s``, ``step_overhead_s``, ``gemm_latency_s`` or
``rack_chips`` by 20% fails a test here (``tests/mutation.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch, design

from dse.perf import score
from dse.perf.batch import Batch

DECODE = {"workload.isl": 1, "workload.osl": 2, "workload.phase": "decode"}


def test_fixed_time_per_layer_per_step_and_per_gemm_by_hand():
    """tp=4, pp=2: a stage runs 40 layers, each with 4 GEMM launches (q/k/v, o, MLP up/gate,
    down), plus the output head: 161 launches x 3 us + 40 layers x 40 us + 1 ms per step =
    3.083 ms of fixed time per stage step; a token waits for both stages."""
    d = design(**DECODE, **{"layout.tp": 4, "layout.pp": 2, "workload.concurrency": 64})
    b = batch(d, ideal=True).replace(layer_overhead_s=40e-6, graph_layer_overhead_s=40e-6,
                                     step_overhead_s=1e-3, gemm_latency_s=3e-6)
    m, steps = score(b, breakdown=True)
    dec = steps.decode
    assert dec.overhead_s[0] == pytest.approx(161 * 3e-6 + 40 * 40e-6 + 1e-3, rel=1e-9)
    assert dec.total_s[0] == pytest.approx(dec.op_s.sum(0)[0] + dec.overhead_s[0], rel=1e-9)
    assert m["tpot_s"][0] == pytest.approx(2 * dec.total_s[0], rel=1e-9)


def test_racks_hold_whole_instances():
    """8-chip instances in 40-chip racks: 5 instances per rack, so a rack serves 40 chips'
    tokens, and a demand that needs 11 instances (10.5 instances' worth of tokens) needs
    ceil(11 / 5) = 3 racks."""
    d = design(**{"layout.tp": 8, "workload.concurrency": 64, "topology.rack_chips": 40})
    b = batch(d)
    m0 = score(b)
    per_inst = m0["output_tokens_per_s_per_instance"][0]
    assert m0["output_tokens_per_s_per_rack"][0] == pytest.approx(
        40 * m0["output_tokens_per_s_per_chip"][0], rel=1e-12)
    m = score(b.replace(demand_output_tokens_per_s=10.5 * per_inst))
    assert m["instances_for_demand"][0] == 11
    assert m["racks_for_demand"][0] == np.ceil(11 / 5) == 3


def test_a_decode_only_step_replayed_as_a_cuda_graph_takes_its_own_time_per_layer():
    """The runtimes replay decode-only steps as CUDA graphs (TensorRT-LLM's cuda_graph_config,
    SGLang's and vLLM's defaults), where the per-layer fixed time is ``graph_layer_overhead_s``;
    a step that carries prompt tokens runs eagerly at ``layer_overhead_s``. tp=4, pp=2, as
    above: 161 launches x 3 us + 40 layers x 10 us + 1 ms = 1.883 ms of fixed time per
    decode-only stage step (3.083 ms at 40 us a layer); the TTFT step keeps 40 us a layer."""
    d = design(**DECODE, **{"layout.tp": 4, "layout.pp": 2, "workload.concurrency": 64})
    b = batch(d, ideal=True).replace(layer_overhead_s=40e-6, graph_layer_overhead_s=40e-6,
                                     step_overhead_s=1e-3, gemm_latency_s=3e-6)
    m, steps = score(b.replace(graph_layer_overhead_s=10e-6), breakdown=True)
    assert steps.decode.overhead_s[0] == pytest.approx(161 * 3e-6 + 40 * 10e-6 + 1e-3, rel=1e-9)
    assert m["tpot_s"][0] == pytest.approx(2 * steps.decode.total_s[0], rel=1e-9)
    _, eager = score(b, breakdown=True)
    assert steps.prefill.overhead_s[0] == pytest.approx(eager.prefill.overhead_s[0], rel=1e-12)
    assert eager.decode.overhead_s[0] - steps.decode.overhead_s[0] == pytest.approx(
        40 * 30e-6, rel=1e-9)
    # a batch built without it: the graph's time is the per-layer time, the same step
    cols = {k: v for k, v in b.columns.items() if k != "graph_layer_overhead_s"}
    _, unset = score(Batch.from_columns(cols), breakdown=True)
    assert unset.decode.overhead_s[0] == pytest.approx(eager.decode.overhead_s[0], rel=1e-12)


def test_a_shared_expert_adds_two_gemm_launches_per_moe_layer_by_hand():
    """DeepSeek-V3 (58 MoE layers, one shared expert each) on tp=8, ep=8: its shared expert runs
    two GEMM launches per MoE layer (up/gate and down) next to the routed experts' one grouped
    launch: without it the step's fixed time is 58 x 2 x 3 us = 348 us shorter."""
    d = design("h200-sxm", "deepseek-v3", **DECODE, **{
        "model.weight_dtype": "fp8", "layout.tp": 8, "layout.ep": 8, "workload.concurrency": 64})
    b = batch(d, ideal=True).replace(layer_overhead_s=40e-6, graph_layer_overhead_s=40e-6,
                                     step_overhead_s=1e-3, gemm_latency_s=3e-6)
    with_sh = score(b, breakdown=True)[1].decode.overhead_s[0]
    without = score(b.replace(n_shared=0.0), breakdown=True)[1].decode.overhead_s[0]
    assert with_sh - without == pytest.approx(58 * 2 * 3e-6, rel=1e-9)


def test_an_instance_spanning_racks_counts_its_share_of_each():
    """floor(rack / instance) whole instances a rack; an instance larger than a rack spans
    ceil(instance / rack) racks and counts 1 / that per rack: 72 chips in 40-chip racks span
    2 racks (1/2 each), 130 chips span 4 (1/4 each); 8 chips: 5 whole ones a rack."""
    from dse.perf.serve import instances_per_rack
    got = instances_per_rack(np.array([8.0, 72.0, 130.0]), np.array([40.0, 40.0, 40.0]))
    assert got.tolist() == [5.0, 0.5, 0.25]
