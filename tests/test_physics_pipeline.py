"""What one pipeline stage's step carries, worked by hand: a micro-batch of C / pp sequences
through n_layers / pp layers, in every op.

A pipeline of pp stages splits the C sequences into pp micro-batches that keep every stage busy,
so a stage step runs C / pp sequences through its n_layers / pp layers: the KV cache it streams,
the attention FLOPs, the routed experts' FLOPs and weights, the router and the experts'
all-reduce all scale with both. Every efficiency is speed-of-light (``helpers.IDEAL``) and the
peaks are pinned to round numbers, so a refit does not move the expected values; dropping or
inverting a stage factor (``/ pp``, ``* stage``) or the FFN group's split fails a test here
(``tests/mutation.py --operators``); before these tests only the goldens caught those.
"""

from __future__ import annotations

import pytest
from helpers import batch, design

from dse.perf import OPS, score

PROJ, CORE, MOE, ROUTER = (OPS.index(o) for o in ("attn_proj", "attn_core", "moe_routed",
                                                  "router"))
KV_TOKEN_LAYER = 2 * 8 * 128 * 2                    # K and V of one token in one layer, bf16


def _llama8b(**kw):
    """Llama-3.1-8B (config.json): 32 layers, 32 heads and 8 KV heads of dim 128; bf16."""
    return design(model="llama-3.1-8b", **{
        "model.weight_dtype": "bf16", "model.kv_dtype": "bf16", "layout.tp": 1, **kw})


def _decode_step(d, **pins):
    b = batch(d, ideal=True).replace(**pins)
    return score(b, breakdown=True)[1].decode


def test_decode_reads_one_stages_kv_per_micro_batch():
    """Decode-only, 8 sequences at a mean context of 4096 + 2/2 = 4097 tokens. With pp = 2 one
    stage step carries a micro-batch of 4 sequences through 16 of the 32 layers: it reads
    4 x 4097 x 16 layers of K and V (8 KV heads x 128 x 2 B each, twice), writes the 4 new
    tokens' K and V in its 16 layers, and reads each token's query and writes its output
    (32 heads x (128 + 128) x 2 B per layer), all at 3.35 TB/s. Without pipelining (pp = 1)
    the step carries all 8 sequences through all 32 layers: four times one stage's bytes. With
    two attention data-parallel ranks instead, each rank's chip reads the KV of its own 4."""
    for pp, dp in ((1, 1), (2, 1), (1, 2)):
        d = _llama8b(**{"workload.isl": 4096, "workload.osl": 2, "workload.concurrency": 8,
                        "workload.phase": "decode", "layout.pp": pp, "layout.dp": dp})
        dec = _decode_step(d, hbm_bw_bytes_per_s=3.35e12)
        seqs, layers = 8 / pp / dp, 32 / pp
        kv_read = seqs * 4097 * layers * KV_TOKEN_LAYER
        kv_write = seqs * layers * KV_TOKEN_LAYER
        q_and_o = seqs * layers * 32 * (128 + 128) * 2
        expected = (kv_read + kv_write + q_and_o) / 3.35e12
        assert dec.memory_s[CORE][0] == pytest.approx(expected, rel=1e-9), (pp, dp)
    # one stage of two reads a quarter of the whole batch's KV: 4 x 4097 x 16 x 4 KiB = 1.07 GB
    assert 4 * 4097 * 16 * KV_TOKEN_LAYER == 1_074_003_968


# Mixtral-8x7B (config.json): 32 layers, all MoE, hidden 4096, 32 heads and 8 KV heads of dim
# 128, 8 routed experts of width 14336 (gated: 3 matrices), top-2, bf16. A non-gated expert's
# kernel slowdown (1.5) must leave these gated ones alone; each GEMM launch costs 5 us.
EXPERT = 3 * 4096 * 14336                           # 176,160,768 weights per expert
PINS = dict(matmul_flops_per_s=1e15, attn_matmul_flops_per_s=1e15,
            expert_matmul_flops_per_s=1e15, attn_flops_per_s=5e14, hbm_bw_bytes_per_s=4e12,
            scaleup_bw_bytes_per_s=450e9, scaleup_latency_s=2e-6, domain_chips=8.0,
            expert_imbalance=1.0, moe_nongated_slowdown=1.5, gemm_latency_s=5e-6)
PIPE = OPS.index("pipeline")


def test_moe_stage_step_by_hand():
    """Mixtral decoding 8 sequences at a mean context of 2048 + 2/2 = 2049 tokens, at tp = 2
    (ep = 1: each expert split over the 2 chips of the FFN group), without and with two
    pipeline stages (one batch). A stage step carries 8 / pp tokens through 32 / pp layers:

    - attention projections: 2 FLOPs x (41.9M / tp) weights per layer per token, at 1 PFLOP/s;
    - attention core: 2 x (32 / tp = 16 heads) x (128 + 128) FLOPs per context token per layer
      per token, at 0.5 PFLOP/s;
    - routed experts: each token's 2 experts, 2 x 2 x 176.2M / 2 FLOPs per layer; the weights
      of the experts the tokens touch, 1 - (1 - 2/8)^tokens of the 8, at 2 B / 2 chips per
      weight, at 4 TB/s; their outputs all-reduced over the tp = 2 chips that split each
      expert, a ring's 2 x 1/2 of 4096 x 2 B per token per layer, at 450 GB/s;
    - the router: 2 x 4096 x 8 FLOPs per token per layer and its 4096 x 8 x 2 B of weights,
      both split over the 2 chips;
    - GEMM launches: 2 attention GEMMs and the router per layer, and the output head;
    - the hand-off to the next stage: only with two stages (a latency and 8/2 x 4096 x 2 B /
      tp per chip at 450 GB/s), none without."""
    rows = [design("h100-sxm", "mixtral-8x7b", **{
        "model.weight_dtype": "bf16", "model.kv_dtype": "bf16", "layout.tp": 2,
        "layout.ep": 1, "layout.pp": pp, "workload.phase": "decode", "workload.isl": 2048,
        "workload.osl": 2, "workload.concurrency": 8}) for pp in (1, 2)]
    dec = score(batch(rows, ideal=True).replace(**PINS), breakdown=True)[1].decode
    attn = (4096 * 32 * 128 * 2 + 4096 * 8 * 128 * 2) / 2
    for i, pp in enumerate((1, 2)):
        tok, layers = 8 / pp, 32 / pp
        assert dec.compute_s[PROJ][i] == pytest.approx(2 * attn * layers * tok / 1e15, rel=1e-9)
        core = 2 * 16 * (128 + 128) * 2049 * layers * tok / 5e14
        assert dec.compute_s[CORE][i] == pytest.approx(core, rel=1e-9)
        assert dec.compute_s[MOE][i] == pytest.approx(2 * 2 * EXPERT / 2 * layers * tok / 1e15,
                                                      rel=1e-9)
        touched = 1 - (1 - 2 / 8) ** tok
        assert dec.memory_s[MOE][i] == pytest.approx(
            8 * EXPERT * 2 / 2 * layers * touched / 4e12, rel=1e-9)
        assert dec.network_s[MOE][i] == pytest.approx(
            2 * (1 / 2) * tok * 4096 * 2 * layers / 450e9, rel=1e-9)
        assert dec.compute_s[ROUTER][i] == pytest.approx(
            2 * 4096 * 8 / 2 * layers * tok / 1e15, rel=1e-9)
        assert dec.memory_s[ROUTER][i] == pytest.approx(4096 * 8 * 2 / 2 * layers / 4e12,
                                                        rel=1e-9)
        assert dec.overhead_s[i] == pytest.approx((3 * layers + 1) * 5e-6, rel=1e-9)
    assert dec.network_s[PIPE][0] == 0.0
    assert dec.network_s[PIPE][1] == pytest.approx(2e-6 + 4 * 4096 * 2 / 2 / 450e9, rel=1e-9)
