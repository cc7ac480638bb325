# %% [markdown]
# # dse from a notebook: one design, a sweep, a search, a what-if, a comparison
#
# Each `# %%` cell runs as a Jupyter cell (VS Code, JupyterLab with jupytext); the whole file
# runs as a script too: `python examples/notebook_workflow.py [OUT_DIR]` (tests/test_api.py
# executes it). Every number below comes from the model and the catalog.

# %%
import sys
import tempfile
from pathlib import Path

import pandas as pd

import dse

OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="dse-notebook-"))
HERE = Path(__file__).resolve().parent

# %% [markdown]
# ## 1. One design: every metric and the per-op breakdown

# %%
ev = dse.evaluate(HERE / "llama70b-h100.toml")
print(f"TPOT {ev.metrics['tpot_s'] * 1e3:.2f} ms, {ev.metrics['usd_per_mtok_output']:.3f} $/Mtok, "
      f"decode bound: {ev.metrics['bound']}")
decode = ev.breakdown[ev.breakdown["step"] == "decode"]
print(decode[["op", "compute_s", "memory_s", "network_s", "time_s", "bound"]].to_string(index=False))

# the same design as a dict of dotted paths
same = dse.evaluate({"accelerator.id": "h100-sxm", "model.id": "llama-3.1-70b",
                     "model.weight_dtype": "fp8", "layout.tp": 4, "workload.isl": 2048,
                     "workload.osl": 256, "workload.concurrency": 64})
print(f"as a dict: TPOT {same.metrics['tpot_s'] * 1e3:.2f} ms")

# %% [markdown]
# ## 2. A sweep as a DataFrame, scored at once

# %%
sweep = pd.DataFrame([{"accelerator.id": acc, "layout.tp": tp, "workload.concurrency": c}
                      for acc in ("h100-sxm", "h200-sxm", "b200")
                      for tp in (4, 8) for c in (16, 64, 256)])
scored = dse.score(sweep, base={"model.id": "llama-3.1-70b", "model.weight_dtype": "fp8",
                                "workload.isl": 2048, "workload.osl": 256})
cheapest = scored[scored["feasible"]].nsmallest(3, "usd_per_mtok_output")
print(cheapest[["accelerator.id", "layout.tp", "workload.concurrency", "tpot_s",
                "usd_per_mtok_output", "bound"]].to_string(index=False))

# %% [markdown]
# ## 3. A small space, searched exhaustively (the exact Pareto front)

# %%
space = {
    "name": "notebook",
    "question": "Which of two chips, at which TP and batch, with or without +50% HBM bandwidth?",
    "accelerator": {"id": "h100-sxm"},
    "model": {"id": "llama-3.1-70b", "weight_dtype": "fp8"},
    "workload": {"isl": 2048, "osl": 256},
    "parameters": {"accelerator.id": ["h100-sxm", "h200-sxm"], "layout.tp": [4, 8],
                   "workload.concurrency": [8, 32, 128, 512],
                   "accelerator.hbm_bw_bytes_per_s": {"scale": [1.0, 1.5]}},
    "objectives": {"usd_per_mtok_output": "minimize", "tpot_s": "minimize"},
    "constraints": {"ttft_s": {"max": 5.0}},
}
run = dse.run(space, out=OUT / "run")
print(run.status["state"], run.status["designs_scored"], "designs,",
      run.status["front_size"], "on the front")
# a scale factor's column says so: accelerator.hbm_bw_bytes_per_s.scale
print(run.front.sort_values("tpot_s").to_string(index=False))

# %% [markdown]
# ## 4. Open it again later, and ask what if the chip were a B300

# %%
again = dse.open_run(OUT / "run")
w = dse.whatif(again, set={"accelerator.id": "b300"}, out=OUT / "whatif-b300")
print(w.rescored[["design_id", "tpot_s_before", "tpot_s", "tpot_s_change"]].to_string(index=False))
print(w.sensitivities.to_string(index=False))

# %% [markdown]
# ## 5. Compare with a run of the same space on component-priced capex

# %%
space2 = {**space, "name": "notebook-components", "cost": {"capex_model": "components"}}
run2 = dse.run(space2, out=OUT / "run-components")
c = dse.compare(run, run2)
print(f"hypervolume A {c.hypervolume_a:.4g}, B {c.hypervolume_b:.4g}; "
      f"coverage A->B {c.coverage_a:.2f}, B->A {c.coverage_b:.2f}")
print("written:", c.write(OUT / "compare"))
