"""Selective recompute of the norms and of the MoE activation (``training.recompute_norms``,
``training.recompute_moe_act``: Megatron-Core's ``recompute_modules`` "layernorm" and
"moe_act"), hand-worked on the small MoE design of test_train_physics at roofline (HBM at
2 TB/s, fraction 1), and the calibration rule that sets them on the Megatron-Bridge gpt-oss
row (dse.calibration.train_fit.RECOMPUTE_RULES)."""

from __future__ import annotations

import pandas as pd
import pytest
from test_train_physics import HBM, MOE, batch

from dse.calibration.train_fit import apply_recompute_rules
from dse.errors import InputError
from dse.perf.train_step import score_train
from dse.perf.train_time import recompute_elementwise_s
from dse.scoring.train_predict import predict_train_frame
from dse.spec import train_fields

TOKENS = 2048                   # one micro-batch of one 2048-token sequence
NORMS = 2 * 2 * 1024 * 2        # two pre-norms, each reads and writes h = 1024 bf16: 8192 B/token
ACT = 2 * 512 * 3 * 2           # topk 2 rows, each reads 2 x 512 and writes 512 bf16: 6144 B
RUNS = 8 * 8                    # 8 layers x 8 micro-batches (global 8, micro 1, dp 1, pp 1)


def step(**over) -> float:
    return float(score_train(batch(MOE, **over))["step_time_s"])


def test_recompute_modules_cost_their_forward_passes_by_hand():
    # norms: 2048 x 8192 / 2e12 = 8.389 us a layer; the MoE activation 2048 x 6144 / 2e12 =
    # 6.291 us; both 14.68 us, 64 runs a step: 0.9395 ms
    assert NORMS == 8192 and ACT == 6144
    norms = TOKENS * NORMS / HBM
    act = TOKENS * ACT / HBM
    assert norms == pytest.approx(8.389e-6, rel=1e-3) and act == pytest.approx(6.291e-6, rel=1e-3)
    assert float(recompute_elementwise_s(batch(MOE, recompute_norms=1.0))) == \
        pytest.approx(norms, rel=1e-12)
    assert float(recompute_elementwise_s(batch(MOE, recompute_moe_act=1.0))) == \
        pytest.approx(act, rel=1e-12)
    base = step()
    assert step(recompute_norms=1.0) - base == pytest.approx(RUNS * norms, rel=1e-9)
    assert step(recompute_moe_act=1.0) - base == pytest.approx(RUNS * act, rel=1e-9)
    both = step(recompute_norms=1.0, recompute_moe_act=1.0) - base
    assert both == pytest.approx(RUNS * (norms + act), rel=1e-9)
    assert both == pytest.approx(0.9395e-3, rel=1e-3)


def test_tensor_parallelism_shards_them_and_full_recompute_already_reruns_them():
    # tp 2: the activation's rows split 2 ways; the norms only with sequence parallelism
    norms = TOKENS * NORMS / HBM
    act = TOKENS * ACT / HBM
    on = {"recompute_norms": 1.0, "recompute_moe_act": 1.0, "tp": 2}
    assert float(recompute_elementwise_s(batch(MOE, **on))) == \
        pytest.approx(norms + act / 2, rel=1e-12)
    assert float(recompute_elementwise_s(batch(MOE, **on, sequence_parallel=1))) == \
        pytest.approx((norms + act) / 2, rel=1e-12)
    # a full recompute of every layer reruns their whole forward (elementwise_s's x 4)
    assert float(recompute_elementwise_s(batch(MOE, **on, recompute=2))) == 0.0
    half = batch(MOE, **on, recompute=2, recompute_layer_fraction=0.5)
    assert float(recompute_elementwise_s(half)) == pytest.approx((norms + act / 2) / 2,
                                                                 rel=1e-12)
    # a dense model has no MoE activation to rerun
    dense = {**MOE, "moe_layers": 0, "ffn": 1024}
    assert float(recompute_elementwise_s(batch(dense, recompute_moe_act=1.0))) == 0.0


def test_the_fields_default_to_no_selective_recompute():
    reg = train_fields.REGISTRY
    assert reg["training.recompute_norms"].default is False
    assert reg["training.recompute_moe_act"].default is False


ROW = {"case_id": "a", "model": "qwen3-30b-a3b", "hardware": "h100-sxm", "num_chips": 8,
       "tp": 1, "pp": 1, "dp": 8, "ep": 8, "cp": 1, "global_batch_seqs": 64,
       "micro_batch_seqs": 1, "seq_len": 4096, "precision": "bf16", "recompute": "none",
       "zero_stage": 1}


def test_the_case_columns_set_them_per_row():
    cols = {"b": {"training.recompute_norms": "true"},
            "c": {"training.recompute_moe_act": "true"},
            "d": {"training.recompute_norms": "true", "training.recompute_moe_act": "true"},
            "e": {"training.recompute_norms": "false", "training.recompute_moe_act": "false"}}
    cases = pd.DataFrame([ROW] + [{**ROW, "case_id": k, **v} for k, v in cols.items()])
    t = predict_train_frame(cases).set_index("case_id")["step_time_s"]
    assert t["a"] < t["b"] < t["d"] and t["a"] < t["c"] < t["d"]
    assert t["d"] - t["a"] == pytest.approx((t["b"] - t["a"]) + (t["c"] - t["a"]), rel=1e-6)
    assert t["e"] == pytest.approx(t["a"], rel=1e-12)           # blank = the defaults
    bad = pd.DataFrame([{**ROW, "training.recompute_moe_act": "sometimes"}])
    with pytest.raises(InputError, match="training.recompute_moe_act"):
        predict_train_frame(bad)


def test_the_bridge_rule_covers_the_gpt_oss_h100_row_only():
    cite = ("NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md @ commit "
            "0a25f911b2ed6c6905a539504fdb8e5b40e3438b, section \"25.11 NeMo Container\"")
    rows = [("MB2511", cite, "gpt-oss-120b"), ("MB2511", cite, "qwen3-235b-a22b"),
            ("NEMO2407", "NVIDIA/NeMo docs", "gpt-oss-120b")]
    got = apply_recompute_rules(pd.DataFrame(rows, columns=["source", "citation", "model"]))
    assert (got["training.recompute_norms"].iloc[0],
            got["training.recompute_moe_act"].iloc[0]) == ("true", "true")
    assert got[["training.recompute_norms", "training.recompute_moe_act"]].iloc[1:].isna() \
        .all().all()
    given = pd.DataFrame([rows[0]], columns=["source", "citation", "model"]).assign(
        **{"training.recompute_norms": "false"})
    out = apply_recompute_rules(given).iloc[0]
    assert (out["training.recompute_norms"], out["training.recompute_moe_act"]) == \
        ("false", "true")                                       # given wins
