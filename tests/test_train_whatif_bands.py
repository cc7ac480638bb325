"""Bands of ``dse whatif`` and ``dse compare`` on training runs: the changes re-scored under
samples of the training fit's covariance and the kernel fits' (``dse.scoring.train_bands``),
through the same code as serving's (``dse.results.bands_report``), in the Python API result,
the terminal and the page."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import run_cli

import dse
from dse.results import bands_report
from dse.scoring import train_bands as TB

SPACE = """
task = "train"
name = "small-train-bands"
[training]
tokens = 1e12
global_batch_seqs = 512
seq_len = 4096
[model]
id = "llama-3.1-70b"
[accelerator]
id = "h100-sxm"
[parameters]
"accelerator.id" = ["h100-sxm", "b200"]
"layout.tp" = [2, 4, 8]
"layout.pp" = [1, 2, 4]
"layout.dp" = [8, 16, 32]
"layout.recompute" = ["none", "selective", "full"]
[objectives]
train_time_s = "minimize"
train_cost_usd = "minimize"
[constraints]
step_time_s = { max = 30.0 }
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("trainbands")
    a, b = d / "a.toml", d / "b.toml"
    a.write_text(SPACE)
    b.write_text(SPACE.replace('"layout.pp" = [1, 2, 4]', '"layout.pp" = [1, 2, 4, 8]'))
    return (dse.run(str(a), out=d / "ra", progress=False),
            dse.run(str(b), out=d / "rb", progress=False))


def test_whatif_band_contains_the_nominal_change(runs, tmp_path):
    a, _ = runs
    w = dse.whatif(a, scale={"accelerator.peak_flops_per_s": 2.0}, bands=16, seed=1,
                   out=tmp_path / "wi")
    assert w.bands is not None and w.bands["samples"] == 16
    r = w.rescored
    for m in ("train_time_s", "train_cost_usd"):
        ch, lo, hi = (r[f"{m}_change{s}"].to_numpy(float) for s in ("", "_lo", "_hi"))
        assert (ch < 0).all()                               # twice the FLOP/s: faster, cheaper
        assert (lo <= ch + 1e-9).all() and (ch <= hi + 1e-9).all()
        assert (hi - lo > 1e-4).any()                       # the compute fraction moves it
        b = w.bands["objectives"][m]["median_change"]
        assert b["lo"] <= float(np.median(ch)) <= b["hi"]
        # the training fit's group is named among what moves it
        assert "train" in w.bands["objectives"][m]["groups"]
    assert "training fit" in w.bands["note"]
    assert any("90% band" in h and "training fit" in h for h in w.headline)
    page = (tmp_path / "wi" / "whatif.md").read_text()
    assert "## Uncertainty bands (16 parameter samples, seed 1" in page
    assert json.loads((tmp_path / "wi" / "bands.json").read_text())["samples"] == 16


def test_seeded_band_is_reproducible(runs, tmp_path):
    a, _ = runs
    one, two, other = (dse.whatif(a, scale={"topology.scaleout.link_bw_bytes_per_s": 0.5},
                                  bands=8, seed=s, out=tmp_path / f"w{i}")
                       for i, s in enumerate((5, 5, 6)))
    cols = [c for c in one.rescored.columns if c.endswith(("_lo", "_hi"))]
    assert cols
    assert one.rescored[cols].equals(two.rescored[cols])
    assert one.bands["objectives"] == two.bands["objectives"]
    assert not one.rescored[cols].equals(other.rescored[cols])


def test_a_change_with_no_effect_has_a_zero_width_band(runs, tmp_path, capsys):
    a, _ = runs
    # the price moves the cost by exactly its factor and the time not at all, in every sample
    rc, out, err = run_cli(capsys, "whatif", a.path, "--scale",
                           "accelerator.price_usd_per_hour=2", "--bands", "8",
                           "--out", tmp_path / "wi")
    assert rc == 0, err
    w = dse.whatif(a, scale={"accelerator.price_usd_per_hour": 2.0}, bands=8,
                   out=tmp_path / "wi2")
    r = w.rescored
    assert np.allclose(r[["train_time_s_change_lo", "train_time_s_change_hi"]], 0.0, atol=1e-12)
    assert np.allclose(r[["train_cost_usd_change_lo", "train_cost_usd_change_hi"]], 1.0,
                       atol=1e-9)
    b = w.bands["objectives"]["train_time_s"]["median_change"]
    assert b["lo"] == b["hi"] == 0.0
    assert "90% band +0.0%..+0.0%" in out and "Uncertainty bands (8 parameter samples" in out


def test_bands_off_on_a_training_whatif(runs, tmp_path):
    a, _ = runs
    w = dse.whatif(a, scale={"accelerator.peak_flops_per_s": 2.0}, bands=0, out=tmp_path / "w")
    assert w.bands is None and "train_time_s_change_lo" not in w.rescored
    assert all("bands off" in h for h in w.headline)


def test_compare_training_runs_has_bands(runs, tmp_path, capsys):
    a, b = runs
    c = dse.compare(a, b, bands=8, seed=2)
    assert c.bands is not None and c.bands["samples"] == 8
    t = c.bands["objectives"]["train_time_s"]
    assert t["a"]["lo"] <= t["a"]["run_value"] <= t["a"]["hi"]
    assert 0.0 <= t["p_a_better"] <= 1.0
    assert "training fit" in c.bands["note"]
    rc, out, err = run_cli(capsys, "compare", a.path, b.path, "--bands", "8", "--out",
                           tmp_path / "cmp")
    assert rc == 0, err
    assert "P(A better)" in out and "training fit" in out


def test_training_draw_sets_are_the_full_draw_with_the_other_groups_held():
    k = 4
    _, d = TB.draw_sets(k, 3, [TB.GROUPS, ("train",), ("gemm", "comm")])
    full = TB.draw(k, 3)
    assert np.array_equal(d.train[:k], full.train)
    for chip, keys in full.kernel.items():
        for key, f in keys.items():
            assert np.array_equal(d.kernel[chip][key][:k], f)
    assert np.array_equal(d.train[k:2 * k], full.train)            # the training fit alone
    assert all(np.all(v[k:2 * k] == 1.0) for c in d.kernel.values() for v in c.values())
    assert np.all(d.train[2 * k:] == 1.0)                            # kernels only
    groups, dg = TB.draw_groups(k, 3)
    assert groups == TB.GROUPS and dg.n == k * len(TB.GROUPS)
    with pytest.raises(ValueError):
        TB.draw_sets(k, 3, [("nope",)])


def test_the_sampler_follows_the_task(runs):
    a, _ = runs
    assert bands_report.sampler(a.space) is bands_report.TRAINING
    assert bands_report.GROUP_NAMES["train"] == TB.GROUP_NAMES["train"]
