"""The training catalog (training.toml): models and accelerators only training cases name so
far, joined to the serving catalog's, and the training model's fitted parameters.

A training-only accelerator names a serving ``base`` part and the fields that differ; its
kernel fits are the base's (the transfer is stated in its notes).
"""

from __future__ import annotations

import tomllib
from functools import lru_cache
from importlib import resources

from dse.catalog import accelerators, kernel_params, models, topologies
from dse.catalog.specs import FlopsTable, Model
from dse.errors import InputError, suggest

KERNEL_RUNTIME = "trtllm"     # the kernel tables' runtime whose GEMM/attention/NCCL fits training reuses
ACC_FIELDS = ("name", "source_url", "hbm_capacity_bytes", "hbm_bw_bytes_per_s", "tdp_w",
              "scaleout_link_bw_bytes_per_s", "notes")


@lru_cache(maxsize=1)
def document() -> dict:
    with resources.files(__package__).joinpath("training.toml").open("rb") as f:
        return tomllib.load(f)


@lru_cache(maxsize=1)
def train_models() -> dict[str, Model]:
    """Every model a training case may name: the serving catalog's and training.toml's."""
    extra = {k: Model(id=k, **v) for k, v in document()["models"].items()}
    return {**models(), **extra}


@lru_cache(maxsize=1)
def train_accelerators() -> dict:
    """Every accelerator a training case may name, with ``base``: the serving part whose kernel
    fits it uses ({id: (Accelerator, base id)})."""
    out = {k: (a, k) for k, a in accelerators().items()}
    for k, v in document()["accelerators"].items():
        base = accelerators()[v["base"]]
        upd = {f: v[f] for f in ACC_FIELDS if f in v}
        if "peak_flops_bf16" in v:
            upd["peak_flops_per_s"] = FlopsTable(bf16=v["peak_flops_bf16"],
                                                 fp16=v["peak_flops_bf16"],
                                                 fp8=v.get("peak_flops_fp8"))
        upd["sources"] = tuple(v.get("sources", ())) + base.sources
        out[k] = (base.model_copy(update={"id": k, **upd}), v["base"])
    return out


def train_parameters() -> dict:
    """The training model's parameters ([training] of training.toml) with ``fitted_on``."""
    return dict(document()["training"])


def kernel(acc_id: str) -> dict:
    """The fitted kernel parameters (GEMM, attention, collectives) training uses for a part."""
    return kernel_params()[(train_accelerators()[acc_id][1], KERNEL_RUNTIME)]


def lookup(kind: str, entry_id: str, *, file: str | None = None, where: str | None = None):
    """A model, accelerator ((spec, base id)) or topology of the training catalog, or a one-line
    InputError with the closest ids."""
    entries = {"models": train_models, "accelerators": train_accelerators,
               "topologies": topologies}[kind]()
    key = str(entry_id).strip()
    if key not in entries:
        raise InputError(f"unknown {kind[:-1].replace('ie', 'y')} id {key!r}", file=file,
                         where=where, hint=suggest(key, entries, f"valid {kind}"))
    return entries[key]
