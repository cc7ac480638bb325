"""Collective cost models (dse.perf.kernel_comm) and their fitted catalog (comm.toml)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

from dse.perf import kernel_comm as kc

NCCL = dict(ar_nccl_latency_s=5e-6, ar_nccl_latency_per_log2_s=3e-6, ar_nccl_ll_fraction=0.1,
            ar_nccl_bulk_latency_s=3e-5, ar_nccl_fraction=0.9, ar_nccl_fraction_per_doubling=1.0)
CUSTOM = dict(ar_custom_latency_s=4e-6, ar_custom_latency_per_log2_s=0.0 + 1e-12,
              ar_custom_fraction=0.8)
OUT = dict(a2a_scaleout_latency_s=1e-5, a2a_scaleout_fraction=0.9)
W = 450e9


def test_ring_allreduce_1gb_8gpu_by_hand():
    t = kc.allreduce_s(1e9, 8, W, custom=False, **NCCL)
    # Simple branch: 30 us + 3 * 3 us + 2*7/8 * 1e9 / (450e9 * 0.9)
    assert t == pytest.approx(30e-6 + 9e-6 + 1.75e9 / 405e9, rel=1e-12)
    assert t == pytest.approx(4.3599e-3, rel=1e-4)


def test_small_messages_latency_bound():
    t = kc.allreduce_s(np.array([256.0, 1024.0]), 8, W, custom=False, **NCCL)
    # LL branch: 5 + 3*3 = 14 us plus a few ns of bytes
    assert np.allclose(t, 14e-6, rtol=0.01)
    tc = kc.allreduce_s(256.0, 8, W, **NCCL, **CUSTOM)
    assert tc == pytest.approx(4e-6 + 7 * 256 / (W * 0.8), rel=1e-6)


def test_custom_oneshot_hand_example():
    lat, spb = kc.custom_allreduce_branches(8, W, **CUSTOM)
    t = lat + spb * 65536
    assert t[0] == pytest.approx(4e-6 + 7 * 65536 / 360e9, rel=1e-6)      # 5.27 us
    assert t[1] == pytest.approx(8e-6 + 1.75 * 65536 / 360e9, rel=1e-6)   # 8.32 us


def test_custom_nccl_crossover():
    b = np.logspace(2, 9, 200)
    t_min = kc.allreduce_s(b, 8, W, **NCCL, **CUSTOM)
    t_nccl = kc.allreduce_s(b, 8, W, custom=False, **NCCL)
    lat, spb = kc.custom_allreduce_branches(8, W, **CUSTOM)
    t_custom = np.min(lat[:, None] + spb[:, None] * b, axis=0)
    assert np.allclose(t_min, np.minimum(t_nccl, t_custom))
    assert t_custom[0] < t_nccl[0] and t_custom[-1] > t_nccl[-1]    # custom small, NCCL large
    # by hand: two-shot (8 us + 1.75 B/360e9) = Simple (39 us + 1.75 B/405e9) at B = 57.4 MB
    cross = (39e-6 - 8e-6) / (1.75 / 360e9 - 1.75 / 405e9)
    i = np.argmax(t_custom > t_nccl)
    assert b[i - 1] < cross * 1.1 and b[i] > cross / 1.1


def test_ep_dispatch_bytes_node_dedup_by_hand():
    # top-8 of 256 experts over 4 nodes of 8 GPUs (ep 32), T = 128, h = 7168, fp8
    row = 7168 * kc.FP8_ELEM_BYTES
    assert row == pytest.approx(7392.0)
    up_ll, out_ll = kc.alltoall_bytes(128, 7168, 8, 256, 32, 8, kc.FP8_ELEM_BYTES, "ll")
    assert out_ll == pytest.approx(128 * row * 8 * 3 / 4)        # 6 copies leave the node
    assert up_ll == pytest.approx(128 * row * 8 * 7 / 32)        # 1.75 copies to node peers
    up, out = kc.alltoall_bytes(128, 7168, 8, 256, 32, 8, kc.FP8_ELEM_BYTES, "normal")
    miss = np.prod([(192 - i) / (256 - i) for i in range(8)])    # no expert on a given node
    assert out == pytest.approx(128 * row * 3 * (1 - miss))
    assert 1 - miss == pytest.approx(0.9036, abs=1e-4)
    assert out_ll / out == pytest.approx(6 / (3 * 0.90355), rel=1e-3)   # dedup saves 2.2x
    assert up < up_ll * 7 / 1.75   # dedup per rank too


def test_alltoall_docstring_example():
    t = kc.alltoall_s(4096, 7168, 8, 256, 32, 8, kc.FP8_ELEM_BYTES, 200e9, 50e9,
                      latency_s=3e-5, fraction=0.8, kind="normal", **OUT)
    assert t == pytest.approx(1.864e-3, rel=2e-3)


def test_low_latency_vs_normal():
    kw = dict(hidden=7168, topk=8, experts=256, ep=8, ranks_per_node=8,
              elem_bytes=kc.FP8_ELEM_BYTES, scaleup_bw_bytes_per_s=W, scaleout_bw_bytes_per_s=50e9,
              **OUT)
    ll = dict(latency_s=3e-5, fraction=0.3, kind="ll")
    normal = dict(latency_s=1.2e-4, fraction=0.7, kind="normal")
    small = [kc.alltoall_s(8, **kw, **p) for p in (ll, normal)]
    big = [kc.alltoall_s(16384, **kw, **p) for p in (ll, normal)]
    assert small[0] < small[1] and big[0] > big[1]
    assert small[0] > 2e-5     # tens of us, not one hop of 1 us


def test_single_rank_is_free_and_monotone():
    assert kc.allreduce_s(1e6, 1, W, **NCCL, **CUSTOM) == 0.0
    b = np.logspace(2, 9, 50)
    for g in (2, 4, 8, 16):
        t = kc.allreduce_s(b, g, W, **NCCL, **CUSTOM)
        assert np.all(np.diff(t) >= 0)
    tg = [kc.allreduce_s(1e8, g, W, **NCCL, **CUSTOM) for g in (2, 4, 8, 16)]
    assert np.all(np.diff(tg) > 0)
    kw = dict(hidden=7168, topk=8, experts=256, ranks_per_node=8, elem_bytes=1.0,
              scaleup_bw_bytes_per_s=W, scaleout_bw_bytes_per_s=50e9, latency_s=3e-5,
              fraction=0.5, **OUT)
    for kind in ("ll", "normal"):
        tt = kc.alltoall_s(np.array([1, 10, 100, 1000, 10000.]), ep=16, kind=kind, **kw)
        assert np.all(np.diff(tt) > 0)
        te = [float(kc.alltoall_s(1024, ep=e, kind=kind, **kw)) for e in (2, 4, 8, 16, 32, 64)]
        assert np.all(np.diff(te) > 0)
        assert float(kc.alltoall_s(1024, ep=1, kind=kind, **kw)) == 0.0


def test_hierarchical_allreduce_pays_scaleout():
    inside = kc.allreduce_s(1e8, 8, W, domain_chips=8, scaleout_bw_bytes_per_s=50e9,
                            **NCCL, **CUSTOM, **OUT)
    spans = kc.allreduce_s(1e8, 16, W, domain_chips=8, scaleout_bw_bytes_per_s=50e9,
                           **NCCL, **CUSTOM, **OUT)
    extra = 2 * 1e-5 + 2 * 0.5 * (1e8 / 8) / (50e9 * 0.9)
    nccl8 = kc.allreduce_s(1e8, 8, W, custom=False, **NCCL)
    assert spans == pytest.approx(nccl8 + extra, rel=1e-9)
    assert spans > inside


@pytest.mark.parametrize("name", list(NCCL) + list(CUSTOM))
def test_each_allreduce_parameter_matters(name):
    p = {**NCCL, **CUSTOM}
    b = np.logspace(2, 9, 40)
    ref = kc.allreduce_s(b, 8, W, custom=name in CUSTOM, **p)
    p[name] = p[name] * 1.2 if p[name] > 1e-9 else 1e-6
    new = kc.allreduce_s(b, 8, W, custom=name in CUSTOM, **p)
    assert np.max(np.abs(new / ref - 1)) > 0.01


@pytest.mark.parametrize("name", ["latency_s", "fraction", "a2a_scaleout_latency_s",
                                  "a2a_scaleout_fraction"])
@pytest.mark.parametrize("kind", ["ll", "normal"])
def test_each_alltoall_parameter_matters(name, kind):
    p = dict(latency_s=3e-5, fraction=0.5, **OUT)
    tokens = np.array([1, 64, 1024, 16384.])
    kw = dict(hidden=7168, topk=8, experts=256, elem_bytes=1.0, scaleup_bw_bytes_per_s=W,
              scaleout_bw_bytes_per_s=50e9, kind=kind)
    # the scale-up fraction shows on one node, the scale-out terms across nodes
    ep, rpn = (8, 8) if name == "fraction" else (32, 8)
    ref = kc.alltoall_s(tokens, ep=ep, ranks_per_node=rpn, **kw, **p)
    p[name] *= 1.2
    new = kc.alltoall_s(tokens, ep=ep, ranks_per_node=rpn, **kw, **p)
    assert np.max(np.abs(new / ref - 1)) > 0.01


def test_synthetic_fit_recovers_parameters():
    pytest.importorskip("scipy")
    pytest.importorskip("pandas")
    from dse.calibration.kernels import common
    from dse.calibration.kernels.comm import CUSTOM_PARAMS, NCCL_PARAMS
    g = np.repeat([2.0, 4.0, 8.0], 22)
    b = np.tile(2.0 * 2.0 ** np.arange(8, 30), 3)
    true = dict(NCCL, ar_nccl_fraction_per_doubling=1.15)
    truec = dict(ar_custom_latency_s=3e-6, ar_custom_latency_per_log2_s=5e-7,
                 ar_custom_fraction=0.6)

    def pred_n(v):
        lat, spb = kc.nccl_allreduce_branches(g, W, **v)
        return np.min(lat + spb * b, axis=0)
    fit = common.least_squares_fit(pred_n, NCCL_PARAMS, pred_n(true), max_nfev=400)
    for k, v in true.items():
        assert fit.values[k] == pytest.approx(v, rel=0.03), k

    def pred_c(v):
        return kc.allreduce_s(b, g, W, **true, **v)
    fitc = common.least_squares_fit(pred_c, CUSTOM_PARAMS, pred_c(truec), max_nfev=400)
    for k, v in truec.items():
        assert fitc.values[k] == pytest.approx(v, rel=0.03), k


def test_catalog_complete_for_every_accelerator_and_runtime():
    from dse.catalog import accelerators, kernel_chip
    path = Path(__file__).resolve().parents[1] / "dse" / "catalog" / "kernels" / "comm.toml"
    with open(path, "rb") as fh:
        cat = tomllib.load(fh)
    for chip in accelerators():
        for rt in ("trtllm", "sglang", "vllm"):
            e = cat[kernel_chip(chip)][rt]     # a variant part reads its base
            assert e["fitted_on"]
            for k in kc.KEYS:
                assert np.isfinite(e[k]) and e[k] > 0, (chip, rt, k)
            # the catalog values run through the model
            assert kc.allreduce_s(1e6, 8, 450e9, **{k: e[k] for k in kc.KEYS
                                                    if k.startswith("ar_")}) > 0
            assert kc.alltoall_s(128, 7168, 8, 256, 16, 8, 1.0, 450e9, 50e9,
                                 **kc.phase_params(e, "ll", "dispatch")) > 1e-6


def test_fit_report_on_measured_tables():
    pytest.importorskip("aiconfigurator_core")
    from dse.calibration.kernels import comm
    rep = comm.main(fit=False)
    ar = rep[rep["op_class"] == "allreduce_nccl"].dropna(subset=["error_held_out"])
    assert len(ar) >= 5 and (ar["error_held_out"] < 1.2).all()


def test_missing_runtime_takes_that_runtimes_chips_first():
    from dse.calibration.kernels import comm
    from dse.catalog import accelerators
    accs = accelerators()
    nccl = {c: dict(NCCL) for c in ("h100-sxm", "h200-sxm", "b200")}
    own = dict(ar_custom_latency_s=3e-6, ar_custom_latency_per_log2_s=3e-7,
               ar_custom_fraction=0.5)
    other = {k: v * 2.0 for k, v in own.items()}
    fits = {"nccl": nccl, "a2a": {},
            "custom": {("h100-sxm", "trtllm"): own, ("h200-sxm", "sglang"): other,
                       ("b200", "sglang"): other}}
    v, how = comm.entry_for("h100-sxm", "sglang", fits, accs)
    assert "ar_custom: ar_custom sglang transfer from" in how
    for k in own:
        assert v[k] == pytest.approx(other[k], rel=1e-9), k
    v, how = comm.entry_for("h100-sxm", "vllm", fits, accs)     # nobody has vllm
    assert "chip's other runtimes" in how
    for k in own:
        assert v[k] == pytest.approx(own[k], rel=1e-9), k


def test_nvl72_trtllm_a2a_from_nvlink_table():
    """GB200/GB300 trtllm a2a keys come from TRT-LLM's NVLink all-to-all, fitted as one
    NVLink node (ranks_per_node = ep), not pegged at the fraction bounds."""
    from dse.calibration.kernels import comm
    cat = comm.catalog_entries()
    for chip in comm.NVLINK_CHIPS:
        e = cat[chip]["trtllm"]
        assert "trtllm_alltoall_perf" in e["fitted_on"]
        for kind in ("ll", "normal"):
            for phase in ("dispatch", "combine"):
                assert 0.05 < e[f"a2a_{kind}_{phase}_fraction"] < 2.5
                assert e[f"a2a_{kind}_{phase}_latency_s"] < 1e-4
    rows = comm.nvlink_a2a_rows()
    if len(rows):
        assert (rows["rpn"] == rows["ep"]).all()
        assert set(rows["kind"]) == {"ll", "normal"}


def _nccl_frame(chip, busbw_by_g):
    """Synthetic NCCL rows at 16-512 MiB with the given bus bandwidth (B/s) per group size."""
    import pandas as pd
    rows = []
    for g, bw in busbw_by_g.items():
        for b in 2.0 ** np.arange(24, 30):
            rows.append(dict(chip=chip, num_gpus=float(g), bytes=b,
                             latency_s=2 * (g - 1) / g * b / bw))
    return pd.DataFrame(rows)


def test_host_staged_rule_flags_a_collapse_the_topology_does_not_explain():
    pytest.importorskip("pandas")
    import pandas as pd

    from dse.calibration.kernels import comm
    # an L40S-like box: P2P pairs at 20 GB/s, 4 and 8 GPUs staged through the host
    bad = _nccl_frame("l40s", {2: 20e9, 4: 5.1e9, 8: 1.45e9})
    # an RTX PRO 6000-like PCIe box with P2P: 38 -> 24 GB/s, the ring's normal decline
    ok = _nccl_frame("rtx-pro-6000", {2: 38e9, 4: 25e9, 8: 24e9})
    assert comm.host_staged(pd.concat([bad, ok])) == {"l40s": [4.0, 8.0]}
    # just above the threshold is kept, just below is flagged
    edge = _nccl_frame("x", {2: 10e9, 4: 4.1e9, 8: 3.9e9})
    assert comm.host_staged(edge) == {"x": [8.0]}


def test_host_staged_chip_takes_group_terms_from_its_fabric():
    """The catalog's L40S entries: 4-/8-GPU rows not fitted, group-size terms equal to the
    RTX PRO 6000's (the other pcie-8 chip), and a ring of 8 over PCIe Gen4 no slower than
    ~3x a pair (the host-staged table had it 14x slower in bus bandwidth)."""
    from dse.calibration.kernels import comm
    cat = comm.catalog_entries()
    for rt in ("trtllm", "sglang", "vllm"):
        e, donor = cat["l40s"][rt], cat["rtx-pro-6000"][rt]
        assert "host-staged" in e["fitted_on"] and "rtx-pro-6000" in e["fitted_on"]
        for k in ("ar_nccl_latency_per_log2_s", "ar_nccl_fraction_per_doubling"):
            assert e[k] == pytest.approx(donor[k], rel=1e-5), (rt, k)
        ar = {k: e[k] for k in kc.AR_NCCL_KEYS + kc.AR_CUSTOM_KEYS}
        b = 2.0 ** 28
        bus = {g: 2 * (g - 1) / g * b / kc.allreduce_s(b, g, 32e9, **ar) for g in (2, 8)}
        assert 0.3 < bus[8] / bus[2] < 1.0
        assert 15e9 < bus[2] < 25e9          # PCIe Gen4 x16 P2P, as measured for 2 GPUs


def test_comm_entries_carry_uncertainty_for_every_family():
    from dse.calibration.kernels import comm
    cat = comm.catalog_entries()
    for chip, rts in cat.items():
        for rt, e in rts.items():
            unc = e["uncertainty"]
            assert set(unc) == set(comm.FAMILIES), (chip, rt)
            for fam, u in unc.items():
                n = len(comm.FAMILIES[fam])
                assert u["params"] == list(comm.FAMILIES[fam])
                sd = np.array(u["log_sd"])
                c = np.array(u["log_corr"])
                assert sd.shape == (n,) and c.shape == (n, n)
                assert np.all(sd > 0) and np.all(np.isfinite(sd)), (chip, rt, fam)
                assert np.allclose(np.diag(c), 1.0) and np.allclose(c, c.T)
                assert u["rule"].startswith(("fitted", "transferred"))
    # a transferred entry is at least as uncertain as the LOCO inflation it names
    u = cat["mi300x"]["trtllm"]["uncertainty"]["ar_nccl"]
    assert u["rule"].startswith("transferred")
    loco = float(u["rule"].split("ln(")[1].split(")")[0])
    assert min(u["log_sd"]) >= np.log(loco) - 1e-9
    # a measured chip's fitted fraction is pinned far tighter than a transfer
    f = cat["h100-sxm"]["trtllm"]["uncertainty"]["ar_nccl"]
    assert f["rule"].startswith("fitted")
    assert f["log_sd"][f["params"].index("ar_nccl_fraction")] < 0.1


def test_entry_uncertainty_transferred_terms_inside_a_fitted_family():
    from dse.calibration.kernels import comm
    names = list(comm.NCCL_PARAMS)
    fitted = [p.name for p in names if p.name not in comm.GROUP_PARAMS]
    cov_own = np.diag(np.full(len(fitted), 0.01 ** 2))
    cov_donor = np.diag(np.full(len(names), 0.05 ** 2))
    fits = {"cov": {("nccl", "l40s", None): (fitted, cov_own),
                    ("nccl", "rtx-pro-6000", None): ([p.name for p in names], cov_donor)}}
    u = comm.entry_uncertainty("l40s", "trtllm", fits, {"ar_nccl": 1.2})["ar_nccl"]
    sd = dict(zip(u["params"], u["log_sd"]))
    assert sd["ar_nccl_fraction"] == pytest.approx(0.01)
    # donors' variance + ln(1.2)^2, by hand: sqrt(0.05^2 + 0.1823^2) = 0.18904
    assert sd["ar_nccl_fraction_per_doubling"] == pytest.approx(
        np.sqrt(0.05 ** 2 + np.log(1.2) ** 2), rel=1e-3)
    assert "transferred" in u["rule"]


def test_alltoall_issue_rate_terms_by_hand():
    """Docstring of kernel_comm.alltoall_rate_s: h = 7168 bf16, top-8 of 256, one node of 8:
    1 + 7 p_rank = 5.633 messages a token (normal, 20 ns each: 112.7 ns); ll at 1 GB/s an
    expert: 7168 x 2 x 8 / 256e9 = 448 ns a token, 32x that with 8 experts."""
    miss = np.prod([(224 - i) / (256 - i) for i in range(8)])
    up, out = kc.alltoall_bytes(1.0, 7168, 8, 256, 8, 8, 2.0, "normal")
    t = kc.alltoall_rate_s(7168, 8, 256, 2.0, up, out, kind="normal", message_s=20e-9)
    assert t == pytest.approx((1 + 7 * (1 - miss)) * 20e-9, rel=1e-12)
    assert t == pytest.approx(112.7e-9, rel=1e-3)
    ll = [kc.alltoall_rate_s(7168, 8, e, 2.0, 0.0, 0.0, kind="ll", expert_bytes_per_s=1e9)
          for e in (256, 8)]
    assert ll[0] == pytest.approx(448e-9, rel=1e-12) and ll[1] == pytest.approx(32 * ll[0])
    # in series with the link term, per token; the defaults are "no such term"
    kw = dict(hidden=7168, topk=8, experts=256, ep=8, ranks_per_node=8, elem_bytes=2.0,
              scaleup_bw_bytes_per_s=W, scaleout_bw_bytes_per_s=50e9, latency_s=3e-5,
              fraction=0.5, **OUT)
    for kind, extra in (("normal", dict(message_s=20e-9)), ("ll", dict(expert_bytes_per_s=1e9))):
        base = kc.alltoall_s(1024, kind=kind, **kw)
        with_rate = kc.alltoall_s(1024, kind=kind, **kw, **extra)
        per_tok = t if kind == "normal" else ll[0]
        assert with_rate - base == pytest.approx(1024 * per_tok, rel=1e-9)


@pytest.mark.parametrize("kind,name,value", [("normal", "message_s", 20e-9),
                                             ("ll", "expert_bytes_per_s", 5e9)])
def test_each_alltoall_rate_parameter_matters(kind, name, value):
    kw = dict(hidden=7168, topk=8, experts=256, ep=8, ranks_per_node=8, elem_bytes=1.0,
              scaleup_bw_bytes_per_s=W, scaleout_bw_bytes_per_s=50e9, latency_s=3e-5,
              fraction=0.5, kind=kind, **OUT)
    tokens = np.array([1, 64, 1024, 16384.])
    ref = kc.alltoall_s(tokens, **kw, **{name: value})
    new = kc.alltoall_s(tokens, **kw, **{name: value * 1.2})
    assert np.max(np.abs(new / ref - 1)) > 0.01


def test_alltoall_latency_donors_share_the_fabric():
    """The all-to-all latencies transfer from chips on the same default topology (an HGX
    board's from HGX boards, an NVL72 rack's from NVL72 racks), the general rule when none."""
    pytest.importorskip("pandas")
    from dse.calibration.kernels.comm import same_fabric
    from dse.catalog import accelerators
    accs = accelerators()
    measured = ["b200", "b300", "gb200", "gb300", "h100-sxm", "h200-sxm"]
    assert same_fabric("b200", measured, accs) == ["b300", "h100-sxm", "h200-sxm"]
    assert same_fabric("gb300", measured, accs) == ["gb200"]
    assert same_fabric("mi300x", measured, accs) == sorted(measured)


def test_trtllm_deepep_rows_on_nvl72_are_their_own_runtime():
    pytest.importorskip("aiconfigurator_core")
    from dse.calibration.kernels import comm
    a = comm.a2a_rows()
    nvl = a[a["chip"].isin(comm.NVLINK_CHIPS)]
    assert not (nvl["runtime"] == "trtllm").any()
    assert (nvl["runtime"] == comm.DEEPEP_RT).sum() > 100
    # the low-latency tables of SGLang sweep the expert count; TensorRT-LLM's do not
    ll = a[(a["kind"] == "ll") & (a["phase"] == "dispatch")]
    n = ll.groupby("runtime")["experts"].nunique()
    assert n["sglang"] >= comm.MIN_EXPERT_COUNTS > n["trtllm"]


def test_allreduce_across_four_domains_by_hand():
    # 32 ranks in 4 domains of 8: each rank's inter-domain ring all-reduce of its B / 8 share
    # over 4 domains moves 2 x 3/4 of it on the NICs (50 GB/s x 0.9), and the latency adds 2 x
    # log2(4) scale-out hops of 10 us; NCCL's in-domain branches take the rest
    spans = kc.allreduce_s(1e8, 32, W, domain_chips=8, scaleout_bw_bytes_per_s=50e9,
                           **NCCL, **CUSTOM, **OUT)
    extra = 2 * 2 * 1e-5 + 2 * 3 / 4 * (1e8 / 8) / (50e9 * 0.9)
    nccl8 = kc.allreduce_s(1e8, 8, W, custom=False, **NCCL)
    assert spans == pytest.approx(nccl8 + extra, rel=1e-9)
    # the custom (one-shot, two-shot) kernels run inside one domain only: off across domains
    lat, _ = kc.allreduce_branches(np.array([8.0, 16.0]), W, domain_chips=8,
                                   scaleout_bw_bytes_per_s=50e9, **NCCL, **CUSTOM, **OUT)
    assert np.all(np.isfinite(lat[:, 0])) and np.all(np.isfinite(lat[:2, 1]))
    assert np.all(np.isinf(lat[2:, 1]))


@pytest.mark.parametrize("kind", ["ll", "normal"])
def test_one_expert_rank_sends_no_dispatch_bytes(kind):
    # ep = 1: every expert is on the token's own rank, no copy leaves it (scale-up or out)
    up, out = kc.alltoall_bytes(128, 7168, 8, 256, 1, 8, kc.FP8_ELEM_BYTES, kind)
    assert float(up) == 0.0 and float(out) == 0.0
