"""The communication overlap of a training job's software (``training.tp_comm_overlap``,
``training.overlap_p2p_comm``, ``training.overlap_grad_reduce``, ``training.p2p_scatter_gather``),
hand-worked on the small dense design of test_train_physics at roofline (every collective at
the link bandwidth: an all-reduce of B bytes over g ranks takes 2 (g - 1) / g B / W, a send
B / W), and the calibration rule that sets them on the Megatron-LM rows
(dse.calibration.train_fit.SOFTWARE_RULES)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_train_physics import DENSE, batch

from dse.calibration.train_fit import apply_software_rules
from dse.errors import InputError
from dse.perf.train_batch import TP_COMM_OVERLAP
from dse.perf.train_memory import memory_bytes
from dse.perf.train_step import score_train
from dse.scoring.train_predict import predict_train_frame
from dse.spec import train_fields

UP = 400e9                      # the test design's scale-up bandwidth per chip (B/s)
ACT = 2048 * 1024 * 2           # one sequence's activations: 2048 tokens x hidden 1024 x bf16
ALL, BACKWARD, NONE = (float(TP_COMM_OVERLAP.index(k)) for k in ("all", "backward", "none"))


def step(**over) -> float:
    return float(score_train(batch(DENSE, **over))["step_time_s"])


def test_tensor_parallel_overlap_modes_by_hand():
    # tp 2, one micro-batch of one sequence: a layer's forward has two all-reduces of the
    # 4.19 MB activations over 2 ranks, 2 x 1/2 x 4.19e6 / 400e9 = 10.49 us each; the backward
    # as many. none: all four of each of the 8 layers on the critical path; backward: the
    # forward's two; all: none of them (overlap_fraction 1, the GEMMs are longer)
    ar = 2 * (1 / 2) * ACT / UP
    assert ar == pytest.approx(10.49e-6, rel=1e-3)
    one = {"tp": 2, "global_batch_seqs": 1}
    base = step(**one, tp_comm_overlap=ALL)
    assert step(**one) == base                                      # the default is "all"
    assert step(**one, tp_comm_overlap=NONE) - base == pytest.approx(8 * 4 * ar, rel=1e-9)
    assert step(**one, tp_comm_overlap=BACKWARD) - base == pytest.approx(8 * 2 * ar, rel=1e-9)
    # full recompute reruns the forward and its two all-reduces, never hidden but under "all"
    full = {**one, "recompute": 2}
    base = step(**full)
    assert step(**full, tp_comm_overlap=NONE) - base == pytest.approx(8 * 6 * ar, rel=1e-9)
    assert step(**full, tp_comm_overlap=BACKWARD) - base == pytest.approx(8 * 4 * ar, rel=1e-9)
    # and "all" still exposes what the fitted overlap_fraction leaves: half of the 6 here
    half = step(**full, overlap_fraction=0.5) - base
    assert half == pytest.approx(8 * 3 * ar, rel=1e-9)


def test_blocking_pipeline_sends_by_hand():
    # pp 2, 4 micro-batches of one sequence: each micro-batch sends its 4.19 MB activations
    # forward and their gradient back over the scale-up link (the pipeline spans 2 chips), 10.49
    # us each; blocking, they lengthen every micro-batch, and the 1F1B bubble (p - 1) t_mb too:
    # (4 + 1) x 2 x 10.49 us = 104.9 us
    send = ACT / UP
    pipe = {"pp": 2, "global_batch_seqs": 4}
    d = step(**pipe, overlap_p2p_comm=0.0) - step(**pipe)
    assert d == pytest.approx(5 * 2 * send, rel=1e-9)
    assert d == pytest.approx(104.9e-6, rel=1e-3)
    # tp 2 without sequence parallelism: the whole activation from each rank; scattered, half
    tp = {**pipe, "tp": 2}
    hidden = step(**tp)
    whole = step(**tp, overlap_p2p_comm=0.0) - hidden
    half = step(**tp, overlap_p2p_comm=0.0, p2p_scatter_gather=1.0) - hidden
    assert whole == pytest.approx(5 * 2 * send, rel=1e-9)
    assert half == pytest.approx(5 * 2 * send / 2, rel=1e-9)
    # sequence parallelism shards it already: scattering changes nothing
    sp = {**tp, "sequence_parallel": 1, "overlap_p2p_comm": 0.0}
    assert step(**sp, p2p_scatter_gather=1.0) == pytest.approx(step(**sp), rel=1e-12)


def test_gradient_reduction_after_the_backward_by_hand():
    # dp 2, ZeRO 0, one micro-batch: the bf16 gradients of the 166.2 M parameters (8 layers of
    # 4h^2 + 8h^2 + 2h norms, untied 32000 x 1024 embeddings and logits) all-reduced over 2
    # ranks of the domain: 2 x 1/2 x 332.4 MB / 400 GB/s = 831 us, under the backward (1.2 ms of
    # GEMMs) when overlapped, after it when not
    params = 8 * (4 * 1024 ** 2 + 2 * 1024 + 2 * 1024 * 4096) + 2 * 32000 * 1024
    b = {"dp": 2, "global_batch_seqs": 2}
    assert float(memory_bytes(batch(DENSE, **b))["params_per_chip"]) == pytest.approx(params)
    reduce_s = 2 * (1 / 2) * params * 2 / UP
    assert reduce_s == pytest.approx(831e-6, rel=1e-3)
    on = score_train(batch(DENSE, **b))
    off = score_train(batch(DENSE, overlap_grad_reduce=0.0, **b))
    assert float(on["network_exposed_s"]) == pytest.approx(0.0, abs=1e-12)
    assert float(off["step_time_s"] - on["step_time_s"]) == pytest.approx(reduce_s, rel=1e-9)
    # ZeRO-3 gathers and reduces per micro-batch, which the switch does not touch
    z3 = {**b, "zero_stage": 3}
    assert step(**z3, overlap_grad_reduce=0.0) == pytest.approx(step(**z3), rel=1e-12)


def test_the_fields_default_to_what_megatron_core_runs():
    reg = train_fields.REGISTRY
    assert reg["training.tp_comm_overlap"].default == "all"
    assert train_fields.TP_COMM_OVERLAP == TP_COMM_OVERLAP
    assert reg["training.overlap_p2p_comm"].default is True
    assert reg["training.overlap_grad_reduce"].default is True
    assert reg["training.p2p_scatter_gather"].default is False


ROW = {"case_id": "a", "model": "llama-3.1-8b", "hardware": "h100-sxm", "num_chips": 8,
       "tp": 2, "pp": 2, "dp": 2, "cp": 1, "global_batch_seqs": 16, "micro_batch_seqs": 1,
       "seq_len": 4096, "precision": "bf16", "recompute": "none", "zero_stage": 1,
       "sequence_parallel": "false"}


def test_the_case_columns_set_each_switch_per_row():
    cols = {"b": {"training.tp_comm_overlap": "backward"},
            "c": {"training.tp_comm_overlap": "none"},
            "d": {"training.overlap_p2p_comm": "false"},
            "e": {"training.overlap_grad_reduce": "false"},
            "f": {"training.overlap_p2p_comm": "false", "training.p2p_scatter_gather": "true"},
            "g": {"training.tp_comm_overlap": "all", "training.overlap_p2p_comm": "true"}}
    cases = pd.DataFrame([ROW] + [{**ROW, "case_id": k, **v} for k, v in cols.items()])
    t = predict_train_frame(cases).set_index("case_id")["step_time_s"]
    assert t["a"] < t["b"] < t["c"]
    assert t["d"] > t["f"] > t["a"] and t["e"] > t["a"]
    assert t["g"] == pytest.approx(t["a"], rel=1e-12)          # blank = the defaults
    bad = pd.DataFrame([{**ROW, "training.tp_comm_overlap": "sometimes"}])
    with pytest.raises(InputError, match="training.tp_comm_overlap"):
        predict_train_frame(bad)
    bad = pd.DataFrame([{**ROW, "training.overlap_grad_reduce": "maybe"}])
    with pytest.raises(InputError, match="training.overlap_grad_reduce"):
        predict_train_frame(bad)


def test_the_megatron_rules_follow_the_code_each_source_ran():
    rows = [("MEGATRON-2021", "NVIDIA/Megatron-LM README.md @ commit 152aab304d (2021-01-11)"),
            ("KORTHI", "Korthikanti et al. 2022"), ("NEMO2407", "NVIDIA/NeMo docs")]
    df = pd.DataFrame(rows, columns=["source", "citation"])
    got = apply_software_rules(df)
    meg, kor, nemo = (got.iloc[i] for i in range(3))
    assert (meg["training.tp_comm_overlap"], meg["training.overlap_p2p_comm"],
            meg["training.overlap_grad_reduce"], meg["sequence_parallel"],
            meg["zero_stage"]) == ("none", "false", "false", "false", "0")
    assert pd.isna(meg["training.p2p_scatter_gather"])         # no scatter/gather before 2021-02
    assert (kor["training.tp_comm_overlap"], kor["training.overlap_p2p_comm"],
            kor["training.p2p_scatter_gather"]) == ("backward", "false", "true")
    assert pd.isna(kor["sequence_parallel"])                   # the case file says per row
    assert nemo.drop(["source", "citation"]).isna().all()      # Megatron-Core: the defaults
    given = df.assign(sequence_parallel=["true", None, None])
    assert apply_software_rules(given)["sequence_parallel"].iloc[0] == "true"   # given wins


def test_a_space_sets_them_as_a_case_file_does(tmp_path):
    """The four fields in a training space give what the same case-file columns give, and a
    space can search over them."""
    from dse.build.space import load_space
    from dse.scoring import train_space
    text = """
task = "train"
[training]
global_batch_seqs = 16
seq_len = 4096
precision = "bf16"
tp_comm_overlap = "backward"
overlap_p2p_comm = false
overlap_grad_reduce = false
p2p_scatter_gather = true
[model]
id = "llama-3.1-8b"
[accelerator]
id = "h100-sxm"
[layout]
tp = 2
pp = 2
dp = 2
micro_batch_seqs = 1
zero_stage = 1
recompute = "none"
sequence_parallel = "off"
[objectives]
step_time_s = "minimize"
"""
    path = tmp_path / "space.toml"
    path.write_text(text)
    s = train_space.score_values(load_space(str(path)), {}, dtype=np.float64)
    case = {**ROW, "training.tp_comm_overlap": "backward", "training.overlap_p2p_comm": "false",
            "training.overlap_grad_reduce": "false", "training.p2p_scatter_gather": "true"}
    pred = predict_train_frame(pd.DataFrame([case])).iloc[0]
    assert float(s["step_time_s"][0]) == pytest.approx(float(pred["step_time_s"]), rel=1e-9)
    grid = path.read_text().replace('[objectives]', '[parameters]\n"training.tp_comm_overlap" = '
                                    '["all", "backward", "none"]\n[objectives]')
    path.write_text(grid)
    t = train_space.score_values(load_space(str(path)),
                                 {"training.tp_comm_overlap": np.array(["all", "backward",
                                                                        "none"], object)},
                                 dtype=np.float64)["step_time_s"]
    assert t[0] < t[1] < t[2] and t[1] == pytest.approx(float(pred["step_time_s"]), rel=1e-9)
