"""Worked training questions (spaces/questions/train-*.toml, dse/questions/train_*.py) on tiny
versions of their spaces, and the training bands (dse.scoring.train_bands, the training fit's
uncertainty of dse.calibration.train_fit)."""

from __future__ import annotations

import json
import re
import tomllib

import numpy as np
import pandas as pd
import pytest
from helpers import ROOT

from dse.build.space import load_space
from dse.calibration import train_fit
from dse.catalog import training as tcat
from dse.errors import InputError
from dse.questions import (
    train_chip_cost,
    train_common,
    train_dp_batch,
    train_hw_value,
    train_moe_1t,
    train_nvl72_moe,
)
from dse.questions.answer import answer_space
from dse.questions.context import Context
from dse.scoring import train_bands as TB
from dse.scoring import train_space

QUESTIONS = ROOT / "spaces" / "questions"


def tiny(tmp_path, name: str, params: str, answer_extra: str = "") -> object:
    """The question's space with its [parameters] replaced by ``params`` (TOML lines)."""
    text = (QUESTIONS / f"{name}.toml").read_text()
    text = re.sub(r"(?ms)^\[parameters\]\n.*?(?=^\[)", "[parameters]\n" + params + "\n\n", text)
    if answer_extra:
        text = text.rstrip() + "\n" + answer_extra + "\n"
    p = tmp_path / f"{name}.toml"
    p.write_text(text)
    return load_space(str(p))


def context(space, tmp_path, sample=None) -> Context:
    return Context(space, tmp_path, tmp_path, dict(space.answer or {}), pd.DataFrame(), sample)


def answer(mod, space, tmp_path, sample=None):
    spec = {k: v for k, v in (space.answer or {}).items() if k != "analysis"}
    ctx = Context(space, tmp_path, tmp_path, spec, pd.DataFrame(), sample)
    return mod.answer(ctx)


# ---------------------------------------------------------------- the question files

def test_every_training_question_loads_with_its_analysis():
    names = sorted(p.stem for p in QUESTIONS.glob("train-*.toml"))
    assert names == ["train-chip-cost", "train-dp-batch", "train-hw-value", "train-moe-1t",
                     "train-nvl72-moe"]
    for n in names:
        sp = load_space(str(QUESTIONS / f"{n}.toml"))
        assert sp.task == "train" and sp.answer["analysis"] == n
        assert sp.question.strip() and 0 < sp.size <= 2000      # answers in minutes


def test_training_space_answer_table_is_checked(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text((QUESTIONS / "train-moe-1t.toml").read_text().replace(
        'analysis = "train-moe-1t"', 'analysis = 3'))
    with pytest.raises(InputError):
        load_space(str(p))


# ---------------------------------------------------------------- (a) NVL72 vs 8-GPU nodes

def test_nvl72_worth_where_ep_crosses_the_node(tmp_path):
    sp = tiny(tmp_path, "train-nvl72-moe", '"topology.id" = ["hgx-8", "nvl72"]\n'
              '"layout.ep" = [8, 64]\n"layout.pp" = [8]')
    a = answer(train_nvl72_moe, sp, tmp_path)
    n = a.numbers
    # ep = 8 stays in an 8-GPU node: the rack changes nothing but the pipeline/DP links
    assert n["worth_per_ep"]["ep8"] == pytest.approx(1.0, abs=0.05)
    # ep = 64 leaves the node: its all-to-all runs on the NICs there, on NVLink in the rack
    assert n["worth_at_recipe_ep"] > 1.2
    assert n["node_recipe_exposed_comm_share"] > 2 * n["rack_recipe_exposed_comm_share"]
    assert n["worth_best_layouts"] == pytest.approx(
        n["rack_best"]["tokens_per_s_per_chip"] / n["node_best"]["tokens_per_s_per_chip"])
    assert "1.0" in a.headline or "x" in a.headline


# ---------------------------------------------------------------- (c) cost per trillion tokens

def test_chip_cost_is_price_over_throughput(tmp_path):
    sp = tiny(tmp_path, "train-chip-cost", '"accelerator.id" = ["h100-sxm", "gb200", "tpu-v5p"]'
              '\n"layout.tp" = [8]\n"layout.pp" = [8]\n"layout.cp" = [2]\n'
              '"layout.recompute" = ["none", "full"]')
    n = answer(train_chip_cost, sp, tmp_path).numbers
    for chip in ("h100-sxm", "gb200", "tpu-v5p"):
        x = n[chip]
        acc, _ = tcat.lookup("accelerators", chip)
        # dollars = chip-hours x the catalog's $/chip-hour; chip-hours = 1e12 / (tokens/s) / 3600
        assert x["usd_per_chip_hour"] == pytest.approx(acc.price.usd_per_hour)
        assert x["chip_hours_per_trillion_tokens"] == pytest.approx(
            1e12 / x["tokens_per_s_per_chip"] / 3600)
        assert x["cost_over_reference"] == pytest.approx(
            x["usd_per_trillion_tokens"] / n["h100-sxm"]["usd_per_trillion_tokens"])
    assert n["h100-sxm"]["cost_over_reference"] == 1.0
    # a GB200 trains more tokens per chip-hour than an H100 (2.5x the bf16 peak)
    assert n["gb200"]["tokens_per_s_per_chip"] > 1.5 * n["h100-sxm"]["tokens_per_s_per_chip"]
    assert n["cheapest_chip"] == min(("h100-sxm", "gb200", "tpu-v5p"),
                                     key=lambda c: n[c]["usd_per_trillion_tokens"])


# ---------------------------------------------------------------- (e) DP communication share

def test_dp_share_falls_with_the_batch_per_replica(tmp_path):
    sp = tiny(tmp_path, "train-dp-batch", '"accelerator.id" = ["b200"]\n"layout.dp" = [16, 256]'
              '\n"training.global_batch_seqs" = [256, 512, 1024, 4096, 16384]',)
    ctx = context(sp, tmp_path)
    df = train_dp_batch.dp_shares(ctx)
    for dp, g in df.groupby("layout.dp"):
        g = g.sort_values("per_replica_seqs")
        # one gradient reduction per step: its exposed seconds do not depend on the batch ...
        assert np.ptp(g["dp_exposed_s"]) < 1e-9 * g["dp_exposed_s"].max() + 1e-12
        assert g["dp_exposed_s"].min() > 0
        # ... so its share of the step falls as the batch per replica grows
        assert np.all(np.diff(g["dp_share"].to_numpy()) < 0)
    # the measured DP exposure is the step's exposed communication less the replica's alone
    row = df[(df["layout.dp"] == 256) & (df["training.global_batch_seqs"] == 1024)].iloc[0]
    alone = train_space.score_values(sp, {"accelerator.id": np.array(["b200"]),
                                          "layout.dp": np.array([1]),
                                          "training.global_batch_seqs": np.array([4])},
                                     dtype=np.float64)
    assert row["dp_exposed_s"] == pytest.approx(row["network_exposed_s"]
                                                - float(alone["network_exposed_s"][0]))


def test_dp_crossing_interpolates_in_log_batch():
    x = np.array([1.0, 2.0, 4.0])
    assert train_dp_batch._cross(x, np.array([0.6, 0.4, 0.2]), 0.5) == pytest.approx(2 ** 0.5)
    assert train_dp_batch._cross(x, np.array([0.4, 0.3, 0.2]), 0.5) is None   # never above
    assert train_dp_batch._cross(x, np.array([0.9, 0.8, 0.7]), 0.5) is None   # never below


def test_dp_batch_answer_crossing_monotone_in_share(tmp_path):
    sp = tiny(tmp_path, "train-dp-batch", '"accelerator.id" = ["b200"]\n"layout.dp" = [256]'
              '\n"training.global_batch_seqs" = [256, 512, 1024, 2048, 4096, 8192, 16384]')
    df = train_dp_batch.dp_shares(context(sp, tmp_path))
    c = [train_dp_batch.crossings(df, share, 0.95)["crossing_per_replica_seqs"].iloc[0]
         for share in (0.5, 0.3, 0.1)]
    assert all(v is not None for v in c)
    assert c[0] < c[1] < c[2]             # a lower share is crossed at a larger batch
    n = answer(train_dp_batch, sp, tmp_path).numbers["b200"]
    assert n["share_at_one_seq"] > 0.5 and 1.0 < n["crossing_per_replica_seqs"] < 2.0


# ---------------------------------------------------------------- (b) HBM / scale-up value

def test_hw_value_training_gain_and_serving_file(tmp_path):
    sp = tiny(tmp_path, "train-hw-value", '"layout.tp" = [1]\n"layout.pp" = [8]\n'
              '"layout.ep" = [8, 64]')
    n = answer(train_hw_value, sp, tmp_path).numbers
    hbm, up = n["+50% HBM bandwidth"], n["2x scale-up bandwidth"]
    assert 0 < hbm["throughput_change_pct"] < 50      # only the HBM-bound part shrinks
    assert up["throughput_change_pct"] > 0
    # at a fixed number of GPUs and price, the cost falls as the throughput rises
    assert hbm["train_cost_change_pct"] == pytest.approx(
        100 * (1 / (1 + hbm["throughput_change_pct"] / 100) - 1), rel=1e-6)
    doc = json.loads((ROOT / "reports" / "hardware-value" / "answer.json").read_text())
    row = next(r for r in doc["numbers"]["rows"] if r["slo"] == doc["numbers"]["scenarios"][0]
               and r["upgrade"] == "+50% HBM bandwidth")
    assert hbm["serving_cost_change_pct"] == row["cost_change_pct"]
    assert train_hw_value.serving_side("no/such/file.json", ["x"]) == {}


# ---------------------------------------------------------------- (d) 1T MoE on 16k GPUs

MOE_1T = ('"layout.tp" = [2]\n"layout.pp" = [4]\n"layout.ep" = [16, 128]\n'
          '"training.moe_grouped_gemm" = ["per_expert", "single"]')


def test_moe_1t_answers_each_way_of_launching_the_expert_gemms(tmp_path):
    n = answer(train_moe_1t, tiny(tmp_path, "train-moe-1t", MOE_1T), tmp_path).numbers
    # the top level is the default software, one GEMM per local expert (TE 2.9, the fit's)
    assert n["grouped_gemm"] == "per_expert" and set(n["software"]) == {"per_expert", "single"}
    assert n["inside_over_across"] == n["software"]["per_expert"]["inside_over_across"]
    per, one = n["software"]["per_expert"], n["software"]["single"]
    for c in (per, one):
        assert c["inside"]["ep"] == 16 and c["across"]["ep"] == 128
        assert c["across"]["memory_per_chip_gb"] < c["inside"]["memory_per_chip_gb"]
    # the expert GEMMs cost the same per rank at ep 16 and 128 (each rank gets its tokens x
    # top-k rows), and inside the rack the all-to-all is cheaper. One GEMM per local expert:
    # the fixed time is paid per linear layer, 24 local experts at ep 16 (55.2 linear layers a
    # layer) against 3 at ep 128 (13.9), and across racks wins by 2.2x (0.456)
    assert per["best_ep"] == 128
    assert per["inside_over_across"] == pytest.approx(0.456, abs=0.01)
    # one grouped kernel per fc1 and fc2: both pay 9.95 linear layers a layer, and inside the
    # rack wins by its all-to-all, by a few per cent (1.023), as before the per-linear count
    assert one["best_ep"] == 16
    assert one["inside_over_across"] == pytest.approx(1.023, abs=0.01)


def test_moe_1t_fixed_time_by_the_linear_layers_it_counts(tmp_path):
    # Kimi K2, 61 layers of which 60 MoE (384 experts, a shared expert), MLA with a query
    # LoRA (5 projections): linear layers a layer, averaged over its dense and MoE layers,
    # 5 + (60 x (1 + 2 + 2 x local) + 2) / 61
    df = context(sp := tiny(tmp_path, "train-moe-1t", MOE_1T), tmp_path).score()
    assert sp.size == 4

    def overhead(ep, sw):
        r = df[(df["layout.ep"] == ep) & (df["training.moe_grouped_gemm"] == sw)]
        return float(r["overhead_s"].iloc[0])

    per16, per128 = 5 + (60 * 51 + 2) / 61, 5 + (60 * 9 + 2) / 61     # 55.20, 13.89
    single = 5 + (60 * 5 + 2) / 61                                    # 9.95 at any ep
    assert overhead(16, "per_expert") / overhead(128, "per_expert") == pytest.approx(
        per16 / per128, rel=1e-9)
    assert overhead(16, "single") / overhead(16, "per_expert") == pytest.approx(
        single / per16, rel=1e-9)
    assert overhead(128, "single") == pytest.approx(overhead(16, "single"), rel=1e-9)


def test_layout_text_gives_dp_of_a_fixed_chip_count(tmp_path):
    sp = tiny(tmp_path, "train-moe-1t", '"layout.tp" = [2]\n"layout.pp" = [4]\n'
              '"layout.ep" = [16]')
    row = train_common.with_layout(context(sp, tmp_path), context(sp, tmp_path).score()).iloc[0]
    assert row["layout.dp"] == 16384 / (2 * 4)
    assert "dp=2,048" in train_common.layout_text(row) and "zero=1" in train_common.layout_text(row)


# ---------------------------------------------------------------- training bands

DESIGN = {"accelerator.id": np.array(["h100-sxm"]), "layout.dp": np.array([64]),
          "training.global_batch_seqs": np.array([1024])}


def band_of(space, draws, metric="step_time_s"):
    s = TB.space_samples(space, DESIGN, draws, None, [metric])[metric][:, 0]
    return np.percentile(s, [5, 50, 95])


@pytest.fixture
def dp_space(tmp_path):
    return tiny(tmp_path, "train-dp-batch", '"accelerator.id" = ["h100-sxm"]')


def test_nominal_inside_the_band_and_draws_reproducible(dp_space):
    nominal = float(train_space.score_values(dp_space, DESIGN, dtype=np.float64)
                    ["step_time_s"][0])
    d = TB.draw(64, 0)
    lo, med, hi = band_of(dp_space, d)
    assert lo < nominal < hi and lo < med < hi
    assert np.array_equal(TB.draw(64, 0).train, d.train)
    assert not np.array_equal(TB.draw(64, 1).train, d.train)
    # a family's draws do not depend on the other groups drawn
    assert np.array_equal(TB.draw(8, 0, ("train",)).train, d.train[:8])


def test_twenty_percent_more_sd_widens_the_band(dp_space, monkeypatch):
    d = TB.draw(64, 0, ("train",))
    lo, _, hi = band_of(dp_space, d)
    clo, _, chi = band_of(dp_space, d, "compute_s")
    u = TB.fit_uncertainty()
    wider = {**u, "log_sd": [1.2 * x for x in u["log_sd"]]}
    monkeypatch.setattr(TB, "fit_uncertainty", lambda: wider)
    d2 = TB.draw(64, 0, ("train",))
    lo2, _, hi2 = band_of(dp_space, d2)
    clo2, _, chi2 = band_of(dp_space, d2, "compute_s")
    assert (hi2 - lo2) / (hi - lo) > 1.05
    # compute is 1 / compute_fraction_scale (log sd 0.08: nearly linear): 20% wider
    assert (chi2 - clo2) / (chi - clo) == pytest.approx(1.2, abs=0.05)
    none = {**u, "log_sd": [0.0] * len(u["log_sd"])}
    monkeypatch.setattr(TB, "fit_uncertainty", lambda: none)
    lo3, _, hi3 = band_of(dp_space, TB.draw(16, 0, ("train",)))
    nominal = float(train_space.score_values(dp_space, DESIGN, dtype=np.float64)
                    ["step_time_s"][0])
    assert lo3 == pytest.approx(nominal) and hi3 == pytest.approx(nominal)


def test_kernel_draws_move_the_step_and_train_params_stay_in_bounds(dp_space):
    d = TB.draw(32, 0, ("gemm",))
    assert np.all(d.train == 1.0) and "h100-sxm" in d.kernel
    lo, _, hi = band_of(dp_space, d)
    assert hi > lo                                     # GEMM parameters move the step
    full = TB.draw(64, 0)
    for k in range(full.n):
        ov = TB.sample_overrides(full, k)
        assert 0.0 <= ov["train.overlap_fraction"][1] <= 1.0
        assert 0.3 <= ov["train.compute_fraction_scale"][1] <= 1.5
    # an analysis's own override is kept and multiplied by the sample's factor
    ov = TB.sample_overrides(full, 3, {"train.layer_overhead_s": ("set", 1e-3)})
    i = full.params.index("layer_overhead_s")
    assert ov["train.layer_overhead_s"] == ("set", pytest.approx(1e-3 * full.train[3, i]))


def test_groups_alone_are_the_full_draws_with_the_rest_at_the_fit():
    groups, d = TB.draw_groups(4, 0)
    assert groups[0] == "train" and d.n == 4 * len(groups)
    full = TB.draw(4, 0)
    assert np.array_equal(d.train[:4], full.train)           # the training fit alone
    assert np.all(d.train[4:] == 1.0)                        # held for the kernel groups
    g = groups.index("gemm")
    key = next(k for k in full.kernel["h100-sxm"] if k.startswith("gemm_bf16_fraction"))
    assert np.array_equal(d.kernel["h100-sxm"][key][4 * g:4 * g + 4], full.kernel["h100-sxm"][key])
    assert np.all(d.kernel["h100-sxm"][key][:4] == 1.0)


# ---------------------------------------------------------------- the fit's uncertainty

def test_gauss_newton_uncertainty_on_a_linear_model(monkeypatch):
    """log errors linear in the log parameters: r = r0 + J (log p - log p0); the covariance is
    s^2 (J^T W J)^-1 with W the source-equal weights, by hand."""
    rng = np.random.default_rng(3)
    n = 12
    truth = pd.DataFrame({"case_id": [f"c{i}" for i in range(n)],
                          "source": ["A"] * 8 + ["B"] * 4, "metric": ["mfu"] * n})
    jac = rng.normal(size=(n, 3))
    r0 = rng.normal(scale=0.1, size=n)
    p0 = {"compute_fraction_scale": 0.7, "overlap_fraction": 0.5, "layer_overhead_s": 1e-3}

    def fake(cases, tr, params):
        dx = np.array([np.log(params[k] / p0[k]) for k in train_fit.FITTED])
        return r0 + jac @ dx
    monkeypatch.setattr(train_fit, "residuals", fake)
    u = train_fit.uncertainty(None, truth, p0)
    w = np.array([1 / 8] * 8 + [1 / 4] * 4)
    w = w * n / w.sum()
    s2 = np.sum(w * r0 ** 2) / (n - 3)
    cov = s2 * np.linalg.inv(jac.T @ (w[:, None] * jac))
    assert u["params"] == list(train_fit.FITTED)
    assert np.allclose(u["log_sd"], np.sqrt(np.diag(cov)), rtol=1e-3)
    corr = cov / np.outer(np.sqrt(np.diag(cov)), np.sqrt(np.diag(cov)))
    assert np.allclose(u["log_corr"], corr, atol=2e-3)
    # written as one TOML inline table that reads back
    back = tomllib.loads("u = " + train_fit.toml_inline(u))["u"]
    assert back["log_sd"] == u["log_sd"] and back["params"] == u["params"]


def test_catalog_carries_the_fit_uncertainty():
    u = TB.fit_uncertainty()
    assert u["params"] == list(train_fit.FITTED)
    assert all(s > 0 for s in u["log_sd"]) and "Gauss-Newton" in u["rule"]


# ---------------------------------------------------------------- end to end, with bands

def test_answer_space_writes_training_bands(tmp_path):
    text = (QUESTIONS / "train-moe-1t.toml").read_text()
    text = re.sub(r"(?ms)^\[parameters\]\n.*?(?=^\[)", '[parameters]\n"layout.tp" = [2]\n'
                  '"layout.pp" = [4]\n"layout.ep" = [16, 128]\n\n', text)
    p = tmp_path / "train-moe-1t.toml"
    p.write_text(text)
    out = answer_space(str(p), out=str(tmp_path / "out"), run_dir=str(tmp_path / "run"),
                       bands=4)
    doc = json.loads((out / "answer.json").read_text())
    lead = {x["key"]: x for x in doc["lead"]}
    x = lead["inside_over_across"]
    assert x["samples"] == 4 and x["lo"] <= x["median"] <= x["hi"]
    assert "train" in x["groups"]
    assert "training fit" in doc["bands"]["note"]
    assert (out / "best_per_ep.png").is_file()
    assert "**Question.**" in (out / "README.md").read_text()
