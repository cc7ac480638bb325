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
