"""The worked questions of the serving mechanisms (issue 11): each answers from the model, and
its headline numbers obey the mechanism's properties."""

from __future__ import annotations

import pytest


def test_rack_goodput_never_exceeds_saturation(answered):
    _, n = answered("rack-goodput")
    assert 0 < n["goodput_requests_per_s_per_rack"] <= n["saturation_requests_per_s_per_rack"]
    assert n["usd_per_mtok_at_goodput"] > 0


def test_redundant_experts_never_matter_under_perfect_balance_and_help_under_imbalance(answered):
    from dse import catalog
    from dse.perf.imbalance import published_imbalance
    out, n = answered("eplb-ep72")
    g = n["by_imbalance"]
    # balanced: the optimum is no extra slot, and 32 slots are the spares EP 72 leaves anyway
    # (256 experts on 72 ranks: 4 slots per rank, 288 per layer)
    assert g["1"]["best_slots"] == 0 and g["1"]["cut_best"] == pytest.approx(1.0)
    assert g["1"]["usd_per_mtok_published_slots"] == pytest.approx(g["1"]["usd_per_mtok_no_slots"])
    assert g["1"]["best_replicas_per_layer"] == 32
    # at imbalance 2 they help: the same design at the same concurrency steps faster with the
    # slots (the busiest rank's routed tokens shrink), while under balance they only add weight
    # reads. Whether that buys a cheaper price on the question's coarse concurrency grid is a
    # knife-edge (the answer's band; 33 slots at imbalance 2 before the 2026-12-03 refit)
    assert g["2"]["cut_best"] >= 1.0
    d = {"accelerator.id": "gb200", "topology.id": "nvl72", "model.id": "deepseek-v3",
         "model.weight_dtype": "fp8", "layout.dp": 72, "layout.ep": 72, "workload.isl": 2048,
         "workload.osl": 1024, "workload.concurrency": 1722,
         # the front end scaled out as in the question's space: one process would stream 1722
         # answers at 32.6 us per token each, a 56 ms TPOT floor the slots cannot move
         "serving.frontend_processes": 72}
    import pandas as pd

    import dse
    t = dse.score(pd.DataFrame([{**d, "serving.expert_imbalance": imb,
                                 "serving.redundant_experts": slots}
                                for imb in (1.0, 2.0) for slots in (0, 33)]))["tpot_s"].to_numpy()
    assert t[3] < t[2] * 0.99                         # imbalance 2: 33 slots step >= 1% faster
    assert t[1] >= t[0]                               # balanced: they cost weight reads only
    # the published routing model's imbalance at EP 72, and the published default slot count
    pub = float(published_imbalance(72.0, 256.0, catalog.expert_load_cv()))
    assert n["published_imbalance"] == pytest.approx(pub) and 1.3 < pub < 1.45
    assert g["published"]["imbalance"] == pytest.approx(pub)
    assert n["published_redundant_experts"] == 32
    for v in g.values():                              # the optimum is never beaten
        assert v["usd_per_mtok_best"] <= v["usd_per_mtok_no_slots"] * (1 + 1e-12)
        assert v["usd_per_mtok_best"] <= v["usd_per_mtok_published_slots"] * (1 + 1e-12)
    readme = (out / "README.md").read_text()
    assert "the published default of 32 redundant experts costs" in readme
    assert "https://arxiv.org/abs/2412.19437" in readme and "| 33..96 | 360 | 5 | 104 |" in readme
    assert (out / "eplb-slots.png").read_bytes()[:4] == b"\x89PNG"
    from dse.build.space import load_space
    from dse.questions.answer import QUESTIONS_DIR
    sp = load_space(str(QUESTIONS_DIR / "eplb-ep72.toml"))
    red = next(p for p in sp.parameters if p.path == "serving.redundant_experts")
    assert list(red.values) == list(range(97))        # every count 0..96


def test_a_host_tier_never_makes_a_design_that_fits_more_expensive(answered):
    _, n = answered("kv-tiers")
    assert all(v is None or v >= 1.0 - 1e-9 for v in n["tier_worth"].values())


def test_kv_tiers_draws_the_memory_wall_and_where_each_tier_stops_helping(answered):
    out, n = answered("kv-tiers")
    assert (out / "kv-tiers-wall.png").read_bytes()[:4] == b"\x89PNG"
    readme = (out / "README.md").read_text()
    assert "## The memory wall: cost per token by context" in readme
    assert "## Where each tier pays, fills and stops helping" in readme
    per = n["usd_per_mtok_request"]
    contexts = sorted({int(k.split("/")[1]) for k in per})
    assert len(contexts) == 16 and contexts[0] == 4096 and contexts[-1] == 131072
    for acc, tiers in n["tiers"].items():
        for mode, st in tiers.items():
            # a tier never costs more than no tier, at any context
            for c in contexts:
                p = per[f"{acc}/{c}"]
                assert p[mode] <= p["none"] * (1 + 1e-9), (acc, mode, c)
            # where the tier pays, it is worth more than 1; where it is full, its worth falls
            assert st["pays_from"] is not None
            w = {c: per[f"{acc}/{c}"]["none"] / per[f"{acc}/{c}"][mode] for c in contexts}
            assert w[st["pays_from"]] > 1.001
            if st["stops_helping"] is not None:
                after = [w[c] for c in contexts if c > st["stops_helping"]]
                assert after and after[-1] < st["peak_worth"]
        # the host tier (hundreds of GB per chip) fills within 128k prompts, NVMe (3.84 TB) not
        assert tiers["host"]["stops_helping"] is not None and tiers["ssd"]["stops_helping"] is None
        # ... as the catalog's bytes say: 8 chips x tier bytes / (256 x 0.6 x KV bytes per token)
        from dse import catalog
        t = catalog.memory_tiers()[acc]
        kv = 80 * 8 * 128 * 2 * 1.0                       # Llama 3.1 70B, fp8 KV
        assert tiers["host"]["fills_at_tokens"] == pytest.approx(
            8 * t["host_memory_bytes"] / (256 * 0.6 * kv), rel=1e-9)
        assert tiers["ssd"]["fills_at_tokens"] == pytest.approx(
            8 * t["ssd_bytes"] / (256 * 0.6 * kv), rel=1e-9)
        # a tier is full only past the context its bytes alone hold (free HBM holds more)
        assert tiers["host"]["stops_helping"] > tiers["host"]["fills_at_tokens"]
    assert n["kv_dtype"] == "fp8 (1 B per element)"


@pytest.mark.parametrize("name", ["rack-goodput", "eplb-ep72", "kv-tiers", "fast-mode-mtp"])
def test_first_lines_lead_with_the_headline_number(answered, name):
    from helpers import check_first_lines
    check_first_lines(answered(name)[0])


def test_fast_mode_mtp_gives_the_price_and_speed_with_and_without_speculation(answered):
    import numpy as np

    from dse.build.space import load_space
    from dse.perf import score, spec
    from dse.questions.answer import QUESTIONS_DIR
    out, n = answered("fast-mode-mtp")
    s = n["speculation"]
    fast = n["fast"]
    k = s["draft_tokens_fast"]
    assert 1 <= k <= 3
    assert s["fast_usd_per_mtok_with"] == fast["usd_per_mtok_output"]
    assert s["fast_tokens_per_s_per_user_with"] == fast["output_tokens_per_s_per_user"]
    off = s["by_draft_tokens"]["0"]
    assert s["fast_usd_per_mtok_without"] == off["fast"]["usd_per_mtok_output"]
    assert s["price_cut_fast"] == pytest.approx(s["fast_usd_per_mtok_without"]
                                                / s["fast_usd_per_mtok_with"])
    assert s["price_cut_fast"] > 1.0 and off["tokens_per_step_fast"] == 1.0
    # each speed target is met: 2.5x its own baseline's tokens/s per user
    for row in s["by_draft_tokens"].values():
        if row["fast"] is not None:
            assert row["fast"]["output_tokens_per_s_per_user"] >= \
                2.5 * row["baseline"]["output_tokens_per_s_per_user"] * (1 - 1e-12)
    # at the chosen draft count the tokens per verification step are (1 - a^(k+1)) / (1 - a)
    assert s["by_draft_tokens"][str(k)]["tokens_per_step_fast"] == pytest.approx(
        spec.expected_tokens(0.85, k), rel=1e-12)
    # the numbers are the named designs' scores, with and without speculation
    space = load_space(str(QUESTIONS_DIR / "fast-mode-mtp.toml"))
    ids = np.array([fast["design_id"], off["fast"]["design_id"]])
    b, _ = space.batch(ids)
    m = score(b)
    assert m["usd_per_mtok_output"] == pytest.approx(
        [s["fast_usd_per_mtok_with"], s["fast_usd_per_mtok_without"]], rel=1e-9)
    assert m["output_tokens_per_s_per_user"] == pytest.approx(
        [s["fast_tokens_per_s_per_user_with"], s["fast_tokens_per_s_per_user_without"]],
        rel=1e-9)
    assert space.values_at(ids)["serving.spec_tokens"].tolist() == [k, 0]
    readme = (out / "README.md").read_text()
    assert (f"Without speculative decoding the 2.5x fast mode costs "
            f"${s['fast_usd_per_mtok_without']:.3f}/Mtok at "
            f"{s['fast_tokens_per_s_per_user_without']:.1f} tokens/s per user") in readme
    if s["same_speed_usd_per_mtok_without"] is not None:
        # "same" is the cheapest design without speculation at the with-speculation fast mode's
        # speed v; the fast mode without it is the cheapest at 2.5x its own baseline. Where v
        # is at least that target, the fast mode without speculation is the cheaper; where v is
        # at most its speed, it is one of the candidates for "same" (each baseline picks its
        # own design, so v may fall on either side of the target)
        v = s["fast_tokens_per_s_per_user_with"]
        if v >= 2.5 * s["baseline_tokens_per_s_per_user_without"] * (1 + 1e-12):
            assert s["same_speed_usd_per_mtok_without"] >= \
                s["fast_usd_per_mtok_without"] * (1 - 1e-12)
        if v <= s["fast_tokens_per_s_per_user_without"] * (1 - 1e-12):
            assert s["same_speed_usd_per_mtok_without"] <= \
                s["fast_usd_per_mtok_without"] * (1 + 1e-12)
