"""Megatron-Core's forced load balancing of the MoE router (training.moe_router_force_load_balancing):
random scores, so the busiest expert-parallel rank carries the mean load (no skew), by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from dse import catalog
from dse.calibration import train_fit
from dse.perf.imbalance import published_imbalance
from dse.perf.train_batch import TrainBatch
from dse.scoring.train_predict import predict_train_frame

ROW = {"case_id": "a", "model": "qwen3-235b-a22b", "hardware": "h100-sxm", "topology": "hgx-8",
       "num_chips": 64, "tp": 2, "pp": 1, "dp": 32, "ep": 32, "cp": 1, "global_batch_seqs": 256,
       "micro_batch_seqs": 1, "seq_len": 4096, "precision": "fp8", "recompute": "full",
       "zero_stage": 1}


def test_forced_balance_takes_the_skew_out_of_the_busiest_rank():
    """Learned routing: the busiest of 32 EP ranks carries published_imbalance(32, 128, cv) of
    the mean; forced: exactly the mean. The step falls by the expert work the skew added."""
    learned = predict_train_frame(pd.DataFrame([ROW]))
    forced = predict_train_frame(pd.DataFrame([{**ROW, "case_id": "b",
                                                "training.moe_router_force_load_balancing":
                                                "true"}]))
    cv = catalog.expert_load_cv()
    skew = float(published_imbalance(np.float64(32), np.float64(128), cv))
    assert cv > 0 and skew > 1.1                                     # a real skew at ep 32
    assert float(forced["step_time_s"][0]) < float(learned["step_time_s"][0])
    # at cv 0 the formula is 1: the same as the switch
    assert float(published_imbalance(np.float64(32), np.float64(128), 0.0)) == 1.0


def test_the_batch_switch_zeroes_the_cv():
    fields = {f.name: 1.0 for f in dataclasses.fields(TrainBatch) if f.name != "kernel"}
    fields.update(ep=np.array([8.0, 8.0]), experts=np.array([128.0, 128.0]),
                  moe_layers=np.array([48.0, 48.0]), expert_load_cv=np.array([0.3, 0.3]),
                  moe_router_force_load_balancing=np.array([0.0, 1.0]))
    b = TrainBatch(kernel={}, **fields)
    imb = b.ep_imbalance
    assert imb[1] == 1.0
    assert imb[0] == pytest.approx(float(published_imbalance(np.float64(8), np.float64(128), 0.3)))


def test_the_rule_follows_the_case_note():
    c = pd.DataFrame({"note": ["routing force-balanced (dropless)", "", None],
                      "training.moe_router_force_load_balancing": [None, None, "false"]})
    out = train_fit.apply_routing_rule(c)["training.moe_router_force_load_balancing"].tolist()
    assert out[0] == "true" and pd.isna(out[1]) and out[2] == "false"
