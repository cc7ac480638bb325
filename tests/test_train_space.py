"""Training spaces (``task = "train"``): loading and bad input, the space scorer against
``dse predict --train`` (one model), reason bits, and the search, eval, report, compare, what-if
and the Python API on training runs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from helpers import ROOT, run_cli

import dse
from dse import catalog, pareto
from dse.build.space import load_space
from dse.errors import InputError
from dse.scoring import train_space
from dse.scoring.train_predict import predict_train_frame

SMALL = """
task = "train"
name = "small-train"
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
"layout.zero_stage" = [1, 3]
[objectives]
train_time_s = "minimize"
train_cost_usd = "minimize"
[constraints]
step_time_s = { max = 30.0 }
"""


def write(tmp_path, text, name="space.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.fixture
def small(tmp_path):
    return load_space(str(write(tmp_path, SMALL)))


# --- one model: the space scorer gives what dse predict --train gives ----------------------

CASES = [
    dict(case_id="dense", model="llama-3.1-70b", hardware="h100-sxm", num_chips=64, tp=8, pp=2,
         dp=4, cp=1, ep=1, vp=1, zero_stage=1, global_batch_seqs=256, micro_batch_seqs=1,
         seq_len=4096, precision="bf16", recompute="full", pipeline_schedule="1f1b",
         sequence_parallel="true"),
    dict(case_id="moe", model="deepseek-v3", hardware="h100-sxm", num_chips=256, tp=2, pp=8,
         dp=16, cp=1, ep=8, vp=2, zero_stage=1, global_batch_seqs=512, micro_batch_seqs=1,
         seq_len=4096, precision="fp8_block", recompute="selective",
         pipeline_schedule="interleaved", sequence_parallel="true", mtp_layers=1),
    dict(case_id="cp", model="llama-3.1-8b", hardware="b200", num_chips=32, tp=2, pp=1, dp=8,
         cp=2, ep=1, vp=1, zero_stage=3, global_batch_seqs=64, micro_batch_seqs=2,
         seq_len=16384, precision="fp8", recompute="none", pipeline_schedule="1f1b",
         sequence_parallel="false"),
]


def case_space(tmp_path, c) -> str:
    sp = {"true": "on", "false": "off"}[c["sequence_parallel"]]
    return f"""
task = "train"
[training]
global_batch_seqs = {c['global_batch_seqs']}
seq_len = {c['seq_len']}
precision = "{c['precision']}"
mtp_layers = {c.get('mtp_layers', 0)}
[model]
id = "{c['model']}"
[accelerator]
id = "{c['hardware']}"
[layout]
tp = {c['tp']}
pp = {c['pp']}
dp = {c['dp']}
cp = {c['cp']}
ep = {c['ep']}
vp = {c['vp']}
micro_batch_seqs = {c['micro_batch_seqs']}
zero_stage = {c['zero_stage']}
recompute = "{c['recompute']}"
pipeline_schedule = "{c['pipeline_schedule']}"
sequence_parallel = "{sp}"
[objectives]
step_time_s = "minimize"
"""


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["case_id"])
def test_space_scorer_is_predict_train(tmp_path, case):
    """A training space's design and the same job as a predict --train case: the same numbers
    (float64 to 1e-9; the search's float32 to 1e-4)."""
    pred = predict_train_frame(pd.DataFrame([{k: str(v) for k, v in case.items()}])).iloc[0]
    space = load_space(str(write(tmp_path, case_space(tmp_path, case))))
    s = train_space.score_values(space, {}, dtype=np.float64)
    s32 = train_space.score_values(space, {}, dtype=np.float32)
    for k in ("step_time_s", "tokens_per_s_per_chip", "mfu", "hfu", "memory_per_chip_bytes",
              "bubble_s", "network_exposed_s", "usd_per_trillion_tokens"):
        assert float(s[k][0]) == pytest.approx(float(pred[k]), rel=1e-9, abs=1e-12), k
        assert float(s32[k][0]) == pytest.approx(float(pred[k]), rel=1e-4, abs=1e-6), k
    assert bool(s["feasible"][0]) == bool(pred["feasible"])


def test_job_metrics_follow_from_the_step(small):
    """train_time_s, train_cost_usd, train_energy_j and chips worked from the step by hand."""
    ids = np.arange(small.size)
    s = train_space.score_index(small, ids, dtype=np.float64)
    v = small.values_at(ids)
    chips = v["layout.tp"] * v["layout.pp"] * v["layout.dp"]
    assert np.array_equal(np.asarray(s["num_chips"]), chips)
    tokens_per_step = 512 * 4096
    t = 1e12 / tokens_per_step * np.asarray(s["step_time_s"])      # steps x step time
    assert np.allclose(s["train_time_s"], t, rtol=1e-9)
    price = np.where(v["accelerator.id"] == "h100-sxm",
                     catalog.accelerators()["h100-sxm"].price.usd_per_hour,
                     catalog.accelerators()["b200"].price.usd_per_hour)
    assert np.allclose(s["train_cost_usd"], t / 3600.0 * chips * price, rtol=1e-9)
    power = np.where(v["accelerator.id"] == "h100-sxm",
                     catalog.accelerators()["h100-sxm"].price.all_in_power_w,
                     catalog.accelerators()["b200"].price.all_in_power_w)
    assert np.allclose(s["train_energy_j"], t * chips * power, rtol=1e-9)
    assert np.allclose(s["train_steps"], 1e12 / tokens_per_step, rtol=1e-6)


def test_scale_factor_is_the_scaled_catalog_value(tmp_path):
    base = SMALL.replace('"layout.zero_stage" = [1, 3]', "")
    a = load_space(str(write(tmp_path, base.replace(
        '[parameters]', '[parameters]\n"accelerator.hbm_bw_bytes_per_s" = { scale = [1.5] }'),
        "a.toml")))
    bw = catalog.accelerators()["h100-sxm"].hbm_bw_bytes_per_s
    b = load_space(str(write(tmp_path, base.replace(
        '"accelerator.id" = ["h100-sxm", "b200"]', '"accelerator.id" = ["h100-sxm"]').replace(
        '[parameters]', f'[parameters]\n"accelerator.hbm_bw_bytes_per_s" = [{1.5 * bw}]'),
        "b.toml")))
    sa = train_space.score_index(a, np.arange(b.size), dtype=np.float64)
    sb = train_space.score_index(b, np.arange(b.size), dtype=np.float64)
    assert np.allclose(sa["step_time_s"], sb["step_time_s"], rtol=1e-12)
    plain = load_space(str(write(tmp_path, base, "c.toml")))
    sp = train_space.score_index(plain, np.arange(b.size), dtype=np.float64)
    # more bandwidth: the optimizer step (HBM-bound, no fixed part) shrinks by the factor, and
    # so does no compute
    assert np.allclose(np.asarray(sa["optimizer_s"]) * 1.5, sp["optimizer_s"], rtol=1e-9)
    assert (np.asarray(sa["memory_s"]) < np.asarray(sp["memory_s"])).all()


def test_a_factor_scales_the_value_the_design_gives(tmp_path):
    """A scale factor (parameter or what-if) multiplies the base design's own value where it
    gives one, else the catalog's."""
    text = SMALL.replace('[accelerator]\nid = "h100-sxm"',
                         '[accelerator]\nid = "h100-sxm"\nhbm_bw_bytes_per_s = 2e12')
    text = text.replace('"accelerator.id" = ["h100-sxm", "b200"]', "")
    a = load_space(str(write(tmp_path, text.replace(
        "[parameters]", '[parameters]\n"accelerator.hbm_bw_bytes_per_s" = { scale = [1.5] }'),
        "a.toml")))
    b = load_space(str(write(tmp_path, text.replace('hbm_bw_bytes_per_s = 2e12',
                                                    'hbm_bw_bytes_per_s = 3e12'), "b.toml")))
    ids = np.arange(b.size)
    sa = train_space.score_index(a, ids, dtype=np.float64)
    sb = train_space.score_index(b, ids, dtype=np.float64)
    assert np.allclose(sa["optimizer_s"], sb["optimizer_s"], rtol=1e-12)
    over = train_space.score_values(a, a.values_at(ids),
                                    {"accelerator.hbm_bw_bytes_per_s": ("scale", 2.0)},
                                    dtype=np.float64)
    assert np.allclose(np.asarray(over["optimizer_s"]) * 2.0, sa["optimizer_s"], rtol=1e-12)


def test_moe_shape_parameters_reach_the_model(tmp_path):
    text = """
task = "train"
[training]
global_batch_seqs = 256
seq_len = 4096
precision = "fp8_block"
[model]
id = "deepseek-v3"
[accelerator]
id = "gb200"
[layout]
tp = 1
pp = 16
dp = 64
ep = 64
recompute = "full"
[parameters]
"model.num_experts" = [64, 256]
"model.num_experts_per_tok" = [4, 8]
[objectives]
train_time_s = "minimize"
"""
    space = load_space(str(write(tmp_path, text)))
    s = train_space.score_index(space, np.arange(4), dtype=np.float64)
    v = space.values_at(np.arange(4))
    # fewer experts per token: less expert work and fewer model FLOPs per token
    mflops = np.asarray(s["model_tflops_per_chip"]) * np.asarray(s["step_time_s"])
    k4, k8 = v["model.num_experts_per_tok"] == 4, v["model.num_experts_per_tok"] == 8
    assert (mflops[k4] < mflops[k8]).all()
    # more experts: more expert weights per chip (the same ep)
    e64, e256 = v["model.num_experts"] == 64, v["model.num_experts"] == 256
    assert (np.asarray(s["weights_bytes"])[e64] < np.asarray(s["weights_bytes"])[e256]).all()


# --- reasons -------------------------------------------------------------------------------

def one(tmp_path, layout: str, model="llama-3.1-405b", acc="h100-sxm", training="") -> dict:
    text = f"""
task = "train"
[training]
global_batch_seqs = 1024
seq_len = 8192
{training}
[model]
id = "{model}"
[accelerator]
id = "{acc}"
[layout]
{layout}
[objectives]
train_time_s = "minimize"
"""
    s = train_space.score_values(load_space(str(write(tmp_path, text))), {}, dtype=np.float64)
    return {k: np.asarray(v)[0] for k, v in s.items()}


GOOD = "tp = 8\npp = 16\ndp = 64\nrecompute = \"full\"\n"


@pytest.mark.parametrize("layout,model,acc,training,bit", [
    (GOOD, "llama-3.1-405b", "h100-sxm", "", 0),
    ("tp = 3\npp = 16\ndp = 64\nrecompute = \"full\"", "llama-3.1-405b", "h100-sxm", "", 1),
    (GOOD + "ep = 2", "llama-3.1-405b", "h100-sxm", "", 2),
    ("tp = 8\npp = 128\ndp = 8\nrecompute = \"full\"", "llama-3.1-405b", "h100-sxm", "", 4),
    ("tp = 8\npp = 4\ndp = 8\nrecompute = \"none\"", "llama-3.1-405b", "h100-sxm", "", 8),
    (GOOD, "llama-3.1-405b", "a100-sxm-80g", 'precision = "fp8"', 512),
    ("tp = 8\npp = 16\ndp = 48\nrecompute = \"full\"", "llama-3.1-405b", "h100-sxm", "", 1024),
    (GOOD + "cp = 3", "llama-3.1-405b", "h100-sxm", "", 2048),
    (GOOD + "vp = 2", "llama-3.1-405b", "h100-sxm", "", 4096),
    ("tp = 8\npp = 16\nnum_chips = 1000\nrecompute = \"full\"", "llama-3.1-405b", "h100-sxm",
     "", 8192),
])
def test_reason_bits(tmp_path, layout, model, acc, training, bit):
    s = one(tmp_path, layout, model, acc, training)
    if bit == 0:
        assert s["reason"] == 0 and s["feasible"]
    else:
        assert s["reason"] & bit and not s["feasible"]
        assert train_space.REASONS[bit] in train_space.reason_text(int(s["reason"]))
    if bit == 8:       # the memory bit exactly where the memory exceeds the HBM
        assert s["hbm_used_fraction"] > 1.0


def test_invalid_layouts_are_flagged_not_scored(tmp_path):
    """A chunk mixing valid and invalid layouts (3 sequences per micro-batch do not divide the
    batch): the valid ones score exactly as alone, the invalid ones are NaN and flagged (the
    search never reads their numbers)."""
    small = load_space(str(write(tmp_path, SMALL.replace(
        "[parameters]", '[parameters]\n"layout.micro_batch_seqs" = [1, 3]'))))
    ids = np.arange(small.size)
    s = train_space.score_index(small, ids, dtype=np.float64)
    bits = np.asarray(s["reason"])
    layout = (bits & ~(8 | 512)) != 0
    assert layout.any() and (~layout).any()
    assert np.isnan(np.asarray(s["step_time_s"])[layout]).all()
    assert not np.asarray(s["feasible"])[layout].any()
    ok = ids[~layout]
    alone = train_space.score_index(small, ok, dtype=np.float64)
    for k in ("step_time_s", "train_cost_usd", "memory_per_chip_bytes", "reason"):
        assert np.array_equal(np.asarray(s[k])[ok], np.asarray(alone[k])), k


def test_num_chips_sets_dp(tmp_path):
    a = one(tmp_path, "tp = 8\npp = 16\nnum_chips = 8192\nrecompute = \"full\"")
    b = one(tmp_path, GOOD)
    assert a["num_chips"] == 8192 and a["step_time_s"] == pytest.approx(b["step_time_s"])


# --- the search ----------------------------------------------------------------------------

def brute(space):
    ids = np.arange(space.size)
    s = train_space.score_index(space, ids)
    ok = pareto.admissible(s, space.objectives, space.constraints)
    F = pareto.objective_matrix(s, space.objectives)[ok]
    return set(ids[ok][pareto.nondominated(F)].tolist()), s


def test_exhaustive_run_is_the_exact_front(tmp_path, small):
    d = dse.run(small.file, out=tmp_path / "run", progress=False)
    front = d.front
    exact, s = brute(small)
    assert set(front["design_id"].astype(int)) == exact
    assert len(front) >= 2
    assert np.isfinite(front[["train_time_s", "train_cost_usd"]].to_numpy()).all()
    # the constraint and memory: nothing on the front misses them, and they do bind
    assert (np.asarray(s["step_time_s"])[front["design_id"]] <= 30.0).all()
    assert (np.asarray(s["reason"])[front["design_id"]] == 0).all()
    assert ((np.asarray(s["reason"]) & 8) != 0).any()
    assert (np.asarray(s["step_time_s"]) > 30.0).any()
    m = json.loads((d.path / "manifest.json").read_text())
    assert m["task"] == "train"
    table = pd.read_parquet(next((d.path / "scores").glob("*.parquet")))
    assert {"train_time_s", "mfu", "num_chips", "feasible"} <= set(table.columns)


def test_optuna_run_finds_front_designs(tmp_path, small):
    r = dse.run(small.file, strategy="optuna", trials=60, seed=3, out=tmp_path / "o",
                progress=False)
    exact, s = brute(small)
    got = r.front
    assert len(got) and np.isfinite(got[["train_time_s", "train_cost_usd"]].to_numpy()).all()
    ids = got["design_id"].to_numpy(int)
    assert (np.asarray(s["reason"])[ids] == 0).all()
    assert (np.asarray(s["step_time_s"])[ids] <= 30.0).all()
    # its values are the scorer's (float32 chunks)
    assert np.allclose(got["train_time_s"], np.asarray(s["train_time_s"])[ids], rtol=1e-5)


def test_report_compare_whatif_on_training_runs(tmp_path, small, capsys):
    a = dse.run(small.file, out=tmp_path / "a", progress=False)
    other = write(tmp_path, SMALL.replace('"layout.pp" = [1, 2, 4]', '"layout.pp" = [1, 2, 4, 8]'),
                  "other.toml")
    b = dse.run(str(other), out=tmp_path / "b", progress=False)
    rc, out, err = run_cli(capsys, "report", a.path, "--out", tmp_path / "rep")
    assert rc == 0, err
    summary = (tmp_path / "rep" / "summary.md").read_text()
    assert "a training space: tokens = 1e+12" in summary and "step bound:" in summary
    assert "KV cache" not in summary
    assert "exposed communication" in (tmp_path / "rep" / "index.html").read_text()
    rc, out, err = run_cli(capsys, "compare", a.path, b.path, "--out", tmp_path / "cmp")
    assert rc == 0, err
    c = dse.compare(a, b)
    assert c.hypervolume_b >= c.hypervolume_a - 1e-12          # B's space holds A's
    rc, out, err = run_cli(capsys, "whatif", a.path, "--scale",
                           "accelerator.peak_flops_per_s=2", "--out", tmp_path / "wi")
    assert rc == 0, err
    w = dse.whatif(a, scale={"accelerator.peak_flops_per_s": 2.0})
    ch = w.rescored["train_time_s_change"].to_numpy()
    assert (ch < 0).all() and (ch > -0.5 - 1e-9).all()    # faster, at most by the factor
    w2 = dse.whatif(a, set={"accelerator.id": "gb200"})
    assert (w2.rescored["train_time_s"] != w2.rescored["train_time_s_before"]).any()
    rc, out, err = run_cli(capsys, "whatif", a.path, "--set", "layout.tp=3")
    assert rc == 2 and "none of the front" in err and len(err.strip().splitlines()) == 1
    rc, out, err = run_cli(capsys, "whatif", a.path, "--set", "accelerator.id=b20")
    assert rc == 2 and "b200" in err and len(err.strip().splitlines()) == 1


def test_evaluate_and_eval(tmp_path, capsys):
    design = {"task": "train", "training": {"global_batch_seqs": 1024, "seq_len": 8192},
              "model.id": "llama-3.1-405b", "accelerator.id": "h100-sxm", "layout.tp": 8,
              "layout.pp": 16, "layout.dp": 64, "layout.recompute": "full"}
    ev = dse.evaluate(design)
    s = one(tmp_path, GOOD)
    assert ev.metrics["step_time_s"] == pytest.approx(float(s["step_time_s"]), rel=1e-12)
    assert ev.metrics["feasible"] is True and ev.metrics["num_chips"] == 8192
    assert set(ev.breakdown["part"]) >= {"compute_s", "bubble_s", "activations_bytes"}
    no_task = {k: v for k, v in design.items() if k != "task"}
    assert dse.evaluate(no_task, task="train").metrics == ev.metrics
    f = tmp_path / "d.toml"
    f.write_text('task = "train"\n[training]\nglobal_batch_seqs = 1024\nseq_len = 8192\n'
                 '[model]\nid = "llama-3.1-405b"\n[accelerator]\nid = "h100-sxm"\n'
                 '[layout]\ntp = 8\npp = 16\ndp = 64\nrecompute = "full"\n')
    rc, out, err = run_cli(capsys, "eval", f)
    assert rc == 0 and "step bound:" in out and "train_time_s" in out
    rc, out, err = run_cli(capsys, "eval", f, "--json")
    assert json.loads(out)["metrics"]["num_chips"] == 8192


# --- bad input: one line, exit 2 -----------------------------------------------------------

@pytest.mark.parametrize("change,words", [
    (("global_batch_seqs = 512", "global_batch_seq = 512"), "global_batch_seqs"),
    (("seq_len = 4096", "seq_len = -4096"), "training.seq_len"),
    (("tokens = 1e12", "tokens = nan"), "training.tokens"),
    (('"layout.tp" = [2, 4, 8]', '"layout.tpp" = [2, 4, 8]'), "layout.tp"),
    (('"layout.dp" = [8, 16, 32]', '"layout.dp" = [8, -16, 32]'), "layout.dp"),
    (('"layout.recompute" = ["none", "selective", "full"]',
      '"layout.recompute" = ["none", "selectve"]'), "selective"),
    (('"accelerator.id" = ["h100-sxm", "b200"]', '"accelerator.id" = ["h100-sxm", "b20"]'),
     "b200"),
    (('train_time_s = "minimize"', 'train_tme_s = "minimize"'), "train_time_s"),
    (('step_time_s = { max = 30.0 }', 'step_time_s = { max = nan }'), "step_time_s"),
    (('task = "train"', 'task = "trian"'), "train"),
    (('[model]', '[layout]\nnum_chips = 64\ndp = 8\n[model]'), "num_chips"),
])
def test_bad_training_space_one_line(tmp_path, capsys, change, words):
    f = write(tmp_path, SMALL.replace(*change))
    assert SMALL.replace(*change) != SMALL
    rc, out, err = run_cli(capsys, "run", f, "--out", tmp_path / "r")
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert str(f) in err and words in err
    assert not (tmp_path / "r").exists()


def test_shipped_training_space_runs(tmp_path):
    space = load_space(str(ROOT / "spaces" / "train-405b.toml"))
    assert space.task == "train" and space.size == 10_368
    r = dse.run(space.file, out=tmp_path / "r", progress=False)
    assert len(r.front) >= 3
    assert set(r.front["accelerator.id"]) <= {"h100-sxm", "b200", "gb200"}


def test_api_refuses_a_serving_task_on_a_training_design():
    with pytest.raises(InputError):
        dse.evaluate({"task": "train", "model.id": "llama-3.1-8b",
                      "accelerator.id": "h100-sxm"}, task="serve")
