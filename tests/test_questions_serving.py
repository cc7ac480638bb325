"""The worked questions of the serving mechanisms (issue 11): each answers from the model, and
its headline numbers obey the mechanism's properties."""

from __future__ import annotations

import pytest


def test_rack_goodput_never_exceeds_saturation(answered):
    _, n = answered("rack-goodput")
    assert 0 < n["goodput_requests_per_s_per_rack"] <= n["saturation_requests_per_s_per_rack"]
    assert n["usd_per_mtok_at_goodput"] > 0


def test_redundant_experts_never_matter_under_perfect_balance_and_help_under_imbalance(answered):
    _, n = answered("eplb-ep72")
    g = n["by_imbalance_and_slots"]
    assert g["1/32"] == pytest.approx(1.0)        # 32 slots are the spares ep 72 leaves anyway
    assert g["1/144"] <= 1.0                      # slots cost HBM, buy nothing when balanced
    assert max(g["2/72"], g["2/144"]) > 1.05      # at imbalance 2 they pay


def test_a_host_tier_never_makes_a_design_that_fits_more_expensive(answered):
    _, n = answered("kv-tiers")
    assert all(v is None or v >= 1.0 - 1e-9 for v in n["tier_worth"].values())


@pytest.mark.parametrize("name", ["rack-goodput", "eplb-ep72", "kv-tiers"])
def test_first_lines_lead_with_the_headline_number(answered, name):
    from helpers import check_first_lines
    check_first_lines(answered(name)[0])
