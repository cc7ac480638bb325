"""The attention kernel a training job runs (``training.attention_kernel``): each kernel's forward
and backward rate relative to the kernel the attention fits price, read off published benchmarks
(dse/catalog/training.toml [attention_kernels]): FlashAttention-3 (arXiv:2407.08608) on H100,
FlashAttention-2 (arXiv:2307.08691) section 4.1 on A100; and the calibration rule that sets it
on the MPT rows (dse.calibration.train_fit.ATTENTION_RULES)."""

from __future__ import annotations

import pandas as pd
import pytest
from test_train_physics import DENSE, batch

from dse.calibration.train_fit import KERNEL_COLUMN, apply_attention_rules
from dse.catalog import training as tcat
from dse.errors import InputError
from dse.perf.train_step import score_train
from dse.scoring.train_predict import predict_train_frame
from dse.spec import train_fields

# FlashAttention-3 figures, H100 SXM5, head dim 128, 16k tokens, no causal mask (forward,
# backward TFLOP/s); FlashAttention-2 section 4.1: FA2 1.3-1.5x Triton's forward, ~2x backward
H100 = {"flash2": (370.0, 322.0), "cudnn": (595.0, 516.0), "flash3": (648.0, 561.0)}
TRITON_OVER_FLASH2 = (1.0 / 1.4, 1.0 / 2.0)


def test_hopper_rates_are_the_figure_bars_over_cudnn():
    for k in ("flash2", "flash3"):
        fwd, bwd = tcat.attention_rates("h100-sxm", k)
        assert fwd == pytest.approx(H100[k][0] / H100["cudnn"][0], rel=1e-3)
        assert bwd == pytest.approx(H100[k][1] / H100["cudnn"][1], rel=1e-3)
    fwd, bwd = tcat.attention_rates("h100-sxm", "triton")
    assert fwd == pytest.approx(370 / 595 / 1.4, rel=1e-3)        # 0.444
    assert bwd == pytest.approx(322 / 516 / 2.0, rel=1e-3)        # 0.312


def test_ampere_triton_is_flash2_over_the_paper_ratios_and_variants_use_their_base():
    assert tcat.attention_rates("a100-sxm-80g", "flash2") == (1.0, 1.0)
    for part in ("a100-sxm-80g", "a100-sxm-40g"):        # the 40 GB part: kernel_base 80 GB
        assert tcat.attention_rates(part, "triton") == pytest.approx(TRITON_OVER_FLASH2, rel=1e-3)
    assert tcat.attention_rates("h100-hbm2e-96g", "flash2") == tcat.attention_rates(
        "h100-sxm", "flash2")


def test_the_default_runs_everywhere_and_an_unpublished_pair_is_refused():
    assert tcat.attention_rates("b200", "cudnn") == (1.0, 1.0)
    with pytest.raises(InputError, match="flash3"):
        tcat.attention_rates("a100-sxm-80g", "flash3")       # FlashAttention-3 needs Hopper
    with pytest.raises(InputError, match="b200"):
        tcat.attention_rates("b200", "triton")
    assert train_fields.ATTENTION_KERNELS == tcat.ATTENTION_KERNELS
    assert train_fields.REGISTRY["training.attention_kernel"].default == "cudnn"


def test_a_slower_kernel_adds_its_forward_and_backward_time_by_hand():
    # the dense test model at roofline (1 PFLOP/s), 8 layers, one sequence of 65,536 tokens:
    # causal forward 2 * 16 heads * (64 + 64) * 65536 * 65537 / 2 = 8.796e12 FLOPs = 8.796 ms
    # a layer; at rates (0.5, 0.25) with the backward at 2 forwards, each layer adds
    # fwd (1/0.5 - 1) + 2 fwd (1/0.25 - 1) = 7 fwd
    long = {"seq_len": 65536, "global_batch_seqs": 1, "attention_bwd_ratio": 2.0}
    base = score_train(batch(DENSE, **long))["compute_s"]
    slow = score_train(batch(DENSE, attention_fwd_rate=0.5, attention_bwd_rate=0.25,
                             **long))["compute_s"]
    fwd_s = 2 * 16 * 128 * 65536 * 65537 / 2 / 1e15
    assert float(slow - base) == pytest.approx(8 * 7 * fwd_s, rel=0.01)
    assert float(slow - base) == pytest.approx(0.4926, rel=0.01)
    # forward rate alone: 8 * (1/0.5 - 1) fwd; backward rate alone: 8 * 2 * (1/0.25 - 1) fwd
    f_only = score_train(batch(DENSE, attention_fwd_rate=0.5, **long))["compute_s"]
    b_only = score_train(batch(DENSE, attention_bwd_rate=0.25, **long))["compute_s"]
    assert float(f_only - base) == pytest.approx(8 * 1 * fwd_s, rel=0.01)
    assert float(b_only - base) == pytest.approx(8 * 6 * fwd_s, rel=0.01)


def test_the_case_column_sets_the_kernel_per_row():
    row = {"case_id": "a", "model": "llama-3.1-8b", "hardware": "h100-sxm", "num_chips": 8,
           "tp": 1, "pp": 1, "dp": 8, "cp": 1, "global_batch_seqs": 8, "micro_batch_seqs": 1,
           "seq_len": 16384, "precision": "bf16", "recompute": "none", "zero_stage": 1}
    cases = pd.DataFrame([row, {**row, "case_id": "b", KERNEL_COLUMN: "flash2"},
                          {**row, "case_id": "c", KERNEL_COLUMN: "cudnn"}])
    p = predict_train_frame(cases).set_index("case_id")["step_time_s"]
    assert p["c"] == pytest.approx(p["a"], rel=1e-9)
    assert p["b"] > p["a"] * 1.05
    bad = cases.assign(**{KERNEL_COLUMN: "flash9"})
    with pytest.raises(InputError, match="training.attention_kernel"):
        predict_train_frame(bad)


def test_the_mpt_rule_follows_each_sweep():
    cite = ("mosaicml/llm-foundry scripts/train/benchmarking/README.md @ commit 8c8dd48f7, "
            "section \"{}\"")
    large = cite.format("H100 80GB BF16 (Large Scale, >= 128 GPUs)")
    rows = [("MPT", large, "mpt-70b"), ("MPT", large, "mpt-30b"), ("MPT", large, "mpt-1b"),
            ("MPT", cite.format("H100 80GB BF16"), "mpt-7b"),
            ("MPT", cite.format("A100 40GB with 1600 Gbps node-node interconnect (RoCE)"),
             "mpt-13b"), ("NEMO2407", "NeMo", "llama-2-7b")]
    df = pd.DataFrame(rows, columns=["source", "citation", "model"])
    got = apply_attention_rules(df)[KERNEL_COLUMN].tolist()
    assert got[:5] == ["flash2", "triton", "flash2", "triton", "triton"]
    assert pd.isna(got[5])
    given = df.assign(**{KERNEL_COLUMN: ["cudnn"] + [None] * 5})
    assert apply_attention_rules(given)[KERNEL_COLUMN].iloc[0] == "cudnn"     # given wins


def test_unfused_core_attention_by_hand():
    # Megatron's pre-FlashAttention core attention on the dense test model at roofline (1 PFLOP/s,
    # 2 TB/s), one sequence of 2048 tokens, 16 heads of 64: 16 * 2048 = 32,768 score rows of 2048
    # scores (67.1 M scores, no causal skipping). Each batched GEMM: 2 * 32768 * 2048 * 64 =
    # 8.59e9 FLOPs = 8.59 us; softmax + dropout stream 9 bytes a score forward (302 us at 2 TB/s),
    # 11 backward (369 us); forward 2 GEMMs, backward 4
    from dse.perf.train_time import attention_core_s, unfused_attention_s
    b = batch(DENSE, attention_unfused=1.0, global_batch_seqs=1)
    gemm = 2 * 32768 * 2048 * 64 / 1e15
    stream = 32768 * 2048 / 2e12
    fwd, bwd = unfused_attention_s(b)
    assert float(fwd) == pytest.approx(2 * gemm + 9 * stream, rel=1e-6)
    assert float(bwd) == pytest.approx(4 * gemm + 11 * stream, rel=1e-6)
    assert float(fwd) == pytest.approx(3.191e-4, rel=1e-3)
    assert float(bwd) == pytest.approx(4.034e-4, rel=1e-3)
    # the step takes them instead of the fused kernel's (8 layers), and selective recompute
    # reruns the unfused forward
    core = float(attention_core_s(b))
    flash = score_train(batch(DENSE, global_batch_seqs=1))["compute_s"]
    unfused = score_train(b)["compute_s"]
    assert float(unfused - flash) == pytest.approx(8 * (fwd + bwd - core * (1 + 2.0)), rel=1e-3)
    sel = score_train(batch(DENSE, attention_unfused=1.0, recompute=1,
                            global_batch_seqs=1))["compute_s"]
    assert float(sel - unfused) == pytest.approx(8 * float(fwd), rel=1e-3)


def test_unfused_attention_splits_its_work_over_context_parallel_ranks():
    # cp 2: each chip's 1,024 queries meet all 2,048 keys, so every term of the by-hand test
    # above halves: 16 * 1024 score rows of 2048 scores, GEMMs of n (or k) = 2048, not 1024
    from dse.perf.train_time import unfused_attention_s
    gemm = 2 * 16384 * 2048 * 64 / 1e15
    stream = 16384 * 2048 / 2e12
    fwd, bwd = unfused_attention_s(batch(DENSE, attention_unfused=1.0, global_batch_seqs=1,
                                         cp=2))
    assert float(fwd) == pytest.approx(2 * gemm + 9 * stream, rel=1e-6)
    assert float(bwd) == pytest.approx(4 * gemm + 11 * stream, rel=1e-6)


def test_megatron_rows_run_unfused_attention():
    df = pd.DataFrame([("KORTHI", "Korthikanti et al. 2022", "megatron-22b"),
                       ("MEGATRON-2021", "NVIDIA/Megatron-LM README.md", "gpt3-175b")],
                      columns=["source", "citation", "model"])
    assert apply_attention_rules(df)[KERNEL_COLUMN].tolist() == ["unfused", "unfused"]
    assert tcat.attention_rates("a100-sxm-80g", "unfused") == (1.0, 1.0)


def test_unfused_attention_keeps_the_score_matrix_in_memory():
    # Korthikanti et al.'s 5 a s bytes per token and layer (scores, softmax, dropout mask) come
    # back with the unfused kernel: the dense test model, 8 layers, 16 heads, 2048 tokens, no
    # recompute, tp 1: 5 * 16 * 2048 * 2048 tokens * 8 layers = 2.68 GB more
    base = score_train(batch(DENSE, global_batch_seqs=1))["memory_per_chip_bytes"]
    unf = score_train(batch(DENSE, global_batch_seqs=1,
                            attention_unfused=1.0))["memory_per_chip_bytes"]
    assert float(unf - base) == pytest.approx(5 * 16 * 2048 * 2048 * 8, rel=0.01)
