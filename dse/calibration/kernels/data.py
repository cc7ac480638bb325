"""Read public per-op kernel measurements into tidy tables (SI units, dse catalog ids).

``load(family, table)`` returns every measured row of one op table (``gemm/gemm_perf``,
``moe/moe_perf``, ``attention/context_attention_perf``, ``comm/nccl_perf``, ...) for the chips
dse knows, with columns ``chip`` (dse accelerator id), ``runtime`` (``trtllm``, ``sglang``,
``vllm``, or the library for collectives: ``nccl``), ``version``, the table's own shape
columns, and ``latency_s``. By default only the newest version of each (chip, runtime, table)
is kept: a fit describes the kernels a user would run today.

The tables are aiconfigurator-core's (``aiconfigurator_core/systems/data/<system>/<family>/
<framework>/<version>/<table>.parquet``, Apache-2.0, https://github.com/ai-dynamo/aiconfigurator);
latencies there are milliseconds, except ``moe_a2a_perf`` (microseconds, with
``transmit_us``); tables without a ``latency`` column (DeepEP's ``wideep_deepep_*``) keep their
``*_us`` columns, converted to seconds as ``*_s``. The package is an optional extra: ``pip install -e ".[kernels]"``.
"""

from __future__ import annotations

import importlib.util
import re
from functools import lru_cache
from pathlib import Path

import pandas as pd

from dse.calibration.cases import default_dir
from dse.errors import InputError

# aiconfigurator system folder -> dse accelerator id (systems dse has no catalog entry for,
# such as a100_pcie, a30, l4 and b60, are not read)
SYSTEMS = {"a100_sxm": "a100-sxm-80g", "h100_sxm": "h100-sxm", "h100_pcie": "h100-pcie",
           "h200_sxm": "h200-sxm", "b200_sxm": "b200", "b300_sxm": "b300", "gb200": "gb200",
           "gb300": "gb300", "l40s": "l40s", "rtx_pro_6000_server": "rtx-pro-6000"}
RUNTIMES = ("trtllm", "sglang", "vllm")
# tables whose latency column is in microseconds (all others: milliseconds)
MICROSECOND_TABLES = {"moe_a2a_perf"}
SOURCE = ("aiconfigurator-core {version} (PyPI, Apache-2.0), "
          "aiconfigurator_core/systems/data/<system>/<op>/<runtime>/<version>/*.parquet")

DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "bf16": "bf16",
               "fp16": "fp16", "fp8": "fp8", "fp8_block": "fp8", "fp8_static": "fp8",
               "float8": "fp8", "nvfp4": "fp4", "fp4": "fp4", "w4afp8": "fp4",
               "int8_wo": "int8", "int4_wo": "int4", "w4a16_mxfp4": "fp4", "mxfp4": "fp4"}


class KernelDataMissing(InputError):
    pass


def root() -> Path:
    """The aiconfigurator-core data folder (raises with the install hint when it is absent)."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        raise KernelDataMissing("the kernel measurements are not installed",
                                where="aiconfigurator_core",
                                hint='pip install -e ".[kernels]" (only fitting needs them)')
    return Path(list(spec.submodule_search_locations)[0]) / "systems" / "data"


def package_version() -> str:
    from importlib.metadata import version
    return version("aiconfigurator-core")


def version_key(v: str) -> tuple:
    """Sort key of a release string: 1.3.0rc20 < 1.3.0 < 1.3.0.post1, 0.5.6.post2 > 0.5.6."""
    parts = re.findall(r"\d+|[a-z]+", v.lower())
    key = []
    for p in parts:
        if p.isdigit():
            key.append((2, int(p)))
        else:   # pre-releases sort below the release, post-releases above
            key.append((3 if p == "post" else 1, {"dev": 0, "a": 1, "b": 2, "rc": 3}.get(p, 4)))
    return tuple(key) + ((2, -1),)


def files(family: str, table: str) -> pd.DataFrame:
    """Every (chip, runtime, version, path) holding ``<family>/.../<table>.parquet``."""
    rows = []
    base = root()
    for system, chip in SYSTEMS.items():
        for path in sorted((base / system / family).glob(f"*/*/{table}.parquet")):
            rows.append({"chip": chip, "runtime": path.parent.parent.name,
                         "version": path.parent.name, "path": path})
    return pd.DataFrame(rows, columns=["chip", "runtime", "version", "path"])


@lru_cache(maxsize=64)
def _read(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path)


def load(family: str, table: str, *, latest: bool = True, chips=None,
         runtimes=None) -> pd.DataFrame:
    """All rows of one op table for the known chips (newest version per chip and runtime)."""
    index = files(family, table)
    if chips is not None:
        index = index[index["chip"].isin(list(chips))]
    if runtimes is not None:
        index = index[index["runtime"].isin(list(runtimes))]
    if latest and len(index):
        index = (index.assign(_k=index["version"].map(version_key))
                 .sort_values("_k").groupby(["chip", "runtime"]).tail(1).drop(columns="_k"))
    scale = 1e-6 if table in MICROSECOND_TABLES else 1e-3
    parts = []
    for r in index.itertuples(index=False):
        d = _read(r.path).copy()
        d = d.drop(columns=[c for c in ("framework", "version", "device") if c in d.columns])
        d.insert(0, "version", r.version)
        d.insert(0, "runtime", r.runtime)
        d.insert(0, "chip", r.chip)
        if "latency" in d.columns:
            d["latency_s"] = d.pop("latency").astype(float) * scale
        for c in [c for c in d.columns if c.endswith("_us")]:
            d[c[:-3] + "_s"] = d.pop(c).astype(float) * 1e-6
        parts.append(d)
    if not parts:
        return pd.DataFrame(columns=["chip", "runtime", "version", "latency_s"])
    out = pd.concat(parts, ignore_index=True)
    for c in out.columns:
        if out[c].dtype == object or str(out[c].dtype).startswith("string"):
            out[c] = out[c].astype(str)
    if "latency_s" in out.columns:
        out = out[out["latency_s"] > 0]
    return out.reset_index(drop=True)


def dtype(name) -> str:
    """A table's dtype name as a dse weight dtype (bf16, fp16, fp8, fp4, int8, int4) or itself."""
    return DTYPE_NAMES.get(str(name).lower(), str(name).lower())


def shared_measurements(folder: Path | None = None) -> pd.DataFrame:
    """The kernel and collective rows of ``../shared/calibration/kernel_comm_measurements.csv``."""
    folder = Path(folder) if folder else default_dir()
    return pd.read_csv(folder / "kernel_comm_measurements.csv")
