"""The per-op work table (``score(b, breakdown=True)``: ``StepTimes.flops``, ``hbm_bytes``,
``net_bytes``), worked by hand: per chip, one stage step of one micro-batch, a multiply-add = 2
FLOPs, all-reduces at the ring's 2 (g-1)/g of the message (dse/perf/step.py's docstring).

The architecture numbers are the models' published configs (Hugging Face config.json), typed
in here rather than read back from the scorer."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from helpers import batch, design

from dse import catalog
from dse.bench import random_designs
from dse.build.designs import resolve, to_batch
from dse.perf import OPS, score

PROJ, CORE, DENSE, MOE, SHARED, ROUTER, LOGITS, PIPE = (OPS.index(o) for o in OPS)
FP8_DISPATCH = 1.0 + 4.0 / 128.0          # fp8 payload + one fp32 scale per 128 elements

# Llama-3.1-70B
L70, D70, H70, KV70, HD70, F70, V70 = 80, 8192, 64, 8, 128, 28672, 128256
ATTN70 = 2 * D70 * H70 * HD70 + 2 * D70 * KV70 * HD70      # q, o + k, v projections


def _steps(d: dict, ideal: bool = True, **updates):
    b = batch(d, ideal=ideal)
    if updates:
        b = b.replace(**updates)
    return score(b, breakdown=True)[1]


def _col(st, name: str) -> np.ndarray:
    """One column of a step's work table at row 0, per op."""
    return getattr(st, name)[:, 0]


def _llama70(tp=4, dp=1, pp=1, c=64, **updates):
    d = design(**{"model.weight_dtype": "bf16", "layout.tp": tp, "layout.dp": dp,
                  "layout.pp": pp, "workload.concurrency": c, "workload.isl": 1000,
                  "workload.osl": 200, "workload.phase": "decode"})
    return _steps(d, **updates).decode


def test_dense_decode_work_per_op_on_tp4():
    # Llama-3.1-70B in bf16 on tp = 4, 64 sequences decoding at a mean context of 1000 + 200/2
    st = _llama70()
    rows, ctx, bf16 = 64, 1100, 2
    kv_token_layer_chip = 2 * KV70 * HD70 * bf16 / 4       # K and V, 2 of the 8 KV heads
    flops, hbm, net = (_col(st, c) for c in ("flops", "hbm_bytes", "net_bytes"))
    # attention projections: 2 x (attention weights / tp) x rows x layers, weights read once,
    # the tp all-reduce of the output (rows x hidden x 2 B) once per layer
    assert flops[PROJ] == pytest.approx(2 * ATTN70 / 4 * rows * L70, rel=1e-9)
    assert hbm[PROJ] == pytest.approx(ATTN70 / 4 * L70 * bf16, rel=1e-9)
    assert net[PROJ] == pytest.approx(2 * 3 / 4 * rows * D70 * bf16 * L70, rel=1e-9)
    # attention core: 2 x 16 heads x (128 + 128) per (token, context token, layer); the KV read
    # (batch x context x KV bytes per token and layer x layers / shards), every token's Q and O,
    # every token's KV written
    assert flops[CORE] == pytest.approx(2 * 16 * 256 * rows * ctx * L70, rel=1e-9)
    kv_read = rows * ctx * kv_token_layer_chip * L70
    q_o = L70 * 16 * 256 * bf16 * rows
    kv_written = rows * kv_token_layer_chip * L70
    assert hbm[CORE] == pytest.approx(kv_read + q_o + kv_written, rel=1e-9)
    assert net[CORE] == 0
    # dense MLP (gated: 3 matrices of hidden x intermediate), tp-sharded, all-reduced per layer
    assert flops[DENSE] == pytest.approx(2 * 3 * D70 * F70 / 4 * L70 * rows, rel=1e-9)
    assert hbm[DENSE] == pytest.approx(3 * D70 * F70 / 4 * L70 * bf16, rel=1e-9)
    assert net[DENSE] == pytest.approx(2 * 3 / 4 * rows * D70 * bf16 * L70, rel=1e-9)
    # the head: vocab / tp columns per token, its weights, one embedding row per token, and
    # the all-gather of the logits: (tp - 1) / tp of rows x vocab x 2 B
    assert flops[LOGITS] == pytest.approx(2 * V70 / 4 * D70 * rows, rel=1e-9)
    assert hbm[LOGITS] == pytest.approx(V70 * D70 * bf16 / 4 + rows * D70 * bf16, rel=1e-9)
    assert net[LOGITS] == pytest.approx(3 / 4 * rows * V70 * bf16, rel=1e-9)
    # a dense model on one stage: no MoE op, no hand-off
    for op in (MOE, SHARED, ROUTER, PIPE):
        assert flops[op] == hbm[op] == net[op] == 0


def test_at_speed_of_light_each_time_is_its_work_over_the_peak():
    # ideal efficiencies (no padding, full rates, no latencies): every compute time is FLOPs /
    # peak, every memory time bytes / HBM bandwidth, the all-reduces bus bytes / link
    st = _llama70()
    peak, hbm_bw, link = 989e12, 3.35e12, 450e9              # H100 SXM
    for op in (PROJ, CORE, DENSE, LOGITS):
        assert st.compute_s[op, 0] == pytest.approx(st.flops[op, 0] / peak, rel=1e-9)
        assert st.memory_s[op, 0] == pytest.approx(st.hbm_bytes[op, 0] / hbm_bw, rel=1e-9)
    for op in (PROJ, DENSE, LOGITS):
        assert st.network_s[op, 0] == pytest.approx(st.net_bytes[op, 0] / link, rel=1e-9)


def test_dense_mlp_split_over_tp_dp_or_replicated_per_rank():
    # tp = 4, dp = 2, 64 sequences: replicated, each rank's tp group runs its 32 tokens with a
    # quarter of the weights; split over all 8 chips, every chip runs all 64 with an eighth
    rep = _llama70(dp=2)
    split = _llama70(dp=2, dense_replicated=0.0)
    for st in (rep, split):
        assert st.flops[DENSE, 0] == pytest.approx(2 * 3 * D70 * F70 / 8 * L70 * 64, rel=1e-9)
    assert rep.hbm_bytes[DENSE, 0] == pytest.approx(3 * D70 * F70 / 4 * L70 * 2, rel=1e-9)
    assert split.hbm_bytes[DENSE, 0] == pytest.approx(3 * D70 * F70 / 8 * L70 * 2, rel=1e-9)
    assert rep.net_bytes[DENSE, 0] == pytest.approx(2 * 3 / 4 * 32 * D70 * 2 * L70, rel=1e-9)
    assert split.net_bytes[DENSE, 0] == pytest.approx(2 * 7 / 8 * 64 * D70 * 2 * L70, rel=1e-9)
    # attention is data-parallel: the busiest rank's 32 tokens, a quarter of the weights
    assert rep.flops[PROJ, 0] == pytest.approx(2 * ATTN70 / 4 * 32 * L70, rel=1e-9)
    # one embedding row per token on its rank
    assert rep.hbm_bytes[LOGITS, 0] == pytest.approx(V70 * D70 * 2 / 4 + 32 * D70 * 2, rel=1e-9)


def test_pipeline_stage_step_and_hand_off():
    # pp = 2: a stage holds 40 layers and a micro-batch carries half the 64 sequences; the
    # hand-off sends each token's hidden state, split over the stage's tp*dp = 4 chips
    st = _llama70(pp=2)
    assert st.flops[PROJ, 0] == pytest.approx(2 * ATTN70 / 4 * 32 * 40, rel=1e-9)
    assert st.hbm_bytes[DENSE, 0] == pytest.approx(3 * D70 * F70 / 4 * 40 * 2, rel=1e-9)
    assert st.net_bytes[PIPE, 0] == pytest.approx(32 * D70 * 2 / 4, rel=1e-9)
    assert st.flops[PIPE, 0] == st.hbm_bytes[PIPE, 0] == 0


def test_prefill_chunk_attention_counts_the_causal_pairs():
    # one 2048-token prompt on one H100 (Llama-3.1-8B, bf16, prefill-only): the TTFT step's
    # attention scores every causal (query, key) pair, 2048 x 2049 / 2 per layer and head
    layers, d, h, kv, hd, v = 32, 4096, 32, 8, 128, 128256
    isl = 2048
    st = _steps(design(model="llama-3.1-8b", **{
        "model.weight_dtype": "bf16", "workload.isl": isl, "workload.osl": 1,
        "workload.concurrency": 1, "workload.phase": "prefill",
        "serving.max_num_tokens": 16384})).prefill
    pairs = isl * (isl + 1) / 2
    assert st.flops[CORE, 0] == pytest.approx(2 * h * 2 * hd * pairs * layers, rel=1e-9)
    assert st.hbm_bytes[CORE, 0] == pytest.approx(isl * 2 * kv * hd * 2 * layers, rel=1e-9)
    attn = 2 * d * h * hd + 2 * d * kv * hd
    assert st.flops[PROJ, 0] == pytest.approx(2 * attn * isl * layers, rel=1e-9)
    # the head runs for the prompt's last token only; every token's embedding row is read
    assert st.flops[LOGITS, 0] == pytest.approx(2 * v * d, rel=1e-9)
    assert st.hbm_bytes[LOGITS, 0] == pytest.approx(v * d * 2 + isl * d * 2, rel=1e-9)
    # half the prompt from the prefix cache: 1024 new tokens after 1024 cached ones score
    # 1024 x 1024 + 1024 x 1025 / 2 pairs, write their own KV and read the prefix's
    hit = _steps(design(model="llama-3.1-8b", **{
        "model.weight_dtype": "bf16", "workload.isl": isl, "workload.osl": 1,
        "workload.concurrency": 1, "workload.phase": "prefill", "workload.prefix_hit_fraction": 0.5,
        "serving.max_num_tokens": 16384})).prefill
    pairs = 1024 * 1024 + 1024 * 1025 / 2
    assert hit.flops[CORE, 0] == pytest.approx(2 * h * 2 * hd * pairs * layers, rel=1e-9)
    kv_token = 2 * kv * hd * 2 * layers
    assert hit.hbm_bytes[CORE, 0] == pytest.approx((1024 + 1024) * kv_token, rel=1e-9)


def _mixtral(c=256, **updates):
    # Mixtral-8x7B (8 experts, top-2, hidden 4096, expert width 14336, 32 layers) in bf16 on
    # 8 H100s: tp = 1, dp = 8, ep = 8, one expert per chip, balanced routing
    d = design(model="mixtral-8x7b", **{
        "model.weight_dtype": "bf16", "layout.tp": 1, "layout.dp": 8, "layout.ep": 8,
        "workload.concurrency": c, "workload.isl": 1000, "workload.osl": 200,
        "workload.phase": "decode"})
    return _steps(d, **{"expert_imbalance": 1.0, **updates}).decode


MIX_EXPERT = 3 * 4096 * 14336


def test_moe_routed_experts_and_low_latency_all_to_all():
    st = _mixtral()
    tok, layers = 256, 32
    # every token runs top-2 experts: 2 x 2 x expert weights per token, over the 8 chips
    assert st.flops[MOE, 0] == pytest.approx(2 * 2 * MIX_EXPERT * layers / 8 * tok, rel=1e-9)
    # one expert per chip, read when touched: 1 - (1 - 2/8)^256 of them
    touched = 1 - (1 - 2 / 8) ** tok
    assert st.hbm_bytes[MOE, 0] == pytest.approx(MIX_EXPERT * layers * 2 * touched, rel=1e-9)
    # EP all-to-all, low-latency kernels in a decode step: each of the chip's 256 / 8 tokens
    # sends one row per (token, expert) pair to another rank, 2 x 7/8 rows of 4096 elements,
    # dispatched and combined in bf16 (2 + 2 B), once per MoE layer
    a2a = tok / 8 * 2 * 7 / 8 * 4096 * (2 + 2) * layers
    assert st.net_bytes[MOE, 0] == pytest.approx(a2a, rel=1e-9)
    # the dispatch and combine take at least their bytes over the full link
    assert st.network_s[MOE, 0] >= st.net_bytes[MOE, 0] / 450e9
    # the router: [tok, 4096] x [4096, 8], split over the 8 chips
    assert st.flops[ROUTER, 0] == pytest.approx(2 * 4096 * 8 * layers / 8 * tok, rel=1e-9)
    assert st.hbm_bytes[ROUTER, 0] == pytest.approx(4096 * 8 * layers * 2 / 8, rel=1e-9)
    assert st.flops[SHARED, 0] == st.hbm_bytes[SHARED, 0] == 0     # Mixtral has none


def test_routed_permute_bytes_and_the_expert_all_reduce():
    # permute/quantize bytes per routed row (3 B per hidden element), layer in/out per token
    # on the chip (2 B) and per routed entry (1 B), for the share of tokens a rank sees: a
    # token visits 8 (1 - (7/8)^2) = 1.875 of the 8 ranks
    st = _mixtral(moe_token_bytes=3.0, moe_batch_bytes=2.0, moe_route_bytes=1.0)
    touched = 1 - (1 - 2 / 8) ** 256
    permute = 4096 * (2 / 8 * 3 + 1.875 / 8 * (2 + 2 * 1)) * 256 * 32
    assert st.hbm_bytes[MOE, 0] == pytest.approx(MIX_EXPERT * 32 * 2 * touched + permute,
                                                 rel=1e-9)
    # experts tensor-parallel over tp = 8 (ep = 1): no all-to-all, every chip holds an eighth
    # of every expert and all-reduces the layer's output for every token
    d = design(model="mixtral-8x7b", **{
        "model.weight_dtype": "bf16", "layout.tp": 8, "workload.concurrency": 256,
        "workload.isl": 1000, "workload.osl": 200, "workload.phase": "decode"})
    tp8 = _steps(d, expert_imbalance=1.0).decode
    assert tp8.flops[MOE, 0] == pytest.approx(2 * 2 * MIX_EXPERT * 32 / 8 * 256, rel=1e-9)
    assert tp8.net_bytes[MOE, 0] == pytest.approx(2 * 7 / 8 * 256 * 4096 * 2 * 32, rel=1e-9)


def test_normal_all_to_all_deduplicates_per_rank():
    # the normal kernels send a token once to each rank it visits: with one of 8 experts per
    # rank and top-2, a token hits a given rank with p = 1 - (7/8)(6/7) = 1/4, so it crosses to
    # 7 x 1/4 other ranks (vs 2 x 7/8 rows without deduplication)
    st = _mixtral(a2a_mode=2.0)
    a2a = 256 / 8 * 7 * 0.25 * 4096 * (2 + 2) * 32
    assert st.net_bytes[MOE, 0] == pytest.approx(a2a, rel=1e-9)


def test_busiest_ep_rank_sets_the_routed_work():
    # 1.3x the mean routed tokens on the busiest rank: its expert FLOPs and all-to-all bytes
    base, hot = _mixtral(), _mixtral(expert_imbalance=1.3)
    assert hot.flops[MOE, 0] == pytest.approx(1.3 * base.flops[MOE, 0], rel=1e-9)
    assert hot.net_bytes[MOE, 0] == pytest.approx(1.3 * base.net_bytes[MOE, 0], rel=1e-9)
    assert hot.flops[ROUTER, 0] == pytest.approx(base.flops[ROUTER, 0], rel=1e-9)


def test_per_op_dtypes_set_the_bytes_each_op_reads():
    # bf16 model, fp4 experts (NVFP4: 0.5 B + one fp8 scale per 16 elements) and fp8 attention
    # projections: each op streams its weights in its own dtype
    d = design(model="mixtral-8x7b", **{
        "model.weight_dtype": "bf16", "model.expert_dtype": "fp4", "model.attention_dtype": "fp8",
        "layout.tp": 1, "layout.dp": 8, "layout.ep": 8, "workload.concurrency": 256,
        "workload.isl": 1000, "workload.osl": 200, "workload.phase": "decode"})
    st = _steps(d, expert_imbalance=1.0).decode
    touched = 1 - (1 - 2 / 8) ** 256
    assert st.hbm_bytes[MOE, 0] == pytest.approx(MIX_EXPERT * 32 * (0.5 + 1 / 16) * touched,
                                                 rel=1e-9)
    attn = 2 * 4096 * 32 * 128 + 2 * 4096 * 8 * 128
    assert st.hbm_bytes[PROJ, 0] == pytest.approx(attn * 32 * 1, rel=1e-9)
    assert st.hbm_bytes[ROUTER, 0] == pytest.approx(4096 * 8 * 32 * 2 / 8, rel=1e-9)


def test_deepseek_mla_shared_experts_and_fp8_dispatch():
    # DeepSeek-V3 in fp8 on tp = 8 = ep: 128 heads (16 a chip), MLA decoding against the
    # replicated 512 + 64 latent (absorbed: d_qk + d_v = 576 + 512), 3 dense + 58 MoE layers,
    # one shared expert of width 2048, 256 routed experts, top-8
    d, tok, ctx, layers = 7168, 128, 1100, 61
    st = _steps(design(model="deepseek-v3", **{
        "model.weight_dtype": "fp8", "layout.tp": 8, "layout.ep": 8,
        "workload.concurrency": tok, "workload.isl": 1000, "workload.osl": 200,
        "workload.phase": "decode"}), expert_imbalance=1.0).decode
    assert st.flops[CORE, 0] == pytest.approx(2 * 16 * (576 + 512) * tok * ctx * layers,
                                              rel=1e-9)
    kv = tok * ctx * 576 * 1 * layers + tok * 576 * layers         # read (fp8) + written
    q_o = layers * 16 * (576 + 512) * 2 * tok
    assert st.hbm_bytes[CORE, 0] == pytest.approx(kv + q_o, rel=1e-9)
    assert st.flops[SHARED, 0] == pytest.approx(2 * 3 * d * 2048 * 58 / 8 * tok, rel=1e-9)
    assert st.flops[ROUTER, 0] == pytest.approx(2 * d * 256 * 58 / 8 * tok, rel=1e-9)
    assert st.flops[DENSE, 0] == pytest.approx(2 * 3 * d * 18432 / 8 * 3 * tok, rel=1e-9)
    # tp = 8 without attention DP: every chip holds every token, so no all-to-all; the MoE
    # output (tok x 7168 x 2 B) is all-reduced over the 8 chips once per MoE layer
    assert st.net_bytes[MOE, 0] == pytest.approx(2 * 7 / 8 * tok * d * 2 * 58, rel=1e-9)


def test_attention_dp_pays_the_all_to_all_next_to_a_tp_ep_row():
    # DeepSeek-V3 in fp8 on 8 H200s, tp = 1, dp = 8, ep = 8 (each rank its own 64 of 512
    # tokens) and, in the same batch, Mixtral on 4 H100s, tp = 4, ep = 4, dp = 1
    d = 7168
    dsv3 = design("h200-sxm", "deepseek-v3", **{
        "model.weight_dtype": "fp8", "layout.tp": 1, "layout.dp": 8, "layout.ep": 8,
        "workload.concurrency": 512, "workload.isl": 1000, "workload.osl": 200,
        "workload.phase": "decode"})
    b = batch([dsv3, _mixtral_tp4(4)], ideal=True).replace(expert_imbalance=1.0)
    st = score(b, breakdown=True)[1].decode
    # the DP row: fp8 dispatch with its scales, bf16 combine, 8 x 7/8 rows per token off the
    # rank (low-latency kernels in a decode step), no expert all-reduce (one chip per expert)
    a2a = 512 / 8 * 8 * 7 / 8 * d * (FP8_DISPATCH + 2) * 58
    assert st.net_bytes[MOE, 0] == pytest.approx(a2a, rel=1e-9)
    assert st.network_s[MOE, 0] >= a2a / 450e9                # at least over the full link
    # the TP+EP row: its all-reduce only (test_expert_parallelism_without_attention_dp)
    assert st.net_bytes[MOE, 1] == pytest.approx(2 * 3 / 4 * 256 * 4096 * 2 * 32, rel=1e-9)
    assert st.network_s[MOE, 1] == pytest.approx(st.net_bytes[MOE, 1] / 450e9, rel=1e-9)


def _mixtral_tp4(ep: int) -> dict:
    return design(model="mixtral-8x7b", **{
        "model.weight_dtype": "bf16", "layout.tp": 4, "layout.ep": ep, "workload.concurrency": 256,
        "workload.isl": 1000, "workload.osl": 200, "workload.phase": "decode"})


def test_expert_parallelism_without_attention_dp_sends_no_all_to_all():
    # Mixtral in bf16 on tp = 4, dp = 1 (TensorRT-LLM's and vLLM's TP+EP): every chip holds
    # all 256 tokens after the attention all-reduce, runs its own experts' rows of them and
    # all-reduces the full output (256 x 4096 x 2 B) over the 4 chips once per layer, whatever
    # ep: ep = 2 (two experts of four a chip, each 2-way sharded) and ep = 4 send the same
    # bytes as ep = 1, in the same time, and compute the same FLOPs (2 x top-2 x expert
    # weights / 4 per token)
    b = batch([_mixtral_tp4(ep) for ep in (1, 2, 4)], ideal=True).replace(expert_imbalance=1.0)
    st = score(b, breakdown=True)[1].decode
    net = 2 * 3 / 4 * 256 * 4096 * 2 * 32
    flops = 2 * 2 * MIX_EXPERT * 32 / 4 * 256
    for row in range(3):
        assert st.net_bytes[MOE, row] == pytest.approx(net, rel=1e-9)
        assert st.network_s[MOE, row] == pytest.approx(net / 450e9, rel=1e-9)
        assert st.flops[MOE, row] == pytest.approx(flops, rel=1e-9)


def test_doubling_the_batch_doubles_the_token_work_not_the_weights():
    one, two = _llama70(c=64), _llama70(c=128)
    for op in (PROJ, CORE, DENSE, LOGITS):
        assert two.flops[op, 0] == pytest.approx(2 * one.flops[op, 0], rel=1e-9)
    for op in (PROJ, DENSE, LOGITS):
        assert two.net_bytes[op, 0] == pytest.approx(2 * one.net_bytes[op, 0], rel=1e-9)
    for op in (PROJ, DENSE):                      # weights only: read once either way
        assert two.hbm_bytes[op, 0] == pytest.approx(one.hbm_bytes[op, 0], rel=1e-9)
    assert two.hbm_bytes[CORE, 0] == pytest.approx(2 * one.hbm_bytes[CORE, 0], rel=1e-9)


def test_two_batch_overlap_reads_the_weights_twice():
    base, tbo = _mixtral(), _mixtral(two_batch_overlap=1.0)
    for op in (PROJ, MOE, ROUTER):
        assert tbo.hbm_bytes[op, 0] == pytest.approx(2 * base.hbm_bytes[op, 0], rel=1e-9)
        assert tbo.flops[op, 0] == pytest.approx(base.flops[op, 0], rel=1e-9)
    assert tbo.net_bytes[MOE, 0] == pytest.approx(base.net_bytes[MOE, 0], rel=1e-9)


def test_no_op_beats_its_roofline_on_random_designs():
    # fitted efficiencies, random catalog designs (dense and MoE, tp, dp, ep, pp, lengths):
    # an op's time is never below its FLOPs at the fastest peak nor its bytes at the full HBM
    # bandwidth, in any of the three steps
    base = random_designs(300, seed=3)
    experts = base["model.id"].map(lambda m: catalog.models()[m].num_experts).to_numpy()
    group = (base["layout.tp"] * base["layout.dp"]).to_numpy()
    ep = np.minimum(group, np.maximum(experts, 1))
    base["layout.ep"] = np.where(group % ep == 0, ep, 1)
    b = to_batch(resolve(base))
    st = score(b, breakdown=True)[1]
    peak = functools.reduce(np.maximum, [b.matmul_flops_per_s, b.attn_flops_per_s,
                                         b.attn_matmul_flops_per_s, b.expert_matmul_flops_per_s])
    for s in (st.decode, st.mixed, st.prefill):
        assert np.all(s.flops >= 0) and np.all(s.hbm_bytes >= 0) and np.all(s.net_bytes >= 0)
        assert np.all(s.op_s >= s.flops / peak * (1 - 1e-9))
        assert np.all(s.op_s >= s.hbm_bytes / b.hbm_bw_bytes_per_s * (1 - 1e-9))
    assert np.any(st.decode.flops[MOE] > 0) and np.any(st.decode.flops[DENSE] > 0)
    assert np.any(st.decode.net_bytes[MOE] > 0) and np.any(st.decode.net_bytes[PIPE] > 0)


def test_the_hot_path_returns_no_work_table():
    b = batch(design(**{"workload.concurrency": 8}))
    m = score(b)
    assert isinstance(m, dict) and "flops" not in m
    st = score(b, breakdown=True)[1].decode
    assert st.flops.shape == st.hbm_bytes.shape == st.net_bytes.shape == (len(OPS), 1)


def test_gathered_coefficients_give_the_same_work_table():
    # the search scores gathered per-design coefficients (score_chunked(rows=...)), which
    # leave the work-only terms out: a breakdown from them rebuilds the same table
    from dse.perf.step import Coefficients
    distinct = batch([design(**{"layout.tp": tp, "workload.concurrency": 16})
                      for tp in (1, 2, 4)] + [design(model="mixtral-8x7b", **{
                          "layout.tp": 2, "layout.dp": 4, "layout.ep": 8})])
    rows = np.array([3, 0, 2, 2, 1, 3])
    sub = distinct.take(rows)
    k = Coefficients(distinct).gather(rows, sub)
    direct = score(sub, breakdown=True)[1]
    gathered = score(sub, breakdown=True, coefficients=k)[1]
    for name in ("decode", "mixed", "prefill"):
        a, b = getattr(direct, name), getattr(gathered, name)
        for col in ("flops", "hbm_bytes", "net_bytes", "op_s"):
            np.testing.assert_array_equal(getattr(a, col), getattr(b, col))
    assert np.all(direct.decode.flops[MOE, [0, 5]] > 0)


def test_prefill_reads_each_prompts_cached_prefix_on_its_stage():
    # Llama-3.1-8B in bf16 (32 layers, 8 KV heads of 128): K and V are 2 x 8 x 128 x 2 B a
    # token and layer; 2048-token prompts, half from the prefix cache: 1024 new tokens each
    kv_token_layer, new, prior = 2 * 8 * 128 * 2, 1024, 1024
    d = design(model="llama-3.1-8b", **{
        "model.weight_dtype": "bf16", "workload.isl": 2048, "workload.osl": 1,
        "workload.phase": "prefill", "workload.prefix_hit_fraction": 0.5,
        "serving.max_num_tokens": 16384})
    # a prefill-only batch of 2 prompts: its step writes 2 x 1024 new tokens' KV and reads
    # both prompts' cached 1024, all 32 layers on one chip
    st = _steps({**d, "workload.concurrency": 2}).mixed
    assert st.hbm_bytes[CORE, 0] == pytest.approx(
        (2 * new + 2 * prior) * kv_token_layer * 32, rel=1e-9)
    # pp = 2: a stage holds 16 layers, so one prompt's chunk step writes and reads 16 layers'
    st = _steps({**d, "workload.concurrency": 1, "layout.pp": 2}).prefill
    assert st.hbm_bytes[CORE, 0] == pytest.approx((new + prior) * kv_token_layer * 16, rel=1e-9)


def test_speculation_reads_each_sequences_kv_once_for_its_verified_tokens():
    # Llama-3.1-70B in bf16 on tp = 4, 64 sequences decoding at a mean context of 1000 + 200/2
    # with 2 draft tokens: the verify step runs 3 tokens a sequence, 192 query tokens, each
    # with its Q and O and its KV written, but a sequence's KV is read once for its 3 tokens
    d = design(**{"model.weight_dtype": "bf16", "layout.tp": 4, "workload.concurrency": 64,
                  "workload.isl": 1000, "workload.osl": 200, "workload.phase": "decode",
                  "serving.spec_tokens": 2, "serving.spec_method": "draft",
                  "serving.spec_draft_model": "llama-3.1-8b"})
    st = _steps(d).decode
    seqs, tokens, ctx, bf16 = 64, 192, 1100, 2
    kv_token_layer_chip = 2 * KV70 * HD70 * bf16 / 4       # K and V, 2 of the 8 KV heads
    kv_read = seqs * ctx * kv_token_layer_chip * L70
    q_o = L70 * 16 * 256 * bf16 * tokens
    kv_written = tokens * kv_token_layer_chip * L70
    assert st.hbm_bytes[CORE, 0] == pytest.approx(kv_read + q_o + kv_written, rel=1e-9)
    assert st.flops[CORE, 0] == pytest.approx(2 * 16 * 256 * tokens * ctx * L70, rel=1e-9)


def test_attention_dp_with_experts_split_over_two_chips_pays_both_collectives():
    # Mixtral in bf16 on tp = 1, dp = 8, ep = 4: two experts a rank, each split over 2 chips.
    # The all-to-all (low-latency kernels in a decode step): each chip's 256 / 8 tokens send a
    # row per (token, expert) pair to the 3 other ranks, 2 x 3/4 rows of 4096 elements, bf16
    # dispatch and combine (2 + 2 B), once per layer. The expert all-reduce over its 2 chips
    # (ring: 2 x 1/2 of the bytes) of the tokens that visit the rank, 256 x (1 - (3/4)^2)
    # (each of a token's 2 experts on a given rank with p = 1/4), 4096 x 2 B each, per layer
    d = design(model="mixtral-8x7b", **{
        "model.weight_dtype": "bf16", "layout.tp": 1, "layout.dp": 8, "layout.ep": 4,
        "workload.concurrency": 256, "workload.isl": 1000, "workload.osl": 200,
        "workload.phase": "decode"})
    st = _steps(d, expert_imbalance=1.0).decode
    a2a = 256 / 8 * 2 * 3 / 4 * 4096 * (2 + 2) * 32
    allreduce = 2 * 1 / 2 * 256 * (1 - (3 / 4) ** 2) * 4096 * 2 * 32
    assert st.net_bytes[MOE, 0] == pytest.approx(a2a + allreduce, rel=1e-9)


def test_two_batch_overlap_splits_moe_steps_only():
    # two-batch overlap hides an all-to-all, which a dense model has not: a Llama-3.1-70B row
    # scored beside a Mixtral row, both with it on, reads its tp = 4 share of the attention
    # weights once (80 layers, bf16), the Mixtral row twice
    mix = design(model="mixtral-8x7b", **{
        "model.weight_dtype": "bf16", "layout.tp": 1, "layout.dp": 8, "layout.ep": 8,
        "workload.concurrency": 256, "workload.isl": 1000, "workload.osl": 200,
        "workload.phase": "decode"})
    dense = design(**{"model.weight_dtype": "bf16", "layout.tp": 4, "workload.concurrency": 64,
                      "workload.isl": 1000, "workload.osl": 200, "workload.phase": "decode"})
    b = batch([mix, dense], ideal=True).replace(two_batch_overlap=1.0, expert_imbalance=1.0)
    st = score(b, breakdown=True)[1].decode
    assert st.hbm_bytes[PROJ, 1] == pytest.approx(ATTN70 / 4 * L70 * 2, rel=1e-9)
    attn_mix = 2 * 4096 * 32 * 128 + 2 * 4096 * 8 * 128
    assert st.hbm_bytes[PROJ, 0] == pytest.approx(2 * attn_mix * 32 * 2, rel=1e-9)
