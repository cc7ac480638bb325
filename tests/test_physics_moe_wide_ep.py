"""Wide expert parallelism: the routed experts' kernel time of one rank, worked by hand.

Under attention DP (dp = ep, tp = 1) the all-to-all hands each rank only the tokens routed to
it (DeepEP, TensorRT-LLM's WideEP), so the rank's grouped GEMM time depends on its own routed
rows and its own experts' weights, plus the tokens it received (each with its top-k list):
a token visits ``dest = ep (1 - (1 - 1/ep)^k)`` ranks, so a rank receives ``tok dest / ep``
tokens carrying ``rows dest`` entries, ``rows (dest - 1)`` of them remote. At the same rows
and experts per rank that is at most ``k - 1`` remote entries per own row whatever ep is
(``dse.perf.op_mlp``), where the single-GPU tables' form (every token of the batch through
every chip's kernel: TP+EP, dp = 1) charges ``tok k (ep - 1) / ep``, growing with ep.

The shape is DeepSeek-V3's (hidden 7168, experts of width 2048, gated, top-8, 58 MoE layers),
with the experts per rank held at 8 (64 experts at ep = 8, 256 at 32, 576 at 72) and the
routed rows per rank at 2048 (2048, 8192, 18432 decode tokens): compute-bound, so every term
of the grouped GEMM shows. Kernel parameters are pinned to
round numbers of their own (``PIN``), so a refit does not move the expected values; changing
any of them, or the experts, top-k, ep or the tokens, by 20% fails a test here.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import batch, design

from dse.catalog import kernel_params
from dse.perf import OPS, score

MOE = OPS.index("moe_routed")
P_EXP = 3 * 7168 * 2048                 # weights of one expert (gated: 3 matrices)
LAYERS = 58
PER_RANK_EXPERTS, ROWS, K = 8, 2048, 8
PIN = {"matmul_flops_per_s": 1e15, "expert_matmul_flops_per_s": 2e15, "expert_weight_bytes": 1.0,
       "hbm_bw_bytes_per_s": 4e12, "moe_fraction": 0.4, "moe_half_rows": 16.0,
       "moe_width_half": 512.0, "moe_hidden_half": 1024.0, "moe_hbm_fraction": 0.6,
       "moe_token_bytes": 6.0, "moe_batch_bytes": 3.0, "moe_route_bytes": 0.25,
       "moe_latency_s": 30e-6, "moe_wave_elements": 3e5, "moe_remote_fraction": 0.05,
       "alltoall_overlap_fraction": 0.0}
NO_RECEIVED_TERMS = {"moe_batch_bytes": 0.0, "moe_route_bytes": 0.0, "moe_remote_fraction": 0.0}


def _steps(eps, tp_ep=False, **pin):
    """The decode step of DeepSeek-V3's shape at each ep (8 experts and 2048 routed rows per
    rank), attention DP (dp = ep, tp = 1) or, ``tp_ep``, TP+EP (tp = ep, dp = 1)."""
    rows = []
    for ep in eps:
        tp, dp = (ep, 1) if tp_ep else (1, ep)
        rows.append(design("gb200", "deepseek-v3", **{
            "model.weight_dtype": "fp8", "layout.tp": tp, "layout.dp": dp, "layout.ep": ep,
            "workload.isl": 1, "workload.osl": 2, "workload.concurrency": ROWS * ep // K,
            "workload.phase": "decode", "topology.id": "nvl72",
            "serving.expert_imbalance": 1.0}))
    ep = np.asarray(eps, float)
    b = batch(rows, ideal=True).replace(**{**PIN, **pin, "n_experts": PER_RANK_EXPERTS * ep})
    return score(b, breakdown=True)[1].decode


def _kernel_s(dec):
    """The routed experts' busy time per chip (compute or weights, plus the additive terms):
    the op's time without its network terms (none hidden here)."""
    return dec.op_s[MOE] - dec.network_s[MOE]


def _by_hand(ep, tp_ep=False, remote=0.05, batch_bytes=3.0, route=0.25):
    """One rank's routed-expert time at ``ep``, 58 layers (module docstring): 2048 own rows,
    16 padded rows for each of its 8 experts (all touched), one wave of 3e5 / 2048 rows, and
    the remote entries (dp > 1: those of its received tokens, 2048 (dest - 1); dp = 1: every
    token's, tok k (ep - 1) / ep), x (1 + 512/2048 + 1024/7168) edge waste, at 2 PFLOP/s x 0.4;
    or its 8 experts' weights at 4 TB/s x 0.6; plus per hidden element at 4 TB/s 6 B per own
    row and 3 B per received token and 0.25 B per received entry, and 30 us."""
    tok = ROWS * ep / K
    e = PER_RANK_EXPERTS * ep
    touched = 1 - (1 - K / e) ** tok
    dest = ep * (1 - (1 - 1 / ep) ** K)
    spread = not tp_ep
    received = tok * dest / ep if spread else tok
    remote_rows = ROWS * (dest - 1) if spread else tok * K * (ep - 1) / ep
    shape = 1 + 512 / 2048 + 1024 / 7168
    rows = ROWS + remote * remote_rows + 16 * PER_RANK_EXPERTS * touched + 3e5 / 2048
    compute = LAYERS * 2 * P_EXP * shape / (2e15 * 0.4) * rows
    memory = LAYERS * PER_RANK_EXPERTS * P_EXP * 1.0 / (4e12 * 0.6) * touched
    extra = LAYERS * (7168 / 4e12 * (ROWS * 6.0 + received * (batch_bytes + K * route)) + 30e-6)
    return compute, memory, max(compute, memory) + extra


EPS = (8, 32, 72)


def test_wide_ep_rank_time_by_hand():
    """At ep 8, 32 and 72 the rank's compute, weight and busy times are the hand-worked ones
    (``_by_hand``): the received tokens' remote entries and bytes, not the batch's."""
    dec = _steps(EPS)
    for i, ep in enumerate(EPS):
        compute, memory, busy = _by_hand(ep)
        assert dec.compute_s[MOE][i] == pytest.approx(compute, rel=1e-9)
        assert dec.memory_s[MOE][i] == pytest.approx(memory, rel=1e-9)
        assert _kernel_s(dec)[i] == pytest.approx(busy, rel=1e-9)


def test_same_rows_and_experts_per_rank_same_time_at_any_ep():
    """The rank's own rows and experts set its kernel time: without the received tokens' terms
    the time at ep 8, 32 and 72 is the same (up to the touched share, 1 - e^-256 here), and with
    them it grows only with the received tokens, by less than the ratio of their distinct
    ranks visited (dest 5.25, 7.61, 7.83: bounded by k = 8), not as ep."""
    flat = _kernel_s(_steps(EPS, **NO_RECEIVED_TERMS))
    assert flat[1] == pytest.approx(flat[0], rel=1e-6)
    assert flat[2] == pytest.approx(flat[0], rel=1e-6)
    full = _kernel_s(_steps(EPS))
    assert full[0] < full[1] < full[2] < full[0] * 7.83 / 5.25
    assert full[2] / full[1] < 1.02                  # ep 2.25x, the time 1.5% (dest 7.61 -> 7.83)


def test_tp_ep_keeps_every_token_through_every_chip():
    """TP+EP (dp = 1, tp = ep): every chip holds every token, so its kernel runs all tok x 8
    entries, tok x 8 x (ep - 1) / ep of them remote, and the batch's bytes (the single-GPU
    tables' form, kept): by hand, and growing with ep at the same rows per chip."""
    eps = (8, 32)
    dec = _steps(eps, tp_ep=True)
    for i, ep in enumerate(eps):
        compute, memory, _ = _by_hand(ep, tp_ep=True)
        assert dec.compute_s[MOE][i] == pytest.approx(compute, rel=1e-9)
        assert dec.memory_s[MOE][i] == pytest.approx(memory, rel=1e-9)
    spread = _kernel_s(_steps(eps))
    whole = _kernel_s(dec)
    assert whole[1] / whole[0] > 1.5 * spread[1] / spread[0]


@pytest.mark.parametrize("field", ["moe_remote_fraction", "moe_batch_bytes", "moe_route_bytes",
                                   "moe_token_bytes", "moe_fraction", "moe_half_rows",
                                   "moe_wave_elements", "moe_latency_s", "moe_hbm_fraction"])
def test_a_term_changed_by_20_percent_leaves_the_hand_worked_time(field):
    """Each term of the rank's time moves it by far more than the tolerance of the by-hand
    test when changed by 20% (at ep = 72, where the weights are not the bound, except for the
    weight read: at ep = 8 with 16 rows per rank, where they are)."""
    ep, rows_per_rank = (8, 16) if field == "moe_hbm_fraction" else (72, ROWS)
    d = design("gb200", "deepseek-v3", **{
        "model.weight_dtype": "fp8", "layout.tp": 1, "layout.dp": ep, "layout.ep": ep,
        "workload.isl": 1, "workload.osl": 2, "workload.concurrency": rows_per_rank * ep // K,
        "workload.phase": "decode", "topology.id": "nvl72", "serving.expert_imbalance": 1.0})
    pin = {**PIN, "n_experts": float(PER_RANK_EXPERTS * ep)}
    base = batch(d, ideal=True).replace(**pin)
    t0 = _kernel_s(score(base, breakdown=True)[1].decode)[0]
    t1 = _kernel_s(score(base.replace(**{field: pin[field] * 1.2}), breakdown=True)[1].decode)[0]
    assert abs(t1 / t0 - 1.0) > 1e-3


def _moe_fields(rows):
    return batch(rows).columns


def test_sglang_wide_ep_runs_the_deepgemm_kernel_fitted_on_the_wide_ep_tables():
    """SGLang with attention DP and ep > 1 (DeepEP) runs its experts on DeepGEMM: the design
    takes the ``deepgemm`` MoE parameters (dse/catalog/kernels/moe_wideep.toml) under
    ``serving.moe_backend = "auto"``; TensorRT-LLM's wide EP takes its WideEP module's
    (``wideep``, fitted on its wide-EP table); dp = 1 (no all-to-all) and a named backend keep
    theirs."""
    base = {"model.weight_dtype": "fp8", "workload.concurrency": 256,
            "serving.runtime": "sglang"}
    rows = [design("h100-sxm", "deepseek-v3", **{**base, "layout.tp": 1, "layout.dp": 16,
                                                 "layout.ep": 16}),
            design("h100-sxm", "deepseek-v3", **{**base, "layout.tp": 16, "layout.dp": 1,
                                                 "layout.ep": 16}),
            design("h100-sxm", "deepseek-v3", **{**base, "serving.runtime": "trtllm",
                                                 "layout.tp": 1, "layout.dp": 16,
                                                 "layout.ep": 16}),
            design("h100-sxm", "deepseek-v3", **{**base, "serving.moe_backend": "triton",
                                                 "layout.tp": 1, "layout.dp": 16,
                                                 "layout.ep": 16})]
    got = _moe_fields(rows)["moe_fraction"]
    kp = kernel_params()
    wide = kp[("h100-sxm", "sglang")]["backend"]["deepgemm"]["moe_fp8_block_fraction"]
    assert "wideep" in kp[("h100-sxm", "sglang")]["backend"]["deepgemm"]["fitted_on"][
        "moe_wideep"]
    assert got[0] == pytest.approx(wide, rel=1e-6)
    assert got[1] == pytest.approx(kp[("h100-sxm", "sglang")]["moe_fp8_block_fraction"], rel=1e-6)
    assert got[2] == pytest.approx(
        kp[("h100-sxm", "trtllm")]["backend"]["wideep"]["moe_fp8_block_fraction"], rel=1e-6)
    assert got[3] == pytest.approx(
        kp[("h100-sxm", "sglang")]["backend"]["triton"]["moe_fp8_block_fraction"], rel=1e-6)
    assert got[0] != pytest.approx(got[1], rel=1e-3)


def test_a_space_sweeping_the_layout_picks_the_kernel_per_design(tmp_path):
    """A space whose dp is numeric (resolved once, the layout applied per design) gives each
    design the same kernel fields as scoring it alone."""
    from dse.build.space import load_space

    (tmp_path / "s.toml").write_text(
        'name = "wide-ep"\n[accelerator]\nid = "h100-sxm"\n[model]\nid = "deepseek-v3"\n'
        'weight_dtype = "fp8"\n[serving]\nruntime = "sglang"\n[layout]\ntp = 1\nep = 16\n'
        '[workload]\nconcurrency = 256\n[parameters]\n"layout.dp" = [1, 16]\n'
        '[objectives]\ntpot_s = "minimize"\n')
    space = load_space(tmp_path / "s.toml")
    b, _ = space.batch(np.arange(space.size))
    alone = _moe_fields([design("h100-sxm", "deepseek-v3", **{
        "model.weight_dtype": "fp8", "serving.runtime": "sglang", "layout.tp": 1,
        "layout.ep": 16, "workload.concurrency": 256, "layout.dp": dp}) for dp in (1, 16)])
    for k in ("moe_fraction", "moe_batch_bytes", "moe_remote_fraction"):
        np.testing.assert_allclose(np.broadcast_to(b.columns[k], (2,)),
                                   np.broadcast_to(alone[k], (2,)), rtol=1e-6)
