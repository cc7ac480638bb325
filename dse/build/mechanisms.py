"""The serving mechanisms' fields (issue 11), from the resolved design table to scorer columns.

``dse.build.designs`` calls two functions: ``resolve_defaults`` (fills what a design left to the catalog:
the published draft acceptance per speculative method; then ``check``: a draft method needs a
catalog draft model, MTP needs MTP layers, a request rate or SLO needs an instance that takes
requests end to end; ``dse whatif`` runs ``check`` again after its numeric overrides) and
``batch_columns`` (the Batch fields of dse.perf.spec, queueing, imbalance, lengths and per-op
precision). A design that sets none of them gets every mechanism "off" (dse.perf.batch.OPTIONAL)
and scores exactly as before.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dse import catalog
from dse.build.select import BYTES, MOE_INT4, MOE_MXFP4, W, compute_peak, encode, lookup
from dse.errors import InputError, suggest
from dse.catalog.specs import DTYPES
from dse.perf.imbalance import published_imbalance

SPEC_METHODS = {"mtp": 0.0, "draft": 1.0}
# settable paths that are exactly one scorer field used only after the step model's per-design
# constants (dse.build.designs.DIRECT_FIELDS: a search writes them straight into the Batch)
DIRECT = {"workload.request_rate_per_s": "request_rate_per_s",
          "workload.ttft_slo_s": "ttft_slo_s", "workload.tpot_slo_s": "tpot_slo_s",
          "workload.isl_cv": "isl_cv", "workload.osl_cv": "osl_cv",
          "serving.spec_tokens": "spec_tokens", "serving.spec_acceptance": "spec_acceptance",
          "serving.expert_imbalance": "expert_imbalance",
          "workload.cached_conversations": "cached_conversations",
          "workload.num_requests": "num_requests",
          "serving.request_overhead_s": "request_overhead_s",
          "serving.seq_overhead_s": "seq_overhead_s",
          "serving.frontend_prompt_token_s": "frontend_prompt_token_s",
          "serving.frontend_token_s": "frontend_token_s",
          "serving.frontend_text_token_s": "frontend_text_token_s",
          "serving.frontend_request_s": "frontend_request_s",
          "serving.frontend_processes": "frontend_processes",
          "serving.overlap_schedule": "overlap_schedule",
          "serving.stream_interval": "stream_interval",
          "serving.batch_wait_iters": "batch_wait_iters",
          "serving.batch_wait_tokens_fraction": "batch_wait_tokens_fraction"}


def _col(out, path, default):
    if path in out.keys():
        return out[path]
    return pd.Series([default] * len(out)) if isinstance(out, pd.DataFrame) else np.array([default])


def resolve_defaults(out: pd.DataFrame, file=None, names=None, alias=None) -> None:
    """Blank ``serving.spec_acceptance`` takes the method's published figure (serving.toml
    [spec_acceptance]); ``serving.spec_draft_model`` must be a catalog model where the method is
    "draft" and a draft is asked for."""
    alias = alias or {}
    tier_defaults(out)
    if "serving.expert_imbalance" not in out.columns:   # blank: the published routing model
        out["serving.expert_imbalance"] = np.nan
    n = len(out)
    method = _col(out, "serving.spec_method", "mtp")
    acc = pd.to_numeric(pd.Series(np.asarray(_col(out, "serving.spec_acceptance", np.nan),
                                             dtype=object)), errors="coerce").to_numpy(float)
    pub = lookup(method, catalog.spec_acceptance())
    out["serving.spec_acceptance"] = np.broadcast_to(np.where(np.isnan(acc), pub, acc), (n,))
    draft = pd.Series(np.asarray(_col(out, "serving.spec_draft_model", ""), dtype=object)) \
        .fillna("").astype(str).str.strip()
    out["serving.spec_draft_model"] = np.broadcast_to(draft.to_numpy(), (n,))
    check(out, file, names, alias)


def check(out, file=None, names=None, alias=None) -> None:
    """The mechanisms' consistency rules on a resolved table (``check_spec``, ``check_rate``)."""
    check_spec(out, file, names, alias)
    check_rate(out, file, names, alias)


RATE_PATHS = ("workload.request_rate_per_s", "workload.ttft_slo_s", "workload.tpot_slo_s")


def check_rate(out, file=None, names=None, alias=None) -> None:
    """A request rate or a latency SLO needs an instance that takes requests end to end: a
    prefill-only or decode-only instance (``workload.phase``, one pool of a disaggregated
    system) has no request stream of its own (its rate is set by the other pool), so a rate
    there would be ignored. Refused in one line; ``serving.mode = "disaggregated"`` models both
    pools, with the prefill pool's queue (dse.perf.queueing.serve_disaggregated)."""
    if "workload.phase" not in out.keys():
        return
    alias = alias or {}
    phase = pd.Series(np.asarray(out["workload.phase"], dtype=object).ravel()).fillna("")
    n = max(len(phase), *(np.size(out[p]) for p in RATE_PATHS if p in out.keys()))
    one = np.broadcast_to(phase.to_numpy(), (n,))
    single = (one == "prefill") | (one == "decode")
    if not single.any():
        return
    for path in RATE_PATHS:
        v = np.broadcast_to(pd.to_numeric(pd.Series(np.asarray(_col(out, path, 0.0), dtype=object)
                                                    .ravel()), errors="coerce").fillna(0.0)
                            .to_numpy(float), (n,))
        bad = single & (v > 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(f"{alias.get(path, path)} = {v[i]:g} on a {one[i]}-only instance "
                             f"({alias.get('workload.phase', 'workload.phase')} = {one[i]!r}): "
                             "one pool of a disaggregated system has no request stream of its "
                             "own", file=file, where=names[i] if names and i < len(names) else None,
                             hint="model the whole system (serving.mode = \"disaggregated\" "
                             "with workload.phase = \"both\": both pools and the prefill queue), "
                             "or score this pool at a fixed workload.concurrency")


def check_spec(out, file=None, names=None, alias=None) -> None:
    """Refuse speculative decoding that cannot run, in one line: ``serving.spec_method =
    "draft"`` with draft tokens but no (or an unknown) ``serving.spec_draft_model``, and
    ``"mtp"`` on a model without MTP layers. Called on the resolved table and again by ``dse
    whatif`` once its numeric overrides (``--set serving.spec_tokens=2``) are applied."""
    alias = alias or {}
    n = len(out) if isinstance(out, pd.DataFrame) else max(
        (np.size(out[c]) for c in out.keys()), default=1)
    method = np.broadcast_to(np.asarray(_col(out, "serving.spec_method", "mtp"), dtype=object),
                             (n,))
    method = np.where(pd.isna(method) | (method == ""), "mtp", method)
    draft = pd.Series(np.broadcast_to(np.asarray(_col(out, "serving.spec_draft_model", ""),
                                                 dtype=object), (n,))).fillna("").astype(str) \
        .str.strip()
    tokens = np.broadcast_to(pd.to_numeric(pd.Series(np.asarray(
        _col(out, "serving.spec_tokens", 0), dtype=object).ravel()), errors="coerce").fillna(0)
        .to_numpy(float), (n,))
    where = lambda i: names[i] if names and i < len(names) else None  # noqa: E731
    wants = (method == "draft") & (tokens > 0)
    models = catalog.models()
    bad = wants & ~draft.isin(list(models)).to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        key = alias.get("serving.spec_draft_model", "serving.spec_draft_model")
        if draft.iloc[i]:
            raise InputError(f"unknown draft model id {draft.iloc[i]!r}", file=file,
                             where=where(i) or key,
                             hint=suggest(draft.iloc[i], models, "valid models"))
        raise InputError(f"serving.spec_method = \"draft\" with serving.spec_tokens = "
                         f"{tokens[i]:g} needs {key} (the catalog id of the draft model)",
                         file=file, where=where(i), hint="give a catalog model id such as "
                         "\"llama-3.1-8b\" (`dse catalog list models`), or use "
                         "serving.spec_method = \"mtp\" on a model with MTP layers")
    layers = np.broadcast_to(np.asarray(_col(out, "model.num_nextn_predict_layers", 0),
                                        dtype=float), (n,))
    bad = (method == "mtp") & (tokens > 0) & ~(layers >= 1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError("serving.spec_method = \"mtp\" but the model has no MTP module "
                         "(model.num_nextn_predict_layers = 0)", file=file, where=where(i),
                         hint="use serving.spec_method = \"draft\" with a "
                         "serving.spec_draft_model, or a model that ships MTP layers")


def batch_columns(out, kv_bytes: np.ndarray) -> dict[str, np.ndarray]:
    """The mechanisms' scorer fields of a resolved table (a DataFrame or a dict of columns)."""
    f = lambda c, d=0.0: np.asarray(_col(out, c, d), dtype=float)  # noqa: E731
    models = catalog.models()
    draft = _col(out, "serving.spec_draft_model", "")
    per_token = {k: (m.kv_lora_rank + m.qk_rope_head_dim if m.kv_lora_rank > 0
                     else 2.0 * m.num_key_value_heads * m.head_dim) * m.num_hidden_layers
                 for k, m in models.items()}
    return {
        "spec_tokens": f("serving.spec_tokens"),
        "spec_acceptance": f("serving.spec_acceptance"),
        "spec_draft": lookup(_col(out, "serving.spec_method", "mtp"), SPEC_METHODS, 0.0),
        "spec_mtp_layers": f("model.num_nextn_predict_layers"),
        "draft_params": lookup(draft, {k: m.total_params for k, m in models.items()}, 0.0),
        "draft_layers": lookup(draft, {k: float(m.num_hidden_layers) for k, m in models.items()},
                               0.0),
        "draft_kv_bytes_per_token": lookup(draft, per_token, 0.0) * kv_bytes,
        "request_rate_per_s": f("workload.request_rate_per_s"),
        "ttft_slo_s": f("workload.ttft_slo_s"), "tpot_slo_s": f("workload.tpot_slo_s"),
        "expert_imbalance": expert_imbalance(out, f),
        "expert_load_cv": np.array([catalog.expert_load_cv()]),
        "redundant_experts": f("serving.redundant_experts"),
        "isl_cv": f("workload.isl_cv"), "osl_cv": f("workload.osl_cv"),
        "num_requests": f("workload.num_requests"),
        "request_overhead_s": f("serving.request_overhead_s"),
        "seq_overhead_s": f("serving.seq_overhead_s"),
        "frontend_prompt_token_s": f("serving.frontend_prompt_token_s"),
        "frontend_token_s": f("serving.frontend_token_s"),
        "frontend_text_token_s": f("serving.frontend_text_token_s"),
        "frontend_request_s": f("serving.frontend_request_s"),
        "frontend_processes": f("serving.frontend_processes"),
        "overlap_schedule": f("serving.overlap_schedule"),
        "stream_interval": f("serving.stream_interval"),
        "batch_wait_iters": f("serving.batch_wait_iters"),
        "batch_wait_tokens_fraction": f("serving.batch_wait_tokens_fraction"),
        **tier_columns(out, f),
    }


def expert_imbalance(out, f) -> np.ndarray:
    """serving.expert_imbalance where given, else 0: the published routing model of the row's EP
    size (dse.perf.imbalance.raw, with ``expert_load_cv`` from serving.toml [expert_routing]);
    1 for dense models, so those rows stay "off"."""
    given = f("serving.expert_imbalance", np.nan)
    if not np.any(np.isnan(given)):
        return given
    return np.where(np.isnan(given), np.where(f("model.num_experts") > 0, 0.0, 1.0), given)


def scale_base(table, path: str) -> np.ndarray:
    """The values a scale factor (``--scale PATH=F``, a ``{ scale = [...] }`` parameter)
    multiplies: the column as resolved, with a blank ``serving.expert_imbalance`` replaced by
    the published routing model it stands for (``dse.perf.imbalance.published_imbalance`` of
    the row's ``layout.ep`` and experts), so that scaling a blank imbalance scales that default
    (1.07 at EP 8 x 1.2 = 1.28). Rows where the model gives exactly 1 (dense models, ep = 1:
    no imbalance between EP ranks exists) keep the blank, which stays 1 whatever the factor; a
    disaggregated prefill pool with its own EP size takes the decode layout's scaled value."""
    cur = np.asarray(table[path], dtype=float)
    if path != "serving.expert_imbalance" or not np.isnan(cur).any():
        return cur
    f = lambda c, d=0.0: np.asarray(_col(table, c, d), dtype=float)  # noqa: E731
    pub = published_imbalance(f("layout.ep", 1.0), f("model.num_experts"),
                              catalog.expert_load_cv())
    pub = np.broadcast_to(pub, np.broadcast_shapes(pub.shape, cur.shape))
    cur = np.broadcast_to(cur, pub.shape)
    return np.where(np.isnan(cur) & (pub > 1.0), pub, cur)


def tier_columns(out, f) -> dict:
    """The offload tier of serving.kv_offload (bytes and bandwidth per chip) and the shared
    prefix."""
    mode = _col(out, "serving.kv_offload", "none")
    host, ssd = lookup(mode, {"host": 1.0}, 0.0), lookup(mode, {"ssd": 1.0}, 0.0)
    return {"tier_bytes": host * f("accelerator.host_memory_bytes")
            + ssd * f("accelerator.ssd_bytes"),
            "tier_bw_bytes_per_s": host * f("accelerator.host_link_bw_bytes_per_s")
            + ssd * f("accelerator.ssd_bw_bytes_per_s"),
            "prefix_tokens": f("workload.prefix_tokens"),
            "cached_conversations": f("workload.cached_conversations")}


TIER_FIELDS = ("host_memory_bytes", "host_link_bw_bytes_per_s", "ssd_bytes", "ssd_bw_bytes_per_s")


def tier_defaults(out: pd.DataFrame) -> None:
    """accelerator.host_memory_bytes / host_link_bw_bytes_per_s / ssd_bytes / ssd_bw_bytes_per_s
    from dse/catalog/memory_tiers.toml where a design leaves them blank (0: no catalog figure)."""
    table = catalog.memory_tiers()
    for k in TIER_FIELDS:
        col = f"accelerator.{k}"
        own = lookup(out["accelerator.id"], {a: float(v.get(k, 0.0)) for a, v in table.items()},
                     0.0)
        if col in out.columns:
            given = pd.to_numeric(out[col], errors="coerce").to_numpy(dtype=float)
            own = np.where(np.isnan(given), own, given)
        out[col] = own


def precision_columns(out, wbytes, matmul, fam, peak) -> dict:
    """Per-op precision: bytes and compute peak of the routed experts' and the attention
    projections' weights (``model.expert_dtype``, ``model.attention_dtype``; blank: the
    weights'), and the grouped-GEMM kernel family code of the experts' dtype (``moe_family``:
    None when every row's experts are in the weights' dtype and run its GEMM family). Experts
    in int4 run the W4A16 kernels (Marlin: int4 weights dequantized to bf16 in registers, bf16
    MMAs), their own family (``select.MOE_INT4``), not the bf16 kernel their compute peak
    would pick. Experts in fp4 on a chip without an fp4 peak (Hopper, Ada, Ampere) run a W4A16
    MXFP4 kernel (the fp4 weights dequantized to bf16 in registers, bf16 MMAs: TensorRT-LLM's
    Hopper MoE ``w4a16_mxfp4``, vLLM's OAI Triton MXFP4 experts, SGLang's Triton fused MoE, as
    aiconfigurator-core's tables name them), their own family (``select.MOE_MXFP4``) at the
    bf16 peak, not the fp8 block-scaled CUTLASS kernel the fp8 fallback of their compute peak
    would pick. On dtype codes: no string work per design."""
    cols = {}
    moe_family = None
    weight = encode(out["model.weight_dtype"], DTYPES)
    expert = weight
    for key, path in (("expert", "model.expert_dtype"), ("attn", "model.attention_dtype")):
        given = encode(_col(out, path, None), DTYPES)       # -1: blank, the weights' dtype
        if not np.any(given >= 0):
            cols[f"{key}_weight_bytes"], cols[f"{key}_matmul_flops_per_s"] = wbytes, matmul
            continue
        dt = np.where(given >= 0, given, weight)
        mm, fm = compute_peak(dt, peak)
        cols[f"{key}_weight_bytes"] = BYTES[dt]
        cols[f"{key}_matmul_flops_per_s"] = mm
        if key == "expert":
            moe_family, expert = fm, dt
    int4 = np.asarray(expert) == W["int4"]
    if np.any(int4):
        moe_family = np.where(int4, MOE_INT4, fam if moe_family is None else moe_family)
    mxfp4 = (np.asarray(expert) == W["fp4"]) & np.isnan(peak["fp4"])
    if np.any(mxfp4):
        moe_family = np.where(mxfp4, MOE_MXFP4, fam if moe_family is None else moe_family)
        cols["expert_matmul_flops_per_s"] = np.where(mxfp4, peak["bf16"],
                                                     cols["expert_matmul_flops_per_s"])
    cols["moe_family"] = moe_family
    return cols
