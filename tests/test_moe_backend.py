"""``serving.moe_backend``: a named MoE kernel's own fitted parameters (dse/calibration/kernels/moe.py),
read from the catalog's backend sections, change the MoE layer time and nothing else; auto is
the entry's own (joint) fit; a backend without parameters for the runtime is refused."""

import tomllib

import numpy as np
import pandas as pd
import pytest

import dse
from dse import catalog
from dse.build import tables
from dse.build.designs import resolve, to_batch
from dse.calibration.kernels import common, moe
from dse.errors import InputError
from dse.perf import score
from dse.spec import fields

BASE = {"accelerator.id": "b200", "model.id": "qwen3-235b-a22b", "serving.runtime": "sglang",
        "workload.concurrency": 64.0}


def _resolved(**kw):
    return resolve(pd.DataFrame([{**BASE, **kw}]))


def test_choices_are_the_fit_backends():
    assert fields.REGISTRY["serving.moe_backend"].choices == ("auto",) + moe.BACKENDS
    assert fields.REGISTRY["serving.moe_backend"].default == "auto"


@pytest.mark.parametrize("source, backend", [
    ("sglang_fused_moe_triton", "triton"),
    ("sglang_flashinfer_trtllm_moe", "flashinfer_trtllm"),
    ("sglang_flashinfer_cutlass_moe", "flashinfer_cutlass"),
    ("vllm_unquantizedfusedmoe_flashinfer_trtllm_trtllmbf16experts", "flashinfer_trtllm"),
    ("vllm_fp8moe_flashinfer_cutlass_flashinferexperts", "flashinfer_cutlass"),
    ("vllm_fp8moe_triton_tritonexperts", "triton"),
    ("vllm_fused_moe", "triton"),
    ("moe_torch_flow_cutlass", "cutlass"),
    ("moe_torch_flow_nongated", "cutlass"),
    ("moe_torch_flow_triton_fp8_block", "triton"),
    ("deepgemm", "deepgemm"),
])
def test_kernel_source_to_backend(source, backend):
    assert moe.backend_of(source) == backend


def test_named_backend_takes_its_catalog_section_and_auto_the_entry():
    doc = tomllib.loads((common.CATALOG_DIR / "moe.toml").read_text())
    entry = doc["b200"]["sglang"]
    for b in ("triton", "flashinfer_trtllm"):
        sec = entry["backend"][b]
        assert "fitted on" in sec["fitted_on"]        # B200 measured both kernels itself
        r = _resolved(**{"serving.moe_backend": b})
        for k in ("moe_bf16_fraction", "moe_bf16_half_rows", "moe_bf16_latency_s"):
            assert r[f"accelerator.kernel.{k}"].iloc[0] == pytest.approx(sec[k], rel=1e-12)
    r = _resolved()
    assert r["accelerator.kernel.moe_bf16_fraction"].iloc[0] == pytest.approx(
        entry["moe_bf16_fraction"], rel=1e-12)
    # the two kernels are fitted apart: FlashInfer's TensorRT-LLM-gen MoE reaches several
    # times the Triton fused MoE's fraction of the bf16 peak
    assert entry["backend"]["flashinfer_trtllm"]["moe_bf16_fraction"] > \
        2.0 * entry["backend"]["triton"]["moe_bf16_fraction"]


def test_backend_moves_only_the_moe_time():
    runs = {b: score(to_batch(_resolved(**{"serving.moe_backend": b})))
            for b in ("auto", "triton", "flashinfer_trtllm")}
    tpot = {b: float(np.asarray(s["tpot_s"])[0]) for b, s in runs.items()}
    assert tpot["flashinfer_trtllm"] < tpot["triton"]
    assert len({round(v, 12) for v in tpot.values()}) == 3
    # non-MoE kernels are untouched: the resolved GEMM and attention keys are equal
    a, b = _resolved(), _resolved(**{"serving.moe_backend": "triton"})
    other = [c for c in a.columns if c.startswith("accelerator.kernel.")
             and not c.startswith("accelerator.kernel.moe_")]
    assert np.allclose(a[other].to_numpy(float), b[other].to_numpy(float), equal_nan=True)


def test_explicit_kernel_override_beats_the_backend():
    r = _resolved(**{"serving.moe_backend": "triton", "accelerator.kernel.moe_bf16_fraction": 0.5})
    assert r["accelerator.kernel.moe_bf16_fraction"].iloc[0] == 0.5


def test_transferred_backend_on_a_chip_without_its_table():
    """A chip that never measured a backend takes it from the chips that did (common.transfer),
    and says so."""
    p = catalog.kernel_params()
    sec = p[("mi355x", "sglang")]["backend"]["flashinfer_trtllm"]
    assert "transferred from sglang flashinfer_trtllm fits" in sec["fitted_on"]["moe"]


def test_backend_without_parameters_for_the_runtime_is_infeasible():
    """A named backend the runtime has no kernels for makes an MoE design infeasible with that
    reason (bit 256), not an error, so a space may cross runtimes with backends; a dense model
    has no experts and stays feasible; a misspelled backend is refused."""
    has = tables.backend_runtimes(tables.tables())
    assert "trtllm" not in has["flashinfer_trtllm"] and "sglang" in has["flashinfer_trtllm"]
    rows = [{**BASE, "serving.runtime": rt, "serving.moe_backend": bk}
            for rt, bk in (("trtllm", "flashinfer_trtllm"), ("sglang", "flashinfer_trtllm"),
                           ("trtllm", "auto"))]
    rows.append({**rows[0], "model.id": "llama-3.1-8b"})
    s = score(to_batch(resolve(pd.DataFrame(rows))))
    bit = (np.asarray(s["reason"]) & 256) != 0
    assert list(bit) == [True, False, False, False]
    assert not np.asarray(s["feasible"])[0]
    m = dse.evaluate({**rows[0], "layout.ep": 8.0, "layout.dp": 8.0}).metrics
    assert not m["feasible"] and "no fitted MoE kernels" in str(m["reason"])
    with pytest.raises(InputError, match="not valid"):
        _resolved(**{"serving.moe_backend": "flashinfer"})


def test_evaluate_accepts_it():
    a = dse.evaluate({**BASE, "serving.moe_backend": "flashinfer_trtllm"}).metrics["tpot_s"]
    b = dse.evaluate({**BASE, "serving.moe_backend": "triton"}).metrics["tpot_s"]
    assert a < b
