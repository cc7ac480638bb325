"""The catalog: accelerators, topologies and models shipped as TOML package data.

Every entry carries its ``source_url``; efficiencies say what they were fitted on.
"""

from __future__ import annotations

import tomllib
from functools import cache, lru_cache
from importlib import resources

from pydantic import ValidationError

from dse.catalog.specs import Accelerator, Efficiency, Model, Topology
from dse.errors import InputError, suggest

KINDS = ("accelerators", "topologies", "models")


def _load(name: str) -> dict:
    with resources.files(__package__).joinpath(name).open("rb") as f:
        return tomllib.load(f)


def _efficiency(acc_id: str, table: dict, own: dict | None = None) -> Efficiency:
    """The end-to-end remainder of the model (efficiency.toml): a chip's own entry, else the
    default fitted on every calibrated chip (the per-op efficiencies are the kernel fits);
    ``own``: the chip's ``[<chip>.efficiency]`` table in accelerators.toml, fields that its
    architecture sets (with their source in its ``sources``) over the fitted ones."""
    base = dict(table.get(acc_id, table["default"]))
    if own:
        base.update(own)
        if "layer_overhead_s" in own and "graph_layer_overhead_s" not in own:
            # the chip's own per-layer time stands for every step's (a CUDA graph's is a
            # fitted refinement of the CUDA runtimes' per-layer time, not of the chip's own)
            base["graph_layer_overhead_s"] = own["layer_overhead_s"]
        base["fitted_on"] = (f"{base.get('fitted_on', '')}; {', '.join(sorted(own))} from the "
                             "chip's own catalog entry (accelerators.toml, its architecture)")
    return Efficiency(**base)


@lru_cache(maxsize=1)
def accelerators() -> dict[str, Accelerator]:
    raw = _load("accelerators.toml")
    eff = _load("efficiency.toml")
    out = {}
    for k, v in raw.items():
        v = dict(v)
        own = v.pop("efficiency", None)
        out[k] = Accelerator(id=k, efficiency=_efficiency(k, eff, own), **v)
    for k, a in out.items():
        if a.kernel_base is not None and (a.kernel_base not in out
                                          or out[a.kernel_base].kernel_base is not None):
            raise ValueError(f"accelerators.toml [{k}]: kernel_base {a.kernel_base!r} is not a "
                             "catalog part with its own kernel fits")
    return out


def kernel_chip(acc_id: str) -> str:
    """The catalog part whose kernel fits (``kernel_params``) and kernel uncertainty
    ``acc_id`` uses: its ``kernel_base`` (a variant of that part's die), else itself."""
    return accelerators()[acc_id].kernel_base or acc_id


@lru_cache(maxsize=1)
def topologies() -> dict[str, Topology]:
    return {k: Topology(id=k, **v) for k, v in _load("topologies.toml").items()}


@lru_cache(maxsize=1)
def models() -> dict[str, Model]:
    return {k: Model(id=k, **v) for k, v in _load("models.toml").items()}


@lru_cache(maxsize=1)
def serving_defaults() -> dict:
    """Serving-runtime defaults (serving.toml): runtime, prefill chunk, KV share, reserve."""
    return {k: v for k, v in _load("serving.toml").items() if not isinstance(v, dict)}


@lru_cache(maxsize=1)
def memory_tiers() -> dict[str, dict]:
    """Per-accelerator KV offload tiers (memory_tiers.toml): host memory and its link."""
    return dict(_load("memory_tiers.toml"))


@lru_cache(maxsize=1)
def spec_acceptance() -> dict[str, float]:
    """Published per-token draft acceptance per speculative method (serving.toml)."""
    return dict(_load("serving.toml")["spec_acceptance"])


@lru_cache(maxsize=1)
def expert_load_cv() -> float:
    """Per-expert routed-load coefficient of variation behind the default expert imbalance
    (serving.toml [expert_routing], with its source)."""
    return float(_load("serving.toml")["expert_routing"]["expert_load_cv"])


@lru_cache(maxsize=1)
def runtime_defaults() -> dict[str, dict]:
    """Per-runtime defaults (serving.toml [runtimes.*]: max_batch_size, dense_mlp, the
    all-reduce rule), with the end-to-end numbers fitted per runtime (efficiency.toml
    [runtimes.*]: request_overhead_s, seq_overhead_s; dse.calibration.fit)."""
    out = {k: dict(v) for k, v in _load("serving.toml")["runtimes"].items()}
    for rt, fitted in _load("efficiency.toml").get("runtimes", {}).items():
        if rt in out:
            out[rt].update({k: v for k, v in fitted.items() if k != "fitted_on"})
    return out


@cache
def front_end_defaults() -> dict[str, dict]:
    """The end-to-end numbers fitted for a front end that is not the runtime's own server
    (efficiency.toml [front_ends.*], e.g. "dynamo": request_overhead_s; dse.calibration.fit),
    {} when none was fitted. Read for the calibration cases that name one
    (dse.calibration.harness_rules.FRONT_ENDS); no design field selects a front end."""
    return {k: dict(v) for k, v in _load("efficiency.toml").get("front_ends", {}).items()}


@lru_cache(maxsize=None)
def cost_model() -> dict:
    """Component shares of all-in capex and power (cost_model.toml), each summing to 1."""
    doc = _load("cost_model.toml")
    for part in ("capex", "power"):
        total = sum(doc[part].values())
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"cost_model.toml [{part}] shares sum to {total}, not 1")
    return doc


def table(kind: str) -> dict:
    if kind not in KINDS:
        raise InputError(f"unknown catalog kind {kind!r}", hint=suggest(kind, KINDS, "kinds"))
    return {"accelerators": accelerators, "topologies": topologies, "models": models}[kind]()


def lookup(kind: str, entry_id: str, *, file: str | None = None, where: str | None = None):
    """The entry ``entry_id`` of ``kind``, or a one-line InputError with the closest ids."""
    entries = table(kind)
    key = str(entry_id).strip()
    if key not in entries:
        singular = {"accelerators": "accelerator", "topologies": "topology", "models": "model"}
        raise InputError(f"unknown {singular[kind]} id {key!r}", file=file, where=where,
                         hint=suggest(key, entries, f"valid {kind}"))
    return entries[key]


def find(entry_id: str):
    """(kind, entry) for an id in any catalog."""
    for kind in KINDS:
        if entry_id in table(kind):
            return kind, table(kind)[entry_id]
    every = [i for kind in KINDS for i in table(kind)]
    raise InputError(f"unknown catalog id {entry_id!r}", hint=suggest(entry_id, every, "valid ids"))


__all__ = ["KINDS", "ValidationError", "accelerators", "find", "kernel_chip", "lookup", "models",
           "table", "topologies"]


@lru_cache(maxsize=1)
def kernel_params() -> dict[tuple[str, str], dict]:
    """Fitted per-op kernel parameters, {(accelerator id, runtime): {key: value}}, merged over
    ``kernels/*.toml`` (written by ``python -m dse.calibration.kernels --fit --write``); each entry's
    ``fitted_on`` is a dict {op file: what it was fitted on or transferred from}, and
    ``uncertainty`` (where written) {family: {params, log_sd, log_corr, rule}}: the covariance
    of the log parameters (dse/calibration/kernels/common.py); ``backend`` (where written) {kernel backend:
    {key: value, "fitted_on": {op file: text}}}: the parameters ``serving.moe_backend`` selects
    in place of the entry's own (dse/calibration/kernels/moe.py). A variant part
    (``kernel_base``) holds its base part's entries (``_apply_variants``)."""
    out: dict[tuple[str, str], dict] = {}
    derived: dict[str, dict] = {}
    folder = resources.files(__package__).joinpath("kernels")
    for f in sorted(folder.iterdir(), key=lambda x: x.name):
        if not f.name.endswith(".toml"):
            continue
        doc = tomllib.loads(f.read_text())
        for chip, runtimes in doc.items():
            for rt, vals in runtimes.items():
                if rt == ARCHITECTURE_RUNTIME:      # derived from the architecture: applied below
                    derived[chip] = {**vals, "file": f.name[:-5]}
                    continue
                d = out.setdefault((chip, rt), {"fitted_on": {}})
                for k, v in vals.items():
                    if k == "fitted_on":
                        d["fitted_on"][f.name[:-5]] = v
                    elif k == "uncertainty":      # {family: params, log_sd, log_corr, rule}
                        d.setdefault("uncertainty", {}).update(v)
                    elif k == "backend":          # {kernel backend: {key: value, fitted_on}}
                        for b, sec in v.items():
                            into = d.setdefault("backend", {}).setdefault(b, {"fitted_on": {}})
                            for bk, bv in sec.items():
                                if bk == "fitted_on":
                                    into["fitted_on"][f.name[:-5]] = bv
                                else:
                                    into[bk] = float(bv)
                    else:
                        d[k] = float(v)
    _apply_derived(out, derived)
    _apply_variants(out)
    return out


def _apply_variants(out: dict) -> None:
    """Give each variant part (``kernel_base`` in accelerators.toml) its base part's entries,
    key by key, with ``kernel_base`` set and ``fitted_on`` saying whose they are (in place;
    an entry a kernel fit wrote for the variant itself is replaced: the base's fits are its)."""
    for chip, acc in accelerators().items():
        if acc.kernel_base is None:
            continue
        for (c, rt), d in list(out.items()):
            if c == acc.kernel_base:
                out[(chip, rt)] = {**d, "kernel_base": acc.kernel_base, "fitted_on": {
                    f: f"{acc.kernel_base}'s (kernel_base: the same die): {t}"
                    for f, t in d["fitted_on"].items()}}


# ``[<chip>.all]`` in kernels/architecture.toml: parameters derived from the chip's architecture
ARCHITECTURE_RUNTIME = "all"


def _apply_derived(out: dict, derived: dict) -> None:
    """Overlay each chip's architecture-derived parameters (kernels/architecture.toml
    ``[<chip>.all]``) on every runtime's entry of that chip, key by key (in place): they replace
    what the fit transferred from other chips; the transferred uncertainty families that hold a
    replaced key are dropped (the derived values carry none)."""
    runtimes = sorted({rt for _, rt in out})
    for chip, vals in derived.items():
        keys = {k: float(v) for k, v in vals.items() if k not in ("derived_from", "file")}
        for rt in runtimes:
            d = out.setdefault((chip, rt), {"fitted_on": {}})
            d.update(keys)
            d["fitted_on"][vals["file"]] = "derived from the architecture: " + str(
                vals.get("derived_from", ""))
            unc = d.get("uncertainty")
            if unc:
                d["uncertainty"] = {f: u for f, u in unc.items()
                                    if not set(u.get("params", ())) & set(keys)}


# kernel parameters only the fits use (a benchmark's warm L2, ``kernel_gemm.warm_l2_factor``:
# the scorer's cache is cold): in the catalog with what they were fitted on, never a scorer
# input or a settable field
FIT_ONLY_SUFFIXES = ("l2_speedup",)


@lru_cache(maxsize=1)
def kernel_keys() -> tuple[str, ...]:
    """Every numeric kernel parameter any entry has that the scorer reads (not the fit-only
    ones, ``FIT_ONLY_SUFFIXES``)."""
    return tuple(sorted({k for e in kernel_params().values() for k in e
                         if k not in ("fitted_on", "uncertainty", "backend", "kernel_base")
                         and not k.endswith(FIT_ONLY_SUFFIXES)}))

