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
    assert g["2"]["cut_best"] > 1.05                  # at imbalance 2 they pay
    assert g["2"]["best_replicas_per_layer"] == 5 * 72 - 256 and g["2"]["best_slots"] == 33
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
    from dse.space import load_space
    from dse.questions import QUESTIONS_DIR
    sp = load_space(str(QUESTIONS_DIR / "eplb-ep72.toml"))
    red = next(p for p in sp.parameters if p.path == "serving.redundant_experts")
    assert list(red.values) == list(range(97))        # every count 0..96


def test_a_host_tier_never_makes_a_design_that_fits_more_expensive(answered):
    _, n = answered("kv-tiers")
    assert all(v is None or v >= 1.0 - 1e-9 for v in n["tier_worth"].values())


@pytest.mark.parametrize("name", ["rack-goodput", "eplb-ep72", "kv-tiers"])
def test_first_lines_lead_with_the_headline_number(answered, name):
    from helpers import check_first_lines
    check_first_lines(answered(name)[0])
