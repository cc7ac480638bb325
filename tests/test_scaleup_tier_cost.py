"""A scale-up domain larger than a rack pays for a second switch tier (cost_model.toml
[scaleup_tier]): worked by hand from the design's own inputs, so a refit of prices still holds."""

import math

import pandas as pd
import pytest

import dse
from dse import catalog


def _frame(domains, **extra):
    n = len(domains)
    cols = {"accelerator.id": ["gb200"] * n, "topology.id": ["nvl72"] * n,
            "topology.scaleup.domain_chips": list(domains), "model.id": ["llama-3.1-70b"] * n,
            "workload.isl": [1024] * n, "workload.osl": [1024] * n,
            "workload.concurrency": [64] * n}
    cols.update({k: [v] * n for k, v in extra.items()})
    return pd.DataFrame(cols)


def test_a_multi_rack_domain_adds_the_tier_price_per_800g_of_scaleup_bandwidth():
    """GB200: 900 GB/s per direction = 7.2 Tb/s = 9 units of 800 Gb/s. Ownership cost per
    chip-hour grows by 9 x usd_per_800g / (4 years x 8766 h) + 9 x w_per_800g x PUE x $/kWh / 1000;
    a domain of one rack (72 = rack_chips) pays nothing extra; speed is unchanged."""
    acc = catalog.accelerators()["gb200"]
    tier = catalog.cost_model()["scaleup_tier"]
    units = acc.scaleup_link_bw_bytes_per_s * 8 / 800e9
    assert units == pytest.approx(9.0)
    out = dse.score(_frame([72, 144, 576]))
    years, pue, kwh = 4.0, 1.3, 0.08                     # fields.py defaults
    extra = units * tier["usd_per_800g"] / (years * 8766.0) \
        + units * tier["w_per_800g"] * pue * kwh / 1000.0
    d = out["usd_per_chip_hour"].to_numpy()
    assert d[1] - d[0] == pytest.approx(extra, rel=1e-5)
    assert d[2] == pytest.approx(d[1], rel=1e-9)
    assert (out["tpot_s"].to_numpy() == out["tpot_s"].iloc[0]).all()


def test_the_tier_price_is_a_setting_and_zero_turns_it_off():
    base = dse.score(_frame([72]))["usd_per_chip_hour"].iloc[0]
    off = dse.score(_frame([144], **{"cost.scaleup_tier_usd_per_800g": 0.0,
                                     "cost.scaleup_tier_w_per_800g": 0.0}))
    assert off["usd_per_chip_hour"].iloc[0] == pytest.approx(base, rel=1e-9)
    half = dse.score(_frame([144], **{"cost.scaleup_tier_usd_per_800g": 4375.0,
                                      "cost.scaleup_tier_w_per_800g": 0.0}))
    assert half["usd_per_chip_hour"].iloc[0] - base == pytest.approx(
        9 * 4375.0 / (4 * 8766.0), rel=1e-5)
    assert not math.isnan(half["usd_per_mtok_output"].iloc[0])
