"""Architecture contracts: the layers as folders with imports that only go down, dse.perf pure
numpy, every command on the same model."""

from __future__ import annotations

import ast
import subprocess
import sys

from helpers import ROOT

# The layers, bottom to top. A module may import modules of its own layer (without a circle) and
# of the layers below it, never of a layer above (checked with ``ast``: module-level imports and
# imports inside functions alike).
LAYERS = (
    ("ground", ("dse.errors", "dse.units", "dse.version", "dse.pareto")),   # ground imports ground only
    ("model", ("dse.perf",)),                   # the numpy model
    ("catalog", ("dse.catalog",)),              # data with sources, the pydantic specs, topologies
    ("spec", ("dse.spec",)),                    # what a user writes: fields, validation, files
    ("build", ("dse.build",)),                  # documents + catalog -> Batch
    ("scoring", ("dse.scoring",)),              # predict, evaluate, bands
    ("calibration", ("dse.calibration",)),      # the fits (only tools import it)
    ("search", ("dse.search",)),                # the run store, the loop, the driver, strategies
    ("results", ("dse.results",)),              # the run reader, report, pages, compare, what-if
    ("api", ("dse.api",)),                      # the Python API
    ("questions", ("dse.questions",)),          # the worked questions (on the API)
    ("interface", ("dse.cli", "dse.bench", "dse.__main__", "dse")),
)
# imports of dse modules inside functions: only where start-up time needs them, with the reason
LAZY = {
    "dse": "``import dse.perf`` stays numpy-only: the package's API is imported on first use",
    "dse.cli": "``dse --help``, ``--version`` and usage errors answer without importing pandas, "
               "the catalog or optuna: each command imports what it runs",
}
TOP_LEVEL_MAX = 10          # modules at the top of dse/ (the rest live in their layer's folder)

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
                # collections: collections.abc's Mapping (train_batch.GatheredKernel), no I/O
                assert n in {"numpy", "dse", "__future__", "dataclasses", "functools",
                             "collections"}, f"{path.name} imports {n}"
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
    import pandas as pd

    from dse.scoring.evaluate import evaluate_file
    from dse.scoring.predict import predict_frame
    res = evaluate_file(str(ROOT / "examples" / "llama70b-h100.toml"))
    case = pd.DataFrame([{"case_id": "x", "model": "llama-3.1-70b", "hardware": "h100-sxm",
                          "num_chips": 4, "tp": 4, "pp": 1, "ep": 1, "dp": 1, "weight_dtype": "fp8",
                          "isl": 2048, "osl": 256, "concurrency": 64}])
    p = predict_frame(case).iloc[0]
    for k in ("ttft_s", "tpot_s", "output_tokens_per_s_per_chip", "input_tokens_per_s_per_chip"):
        assert abs(res["metrics"][k] / p[k] - 1) < 1e-9, k


# Where dse leans on Optuna beyond its documented Python API, each with why (the allowlist of
# test_dse_uses_no_private_optuna_internals; a new use fails it, a stale entry too):
OPTUNA_CONVENTIONS = {
    # the system attr ``Study.enqueue_trial`` stores a waiting trial's parameters in (its
    # ``params`` are empty until it is asked): the chunk or design a waiting trial stands for
    ("dse/search/optuna/enqueue.py", "fixed_params"),
    ("dse/search/shards.py", "fixed_params"),
    # the RDB's ``trials`` table, counted by state in one SQL query: the public
    # ``get_all_trials`` loads every trial of every segment, each batch of a long shared run
    ("dse/search/optuna/segments.py", "sa.table('trials'"),
    ("dse/search/shards.py", "segments.TRIALS"),
}


def test_dse_uses_no_private_optuna_internals():
    """Optuna is pinned to the tested minor (pyproject: optuna>=5.0,<5.1) and dse uses only its
    public API: no ``optuna._x`` module or name, no ``obj._attr`` of an object that is not dse's
    own (Optuna's ``study._storage``, ``trial._trial_id``, ``storage._backend``, ...), no
    ``getattr(obj, "_x")``; Optuna's storage conventions only where OPTUNA_CONVENTIONS says."""
    import re
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "optuna>=5.0,<5.1" in [d.split("#")[0].strip() for d in deps]
    import optuna
    assert optuna.__version__.startswith("5.0.")          # the tested minor is installed
    found, conventions = [], set()
    for path in sorted((ROOT / "dse").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        text = path.read_text()
        tree = ast.parse(text)
        own = {"self", "cls"}          # names of dse's own modules and objects in this file
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("dse")):
                own |= {a.asname or a.name for a in n.names}
            elif isinstance(n, ast.Import):
                own |= {a.asname or a.name.split(".")[0] for a in n.names
                        if a.name.split(".")[0] == "dse"}
        for n in ast.walk(tree):
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""]
                names = [] if isinstance(n, ast.Import) else [a.name for a in n.names]
                if any(m.split(".")[0] == "optuna" for m in mods):
                    parts = [p for m in mods for p in m.split(".")] + names
                    if any(p.startswith("_") for p in parts):
                        found.append(f"{rel}:{n.lineno}: {ast.unparse(n)}")
            elif isinstance(n, ast.Attribute) and n.attr.startswith("_") and \
                    not n.attr.startswith("__"):
                if not (isinstance(n.value, ast.Name) and n.value.id in own):
                    found.append(f"{rel}:{n.lineno}: {ast.unparse(n)}")
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and \
                    n.func.id in ("getattr", "hasattr", "setattr") and len(n.args) > 1 and \
                    isinstance(n.args[1], ast.Constant) and str(n.args[1].value).startswith("_"):
                found.append(f"{rel}:{n.lineno}: {ast.unparse(n)}")
        for m in re.finditer(r"optuna\._\w+|\._(storage|backend|cached_frozen_trial|trial_id|"
                             r"study_id|fixed_params)\b", text):
            found.append(f"{rel}: {m.group(0)}")
        src = ast.unparse(tree)          # code only: docstrings and comments may name them
        for f, needle in OPTUNA_CONVENTIONS:
            if f == rel and needle in src:
                conventions.add((f, needle))
        for needle in ("fixed_params", "sa.table('trials'", "segments.TRIALS"):
            if needle in src and (rel, needle) not in OPTUNA_CONVENTIONS:
                found.append(f"{rel}: {needle} (not in OPTUNA_CONVENTIONS)")
    assert not found, "\n".join(found)
    assert conventions == OPTUNA_CONVENTIONS            # every entry still needed


# --- the layers -------------------------------------------------------------------------------

def _modules() -> dict:
    out = {}
    for p in sorted((ROOT / "dse").rglob("*.py")):
        rel = p.relative_to(ROOT).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        out[name] = p
    return out


def _imports(name: str, path, modules: dict):
    """(line, imported dse module, inside a function) of every import of a dse module."""
    tree = ast.parse(path.read_text())
    parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}

    def in_function(node):
        while node in parents:
            node = parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return True
        return False

    def resolve(mod):
        while mod not in modules and "." in mod:
            mod = mod.rsplit(".", 1)[0]
        return mod

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(pkg[:len(pkg) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                       for a in node.names]
        else:
            continue
        for tgt in targets:
            if tgt.split(".")[0] == "dse":
                yield node.lineno, resolve(tgt), in_function(node)


def _layer(module: str) -> int:
    best, rank = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for pre in prefixes:
            if (module == pre or module.startswith(pre + ".")) and len(pre) > best:
                best, rank = len(pre), i
    return rank


def test_layer_contract():
    """Every module sits in a layer; imports only go down (or stay in the layer); no import
    circle; imports inside functions only where LAZY says why; at most TOP_LEVEL_MAX modules at
    the top of dse/."""
    import networkx as nx
    modules = _modules()
    bad, graph = [], nx.DiGraph()
    for name, path in modules.items():
        mine = _layer(name)
        if mine is None:
            bad.append(f"{name}: in no layer of LAYERS")
            continue
        graph.add_node(name)
        for line, tgt, lazy in _imports(name, path, modules):
            if tgt == name:
                continue
            graph.add_edge(name, tgt)
            where = f"{path.relative_to(ROOT)}:{line}"
            if _layer(tgt) is not None and _layer(tgt) > mine:
                bad.append(f"{where}: {name} ({LAYERS[mine][0]}) imports {tgt} "
                           f"({LAYERS[_layer(tgt)][0]}), a layer above")
            if lazy and name not in LAZY:
                bad.append(f"{where}: {name} imports {tgt} inside a function (move it to the top "
                           "of the module, or give LAZY the start-up reason)")
    for cycle in nx.simple_cycles(graph):
        bad.append("import circle: " + " -> ".join(cycle + cycle[:1]))
        if len(bad) > 40:
            break
    top = [n for n in modules if n.count(".") == 1 and not (ROOT / "dse" / n.split(".")[1]).is_dir()]
    if len(top) > TOP_LEVEL_MAX:
        bad.append(f"{len(top)} modules at the top of dse/ (at most {TOP_LEVEL_MAX}): {sorted(top)}")
    assert not bad, "\n".join(dict.fromkeys(bad))


def test_ground_imports_ground_only():
    """errors, units, version and pareto import nothing of dse but each other (units: errors)."""
    modules = _modules()
    for name in LAYERS[0][1]:
        for line, tgt, _ in _imports(name, modules[name], modules):
            assert _layer(tgt) == 0, f"{name}:{line} imports {tgt}"


def test_no_cross_module_private_names():
    """No module uses another dse module's private name (``from dse.x import _y``, ``x._y``)."""
    bad = []
    for path in sorted((ROOT / "dse").rglob("*.py")):
        tree = ast.parse(path.read_text())
        mods = set()
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("dse"):
                for a in n.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        bad.append(f"{path.relative_to(ROOT)}:{n.lineno}: from {n.module} "
                                   f"import {a.name}")
                    mods.add(a.asname or a.name)
            elif isinstance(n, ast.Import):
                mods |= {a.asname or a.name.split(".")[0] for a in n.names
                         if a.name.startswith("dse")}
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and n.attr.startswith("_") and \
                    not n.attr.startswith("__") and isinstance(n.value, ast.Name) and \
                    n.value.id in mods:
                bad.append(f"{path.relative_to(ROOT)}:{n.lineno}: {ast.unparse(n)}")
    assert not bad, "\n".join(dict.fromkeys(bad))


def test_layer_contract_catches_an_upward_import(tmp_path, monkeypatch):
    """The check fails on an upward import (a model module importing the search)."""
    fake = tmp_path / "step.py"
    fake.write_text("def f():\n    from dse.search import store\n")
    modules = {**_modules(), "dse.perf.step": fake}
    found = [(tgt, lazy) for _, tgt, lazy in _imports("dse.perf.step", fake, modules)]
    assert found == [("dse.search.store", True)]
    assert _layer("dse.search.store") > _layer("dse.perf.step")


MAX_FUNCTION_LINES = 120


def test_no_function_over_120_lines():
    """Modules small enough to read in one sitting start with functions that are: none in dse/
    is longer than MAX_FUNCTION_LINES lines (docstring included)."""
    long = []
    for path in sorted((ROOT / "dse").rglob("*.py")):
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = n.end_lineno - n.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{n.lineno}: {n.name} has {size} lines")
    assert not long, "\n".join(long)
