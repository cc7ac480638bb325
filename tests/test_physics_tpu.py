"""TPU physics worked by hand through the scorer (issue 28, point 6): the 2D weight-stationary
layout's communication (Pope et al. 2022, "Efficiently Scaling Transformer Inference", section
3.2.2), the KV cache split by sequence (their multiquery layout), the TPU's matmuls on its MXUs
(no GPU tile padding) and a TPU step without GPU launch or per-layer overheads.

Every expected value is worked from the paper's formulas, the catalog's spec-sheet numbers and
the architecture (dse/catalog/kernels/architecture.toml), never from a measured serving figure;
a term changed by 20% fails the test that pins it (exact comparisons).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers import batch, design

from dse.errors import InputError
from dse.perf import score, tp2d
from dse.scoring.predict import predict_frame

DECODE = {"workload.isl": 1, "workload.osl": 2, "workload.phase": "decode"}
# a small dense model for hand arithmetic: d_model E = 1024, d_ff F = 4 E, non-gated (the
# paper's two-matrix MLP), 8 layers, 16 heads of 64, one KV head (multiquery)
SMALL = {"model.id": "llama-3.1-8b", "model.hidden_size": 1024, "model.intermediate_size": 4096,
         "model.mlp_gated": False, "model.num_hidden_layers": 8,
         "model.num_attention_heads": 16, "model.num_key_value_heads": 1, "model.head_dim": 64}


def _small(acc="tpu-v4", **kw) -> dict:
    d = design(acc, **SMALL)
    d.update(kw)
    return d


def test_2d_weight_stationary_bytes_match_the_papers_formula():
    """Pope et al. 2022, 2D weight-stationary FFN: per layer a chip moves ``2 B L E / X`` over
    the YZ axis (input all-gather, output reduce-scatter) and ``2 B L F / YZ`` over X (the
    d_ff partial sums reduce-scattered, the activations all-gathered), each with its ring
    factor (N - 1) / N. n = 16 chips as X = 2 by YZ = 8, B L = 32 tokens, E = 1024, F = 4096,
    bf16 (2 bytes): 2*32*1024/2 * 7/8 + 2*32*4096/8 * 1/2 = 28,672 + 16,384 elements =
    90,112 bytes per layer; the model's work table counts that for the dense MLP."""
    yz_b, x_b = tp2d.block_bytes_per_row(1024.0, 4096.0, 4096.0, 2.0, 8.0, 2.0)
    assert 32 * yz_b == pytest.approx(2 * 32 * 1024 / 2 * 7 / 8 * 2, rel=1e-12)
    assert 32 * x_b == pytest.approx(2 * 32 * 4096 / 8 * 1 / 2 * 2, rel=1e-12)
    b = batch(_small(**DECODE, **{"layout.tp": 16, "layout.tp_x": 2,
                                  "workload.concurrency": 32}))
    _, steps = score(b, breakdown=True)
    mlp = steps.decode.net_bytes[2, 0]                 # OPS: mlp_dense
    assert mlp == pytest.approx(8 * 90_112.0, rel=1e-12)
    # at the paper's optimum X = sqrt(n E / F) = 0.5 sqrt(n) (F = 4E) the volume without the
    # ring factors is 8 B L E / sqrt(n): n = 64, X = 4, YZ = 16
    n, x, yz, bl, e = 64.0, 4.0, 16.0, 32.0, 1024.0
    assert 2 * bl * e / x + 2 * bl * 4 * e / yz == pytest.approx(8 * bl * e / np.sqrt(n))


def test_2d_collectives_run_on_each_axis_links():
    """The X axis (4 chips: a 2 x 2 block of the 3D torus) has 2 of a chip's 6 ICI links, so
    its collectives see 2/6 of the 270 GB/s injection bandwidth; the decode step's MLP network
    time is the four collectives' bytes over their axis's links at the achieved fraction
    (scaleup_fraction) plus one ring latency each, per layer."""
    b = batch(_small(**DECODE, **{"layout.tp": 64, "layout.tp_x": 4,
                                  "workload.concurrency": 64}))
    # the groups sit as compact blocks of the 16 x 16 x 16 pod (dse.catalog.topology): X = 4 a
    # 2 x 2 block (2 in-group links per chip), YZ = 16 a 4 x 2 x 2 block (1.5 + 1 + 1 links per
    # chip: the 4-chip line has no wraparound); a ring collective's latency is twice the
    # group's mean hops at 1 us per hop (TPU ICI): 4/3 in the 2 x 2 block, 2.4 in the 4 x 2 x 2
    # one (1.25 + 0.5 + 0.5 over all pairs, x 256/240 over distinct ones)
    x_share, yz_share, x_lat, yz_lat = 2 / 6, 3.5 / 6, 2 * 1e-6 * 4 / 3, 2 * 1e-6 * 2.4
    assert (b.tp_x_bw_fraction[0], b.tp_yz_bw_fraction[0]) == pytest.approx((x_share, yz_share))
    assert (b.tp_x_latency_s[0], b.tp_yz_latency_s[0]) == pytest.approx((x_lat, yz_lat))
    _, steps = score(b, breakdown=True)
    rows, e, f, layers = 64.0, 1024.0, 4096.0, 8.0
    yz_bytes = 2 * rows * e * 2 / 4 * 15 / 16
    x_bytes = 2 * rows * f * 2 / 16 * 3 / 4
    bw = 270e9 * 0.8                                   # ICI per chip x scaleup_fraction
    assert b.scaleup_fraction[0] == 0.8
    want = layers * (yz_bytes / (bw * yz_share) + x_bytes / (bw * x_share)
                     + 2 * (yz_lat + x_lat))
    assert steps.decode.network_s[2, 0] == pytest.approx(want, rel=1e-9)


def test_2d_layout_lifts_the_heads_rule_to_tp_over_x():
    """tp = 64 does not divide 48 heads, but the 2D mesh 4 x 16 splits the heads 16 ways
    (Pope et al. padded PaLM's 48 heads to 64 only for 1D): feasible; a tp_x that does not
    divide tp, or 2D with experts, is refused."""
    palm = {"accelerator.id": "tpu-v4", "model.id": "palm-540b", **DECODE,
            "workload.concurrency": 64}
    assert score(batch({**palm, "layout.tp": 64}))["reason"][0] & 1
    assert score(batch({**palm, "layout.tp": 64, "layout.tp_x": 4}))["reason"][0] & 1 == 0
    with pytest.raises(InputError, match="does not divide layout.tp"):
        batch({**palm, "layout.tp": 64, "layout.tp_x": 3})
    with pytest.raises(InputError, match="2D weight-stationary"):
        batch(design("tpu-v5p", "mixtral-8x7b", **{"layout.tp": 8, "layout.tp_x": 2}))


def test_kv_split_by_sequence_stores_multiquery_kv_once():
    """One KV head over tp = 16: split by heads every chip keeps the whole head (16 copies);
    split by sequence each keeps 1/16 of the sequences. The queries and outputs move by an
    all-to-all: 16 heads x (64 + 64) dims x 2 bytes x (16 - 1) / 16^2 per token per layer."""
    d = _small(**DECODE, **{"layout.tp": 16, "workload.concurrency": 64})
    heads = score(batch(d))["kv_bytes_per_chip"][0]
    m, steps = score(batch({**d, "layout.kv_sharding": "batch"}), breakdown=True)
    assert m["kv_bytes_per_chip"][0] == pytest.approx(heads / 16, rel=1e-12)
    want = 64 * 8 * 16 * 128 * 2 * 15 / 256
    assert steps.decode.net_bytes[1, 0] == pytest.approx(want, rel=1e-12)   # attn_core
    # its time: the bytes over the tp group's all-to-all share of the links, and two ring
    # latencies of the 16-chip group per layer (1D: no X axis)
    # (the 16 chips a 4 x 2 x 2 block: an all-to-all's share 4 x bisection / 16, the cut
    # across the 4-long axis 4 links of 1/6 each: 1/6; latency 2 x 2.4 hops x 1 us)
    b = batch({**d, "layout.kv_sharding": "batch"})
    assert b.tp_x_latency_s[0] == 0.0
    assert b.tp_a2a_bw_fraction[0] == pytest.approx(1 / 6, rel=1e-12)
    assert steps.decode.network_s[1, 0] == pytest.approx(
        want / (270e9 * 0.8 / 6) + 8 * 2 * (2 * 1e-6 * 2.4), rel=1e-9)


def test_kv_split_by_sequence_moves_nothing_on_rows_that_split_by_heads_or_run_alone():
    """Scored in one batch beside a row that splits its KV by sequence, a row that splits it by
    heads and a tp = 1 row asked to split by sequence run no all-to-all: attention's network
    time is each one's alone (the heads row's none, the attention core needing no collective;
    one chip has no other to send to), the sequence-split row's its 8 layers x 2 ring latencies
    of 4.8 us (76.8 us) plus its bytes, as alone."""
    d = _small(**DECODE, **{"layout.tp": 16, "workload.concurrency": 64})
    solo = {**d, "layout.tp": 1, "layout.kv_sharding": "batch"}
    rows = [d, {**d, "layout.kv_sharding": "batch"}, solo]
    _, mixed = score(batch(rows), breakdown=True)
    for i, r in enumerate(rows):
        _, alone = score(batch(r), breakdown=True)
        assert mixed.decode.network_s[1, i] == pytest.approx(alone.decode.network_s[1, 0],
                                                             rel=1e-12, abs=0.0)
    assert mixed.decode.network_s[1, 0] == 0.0 and mixed.decode.network_s[1, 2] == 0.0
    assert mixed.decode.network_s[1, 1] > 8 * 2 * (2 * 1e-6 * 2.4)


def test_tpu_gemm_runs_its_rows_without_gpu_tile_padding():
    """8 decode tokens through the dense MLP on TPU v4 (tp = 8, 1D): the MXU streams the 8 rows
    (no padding to a GPU tile's ~100 rows), at 0.85 of the 275 TFLOP/s bf16 peak (JAX's Pallas
    TPU matmul guide: 80-90%), each GEMM's shape padded to the MXU's 128 columns: k (1 + 64/n)
    + 64 per GEMM, here n = 512 (up: 4096 / 8 wide, k = 1024) and n = 1024 (down: k = 512)."""
    b = batch(_small(**DECODE, **{"layout.tp": 8, "workload.concurrency": 8}))
    assert b.gemm_half_rows[0] == 0.0 and b.gemm_latency_s[0] == 0.0
    _, steps = score(b, breakdown=True)
    a = (512 * ((1 + 64 / 512) * 1024 + 64) + 1024 * ((1 + 64 / 1024) * 512 + 64))
    want = a * 8 * 8 * 2 / (275e12 * 0.85)                              # rows x layers
    assert steps.decode.compute_s[2, 0] == pytest.approx(want, rel=1e-9)


def test_tpu_step_carries_no_gpu_launch_or_layer_overhead():
    """The same decode step on H100 pays a fixed time per GEMM launch and per layer (CUDA);
    the TPU's own catalog entry sets no per-layer time, for graph-replayed steps too;
    on TPU v4 (XLA: one program per step) the step's fixed time is only the runtime's host
    time per running sequence."""
    d = _small(**DECODE, **{"layout.tp": 8, "workload.concurrency": 8})
    tpu = batch(d)
    gpu = batch({**d, "accelerator.id": "h100-sxm"})
    _, st = score(tpu, breakdown=True)
    assert st.decode.overhead_s[0] == pytest.approx(tpu.seq_overhead_s[0] * 8, rel=1e-12)
    _, sg = score(gpu, breakdown=True)
    # a decode-only step replays as a CUDA graph: its per-layer time is the graph's
    fixed = 8 * gpu.graph_layer_overhead_s[0] + 33 * gpu.gemm_latency_s[0]  # 4 GEMMs/layer + head
    assert sg.decode.overhead_s[0] == pytest.approx(fixed + gpu.seq_overhead_s[0] * 8, rel=1e-9)
    assert fixed > 100e-6


def test_1d_tp_on_tpu_all_reduces_over_the_ici_links():
    """TPU ICI collectives are DMAs over the torus links (topology.link_collectives), not GPU
    kernels: a 1D tp = 8 block all-reduces as a ring over its group's links, ``2 d (tp - 1) /
    tp`` elements per row, two ring latencies per layer. The 8 chips are a 2 x 2 x 2 block of
    the pod: 3 of 6 links per chip, mean hops 1.5 x 8/7 over distinct pairs."""
    b = batch(_small(**DECODE, **{"layout.tp": 8, "workload.concurrency": 32}))
    assert b.link_collectives[0] == 1.0
    share, lat = 3 / 6, 2 * 1e-6 * 1.5 * 8 / 7
    assert (b.tp_yz_bw_fraction[0], b.tp_yz_latency_s[0]) == pytest.approx((share, lat))
    _, steps = score(b, breakdown=True)
    nbytes = 2 * 1024 * 2 * 7 / 8 * 32                 # per layer
    want = 8 * (nbytes / (270e9 * 0.8 * share) + 2 * lat)
    assert steps.decode.network_s[2, 0] == pytest.approx(want, rel=1e-9)   # mlp_dense
    assert steps.decode.net_bytes[2, 0] == pytest.approx(8 * nbytes, rel=1e-12)
    # the same design on H100 NVLink runs the fitted all-reduce kernels instead
    gpu = batch({**_small(**DECODE, **{"layout.tp": 8, "workload.concurrency": 32}),
                 "accelerator.id": "h100-sxm"})
    assert not gpu.has_on("link_collectives")


def test_a_dense_mlp_split_over_tp_x_dp_keeps_the_kernels_all_reduce_on_tpu():
    """On the ICI (link_collectives) only a tp group's blocks run as rings on the group's links:
    a dense MLP split over tp x dp = 2 x 4 = 8 chips (every chip sees the 32 tokens) all-reduces
    with the collective kernels, 2 x 7/8 x 32 tokens x 1024 x 2 B = 114,688 B a layer, 917,504 B
    over the 8 layers; replicated on each rank's tp = 2 group it is the links' 1D ring, 2 x 1024
    x 2 B x 1/2 = 2048 B a row, 8 rows a rank: 131,072 B over the 8 layers."""
    kw = {"layout.tp": 2, "layout.dp": 4, "workload.concurrency": 32}
    b = batch([_small(**DECODE, **kw, **{"layout.dense_mlp": m}) for m in ("split", "replicated")])
    assert b.link_collectives[0] == 1.0
    _, steps = score(b, breakdown=True)
    assert steps.decode.net_bytes[2, 0] == pytest.approx(8 * 2 * 7 / 8 * 32 * 1024 * 2, rel=1e-12)
    assert steps.decode.net_bytes[2, 1] == pytest.approx(8 * 2048 * 8, rel=1e-12)


def test_predict_searches_the_2d_layouts_only_where_collectives_run_on_links():
    """A blank layout on 64 TPU v4 for a dense multiquery model: predict also tries the 2D
    meshes and the KV split by sequence, and keeps the fastest; on GPUs the search is the
    (tp, pp, ep, dp) one and writes no tp_x column."""
    row = {"case_id": "t", "model": "palm-540b", "hardware": "tpu-v4", "num_chips": "64",
           "weight_dtype": "bf16", "isl": "2048", "osl": "64", "concurrency": "64",
           "phase": "decode"}
    out = predict_frame(pd.DataFrame([row]))
    assert out["tp_x"][0] > 1 and out["kv_sharding"][0] == "batch" and out["tp"][0] == 64
    gpu = predict_frame(pd.DataFrame([{**row, "model": "llama-3.1-70b", "hardware": "h100-sxm",
                                       "num_chips": "8"}]))
    assert "tp_x" not in gpu.columns
    # a given mesh with a blank KV split: the split is searched, the mesh kept
    out = predict_frame(pd.DataFrame([{**row, "tp_x": "4"}]))
    assert out["tp_x"][0] == 4 and out["tp"][0] % 4 == 0 and out["dp"][0] == 1
