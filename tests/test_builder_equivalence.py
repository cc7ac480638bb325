"""The builder on integer-coded catalog tables gives the same numbers as the builder it replaced.

tests/legacy_build.py and tests/legacy_space.py are frozen copies of dse/build/designs.py and
dse/build/space.py before issue 10 item 7. Mixed designs (every accelerator and model, MoE and MLA
among them, every weight dtype, KV dtypes, fp8 scalings, runtimes, topologies, layouts, serving
modes, cost modes, overrides of catalog, derived and kernel fields, and the serving mechanisms'
fields of issue 11: per-op dtypes, expert imbalance, lengths, KV tier) must resolve to the same
table, build the same Batch and score the same metrics, bit for bit; so must every shipped
space's designs built through ``Space.batch`` (scale factors, what-if overrides included).
"""

from __future__ import annotations

import glob
import sys

import numpy as np
import pandas as pd
import pytest
from helpers import ROOT

sys.path.insert(0, str(ROOT / "tests"))

import legacy_build  # noqa: E402
import legacy_space  # noqa: E402

from dse import catalog  # noqa: E402
from dse.build import designs as build
from dse.build import tables
from dse.build.space import load_space  # noqa: E402
from dse.catalog.specs import DTYPES  # noqa: E402
from dse.perf import score  # noqa: E402

N = 3000


def mixed_designs(n: int = N, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    accs, models = list(catalog.accelerators()), list(catalog.models())
    moe = np.array([catalog.models()[m].num_experts > 0 for m in models])
    model = rng.choice(models, n)
    tp = rng.choice([1, 2, 4, 8], n)
    dp = rng.choice([1, 2, 4], n)
    is_moe = moe[[models.index(m) for m in model]]
    ep = np.where(is_moe & (rng.random(n) < 0.5), tp * dp, 1)
    nan = lambda p, v: np.where(rng.random(n) < p, v, np.nan)  # noqa: E731
    d = pd.DataFrame({
        "accelerator.id": rng.choice(accs, n), "model.id": model,
        "topology.id": rng.choice(["", "", "hgx-8", "nvl72", "pcie-8", "mi-8", "tpu-torus-3d",
                                   "tpu-torus-2d", "trn2-ultraserver"], n),
        "model.weight_dtype": rng.choice(list(DTYPES), n),
        "model.kv_dtype": rng.choice(["", "", "fp8", "bf16", "fp16"], n),
        "model.fp8_scaling": rng.choice(["auto", "tensor", "block"], n),
        "serving.runtime": rng.choice(["trtllm", "sglang", "vllm"], n),
        "serving.ep_overlap": rng.choice(["none", "tbo"], n),
        "serving.a2a_kernel": rng.choice(["auto", "low_latency", "normal"], n),
        "layout.dense_mlp": rng.choice(["auto", "split", "replicated"], n),
        "workload.phase": rng.choice(["both", "both", "prefill", "decode"], n),
        "cost.mode": rng.choice(["ownership", "rental"], n),
        "cost.capex_model": rng.choice(["catalog", "components"], n),
        "layout.tp": tp, "layout.dp": dp, "layout.ep": ep, "layout.pp": rng.choice([1, 2], n),
        "workload.isl": rng.choice([128, 1024, 8192], n),
        "workload.osl": rng.choice([64, 512], n),
        "workload.concurrency": rng.integers(1, 1024, n),
        # overrides, blank (NaN) on most rows: a catalog field, a dtype the chip may lack,
        # derived system fields and a fitted kernel parameter
        "accelerator.hbm_bw_bytes_per_s": nan(0.3, rng.uniform(1e12, 1e13, n)),
        "accelerator.peak_flops_per_s.fp8": nan(0.1, rng.uniform(5e14, 5e15, n)),
        "accelerator.scaleup_link_bw_bytes_per_s": nan(0.2, rng.uniform(1e11, 2e12, n)),
        "topology.scaleup.domain_chips": nan(0.2, rng.choice([8, 16, 32, 64], n)),
        "topology.scaleup.link_bw_bytes_per_s": nan(0.1, rng.uniform(1e11, 2e12, n)),
        "accelerator.kernel.gemm_bf16_fraction": nan(0.2, rng.uniform(0.3, 0.9, n)),
        "accelerator.kernel.ar_nccl_fraction": nan(0.2, rng.uniform(0.3, 0.9, n)),
        # serving mechanisms (issue 11): per-op precision, expert imbalance and redundant
        # experts, length distributions, a KV offload tier and a shared prefix
        "model.expert_dtype": rng.choice(["", "", "fp4", "fp8", "bf16"], n),
        "model.attention_dtype": rng.choice(["", "", "fp8", "bf16"], n),
        "serving.expert_imbalance": nan(0.3, rng.uniform(1.0, 1.5, n)),
        "serving.redundant_experts": nan(0.2, rng.choice([0, 8, 32], n)),
        "workload.isl_cv": nan(0.2, rng.uniform(0.0, 1.0, n)),
        "serving.kv_offload": rng.choice(["none", "none", "host"], n),
        "workload.prefix_tokens": nan(0.2, rng.choice([0, 64, 512], n)),
    })
    return d


def assert_batches_equal(new, old):
    assert set(new.columns) == set(old.columns)
    n, o = new.expanded(), old.expanded()
    assert len(n) == len(o)
    for k in o.columns:
        np.testing.assert_array_equal(n.columns[k], o.columns[k], err_msg=k)


def assert_scores_equal(new, old):
    s_new, s_old = score(new), score(old)
    for m, v in s_old.items():
        a = np.asarray(s_new[m])
        if a.dtype.kind == "f":
            np.testing.assert_allclose(a, v, rtol=1e-12, atol=0, equal_nan=True, err_msg=m)
        else:
            np.testing.assert_array_equal(a, v, err_msg=m)


@pytest.fixture(scope="module")
def designs():
    return mixed_designs()


def test_mixed_designs_cover_what_they_claim(designs):
    m = catalog.models()
    kinds = {("moe" if m[i].num_experts else "dense") + ("-mla" if m[i].kv_lora_rank else "")
             for i in designs["model.id"]}
    assert kinds == {"dense", "moe", "moe-mla"}
    assert set(designs["accelerator.id"]) == set(catalog.accelerators())
    assert set(designs["model.weight_dtype"]) == set(DTYPES)


def test_resolve_gives_the_same_table(designs):
    new, old = build.resolve(designs), legacy_build.resolve(designs)
    pd.testing.assert_frame_equal(new, old, check_exact=True)


def test_to_batch_and_score_are_bit_identical(designs):
    table = legacy_build.resolve(designs)
    new, old = build.to_batch(build.resolve(designs)), legacy_build.to_batch(table)
    assert_batches_equal(new, old)
    assert_scores_equal(new, old)


SPACES = sorted(glob.glob(str(ROOT / "spaces" / "*.toml")) +
                glob.glob(str(ROOT / "spaces" / "questions" / "*.toml")))


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.split("spaces/")[-1])
def test_space_batches_are_bit_identical(path):
    new, old = load_space(path), legacy_space.load_space(path)
    rng = np.random.default_rng(1)
    idx = np.sort(rng.choice(new.size, min(new.size, 2000), replace=False))
    b_new, _ = new.batch(idx)
    b_old, _ = old.batch(idx)
    assert_batches_equal(b_new, b_old)
    assert_scores_equal(b_new.expanded(), b_old.expanded())
    # what-if re-scoring: an override of a catalog field and of a system feeder
    over = {"accelerator.hbm_bw_bytes_per_s": ("scale", 1.5),
            "accelerator.scaleup_link_bw_bytes_per_s": ("set", 9e11)}
    w_new, _ = new.batch_from_values(new.values_at(idx[:300]), over)
    w_old, _ = old.batch_from_values(old.values_at(idx[:300]), over)
    assert_batches_equal(w_new, w_old)


SWEEP = """
name = "sweep"
[accelerator]
id = "b200"
[topology]
id = "nvl72"
[model]
id = "deepseek-v3"
weight_dtype = "fp4"
[layout]
dp = 8
ep = 8
[cost]
capex_model = "components"
[parameters]
"accelerator.id" = ["b200", "h200-sxm", "mi300x"]
"serving.runtime" = ["sglang", "trtllm"]
"accelerator.peak_flops_per_s.fp4" = { scale = [0.5, 1.0, 2.0] }
"accelerator.hbm_bw_bytes_per_s" = { scale = [0.5, 1.3, 2.0] }
"accelerator.scaleup_link_bw_bytes_per_s" = { scale = [0.5, 2.0] }
"topology.scaleup.domain_chips" = [8, 16, 72]
"accelerator.kernel.moe_fp4_fraction" = { scale = [0.8, 1.0] }
"model.expert_dtype" = ["", "fp8"]
"layout.tp" = [1, 2, 8]
"workload.concurrency" = [16, 256, 4096]
[objectives]
usd_per_mtok_output = "minimize"
"""


def test_hypothetical_chip_sweep_is_bit_identical(tmp_path):
    f = tmp_path / "sweep.toml"
    f.write_text(SWEEP)
    new, old = load_space(str(f)), legacy_space.load_space(str(f))
    idx = np.arange(new.size)
    b_new, _ = new.batch(idx)
    b_old, _ = old.batch(idx)
    assert_batches_equal(b_new, b_old)
    assert_scores_equal(b_new.expanded(), b_old.expanded())


def test_tables_follow_a_reloaded_catalog():
    t = tables.tables()
    assert tables.tables() is t                     # built once per process
    acc = catalog.accelerators()
    a = t.ids["accelerator"].index("h100-sxm")
    assert t.columns["accelerator.hbm_bw_bytes_per_s"][a] == acc["h100-sxm"].hbm_bw_bytes_per_s
    assert np.isnan(t.columns["accelerator.peak_flops_per_s.fp4"][a])   # the H100 has no FP4
    r = t.runtimes.index("sglang")
    k = t.kernel_keys.index("gemm_bf16_fraction")
    assert t.kernel[a, r, k] == catalog.kernel_params()[("h100-sxm", "sglang")]["gemm_bf16_fraction"]
    catalog.accelerators.cache_clear()                      # what dse.calibration.fit does after a write
    try:
        assert tables.tables() is not t
    finally:
        catalog.accelerators.cache_clear()


BIG_GRID = """
name = "big-grid"
[accelerator]
id = "h100-sxm"
[model]
id = "llama-3.1-8b"
[parameters]
"accelerator.id" = ["a100-sxm-80g", "h100-sxm", "h200-sxm", "b200", "mi300x", "tpu-v6e", "l40s"]
"model.weight_dtype" = ["bf16", "fp8", "fp4", "int8", "int4", "fp16"]
"model.kv_dtype" = ["", "fp8", "bf16"]
"model.fp8_scaling" = ["auto", "tensor", "block"]
"serving.runtime" = ["trtllm", "sglang", "vllm"]
"serving.ep_overlap" = ["none", "tbo"]
"cost.mode" = ["ownership", "rental"]
"layout.tp" = [1, 2]
[objectives]
usd_per_mtok_output = "minimize"
"""


def test_grid_beyond_full_resolution_is_bit_identical(tmp_path):
    # more structural combinations than FULL_RESOLVE: resolved per call and cached by row
    from dse.build.space import FULL_RESOLVE
    f = tmp_path / "big.toml"
    f.write_text(BIG_GRID)
    new, old = load_space(str(f)), legacy_space.load_space(str(f))
    assert new.size // 2 > FULL_RESOLVE
    rng = np.random.default_rng(2)
    for _ in range(3):      # overlapping calls: rows cached by earlier calls mix with new ones
        idx = np.sort(rng.choice(new.size, 700, replace=False))
        b_new, _ = new.batch(idx)
        b_old, _ = old.batch(idx)
        assert_batches_equal(b_new, b_old)


def test_float32_build_is_the_float64_build_converted(designs):
    """The builder's float32 batches (what the search scores) are the float64 ones rounded
    once, column for column, and score the same as the float64 batch converted chunk by chunk;
    so are a space's parts (``Space.batch_parts(dtype=np.float32)``)."""
    from dse.perf import score_chunked
    table = build.resolve(designs)
    b64, b32 = build.to_batch(table), build.to_batch(table, dtype=np.float32)
    assert {v.dtype for v in b32.columns.values()} == {np.dtype(np.float32)}
    assert_batches_equal(b32, b64.astype(np.float32))
    s32, s64 = score_chunked(b32, 1000, np.float32), score_chunked(b64, 1000, np.float32)
    for m, v in s64.items():
        np.testing.assert_array_equal(s32[m], v, err_msg=m)
    space = load_space(str(ROOT / "spaces" / "quickstart.toml"))
    idx = np.arange(min(space.size, 5000), dtype=np.int64)
    d64, r64, x64, _ = space.batch_parts(idx)
    d32, r32, x32, _ = space.batch_parts(idx, dtype=np.float32)
    np.testing.assert_array_equal(r32, r64)
    assert all(v.dtype == np.float32 for v in (*d32.columns.values(), *x32.values()))
    a = score_chunked(d32, 1000, np.float32, rows=r32, direct=x32)
    b = score_chunked(d64, 1000, np.float32, rows=r64, direct=x64)
    for m, v in b.items():
        np.testing.assert_array_equal(a[m], v, err_msg=m)
