"""The fitted per-op kernel models as the step uses them, worked by hand: dense GEMMs (tile
padding, edge waste, one wave of tiles), the routed experts' grouped GEMMs and their per-token
and per-layer costs, decode and prefill attention.

Every kernel parameter is pinned to a round number of its own (``PIN``; none is a fitted
value), so a refit of the catalog does not move the expected values, and changing any one of
them by 20% fails a test here (``tests/mutation.py``). The formulas are those of
``dse.perf.kernel_gemm`` and ``dse.perf.kernel_attention``; the architectures are the
published configs.
"""

from __future__ import annotations

import pytest
from helpers import batch, design

from dse.perf import OPS, score

PROJ, CORE, MOE = (OPS.index(o) for o in ("attn_proj", "attn_core", "moe_routed"))
PIN = {"matmul_flops_per_s": 1e15, "attn_matmul_flops_per_s": 1e15, "attn_weight_bytes": 2.0,
       "hbm_bw_bytes_per_s": 4e12, "gemm_fraction": 0.5, "gemm_half_rows": 64.0,
       "gemm_n_half": 256.0, "gemm_k_half": 512.0, "gemm_wave_elements": 1e5,
       "gemm_hbm_fraction": 0.8}


def _gemm_s(rows, n, k):
    """kernel_gemm: 2 (rows + half_rows) n k (1 + n_half/n + k_half/k) FLOPs plus one wave of
    tiles, 2 wave_elements k (same shape factor), at peak x gemm_fraction."""
    shape = 1 + 256.0 / n + 512.0 / k
    return (2 * (rows + 64.0) * n * k + 2 * 1e5 * k) * shape / (1e15 * 0.5)


def test_attention_projections_are_two_padded_gemms_per_layer():
    """Llama-3.1-8B at tp=1, 64 sequences decoding: per layer a q/k/v GEMM of width
    (32 + 2 x 8) x 128 = 6144 and an o GEMM of width 4096, both of depth 4096, on 64 rows
    padded by 64; 32 layers. Weights read once: 41,943,040 x 32 x 2 B at 4 TB/s x 0.8."""
    d = design(model="llama-3.1-8b", **{
        "model.weight_dtype": "bf16", "layout.tp": 1, "workload.isl": 1, "workload.osl": 2,
        "workload.concurrency": 64, "workload.phase": "decode"})
    dec = score(batch(d, ideal=True).replace(**PIN), breakdown=True)[1].decode
    expected = 32 * (_gemm_s(64, 6144, 4096) + _gemm_s(64, 4096, 4096))
    assert dec.compute_s[PROJ][0] == pytest.approx(expected, rel=1e-9)
    assert dec.memory_s[PROJ][0] == pytest.approx(41943040 * 32 * 2 / 3.2e12, rel=1e-9)


MOE_PIN = {**PIN, "expert_matmul_flops_per_s": 2e15, "expert_weight_bytes": 1.0,
           "moe_fraction": 0.4, "moe_half_rows": 16.0, "moe_width_half": 512.0,
           "moe_hidden_half": 1024.0, "moe_hbm_fraction": 0.6, "moe_token_bytes": 6.0,
           "moe_batch_bytes": 3.0, "moe_route_bytes": 0.25, "moe_latency_s": 30e-6}


def test_routed_experts_grouped_gemm_by_hand():
    """DeepSeek-V3 fp8 on 8 GB200, tp=1, dp=ep=8, 512 sequences decoding; 58 MoE layers of 256
    experts (3 x 7168 x 2048 = 44,040,192 params each), top-8. Per chip per layer:
    - compute: 512 x 8 routed rows / 8 chips of 2 x 44.04e6 FLOPs, plus 16 padded rows for each
      touched expert of its 32 (all are touched: 1 - (1 - 8/256)^512 = 1 - 8.7e-8), with the
      edge waste of a 2048-wide expert in a 7168-wide model: x (1 + 512/2048 + 1024/7168), at
      2 PFLOP/s x 0.4;
    - memory: its 32 experts, 1 B a weight, at 4 TB/s x 0.6;
    - per token: 8/8 routed rows x 6 B + the layer's in/out, 3 B, and its 8 routed entries'
      scan, 8 x 0.25 B, for the share of the 8 ranks a token visits (1 - (7/8)^8 = 0.6564),
      per hidden element, at 4 TB/s; plus 30 us."""
    d = design("gb200", "deepseek-v3", **{
        "model.weight_dtype": "fp8", "layout.tp": 1, "layout.dp": 8, "layout.ep": 8,
        "workload.isl": 1, "workload.osl": 2, "workload.concurrency": 512,
        "workload.phase": "decode", "topology.id": "nvl72", "serving.expert_imbalance": 1.0})
    dec = score(batch(d, ideal=True).replace(**MOE_PIN), breakdown=True)[1].decode
    p = 3 * 7168 * 2048
    touched = 1 - (1 - 8 / 256) ** 512
    rows = 512 + 16 * 256 / 8 * touched                  # routed rows (x k / chips below)
    shape = 1 + 512 / 2048 + 1024 / 7168
    compute = 58 * 2 * 8 * p / 8 * shape / (2e15 * 0.4) * rows
    memory = 58 * 32 * p * 1.0 / (4e12 * 0.6) * touched
    per_token = 58 * 7168 / 4e12 * (8 / 8 * 6.0 + (1 - (7 / 8) ** 8) * (3.0 + 8 * 0.25))
    extra = per_token * 512 + 58 * 30e-6
    assert dec.compute_s[MOE][0] == pytest.approx(compute, rel=1e-9)
    assert dec.memory_s[MOE][0] == pytest.approx(memory, rel=1e-9)
    # the op: max(compute, memory) + the additive costs + the all-to-all (network, not hidden)
    busy = dec.op_s[MOE][0] - dec.network_s[MOE][0]
    assert busy == pytest.approx(max(compute, memory) + extra, rel=1e-9)


def test_grouped_gemm_wave_floor_and_remote_entries_by_hand():
    """The same DeepSeek-V3 decode step on a kernel that pays one wave of 3e5 output elements
    per call and computes the non-local entries it is handed at 0.05 of a local row
    (``moe_wave_elements``, ``moe_remote_fraction``), plus 3e5 / 2048 rows of the 2048-wide
    expert's wave per chip and layer on top of its 512 x 8 / 8 local rows.

    Attention DP (dp = ep = 8): the all-to-all hands each chip only the tokens routed to it,
    each with its 8 routed entries: a token visits 8 (1 - (7/8)^8) = 5.251 of the 8 ranks, so a
    chip receives 512 x 5.251 / 8 tokens, 512 x 5.251 entries, of which 512 are its own:
    512 x 4.251 x 0.05 remote rows. TP+EP (tp = ep = 8, dp = 1): every chip runs every token,
    512 x 8 entries, 512 x 7 of them remote: 512 x 7 x 0.05 remote rows."""
    p = 3 * 7168 * 2048
    touched = 1 - (1 - 8 / 256) ** 512
    dest = 8 * (1 - (7 / 8) ** 8)
    shape = 1 + 512 / 2048 + 1024 / 7168
    pin = {**MOE_PIN, "moe_wave_elements": 3e5, "moe_remote_fraction": 0.05}
    for tp, dp, remote in ((1, 8, 512 * (dest - 1) * 0.05), (8, 1, 512 * 7 * 0.05)):
        d = design("gb200", "deepseek-v3", **{
            "model.weight_dtype": "fp8", "layout.tp": tp, "layout.dp": dp, "layout.ep": 8,
            "workload.isl": 1, "workload.osl": 2, "workload.concurrency": 512,
            "workload.phase": "decode", "topology.id": "nvl72",
            "serving.expert_imbalance": 1.0})
        dec = score(batch(d, ideal=True).replace(**pin), breakdown=True)[1].decode
        rows = 512 + remote + 16 * 256 / 8 * touched + 3e5 / 2048
        compute = 58 * 2 * 8 * p / 8 * shape / (2e15 * 0.4) * rows
        assert dec.compute_s[MOE][0] == pytest.approx(compute, rel=1e-9)


def test_non_gated_experts_run_their_own_kernel_by_hand():
    """The same DeepSeek-V3 decode step with non-gated experts (``model.mlp_gated`` off: 2 x
    7168 x 2048 params each) on a kernel 1.5x slower than the gated one
    (``moe_nongated_slowdown``): both grouped-GEMM terms are the gated formula's with 2
    matrices, x 1.5."""
    d = design("gb200", "deepseek-v3", **{
        "model.weight_dtype": "fp8", "model.mlp_gated": False, "layout.tp": 1, "layout.dp": 8,
        "layout.ep": 8, "workload.isl": 1, "workload.osl": 2, "workload.concurrency": 512,
        "workload.phase": "decode", "topology.id": "nvl72", "serving.expert_imbalance": 1.0})
    dec = score(batch(d, ideal=True).replace(**MOE_PIN, moe_nongated_slowdown=1.5),
                breakdown=True)[1].decode
    p = 2 * 7168 * 2048
    touched = 1 - (1 - 8 / 256) ** 512
    rows = 512 + 16 * 256 / 8 * touched
    shape = 1 + 512 / 2048 + 1024 / 7168
    compute = 1.5 * 58 * 2 * 8 * p / 8 * shape / (2e15 * 0.4) * rows
    memory = 1.5 * 58 * 32 * p * 1.0 / (4e12 * 0.6) * touched
    assert dec.compute_s[MOE][0] == pytest.approx(compute, rel=1e-9)
    assert dec.memory_s[MOE][0] == pytest.approx(memory, rel=1e-9)


ATTN_PIN = {"attn_flops_per_s": 5e14, "hbm_bw_bytes_per_s": 4e12, "kv_bytes": 2.0,
            "attn_decode_compute_fraction": 0.5, "attn_decode_group_min_heads": 8.0,
            "attn_decode_hbm_fraction": 0.8, "attn_decode_latency_s": 5e-6,
            "attn_decode_per_seq_s": 1e-7, "attn_decode_per_seq_kv_head_s": 2e-8,
            "attn_prefill_fraction": 0.6, "attn_prefill_half_tokens": 512.0,
            "attn_prefill_half_rows": 2048.0, "attn_prefill_latency_s": 7e-6,
            "attn_prefill_hbm_fraction": 0.7, "attn_prefill_per_seq_s": 3e-6,
            "attn_prefill_per_seq_head_s": 1e-7, "attn_prefill_dim_half": 32.0}


@pytest.mark.parametrize("dp", [1, 2])
def test_decode_attention_by_hand(dp):
    """Llama-3.1-8B, tp=1, 64 sequences at a mean context of 1000 + 2000/2 = 2000 tokens,
    32 layers: 32 query heads in 8 KV groups of 4, each group padded to 8 MMA rows (x2);
    2 x 32 x 2 x (2 x 128) FLOPs per (token, context token, layer) at 500 TFLOP/s x 0.5. KV read
    2 x 8 x 128 x 2 B per context token and layer at 4 TB/s x 0.8, and each sequence's new
    token written (at the prefill attention's 0.7); each sequence's query read and output
    written, 32 heads x (128 + 128) bf16 per layer, on the KV's stream. Fixed: 32 layers x (5 us + 64 sequences x
    (0.1 us + 8 KV heads x 0.02 us)). Over dp = 2 attention ranks each chip runs 32 of the
    64: each term is the one-rank term of 64 / dp sequences."""
    d = design(model="llama-3.1-8b", **{
        "layout.tp": 1, "layout.dp": dp, "workload.isl": 1000, "workload.osl": 2000,
        "workload.concurrency": 64, "workload.phase": "decode"})
    dec = score(batch(d, ideal=True).replace(**ATTN_PIN), breakdown=True)[1].decode
    ctx = 32 * 2000
    seqs = 64 / dp                                  # sequences a rank runs
    compute = 2 * 32 * 2 * 256 / (5e14 * 0.5) * seqs * ctx
    kv_tok = 2 * 8 * 128 * 2
    qo = 32 * 32 * 256 * 2 / (4e12 * 0.8) * seqs    # each token's query and output, bf16
    memory = kv_tok / (4e12 * 0.8) * seqs * ctx + kv_tok / (4e12 * 0.7) * seqs * 32 + qo
    fixed = 32 * (5e-6 + seqs * (1e-7 + 8 * 2e-8))
    assert dec.compute_s[CORE][0] == pytest.approx(compute, rel=1e-9)
    assert dec.memory_s[CORE][0] == pytest.approx(memory, rel=1e-9)
    assert dec.op_s[CORE][0] == pytest.approx(max(compute, memory) + fixed, rel=1e-9)


def test_prefill_attention_by_hand():
    """One 4096-token prompt on Llama-3.1-8B, tp=1, prefill only: 4096 x 4097 / 2 causal pairs
    per layer, 32 layers, 2 x 32 heads x (128 + 128) FLOPs each, slowed by the head dim
    (1 + 32/128), the keys per query row (1 + 512 / (4097/2)) and its rows (1 + (2048/32) / 4096), at
    500 TFLOP/s x 0.6. KV written: 4096 tokens x 32 layers x 4096 B at 4 TB/s x 0.7. Fixed:
    32 layers x (7 us + 3 us + 32 heads x 0.1 us)."""
    d = design(model="llama-3.1-8b", **{
        "layout.tp": 1, "workload.isl": 4096, "workload.osl": 1, "workload.concurrency": 1,
        "workload.phase": "prefill", "serving.max_num_tokens": 8192})
    pre = score(batch(d, ideal=True).replace(**ATTN_PIN), breakdown=True)[1].prefill
    pairs = 32 * 4096 * 4097 / 2
    eff = (1 + 32 / 128) * (1 + 512 / (4097 / 2)) * (1 + 2048 / 32 / 4096)
    compute = 2 * 32 * 256 * pairs * eff / (5e14 * 0.6)
    memory = 2 * 8 * 128 * 2 / (4e12 * 0.7) * 4096 * 32
    fixed = 32 * (7e-6 + 3e-6 + 32 * 1e-7)
    assert pre.compute_s[CORE][0] == pytest.approx(compute, rel=1e-9)
    assert pre.memory_s[CORE][0] == pytest.approx(memory, rel=1e-9)
    assert pre.op_s[CORE][0] == pytest.approx(max(compute, memory) + fixed, rel=1e-9)


def test_windowed_prefill_attention_by_hand():
    """One 4096-token prompt on gpt-oss-120b, tp=1: 18 global layers of 4096 x 4097 / 2 causal
    pairs and 18 local layers whose 128-token window computes 128 + 64 (window_pad_tokens)
    keys per query row, 4096 x 192 pairs; 64 heads x 2 x (64 + 64) FLOPs per pair, slowed by the
    head dim (1 + 32/64) and the rows (1 + (2048/64) / 4096), plus 512 keys' worth per query
    row per layer (half_tokens, 36 layers x 4096 rows), at 500 TFLOP/s x 0.6."""
    d = design(model="gpt-oss-120b", **{
        "layout.tp": 1, "workload.isl": 4096, "workload.osl": 1, "workload.concurrency": 1,
        "workload.phase": "prefill", "serving.max_num_tokens": 8192})
    pin = dict(ATTN_PIN, attn_prefill_window_pad_tokens=64.0)
    pre = score(batch(d, ideal=True).replace(**pin), breakdown=True)[1].prefill
    pairs = 18 * 4096 * 4097 / 2 + 18 * 4096 * (128 + 64) + 36 * 512 * 4096
    eff = (1 + 32 / 64) * (1 + 2048 / 64 / 4096)
    compute = 2 * 64 * 128 * pairs * eff / (5e14 * 0.6)
    assert pre.compute_s[CORE][0] == pytest.approx(compute, rel=1e-9)


def test_decode_kv_ramp_fades_with_split_kv_by_hand():
    """The decode of test_decode_attention_by_hand with half_items = 16 and split_tokens = 500:
    each layer's call has 64 sequences x 8 KV heads = 512 items, each split over
    1 + 2000 / 500 = 5 CTAs, so the KV stream runs at 1 / (1 + 16 / (512 x 5)) of its rate."""
    d = design(model="llama-3.1-8b", **{
        "layout.tp": 1, "workload.isl": 1000, "workload.osl": 2000, "workload.concurrency": 64,
        "workload.phase": "decode"})
    pin = dict(ATTN_PIN, attn_decode_half_items=16.0, attn_decode_split_tokens=500.0)
    dec = score(batch(d, ideal=True).replace(**pin), breakdown=True)[1].decode
    ctx = 32 * 2000
    kv_tok = 2 * 8 * 128 * 2
    memory = (kv_tok / (4e12 * 0.8) * 64 * ctx * (1 + 16 / (512 * 5))
              + kv_tok / (4e12 * 0.7) * 64 * 32
              + 32 * 32 * 256 * 2 / (4e12 * 0.8) * 64)     # queries and outputs: no ramp
    assert dec.memory_s[CORE][0] == pytest.approx(memory, rel=1e-9)


def test_prefill_attention_of_a_one_token_prompt_by_hand():
    """A 4096-token prompt all cached but its last token (Llama-3.1-8B, tp=1, prefill only):
    one query row against 4095 cached keys and itself, 4096 pairs per layer, 32 layers, plus
    512 keys' worth (half_tokens) for its one row; slowed by the head dim (1 + 32/128) and by
    its single row, 1 + (2048/32) / 1 = 65, at 500 TFLOP/s x 0.6."""
    d = design(model="llama-3.1-8b", **{
        "layout.tp": 1, "workload.isl": 4096, "workload.osl": 1, "workload.concurrency": 1,
        "workload.prefix_hit_fraction": 4095 / 4096, "workload.phase": "prefill",
        "serving.max_num_tokens": 8192})
    pre = score(batch(d, ideal=True).replace(**ATTN_PIN), breakdown=True)[1].prefill
    eff = (1 + 32 / 128) * (1 + 2048 / 32 / 1)
    compute = 2 * 32 * 256 * 32 * (4096 + 512) * eff / (5e14 * 0.6)
    assert pre.compute_s[CORE][0] == pytest.approx(compute, rel=1e-9)


def test_prefill_attention_on_a_pipeline_stage_by_hand():
    """The 4096-token prompt of test_prefill_attention_by_hand on pp = 2: a stage holds 16 of
    the 32 layers, so its step scores 16 layers' causal pairs and half_tokens keys: half the
    one-stage compute (the same efficiencies)."""
    d = design(model="llama-3.1-8b", **{
        "layout.tp": 1, "layout.pp": 2, "workload.isl": 4096, "workload.osl": 1,
        "workload.concurrency": 1, "workload.phase": "prefill", "serving.max_num_tokens": 8192})
    pre = score(batch(d, ideal=True).replace(**ATTN_PIN), breakdown=True)[1].prefill
    pairs = 16 * 4096 * 4097 / 2
    eff = (1 + 32 / 128) * (1 + 512 / (4097 / 2)) * (1 + 2048 / 32 / 4096)
    compute = 2 * 32 * 256 * pairs * eff / (5e14 * 0.6)
    assert pre.compute_s[CORE][0] == pytest.approx(compute, rel=1e-9)


def test_decode_attention_with_more_tp_ranks_than_kv_heads_by_hand():
    """Llama-3.1-8B on tp = 16 (8 KV heads): each chip holds 2 query heads and one whole KV
    head (each KV head on 2 chips), a query group of 2 padded to 8 MMA rows (x4): 2 x 2 heads
    x 2 x (2 x 128) FLOPs per (token, context token, layer), 64 sequences at a context of
    2000, 32 layers, at 500 TFLOP/s x 0.5; fixed 32 x (5 us + 64 x (0.1 us + 1 x 0.02 us))."""
    d = design(acc="gb200", model="llama-3.1-8b", **{
        "topology.id": "nvl72", "layout.tp": 16, "workload.isl": 1000, "workload.osl": 2000,
        "workload.concurrency": 64, "workload.phase": "decode"})
    dec = score(batch(d, ideal=True).replace(**ATTN_PIN), breakdown=True)[1].decode
    compute = 2 * 2 * 4 * 256 / (5e14 * 0.5) * 64 * 32 * 2000
    fixed = 32 * (5e-6 + 64 * (1e-7 + 1 * 2e-8))
    assert dec.compute_s[CORE][0] == pytest.approx(compute, rel=1e-9)
    assert dec.op_s[CORE][0] == pytest.approx(
        max(compute, dec.memory_s[CORE][0]) + fixed, rel=1e-9)
