"""Uncertainty bands (dse.scoring.bands): the sampler, closed-form cases, bands off, one scorer call,
and the words a page uses when a sign or a ranking is not resolved."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from helpers import ROOT

import dse
from dse.build import tables
from dse.build.designs import resolve
from dse.cli import main
from dse.scoring import bands as B
from dse.spec.fields import label

QUICK = ROOT / "spaces" / "quickstart.toml"


def _family(acc="a100-sxm-80g", rt="trtllm", name="gemm_bf16"):
    return next(f for f in B.families() if f.entry == (acc, rt) and f.name == name)


def _gemm_only(sd=0.1, acc="h100-sxm", rt="trtllm"):
    return [B.Family("gemm", (acc, rt), "gemm_bf16", ("gemm_bf16_fraction",), np.array([sd]),
                     np.eye(1), "test")]


# ------------------------------------------------------------------ the sampler

def test_draws_match_the_catalog_mean_sd_and_correlation():
    fam = _family()
    assert not fam.free().any() and len(fam.params) >= 5
    n = 20000
    z = B.log_draws(fam, n, seed=3)
    sd = fam.log_sd
    # mean 0 within 4 standard errors, sd within 3%, correlation within 0.03
    assert np.all(np.abs(z.mean(axis=0)) < 4 * sd / np.sqrt(n))
    np.testing.assert_allclose(z.std(axis=0), sd, rtol=0.03)
    np.testing.assert_allclose(np.corrcoef(z.T), fam.log_corr, atol=0.03)
    assert np.abs(fam.log_corr - np.eye(len(sd))).max() > 0.3    # a correlation to check
    # the catalog tables get exactly these factors, at the entry's (accelerator, runtime, key)
    d = B.draw(64, seed=3)
    T = tables.tables()
    a, r = T.index["accelerator"]["a100-sxm-80g"], T.runtimes.index("trtllm")
    for j, p in enumerate(fam.params):
        if p not in T.kernel_keys:          # a fit-only parameter (catalog.FIT_ONLY_SUFFIXES)
            continue
        np.testing.assert_allclose(np.log(d.kernel[:, a, r, T.kernel_keys.index(p)]),
                                   B.log_draws(fam, 64, 3)[:, j], rtol=1e-12, atol=1e-15)


def test_draws_are_seeded_per_entry():
    fam = _family()
    np.testing.assert_array_equal(B.log_draws(fam, 8, 0), B.log_draws(fam, 8, 0))
    assert not np.allclose(B.log_draws(fam, 8, 0), B.log_draws(fam, 8, 1))
    other = _family("b200")
    assert not np.allclose(B.log_draws(fam, 8, 0)[:, 0], B.log_draws(other, 8, 0)[:, 0])


def test_parameters_the_data_leave_free_are_held():
    fam = B.Family("gemm", ("h100-sxm", "trtllm"), "gemm_bf16",
                   ("gemm_bf16_fraction", "gemm_bf16_n_half"), np.array([0.1, 4.0]),
                   np.eye(2), "test")
    z = B.log_draws(fam, 2000, 0)
    assert np.all(z[:, 1] == 0.0) and 0.09 < z[:, 0].std() < 0.11
    assert "held at their fitted values" in B.coverage_note([fam])


def test_bad_sample_counts_are_refused():
    assert B.check_samples(None) == B.DEFAULT_SAMPLES and B.check_samples(0) == 0
    for bad in (-1, 1, 2.5):
        with pytest.raises(dse.InputError, match="--bands"):
            B.check_samples(bad)


# ------------------------------------------------------------------ closed form

def _frame(concurrency, tp=4):
    return pd.DataFrame({"accelerator.id": ["h100-sxm"], "model.id": ["llama-3.1-8b"],
                         "model.weight_dtype": ["bf16"], "serving.runtime": ["trtllm"],
                         "workload.phase": ["decode"], "layout.tp": [tp],
                         "workload.concurrency": [concurrency],
                         "workload.isl": [128], "workload.osl": [128]})


def _tpot_samples(frame, fams, n=400):
    d = B.draw(n, seed=5, fams=fams)
    return B.frame_samples(resolve(frame), d, metrics=("tpot_s",))["tpot_s"][:, 0]


def test_memory_bound_decode_does_not_move_with_gemm_compute_uncertainty():
    frame = _frame(1)
    t = _tpot_samples(frame, _gemm_only(0.1))
    assert np.all(t == t[0])
    assert t[0] == pytest.approx(float(dse.score(frame)["tpot_s"].iloc[0]), rel=1e-12)


def test_compute_bound_decode_moves_by_the_expected_log_sd():
    frame = _frame(1024, tp=1)
    # the elasticity of TPOT to the GEMM compute fraction, by hand: +-5% in log space
    col = "accelerator.kernel.gemm_bf16_fraction"
    f0 = float(resolve(frame)[col].iloc[0])
    up = dse.score(frame.assign(**{col: f0 * np.exp(0.05)}))["tpot_s"].iloc[0]
    dn = dse.score(frame.assign(**{col: f0 * np.exp(-0.05)}))["tpot_s"].iloc[0]
    e = float(np.log(up / dn) / 0.1)
    assert e < -0.5                      # compute-bound: the GEMMs are most of the step
    sd = 0.1
    t = _tpot_samples(frame, _gemm_only(sd))
    assert np.log(t).std() == pytest.approx(abs(e) * sd, rel=0.08)
    # twice the catalog sd: twice the spread (the band follows the catalog's number)
    t2 = _tpot_samples(frame, _gemm_only(2 * sd))
    assert np.log(t2).std() / np.log(t).std() == pytest.approx(2.0, rel=0.1)


def test_end_to_end_overhead_uncertainty_moves_every_chip_that_shares_its_table():
    fam = B.Family("e2e", ("default",), "e2e", ("layer_overhead_s",), np.array([0.3]),
                   np.eye(1), "test")
    d = B.draw(2000, seed=0, fams=[fam])
    T = tables.tables()
    j = tables.EFF_FIELDS.index("layer_overhead_s")
    for acc in ("h100-sxm", "b200"):
        x = np.log(d.eff[:, T.index["accelerator"][acc], j])
        assert x.std() == pytest.approx(0.3, rel=0.05)
    np.testing.assert_array_equal(d.eff[:, 0, j], d.eff[:, 1, j])   # one table: one draw
    t = B.frame_samples(resolve(_frame(8)), B.draw(64, 0, [fam]), ("tpot_s",))["tpot_s"]
    assert np.log(t).std() > 0.01


def test_a_runtimes_front_end_uncertainty_moves_its_own_designs_only():
    """The end-to-end fit's per-runtime host times are sampled per runtime: TensorRT-LLM's
    front end (log sd 0.3) spreads a TensorRT-LLM design's unloaded TTFT by the front end's
    share of it, and leaves an SGLang design's exact."""
    fam = B.Family("e2e", ("default",), "e2e", ("request_overhead_s.trtllm",), np.array([0.3]),
                   np.eye(1), "test")
    d = B.draw(2000, seed=0, fams=[fam])
    T = tables.tables()
    j = B.HOST_TIMES.index("serving.request_overhead_s")
    assert np.log(d.host[:, T.runtimes.index("trtllm"), j]).std() == pytest.approx(0.3, rel=0.05)
    assert (d.host[:, T.runtimes.index("sglang"), :] == 1.0).all()
    frame = pd.concat([_frame(8), _frame(8).assign(**{"serving.runtime": ["sglang"]})])
    frame = frame.drop(columns="workload.phase").assign(**{"serving.request_overhead_s": 0.2})
    t = B.frame_samples(resolve(frame), B.draw(400, 0, [fam]),
                        ("ttft_unloaded_s",))["ttft_unloaded_s"]
    own = t[:, 0] - np.median(t[:, 0]) + 0.2          # the front end's samples, recovered
    assert np.log(own).std() == pytest.approx(0.3, rel=0.1)
    assert np.ptp(t[:, 1]) == 0.0


# ------------------------------------------------------------------ shared draws, bands off, one call

def _designs():
    return pd.DataFrame({"accelerator.id": ["h100-sxm", "h100-sxm", "b200", "mi300x"],
                         "model.id": ["llama-3.1-70b"] * 4, "layout.tp": [4, 8, 4, 8],
                         "workload.concurrency": [8, 256, 64, 512],
                         "workload.isl": 2048, "workload.osl": 256})


def test_bands_off_gives_todays_numbers_exactly():
    frame = _designs()
    nominal = dse.score(frame)
    s = B.frame_samples(resolve(frame), B.draw(3, 0, fams=[]))
    for m, v in s.items():
        if m == "reason":
            continue
        ref = nominal[m].to_numpy()
        ref = np.array([["compute", "memory", "network", "capacity"].index(x) for x in ref]) \
            if m == "bound" else ref.astype(float)
        for k in range(3):
            np.testing.assert_array_equal(np.asarray(v[k], float), ref, err_msg=m)


def test_one_draw_per_catalog_entry_shared_by_its_designs():
    frame = _designs()
    alone = dse.score_bands(frame.iloc[[0]], 16, metrics=("tpot_s",)).samples["tpot_s"]
    both = dse.score_bands(frame, 16, metrics=("tpot_s",)).samples["tpot_s"]
    np.testing.assert_allclose(both[:, 0], alone[:, 0], rtol=1e-12)
    # two designs on the same chip that differ a little (batch 8 vs 9) move together (the same
    # draws), the same design on another chip does not (its own kernel draws)
    pair = pd.concat([frame.iloc[[0, 0, 0]]], ignore_index=True)
    pair["workload.concurrency"] = [8, 9, 8]
    pair.loc[2, "accelerator.id"] = "h200-sxm"
    p = np.log(dse.score_bands(pair, 32, metrics=("tpot_s",)).samples["tpot_s"])
    r_same = np.corrcoef(p[:, 0], p[:, 1])[0, 1]
    r_other = np.corrcoef(p[:, 0], p[:, 2])[0, 1]
    assert r_same > 0.95 and r_other < r_same


def test_samples_times_designs_in_one_scorer_call(monkeypatch):
    calls = []
    real = B.score_chunked

    def counting(b, *a, **kw):
        calls.append(len(kw["rows"]) if kw.get("rows") is not None else len(b))
        return real(b, *a, **kw)
    monkeypatch.setattr(B, "score_chunked", counting)
    frame = _designs()
    res = resolve(frame)
    s = B.frame_samples(res, B.draw(32, 0), metrics=("tpot_s",))
    assert calls == [32 * len(frame)] and s["tpot_s"].shape == (32, len(frame))


def test_score_bands_table_brackets_the_median():
    b = dse.score_bands(_designs(), 32, metrics=("tpot_s", "usd_per_mtok_output"))
    t = b.table()
    assert (t["tpot_s_lo"] <= t["tpot_s"]).all() and (t["tpot_s"] <= t["tpot_s_hi"]).all()
    assert (t["tpot_s_hi"] > t["tpot_s_lo"]).any()
    assert "held exact" in b.note or "bands sample" in b.note


# ------------------------------------------------------------------ words

def test_not_resolved_wording():
    assert B.NOT_RESOLVED in B.sign_words(-0.01, 0.02)
    assert B.sign_words(0.01, 0.02) == "" and B.sign_words(-0.02, -1e-12) == ""
    assert B.NOT_RESOLVED in B.ranking_words(0.6) and B.ranking_words(0.97) == ""
    assert B.p_better([1, 2, 3], [2, 2, 2], "minimize") == pytest.approx(0.5)
    assert B.text(1.0, 0.5, 2.0) == "1 [0.5..2]"
    from dse.results.bands_report import whatif_lines
    band = {"samples": 8, "seed": 0, "note": "n", "objectives": {"tpot_s": {
        "median_change": {"median": 0.01, "lo": -0.02, "hi": 0.03}, "designs": 3,
        "designs_sign_unresolved": 2, "words": B.sign_words(-0.02, 0.03, "the sign")}}}
    text = "\n".join(whatif_lines(band))
    assert "+1.0% [-2.0%..+3.0%]" in text and B.NOT_RESOLVED in text


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("b") / "run"
    assert main(["run", str(QUICK), "--out", str(d), "--quiet"]) == 0
    return d


def test_whatif_bands_and_bands_off(run, tmp_path, capsys):
    off, on = tmp_path / "off", tmp_path / "on"
    args = ["whatif", str(run), "--scale", "accelerator.hbm_bw_bytes_per_s=1.5", "--quiet"]
    assert main(args + ["--out", str(off), "--bands", "0"]) == 0
    # the terminal shows the page's lines without Markdown markers (dse.results.pages.plain)
    assert "; uncertainty bands off (--bands 0)" in capsys.readouterr().out.splitlines()[0]
    assert main(args + ["--out", str(on), "--bands", "8"]) == 0
    assert "Uncertainty bands" not in (off / "whatif.md").read_text()
    assert not (off / "bands.json").exists()
    md = (on / "whatif.md").read_text()
    assert "Uncertainty bands (8 parameter samples" in md
    band = json.loads((on / "bands.json").read_text())
    for m, o in band["objectives"].items():
        b = o["median_change"]
        assert b["lo"] <= b["median"] <= b["hi"], m
    # the nominal lines (before, after, change) are the same with and without bands
    nominal = [ln.split("; with parameter uncertainty")[0] for ln in md.splitlines()
               if "median change **" in ln]
    off_lines = [ln for ln in (off / "whatif.md").read_text().splitlines()
                 if "median change **" in ln]
    assert all(ln.endswith("; uncertainty bands off (`--bands 0`)") for ln in off_lines)
    assert nominal == [ln.split("; uncertainty bands off")[0] for ln in off_lines]
    out = capsys.readouterr().out
    assert "**" not in out and "`" not in out
    assert not any(ln.lstrip().startswith("#") for ln in out.splitlines())
    # the terminal leads with each objective's change and its band, then the band details
    first = out.index("median change ")
    assert first < out.index("Uncertainty bands") < out.index("wrote ")
    lead = [ln for ln in out.splitlines() if "median change " in ln and "90% band" in ln]
    assert len(lead) == len(band["objectives"])
    for ln, (m, o) in zip(lead, band["objectives"].items()):
        b = o["median_change"]
        med, lo, hi = B.band_strings((b["median"], b["lo"], b["hi"]), B.pct, 1)
        assert f"90% band {lo}..{hi} (median {med}, 8 samples)" in ln, m
        assert ln.startswith(f"- {label(m)}: median change "), m
        assert "what would change it: the " in ln
        assert ("its sign is resolved" in ln) == (not o["words"]), m
    # the band section names each objective by its label with its unit
    assert "- output cost [$/Mtok]: median change over the front " in out
    assert "- TPOT [s]: median change over the front " in out


def test_compare_a_run_with_itself_is_not_resolved(run, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", str(run), str(run), "--out", str(out), "--bands", "8"]) == 0
    band = json.loads((out / "bands.json").read_text())
    for m, o in band["objectives"].items():
        assert o["p_a_better"] == pytest.approx(0.5)        # the same design: ties
        assert B.NOT_RESOLVED in o["words"]
        assert o["a"]["lo"] <= o["a"]["median"] <= o["a"]["hi"]
    assert B.NOT_RESOLVED in (out / "compare.md").read_text()
    text = capsys.readouterr().out
    assert "**" not in text and "`" not in text
    assert "- best TPOT [s] (minimize): A " in text
    assert "- minimize TPOT [s]: A " in text and "- minimize output cost [$/Mtok]: A " in text
    assert "A is better in 50% of the samples (P(A better) = 0.50)" in text


def test_bad_bands_exit_2(run, tmp_path, capsys):
    assert main(["whatif", str(run), "--scale", "accelerator.hbm_bw_bytes_per_s=1.5",
                 "--out", str(tmp_path / "w"), "--bands", "-3"]) == 2
    err = capsys.readouterr().err
    assert "--bands" in err and "Traceback" not in err
    assert not (tmp_path / "w").exists()


# ------------------------------------------------------------------ answers

def test_sample_view_vectorized_and_per_sample_paths_agree(monkeypatch):
    from dse.build.space import load_space
    from dse.questions import sampled
    space = load_space(str(QUICK))
    vals = space.values_at(np.arange(0, space.size, 7))
    shared = sampled.Sampled(B.draw(4, 0))
    fast = shared.view(2).score(space, vals)
    monkeypatch.setattr(sampled, "VECTOR_ROWS", 0)
    slow = sampled.Sampled(B.draw(4, 0)).view(2).score(space, vals)
    for m in ("tpot_s", "usd_per_mtok_output", "ttft_s"):
        np.testing.assert_allclose(fast[m], slow[m], rtol=1e-12)


def test_answer_numbers_get_bands(tmp_path, capsys):
    from dse.questions.answer import QUESTIONS_DIR
    out = tmp_path / "r"
    assert main(["answer", str(QUESTIONS_DIR / "rack-goodput.toml"), "--out", str(out),
                 "--run-dir", str(tmp_path / "run"), "--bands", "4", "--quiet"]) == 0
    # the terminal prints the first lines without Markdown markers
    printed = capsys.readouterr().out
    assert "90% band" in printed and "what would change it" in printed
    assert "**" not in printed and "`" not in printed
    assert not any(ln.lstrip().startswith("#") for ln in printed.splitlines())
    doc = json.loads((out / "answer.json").read_text())
    nums = doc["bands"]["numbers"]
    assert doc["bands"]["samples"] == 4 and nums
    for k, b in nums.items():
        if "median" in b and np.isfinite(b["median"]):
            assert b["lo"] <= b["median"] <= b["hi"], k
    assert "**Uncertainty bands** (4 parameter samples" in (out / "README.md").read_text()
    # the first lines: the lead number, its band from the same samples, resolution, attribution
    from dse.questions.answer import first_lines
    lead = doc["lead"][0]
    b = nums[lead["key"]]
    assert (lead["lo"], lead["median"], lead["hi"]) == (b["lo"], b["median"], b["hi"])
    assert lead["samples_per_group"] == 4 and set(lead["groups"]) <= set(B.GROUPS)
    spreads = [g["spread"] for g in lead["groups"].values()]
    assert spreads == sorted(spreads, reverse=True)
    first = first_lines(out).splitlines()[0]
    assert "90% band" in first and "what would change it: the " in first
    from dse.results.pages import plain
    assert plain(first) in printed.splitlines()
    assert ("the ranking is resolved" in first) == (lead["pick_share"] >= 0.95)
    readme = (out / "README.md").read_text()
    assert readme.split("## Answer\n\n", 1)[1].startswith(first)
    # the page: the question first, then the answer, its bands collapsed and named in words
    page = (out / "index.html").read_text()
    assert page.index("<strong>Question.</strong>") < page.index("<h2>Answer</h2>") \
        < page.index("<details class='bands'><summary>") < page.index("Pareto report")
    folded = page.split("<details class='bands'>")[1].split("</details>")[0]
    assert not any(f"<code>{k}</code>" in folded for k in nums)          # no internal keys
    assert "goodput requests per rack [requests/s]" in folded                # in words, units
    # one shared plotly.js beside the page's folder, not inlined; figures by file name
    assert "src='../_static/plotly.min.js'" in page and len(page) < 1_000_000
    assert (tmp_path / "_static" / "plotly.min.js").stat().st_size > 1_000_000
    assert "base64" not in page
    # answer.json: every figure at 4 significant digits (counts and ids exact)
    def floats(v):
        if isinstance(v, dict):
            return [x for u in v.values() for x in floats(u)]
        if isinstance(v, list):
            return [x for u in v for x in floats(u)]
        return [v] if isinstance(v, float) else []
    got = floats(doc)
    assert got and all(not np.isfinite(v) or v.is_integer() or v == float(f"{v:.3e}")
                       for v in got)


def test_end_to_end_log_sd_is_read_when_the_catalog_has_it(tmp_path, monkeypatch):
    import shutil
    shutil.copytree(B.CATALOG / "kernels", tmp_path / "kernels")
    text = (B.CATALOG / "efficiency.toml").read_text()
    assert "[default]" in text
    # keep only the plain form: drop the fit's top-level [uncertainty.*] tables
    text = text.split("\n[uncertainty.")[0] + "\n"
    (tmp_path / "efficiency.toml").write_text(
        text.replace("[default]", "[default]\nlayer_overhead_s_log_sd = 0.2", 1))
    monkeypatch.setattr(B, "CATALOG", tmp_path)
    B._families_cached.cache_clear()
    try:
        fams = [f for f in B.families() if f.group == "e2e"]
        assert [f.params for f in fams] == [("layer_overhead_s",)]
        assert fams[0].log_sd.tolist() == [0.2]
        assert "end-to-end overhead" in B.coverage_note().split(";")[0]
        assert B.coverage()["e2e"] == 1
    finally:
        monkeypatch.undo()
        B._families_cached.cache_clear()
    # the shipped catalog: the fit's bootstrap table (dse.calibration.fit) for the shared default
    fams = [f for f in B.families() if f.group == "e2e"]
    from dse.calibration.fit import FITTED
    assert fams and fams[0].params == tuple(p[0] for p in FITTED)


# ------------------------------------------------------------------ first lines

def test_group_draws_are_the_full_draws_with_the_other_groups_held():
    groups, dg = B.draw_groups(4, 0)
    full = B.draw(4, 0)
    assert dg.n == 4 * len(groups) and set(groups) <= set(B.GROUPS)
    T = __import__("dse.build.tables", fromlist=["tables"]).tables()
    kpos = {k: j for j, k in enumerate(T.kernel_keys)}
    for i, g in enumerate(groups):
        mine = {kpos[p] for f in B.families() if f.group == g for p in f.params if p in kpos}
        ker = dg.kernel[i * 4:(i + 1) * 4]
        others = [j for j in range(ker.shape[-1]) if j not in mine]
        assert (ker[..., others] == 1.0).all(), g             # every other group held
        if mine and g != "e2e":
            idx = sorted(mine)
            np.testing.assert_array_equal(ker[..., idx], full.kernel[..., idx])
    if "e2e" in groups:
        i = groups.index("e2e")
        np.testing.assert_array_equal(dg.eff[i * 4:(i + 1) * 4], full.eff)


def _lead_answer():
    from dse.questions.context import Answer, Lead
    return Answer("- x", numbers={"m": {"cost": 2.0, "design": 7}, "change": -1.0},
                  lead=(Lead("m.cost", "Price", "$/Mtok", pick="m.design", pick_label="design"),
                        Lead("change", "Cost change", "%", versus=0.0)))


def test_first_lines_give_the_band_the_resolution_and_what_changes_it():
    from dse.questions import sampled
    ans = _lead_answer()
    cost = [1.8, 1.9, 2.0, 2.1, 2.2, 2.0, 2.0, 2.05, 1.95, 2.3]
    values = {"m.cost": cost, "m.design": [7.0] * 6 + [9.0] * 4,
              "change": [-1.0, -0.5, 0.4, -2.0, -1.5, -1.0, -0.2, -0.8, -1.1, -0.9]}
    attr = {"samples_per_group": 4, "groups": {
        "gemm": {"m.cost": [2.0, 2.01, 1.99, 2.0], "m.design": [7.0] * 4,
                 "change": [-1.0] * 4},
        "moe": {"m.cost": [1.8, 2.3, 2.0, 1.9], "m.design": [7.0, 9.0, 7.0, 7.0],
                "change": [-0.5, -1.5, -1.0, -1.2]}}}
    items = sampled.leads(ans, values, attr)
    lo, med, hi = np.percentile(cost, [5, 50, 95])
    a = items[0]
    assert (a["lo"], a["median"], a["hi"]) == pytest.approx((lo, med, hi))
    assert a["pick_share"] == pytest.approx(0.6)
    assert list(a["groups"]) == ["moe", "gemm"]               # the widest first
    assert a["groups"]["moe"]["pick_changes"] == pytest.approx(0.25)
    text = sampled.lead_markdown(items, None).splitlines()
    # the lead figure is the samples' median, the nominal beside it
    assert text[0].startswith("- **Price: $2/Mtok**, the median of 10 parameter samples, "
                              "90% band $")
    assert "(the model at its fitted parameters: $2/Mtok)" in text[0]
    assert (f"which design wins is {B.NOT_RESOLVED}: design 7 is picked in 60% of the samples, "
            "9 in 40%;") in text[0]
    assert "what would change it: the MoE grouped-GEMM parameters" in text[0]
    assert text[0].index("MoE grouped-GEMM") < text[0].index("then the GEMM")
    # the change's band crosses 0: its sign is said not resolved
    assert f"whether it is above or below 0% is {B.NOT_RESOLVED}" in text[1]
    values["change"] = [v - 1.0 for v in values["change"]]
    resolved = sampled.lead_markdown(sampled.leads(ans, values, attr), None).splitlines()[1]
    assert "its sign is resolved (the band stays below 0%)" in resolved
    values["m.design"] = [7.0] * 10
    first = sampled.lead_markdown(sampled.leads(ans, values, attr), None).splitlines()[0]
    assert "the ranking is resolved: design 7 is picked in >= 95% of the samples (100%)" in first
    values["m.design"] = [7.0] * 19 + [9.0]                   # 95%: resolved, said the same way
    values["m.cost"] = cost * 2
    first = sampled.lead_markdown(sampled.leads(ans, values, attr), None).splitlines()[0]
    assert "the ranking is resolved: design 7 is picked in >= 95% of the samples (95%)" in first


def test_first_lines_with_bands_off_say_so():
    from dse.questions import sampled
    text = sampled.lead_markdown(sampled.leads(_lead_answer()), None).splitlines()
    assert text == ["- **Price: $2/Mtok** (uncertainty bands off, `--bands 0`: no band, no "
                    "resolution, no attribution)",
                    "- **Cost change: -1.0%** (uncertainty bands off, `--bands 0`: no band, no "
                    "resolution, no attribution)"]


# ------------------------------------------------------------------ one band formatter

def test_band_strings_never_collapse():
    assert B.text(1.0, 0.5, 2.0) == "1 [0.5..2]"
    assert B.text(2.0, 2.0, 2.0) == "2 [2..2]"                 # equal values stay short
    assert B.text(1.2001, 1.2, 1.2002) == "1.2001 [1.2..1.2002]"
    assert B.text(0.0101, 0.0100, 0.0102, B.pct, 1) == "+1.01% [+1.00%..+1.02%]"
    assert B.text(11585.0, 11585.0, 23170.0) == "11,585 [11,585..23,170]"
    # a difference of rounding (1e-16) is not a reason for 10 digits
    assert B.band_strings((0.3, 0.3 + 1e-16)) == ["0.3", "0.3"]
    from dse.questions.sampled import band_text, range_text
    assert band_text(0.3171, 0.3170, 0.3172, "$/Mtok") == ("$0.3171/Mtok",
                                                           "$0.317/Mtok..$0.3172/Mtok")
    assert band_text(135.2, 135.1, 135.3, "requests/s") == ("135.2 requests/s",
                                                            "135.1..135.3 requests/s")
    assert band_text(-1.02, -1.04, -1.01, "%") == ("-1.02%", "-1.04%..-1.01%")
    assert range_text(1.0, 1.15, "x") == "1x..1.15x"
    from dse.results.bands_report import whatif_lines
    band = {"samples": 8, "seed": 0, "note": "n", "objectives": {"tpot_s": {
        "median_change": {"median": 0.0102, "lo": 0.0101, "hi": 0.0104}, "designs": 3,
        "designs_sign_unresolved": 0, "words": ""}}}
    assert "- TPOT [s]: median change over the front +1.02% [+1.01%..+1.04%]" in \
        whatif_lines(band)


def test_pick_wording_is_one_rule():
    assert B.shares_words({"7": 1.0}, "7") == "7 is picked in >= 95% of the samples (100%)"
    assert B.shares_words({"7": 0.95, "9": 0.05}, "7") == \
        "7 is picked in >= 95% of the samples (95%)"
    # 94.9% is said as 94% (rounded down), never as a 95% that reads resolved
    assert B.shares_words({"7": 0.949, "9": 0.051}, "7") == \
        "7 is picked in 94% of the samples, 9 in 5%"
    assert B.shares_words({"9": 0.7, "7": 0.2, "8": 0.1}, "7", "") == \
        "7 in 20% of the samples, 9 in 70%, 8 in 10%"
    assert B.ranking_words(0.96) == "" and B.ranking_words(0.04) == ""
    assert B.ranking_words(0.6) == (f"which of A and B is better is {B.NOT_RESOLVED}: A is better "
                                    "in 60% of the samples (P(A better) = 0.60)")
    # an answer's text values use the same rule and the same words
    from dse.questions import sampled
    nominal = {"best": "h200", "other": "b200"}
    values = {"best": ["h200"] * 19 + ["b200"], "other": ["b200"] * 9 + ["h200"]}
    band = sampled.summarize(nominal, values, 20, 0, "note")
    assert band["numbers"]["best"]["words"] == ""
    assert band["numbers"]["other"]["words"] == f"which value it takes is {B.NOT_RESOLVED}"
    md = sampled.markdown(band)
    assert "- best: h200; h200 in >= 95% of the samples (95%)" in md
    assert (f"- other: b200; b200 in 90% of the samples, h200 in 10% — which value it takes is "
            f"{B.NOT_RESOLVED}") in md


# ------------------------------------------------------------------ groups together

def test_draw_sets_are_the_groups_varied_together():
    groups, single = B.draw_groups(4, 0)
    sets, d = B.draw_sets(4, 0, [("gemm", "attention"), groups])
    assert sets == (("gemm", "attention"), groups) and d.n == 8
    i, j = groups.index("gemm"), groups.index("attention")
    # each parameter belongs to one group: a union's factors are its groups' factors multiplied
    np.testing.assert_allclose(d.kernel[:4], single.kernel[i * 4:i * 4 + 4]
                               * single.kernel[j * 4:j * 4 + 4], rtol=1e-12)
    assert (d.eff[:4] == 1.0).all()                           # end-to-end held
    # the set of every sampled group is the full draw's first samples
    full = B.draw(16, 0)
    np.testing.assert_array_equal(d.kernel[4:], full.kernel[:4])
    np.testing.assert_array_equal(d.eff[4:], full.eff[:4])
    with pytest.raises(ValueError, match="unknown parameter groups"):
        B.draw_sets(4, 0, [("gemm", "nvlink")])


def test_greedy_unions_grows_the_smallest_union_one_call_per_round():
    weight = {"a": 3.0, "b": 2.0, "c": 1.5, "d": 0.1}
    calls = []

    def evaluate(sets):
        calls.append(sorted("".join(sorted(s)) for s in sets))
        return {s: sum(weight[g] for g in s) for s in sets}

    def target(x):
        return (lambda r: (r,), lambda r: r >= x)

    found = B.greedy_unions("abcd", evaluate, [target(2.5), target(4.6), target(6.0),
                                               target(99.0)])
    assert [f["groups"] for f in found] == [("a",), ("a", "b"), ("a", "b", "c"),
                                            ("a", "b", "c", "d")]
    assert [f["met"] for f in found] == [True, True, True, False]
    assert [f["result"] for f in found] == pytest.approx([3.0, 5.0, 6.5, 6.6])
    # singles, then each round's sets for every open target in one call
    assert calls == [["a", "b", "c", "d"], ["ab", "ac", "ad"], ["abc", "abd"], ["abcd"]]
    # a pre-filled cache is not evaluated again
    calls.clear()
    B.greedy_unions("abcd", evaluate, [target(6.0)],
                    cache={frozenset(g): weight[g] for g in "abcd"})
    assert calls == [["ab", "ac", "ad"], ["abc", "abd"]]


def _together_module(T, groups):
    """An analysis whose number moves only when the GEMM and attention parameters move
    together: 1 + (sum of the GEMM log factors) x (sum of the attention ones)."""
    from types import SimpleNamespace

    from dse.questions.context import Answer, Lead
    kpos = {k: j for j, k in enumerate(T.kernel_keys)}
    idx = {g: sorted({kpos[p] for f in B.families() if f.group == g for p in f.params
                      if p in kpos}) for g in groups}

    def answer(ctx):
        x = 1.0
        if ctx.sample is not None:
            lg = np.log(ctx.sample.shared.draws.kernel[ctx.sample.k])
            x = 1.0 + float(lg[..., idx["gemm"]].sum() * lg[..., idx["attention"]].sum())
        return Answer("- x", numbers={"x": x}, lead=(Lead("x", "X", "x", versus=1.0),))
    return SimpleNamespace(answer=answer)


def test_answer_attribution_names_the_groups_that_move_it_together(monkeypatch):
    from dse.build.space import load_space
    from dse.questions import sampled
    from dse.questions.context import Context
    space = load_space(str(QUICK))
    groups = B.draw_groups(1, 0)[0]
    mod = _together_module(tables.tables(), groups)

    def make(f, tmp, sample):
        return Context(space, None, tmp, {}, f, sample)
    front = pd.DataFrame()
    ans = mod.answer(make(front, None, None))
    got = sampled.sampled_answers(mod, make, space, front, 16, 0)
    calls = []
    real = sampled.sampled_answers

    def counted(*a, **k):
        calls.append(k["draws"].n)
        return real(*a, **k)
    monkeypatch.setattr(sampled, "sampled_answers", counted)
    attr = sampled.attribution(mod, make, space, front, 16, 0, ans=ans, values=got["values"])
    # singles (8 samples each), then one call for the second round: GEMM (first of the equal
    # singles) with each other group; GEMM + attention reproduces it
    assert calls == [8 * len(groups), 8 * (len(groups) - 1)]
    t = attr["together"]["x"]
    assert t["groups"] == ["gemm", "attention"] and t["met"] and t["needs"] == ["band", "sign"]
    x = sampled.leads(ans, got["values"], attr)[0]
    assert all(g["spread"] == 0 for g in x["groups"].values())      # no group alone moves it
    # with both groups varied and every other held, the number is the full draw's
    lo, med, hi = np.percentile(got["values"]["x"][:8], [5, 50, 95])
    assert (x["together"]["lo"], x["together"]["hi"]) == pytest.approx((lo, hi))
    assert not x["side_resolved"]
    line = sampled.lead_markdown([x], None)
    assert ("what would change it: no fitted parameter group moves it on its own (8 samples "
            "per group); no group alone reproduces its unresolved side of 1x and 50% of its "
            "band's width: the GEMM and attention parameters together do (together they move it "
            f"{sampled.range_text(lo, hi, 'x')})") in line
    # not even a smaller union: said so
    x["together"]["met"] = False
    assert "nor does any union of fewer than all 2 groups: only all of them together, as " \
        "in the full 16 samples" in sampled.lead_markdown([x], None)


def test_whatif_and_compare_name_the_groups_that_move_it_together():
    from dse.results.bands_report import by_group, changes_words, together
    groups, single_d = B.draw_groups(8, 0)
    T = tables.tables()
    kpos = {k: j for j, k in enumerate(T.kernel_keys)}
    idx = {g: sorted({kpos[p] for f in B.families() if f.group == g for p in f.params
                      if p in kpos}) for g in groups}
    calls = []

    def stat_of(d):                  # a change that moves only when GEMM and attention both do
        calls.append(d.n)
        lg = np.log(d.kernel)
        s = {g: lg[..., idx[g]].reshape(d.n, -1).sum(axis=1) for g in ("gemm", "attention")}
        return {"tpot_s": 0.01 * s["gemm"] * s["attention"], "ttft_s": 0.01 * s["gemm"]}
    full, single = stat_of(B.draw(16, 0)), stat_of(single_d)
    calls.clear()
    t = together(groups, 8, 0, stat_of, full, single)
    assert calls == [8 * (len(groups) - 1)]                  # one round, every set in one go
    assert list(t) == ["tpot_s"]                              # GEMM alone moves ttft_s
    assert t["tpot_s"]["groups"] == ["gemm", "attention"] and t["tpot_s"]["met"]
    lo, hi = np.percentile(full["tpot_s"][:8], [5, 95])
    assert (t["tpot_s"]["lo"], t["tpot_s"]["hi"]) == pytest.approx((lo, hi))
    words = changes_words(by_group(single["tpot_s"], groups, 8), t["tpot_s"], 16, 8,
                          "the unresolved ranking")
    assert words == ("what would change it: no fitted parameter group moves it on its own; no "
                     "group alone reproduces the unresolved ranking and 50% of its band's width: "
                     "the GEMM and attention parameters together do (together they move it "
                     + "..".join(B.band_strings((lo, hi), B.pct, 1)) + ")")
