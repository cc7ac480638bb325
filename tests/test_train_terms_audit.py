"""Training-model gaps found by the issue-25 audit, hand-worked on the small designs of
test_train_physics (pure roofline): DualPipe's bubble and memory (DeepSeek-V3 Table 2), the
fitted per-layer overhead as its own part, ZeRO-2's per-micro-batch gradient reduce-scatter,
the layout rules, MXFP8's native support, and one-line refusals."""

from __future__ import annotations

import warnings

import pandas as pd
import pytest
from test_train_physics import batch

from dse.errors import InputError
from dse.perf.train_layout import layout_bits
from dse.perf.train_memory import state_bytes
from dse.perf.train_step import bubble_fraction_of_mb, micro_batch_parts, score_train

LAYER_PARAMS = 4 * 1024 ** 2 + 2 * 1024 + 2 * 1024 * 4096    # the small dense model's layer
EMBED = 32000 * 1024


# ------------------------------------------------------------------------ pipeline schedules

@pytest.mark.parametrize("p", [4, 8, 16])
def test_bubbles_agree_with_deepseek_v3_table_2(p):
    """Table 2 in chunk times, F = W = t / 3, B = 2 t / 3 (B the *full* backward), F&B = F + B:
    1F1B (PP - 1)(F + B), ZB1P (PP - 1)(F + B - 2W), DualPipe (PP/2 - 1)(F&B + B - 3W)."""
    t = 1.0
    f, b, w = t / 3, 2 * t / 3, t / 3
    table = {0: (p - 1) * (f + b), 2: (p - 1) * (f + b - 2 * w),
             3: (p / 2 - 1) * ((f + b) + b - 3 * w)}
    for schedule, bubble in table.items():
        got = float(bubble_fraction_of_mb(batch(pp=p, schedule=schedule)))
        assert got == pytest.approx(bubble, rel=1e-12), schedule
    # DualPipe pp = 8: 3 x 2/3 = 2 micro-batch times, not the third of it once modelled
    assert float(bubble_fraction_of_mb(batch(pp=8, schedule=3))) == pytest.approx(2.0)


def test_dualpipe_holds_two_stages_of_parameters():
    """Rank 0 of a DualPipe pp = 4 holds stage 0 and stage 3: 2 x 2 layers, the embedding and
    the output layer (Table 2: 2x parameters); 1F1B's first stage 2 layers and the embedding.
    Gradients and optimizer state follow the parameters."""
    one = state_bytes(batch(pp=4, global_batch_seqs=16))
    two = state_bytes(batch(pp=4, global_batch_seqs=16, schedule=3))
    assert float(one["params_per_chip"]) == pytest.approx(2 * LAYER_PARAMS + EMBED, rel=1e-12)
    assert float(two["params_per_chip"]) == pytest.approx(4 * LAYER_PARAMS + 2 * EMBED,
                                                          rel=1e-12)
    for k in ("weights_bytes", "grads_bytes", "optimizer_bytes"):
        assert float(two[k] / one[k]) == pytest.approx(2.0, rel=1e-12), k


# -------------------------------------------------------------------------- fixed overhead

def test_layer_overhead_is_its_own_part_and_never_the_bound():
    """8 layers x 4 micro-batches x 1 ms = 32 ms in overhead_s, none in memory_s; a step that
    is mostly overhead is not 'memory'-bound."""
    b = batch(global_batch_seqs=4)
    s0, s1 = score_train(b), score_train(b.replace(layer_overhead_s=1e-3))
    assert float(s1["overhead_s"]) == pytest.approx(32e-3, rel=1e-12)
    assert float(s1["memory_s"]) == pytest.approx(float(s0["memory_s"]), rel=1e-12)
    assert float(s1["step_time_s"] - s0["step_time_s"]) == pytest.approx(32e-3, rel=1e-9)
    assert float(micro_batch_parts(b.replace(layer_overhead_s=1e-3))["overhead_s"]) \
        == pytest.approx(8e-3, rel=1e-12)
    # 32 sequences: compute 59.1 ms > HBM-bound work 54.7 ms; 256 ms of overhead leaves it so
    c = batch(global_batch_seqs=32)
    huge = score_train(c.replace(layer_overhead_s=1e-3))
    assert float(huge["overhead_s"]) == pytest.approx(0.256, rel=1e-12)
    assert float(huge["overhead_s"]) > 2 * float(huge["compute_s"] + huge["memory_s"])
    assert int(huge["bound"]) == int(score_train(c)["bound"]) == 0      # compute


# --------------------------------------------------------------------------------- ZeRO-2

def test_zero2_reduce_scatters_every_micro_batch_and_gathers_once():
    """ZeRO 2, dp = cp = 2, pp = 2, 4 micro-batches, nothing hidden: a gradient reduce-scatter
    (half a ring all-reduce over the 4 ranks) in each micro-batch (the bubble's too) and the
    parameter all-gather (the other half) once::

        step = 4 (t_mb + rs) + (p - 1)(t_mb + rs) + ag + optimizer
    """
    b = batch(dp=2, cp=2, pp=2, global_batch_seqs=8, zero_stage=2, overlap_fraction=0.0,
              hbm_fraction=0.8)
    n = float(state_bytes(b)["params_per_chip"])
    parts = micro_batch_parts(b)
    t_mb = float(parts["compute_s"] + parts["memory_s"] + parts["overhead_s"]
                 + parts["network_exposed_s"])
    ar = 2 * 3 / 4 * 2 * n / 400e9            # ring all-reduce of bf16 gradients, 4 ranks
    opt = 30 * n / 4 / (2e12 * 0.8)
    s = score_train(b)
    assert float(s["step_time_s"]) == pytest.approx(5 * (t_mb + ar / 2) + ar / 2 + opt,
                                                    rel=1e-12)
    # the same bytes moved as ZeRO 1's one all-reduce, but 4 reduce-scatters instead of one
    s1 = score_train(b.replace(zero_stage=1))
    assert float(s["network_total_s"] - s1["network_total_s"]) == pytest.approx(
        4 * ar / 2 + ar / 2 - ar, rel=1e-9)


# --------------------------------------------------------------------------------- layouts

@pytest.mark.parametrize("over,bit", [
    ({"tp": 3}, 1), ({"pp": 9}, 4), ({"cp": 2, "seq_len": 2050}, 2048),
    ({"pp": 2, "vp": 2, "schedule": 0}, 4096),
    ({"pp": 4, "vp": 3, "schedule": 1}, 16384),          # 12 chunks of 8 layers
    ({"pp": 3, "schedule": 3, "global_batch_seqs": 12}, 32768),     # odd pp
    ({"pp": 4, "schedule": 3, "global_batch_seqs": 6}, 32768),      # 6 < 2 pp
    ({"pp": 4, "schedule": 3, "global_batch_seqs": 9}, 32768),      # odd micro-batches
])
def test_layout_rules(over, bit):
    assert int(layout_bits(batch(**over))) == bit
    s = score_train(batch(**over))
    assert not bool(s["feasible"]) and int(s["reason"]) == 3


@pytest.mark.parametrize("over", [{"pp": 4, "vp": 2, "schedule": 1},
                                  {"pp": 8, "vp": 1, "schedule": 0},
                                  {"pp": 4, "schedule": 3, "global_batch_seqs": 8},
                                  {"cp": 2, "seq_len": 2048}])
def test_valid_layouts_have_no_bits(over):
    assert int(layout_bits(batch(**over))) == 0
    assert bool(score_train(batch(**over))["feasible"])


# ------------------------------------------------------------------------------ precisions

def test_mxfp8_is_native_only_with_block_scaled_mma():
    """MXFP8 needs the tensor cores' block-scaled MMA: Blackwell (an fp4 peak in the catalog),
    not Hopper; fp8_block (scales applied between WGMMAs) runs wherever fp8 does."""
    from dse.catalog import training as tcat
    from dse.perf.train_batch import OPERAND_BYTES, PRECISIONS
    from dse.scoring.train_predict import design_numbers

    def native(acc, prec):
        m = tcat.lookup("models", "llama-3.1-8b")
        a, _ = tcat.lookup("accelerators", acc)
        topo = tcat.lookup("topologies", a.default_topology)
        return design_numbers(m, a, topo, prec, {})["precision_native"]

    assert native("h100-sxm", "mxfp8") == 0.0 and native("h100-sxm", "fp8_block") == 1.0
    assert native("b200", "mxfp8") == 1.0 and native("b200", "fp8_block") == 1.0
    assert native("h100-sxm", "nvfp4") == 0.0 and native("b200", "nvfp4") == 1.0
    ob = dict(zip(PRECISIONS, OPERAND_BYTES))
    assert ob["mxfp8"] == 1 + 1 / 32 and ob["fp8_block"] == 1 + 4 / 128
    assert ob["nvfp4"] == 0.5 + 1 / 16


def test_mxfp8_on_hopper_is_an_infeasible_row():
    from dse.api import predict_train
    row = {"case_id": "mx", "model": "llama-3.1-8b", "hardware": "h100-sxm", "num_chips": 8,
           "global_batch_seqs": 64, "seq_len": 4096, "precision": "mxfp8"}
    p = predict_train(pd.DataFrame([row, {**row, "case_id": "b", "hardware": "b200"}]))
    assert not p.iloc[0].feasible and "no native support" in p.iloc[0].reason
    assert p.iloc[1].feasible


# ---------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("col,value", [("num_chips", "inf"), ("seq_len", "-inf"),
                                       ("mtp_layers", "inf"), ("tp", "nan")])
def test_infinite_counts_are_refused_without_a_warning(col, value):
    from dse.scoring.train_cases import parse
    df = pd.DataFrame([{"case_id": "a", "model": "llama-3.1-8b", "hardware": "h100-sxm",
                        "num_chips": "8", "global_batch_seqs": "64", "seq_len": "4096",
                        "precision": "bf16", col: value}])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InputError, match=col):
            parse(df, "cases.csv")


def test_training_report_labels_are_training_metrics():
    from dse.spec.fields import label
    assert label("num_chips") == "chips per instance [chips]"      # serving's
    assert label("num_chips", task="train") == "chips [chips]"
    assert label("overhead_s", task="train").endswith("[s]")
