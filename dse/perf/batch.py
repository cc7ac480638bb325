"""The scorer's input: one numpy array per field, one row per candidate design (SI units)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dse.perf import kernel_comm

# name -> meaning. Every field is a float64 array of the same length.
FIELDS: dict[str, str] = {
    # --- model architecture (Hugging Face config vocabulary) ---
    "n_layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim (per attention head)",
    "ffn_dense": "intermediate_size of the dense layers",
    "vocab": "vocab_size",
    "tied": "1 if the input and output embeddings are shared",
    "mlp_mats": "matrices per MLP: 3 (gated) or 2",
    "n_experts": "routed experts per MoE layer (0: dense model)",
    "top_k": "routed experts per token",
    "ffn_expert": "moe_intermediate_size (one routed expert)",
    "n_shared": "shared experts per MoE layer",
    "ffn_shared": "width of one shared expert",
    "n_dense_layers": "layers with a dense MLP",
    "n_moe_layers": "layers with an MoE block",
    "q_lora": "MLA q_lora_rank (0: no low-rank query)",
    "kv_lora": "MLA kv_lora_rank (0: not MLA)",
    "qk_nope": "MLA qk_nope_head_dim",
    "qk_rope": "MLA qk_rope_head_dim",
    "v_head": "MLA v_head_dim",
    "window_tokens": "sliding/chunked attention window of the local layers",
    "n_local_layers": "layers that attend only within window_tokens",
    "weight_bytes": "bytes per weight element",
    "kv_bytes": "bytes per KV-cache element",
    "act_bytes": "bytes per activation element on the wire",
    "dispatch_bytes": "bytes per element of MoE dispatch traffic",
    # --- accelerator ---
    "matmul_flops_per_s": "peak dense FLOP/s of the compute dtype",
    "attn_flops_per_s": "peak dense FLOP/s used by attention kernels",
    "hbm_bw_bytes_per_s": "HBM bandwidth",
    "hbm_capacity_bytes": "HBM capacity",
    "hbm_fraction": "achievable fraction of HBM bandwidth",
    "scaleup_fraction": "achievable fraction of scale-up link bandwidth",
    "scaleout_fraction": "achievable fraction of scale-out link bandwidth",
    "layer_overhead_s": "fixed time per layer per step (kernel launches, syncs)",
    "step_overhead_s": "fixed time per step (scheduling, sampling)",
    "network_overlap_fraction": "0: collectives serialise with compute, 1: fully hidden",
    # --- topology, reduced to per-tier numbers ---
    "domain_chips": "chips in one scale-up domain",
    "scaleup_bw_bytes_per_s": "per-chip scale-up bandwidth per direction",
    "scaleup_latency_s": "latency of one scale-up collective step",
    "scaleout_bw_bytes_per_s": "per-chip scale-out bandwidth per direction",
    "scaleout_latency_s": "latency of one scale-out collective step",
    "tp_bw_fraction": "fraction of scale-up bandwidth a tp group can use",
    "tp_bw_rel": "tp_bw_fraction over that of the system the collective kernels were measured on",
    # (the tp*dp group's own fractions only reach the scorer relative to the measured system's)
    "ffn_bw_rel": "fraction of scale-up bandwidth a tp*dp group can use, over that of the "
                  "measured system",
    "a2a_bw_rel": "fraction of scale-up bandwidth for all-to-all over the tp*dp group, over "
                  "that of the measured system",
    "rack_chips": "chips per rack",
    "scaleup_extra_latency_s": "scale-up latency of the design's topology beyond that of the "
                               "system the collective kernels were measured on (per step)",
    # --- layout ---
    "tp": "tensor parallel degree (attention)",
    "pp": "pipeline stages",
    "ep": "expert parallel degree (divides tp*dp)",
    "dp": "attention data parallel degree",
    "dense_replicated": "1: dense MLP layers and shared experts replicated per attention-dp "
                        "rank (tp-sharded), 0: split over the tp*dp group",
    # --- disaggregated serving: a prefill pool feeding the decode instances above ---
    "disaggregated": "1: prefill and decode run on separate pools, 0: aggregated",
    "prefill_tp": "tensor parallel degree of a prefill instance",
    "prefill_pp": "pipeline stages of a prefill instance",
    "prefill_ep": "expert parallel degree of a prefill instance",
    "prefill_dp": "attention data parallel degree of a prefill instance",
    "prefill_concurrency": "prompts a prefill instance batches per step",
    "prefill_chip_ratio": "prefill chips per decode chip (0: as many as keep the decodes fed)",
    # --- workload and serving ---
    "isl": "input tokens per request",
    "osl": "output tokens per request",
    "concurrency": "requests in flight on one instance",
    "prefix_hit_fraction": "fraction of input tokens served from a prefix cache",
    "demand_output_tokens_per_s": "output tokens/s a fleet must serve (0: no demand given)",
    "phase": "0 both (continuous batching), 1 prefill only, 2 decode only",
    "two_batch_overlap": "1: MoE steps run as two micro-batches, one's all-to-all under the "
                         "other's compute (SGLang/DeepEP two-batch overlap), 0: one batch",
    "alltoall_overlap_fraction": "share of the EP all-to-all hidden under the step's compute",
    "a2a_mode": "EP all-to-all kernels: 0 auto (low-latency in decode steps, normal with "
                "prompt tokens), 1 low-latency, 2 normal",
    "max_batch_size": "runtime cap on sequences per scheduler (per attention dp rank)",
    "max_num_tokens": "runtime cap on tokens per step (prefill chunk)",
    "kv_memory_fraction": "fraction of free HBM the runtime gives the KV cache",
    "runtime_reserve_bytes": "HBM per chip held by the runtime (context, buffers)",
    # --- cost ---
    "rental_usd_per_hour": "rental price per chip-hour",
    "capex_usd": "all-in capital cost per chip",
    "amortization_years": "years over which capex is written off",
    "power_w": "power per chip (all-in IT power)",
    "pue": "power usage effectiveness",
    "electricity_usd_per_kwh": "electricity price",
    "use_rental": "1: price = rental rate, 0: ownership (capex + power)",
}


# fitted per-op kernel parameters (dse/catalog/kernels/*.toml, python -m dse.calibration.kernels): the
# collectives' as they are (dse.perf.kernel_comm), the others selected per design for its
# compute dtype and attention kind (dse.build.designs.kernel_fields; formulas in dse.perf.kernel_gemm
# and dse.perf.kernel_attention)
FIELDS.update({k: "collective kernel parameter (dse.perf.kernel_comm)" for k in kernel_comm.KEYS})
FIELDS.update({
    "ar_oneshot_below_2_bytes": "the runtime takes the one-shot all-reduce below this message "
                                "size on <= 2 ranks, NCCL above (0: the fastest branch)",
    "ar_oneshot_below_4_bytes": "the same on 3-4 ranks",
    "ar_oneshot_below_bytes": "the same on more than 4 ranks",
})
FIELDS.update({
    "gemm_fraction": "share of peak FLOP/s a large dense GEMM reaches",
    "gemm_half_rows": "rows of padding every GEMM pays (tile quantization in m)",
    "gemm_n_half": "output width (elements) at which edge quantization halves GEMM throughput",
    "gemm_k_half": "depth (elements) at which the K-loop prologue costs as much as the loop",
    "gemm_wave_elements": "output elements of one wave of tiles: a smaller GEMM still pays it",
    "gemm_hbm_fraction": "share of HBM bandwidth a GEMM's weight stream reaches",
    "gemm_latency_s": "fixed time per GEMM (launch, prologue, tail)",
    "moe_fraction": "share of peak FLOP/s the routed-expert grouped GEMMs reach",
    "moe_half_rows": "rows padded per touched expert (tile quantization per expert)",
    "moe_width_half": "expert width (elements) at which edge waste halves grouped-GEMM throughput",
    "moe_hbm_fraction": "share of HBM bandwidth reading touched experts reaches",
    "moe_token_bytes": "HBM bytes per routed row per hidden element (permute, unpermute, quantize)",
    "moe_latency_s": "fixed time per MoE layer (routing, launches)",
    "moe_hidden_half": "model width (elements) at which grouped-GEMM K/N edge waste halves throughput",
    "moe_batch_bytes": "HBM bytes per token on the chip per hidden element (layer input, output)",
    "moe_route_bytes": "HBM bytes per routed entry (token x top-k) on the chip per hidden element",
    "moe_nongated_slowdown": "time factor of non-gated (2-matrix) experts' grouped GEMMs vs gated",
    "moe_wave_elements": "output elements of one wave of grouped-GEMM tiles: a layer whose "
                         "routed rows on the chip fill less still pays it",
    "moe_remote_fraction": "share of a local routed row's compute a routed entry held by "
                           "another chip still costs (a kernel run over every entry)",
    "attn_prefill_fraction": "share of attn_flops_per_s prefill attention reaches",
    "attn_prefill_half_tokens": "keys per query row (causal pairs / new tokens) at which "
                                "prefill attention efficiency halves",
    "attn_prefill_half_rows": "query rows (batch x heads x tokens) of padding per call",
    "attn_prefill_latency_s": "fixed time per prefill attention call (per layer)",
    "attn_prefill_hbm_fraction": "share of HBM bandwidth prefill attention's Q/K/V traffic reaches",
    "attn_prefill_per_seq_s": "time per prompt per prefill attention call",
    "attn_prefill_per_seq_head_s": "time per (prompt, query head) per prefill attention call",
    "attn_prefill_dim_half": "qk head dim at which prefill attention's MMA rate halves",
    "attn_prefill_window_pad_tokens": "keys per query row a sliding-window prefill computes "
                                      "beyond the window (tile span, masked edge tiles)",
    "attn_decode_hbm_fraction": "share of HBM bandwidth decode attention's KV read reaches",
    "attn_decode_compute_fraction": "share of attn_flops_per_s decode attention reaches",
    "attn_decode_group_min_heads": "query heads per KV head the decode MMA pads to",
    "attn_decode_latency_s": "fixed time per decode attention call (per layer)",
    "attn_decode_per_seq_s": "time per sequence per decode attention call",
    "attn_decode_per_seq_kv_head_s": "time per sequence and KV head per decode attention call",
    "attn_decode_group_max_heads": "widest query group per KV head the decode kernel takes; "
                                   "wider groups run the per-query-head fallback",
    "attn_decode_fallback_fraction": "share of attn_flops_per_s the decode fallback reaches",
    "attn_decode_window_group_max_heads": "widest query group per KV head a sliding-window "
                                          "(local) layer's decode keeps grouped (1: every "
                                          "local layer falls back per query head)",
    "attn_decode_half_items": "(sequence, KV head) items per decode call at which the KV "
                              "stream runs at half rate",
    "attn_decode_split_tokens": "context tokens per extra split-KV CTA of one (sequence, KV "
                                "head) item: the half_items ramp fades with the context",
})


# --- serving mechanisms (issue 11): optional fields, each defaulting to "off" (a number) or to
# another field's value (a name), so a Batch built without them scores exactly as before ---
OPTIONAL: dict[str, float | str] = {
    # speculative decoding / multi-token prediction (dse.perf.spec)
    "spec_tokens": 0.0, "spec_acceptance": 0.0, "spec_draft": 0.0, "spec_mtp_layers": 0.0,
    "draft_params": 0.0, "draft_layers": 0.0, "draft_kv_bytes_per_token": 0.0,
    # request-rate serving, percentiles and goodput (dse.perf.queueing)
    "request_rate_per_s": 0.0, "ttft_slo_s": 0.0, "tpot_slo_s": 0.0,
    # closed-loop TTFT (dse.perf.phases): requests sent in all (0: 10 x concurrency)
    "num_requests": 0.0,
    # the runtime's host times (dse.perf.phases, dse.perf.step): per request, per sequence-step
    "request_overhead_s": 0.0, "seq_overhead_s": 0.0,
    # the fixed time per layer of a decode-only step the runtime replays as a CUDA graph
    # (dse.perf.step): the per-layer time of the other steps unless set
    "graph_layer_overhead_s": "layer_overhead_s",
    # the runtime's serial front end (dse.perf.frontend): per prompt token, per output token, per
    # token of text a chunk repeats
    "frontend_prompt_token_s": 0.0, "frontend_token_s": 0.0, "frontend_text_token_s": 0.0,
    "frontend_processes": 1.0,
    # the scheduler plans step k + 1 while step k runs (dse.perf.phases.ttft): 1, the three
    # runtimes' default loops; 0, a synchronous loop
    "overlap_schedule": 1.0,
    # output tokens per streamed chunk (dse.perf.frontend.chunks): 1, every token sent
    "stream_interval": 1.0,
    # steps a prompt is held to batch more prompt tokens, and the share of max_num_tokens that
    # ends the wait early (dse.perf.phases.batch_wait_s): 0, none
    "batch_wait_iters": 0.0, "batch_wait_tokens_fraction": 0.0,
    # and per request, whatever its lengths
    "frontend_request_s": 0.0,
    # expert load imbalance and redundant experts (dse.perf.imbalance)
    "expert_imbalance": 1.0, "redundant_experts": 0.0, "expert_load_cv": 0.0,
    # request lengths as distributions (dse.perf.lengths)
    "isl_cv": 0.0, "osl_cv": 0.0,
    # KV memory tiers and prefix caching (dse.perf.kvtier)
    "tier_bytes": 0.0, "tier_bw_bytes_per_s": 0.0, "prefix_tokens": 0.0,
    "cached_conversations": 0.0,
    # per-op precision: attention projections and routed experts in their own dtypes
    "attn_weight_bytes": "weight_bytes", "expert_weight_bytes": "weight_bytes",
    "attn_matmul_flops_per_s": "matmul_flops_per_s",
    "expert_matmul_flops_per_s": "matmul_flops_per_s",
    # decode attention's per-query-head fallback (dse.perf.kernel_attention): 1e4 = never
    "attn_decode_group_max_heads": 1e4, "attn_decode_fallback_fraction": 1.0,
    "attn_decode_window_group_max_heads": 1e4,
    "attn_decode_half_items": 0.0,
    # sliding-window prefill's keys per query row beyond the window (kernel_attention)
    "attn_prefill_window_pad_tokens": 0.0,
    # decode's split-KV: context tokens per extra CTA (1e12: never splits)
    "attn_decode_split_tokens": 1e12,
    # routed-entry scan of the grouped GEMMs (dse.perf.kernel_gemm.grouped_gemm_s): 0 = none
    "moe_route_bytes": 0.0,
    # the runtime's all-reduce selection by message size (dse.perf.kernel_comm.allreduce_windows;
    # serving.toml [runtimes.*] allreduce_rule): 0 = no rule, the fastest kernel branch
    "ar_oneshot_below_2_bytes": 0.0, "ar_oneshot_below_4_bytes": 0.0,
    "ar_oneshot_below_bytes": 0.0,
    # non-gated experts' kernel vs the gated one (kernel_gemm.grouped_gemm_s): 1 = the same
    "moe_nongated_slowdown": 1.0,
    # grouped GEMMs' wave floor and the compute of entries routed to other chips
    # (kernel_gemm.grouped_gemm_s): 0 = no such term
    "moe_wave_elements": 0.0, "moe_remote_fraction": 0.0,
    # a named MoE kernel backend the row's runtime has no fitted kernels for: infeasible
    "moe_kernel_missing": 0.0,
    # 2D weight-stationary tp and the KV cache split by sequence (dse.perf.tp2d): 1D, by heads
    "tp_x": 1.0, "kv_batch": 0.0, "link_collectives": 0.0, "tp_x_bw_fraction": 1.0, "tp_yz_bw_fraction": 1.0,
    "tp_a2a_bw_fraction": 1.0, "tp_x_latency_s": 0.0, "tp_yz_latency_s": 0.0,
}
FIELDS.update({
    "spec_tokens": "draft tokens proposed per sequence per step (0: no speculative decoding)",
    "spec_acceptance": "probability that a draft token is accepted (each, given the previous)",
    "spec_draft": "1: a separate draft model drafts, 0: the model's own MTP layers",
    "spec_mtp_layers": "the model's multi-token-prediction layers (num_nextn_predict_layers)",
    "draft_params": "parameters of the draft model (elements)",
    "draft_layers": "layers of the draft model",
    "draft_kv_bytes_per_token": "KV-cache bytes one token adds to the draft model (all layers)",
    "request_rate_per_s": "requests/s arriving at one instance (0: fixed concurrency)",
    "num_requests": "requests a closed-loop benchmark sends in all (0: 10 x concurrency)",
    "request_overhead_s": "front-end time per request, in both TTFTs",
    "frontend_prompt_token_s": "serial front end's time per prompt token (tokenizing)",
    "frontend_token_s": "serial front end's time per output token (detokenizing, streaming)",
    "frontend_text_token_s": "serial front end's time per token of text a streamed chunk "
                             "repeats (a runtime that streams the whole text so far)",
    "frontend_request_s": "serial front end's time per request, whatever its lengths",
    "frontend_processes": "front-end processes the requests are spread over (each a serial "
                          "server)",
    "batch_wait_iters": "steps a prompt is held while decodes run, to batch more prompt tokens",
    "batch_wait_tokens_fraction": "share of max_num_tokens (waiting prompts and running decodes) "
                                  "that ends a batch wait early",
    "stream_interval": "output tokens per streamed chunk after the first token (the serial "
                       "front end's streaming work is per chunk)",
    "overlap_schedule": "1: the scheduler plans the next step while the GPU runs this one (a "
                        "new request joins the step after next), 0: a synchronous loop",
    "seq_overhead_s": "scheduler host time per running sequence per step (per attention-DP "
                      "rank)",
    "graph_layer_overhead_s": "fixed time per layer of a decode-only step replayed as a CUDA "
                              "graph",
    "ttft_slo_s": "p90 TTFT a request must meet (0: no SLO)",
    "tpot_slo_s": "p90 TPOT a request must meet (0: no SLO)",
    "expert_imbalance": "routed tokens on the busiest EP rank over the mean (1: balanced, "
                        "0: the published routing model of the row's ep and expert_load_cv)",
    "expert_load_cv": "coefficient of variation of the routed tokens per expert (routing skew)",
    "redundant_experts": "extra expert slots per EP group (EPLB-style replicas of hot experts)",
    "tier_bytes": "offload-tier memory per chip for KV beyond HBM (0: no tier)",
    "tier_bw_bytes_per_s": "per-chip bandwidth to the offload tier",
    "prefix_tokens": "shared prompt prefix whose KV is kept once per attention-DP rank",
    "cached_conversations": "conversations per instance whose prefix the cache keeps between "
                            "turns (0: hits always held)",
    "isl_cv": "coefficient of variation of input lengths (0: every prompt isl tokens)",
    "osl_cv": "coefficient of variation of output lengths (0: every answer osl tokens)",
    "moe_kernel_missing": "1: serving.moe_backend names a kernel with no fitted parameters for "
                          "the row's runtime (an MoE model: infeasible, reason bit 256)",
    "attn_weight_bytes": "bytes per weight element of the attention projections",
    "expert_weight_bytes": "bytes per weight element of the routed experts",
    "attn_matmul_flops_per_s": "peak FLOP/s of the attention projections' compute dtype",
    "expert_matmul_flops_per_s": "peak FLOP/s of the routed experts' compute dtype",
    "tp_x": "X of the 2D weight-stationary tp mesh X x (tp / X) (1: 1D tp, all-reduces)",
    "link_collectives": "1: the tp group's collectives run on the links (TPU ICI), modelled "
                        "from the topology graph (dse.perf.tp2d), not the fitted kernels",
    "kv_batch": "1: the tp group splits the KV cache by sequence (all-to-all of queries and "
                "attention outputs), 0: by KV heads",
    "tp_x_bw_fraction": "fraction of scale-up bandwidth a collective over the X axis group "
                        "of the 2D tp mesh can use (the topology graph)",
    "tp_yz_bw_fraction": "the same for the tp / X axis group",
    "tp_a2a_bw_fraction": "fraction of scale-up bandwidth an all-to-all over the tp group can "
                          "use (the topology graph)",
    "tp_x_latency_s": "latency of one ring collective over the X axis group (hops x hop "
                      "latency)",
    "tp_yz_latency_s": "the same over the tp / X axis group",
})


@dataclass(frozen=True, eq=False)
class Batch:
    """Struct of arrays: ``Batch.from_columns({...})`` with one array per name in FIELDS.

    Derived per-row quantities (parameter counts, KV sizes) are computed once per batch and
    memoised (``memo``); the columns themselves never change. A *compact* batch may keep a
    column that is the same for every row as a length-1 array: numpy broadcasts it, so it costs
    nothing per row, and ``score`` returns full-length metrics either way.
    """

    columns: dict

    def __post_init__(self):
        object.__setattr__(self, "_memo", {})
        # (rows are the last axis: dse.perf.queueing scores the same designs at several
        # concurrencies in one call, a concurrency of shape (points, rows))
        object.__setattr__(self, "_n", max((np.shape(v)[-1] for v in self.columns.values()),
                                           default=0))

    def memo(self, key: str, fn):
        m = self.__dict__["_memo"]
        if key not in m:
            m[key] = fn()
        return m[key]

    def astype(self, dtype) -> "Batch":
        return Batch({k: v.astype(dtype, copy=False) for k, v in self.columns.items()})

    def astype_lazy(self, dtype) -> Batch:
        """``astype(dtype)`` whose columns are converted when first read (``LazyColumns``): the
        request-rate path's float32 probe batch reads ~half of its ~170 columns."""
        return lazy(LazyColumns(self.columns, None, len(self), dtype=dtype), len(self))

    @classmethod
    def from_columns(cls, columns: dict, compact: bool = False, dtype=np.float64) -> "Batch":
        """``dtype=np.float32``: the batch is emitted in single precision (what the search
        scores in), so the scorer never converts it; the "off" checks run in float64."""
        columns = _with_optional(columns)
        missing = [k for k in FIELDS if k not in columns]
        if missing:
            raise KeyError(f"Batch is missing fields: {', '.join(missing)}")
        arrays = {k: np.atleast_1d(np.asarray(columns[k], dtype=np.float64)) for k in FIELDS}
        n = max(a.shape[0] for a in arrays.values())
        out = {}
        for k, a in arrays.items():
            if k in OPTIONAL and _is_off(k, a, arrays):
                continue                # an "off" mechanism costs nothing per row
            if a.shape != (n,):
                if a.shape != (1,):
                    raise ValueError(f"field {k} has shape {a.shape}, expected ({n},)")
                if not compact:
                    a = np.full(n, a[0], dtype=dtype)
            out[k] = a.astype(dtype, copy=False)
        return cls(out)

    def __len__(self) -> int:
        return self.__dict__["_n"]

    def expanded(self) -> "Batch":
        """The same batch with every column at full length."""
        n = len(self)
        return Batch({k: (np.full(n, v[0]) if len(v) != n else v) for k, v in self.columns.items()})

    def __getattr__(self, name: str) -> np.ndarray:
        d = self.__dict__
        try:
            v = d["columns"][name]
            d[name] = v                 # (the next read finds it: the columns never change)
            return v
        except KeyError:
            cols = d["columns"]
            if name in OPTIONAL:        # a batch built without a mechanism's fields: "off"
                off = OPTIONAL[name]
                if isinstance(off, str):
                    return cols[off]
                return np.full(1, off, dtype=cols["n_layers"].dtype)   # float32 stays float32
            raise AttributeError(name) from None

    def take(self, index) -> "Batch":
        n = len(self)
        if isinstance(index, np.ndarray) and index.dtype.kind in "iu":
            # (ndarray.take: the same rows, ~1.7x faster than fancy indexing on 1-D columns;
            # the request-rate path takes rows on most of its passes)
            return Batch({k: (v if len(v) != n else v.take(index, axis=0))
                          for k, v in self.columns.items()})
        return Batch({k: (v if len(v) != n else v[index]) for k, v in self.columns.items()})

    def take_lazy(self, index: np.ndarray) -> Batch:
        """``take(index)`` (whole-number rows) whose columns are taken when first read
        (``LazyColumns``): dse.perf.queueing's root finding takes the rows still open on most of its
        passes and its queue times read ~60 of the ~170 columns (a take cost ~0.5 us a row)."""
        return lazy(LazyColumns(self.columns, index, len(self)), len(index))

    def gather(self, rows: np.ndarray, direct: dict | None = None,
               part: slice = slice(None), dtype=None) -> "Batch":
        """Rows ``rows[part]`` of this compact batch of distinct rows (its length-1 columns stay
        length-1), with the ``direct`` fields' values ``[part]`` written in."""
        rows = rows[part]
        cols = {k: (v if len(v) == 1 else v[rows]) for k, v in self.columns.items()}
        for k, v in (direct or {}).items():
            v = np.asarray(v)[part]
            cols[k] = v if dtype is None else v.astype(dtype, copy=False)
        if max(len(v) for v in cols.values()) != len(rows):   # all length-1: keep the length
            cols["concurrency"] = np.broadcast_to(cols["concurrency"], (len(rows),)).copy()
        b = Batch(cols)
        return b.astype(dtype) if dtype is not None else b

    def has_on(self, name: str) -> bool:
        """Whether any row sets optional field ``name`` away from its "off" value (the hooks of
        the serving mechanisms run only then, so a batch without them scores as before)."""
        return self.memo("has_on:" + name, lambda: self._has_on(name))

    def _has_on(self, name: str) -> bool:
        d = OPTIONAL[name]
        cols = self.__dict__["columns"]
        if name not in cols:            # built without it: "off" by construction
            return False
        off = getattr(self, d) if isinstance(d, str) else d
        return bool(np.any(cols[name] != off))

    def replace(self, **updates) -> "Batch":
        cols = self.columns.copy()      # (a lazy take's stays lazy: LazyColumns)
        # (in the batch's precision: a float32 batch stays float32, so its arithmetic does not
        # widen to float64 where a mechanism replaces a column)
        dtype = np.result_type(cols["n_layers"], np.float32) if "n_layers" in cols else np.float64
        for k, v in updates.items():
            if k not in FIELDS:
                raise KeyError(k)
            v = np.asarray(v, dtype=dtype)
            cols[k] = np.broadcast_to(v, np.broadcast_shapes(v.shape, (len(self),))).copy()
        # (the rows: this batch's, or an update's last axis where it is longer; no scan of
        # every column, which a request-rate root pays on each of its passes)
        b = object.__new__(Batch)
        object.__setattr__(b, "columns", cols)
        object.__setattr__(b, "_memo", {})
        object.__setattr__(b, "_n", max([len(self)] + [cols[k].shape[-1] for k in updates
                                                        if cols[k].ndim]))
        return b


def lazy(columns: LazyColumns, n: int) -> Batch:
    """A batch of ``n`` rows on lazy columns (``Batch.take_lazy``, ``astype_lazy``)."""
    b = object.__new__(Batch)
    object.__setattr__(b, "columns", columns)
    object.__setattr__(b, "_memo", {})
    object.__setattr__(b, "_n", n)
    return b


class LazyColumns(dict):
    """The columns of ``Batch.take_lazy``: rows ``index`` of ``source``'s columns (of ``n``
    rows; a length-1 column as it is), each taken when first read; ``dtype`` (not None): each
    converted to it when first read (``Batch.astype_lazy``; ``index`` None). Iterating, sizing
    or copying it into a plain dict takes every column first, so it reads as the eager take's."""

    def __init__(self, source: dict, index: np.ndarray, n: int, done: dict | None = None,
                 dtype=None):
        super().__init__(done or {})
        self.source, self.index, self.n, self.dtype = source, index, n, dtype

    def __missing__(self, key):
        v = self.source[key]
        if self.index is not None and np.shape(v)[-1] == self.n:
            v = v.take(self.index, axis=-1)     # (v[..., index]: the rows are the last axis)
        if self.dtype is not None:
            v = v.astype(self.dtype, copy=False)
        dict.__setitem__(self, key, v)
        return v

    def __contains__(self, key) -> bool:
        return dict.__contains__(self, key) or key in self.source

    def get(self, key, default=None):
        return self[key] if key in self else default

    def _all(self) -> None:
        for key in self.source:
            if not dict.__contains__(self, key):
                self.__missing__(key)

    def copy(self) -> LazyColumns:
        """A lazy copy (``Batch.replace``) whose reads take from this one, so a column is
        taken once for every batch replaced from it (a probe's pass at each concurrency)."""
        return LazyColumns(self, None, self.n, dict(dict.items(self)))

    def keys(self):
        self._all()
        return dict.keys(self)

    def values(self):
        self._all()
        return dict.values(self)

    def items(self):
        self._all()
        return dict.items(self)

    def __iter__(self):
        self._all()
        return dict.__iter__(self)

    def __len__(self) -> int:
        self._all()
        return dict.__len__(self)


def as_floating(x) -> np.ndarray:
    """``x`` as a floating array: a float32 batch's values stay float32 (one float64 input
    widens every later step of a float32 chunk), anything else becomes float64."""
    x = np.asarray(x)
    return x if x.dtype.kind == "f" else x.astype(np.float64)


def _is_off(k: str, a: np.ndarray, arrays: dict) -> bool:
    d = OPTIONAL[k]
    off = arrays[d] if isinstance(d, str) else d
    return bool(np.all(a == off))


def _with_optional(columns: dict) -> dict:
    """``columns`` with every OPTIONAL field it lacks at its "off" value."""
    if all(k in columns for k in OPTIONAL):
        return columns
    out = dict(columns)
    for k, d in OPTIONAL.items():
        if k not in out:
            out[k] = out[d] if isinstance(d, str) else d
    return out
