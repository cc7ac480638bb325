"""Context parallelism's exchange by ``training.cp_comm_type`` (Megatron-Core's cp_comm_type):
p2p ring attention, a2a (DeepSpeed-Ulysses, arXiv:2309.14509) and all_gather, hand-worked on the
small dense design of test_train_physics (pure roofline links: 400 GB/s scale-up, 50 GB/s NIC,
8 chips a domain); the head-split check of a2a; the field in a case file and a space."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_train_physics import batch

from dse.errors import InputError
from dse.perf.train_batch import CP_COMM_TYPES
from dse.perf.train_step import score_train
from dse.perf.train_time import attention_core_s, cp_comm_s, cp_layer_s
from dse.scoring.train_predict import predict_train_frame
from dse.spec import train_fields

# the dense model: h 1024, 16 heads of 64 (MHA), seq 2048; cp 4 -> 512 tokens a chip
UP, OUT = 400e9, 50e9


def test_a2a_moves_q_k_v_in_and_o_back_by_hand():
    """tp 2, cp 4 (8 chips: one domain): each chip holds 512 tokens x 8 heads x 64 of Q, K, V
    and O, 524,288 bytes each, and sends a quarter of each to each of the 3 other ranks:
    4 all-to-alls of 3 x 131,072 bytes on the scale-up links."""
    b = batch(cp=4, tp=2, global_batch_seqs=1, cp_comm_type=1)
    per_peer = 512 * 8 * 64 * 2 / 4
    assert per_peer == 131072
    assert float(cp_comm_s(b)) == pytest.approx(4 * 3 * per_peer / UP, rel=1e-12)
    # the ring sends its whole K/V chunk (1,048,576 bytes) 3 times: twice a2a's bytes
    ring = float(cp_comm_s(b.replace(cp_comm_type=0)))
    assert ring == pytest.approx(3 * 2 * 512 * 8 * 64 * 2 / UP, rel=1e-12)
    assert ring == pytest.approx(2 * float(cp_comm_s(b)), rel=1e-12)


def test_a2a_across_the_domain_is_paced_by_the_nic():
    """tp 4, cp 4: the cp ranks sit 4 apart, 2 in a domain of 8; each chip's tensors are
    512 x 4 heads x 64 x 2 = 262,144 bytes, 65,536 to each peer: 1 peer over the scale-up
    links, 2 over the NIC, which sets the pace."""
    b = batch(cp=4, tp=4, global_batch_seqs=1, cp_comm_type=1)
    per_peer = 512 * 4 * 64 * 2 / 4
    assert float(cp_comm_s(b)) == pytest.approx(4 * max(per_peer / UP, 2 * per_peer / OUT),
                                                rel=1e-12)


def test_all_gather_receives_every_other_ranks_k_and_v():
    """all_gather: K and V each gathered whole: 3 peers x 524,288 bytes each, tp 2 inside."""
    b = batch(cp=4, tp=2, global_batch_seqs=1, cp_comm_type=2)
    chunk = 512 * 8 * 64 * 2
    assert float(cp_comm_s(b)) == pytest.approx(2 * 3 * chunk / UP, rel=1e-12)


def test_forward_and_backward_and_what_blocks():
    """p2p: 1 + attention_bwd_ratio forwards that may hide under the attention core; a2a:
    the forward, the backward's O and dO in and dQ, dK, dV back (the forward plus one O),
    blocking; all_gather: the forward, then K and V gathered again and dK, dV
    reduce-scattered (3 forwards), blocking."""
    p2p = batch(cp=4, tp=2, global_batch_seqs=1)
    hid, blk = cp_layer_s(p2p)
    assert float(hid) == pytest.approx(3.0 * float(cp_comm_s(p2p)), rel=1e-12)  # ratio 2
    assert float(blk) == 0.0
    a2a = p2p.replace(cp_comm_type=1)
    hid, blk = cp_layer_s(a2a)
    o = 3 * 512 * 8 * 64 * 2 / 4 / UP
    assert float(hid) == 0.0
    assert float(blk) == pytest.approx(2 * float(cp_comm_s(a2a)) + o, rel=1e-12)
    assert float(blk) == pytest.approx(9 * o, rel=1e-12)
    ag = p2p.replace(cp_comm_type=2)
    assert float(cp_layer_s(ag)[1]) == pytest.approx(3 * float(cp_comm_s(ag)), rel=1e-12)
    # cp = 1: nothing, whatever the type
    for code in (0, 1, 2):
        one = batch(tp=2, cp_comm_type=code)
        assert float(cp_comm_s(one)) == 0.0
        assert float(np.sum(cp_layer_s(one))) == 0.0


def test_the_step_pays_a2a_whole_and_hides_the_ring():
    """One micro-batch of 8 layers: the step's exposed network time is the ring's excess over
    the attention window (overlap_fraction 1), or the whole a2a exchange."""
    p2p = batch(cp=4, tp=2, global_batch_seqs=1)
    a2a = p2p.replace(cp_comm_type=1)
    window = float(attention_core_s(p2p)) * (1 + 2.0)
    ring = float(cp_layer_s(p2p)[0])
    base = float(score_train(p2p)["step_time_s"])
    step = float(score_train(a2a)["step_time_s"])
    assert step - base == pytest.approx(
        8 * (float(cp_layer_s(a2a)[1]) - max(ring - window, 0.0)), rel=1e-9)


ROW = {"case_id": "a", "model": "llama-3.1-8b", "hardware": "h100-sxm", "num_chips": 8,
       "tp": 2, "pp": 1, "dp": 1, "cp": 4, "global_batch_seqs": 4, "micro_batch_seqs": 1,
       "seq_len": 32768, "precision": "bf16", "recompute": "full", "zero_stage": 1,
       "sequence_parallel": "true"}


def test_the_case_column_sets_it_per_row_and_checks_the_heads():
    """Llama-3.1-8B (32 heads, 8 KV heads): tp 2 x cp 4 splits both (4 KV heads per tp rank
    over 4 cp ranks); tp 4 x cp 4 leaves 2 KV heads per tp rank for 4 cp ranks: invalid."""
    assert CP_COMM_TYPES == train_fields.CP_COMM_TYPES == ("p2p", "a2a", "all_gather")
    assert train_fields.REGISTRY["training.cp_comm_type"].default == "p2p"
    cases = pd.DataFrame([ROW] + [{**ROW, "case_id": k, "training.cp_comm_type": k}
                                  for k in CP_COMM_TYPES])
    t = predict_train_frame(cases).set_index("case_id")["step_time_s"]
    assert t["p2p"] == pytest.approx(t["a"], rel=1e-12)          # blank = p2p
    assert t["a2a"] != pytest.approx(t["a"], rel=1e-6)
    assert t["all_gather"] != pytest.approx(t["a"], rel=1e-6)
    bad = pd.DataFrame([{**ROW, "tp": 4, "cp": 4, "num_chips": 16,
                         "training.cp_comm_type": "a2a"}])
    row = predict_train_frame(bad).iloc[0]          # that row infeasible, the file scored
    assert not bool(row["feasible"]) and "a2a context parallelism" in str(row["reason"])
    with pytest.raises(InputError, match="training.cp_comm_type"):
        predict_train_frame(pd.DataFrame([{**ROW, "training.cp_comm_type": "ring"}]))
    # blank cp and dp: only the cp values that split the heads are searched (8 KV / tp 4 =
    # 2 per tp rank: cp 1 or 2); a cp the given degrees fix to 4 is that row infeasible
    free = {**ROW, "cp": None, "dp": None, "num_chips": 16, "tp": 4,
            "training.cp_comm_type": "a2a"}
    got = predict_train_frame(pd.DataFrame([free])).iloc[0]
    assert int(got["cp"]) in (1, 2)
    fixed = predict_train_frame(pd.DataFrame([{**free, "dp": 1}])).iloc[0]   # cp = 4 forced
    assert int(fixed["cp"]) == 4 and not bool(fixed["feasible"])
    assert "a2a context parallelism" in str(fixed["reason"])


def test_a_space_flags_a2a_layouts_that_do_not_split(tmp_path):
    from dse.build.space import load_space
    from dse.scoring import train_space
    text = """
task = "train"
[training]
global_batch_seqs = 4
seq_len = 32768
cp_comm_type = "a2a"
[model]
id = "llama-3.1-8b"
[accelerator]
id = "h100-sxm"
[layout]
pp = 1
dp = 1
micro_batch_seqs = 1
recompute = "full"
[parameters]
"layout.tp" = [2, 4]
"layout.cp" = [4]
[objectives]
step_time_s = "minimize"
"""
    path = tmp_path / "space.toml"
    path.write_text(text)
    s = train_space.score_values(load_space(str(path)),
                                 {"layout.tp": np.array([2.0, 4.0]),
                                  "layout.cp": np.array([4.0, 4.0])}, dtype=np.float64)
    reason = np.asarray(s["reason"])
    assert not (int(reason[0]) & 65536) and int(reason[1]) & 65536
    case = {**ROW, "training.cp_comm_type": "a2a"}
    pred = predict_train_frame(pd.DataFrame([case])).iloc[0]
    assert float(s["step_time_s"][0]) == pytest.approx(float(pred["step_time_s"]), rel=1e-9)
