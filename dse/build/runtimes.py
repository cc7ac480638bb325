"""What a design leaves to its serving runtime: the runtime's defaults written into a resolved
design table (``dse.build.designs.resolve``) where the design gives none -- the max batch per
scheduler and the dense MLP under attention DP (dse/catalog/serving.toml [runtimes.*]), the
fitted host times (efficiency.toml [runtimes.*]: ``HOST_TIMES``), the front end's processes, the
scheduler loop (none at pp > 1 or under a speculative method the loop does not run) and the
stream interval.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse import catalog
from dse.build.select import lookup

HOST_TIMES = ("serving.request_overhead_s", "serving.seq_overhead_s",
              "serving.frontend_prompt_token_s", "serving.frontend_token_s",
              "serving.frontend_text_token_s", "serving.frontend_request_s")


def runtime_defaults(out) -> None:
    """Fill what a design left to its runtime: the max batch per scheduler, its host times, its
    front-end processes, scheduler loop and stream interval, and the dense MLP of an MoE under
    attention data parallelism ("auto")."""
    table = catalog.runtime_defaults()
    rt = out["serving.runtime"]
    cap = pd.to_numeric(out["serving.max_batch_size"], errors="coerce") \
        if "serving.max_batch_size" in out.columns else pd.Series(np.nan, index=out.index)
    own = lookup(rt, {r: float(v["max_batch_size"]) for r, v in table.items()})
    out["serving.max_batch_size"] = np.where(np.isnan(cap.to_numpy(dtype=float)), own, cap)
    for path in HOST_TIMES:        # the runtime's fitted host times (efficiency.toml [runtimes])
        out[path] = runtime_number(out, rt, table, path, 0.0)
    out["serving.frontend_processes"] = frontend_processes(out, rt, table)
    # its scheduler loop (serving.toml [runtimes.*] overlap_schedule), none at pp > 1
    out["serving.overlap_schedule"] = scheduler_loop(out, rt, table)
    # the tokens per streamed chunk (serving.toml [runtimes.*] stream_interval)
    out["serving.stream_interval"] = runtime_number(out, rt, table, "serving.stream_interval",
                                                    1.0)
    dm = out["layout.dense_mlp"].astype(object)
    auto = (dm == "auto") | dm.isna()
    if auto.any():
        own = pd.Series(lookup(rt, {r: v["dense_mlp"] for r, v in table.items()}, ""),
                        index=out.index)
        out["layout.dense_mlp"] = dm.where(~auto, own)


def runtime_number(out, rt, table, path: str, default: float) -> np.ndarray:
    """``path`` (serving.<key>) where a design gives it, else its runtime's ``key`` in
    ``table`` (``default`` where the runtime has none)."""
    key = path.split(".")[1]
    given = pd.to_numeric(out[path], errors="coerce").to_numpy(dtype=float) \
        if path in out.columns else np.full(len(out), np.nan)
    own = lookup(rt, {r: float(v.get(key, default)) for r, v in table.items()}, default)
    return np.where(np.isnan(given), own, given)


def scheduler_loop(out, rt, table) -> np.ndarray:
    """serving.overlap_schedule where given, else the runtime's loop (serving.toml [runtimes.*]
    overlap_schedule), but 0 for a pipeline-parallel instance (layout.pp > 1), which no runtime
    runs on its overlapped loop: TensorRT-LLM's PyExecutor runs ``_executor_loop_pp`` whenever
    ``pp_size > 1``, whatever ``disable_overlap_scheduler`` says
    (tensorrt_llm/_torch/pyexecutor/py_executor.py ``__init__``); SGLang 0.5.x turns
    ``disable_overlap_schedule`` on at pp > 1 and vLLM >= 0.14 leaves async scheduling off at
    pp > 1 (reports/end-to-end/scheduler-loops.md section 1 and its table). And 0 where a design
    decodes speculatively (serving.spec_tokens > 0) with a method its runtime's overlapped loop
    does not run (serving.toml [runtimes.*] overlap_spec_methods)."""
    path = "serving.overlap_schedule"
    n = len(out)

    def num(c, blank):
        return pd.to_numeric(out[c], errors="coerce").to_numpy(dtype=float) \
            if c in out.columns else np.full(n, blank)
    own = runtime_number(out, rt, table, path, 1.0)
    method = out["serving.spec_method"].fillna("").astype(str).str.strip().replace("", "mtp") \
        if "serving.spec_method" in out.columns else pd.Series(["mtp"] * n)
    rts = pd.Series(np.broadcast_to(np.asarray(rt, dtype=object), (n,)))
    keeps = ~rts.isin(list(table)).to_numpy()          # (an unknown runtime: checked elsewhere)
    for r, v in table.items():
        keeps |= (rts.eq(r) & method.reset_index(drop=True).isin(
            v.get("overlap_spec_methods", ("mtp", "draft")))).to_numpy()
    off = (num("layout.pp", 1.0) > 1.0) | ((num("serving.spec_tokens", 0.0) > 0.0) & ~keeps)
    return np.where(np.isnan(num(path, np.nan)) & off, 0.0, own)


def frontend_processes(out, rt, table) -> np.ndarray:
    """serving.frontend_processes where given, else the runtime's default (serving.toml
    [runtimes.*] frontend_processes: a number, or "dp", one per attention-DP rank)."""
    given = pd.to_numeric(out["serving.frontend_processes"], errors="coerce").to_numpy(float) \
        if "serving.frontend_processes" in out.columns else np.full(len(out), np.nan)
    own = lookup(rt, {r: np.nan if v.get("frontend_processes", 1) == "dp"
                      else float(v.get("frontend_processes", 1)) for r, v in table.items()}, 1.0)
    own = np.where(np.isnan(own), np.asarray(out["layout.dp"], dtype=float), own)
    return np.where(np.isnan(given), own, given)
