"""What a serving step runs where the runtimes' kernel tables disagree (dse.build.tables): a
GEMM's fixed time is the smallest any runtime's table fits on the chip, and an MLA kernel family
is the parameter set of the runtime whose fitted kernel is fastest on the reference shapes; the
kernel fits themselves (catalog.kernel_params) keep every runtime's own values."""

from __future__ import annotations

import numpy as np
import pytest

from dse import catalog
from dse.build import tables as tb

HOPPER = ("h100-sxm", "h200-sxm")


def _own(chip: str, rt: str, key: str) -> float:
    return float(catalog.kernel_params()[(chip, rt)][key])


def _served(chip: str, rt: str, key: str) -> float:
    T = tb.tables()
    return float(T.kernel[T.index["accelerator"][chip], T.runtimes.index(rt),
                          T.kernel_keys.index(key)])


@pytest.mark.parametrize("chip", HOPPER)
def test_a_gemm_pays_the_smallest_fixed_time_any_runtimes_table_fits(chip):
    T = tb.tables()
    for fam in ("bf16", "fp8", "fp8_block"):
        key = f"gemm_{fam}_latency_s"
        own = [_own(chip, rt, key) for rt in T.runtimes]
        for rt in T.runtimes:
            assert _served(chip, rt, key) == pytest.approx(min(own), rel=1e-12)


def _time(chip: str, fam: str, get) -> float:
    """Geometric-mean time of family ``fam`` on the reference shapes with the parameters
    ``get(key)`` gives."""
    kind = tb.MLA_FAMILIES[fam]
    args = tb._PREFILL_ARGS if kind == "prefill" else tb._DECODE_ARGS
    p = {a: get(f"{fam}_{a}") for a in args}
    acc = catalog.accelerators()[chip]
    peak = acc.peak_flops_per_s.fp8 if fam == "mla_decode_kv_fp8" else acc.peak_flops_per_s.bf16
    t = tb._mla_times(kind, fam, p, peak, acc.hbm_bw_bytes_per_s)
    return float(np.exp(np.mean(np.log(t))))


@pytest.mark.parametrize("chip", HOPPER)
@pytest.mark.parametrize("fam", sorted(tb.MLA_FAMILIES))
def test_every_runtime_serves_the_fastest_mla_kernel_of_its_chip(chip, fam):
    """Every runtime gets the same MLA parameters, those of the fastest table: the served time on
    the reference shapes is the minimum over the runtimes' own fits, and on Hopper SGLang's own
    fp8-cache decode table (``flash_attention`` backend, 0.12-0.13 of peak on the MMAs) is at
    least 1.5x slower than what is served."""
    T = tb.tables()
    own = {rt: _time(chip, fam, lambda k, rt=rt: _own(chip, rt, k)) for rt in T.runtimes}
    for rt in T.runtimes:
        served = _time(chip, fam, lambda k, rt=rt: _served(chip, rt, k))
        assert served == pytest.approx(min(own.values()), rel=1e-9)
    if fam in ("mla_decode_kv_fp8", "mla_prefill"):
        assert own["sglang"] > 1.5 * min(own.values())


def test_the_reference_shapes_rank_a_slower_kernel_last():
    """A kernel whose achieved compute fraction is 20% lower is slower on the reference
    shapes (the ranking is on time, not on one parameter): with TensorRT-LLM's H200 decode
    parameters, compute_fraction x 0.8 costs time on the 128-head, 512-sequence shapes."""
    chip, fam = "h200-sxm", "mla_decode_kv_fp8"
    base = _time(chip, fam, lambda k: _own(chip, "trtllm", k))
    slower = _time(chip, fam, lambda k: _own(chip, "trtllm", k)
                   * (0.8 if k.endswith("compute_fraction") else 1.0))
    assert slower > 1.02 * base
