"""The Python API (dse.api): the same numbers as the commands, on real designs and runs."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from helpers import API_SPACE, ROOT

import dse
from dse.cli import main
from dse.errors import InputError

DESIGN = ROOT / "examples" / "llama70b-h100.toml"
BASE = {"model.id": "llama-3.1-70b", "model.weight_dtype": "fp8", "workload.isl": 2048,
        "workload.osl": 256}
SPACE = API_SPACE
SCALE_COL = "accelerator.hbm_bw_bytes_per_s.scale"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return dse.run(SPACE, out=tmp_path_factory.mktemp("api") / "run")


def test_evaluate_equals_dse_eval_json(capsys):
    assert main(["eval", str(DESIGN), "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    ev = dse.evaluate(DESIGN)
    assert ev.metrics == js["metrics"]
    assert ev.metrics["tpot_s"] > 0 and ev.metrics["bound"] in ("compute", "memory", "network",
                                                                 "capacity")
    # the breakdown frame holds the JSON's per-op times, step by step, and sums to each total
    for step, b in js["breakdown"].items():
        rows = ev.breakdown[ev.breakdown["step"] == step]
        ops = rows[rows["op"] != "overhead"]
        assert list(ops["op"]) == [o["op"] for o in b["ops"]]
        assert np.allclose(ops["time_s"], [o["time_s"] for o in b["ops"]], rtol=0, atol=0)
        assert rows["time_s"].sum() == pytest.approx(b["total_s"], rel=1e-9)
    # the same design given as a dict (dotted paths, or sections) gives the same numbers
    flat = {"accelerator.id": "h100-sxm", "model.id": "llama-3.1-70b", "model.weight_dtype": "fp8",
            "layout.tp": 4, "workload.isl": 2048, "workload.osl": 256, "workload.concurrency": 64}
    assert dse.evaluate(flat).metrics == ev.metrics
    nested = {"accelerator": {"id": "h100-sxm"}, "model": {"id": "llama-3.1-70b",
              "weight_dtype": "fp8"}, "layout": {"tp": 4},
              "workload": {"isl": 2048, "osl": 256, "concurrency": 64}}
    assert dse.evaluate(nested).metrics == ev.metrics


def test_evaluate_refuses_a_bad_dict():
    with pytest.raises(InputError, match="did you mean 'workload.concurrency'"):
        dse.evaluate({"accelerator.id": "h100-sxm", "model.id": "llama-3.1-70b",
                      "workload.concurency": 8})
    with pytest.raises(InputError, match="did you mean 'h100-sxm'"):
        dse.evaluate({"accelerator.id": "h100-sx", "model.id": "llama-3.1-70b"})


def test_score_three_rows_equals_evaluating_each_design():
    rows = [{"accelerator.id": "h100-sxm", "layout.tp": 4, "workload.concurrency": 64},
            {"accelerator.id": "b200", "layout.tp": 8, "workload.concurrency": 256},
            {"accelerator.id": "h200-sxm", "layout.tp": 2, "workload.concurrency": 16}]
    frame = pd.DataFrame(rows, index=[10, 20, 30]).assign(label=["a", "b", "c"])
    out = dse.score(frame, base=BASE)
    assert list(out.index) == [10, 20, 30] and list(out["label"]) == ["a", "b", "c"]
    for (_, got), row in zip(out.iterrows(), rows):
        want = dse.evaluate({**BASE, **row}).metrics
        for k, v in want.items():
            if isinstance(v, float):
                assert got[k] == pytest.approx(v, rel=1e-12), k
            elif v is None:
                assert not np.isfinite(got[k]), k
            else:
                assert got[k] == v, k
    # three different designs: three different answers (the frame is not broadcast from row 0)
    assert out["tpot_s"].nunique() == 3


@pytest.mark.parametrize("column,needle", [
    ("workload.concurency", "did you mean 'workload.concurrency'"),
    ("concurrency", "did you mean 'workload.concurrency'"),
    ("layout.num_chips", "give layout.tp/pp/ep/dp"),
])
def test_score_refuses_a_bad_column_naming_it(column, needle):
    frame = pd.DataFrame([{**BASE, "accelerator.id": "h100-sxm", column: 8}])
    with pytest.raises(InputError, match=needle) as e:
        dse.score(frame)
    assert column in str(e.value)


def test_score_refuses_a_bad_value_naming_the_row():
    frame = pd.DataFrame([{**BASE, "accelerator.id": "h100-sxm", "layout.tp": 4},
                          {**BASE, "accelerator.id": "h100-sxm", "layout.tp": -4}])
    with pytest.raises(InputError, match="row 1") as e:
        dse.score(frame)
    assert "layout.tp" in str(e.value)


def test_load_space_from_a_dict_equals_the_file(tmp_path):
    from dse.api import to_toml
    f = tmp_path / "s.toml"
    f.write_text(to_toml(SPACE))
    a, b = dse.load_space(SPACE), dse.load_space(f)
    assert a.size == b.size == 2 * 2 * 3 * 2
    assert [(p.path, p.values, p.scale) for p in a.parameters] == \
        [(p.path, p.values, p.scale) for p in b.parameters]
    assert a.digest == b.digest and a.objectives == b.objectives


def test_run_status_equals_dse_status_json(run, capsys):
    assert main(["status", str(run.path), "--json"]) == 0
    assert run.status == json.loads(capsys.readouterr().out)
    assert dse.open_run(run.path).status == run.status
    assert run.status["state"] == "finished" and run.status["designs_scored"] == 24


def test_run_front_is_the_pareto_set_of_its_scores(run):
    """Exhaustive runs store each work item's admissible Pareto set: the run's front is the
    Pareto set of those stored scores, and equals a brute-force front of all 24 designs."""
    from dse import pareto
    front, scores = run.front, run.scores
    space = run.space
    F = pareto.objective_matrix(scores, space.objectives)
    assert set(front["design_id"]) == set(scores["design_id"][pareto.nondominated(F)])
    assert len(front) == run.status["front_size"] > 1
    from dse import catalog
    grid = pd.DataFrame(space.values_at(np.arange(space.size)))
    bw = grid["accelerator.id"].map(lambda a: catalog.table("accelerators")[a].hbm_bw_bytes_per_s)
    grid["accelerator.hbm_bw_bytes_per_s"] = grid.pop(SCALE_COL) * bw     # factors -> bytes/s
    every = dse.score(grid, base=BASE)
    ok = every["feasible"] & (every["ttft_s"] <= 5.0)
    G = pareto.objective_matrix(every[ok], space.objectives)
    want = set(np.flatnonzero(ok.to_numpy())[pareto.nondominated(G)])
    assert set(front["design_id"]) == want


def test_scale_factor_columns_are_named_as_such(run, capsys):
    front = pd.read_csv(run.path / "front.csv")
    assert SCALE_COL in front and "accelerator.hbm_bw_bytes_per_s" not in front
    assert set(front[SCALE_COL]) <= {1.0, 1.5}
    assert SCALE_COL in run.scores and SCALE_COL in run.manifest["parameters"]
    assert main(["validate", run.space.file]) == 0
    assert f"{SCALE_COL}: 2 scale factors" in capsys.readouterr().out
    from dse.spec.fields import label
    assert label(SCALE_COL) == f"{SCALE_COL} [factor]"
    assert label("accelerator.hbm_bw_bytes_per_s") == "accelerator.hbm_bw_bytes_per_s [bytes/s]"


def test_an_old_run_folder_with_bare_scale_columns_stays_readable(run, tmp_path, capsys):
    import shutil
    old = tmp_path / "old"
    shutil.copytree(run.path, old)
    m = json.loads((old / "manifest.json").read_text())
    m["parameters"] = [c.removesuffix(".scale") for c in m["parameters"]]
    (old / "manifest.json").write_text(json.dumps(m))
    f = pd.read_csv(old / "front.csv").rename(columns={SCALE_COL: SCALE_COL[:-6]})
    f.to_csv(old / "front.csv", index=False)
    for t in (old / "scores").glob("*.parquet"):
        pd.read_parquet(t).rename(columns={SCALE_COL: SCALE_COL[:-6]}).to_parquet(t)
    r = dse.open_run(old)
    pd.testing.assert_frame_equal(r.front, run.front)
    assert SCALE_COL in r.scores
    assert main(["report", str(old), "--out", str(tmp_path / "rep")]) == 0
    assert SCALE_COL in pd.read_csv(tmp_path / "rep" / "front.csv")
    c = dse.compare(run, old)
    assert c.hypervolume_a == c.hypervolume_b and len(c.appeared) == len(c.vanished) == 0


def test_whatif_sets_a_catalog_id_and_a_choice(run, tmp_path, capsys):
    # --set accelerator.id=b300: every front design re-scored on a B300 (its scale factor kept)
    assert main(["whatif", str(run.path), "--set", "accelerator.id=b300",
                 "--out", str(tmp_path / "b300")]) == 0
    assert "accelerator.id set b300" in (tmp_path / "b300" / "whatif.md").read_text()
    w = dse.whatif(run, set={"accelerator.id": "b300"}, out=tmp_path / "b300-api")
    front = run.front.set_index("design_id")
    rows = front.loc[w.rescored["design_id"]]
    frame = pd.DataFrame({"accelerator.id": "b300", "layout.tp": rows["layout.tp"].to_numpy(),
                          "workload.concurrency": rows["workload.concurrency"].to_numpy()})
    scale = rows[SCALE_COL].to_numpy()
    # the B300's HBM bandwidth times the design's scale factor: the what-if is exactly a B300
    # design with that bandwidth
    from dse import catalog
    frame["accelerator.hbm_bw_bytes_per_s"] = \
        catalog.accelerators()["b300"].hbm_bw_bytes_per_s * scale
    b300 = dse.score(frame, base=BASE)
    assert np.allclose(w.rescored["tpot_s"].to_numpy(), b300["tpot_s"].to_numpy(), rtol=1e-9)
    assert np.allclose(w.rescored["tpot_s_before"], rows["tpot_s"], rtol=1e-6)
    assert (w.rescored["tpot_s"] < w.rescored["tpot_s_before"]).all()   # B300 beats H100/H200
    # --set cost.capex_model=components: the cost moves, the speed does not
    assert main(["whatif", str(run.path), "--set", "cost.capex_model=components",
                 "--out", str(tmp_path / "comp")]) == 0
    c = dse.whatif(run, set=["cost.capex_model=components"], out=tmp_path / "comp-api")
    assert np.allclose(c.rescored["tpot_s"], c.rescored["tpot_s_before"], rtol=1e-12)
    assert not np.allclose(c.rescored["usd_per_mtok_output"],
                           c.rescored["usd_per_mtok_output_before"], rtol=1e-3)


@pytest.mark.parametrize("item,needle", [
    ("accelerator.id=b30", "did you mean 'b300'"),
    ("cost.capex_model=component", "did you mean 'components'"),
    ("model.weight_dtype=fp9", "did you mean"),
])
def test_whatif_refuses_a_typo_in_a_string_value(run, tmp_path, capsys, item, needle):
    assert main(["whatif", str(run.path), "--set", item, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_whatif_refuses_scaling_a_string_field(run, capsys):
    assert main(["whatif", str(run.path), "--scale", "accelerator.id=2"]) == 2
    assert "cannot be scaled" in capsys.readouterr().err


def test_compare_figures_are_what_dse_compare_prints(run, tmp_path, capsys):
    other = dse.run({**SPACE, "name": "api-components", "cost": {"capex_model": "components"}},
                    out=tmp_path / "b")
    c = dse.compare(run, other)
    assert main(["compare", str(run.path), str(other.path), "--out", str(tmp_path / "cmp")]) == 0
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert f"| hypervolume | {c.hypervolume_a:.6g} | {c.hypervolume_b:.6g} |" in md
    assert f"| {c.coverage_a:.3f} | {c.coverage_b:.3f} |" in md
    assert md == "\n".join(c.lines()) + "\n"
    # same speed, different prices: every design's tpot agrees, the cost front moves
    assert len(c.front_a) == run.status["front_size"]
    assert 0.0 <= c.coverage_a <= 1.0 and c.hypervolume_a > 0 and c.hypervolume_b > 0
    c.write(tmp_path / "cmp2")
    assert (tmp_path / "cmp2" / "compare.md").read_text() == md


def test_run_refuses_bad_arguments(tmp_path):
    with pytest.raises(InputError, match="unknown strategy"):
        dse.run(SPACE, strategy="grid", out=tmp_path / "r")
    with pytest.raises(InputError, match="workers 0 must be >= 1"):
        dse.run(SPACE, workers=0, out=tmp_path / "r")
    with pytest.raises(InputError, match="need --storage"):      # exhaustive, no shared storage
        dse.run(SPACE, strategy="exhaustive", workers=2, out=tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_bound_is_defined_once():
    """predict (which chooses the offline maximum batch) and the scorer report the same bound
    for the same design: capacity when the batch fills the HBM."""
    from dse.perf import BOUNDS, KNEE_FRACTION, decode_bound
    # closed form: the largest share of op time wins (the op time of the compute-, memory- and
    # network-bound ops); a batch at the memory limit is capacity-bound
    tc, tm, tn = np.array([3.0, 1.0, 1.0, 1.0]), np.array([1.0, 3.0, 1.0, 3.0]), \
        np.array([1.0, 1.0, 3.0, 1.0])
    bits = np.zeros(4, np.int64)
    got = decode_bound((tc, tm, tn), bits, np.array([10.0, 10, 10, 100]),
                       np.array([100.0, 100, 100, 100]), np.array([1000.0] * 4))
    assert [BOUNDS[i] for i in got] == ["compute", "memory", "network", "capacity"]
    at = KNEE_FRACTION * 100
    assert decode_bound((tm[1:2], tm[1:2] * 3, tn[1:2]), bits[:1], np.array([at]),
                        np.array([100.0]), np.array([1000.0]))[0] == 3
    assert decode_bound((tc[:1], tm[:1], tn[:1]), bits[:1], np.array([100.0]),
                        np.array([100.0]), np.array([1000.0]))[0] == 0   # compute stays
    assert decode_bound((tc[1:2], tm[1:2], tn[1:2]), bits[:1], np.array([100.0]),
                        np.array([100.0]), np.array([100.0]))[0] == 1    # the runtime's cap
    # on a real design: predict's choice, scored as given, says the same
    case = pd.DataFrame([{"case_id": "x", "model": "llama-3.1-70b", "hardware": "h100-sxm",
                          "num_chips": 2, "tp": 2, "pp": 1, "ep": 1, "dp": 1, "isl": 2048,
                          "osl": 256, "weight_dtype": "bf16"}])
    from dse.api import predict
    p = predict(case).iloc[0]
    assert p["bound"] == "capacity"
    got = dse.score(pd.DataFrame([{**BASE, "model.weight_dtype": "bf16",
                                   "accelerator.id": "h100-sxm", "layout.tp": 2,
                                   "workload.concurrency": int(p["concurrency"])}]))
    assert got["bound"].iloc[0] == p["bound"]
    assert dse.evaluate(DESIGN.parent / "llama70b-h100.toml").metrics["bound"] == \
        dse.score(pd.DataFrame([{**BASE, "accelerator.id": "h100-sxm", "layout.tp": 4,
                                 "workload.concurrency": 64}]))["bound"].iloc[0]




def test_the_package_reads_nothing_outside_itself():
    """No module outside the calibration and kernel-fitting tools builds a path into ../shared
    (a string that is such a path or its "shared" segment; prose that mentions it is fine)."""
    for path in (ROOT / "dse").rglob("*.py"):
        rel = path.relative_to(ROOT / "dse")
        if rel.parts[0] == "calibration":          # the fitting tools
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                v = node.value
                assert not v.strip().startswith(("../shared", "shared/")) and v != "shared", \
                    f"{rel}: {v!r}"


def test_the_notebook_example_runs_end_to_end(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "notebook_workflow.py"),
                        str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "as a dict: TPOT" in r.stdout and SCALE_COL in r.stdout
    assert (tmp_path / "run" / "front.csv").is_file()
    assert (tmp_path / "whatif-b300" / "whatif.md").is_file()
    assert (tmp_path / "compare" / "compare.md").is_file()
    assert "hypervolume A" in r.stdout


def test_run_takes_every_setting_of_dse_run_typed_and_documented():
    """Each option of ``dse run`` is an argument of ``dse.run`` (``--resume`` is ``dse.resume``,
    ``--quiet`` is ``progress=False``), annotated, and named in its docstring."""
    import inspect
    import typing

    from dse.cli import build_parser
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["run"]
    options = {a.dest for a in sub._actions} - {"help", "resume", "quiet"}
    sig = inspect.signature(dse.run)
    hints = typing.get_type_hints(dse.api.run)
    assert options <= set(sig.parameters), options - set(sig.parameters)
    assert set(sig.parameters) == options | {"progress"}
    for name in sig.parameters:
        assert name in hints, name
        assert f"``{name}``" in dse.run.__doc__ or name == "space", name

    def literals(t):
        return {v for a in typing.get_args(t) for v in (literals(a) if typing.get_args(a)
                                                        else [a])} - {type(None)}
    strategies = next(a for a in sub._actions if a.dest == "strategy").choices
    assert literals(hints["strategy"]) == {"auto", *strategies}
    samplers = next(a for a in sub._actions if a.dest == "sampler").choices
    assert literals(hints["sampler"]) == set(samplers)
    for fn in (dse.resume, dse.api.Run.resume):
        r = inspect.signature(fn).parameters
        assert {"trials", "budget", "workers", "storage_retry", "progress"} <= set(r)
        assert all(n in typing.get_type_hints(fn) for n in r if n != "self")


def test_run_settings_reach_the_run_as_dse_run_gives_them(tmp_path, capsys):
    kw = dict(strategy="optuna", sampler="random", population=3, trials=10, seed=5,
              segment_trials=7)
    a = dse.run(SPACE, **kw, out=tmp_path / "a")
    f = tmp_path / "s.toml"
    f.write_text(dse.api.to_toml(SPACE))
    assert main(["run", str(f), "--strategy", "optuna", "--sampler", "random", "--population",
                 "3", "--trials", "10", "--seed", "5", "--segment-trials", "7", "--out",
                 str(tmp_path / "b"), "--quiet"]) == 0
    b = dse.open_run(tmp_path / "b")
    for k in ("strategy", "sampler", "population", "trials", "seed", "segment_trials"):
        assert a.manifest[k] == b.manifest[k] == kw[k], k
    assert a.status["trials_completed"] == 10 and a.manifest["segment"] >= 1   # 10 > 7: rotated
    # the same seed and settings: the same designs scored, the same front
    assert sorted(a.scores["design_id"]) == sorted(b.scores["design_id"])
    pd.testing.assert_frame_equal(a.front, b.front)


def test_resume_and_run_resume_continue_a_stopped_run_to_the_exact_front(run, tmp_path):
    r = dse.run(SPACE, strategy="exhaustive", chunk_designs=4, trials=2, out=tmp_path / "r")
    assert r.status["state"] == "stopped" and r.status["designs_scored"] == 8
    assert r.manifest["chunk_designs"] == 4
    assert r.resume(trials=1) is r
    assert r.status["designs_scored"] == 12 and r.status["trials_completed"] == 3
    done = dse.resume(tmp_path / "r")
    assert isinstance(done, dse.Run) and done.path == r.path
    assert done.status["state"] == "finished" and done.status["designs_scored"] == 24
    assert set(done.front["design_id"]) == set(run.front["design_id"])   # one 24-design pass
    with pytest.raises(InputError, match="not a duration"):
        dse.resume(r, budget="soon")


def test_the_command_line_goes_through_the_api(run, tmp_path, capsys, monkeypatch):
    """``dse run``/``--resume``/``worker``/``status``/``compare``/``whatif``/``eval`` call
    dse.api's functions (no second code path): each is wrapped here and must be called, once."""
    import dse.api as api
    calls = []
    for name in ("run", "resume", "work", "open_run", "compare", "whatif", "evaluate"):
        real = getattr(api, name)
        monkeypatch.setattr(api, name, lambda *a, _f=real, _n=name, **k:
                            (calls.append(_n), _f(*a, **k))[1])
    f = tmp_path / "s.toml"
    f.write_text(dse.api.to_toml(SPACE))
    out = tmp_path / "r"

    def first_call(argv):          # the API function the command called (it may call others)
        calls.clear()
        assert main(argv) == 0
        return calls[0]

    assert first_call(["run", str(f), "--chunk-designs", "8", "--trials", "1", "--out", str(out),
                       "--quiet"]) == "run"
    assert dse.open_run(out).status["designs_scored"] == 8
    assert first_call(["run", "--resume", str(out), "--quiet"]) == "resume"
    assert dse.open_run(out).status["designs_scored"] == 24
    calls.clear()                  # (an exhaustive run without --storage takes no worker:
    assert main(["worker", str(out), "--trials", "1", "--quiet"]) == 2   # dse.work refuses)
    assert calls[:1] == ["work"]
    assert first_call(["status", str(out)]) == "open_run"
    assert first_call(["compare", str(out), str(run.path), "--bands", "0",
                       "--out", str(tmp_path / "c")]) == "compare"
    assert first_call(["whatif", str(out), "--scale", "cost.pue=1.1", "--bands", "0",
                       "--out", str(tmp_path / "w")]) == "whatif"
    assert first_call(["eval", str(DESIGN)]) == "evaluate"
    capsys.readouterr()


def test_dir_lists_the_public_api_each_documented():
    import dse.cli  # noqa: F401  (submodules imported: still not in the listing)
    import dse.search.driver  # noqa: F401
    names = dir(dse)
    assert names == sorted(dse.__all__)
    assert {"run", "resume", "open_run", "evaluate", "score", "load_space", "compare", "whatif",
            "predict", "Run", "InputError"} <= set(names)
    assert not {"api", "cli", "search", "runs", "space"} & set(names)
    for name in names:
        obj = getattr(dse, name)
        if name != "__version__":
            assert callable(obj) and (obj.__doc__ or "").strip(), name
    assert callable(dse.predict) and callable(dse.evaluate)   # the functions, not the modules


PROBE = r'''
import json, os, sys
opened = []
def hook(event, args):
    if event in ("open", "os.listdir", "os.scandir") and args and isinstance(args[0], (str, bytes, os.PathLike)):
        opened.append(os.fsdecode(args[0]))
sys.addaudithook(hook)
import pandas as pd
import dse
SPACE = {"name": "probe", "accelerator": {"id": "h100-sxm"},
         "model": {"id": "llama-3.1-70b", "weight_dtype": "fp8"}, "workload": {"isl": 2048, "osl": 256},
         "parameters": {"accelerator.id": ["h100-sxm", "b200"], "layout.tp": [4, 8],
                        "workload.concurrency": [8, 64, 512]},
         "objectives": {"usd_per_mtok_output": "minimize", "tpot_s": "minimize"}}
ev = dse.evaluate({"accelerator.id": "h100-sxm", "model.id": "llama-3.1-70b", "layout.tp": 4,
                   "workload.concurrency": 64})
dse.score(pd.DataFrame([{"accelerator.id": "b200", "model.id": "llama-3.1-70b", "layout.tp": 8}]))
a = dse.run(SPACE, out="runs/a")
b = dse.run({**SPACE, "name": "probe-b"}, strategy="optuna", sampler="random", population=4,
            trials=8, out="runs/b")
a.front, b.scores, a.status
a.report("rep")
dse.whatif(a, set={"accelerator.id": "b300"}, out="w", bands=4)
dse.compare(a, b, bands=4).write("c")
dse.predict(pd.DataFrame([{"case_id": "x", "model": "llama-3.1-70b", "hardware": "h100-sxm",
                           "num_chips": 2, "tp": 2, "pp": 1, "ep": 1, "dp": 1, "isl": 2048,
                           "osl": 256, "weight_dtype": "bf16"}]))
json.dump({"opened": opened, "modules": sorted(m for m in sys.modules if m.startswith("dse"))},
          open(sys.argv[1], "w"))
'''


def test_at_run_time_the_package_opens_no_file_outside_itself(tmp_path):
    """An audit hook records every file and folder opened while a fresh process evaluates,
    scores, runs (exhaustive and optuna), reports, what-ifs (with bands), compares and predicts
    from dicts and DataFrames in an empty folder: nothing above the package is read (no
    ../shared, no spaces/ or examples/ of the checkout), only the package, the run's own folder
    and the Python installation; the fit-only tools (dse.calibration.fit, dse.calibration.calibrate, dse.calibration.kernels,
    which read ../shared/calibration when fitting) are not even imported."""
    (tmp_path / "probe.py").write_text(PROBE)
    work = tmp_path / "cwd"
    work.mkdir()
    # the scratch files a dict space is written to (tempfile) go to the test's own folder: a
    # checkout cloned into the system's temp folder would otherwise see them "above" itself
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "TMPDIR": str(tmp_path / "tmp")}
    r = subprocess.run([sys.executable, str(tmp_path / "probe.py"), str(tmp_path / "out.json")],
                       cwd=work, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads((tmp_path / "out.json").read_text())
    opened = {os.path.realpath(os.path.join(work, p)) for p in got["opened"]}
    pkg = os.path.realpath(ROOT / "dse")
    assert any(p.startswith(pkg + os.sep) and p.endswith(".toml") for p in opened)  # the catalog
    allowed = [pkg, os.path.realpath(tmp_path), os.path.realpath(sys.prefix),
               os.path.realpath(sys.base_prefix)]
    above = os.path.realpath(ROOT.parent)
    listed = {os.path.realpath(p or ".") for p in [str(ROOT), *sys.path]}   # import's listdir
    # installed distributions' metadata (an editable install's dse.egg-info in the checkout,
    # read by importlib.metadata's entry-point scans), not a file of the project
    meta = lambda p: any(c.endswith((".egg-info", ".dist-info")) for c in p.split(os.sep))  # noqa: E731
    outside = sorted(p for p in opened if (p == above or p.startswith(above + os.sep))
                     and not any(p == a or p.startswith(a + os.sep) for a in allowed)
                     and p not in listed and not meta(p))
    assert not outside, outside[:20]
    assert {"dse.api", "dse.search.driver", "dse.results.report", "dse.results.whatif"} <= set(got["modules"])
    assert not {m for m in got["modules"] if m.split(".")[1:2] in (["fit"], ["calibrate"],
                                                                    ["kernels"])}
