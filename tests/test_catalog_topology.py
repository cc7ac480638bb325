"""The catalog has the contract's ids with sources; topologies reduce to the right numbers."""

from __future__ import annotations

import re

import pytest
from helpers import ROOT

from dse import catalog
from dse.catalog.topology import build_graph, reduce, torus_dims

CONTRACT = ROOT / "docs" / "predict-format.md"      # the case format, with its catalog ids
TRAIN_CONTRACT = ROOT / "docs" / "train-format.md"  # the training cases' format and their ids
ACCELERATORS = ["a100-sxm-80g", "h100-sxm", "h100-pcie", "h200-sxm", "h800-sxm", "gh200", "b200",
                "b300", "gb200", "gb300", "mi300x", "mi325x", "mi355x", "l40s", "rtx-pro-6000",
                "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-v7", "trn2", "gaudi3"]
TOPOLOGIES = ["hgx-8", "nvl72", "pcie-8", "mi-8", "tpu-torus-3d", "tpu-torus-2d", "trn2-ultraserver"]
MODELS = ["llama-2-70b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "llama-4-scout",
          "llama-4-maverick", "mixtral-8x7b", "mixtral-8x22b", "deepseek-v3", "qwen3-30b-a3b",
          "qwen3-235b-a22b", "gpt-oss-120b", "kimi-k2", "palm-540b"]
# the training contract's new ids: one catalog serves and trains them (docs/train-format.md)
TRAIN_ACCELERATORS = ["a100-sxm-40g", "h100-hbm2e-96g"]
TRAIN_MODELS = ["llama-2-7b", "llama-2-13b", "gpt3-175b", "gpt3-5b", "gpt3-20b", "nemotron-4-340b",
                "mpt-1b", "mpt-3b", "mpt-7b", "mpt-13b", "mpt-30b", "mpt-70b", "megatron-22b",
                "mt-nlg-530b", "megatron-1t", "gpt-oss-20b"]


def test_exactly_the_contract_ids():
    assert sorted(catalog.accelerators()) == sorted(ACCELERATORS + TRAIN_ACCELERATORS)
    assert sorted(catalog.topologies()) == sorted(TOPOLOGIES)
    assert sorted(catalog.models()) == sorted(MODELS + TRAIN_MODELS)


def test_the_contract_file_lists_the_same_ids():
    text = CONTRACT.read_text()
    for i in ACCELERATORS + TOPOLOGIES + MODELS:
        assert f"`{i}`" in text, i
    text = TRAIN_CONTRACT.read_text()
    for i in TRAIN_ACCELERATORS + TRAIN_MODELS:
        assert f"`{i}`" in text, i


def test_a_variant_part_reads_its_base_parts_kernel_fits():
    from dse.build import tables
    from dse.catalog import training
    T = tables.tables()
    for v in TRAIN_ACCELERATORS:
        base = catalog.accelerators()[v].kernel_base
        assert base in ACCELERATORS and catalog.kernel_chip(v) == base
        assert training.train_accelerators()[v][1] == base
        i, j = T.index["accelerator"][v], T.index["accelerator"][base]
        assert (T.kernel[i] == T.kernel[j]).all()
        # its own roofline numbers: not the base's
        assert catalog.accelerators()[v].hbm_bw_bytes_per_s < \
            catalog.accelerators()[base].hbm_bw_bytes_per_s
    with pytest.raises(KeyError):
        catalog.kernel_chip("nope")


def test_every_entry_carries_its_source():
    for kind in catalog.KINDS:
        for k, e in catalog.table(kind).items():
            assert re.match(r"https?://", e.source_url), (kind, k)
    for k, a in catalog.accelerators().items():
        assert re.match(r"https?://", a.price.source_url), k
        assert a.efficiency.fitted_on, k


def test_accelerator_numbers_are_plausible():
    for k, a in catalog.accelerators().items():
        ratio = a.peak_flops_per_s.bf16 / a.hbm_bw_bytes_per_s   # FLOP per byte, ~150-600
        assert 100 < ratio < 700, (k, ratio)
        assert a.scaleout_link_bw_bytes_per_s <= a.scaleup_link_bw_bytes_per_s, k
        if a.peak_flops_per_s.fp8:
            assert a.peak_flops_per_s.fp8 >= a.peak_flops_per_s.bf16, k


def test_every_accelerator_says_what_its_parameters_were_fitted_on():
    # the end-to-end remainder (efficiency.toml) and every kernel parameter set per runtime
    for k, acc in catalog.accelerators().items():
        assert "calibration" in acc.efficiency.fitted_on
        for rt in ("trtllm", "sglang", "vllm"):
            fitted = catalog.kernel_params()[(k, rt)]["fitted_on"]
            # (+ "architecture": parameters derived from the chip's architecture, TPUs)
            assert {"gemm", "moe", "attention", "comm"} <= set(fitted) \
                <= {"gemm", "moe", "attention", "comm", "architecture"}, (k, rt)
            assert all(fitted.values()), (k, rt)


def test_switched_domain_gives_every_group_full_bandwidth():
    r = reduce(catalog.topologies()["nvl72"], 72, 72)
    assert (r.ar_fraction == 1.0).all() and (r.a2a_fraction == 1.0).all()
    assert r.at([72], "hops")[0] == 2.0     # GPU -> NVSwitch -> GPU


def test_full_mesh_pair_sees_one_link():
    r = reduce(catalog.topologies()["mi-8"], 8, 8)
    assert r.at([2], "ar_fraction")[0] == pytest.approx(1 / 7)
    assert r.at([8], "ar_fraction")[0] == pytest.approx(1.0)


def test_pcie_tree_halves_alltoall_across_switches():
    r = reduce(catalog.topologies()["pcie-8"], 8, 8)
    assert r.at([4], "a2a_fraction")[0] == pytest.approx(1.0)
    assert r.at([8], "a2a_fraction")[0] == pytest.approx(0.5)


def test_torus_alltoall_is_bisection_limited():
    topo = catalog.topologies()["tpu-torus-2d"]
    r = reduce(topo, 256, 256)
    # a 16x16 torus with wraparound: bisection = 2 x 16 links of 1/4 injection each;
    # uniform all-to-all gets 4 * bisection / N = 4 * 8 / 256 = 1/8 of injection
    assert r.at([256], "a2a_fraction")[0] == pytest.approx(1 / 8)
    assert r.at([256], "ar_fraction")[0] == pytest.approx(1.0)
    assert torus_dims(8960, 3) == (16, 20, 28)
    g = build_graph(topo, 256)
    assert all(d == 4 for n, d in g.degree() if n[0] == "chip")


def test_one_catalog_serves_training_models_and_trains_serving_models():
    import math

    import dse
    served = dse.evaluate({"accelerator.id": "a100-sxm-40g", "model.id": "mpt-30b",
                           "layout.tp": 8, "workload.isl": 1024, "workload.osl": 128,
                           "workload.concurrency": 16})
    assert math.isfinite(served.metrics["tpot_s"]) and served.metrics["tpot_s"] > 0
    # the 40 GB part reads its weights and KV over slower HBM (1,555 vs 2,039 GB/s): never faster
    base = dse.evaluate({"accelerator.id": "a100-sxm-80g", "model.id": "mpt-30b",
                         "layout.tp": 8, "workload.isl": 1024, "workload.osl": 128,
                         "workload.concurrency": 16})
    assert served.metrics["tpot_s"] >= base.metrics["tpot_s"]
    trained = dse.evaluate({"training": {"global_batch_seqs": 256, "seq_len": 4096},
                            "model.id": "mixtral-8x7b", "accelerator.id": "h100-hbm2e-96g",
                            "layout.tp": 2, "layout.pp": 1, "layout.dp": 32, "layout.ep": 8},
                           task="train")
    assert trained.metrics["step_time_s"] > 0
