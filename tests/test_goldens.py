"""Golden values of the deterministic scorer: any change to the model shows up here.

Regenerate after an intended model or catalog change, and say why in the commit:
    DSE_UPDATE_GOLDENS=1 python -m pytest tests/test_goldens.py
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from helpers import ROOT, batch

from dse.perf import score

GOLDEN = ROOT / "tests" / "golden" / "scorer.json"
DESIGNS = {
    "llama70b-fp8-h100-tp4": {"accelerator.id": "h100-sxm", "model.id": "llama-3.1-70b",
                              "model.weight_dtype": "fp8", "layout.tp": 4,
                              "workload.isl": 2048, "workload.osl": 256, "workload.concurrency": 64},
    "llama8b-bf16-a100-decode": {"accelerator.id": "a100-sxm-80g", "model.id": "llama-3.1-8b",
                                 "workload.phase": "decode", "workload.concurrency": 128},
    "llama405b-fp8-h200-tp8-prefill": {"accelerator.id": "h200-sxm", "model.id": "llama-3.1-405b",
                                       "model.weight_dtype": "fp8", "layout.tp": 8,
                                       "workload.phase": "prefill", "workload.isl": 4096,
                                       "workload.concurrency": 4},
    "mixtral-ep8-h100": {"accelerator.id": "h100-sxm", "model.id": "mixtral-8x7b",
                         "model.weight_dtype": "fp8", "layout.tp": 8, "layout.ep": 8,
                         "workload.concurrency": 512},
    "deepseek-dp72-ep72-gb200": {"accelerator.id": "gb200", "model.id": "deepseek-v3",
                                 "model.weight_dtype": "fp8", "layout.dp": 72, "layout.ep": 72,
                                 "workload.isl": 2048, "workload.osl": 1024,
                                 "workload.concurrency": 8192},
    "deepseek-2racks-ep144": {"accelerator.id": "gb200", "model.id": "deepseek-v3",
                              "model.weight_dtype": "fp4", "layout.dp": 144, "layout.ep": 144,
                              "workload.concurrency": 16384},
    "kimi-k2-pp2-b200": {"accelerator.id": "b200", "model.id": "kimi-k2", "model.weight_dtype": "fp8",
                         "layout.tp": 8, "layout.pp": 2, "layout.ep": 8, "workload.concurrency": 256},
    "gpt-oss-mi300x-tp2": {"accelerator.id": "mi300x", "model.id": "gpt-oss-120b",
                           "model.weight_dtype": "fp4", "layout.tp": 2, "layout.ep": 2,
                           "workload.isl": 8192, "workload.concurrency": 64},
    "llama4-scout-tpu-v5e-tp8": {"accelerator.id": "tpu-v5e", "model.id": "llama-4-scout",
                                 "model.weight_dtype": "int8", "layout.tp": 8, "layout.ep": 8,
                                 "workload.concurrency": 32},
    "qwen3-trn2-prefix": {"accelerator.id": "trn2", "model.id": "qwen3-235b-a22b",
                          "model.weight_dtype": "fp8", "layout.tp": 4, "layout.dp": 4,
                          "layout.ep": 16, "workload.prefix_hit_fraction": 0.5,
                          "workload.concurrency": 256, "cost.mode": "rental"},
    "palm-l40s-infeasible": {"accelerator.id": "l40s", "model.id": "palm-540b", "layout.tp": 8,
                             "workload.concurrency": 8},
}


def _current() -> dict:
    names = list(DESIGNS)
    s = score(batch([DESIGNS[n] for n in names]))
    out = {}
    for i, n in enumerate(names):
        out[n] = {k: (None if isinstance(v[i], float | np.floating) and math.isnan(v[i])
                      else (bool(v[i]) if v.dtype == bool else float(v[i])))
                  for k, v in s.items()}
    return out


def test_scorer_matches_goldens():
    cur = _current()
    if os.environ.get("DSE_UPDATE_GOLDENS") or not GOLDEN.exists():
        GOLDEN.write_text(json.dumps(cur, indent=1, sort_keys=True) + "\n")
        if not os.environ.get("DSE_UPDATE_GOLDENS"):
            pytest.fail("golden file was missing; written now, commit it")
    want = json.loads(GOLDEN.read_text())
    assert sorted(want) == sorted(cur)
    for name, metrics in want.items():
        for k, v in metrics.items():
            got = cur[name][k]
            if v is None:
                assert got is None, (name, k, got)
            elif isinstance(v, bool):
                assert got == v, (name, k)
            else:
                assert got == pytest.approx(v, rel=1e-9, abs=1e-30), (name, k)


def test_goldens_cover_feasible_and_infeasible_designs():
    want = json.loads(GOLDEN.read_text())
    assert want["palm-l40s-infeasible"]["feasible"] is False
    assert sum(m["feasible"] for m in want.values()) >= len(want) - 2
