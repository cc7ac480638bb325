"""Invariants of the scorer, checked on random designs (Hypothesis)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers import batch, design
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dse import catalog
from dse.perf import score

ACCS = sorted(catalog.accelerators())
MODELS = sorted(catalog.models())


@st.composite
def designs(draw, n=8):
    rows = []
    for _ in range(n):
        model = draw(st.sampled_from(MODELS))
        m = catalog.models()[model]
        tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if m.num_attention_heads % t == 0]))
        dp = draw(st.sampled_from([1, 2, 4]))
        ep = draw(st.sampled_from([e for e in (1, 2, 4, 8) if (tp * dp) % e == 0
                                   and (e == 1 or (m.num_experts and e <= m.num_experts))]))
        rows.append({
            "accelerator.id": draw(st.sampled_from(ACCS)), "model.id": model,
            "model.weight_dtype": draw(st.sampled_from(["bf16", "fp8", "fp4", "int4"])),
            "layout.tp": tp, "layout.dp": dp, "layout.ep": ep,
            "layout.pp": draw(st.sampled_from([1, 2, 4])),
            "workload.isl": draw(st.integers(1, 32768)), "workload.osl": draw(st.integers(1, 4096)),
            "workload.concurrency": draw(st.integers(1, 4096)),
            "workload.prefix_hit_fraction": draw(st.sampled_from([0.0, 0.5, 0.9])),
            "workload.phase": draw(st.sampled_from(["both", "prefill", "decode"])),
        })
    return batch(rows)


FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# (the closed-loop TTFT, ``ttft_s``, is not among them: a faster decode brings the users back
# sooner, and their prompts may queue longer; a request's own TTFT never grows)
TIME_METRICS = ("tpot_s", "ttft_unloaded_s", "step_s")


def _no_slower(a, b):
    for k in TIME_METRICS:
        x, y = a[k], b[k]
        ok = np.isnan(x) & np.isnan(y) | (y <= x * (1 + 1e-9))
        assert ok.all(), k
    x, y = a["output_tokens_per_s_per_chip"], b["output_tokens_per_s_per_chip"]
    assert (y >= x * (1 - 1e-9)).all()


@FAST
@given(designs(), st.floats(1.0, 4.0))
def test_more_hbm_bandwidth_never_slows_a_step(b, factor):
    _no_slower(score(b), score(b.replace(hbm_bw_bytes_per_s=b.hbm_bw_bytes_per_s * factor)))


@FAST
@given(designs(), st.floats(1.0, 4.0))
def test_more_flops_never_slow_a_step(b, factor):
    faster = b.replace(matmul_flops_per_s=b.matmul_flops_per_s * factor,
                       attn_flops_per_s=b.attn_flops_per_s * factor)
    _no_slower(score(b), score(faster))


@FAST
@given(designs(), st.floats(1.0, 8.0))
def test_more_link_bandwidth_never_slows_a_step(b, factor):
    faster = b.replace(scaleup_bw_bytes_per_s=b.scaleup_bw_bytes_per_s * factor,
                       scaleout_bw_bytes_per_s=b.scaleout_bw_bytes_per_s * factor)
    _no_slower(score(b), score(faster))


@FAST
@given(designs())
def test_scoring_a_batch_equals_scoring_each_row(b):
    whole = score(b)
    for i in range(len(b)):
        row = score(b.take(slice(i, i + 1)))
        for k, v in whole.items():
            np.testing.assert_allclose(row[k], v[i:i + 1], rtol=1e-12, equal_nan=True, err_msg=k)


@FAST
@given(designs())
def test_chunked_scoring_equals_one_call(b):
    from dse.perf import score_chunked
    big = b.take(np.tile(np.arange(len(b)), 5))
    whole = score(big)
    parts = score_chunked(big, chunk_rows=7)
    for k in whole:
        np.testing.assert_allclose(parts[k], whole[k], rtol=1e-12, equal_nan=True, err_msg=k)


@FAST
@given(designs())
def test_infeasible_rows_stay_flagged_with_a_reason(b):
    s = score(b)
    assert ((s["reason"] == 0) == s["feasible"]).all()
    # ask for more sequences than fit: the row must be flagged (bit 16 or 32), never dropped
    over = b.replace(concurrency=s["max_concurrent_sequences"] + 1)
    s2 = score(over)
    assert len(s2["feasible"]) == len(b)
    assert (~s2["feasible"]).all()
    assert ((s2["reason"] & (16 | 32 | 8)) != 0).all()
    # a row's flags do not depend on its neighbours
    mixed = score(b.take(np.r_[0:len(b)][::-1]))
    assert (mixed["reason"][::-1] == s["reason"]).all()


@FAST
@given(designs())
def test_times_are_positive_and_finite_where_defined(b):
    s = score(b)
    for k in ("step_s", "usd_per_chip_hour", "weights_bytes_per_chip", "kv_bytes_per_token"):
        assert np.isfinite(s[k]).all() and (s[k] > 0).all(), k
    dec = b.phase != 1
    assert (s["tpot_s"][dec] > 0).all() and np.isnan(s["tpot_s"][~dec]).all()
    pre = b.phase != 2
    assert (s["ttft_s"][pre] > 0).all() and np.isnan(s["ttft_s"][~pre]).all()


def test_float32_scoring_agrees_with_float64():
    rows = pd.DataFrame({"accelerator.id": ACCS * 2, "model.id": (MODELS * 4)[: 2 * len(ACCS)],
                         "workload.concurrency": 64, "layout.tp": 1})
    from dse.build.designs import resolve, to_batch
    b = to_batch(resolve(rows))
    from dse.perf import score_chunked
    a, f = score_chunked(b), score_chunked(b, dtype=np.float32)
    for k in ("tpot_s", "ttft_s", "output_tokens_per_s_per_chip", "usd_per_mtok_output"):
        np.testing.assert_allclose(f[k], a[k], rtol=1e-5, equal_nan=True)


def test_routed_expert_compute_of_one_token_ignores_untouched_experts():
    """One decode token uses top_k experts: their matmuls are padded to tiles, the other
    experts' are not computed at all, so the routed compute does not depend on how many
    experts there are (memory does: more experts, more weights)."""
    from dse.perf import OPS
    j = OPS.index("moe_routed")
    times = []
    for experts in (64, 256):
        d = design("h200-sxm", "deepseek-v3", **{"model.num_experts": experts, "layout.tp": 8,
                                                 "model.weight_dtype": "fp8",
                                                 "workload.concurrency": 1, "workload.phase": "decode"})
        _, steps = score(batch(d), breakdown=True)
        times.append(float(steps.decode.compute_s[j, 0]))
    assert times[0] == pytest.approx(times[1], rel=1e-12)


def test_an_impossible_model_structure_is_infeasible_never_a_negative_cost():
    # DeepSeek-V3 cut to 2 layers while 3 stay dense (a combination a large space could reach):
    # -1 MoE layers would give negative times and costs; the scorer marks it invalid instead
    b = batch(design("gb200", "deepseek-v3", **{"layout.dp": 8, "layout.ep": 8,
                                                "model.weight_dtype": "fp8",
                                                "workload.concurrency": 64}))
    s = score(b.replace(n_layers=2.0, n_dense_layers=3.0, n_moe_layers=-1.0))
    assert not s["feasible"][0] and (s["reason"][0] & 64)
    ok = score(b)
    assert ok["feasible"][0]


COMPACT_CASES = {
    "topology": {"topology.id": ["hgx-8", "nvl72", "hgx-8", "nvl72"] * 3,
                 "layout.tp": [1, 2, 4, 8] * 3, "layout.dp": [1] * 4 + [2] * 4 + [4] * 4},
    # only the scale-out link varies, groups span two domains (the pipeline-racks question)
    "scaleout": {"accelerator.scaleout_link_bw_bytes_per_s": [25e9, 50e9, 100e9, 200e9],
                 "layout.tp": 8, "layout.dp": 2},
}


@pytest.mark.parametrize("case", sorted(COMPACT_CASES))
@pytest.mark.parametrize("model", ["llama-3.1-70b", "deepseek-v3"])
def test_a_compact_batch_scores_like_its_expanded_copy(model, case):
    """The search scores compact batches (a column the same for every design is one value):
    every metric equals the expanded batch's, whichever columns vary (the topology's domain
    and scale-out numbers, or the scale-out link alone, while the chip, model and kernels do
    not)."""
    from dse.build.designs import resolve, to_batch
    from dse.perf import Batch
    rows = pd.DataFrame({"accelerator.id": "h100-sxm", "model.id": model,
                         "workload.concurrency": 64, **COMPACT_CASES[case]})
    full = to_batch(resolve(rows))
    compact = Batch({k: v[:1] if np.all(v == v[0]) else v for k, v in full.columns.items()})
    assert sum(len(v) == 1 for v in compact.columns.values()) > 100   # mostly constant
    a, c = score(full), score(compact)
    for k in a:
        np.testing.assert_allclose(c[k], a[k], rtol=1e-12, equal_nan=True, err_msg=k)
