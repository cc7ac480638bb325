"""``dse eval`` of a training design (a design file with ``task = "train"``, or
``dse.evaluate(..., task="train")``): the one training scorer (``dse.scoring.train_space``) on a
space of one design, every training metric and the parts of its step and memory.

A training design file is a training space's base design (``dse.build.train_space``) without
``[parameters]``: ``[training]``, ``[model]``, ``[accelerator]``, ``[topology]``, ``[layout]``.
The layout is scored as given (a field left out takes its default: 1, ZeRO 1, no recompute,
1F1B; ``layout.num_chips`` with ``layout.dp`` left out sets dp); ``dse predict --train`` picks
the fastest layout of a job instead.
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np

from dse.build import train_space as tspace
from dse.build.space import Space
from dse.errors import InputError
from dse.perf.train_batch import BOUNDS
from dse.scoring import train_space
from dse.spec import train_fields
from dse.spec.design import read_toml

PARTS = ("compute_s", "memory_s", "overhead_s", "network_exposed_s", "bubble_s", "optimizer_s")
MEMORY = ("weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes",
          "buffers_bytes")


def sections(design: dict) -> dict:
    """A design given as sections, dotted paths or both, as sections (dotted keys folded)."""
    out: dict = {}
    for k, v in design.items():
        if "." in k and not isinstance(v, dict):
            sec, rest = k.split(".", 1)
            node = out.setdefault(sec, {})
            if not isinstance(node, dict):
                raise InputError(f"{sec!r} is both a value and a section", where=k)
            *heads, last = rest.split(".")
            for h in heads:
                node = node.setdefault(h, {})
            node[last] = v
        elif isinstance(v, dict):
            out.setdefault(k, {}).update(v)
        else:
            out[k] = v
    return out


def evaluate_train(design: dict, file: str = "design") -> dict:
    """Score one training design ({dotted path or section: value}); a JSON-ready result."""
    doc = sections(design)
    doc.setdefault("task", "train")
    if "parameters" in doc or "objectives" in doc:
        raise InputError("a design has no [parameters] or [objectives]", file=file,
                         hint="`dse run` searches a training space; `dse eval` scores one design")
    tspace.check_top(doc, file)
    base = tspace.base_design(doc, file)
    space = Space(file, "design", "", base, (), (), (), hashlib.sha256(
        repr(sorted(base.items())).encode()).hexdigest()[:16], task="train")
    tspace.check_space(space)
    s = train_space.score_values(space, {}, dtype=np.float64)
    metrics = {}
    for k in train_fields.METRICS:
        x = np.asarray(s[k]).ravel()[0]
        if k == "bound":
            metrics[k] = BOUNDS[int(x)]
        elif k == "feasible":
            metrics[k] = bool(x)
        elif k == "reason":
            metrics[k] = train_space.reason_text(int(x))
        else:
            x = float(x)
            metrics[k] = x if math.isfinite(x) else None
    parts = train_space.score_values(space, {}, metrics=(*PARTS, *MEMORY), dtype=np.float64)
    resolved = {p: base.get(p, f.default) for p, f in train_fields.REGISTRY.items()
                if p in base or f.default is not train_fields.serving.CATALOG}
    return {"task": "train", "design": resolved, "metrics": metrics,
            "breakdown": {k: float(np.asarray(parts[k]).ravel()[0]) for k in (*PARTS, *MEMORY)}}


def evaluate_train_file(path: str) -> dict:
    return evaluate_train(read_toml(path), file=path)


def is_train_file(path: str) -> bool:
    """Whether a design file says ``task = "train"`` (read once more by the evaluation)."""
    return read_toml(path).get("task", "serve") != "serve"


def render_text(res: dict, path: str) -> str:
    d, m, b = res["design"], res["metrics"], res["breakdown"]
    lay = " ".join(f"{k}={d[f'layout.{k}']}" for k in ("tp", "pp", "dp", "cp", "ep", "vp")
                   if f"layout.{k}" in d)
    lines = [f"training design {path}: {d.get('model.id')} on {m['num_chips']:,.0f} x "
             f"{d.get('accelerator.id')}, {lay}, micro-batch {d.get('layout.micro_batch_seqs')}, "
             f"recompute {d.get('layout.recompute')}, ZeRO {d.get('layout.zero_stage')}, "
             f"{d.get('layout.pipeline_schedule')}; {d.get('training.global_batch_seqs')} x "
             f"{d.get('training.seq_len')} tokens per step, {d.get('training.precision')}, "
             f"{d.get('training.tokens'):.4g} tokens to train"]
    if not m["feasible"]:
        lines.append(f"INFEASIBLE: {m['reason']}")
    lines += [f"step bound: {m['bound']}", "", "step (slowest stage, per optimizer step):"]
    lines += [f"  {k:<22}{b[k]:>12.4g} s" for k in PARTS]
    lines += ["", "memory per chip (most loaded stage):"]
    lines += [f"  {k:<22}{b[k] / 1e9:>12.4g} GB" for k in MEMORY]
    lines += ["", "metrics:"]
    for k, v in m.items():
        shown = "n/a" if v is None else (f"{v:,.6g}" if isinstance(v, float) else str(v) or "-")
        lines.append(f"  {k:<34} {shown} {train_fields.METRIC_INFO.get(k, ('', ''))[1]}".rstrip())
    return "\n".join(lines)


def render_json(res: dict) -> str:
    return json.dumps(res, indent=2, default=str)
