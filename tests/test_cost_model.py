"""Component cost model: hypothetical chips priced by how far their specs move from a catalog chip."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import ROOT, batch, design

from dse import catalog
from dse.build.space import load_space

SHARES = catalog.cost_model()


def _cap_power(**kw):
    b = batch(design("b200", **{"cost.capex_model": "components", **kw}))
    return float(b.capex_usd[0]), float(b.power_w[0])


def test_shares_sum_to_one():
    for part in ("capex", "power"):
        assert sum(SHARES[part].values()) == pytest.approx(1.0)


def test_catalog_chip_keeps_its_catalog_price():
    acc = catalog.lookup("accelerators", "b200")
    assert _cap_power() == pytest.approx((acc.price.capex_usd, acc.price.all_in_power_w))
    b = batch(design("b200", **{"accelerator.hbm_bw_bytes_per_s": 12e12}))   # catalog mode
    assert b.capex_usd[0] == acc.price.capex_usd


@pytest.mark.parametrize("path,key,factor", [
    ("accelerator.hbm_bw_bytes_per_s", "hbm_bandwidth", 1.5),
    ("accelerator.hbm_capacity_bytes", "hbm_capacity", 2.0),
    ("accelerator.scaleup_link_bw_bytes_per_s", "scaleup", 2.0),
    ("accelerator.peak_flops_per_s.fp4", "compute", 2.0),
])
def test_a_component_costs_its_share(path, key, factor):
    acc = catalog.lookup("accelerators", "b200")
    base = {"accelerator.hbm_bw_bytes_per_s": acc.hbm_bw_bytes_per_s,
            "accelerator.hbm_capacity_bytes": acc.hbm_capacity_bytes,
            "accelerator.scaleup_link_bw_bytes_per_s": acc.scaleup_link_bw_bytes_per_s,
            "accelerator.peak_flops_per_s.fp4": acc.peak_flops_per_s.fp4}[path]
    capex, power = _cap_power(**{path: base * factor})
    assert capex == pytest.approx(acc.price.capex_usd * (1 + SHARES["capex"][key] * (factor - 1)))
    assert power == pytest.approx(acc.price.all_in_power_w
                                  * (1 + SHARES["power"][key] * (factor - 1)))


def test_space_scale_factors_and_whatif_overrides_are_priced(tmp_path):
    src = (ROOT / "spaces" / "hypothetical-accelerator.toml").read_text()
    space = load_space(str(ROOT / "spaces" / "hypothetical-accelerator.toml"))
    assert "capex_model" in src
    p = next(p for p in space.parameters if p.path == "accelerator.hbm_bw_bytes_per_s")
    vals = {q.path: np.repeat(np.asarray(q.values[:1], dtype=float), len(p.values))
            for q in space.parameters}
    vals[p.path] = np.asarray(p.values, dtype=float)
    b, _ = space.batch_from_values(vals)
    capex = np.broadcast_to(b.capex_usd, (len(p.values),))
    # every other knob at its first value (0.5x): their shares are the same in every row
    np.testing.assert_allclose(np.diff(capex) / np.diff(p.values),
                               SHARES["capex"]["hbm_bandwidth"] * 75000.0)
    b2, _ = space.batch_from_values(vals, {"accelerator.hbm_bw_bytes_per_s": ("scale", 2.0)})
    np.testing.assert_allclose(np.broadcast_to(b2.capex_usd, (len(p.values),)) - capex,
                               SHARES["capex"]["hbm_bandwidth"] * 75000.0 * np.asarray(p.values))


def test_unknown_capex_model_is_an_input_error():
    from dse.errors import InputError
    with pytest.raises(InputError, match="cost.capex_model"):
        batch(design("b200", **{"cost.capex_model": "bom"}))
