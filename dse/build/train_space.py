"""Training spaces (``task = "train"``): the checks of a space file's base design and
parameters against the training fields (``dse.spec.train_fields``) and the training catalog.

    task = "train"
    question = "..."
    [training]                       # the job: tokens to train, batch, sequence, precision
    tokens = 15e12
    global_batch_seqs = 2048
    seq_len = 8192
    precision = "bf16"
    [model]
    id = "llama-3.1-405b"
    [accelerator]
    id = "h100-sxm"
    [layout]                         # fixed layout fields; the chips are tp x pp x cp x dp,
    num_chips = 16384                # or num_chips with dp left out (dp = what is left)
    [parameters]                     # the same grammar as a serving space
    "accelerator.id" = ["h100-sxm", "b200", "gb200"]
    "layout.tp" = [2, 4, 8]
    "layout.recompute" = ["none", "selective", "full"]
    [objectives]                     # training metrics (dse.spec.train_fields.NUMERIC_METRICS)
    train_time_s = "minimize"
    train_cost_usd = "minimize"
    [constraints]
    step_time_s = { max = 20.0 }

``dse.build.space.load_space`` reads the file and builds the ``Space`` (``task = "train"``);
``dse.scoring.train_space`` scores it. A layout the grid makes invalid (tp not dividing the
heads, a batch that is no whole number of micro-batches, ...) is a design flagged infeasible
with its reason, not an input error: a grid crosses every value with every other.
"""

from __future__ import annotations

from dse.catalog import training as tcat
from dse.errors import InputError, suggest
from dse.spec import train_fields, validate
from dse.spec.design import flatten

TOP_KEYS = ("task", "question", "name", "parameters", "objectives", "constraints", "answer",
            *train_fields.SECTIONS)
IDS = {"model.id": "models", "accelerator.id": "accelerators", "topology.id": "topologies"}


def check_top(doc: dict, path: str) -> None:
    if doc.get("task") != "train":
        raise InputError(f"task = {doc.get('task')!r} is not valid", file=path, where="task",
                         hint='"train" for a training space; leave it out for serving')
    for k in doc:
        if k not in TOP_KEYS:
            raise InputError(f"unknown key {k!r} in a training space", file=path,
                             hint=suggest(k, TOP_KEYS, "top-level keys"))


def check_id(path: str, value: str, *, file: str, where: str) -> None:
    if path in IDS and value != "":
        tcat.lookup(IDS[path], value, file=file, where=where)


def base_design(doc: dict, path: str) -> dict:
    """The base design's dotted fields, each checked (ids against the training catalog)."""
    base = flatten({k: v for k, v in doc.items() if k in train_fields.SECTIONS})
    for key in base:
        if key not in train_fields.REGISTRY:
            raise InputError(f"unknown key {key!r}", file=path, where=key,
                             hint=suggest(key, train_fields.REGISTRY, "training fields"))
        base[key] = validate.check_value(key, base[key], file=path, where=key,
                                         registry=train_fields.REGISTRY)
        check_id(key, base[key], file=path, where=key)
    return base


def check_parameter_path(p: str, path: str) -> None:
    if p not in train_fields.REGISTRY:
        raise InputError(f"unknown parameter path {p!r}", file=path, where="parameters",
                         hint=suggest(p, train_fields.REGISTRY, "training fields"))


def check_space(space) -> None:
    """What a single value cannot show: ids in the parameters' lists, the required ids, a job
    that gives its chips two ways."""
    paths = {p.path: p for p in space.parameters}
    for p in space.parameters:
        if p.scale and train_fields.REGISTRY[p.path].kind in ("enum", "id"):
            raise InputError("only numeric fields can be scaled", file=space.file,
                             where=f"parameters.{p.path}")
        for v in p.values:
            check_id(p.path, v, file=space.file, where=f"parameters.{p.path}")
    for need in ("accelerator.id", "model.id"):
        if need not in space.base and need not in paths:
            raise InputError(f"missing {need}", file=space.file,
                             hint=f"set it in [{need.split('.')[0]}] or in [parameters]")
    given = lambda k: k in space.base or k in paths      # noqa: E731
    if given("layout.num_chips") and given("layout.dp"):
        raise InputError("layout.num_chips and layout.dp are both given", file=space.file,
                         where="parameters.layout.dp" if "layout.dp" in paths else "layout.dp",
                         hint="give num_chips (dp = num_chips / (tp x pp x cp)) or dp, not both")
