"""Architecture contracts: dse.perf is pure numpy, every command uses the same model."""

from __future__ import annotations

import ast
import subprocess
import sys

from helpers import ROOT

PERF = ROOT / "dse" / "perf"
FORBIDDEN_IMPORTS = {"pandas", "optuna", "networkx", "scipy", "os", "io", "pathlib", "json",
                     "tomllib", "csv", "pickle", "sqlite3", "shutil", "requests", "urllib"}


def test_perf_imports_only_numpy_and_itself():
    for path in PERF.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [(node.module or "").split(".")[0]]
            else:
                continue
            for n in names:
                assert n in {"numpy", "dse", "__future__", "dataclasses", "functools"}, \
                    f"{path.name} imports {n}"
                assert n not in FORBIDDEN_IMPORTS


def test_perf_does_no_io():
    for path in PERF.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in {"open", "print", "input", "exec", "eval"}, \
                    f"{path.name} calls {node.func.id}"


def test_importing_perf_pulls_in_no_heavy_dependency():
    code = ("import sys, dse.perf; bad = [m for m in ('pandas', 'optuna', 'networkx', 'scipy') "
            "if m in sys.modules]; print(','.join(bad)); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_scorer_has_no_loop_over_rows():
    # loops in dse/perf may only run over op classes or fixed tuples, never over candidates
    for path in PERF.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.For, ast.comprehension)):
                it = ast.unparse(node.iter)
                assert "range(len(" not in it and "range(n" not in it, f"{path.name}: {it}"


def test_eval_and_predict_agree(tmp_path):
    # one model, one oracle: the design file and the equivalent case row give the same numbers
    from dse.evaluate import evaluate_file
    from dse.predict import predict_frame
    import pandas as pd
    res = evaluate_file(str(ROOT / "examples" / "llama70b-h100.toml"))
    case = pd.DataFrame([{"case_id": "x", "model": "llama-3.1-70b", "hardware": "h100-sxm",
                          "num_chips": 4, "tp": 4, "pp": 1, "ep": 1, "dp": 1, "weight_dtype": "fp8",
                          "isl": 2048, "osl": 256, "concurrency": 64}])
    p = predict_frame(case).iloc[0]
    for k in ("ttft_s", "tpot_s", "output_tokens_per_s_per_chip", "input_tokens_per_s_per_chip"):
        assert abs(res["metrics"][k] / p[k] - 1) < 1e-9, k
