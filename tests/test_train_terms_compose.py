"""How one micro-batch's time is composed from its parts (dse/perf/train_step.py,
``micro_batch_parts``), hand-worked on a small mixed design where every factor shows (issue 25,
point 7): 4 MoE layers of 8 (MoE share 1/2), full recompute on half the layers (the rerun
forward, the elementwise pass and the TP and EP collectives 1/2 a time more), tp = ep = cp =
pp = dp = 2, attention backward 2.5 forwards. Each part's own value (GEMMs, attention core,
collectives, elementwise, sort) is hand-worked in test_train_physics, test_train_terms and
test_train_terms_kernels; this file pins the composition::

    fwd = attn GEMMs + 1/2 MoE MLP + 1/2 dense MLP + attention core
    bwd = their backward + 2.5 x attention core
    compute = 4 layers x (fwd + bwd + 1/2 fwd) + logits (fwd + bwd)
    memory  = 4 x (3.5 x elementwise + 2.5 x 1/2 x sort) + loss
    overhead = 4 x 7.5 / 4 x layer_overhead_s   (linear layers: 2 + 1/2 (1 + 2 x 4) + 1/2 x 2)
    network = 4 x (hide(2.5 tp, (fwd GEMMs) 1.5 + bwd GEMMs) + 2.5 x 1/2 ep
                   + hide(3.5 cp, 3.5 x attention core)) + hide(pp, compute)
"""

from __future__ import annotations

import numpy as np
import pytest
from test_train_physics import MOE, batch

from dse.perf.train_step import micro_batch_parts, score_train
from dse.perf.train_time import (
    attention_core_s,
    cp_comm_s,
    elementwise_s,
    ep_comm_s,
    layer_gemms_s,
    loss_s,
    moe_sort_s,
    pp_comm_s,
    tp_comm_s,
)

MIXED = {**MOE, "moe_layers": 4, "ffn": 2048}


def mixed(**over):
    f = {"tp": 2, "ep": 2, "cp": 2, "pp": 2, "dp": 2, "global_batch_seqs": 8, "recompute": 2,
         "recompute_layer_fraction": 0.5, "sequence_parallel": 1, "overlap_fraction": 0.0,
         "layer_overhead_s": 1e-5, "attention_bwd_ratio": 2.5}
    f.update(over)
    return batch(MIXED, **f)


def pieces(b):
    g = layer_gemms_s(b)
    f = {k: float(v) for k, v in (("attn", attention_core_s(b)), ("tp", tp_comm_s(b)),
                                  ("ep", ep_comm_s(b)), ("cp", cp_comm_s(b)),
                                  ("pp", pp_comm_s(b)), ("sort", moe_sort_s(b)),
                                  ("elem", elementwise_s(b)), ("loss", loss_s(b)))}
    f["gemm_f"] = float(g["attn"][0] + 0.5 * g["moe_mlp"][0] + 0.5 * g["dense_mlp"][0])
    f["gemm_b"] = float(g["attn"][1] + 0.5 * g["moe_mlp"][1] + 0.5 * g["dense_mlp"][1])
    f["logits"] = float(g["logits"][0] + g["logits"][1])
    return f


def test_compute_and_memory_of_a_micro_batch_by_hand():
    b = mixed()
    p, parts = pieces(b), micro_batch_parts(b)
    assert min(p.values()) > 0                     # every part is there to be counted
    fwd = p["gemm_f"] + p["attn"]
    bwd = p["gemm_b"] + 2.5 * p["attn"]
    assert float(parts["forward_s"]) == pytest.approx(4 * fwd, rel=1e-12)
    assert float(parts["backward_s"]) == pytest.approx(4 * bwd, rel=1e-12)
    assert float(parts["compute_s"]) == pytest.approx(4 * (fwd + bwd + 0.5 * fwd) + p["logits"],
                                                      rel=1e-12)
    assert float(parts["memory_s"]) == pytest.approx(
        4 * (3.5 * p["elem"] + 2.5 * 0.5 * p["sort"]) + p["loss"], rel=1e-12)
    # 4 local experts (8 over ep 2): 7.5 linear layers a layer, the fitted time per 4
    assert float(parts["overhead_s"]) == pytest.approx(4 * 7.5 / 4 * 1e-5, rel=1e-12)


def test_collectives_exposed_whole_without_overlap():
    # overlap_fraction 0: every collective is exposed whole
    b = mixed()
    p, parts = pieces(b), micro_batch_parts(b)
    net = 4 * (2.5 * p["tp"] + 2.5 * 0.5 * p["ep"] + 3.5 * p["cp"]) + p["pp"]
    assert float(parts["network_exposed_s"]) == pytest.approx(net, rel=1e-12)
    assert float(parts["network_total_s"]) == pytest.approx(net, rel=1e-12)


def test_collectives_hide_under_their_windows():
    """overlap_fraction 1 on slow links (100 MB/s): TP exposes what exceeds the layer's GEMMs
    (the forward's 1.5 times with half the layers recomputed), CP what exceeds the attention
    core's forward and backward, the pipeline sends what exceeds the micro-batch's compute;
    EP sits on the critical path. The totals do not depend on the overlap."""
    b = mixed(overlap_fraction=1.0, scaleup_bw_bytes_per_s=1e8, scaleout_bw_bytes_per_s=1e8)
    p, parts = pieces(b), micro_batch_parts(b)
    compute = float(parts["compute_s"])
    windows = {"tp": (2.5 * p["tp"], 1.5 * p["gemm_f"] + p["gemm_b"]),
               "cp": (3.5 * p["cp"], 3.5 * p["attn"]), "pp": (p["pp"], compute)}
    assert all(t > w > 0 for t, w in windows.values())   # each window matters
    exposed = {k: t - w for k, (t, w) in windows.items()}
    net = 4 * (exposed["tp"] + 2.5 * 0.5 * p["ep"] + exposed["cp"]) + exposed["pp"]
    assert float(parts["network_exposed_s"]) == pytest.approx(net, rel=1e-12)
    total = 4 * (2.5 * p["tp"] + 2.5 * 0.5 * p["ep"] + 3.5 * p["cp"]) + p["pp"]
    assert float(parts["network_total_s"]) == pytest.approx(total, rel=1e-12)


def test_partial_overlap_exposes_the_rest_of_what_fits():
    # overlap 0.75: what fits in the window is exposed a quarter
    b = mixed(overlap_fraction=0.75)
    p, parts = pieces(b), micro_batch_parts(b)
    windows = {"tp": (2.5 * p["tp"], 1.5 * p["gemm_f"] + p["gemm_b"]),
               "cp": (3.5 * p["cp"], 3.5 * p["attn"]), "pp": (p["pp"], float(parts["compute_s"]))}
    hide = {k: t - min(t, w) + 0.25 * min(t, w) for k, (t, w) in windows.items()}
    net = 4 * (hide["tp"] + 2.5 * 0.5 * p["ep"] + hide["cp"]) + hide["pp"]
    assert float(parts["network_exposed_s"]) == pytest.approx(net, rel=1e-12)


def test_network_total_is_at_least_what_is_exposed():
    # over the overlap fraction and the links: the total never depends on the overlap, and
    # what is exposed never exceeds it
    for bw in (1e8, 4e11):
        totals = []
        for ov in (0.0, 0.5, 1.0):
            s = score_train(mixed(overlap_fraction=ov, scaleup_bw_bytes_per_s=bw,
                                  scaleout_bw_bytes_per_s=bw / 8, dp=4, global_batch_seqs=16))
            assert float(s["network_exposed_s"]) <= float(s["network_total_s"]) * (1 + 1e-12)
            totals.append(float(s["network_total_s"]))
        assert np.allclose(totals, totals[0], rtol=1e-12)


# ------------------------------------------------------------------------ the optimizer step

def dense(**over):
    f = {"dp": 2, "cp": 2, "pp": 2, "global_batch_seqs": 8, "zero_stage": 1,
         "overlap_fraction": 0.0, "hbm_fraction": 0.8}
    f.update(over)
    return batch(**f)


def test_step_with_data_and_context_parallelism_by_hand():
    """ZeRO 1, dp = cp = 2 (the gradient reduction spans the 4 ranks of dp x cp), pp = 2,
    4 micro-batches, nothing hidden::

        step = 4 t_mb + (p - 1) t_mb + all-reduce(2 bytes x params, 4 ranks) + optimizer
        optimizer = 30 bytes x params / (dp cp) at 0.8 x 2 TB/s
    """
    from dse.perf.train_memory import state_bytes
    b = dense()
    n = float(state_bytes(b)["params_per_chip"])
    # half the 8 layers, the embedding on the first stage: 4 x 12.59e6 + 32.77e6 = 83.1e6
    assert n == pytest.approx(4 * (4 * 1024 ** 2 + 2 * 1024 + 2 * 1024 * 4096) + 32000 * 1024)
    parts = micro_batch_parts(b)
    t_mb = float(parts["compute_s"] + parts["memory_s"] + parts["overhead_s"]
                 + parts["network_exposed_s"])
    ar = 2 * 3 / 4 * 2 * n / 400e9                  # ring over 4 ranks inside the domain
    opt = 30 * n / 4 / (2e12 * 0.8)
    s = score_train(b)
    assert float(s["optimizer_s"]) == pytest.approx(opt, rel=1e-12)
    assert float(s["step_time_s"]) == pytest.approx(5 * t_mb + ar + opt, rel=1e-12)
    assert float(s["network_exposed_s"]) == pytest.approx(
        4 * float(parts["network_exposed_s"]) + ar, rel=1e-12)
    assert float(s["network_total_s"]) == pytest.approx(
        4 * float(parts["network_total_s"]) + ar, rel=1e-12)
    # ZeRO 0: the optimizer updates every parameter the chip holds
    assert float(score_train(b.replace(zero_stage=0))["optimizer_s"]) == pytest.approx(4 * opt)


def test_zero3_collectives_run_every_micro_batch():
    """ZeRO 3: two parameter all-gathers and a gradient reduce-scatter (1.5 all-reduces) per
    micro-batch, inside it; no reduction at the end of the step."""
    from dse.perf.train_memory import state_bytes
    b = dense(zero_stage=3)
    n = float(state_bytes(b)["params_per_chip"])
    parts = micro_batch_parts(b)
    z = 1.5 * 2 * 3 / 4 * 2 * n / 400e9
    t_mb = float(parts["compute_s"] + parts["memory_s"] + parts["overhead_s"]
                 + parts["network_exposed_s"]) + z
    opt = 30 * n / 4 / (2e12 * 0.8)
    s = score_train(b)
    assert float(s["step_time_s"]) == pytest.approx(5 * t_mb + opt, rel=1e-12)
    assert float(s["network_total_s"]) == pytest.approx(
        4 * (float(parts["network_total_s"]) + z), rel=1e-12)


def test_gradient_reduction_hides_under_the_micro_batch_forward_and_backward():
    # overlap 1 on 1 GB/s links: what exceeds the forward + backward of a micro-batch shows
    from dse.perf.train_memory import state_bytes
    b = dense(overlap_fraction=1.0, scaleup_bw_bytes_per_s=1e9)
    n = float(state_bytes(b)["params_per_chip"])
    parts = micro_batch_parts(b)
    window = float(parts["forward_s"] + parts["backward_s"])
    ar = 2 * 3 / 4 * 2 * n / 1e9
    assert ar > window > 0
    s = score_train(b)
    assert float(s["network_exposed_s"]) == pytest.approx(
        4 * float(parts["network_exposed_s"]) + ar - window, rel=1e-12)
