"""TTFT physics worked by hand: a prompt's chunks run on one attention-DP rank and attend to
the earlier chunks of the same prompt."""

from __future__ import annotations

import pytest
from helpers import batch, design

from dse.perf import OPS, arch, score

PROJ, CORE = OPS.index("attn_proj"), OPS.index("attn_core")
H100_BF16 = 989e12


def _prefill_step(d):
    b = batch(d, ideal=True)
    m, steps = score(b, breakdown=True)
    return b, m, steps.prefill


@pytest.mark.parametrize("dp", [1, 4, 8])
def test_a_prompt_chunk_is_not_split_over_attention_dp_ranks(dp):
    # DeepSeek-V3, tp=1, dp ranks of attention, one request (no other decodes): the chunk's q/k/v/o
    # projections run on the one rank that holds the request, whatever dp is
    isl = 2048
    d = design("h100-sxm", "deepseek-v3", **{
        "layout.tp": 1, "layout.dp": dp, "layout.ep": dp, "workload.isl": isl,
        "workload.osl": 64, "workload.concurrency": 1})
    b, m, pre = _prefill_step(d)
    flops = 2.0 * arch.attn_params_per_layer(b)[0] * 61 * isl       # 61 layers, tp = 1
    assert pre.compute_s[PROJ][0] == pytest.approx(flops / H100_BF16, rel=1e-6)
    # causal attention of the whole prompt, expanded MLA dims (192 + 128) x 128 heads
    pairs = isl * (isl + 1) / 2
    core = 2.0 * 128 * (192 + 128) * pairs * 61 / H100_BF16
    assert pre.compute_s[CORE][0] == pytest.approx(core, rel=1e-6)


def test_chunks_attend_to_the_earlier_chunks_of_their_prompt():
    # a 16k prompt in 4 chunks of 4k: the chunks' attention FLOPs add up to the whole prompt's
    # causal pairs, 16384 * 16385 / 2, not 4 x (4096 * 4097 / 2)
    isl, chunk = 16384, 4096
    d = design("h100-sxm", "llama-3.1-8b", **{
        "layout.tp": 1, "workload.isl": isl, "workload.osl": 8, "workload.concurrency": 1,
        "serving.max_num_tokens": chunk + 1})     # the running sequence's decode takes one token
    b, m, pre = _prefill_step(d)
    n_chunks = isl // chunk
    per_chunk = pre.compute_s[CORE][0]
    whole = 2.0 * 32 * (128 + 128) * isl * (isl + 1) / 2 * 32 / H100_BF16   # 32 heads, 32 layers
    assert n_chunks * per_chunk == pytest.approx(whole, rel=1e-6)
    # ... which is ~4x what chunks blind to each other would cost
    blind = n_chunks * 2.0 * 32 * 256 * chunk * (chunk + 1) / 2 * 32 / H100_BF16
    assert whole / blind == pytest.approx(4.0, rel=0.01)


def test_a_busy_rank_sets_the_prompt_carrying_step():
    # with dp ranks and fewer prompt tokens than one chunk per rank, one rank carries the whole
    # chunk: the mixed step's projections see chunk rows on that rank, not chunk/dp
    d = design("h100-sxm", "deepseek-v3", **{
        "layout.tp": 1, "layout.dp": 8, "layout.ep": 8, "workload.isl": 1024,
        "workload.osl": 1024, "workload.concurrency": 64})
    b = batch(d, ideal=True)
    m, steps = score(b, breakdown=True)
    # decodes: 64/8 = 8 rows per rank; prompt tokens per step: 64 x 1024 / 1024 = 64 on average,
    # but a step that carries a prompt carries its 1024-token chunk on one rank
    rows = 8 + 1024
    flops = 2.0 * arch.attn_params_per_layer(b)[0] * 61 * rows
    assert steps.mixed.compute_s[PROJ][0] == pytest.approx(flops / H100_BF16, rel=1e-6)


@pytest.mark.parametrize("max_tokens, chunk, prior", [(8192, 2048, 2048), (1025, 1024, 2560)])
def test_a_prompt_chunk_reads_its_cached_prefix_and_writes_its_own_kv(max_tokens, chunk, prior):
    """Llama-3.1-8B, one request with a 4096-token prompt of which half hits the prefix cache:
    the step that carries its chunk writes the chunk's K and V and reads those of the tokens
    before it, the cached 2048 and (chunked in two of 1024, the running sequence's decode taking
    one token of the 1025) on average half of the uncached other chunk: 2048 + 512. Per token
    per layer 2 x 8 KV heads x 128 x 2 B, 32 layers, at 3.35 TB/s."""
    d = design("h100-sxm", "llama-3.1-8b", **{
        "model.weight_dtype": "bf16", "model.kv_dtype": "bf16", "layout.tp": 1,
        "workload.isl": 4096, "workload.osl": 2, "workload.concurrency": 1,
        "workload.prefix_hit_fraction": 0.5, "serving.max_num_tokens": max_tokens})
    b = batch(d, ideal=True).replace(hbm_bw_bytes_per_s=3.35e12)
    _, steps = score(b, breakdown=True)
    kv = 2 * 8 * 128 * 2 * 32
    assert steps.prefill.memory_s[CORE][0] == pytest.approx(kv * (chunk + prior) / 3.35e12,
                                                            rel=1e-9)
