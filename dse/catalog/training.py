"""The training catalog: the main catalog's models and accelerators (one catalog for serving
and training) and the training model's fitted parameters (training.toml).

A variant part (``kernel_base`` in accelerators.toml) uses its base part's kernel fits.
"""

from __future__ import annotations

import tomllib
from functools import lru_cache
from importlib import resources

from dse.catalog import accelerators, kernel_params, models, topologies
from dse.catalog.specs import Model
from dse.errors import InputError, suggest

KERNEL_RUNTIME = "trtllm"     # the kernel tables' runtime whose GEMM/attention/NCCL fits training reuses


@lru_cache(maxsize=1)
def document() -> dict:
    with resources.files(__package__).joinpath("training.toml").open("rb") as f:
        return tomllib.load(f)


def train_models() -> dict[str, Model]:
    """Every model a training case may name: the catalog's (models.toml)."""
    return models()


@lru_cache(maxsize=1)
def train_accelerators() -> dict:
    """Every accelerator a training case may name, with ``base``: the part whose kernel fits it
    uses ({id: (Accelerator, base id)}; base: its ``kernel_base``, else itself)."""
    return {k: (a, a.kernel_base or k) for k, a in accelerators().items()}


def train_parameters() -> dict:
    """The training model's parameters ([training] of training.toml) with ``fitted_on``."""
    return dict(document()["training"])


# = training.toml [attention_kernels]; "unfused" (Megatron's pre-FlashAttention core attention)
# is timed by its own GEMMs and score passes (dse.perf.train_time.unfused_attention_s), no rate
ATTENTION_KERNELS = ("cudnn", "flash3", "flash2", "triton", "unfused")
UNFUSED = "unfused"


def attention_rates(acc_id: str, kernel: str, *, file: str | None = None,
                    where: str | None = None) -> tuple[float, float]:
    """(forward, backward) rate of attention kernel ``kernel`` on part ``acc_id`` relative to
    the kernel the attention fits price (training.toml [attention_kernels], each number with its
    source); the default kernel is 1 everywhere, another kernel on a part or architecture no
    benchmark covers is a one-line InputError."""
    table = document()["attention_kernels"]
    if kernel in (table["default"], UNFUSED):
        return 1.0, 1.0
    base = train_accelerators()[acc_id][1]
    for arch, row in table.items():
        if isinstance(row, dict) and base in row["parts"]:
            if kernel in row:
                return float(row[kernel][0]), float(row[kernel][1])
            raise InputError(f"attention kernel {kernel!r} has no published rate on {arch} "
                             f"parts ({acc_id})", file=file, where=where,
                             hint="valid there: " + ", ".join(k for k in row if k != "parts"))
    raise InputError(f"attention kernel {kernel!r} has no published rate on {acc_id}",
                     file=file, where=where,
                     hint=f"leave training.attention_kernel blank ({table['default']}) there")


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
