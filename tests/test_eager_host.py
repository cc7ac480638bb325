"""The host's floor under a prompt step run eagerly (dse.perf.eager), worked by hand.

A step that carries prompt tokens runs outside CUDA graphs on TensorRT-LLM's PyTorch backend
and on SGLang: it ends no sooner than the host has issued its forward's op calls, ``host ops x
eager_op_s``. The op calls per block come from serving.toml [runtimes.*] eager_ops (counted
from each runtime's forward code; reports/end-to-end/prefill-ttft.md, twelfth pass):

    TensorRT-LLM: GQA 3, MLA 19, norms 2, all-reduce 0 (fused into the norms), dense MLP 3,
                  MoE 6, shared experts 7
    SGLang:       GQA 5, MLA 20, norms 2, all-reduce 2 (tp > 1), dense MLP 3, MoE 19, shared 6
    vLLM:         GQA 2, MLA 2 (a piece replay and the attention call), the rest 0

DeepSeek-V3 (61 layers: 3 dense, 58 MoE with a shared expert; MLA) on TensorRT-LLM:
61 x (19 + 2) + 3 x 3 + 58 x (6 + 7) = 1281 + 9 + 754 = 2044 op calls; on SGLang at tp 8:
61 x (20 + 2 + 2) + 3 x 3 + 58 x (19 + 6) = 1464 + 9 + 1450 = 2923; on vLLM 61 x 2 = 122.
Llama-3.1-70B (80 dense GQA layers): TensorRT-LLM 80 x (3 + 2 + 3) = 640 at any tp; SGLang
80 x (5 + 2 + 3) = 800 at tp 1 and 80 x 12 = 960 at tp 8.

The op time is pinned (``Batch.replace``) on top of the speed-of-light efficiencies, so a refit
does not move the expected values; a 20% change in a count or in the floor fails a test here.
"""

from __future__ import annotations

import pytest
from helpers import batch, design

from dse.perf import eager, score
from dse.perf.basis import basis

PROMPT = {"workload.isl": 1024, "workload.osl": 2, "workload.concurrency": 1}


def _ops(model: str, runtime: str, tp: int, pp: int = 1, **kw) -> float:
    d = design("h200-sxm", model, **PROMPT, **{"serving.runtime": runtime, "layout.tp": tp,
                                               "layout.pp": pp}, **kw)
    b = batch(d)
    return float(eager.host_ops(b, basis(b).stage)[0])


@pytest.mark.parametrize(("model", "runtime", "tp", "ops"), [
    ("deepseek-v3", "trtllm", 8, 2044.0),
    ("deepseek-v3", "sglang", 8, 2923.0),
    ("deepseek-v3", "vllm", 8, 122.0),
    ("llama-3.1-70b", "trtllm", 8, 640.0),
    ("llama-3.1-70b", "trtllm", 1, 640.0),
    ("llama-3.1-70b", "sglang", 1, 800.0),
    ("llama-3.1-70b", "sglang", 8, 960.0),
])
def test_host_op_calls_per_forward_by_hand(model, runtime, tp, ops):
    """The counts of the module docstring, block by block from the architecture."""
    assert _ops(model, runtime, tp) == pytest.approx(ops, rel=1e-12)


def test_a_pipeline_stage_issues_its_share_of_the_layers():
    """pp 2: a stage runs half the layers, so half the op calls (Llama-3.1-70B, TensorRT-LLM:
    40 x 8 = 320)."""
    assert _ops("llama-3.1-70b", "trtllm", 4, pp=2) == pytest.approx(320.0, rel=1e-12)


def test_an_eager_prompt_step_lasts_its_host_ops_times_the_op_time():
    """DeepSeek-V3 on TensorRT-LLM, tp 8, one 1024-token prompt at speed of light: the GPU's
    step is tens of ms, the host's floor 2044 x 100 us = 204.4 ms, so the prompt step takes the
    floor and the wait counts as its fixed time; the decode-only step (a CUDA graph) keeps its
    time."""
    d = design("h200-sxm", "deepseek-v3", **PROMPT,
               **{"serving.runtime": "trtllm", "layout.tp": 8, "layout.ep": 8})
    b = batch(d, ideal=True)
    _, off = score(b, breakdown=True)
    m, on = score(b.replace(eager_op_s=100e-6), breakdown=True)
    floor = 2044 * 100e-6
    assert off.prefill.total_s[0] < 0.5 * floor             # the GPU's step: below it
    assert on.prefill.total_s[0] == pytest.approx(floor, rel=1e-9)
    assert on.prefill.overhead_s[0] - off.prefill.overhead_s[0] == pytest.approx(
        floor - off.prefill.total_s[0], rel=1e-9)
    assert on.decode.total_s[0] == pytest.approx(off.decode.total_s[0], rel=1e-12)
    assert m["ttft_s"][0] >= floor


def test_a_floor_below_the_gpu_step_changes_nothing():
    """At 1 us an op, 2044 us of host time sits under the GPU's step: the step is the same."""
    d = design("h200-sxm", "deepseek-v3", **PROMPT,
               **{"serving.runtime": "trtllm", "layout.tp": 8, "layout.ep": 8})
    b = batch(d)
    _, off = score(b, breakdown=True)
    _, on = score(b.replace(eager_op_s=1e-6), breakdown=True)
    assert off.prefill.total_s[0] > 2044 * 1e-6
    assert on.prefill.total_s[0] == pytest.approx(off.prefill.total_s[0], rel=1e-12)
