"""``dse whatif`` on a training run: the training fields a change may name, the front re-scored
under it with the training scorer (``dse.scoring.train_space``), and the specs whose
sensitivities the page lists. ``dse.results.whatif`` calls these where a run's space is a
training space; the page, the tables and the new front are the same code as serving's."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse import pareto
from dse.catalog import training as tcat
from dse.perf.train_layout import LAYOUT_REASONS
from dse.scoring import train_space
from dse.spec import train_fields

REGISTRY = train_fields.REGISTRY
SENSITIVITY = ("accelerator.peak_flops_per_s", "accelerator.hbm_bw_bytes_per_s",
               "accelerator.hbm_capacity_bytes", "topology.scaleup.link_bw_bytes_per_s",
               "topology.scaleout.link_bw_bytes_per_s", "accelerator.price_usd_per_hour",
               "accelerator.all_in_power_w")
DTYPE_PATHS = tuple(f"accelerator.peak_flops_per_s.{d}" for d in ("bf16", "fp16", "fp8", "fp4"))
# reasons that make a design no design at all (a layout the model cannot take): a change that
# leaves the whole front so is refused; memory and constraints are answers
INVALID = tuple(LAYOUT_REASONS)
REASONS = train_space.REASONS


def ids(path: str) -> list:
    """The valid ids of an id field of a training design (the training catalog's)."""
    kind = {"model.id": "train_models", "accelerator.id": "train_accelerators"}.get(path)
    return list(getattr(tcat, kind)()) if kind else list(tcat.topologies())


def objective_table(space, design_ids, overrides=None) -> pd.DataFrame:
    """Each objective of the designs under ``overrides``, whether each is admissible, and
    its reason bits."""
    s = train_space.score_values(space, space.values_at(design_ids), overrides,
                                 dtype=np.float64)
    df = pd.DataFrame({o.metric: np.asarray(s[o.metric], float) for o in space.objectives})
    df["feasible"] = pareto.admissible(s, space.objectives, space.constraints)
    df["reason"] = np.asarray(s["reason"], np.int64)
    return df


def check_overrides(space, overrides: dict) -> None:
    """A change must leave the base design (each parameter at its first value) scoreable: the
    ids and values were checked as they were parsed; this scores it once under the change."""
    first = {p.column: np.asarray([p.values[0]]) for p in space.parameters}
    train_space.score_values(space, first, overrides, dtype=np.float64)
