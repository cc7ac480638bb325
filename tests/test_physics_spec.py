"""A separate draft model's step time worked by hand through the scorer (speculative decoding,
``dse.perf.spec``): its layers' fixed time and the KV it streams.

Llama-3.1-70B in fp8 on H100 at tp=4, drafted by Llama-3.1-8B, 3 draft tokens per pass, 8
sequences decoding at a mean context of 2048 + 256/2 = 2176 tokens. The inputs the expected
values use are pinned (``Batch.replace``); changing ``draft_layers`` or
``draft_kv_bytes_per_token`` by 20% fails the test (``tests/mutation.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch, design

from dse.perf import score


def test_draft_model_pays_its_layers_fixed_time_and_streams_its_kv():
    """Each of the 3 draft steps of a pass runs the draft model's roofline on the tp group,
    memory-bound here (its 8.03e9 fp8 weights / 4 chips plus the KV read dwarf 2 x 8.03e9 x 8 /
    4 FLOPs at 1 PFLOP/s x 0.5), plus 40 us per draft layer:
    - 32 draft layers instead of none: 3 x 32 x 40 us = 3.84 ms more per pass;
    - 131,072 B of KV per token instead of none: 3 x 8 x 2176 x 131072 / 4 B at 4 TB/s x 0.8
      = 0.5348 ms more per pass;
    TPOT is the pass over the expected accepted tokens per step."""
    d = design(model="llama-3.1-70b", **{
        "model.weight_dtype": "fp8", "layout.tp": 4, "workload.isl": 2048, "workload.osl": 256,
        "workload.concurrency": 8, "workload.phase": "decode", "serving.spec_tokens": 3,
        "serving.spec_method": "draft", "serving.spec_draft_model": "llama-3.1-8b"})
    b = batch([d] * 3, ideal=True).replace(
        matmul_flops_per_s=1e15, gemm_fraction=0.5, hbm_bw_bytes_per_s=4e12,
        gemm_hbm_fraction=0.8, layer_overhead_s=40e-6,
        draft_layers=np.array([32.0, 0.0, 32.0]),
        draft_kv_bytes_per_token=np.array([131072.0, 131072.0, 0.0]))
    m = score(b)
    tpot, per_step = m["tpot_s"], m["spec_expected_tokens"]
    assert tpot[0] - tpot[1] == pytest.approx(3 * 32 * 40e-6 / per_step[0], rel=1e-6)
    kv = 3 * 8 * 2176 * 131072 / 4 / 3.2e12
    assert tpot[0] - tpot[2] == pytest.approx(kv / per_step[0], rel=1e-6)


def test_a_draft_model_that_is_compute_bound_by_hand():
    """spec.draft_s on a namespace batch: 1024 sequences over dp = 2 ranks (512 each), an 8e9-
    parameter draft at 1 B a weight on tp = 4, a 128-token context of 131,072 B of KV a token:
    FLOPs 2 x 8e9 x 512 / 4 = 2.048e12 at 1 PFLOP/s x 0.5 = 4.096 ms, above its bytes
    (8e9 + 512 x 128 x 131072) / 4 = 4.147e9 at 4 TB/s x 0.8 = 1.296 ms; plus 32 layers x
    40 us = 1.28 ms: 5.376 ms a draft step, 3 of them 16.128 ms."""
    from types import SimpleNamespace

    from dse.perf import spec
    b = SimpleNamespace(
        spec_tokens=np.array([3.0]), spec_draft=np.array([1.0]), has_on=lambda name: True,
        dp=2.0, tp=4.0, draft_params=8e9, weight_bytes=1.0, draft_kv_bytes_per_token=131072.0,
        matmul_flops_per_s=1e15, gemm_fraction=0.5, hbm_bw_bytes_per_s=4e12,
        gemm_hbm_fraction=0.8, draft_layers=32.0, layer_overhead_s=np.array([40e-6]))
    head = SimpleNamespace(c=0.0, w=0.0, mem_s=0.0, embed_s=0.0)
    k = SimpleNamespace(head=head, dp=2.0, h=0.0, overhead=0.0, layers_stage=1.0)
    assert spec.draft_s(b, k, 1024.0, np.array([1e-3]), 128.0)[0] \
        == pytest.approx(3 * (4.096e-3 + 1.28e-3), rel=1e-12)
