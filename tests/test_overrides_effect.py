"""Every settable numeric path that a design may override changes some metric of some design.

A key that is accepted and ignored (as ``topology.scaleup_base_latency_s`` once was) lies to the
user: their what-if silently answers a different question. Each numeric path is scaled by 1.2
(or set to a small positive value where it is 0) on a handful of designs that between them use
every feature of the model (dense and MoE/MLA models, tp/ep/dp/pp across domains,
disaggregated, rental and component costs, demand), and some metric of some design must move.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dse.build.designs import STRING_PATHS, resolve, settable_paths, to_batch
from dse.perf import score

BASES = [
    {"accelerator.id": "h100-sxm", "model.id": "llama-3.1-70b", "layout.tp": 4, "layout.pp": 2,
     "workload.isl": 2048, "workload.osl": 256, "workload.concurrency": 64,
     "workload.prefix_hit_fraction": 0.2, "workload.demand_output_tokens_per_s": 1e6},
    {"accelerator.id": "gb200", "model.id": "deepseek-v3", "model.weight_dtype": "fp8",
     "layout.tp": 1, "layout.dp": 32, "layout.ep": 32, "workload.isl": 4096, "workload.osl": 512,
     "workload.concurrency": 2048, "layout.dense_mlp": "replicated"},
    {"accelerator.id": "h200-sxm", "model.id": "deepseek-v3", "model.weight_dtype": "fp8",
     "layout.tp": 8, "layout.dp": 2, "layout.ep": 16, "workload.isl": 1024, "workload.osl": 256,
     "workload.concurrency": 64, "cost.mode": "rental", "layout.dense_mlp": "split"},
    {"accelerator.id": "b200", "model.id": "llama-4-scout", "model.weight_dtype": "fp8",
     "layout.tp": 4, "layout.ep": 4, "workload.isl": 8192, "workload.osl": 1024,
     "workload.concurrency": 32, "cost.capex_model": "components"},
    {"accelerator.id": "h100-sxm", "model.id": "llama-3.1-8b", "layout.tp": 1,
     "workload.isl": 1024, "workload.osl": 256, "workload.concurrency": 128,
     "serving.mode": "disaggregated", "layout.prefill_tp": 2, "workload.prefill_concurrency": 4,
     "serving.prefill_chip_ratio": 0.5},
    {"accelerator.id": "h100-sxm", "model.id": "llama-3.1-405b", "model.weight_dtype": "fp8",
     "layout.tp": 8, "layout.pp": 4, "workload.isl": 1024, "workload.osl": 128,
     "workload.concurrency": 16},
    {"accelerator.id": "a100-sxm-80g", "model.id": "mixtral-8x7b", "model.weight_dtype": "int8",
     "layout.tp": 2, "layout.ep": 2, "workload.concurrency": 32},
    {"accelerator.id": "b200", "model.id": "llama-3.1-70b", "model.weight_dtype": "fp4",
     "layout.tp": 2, "workload.concurrency": 64, "model.kv_dtype": "bf16"},
    {"accelerator.id": "h100-sxm", "model.id": "mixtral-8x7b", "model.weight_dtype": "fp8",
     "model.fp8_scaling": "tensor", "layout.tp": 2, "layout.ep": 2, "workload.concurrency": 64},
    {"accelerator.id": "b200", "model.id": "qwen3-30b-a3b", "model.weight_dtype": "fp4",
     "layout.tp": 1, "layout.dp": 4, "layout.ep": 4, "workload.concurrency": 256,
     "serving.a2a_kernel": "normal"},
    {"accelerator.id": "a100-sxm-80g", "model.id": "llama-3.1-8b", "model.kv_dtype": "fp8",
     "layout.tp": 1, "workload.concurrency": 32},
    {"accelerator.id": "h200-sxm", "model.id": "deepseek-v3", "model.weight_dtype": "bf16",
     "layout.tp": 8, "layout.pp": 2, "workload.concurrency": 16},
    {"accelerator.id": "l40s", "model.id": "llama-3.1-8b", "model.weight_dtype": "fp16",
     "layout.tp": 2, "workload.concurrency": 16, "workload.phase": "prefill"},
    # non-gated (2-matrix, relu2) experts, one per MoE dtype family: the non-gated kernel's
    # efficiency (moe_<family>_nongated_slowdown) acts only on them
    {"accelerator.id": "h100-sxm", "model.id": "qwen3-30b-a3b", "model.weight_dtype": "bf16",
     "model.mlp_gated": False, "layout.tp": 1, "workload.concurrency": 64},
    {"accelerator.id": "b200", "model.id": "qwen3-30b-a3b", "model.weight_dtype": "fp4",
     "model.mlp_gated": False, "layout.tp": 1, "workload.concurrency": 64},
    {"accelerator.id": "gb200", "model.id": "deepseek-v3", "model.weight_dtype": "fp8",
     "model.mlp_gated": False, "layout.dp": 8, "layout.ep": 8, "workload.concurrency": 256},
    {"accelerator.id": "h100-sxm", "model.id": "mixtral-8x7b", "model.weight_dtype": "fp8",
     "model.fp8_scaling": "tensor", "model.mlp_gated": False, "layout.tp": 2, "layout.ep": 2,
     "workload.concurrency": 64},
    # int4 weight-only (W4A16) experts, their own MoE family (moe_int4_*): TP+EP under vLLM
    # (every chip runs every token: remote entries), and non-gated
    {"accelerator.id": "h200-sxm", "model.id": "kimi-k2", "model.weight_dtype": "int4",
     "serving.runtime": "vllm", "layout.tp": 8, "layout.ep": 8, "workload.isl": 1024,
     "workload.osl": 256, "workload.concurrency": 64},
    {"accelerator.id": "h100-sxm", "model.id": "qwen3-30b-a3b", "model.weight_dtype": "int4",
     "model.mlp_gated": False, "layout.tp": 1, "workload.concurrency": 64},
    # fp4 experts on Hopper (no fp4 peak): the W4A16 MXFP4 family (moe_mxfp4_*), TP+EP under
    # TensorRT-LLM, and non-gated
    {"accelerator.id": "h200-sxm", "model.id": "gpt-oss-120b", "model.weight_dtype": "fp4",
     "serving.runtime": "trtllm", "layout.tp": 8, "layout.ep": 8, "workload.isl": 1024,
     "workload.osl": 256, "workload.concurrency": 64},
    {"accelerator.id": "h100-sxm", "model.id": "qwen3-30b-a3b", "model.weight_dtype": "fp4",
     "model.mlp_gated": False, "layout.tp": 1, "workload.concurrency": 64},
    # serving mechanisms that only act when on (issue 11): MTP speculation
    {"accelerator.id": "gb200", "model.id": "deepseek-v3", "model.weight_dtype": "fp8",
     "layout.dp": 8, "layout.ep": 8, "workload.concurrency": 256, "serving.spec_tokens": 2},
    # ... KV offload tiers (host memory, and NVMe) holding the prefix cache past free HBM
    {"accelerator.id": "h100-sxm", "model.id": "llama-3.1-70b", "model.weight_dtype": "fp8",
     "layout.tp": 4, "workload.isl": 32768, "workload.osl": 1024, "workload.concurrency": 16,
     "workload.prefix_hit_fraction": 0.5, "workload.cached_conversations": 1024,
     "serving.kv_offload": "host"},
    {"accelerator.id": "h100-sxm", "model.id": "llama-3.1-70b", "model.weight_dtype": "fp8",
     "layout.tp": 4, "workload.isl": 32768, "workload.osl": 1024, "workload.concurrency": 16,
     "workload.prefix_hit_fraction": 0.5, "workload.cached_conversations": 4096,
     "serving.kv_offload": "ssd", "accelerator.ssd_bytes": 2e12,
     "accelerator.ssd_bw_bytes_per_s": 6e9},
    # ... a scale-up domain of two racks (it pays for a second switch tier)
    {"accelerator.id": "gb200", "model.id": "llama-3.1-70b", "model.weight_dtype": "fp8",
     "layout.tp": 2, "workload.concurrency": 64, "topology.scaleup.domain_chips": 144},
    # decode attention's per-query-head fallback: 36 query heads on one KV head, just past
    # TensorRT-LLM's fitted 32-head group limit (x1.2 = 38.4 puts it back on the grouped kernel)
    {"accelerator.id": "h100-sxm", "model.id": "llama-3.1-8b", "model.num_attention_heads": 36,
     "model.num_key_value_heads": 1, "layout.tp": 1, "workload.isl": 1024, "workload.osl": 256,
     "workload.concurrency": 256, "model.kv_dtype": "bf16"},
    {"accelerator.id": "h100-sxm", "model.id": "llama-3.1-8b", "model.num_attention_heads": 36,
     "model.num_key_value_heads": 1, "layout.tp": 1, "workload.isl": 1024, "workload.osl": 256,
     "workload.concurrency": 256, "model.kv_dtype": "fp8"},
    # sliding-window prefill (attn_prefill*_window_pad_tokens): gpt-oss's 128-token local
    # layers, bf16 and fp8 caches on a chip with an fp8 peak and an fp8 cache on one without
    {"accelerator.id": "h100-sxm", "model.id": "gpt-oss-120b", "layout.tp": 2,
     "workload.isl": 8192, "workload.osl": 256, "workload.concurrency": 16,
     "model.kv_dtype": "bf16"},
    {"accelerator.id": "h100-sxm", "model.id": "gpt-oss-120b", "layout.tp": 2,
     "workload.isl": 8192, "workload.osl": 256, "workload.concurrency": 16,
     "model.kv_dtype": "fp8"},
    {"accelerator.id": "a100-sxm-80g", "model.id": "gpt-oss-120b", "layout.tp": 2,
     "workload.isl": 8192, "workload.osl": 256, "workload.concurrency": 16,
     "model.kv_dtype": "fp8"},
    # TensorRT-LLM's batch waiting, which acts only with both numbers set: a 1024-token prompt
    # and 64 decodes against 0.9 x 1300 = 1170 tokens wait the timeout; at 0.72 x 1300 = 936
    # they do not
    {"accelerator.id": "h200-sxm", "model.id": "llama-3.1-70b", "model.weight_dtype": "fp8",
     "layout.tp": 4, "workload.isl": 1024, "workload.osl": 1024, "workload.concurrency": 64,
     "serving.max_num_tokens": 1300, "serving.batch_wait_iters": 20,
     "serving.batch_wait_tokens_fraction": 0.9},
]

# paths with no numeric effect by design, each with the reason
NO_EFFECT = {
    "accelerator.peak_flops_per_s.int4": "int4 weights are weight-only: they compute in bf16",
    "accelerator.tdp_w": "documentation: power enters through price.all_in_power_w",
    # the soft_l1 refit (2026-12-01) put the bf16-cache MLA decode query-group tile at 2-6
    # heads: it pads only designs with fewer query heads per chip, whose absorbed-MLA decode
    # is KV-bandwidth bound (~4 FLOP/byte), so no metric moves; the kernel model uses it
    # (tests/test_kernel_attention.py::test_every_parameter_matters)
    "accelerator.kernel.mla_decode_group_min_heads": "inactive at the fitted values (see above)",
    # the refit with decode's half_items term (2026-12-02) did the same to the fp8-cache tile
    # (1.5-7.7 heads on the bases' chips, fewer than their 16-128 MLA query heads per chip)
    "accelerator.kernel.mla_decode_kv_fp8_group_min_heads": "inactive at the fitted values",
    # a threshold on whole query-group sizes, fitted at 1 (FlashAttention-2's windowed decode:
    # L40S and RTX PRO 6000 vLLM, bf16 KV) or 1e4 (off): 20% more crosses no group size, so
    # no metric moves; its effect is worked by hand at a crossing value in
    # tests/test_physics_attention_fallback.py::test_windowed_layers_fall_back_per_query_head_by_hand
    "accelerator.kernel.attn_decode_window_group_max_heads": "a threshold 20% does not cross",
    "accelerator.kernel.attn_decode_kv_fp8_window_group_max_heads": "a threshold 20% does not "
                                                                     "cross",
}
BOOLEAN = {"model.mlp_gated", "model.tie_word_embeddings"}


def _numeric_paths():
    out = []
    for p in settable_paths():
        if p in STRING_PATHS or p in NO_EFFECT:
            continue
        if p.endswith(".id"):
            continue
        out.append(p)
    return out


def _scores(rows):
    b = to_batch(resolve(pd.DataFrame(rows)))
    s = score(b)
    keep = [k for k, v in s.items() if np.issubdtype(np.asarray(v).dtype, np.number)]
    return np.column_stack([np.asarray(s[k], dtype=float) for k in keep])


@pytest.fixture(scope="module")
def base_resolved():
    return resolve(pd.DataFrame(BASES))


@pytest.mark.parametrize("path", _numeric_paths())
def test_every_override_has_an_effect(path, base_resolved):
    base = _scores(BASES)
    vals = pd.to_numeric(base_resolved[path], errors="coerce").to_numpy(dtype=float)
    rows = []
    for r, v in zip(BASES, vals):
        v = 0.0 if not np.isfinite(v) else v
        if "fraction" in path and v > 0:
            new = v * 0.8                              # fractions are capped at 1
        elif v == 0:
            new = 0.1 if "fraction" in path else (1e-5 if path.endswith("_s") else 1.0)
        else:
            new = v * 1.2
        if path.startswith(("layout.", "model.")) or path.endswith(("isl", "osl", "concurrency")):
            new = float(max(np.round(new), v + 1, 2))  # whole numbers (0 = "the default": 2)
        if path in BOOLEAN:
            new = 1.0 - v
        rows.append({**r, path: new})
    try:
        moved = _scores(rows)
    except Exception as e:                             # an invalid value is an effect too
        pytest.skip(f"{path}: the changed value is refused ({type(e).__name__})")
    same = np.isclose(base, moved, rtol=1e-9, equal_nan=True)
    assert not same.all(), f"{path} is accepted but changes no metric of any design"
