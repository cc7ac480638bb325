"""The registry of settable fields: every dotted path a design, space, case file or ``--set`` may
give, with its type, unit, description, default and valid range.

Validation (``dse.spec.validate``), the JSON Schemas (``dse.spec.schema``), ``--set`` parsing and labels
with units are all derived from ``FIELDS``; adding a field is one entry below (an enum is
``enum("serving.x", ("a", "b"), "a", "what it means")``).

A value is checked for its type first (a number where a number is expected: never a bool, a
blank, ``nan`` or ``inf``), then for its range (``low``/``high``, ``low_open``: the bound itself
is excluded), then, on the resolved design, for consistency with the other fields
(``dse.spec.validate.CONSISTENCY``).
"""

from __future__ import annotations

from dataclasses import dataclass

from dse.catalog import kernel_keys
from dse.catalog.specs import DTYPES

CATALOG = "from the catalog"        # the default of a field read from a catalog entry

# size limits on anything that allocates or loops per element (named in the errors)
LIMITS = {
    "chips per instance": 65_536,        # tp*pp*dp, num_chips (layout search loops over divisors)
    "scale-up domain chips": 16_384,     # the topology graph has a node per chip (catalog: 9,216)
    "full-mesh domain chips": 512,       # ... and a full mesh an edge per pair of chips
    "values per parameter": 100_000,     # each is checked and kept in memory
    "designs per space": 10**18,         # design ids are 64-bit integers
    "TOML nesting depth": 32,            # tables and arrays in a file (the readers recurse)
}


@dataclass(frozen=True)
class Field:
    path: str
    kind: str                  # "float" | "int" | "bool" | "enum" | "id"
    unit: str = ""
    doc: str = ""
    default: object = CATALOG
    low: float | None = None
    high: float | None = None
    low_open: bool = False     # low itself is not valid (a value must be > low)
    choices: tuple = ()        # enum: the valid values
    blank: str = ""            # what a blank value means, when blank is valid ("" = not valid)
    zero: str = ""             # what 0 means, when 0 is valid for an otherwise positive field
    catalog_absent: bool = False   # the catalog may leave it empty (e.g. a dtype the chip lacks)
    limit: str = ""            # the LIMITS entry that caps it
    resolved: bool = True      # a column of the resolved design (False: input-only, num_chips)

    @property
    def numeric(self) -> bool:
        return self.kind in ("float", "int", "bool")

    @property
    def section(self) -> str:
        return self.path.split(".", 1)[0]

    @property
    def upper(self) -> float | None:
        return LIMITS[self.limit] if self.limit else self.high

    def valid(self) -> str:
        """What a valid value is, in words (the hint of every error on this field)."""
        if self.kind in ("enum", "id"):
            if self.kind == "id":
                return "a catalog id (see `dse catalog list`)"
            text = "one of " + ", ".join(self.choices)
            return text + (f", or blank for {self.blank}" if self.blank else "")
        if self.kind == "bool":
            return "true or false"
        what = "a whole number" if self.kind == "int" else "a finite number"
        lo, hi = self.low, self.upper
        if lo is not None and hi is not None and not self.low_open:
            text = f"{what} in [{_n(lo)}, {_n(hi)}]"
        else:
            parts = []
            if lo is not None:
                parts.append(f"{'>' if self.low_open else '>='} {_n(lo)}")
            if hi is not None:
                parts.append(f"<= {_n(hi)}")
            text = f"{what} " + " and ".join(parts) if parts else what
        if self.limit:
            text += f"; limit: {self.limit}"
        if self.zero:
            text += f"; 0 = {self.zero}"
        return text

    def label(self) -> str:
        """The path with its unit, for tables and plots."""
        return f"{self.path} [{self.unit}]" if self.unit else self.path


def _n(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() and abs(x) < 1e7 else f"{x:g}"


def num(path, unit, doc, default=CATALOG, low=0.0, open_=True, high=None, zero="", **kw) -> Field:
    """A real number, > low (open_) or >= low."""
    return Field(path, "float", unit, doc, default, low, high, open_, zero=zero, **kw)


def count(path, unit, doc, default=CATALOG, low=1, high=None, zero="", **kw) -> Field:
    """A whole number >= low."""
    return Field(path, "int", unit, doc, default, low, high, zero=zero, **kw)


def frac(path, doc, default=CATALOG, open_=False, **kw) -> Field:
    """A fraction in [0, 1] ((0, 1] with open_)."""
    return Field(path, "float", "fraction", doc, default, 0.0, 1.0, open_, **kw)


def enum(path, choices, default, doc, blank="") -> Field:
    return Field(path, "enum", "", doc, default, choices=tuple(choices), blank=blank)


def flag(path, doc, default=CATALOG) -> Field:
    return Field(path, "bool", "", doc, default, 0, 1)


def ident(path, doc, default=CATALOG) -> Field:
    return Field(path, "id", "", doc, default)


_EFF = "end-to-end factor (dse/catalog/efficiency.toml, dse.calibration.fit)"

FIELDS: tuple[Field, ...] = (
    # -- accelerator (dse/catalog/accelerators.toml) --
    ident("accelerator.id", "catalog id of the accelerator"),
    num("accelerator.hbm_capacity_bytes", "bytes", "HBM capacity per chip"),
    num("accelerator.hbm_bw_bytes_per_s", "bytes/s", "HBM bandwidth per chip"),
    *(num(f"accelerator.peak_flops_per_s.{d}", "FLOP/s", f"peak dense {d} FLOP/s per chip",
          catalog_absent=d != "bf16") for d in DTYPES),
    num("accelerator.tdp_w", "W", "thermal design power per chip"),
    num("accelerator.price_usd_per_hour", "USD/h", "rental price per chip-hour"),
    num("accelerator.capex_usd", "USD", "all-in capital cost per chip (system share included)"),
    num("accelerator.all_in_power_w", "W", "all-in power per chip (system share included)"),
    num("accelerator.scaleup_link_bw_bytes_per_s", "bytes/s", "scale-up injection bandwidth per chip"),
    count("accelerator.scaleup_domain_chips", "chips", "chips in the accelerator's scale-up domain",
          limit="scale-up domain chips"),
    num("accelerator.scaleout_link_bw_bytes_per_s", "bytes/s", "scale-out bandwidth per chip"),
    num("accelerator.host_memory_bytes", "bytes", "host memory per chip a KV cache can spill to "
        "(serving.kv_offload = \"host\"; Grace LPDDR or host DRAM; dse/catalog/memory_tiers.toml, "
        "0 where the catalog has no figure)", open_=False, zero="no host tier"),
    num("accelerator.host_link_bw_bytes_per_s", "bytes/s", "per-chip bandwidth to host memory per "
        "direction (NVLink-C2C on Grace systems, PCIe elsewhere)", open_=False, zero="no host tier"),
    num("accelerator.ssd_bytes", "bytes", "local NVMe per chip for KV (serving.kv_offload = "
        "\"ssd\"; the system's data drives shared by its chips: dse/catalog/memory_tiers.toml, 0 "
        "where the catalog has no figure)", open_=False, zero="no NVMe tier"),
    num("accelerator.ssd_bw_bytes_per_s", "bytes/s", "local NVMe read bandwidth per chip (its "
        "share of the drives' sequential read)", open_=False, zero="no NVMe tier"),
    frac("accelerator.efficiency.hbm_fraction", "share of HBM bandwidth reached; " + _EFF,
         open_=True),
    frac("accelerator.efficiency.scaleup_fraction", "share of scale-up bandwidth reached; " + _EFF,
         open_=True),
    frac("accelerator.efficiency.scaleout_fraction", "share of scale-out bandwidth reached; "
         + _EFF, open_=True),
    num("accelerator.efficiency.layer_overhead_s", "s", "fixed time per layer per step; " + _EFF,
        open_=False),
    num("accelerator.efficiency.graph_layer_overhead_s", "s", "fixed time per layer of a "
        "decode-only step, which the runtimes replay as a CUDA graph; " + _EFF, open_=False),
    num("accelerator.efficiency.step_overhead_s", "s", "fixed time per step; " + _EFF, open_=False),
    frac("accelerator.efficiency.network_overlap_fraction",
         "share of network time hidden under compute; " + _EFF),
    # -- topology (dse/catalog/topologies.toml) --
    ident("topology.id", "catalog id of the system topology (blank: the accelerator's default)"),
    count("topology.domain_chips", "chips", "the topology's own scale-up domain (blank in the "
          "catalog: the accelerator's)", catalog_absent=True, limit="scale-up domain chips"),
    count("topology.rack_chips", "chips", "chips per rack", high=10**7),
    num("topology.scaleup_base_latency_s", "s", "scale-up latency of a collective step",
        open_=False),
    num("topology.scaleup_hop_latency_s", "s", "scale-up latency per hop", open_=False),
    num("topology.scaleout_latency_s", "s", "scale-out latency", open_=False),
    num("topology.scaleout_oversubscription", "ratio", "scale-out fabric oversubscription",
        low=1.0, open_=False),
    flag("topology.link_collectives", "the tp group's collectives run on the links themselves "
         "(TPU ICI: rings of DMAs per torus axis), modelled from the topology graph's links "
         "(dse/perf/tp2d.py) instead of the collective kernels fitted on GPUs"),
    count("topology.scaleup.domain_chips", "chips", "chips in the scale-up domain (derived: the "
          "topology's domain, else the accelerator's)", limit="scale-up domain chips"),
    num("topology.scaleup.link_bw_bytes_per_s", "bytes/s",
        "scale-up bandwidth per chip (derived: the accelerator's)"),
    num("topology.scaleout.link_bw_bytes_per_s", "bytes/s", "scale-out bandwidth per chip "
        "(derived: the accelerator's over the fabric's oversubscription)"),
    # -- model (dse/catalog/models.toml, Hugging Face config vocabulary) --
    ident("model.id", "catalog id of the model"),
    enum("model.weight_dtype", DTYPES, "bf16", "weight element type"),
    enum("model.fp8_scaling", ("auto", "tensor", "block"), "auto",
         "how fp8 weights are scaled, which picks the GEMM kernels: per tensor (ModelOpt FP8 "
         "checkpoints of dense models), per 128x128 block (DeepSeek-style fine-grained FP8), or "
         "auto: block for MoE models (their native FP8 checkpoints are block-scaled), else tensor"),
    enum("model.kv_dtype", DTYPES, "", "KV-cache element type",
         blank="fp8 with fp8/fp4 weights, else bf16"),
    count("model.hidden_size", "", "hidden size"),
    count("model.num_hidden_layers", "layers", "transformer layers"),
    count("model.num_attention_heads", "heads", "query heads"),
    count("model.num_key_value_heads", "heads", "KV heads (GQA)"),
    count("model.head_dim", "", "dimension of one head"),
    count("model.intermediate_size", "", "FFN width of the dense layers", low=0,
          zero="no dense FFN (every layer MoE)"),
    count("model.vocab_size", "tokens", "vocabulary size"),
    flag("model.tie_word_embeddings", "input and output embeddings shared"),
    flag("model.mlp_gated", "gated MLP (three matrices, else two)"),
    count("model.num_experts", "experts", "routed experts per MoE layer", low=0, zero="dense"),
    count("model.num_experts_per_tok", "experts", "routed experts per token (top-k)", low=0,
          zero="dense"),
    count("model.moe_intermediate_size", "", "FFN width of one routed expert", low=0, zero="dense"),
    count("model.n_shared_experts", "experts", "shared experts per MoE layer", low=0, zero="none"),
    count("model.shared_expert_intermediate_size", "", "FFN width of one shared expert", low=0,
          zero="no shared expert"),
    count("model.first_k_dense_replace", "layers", "leading dense layers before the MoE layers",
          low=0),
    count("model.moe_layer_step", "layers", "an MoE layer every n-th layer after the dense ones",
          low=0, zero="dense"),
    count("model.q_lora_rank", "", "MLA query low-rank dimension", low=0, zero="no MLA"),
    count("model.kv_lora_rank", "", "MLA latent KV dimension", low=0, zero="no MLA (GQA)"),
    count("model.qk_nope_head_dim", "", "MLA non-rotary query/key head dim", low=0, zero="no MLA"),
    count("model.qk_rope_head_dim", "", "MLA rotary query/key head dim", low=0, zero="no MLA"),
    count("model.v_head_dim", "", "MLA value head dim", low=0, zero="no MLA"),
    count("model.sliding_window", "tokens", "sliding-window length of local layers", low=0,
          zero="none"),
    count("model.num_local_attention_layers", "layers", "layers with sliding-window attention",
          low=0),
    count("model.num_nextn_predict_layers", "layers", "multi-token-prediction modules the "
          "checkpoint ships (DeepSeek-V3: 1); what serving.spec_method = \"mtp\" drafts with",
          low=0, zero="none"),
    enum("model.expert_dtype", DTYPES, "", "element type of the routed experts' weights (NVFP4 "
         "checkpoints ship FP4 experts beside FP8 attention and dense layers)",
         blank="model.weight_dtype"),
    enum("model.attention_dtype", DTYPES, "", "element type of the attention projections' "
         "weights", blank="model.weight_dtype"),
    # -- layout --
    count("layout.num_chips", "chips", "chips of one instance; leave tp/pp/ep/dp out to let dse "
          "choose", default=None, limit="chips per instance", resolved=False),
    count("layout.tp", "chips", "tensor-parallel degree", 1, limit="chips per instance"),
    count("layout.pp", "stages", "pipeline-parallel degree", 1, limit="chips per instance"),
    count("layout.ep", "chips", "expert-parallel degree", 1, limit="chips per instance"),
    count("layout.dp", "chips", "attention data-parallel degree", 1, limit="chips per instance"),
    count("layout.tp_x", "chips", "2D weight-stationary tensor parallelism (Pope et al. 2022, "
          "\"Efficiently Scaling Transformer Inference\", section 3.2.2): the tp group as an X x "
          "(tp / X) mesh of chips, X = this value: every weight matrix split over both axes "
          "(d_model over X, the heads / d_ff over tp / X), each block's input all-gathered and "
          "its output reduce-scattered over tp / X (d_model / X wide), its inner activations "
          "reduce-scattered and all-gathered over X, on each axis's own torus links "
          "(dse/perf/tp2d.py); tp / X must divide the heads. Dense models with dp = 1. "
          "1 = 1D (one all-reduce of every block's output over tp: the runtime's kernels)", 1,
          limit="chips per instance"),
    enum("layout.kv_sharding", ("heads", "batch"), "heads", "how the tp group splits the KV "
         "cache: by KV heads (a chip keeps at least one: fewer KV heads than tp are "
         "replicated), or by sequences (Pope et al. 2022's multiquery layout: each chip holds "
         "every KV head of 1/tp of the sequences and runs their attention; the queries and "
         "attention outputs move by an all-to-all over tp, dse/perf/tp2d.py)"),
    enum("layout.dense_mlp", ("auto", "split", "replicated"), "auto", "dense MLP layers (and "
         "shared experts) of an MoE: split over the tp x dp group, replicated on every "
         "attention-DP rank, or auto: what serving.runtime does (dse/catalog/serving.toml "
         "[runtimes])"),
    *(count(f"layout.prefill_{k}", "chips", f"prefill pool's {k} (disaggregated)", 0, low=0,
            limit="chips per instance", zero="the decode layout's value")
      for k in ("tp", "pp", "ep", "dp")),
    # -- workload --
    count("workload.isl", "tokens", "input tokens per request", 1024),
    count("workload.osl", "tokens", "output tokens per request", 256),
    count("workload.concurrency", "requests", "requests in flight (continuous batching)", 1),
    frac("workload.prefix_hit_fraction", "share of input tokens served from a prefix cache", 0.0),
    count("workload.prefix_tokens", "tokens", "shared prompt prefix (a system prompt) whose KV the "
          "prefix cache keeps once per attention-DP rank instead of per sequence "
          "(dse/perf/kvtier.py; at most workload.isl - 1: the last prompt token is recomputed)",
          0, low=0, zero="no shared prefix"),
    num("workload.cached_conversations", "conversations", "conversations per instance waiting "
        "between turns whose reusable prefix (workload.prefix_hit_fraction x workload.isl "
        "tokens) the prefix cache must keep: in the HBM the running sequences leave free, then "
        "in the serving.kv_offload tier; the hits neither holds are recomputed "
        "(dse/perf/kvtier.py)", 0.0, open_=False,
        zero="the cache always holds the hits (a hit costs nothing)"),
    enum("workload.phase", ("both", "prefill", "decode"), "both",
         "both: prefill and decode on one instance; prefill or decode: a disaggregated instance"),
    count("workload.prefill_concurrency", "requests", "prefill batch (disaggregated)", 1),
    num("workload.demand_output_tokens_per_s", "tokens/s", "fleet demand", 0.0, open_=False,
        zero="no demand (the fleet metrics are NaN)"),
    num("workload.request_rate_per_s", "requests/s", "Poisson request rate into one instance, "
        "instead of workload.concurrency: the concurrency follows from it (Little's law), TTFT "
        "adds the queueing wait (dse/perf/queueing.py). The rate wins: a design, case or space "
        "that also gives workload.concurrency is refused, and a what-if's --set replaces each "
        "design's concurrency with the rate's; refused on a prefill-only or decode-only "
        "instance (workload.phase), whose rate the other pool sets", 0.0, open_=False,
        zero="fixed concurrency (workload.concurrency)"),
    count("workload.num_requests", "requests", "requests a closed-loop benchmark sends in all "
          "(workload.concurrency in flight at any time, all submitted at once at the start): "
          "ttft_s is their mean, the start-up burst included (dse/perf/phases.py)", 0, low=0,
          zero="10 x workload.concurrency, as InferenceX runs its benchmark"),
    num("workload.ttft_slo_s", "s", "p90 TTFT a request must meet: goodput is the highest "
        "request rate at which it and the TPOT SLO hold", 0.0, open_=False, zero="no TTFT SLO"),
    num("workload.tpot_slo_s", "s", "p90 TPOT a request must meet (goodput)", 0.0, open_=False,
        zero="no TPOT SLO"),
    num("workload.isl_cv", "ratio", "coefficient of variation of input lengths (gamma "
        "distributed, mean workload.isl)", 0.0, open_=False, high=10.0,
        zero="every prompt workload.isl tokens"),
    num("workload.osl_cv", "ratio", "coefficient of variation of output lengths (gamma "
        "distributed, mean workload.osl)", 0.0, open_=False, high=10.0,
        zero="every answer workload.osl tokens"),
    # -- serving (dse/catalog/serving.toml) --
    enum("serving.mode", ("aggregated", "disaggregated"), "aggregated",
         "one instance does prefill and decode, or separate prefill and decode pools"),
    enum("serving.runtime", ("trtllm", "sglang", "vllm"), "trtllm",
         "serving runtime: its fitted kernels and collectives (dse/catalog/kernels) and its "
         "defaults (max batch per scheduler, dense MLP layout; dse/catalog/serving.toml)"),
    enum("serving.moe_backend", ("auto", "triton", "flashinfer_trtllm", "flashinfer_cutlass",
                                 "cutlass", "deepgemm", "wideep"), "auto",
         "kernel the runtime runs MoE experts on (SGLang's --moe-runner-backend, vLLM's "
         "FlashInfer/Triton experts, TensorRT-LLM's moe_config.backend WIDEEP): its own fitted "
         "parameters (dse/catalog/kernels/moe.toml, moe_wideep.toml "
         "[<chip>.<runtime>.backend.<name>]); auto = the runtime's mix of kernels as its "
         "benchmarks dispatched them (dse/calibration/kernels/moe.py)"),
    enum("serving.ep_overlap", ("none", "tbo"), "none",
         "two-batch overlap of MoE steps (tbo: two micro-batches, one's expert all-to-all under "
         "the other's compute, as SGLang and DeepEP run it; weights are read twice)"),
    frac("serving.alltoall_overlap_fraction", "share of the EP all-to-all hidden under the "
         "step's other compute (tbo hides all of it)", 0.0),
    enum("serving.a2a_kernel", ("auto", "low_latency", "normal"), "auto",
         "expert-parallel all-to-all kernels: auto = low-latency in decode-only steps and normal "
         "(high-throughput) in steps that carry prompt tokens, as DeepEP runs them"),
    count("serving.spec_tokens", "tokens", "speculative decoding: draft tokens proposed per "
          "sequence per step, verified in one step of spec_tokens + 1 tokens (dse/perf/spec.py)",
          0, low=0, high=64, zero="no speculative decoding"),
    frac("serving.spec_acceptance", "probability that each draft token is accepted (given the "
         "previous ones); blank = the method's published figure (serving.toml [spec_acceptance])"),
    enum("serving.spec_method", ("mtp", "draft"), "mtp", "who drafts: the model's own "
         "multi-token-prediction module (model.num_nextn_predict_layers) or a separate draft "
         "model (serving.spec_draft_model)"),
    Field("serving.spec_draft_model", "id", "", "catalog id of the draft model "
          "(serving.spec_method = \"draft\")", "", blank="no draft model"),
    num("serving.expert_imbalance", "ratio", "routed tokens on the busiest expert-parallel rank "
        "over the mean (dse/perf/imbalance.py); the slowest rank sets the step; blank = the "
        "published routing model 1 + z(ep) cv sqrt(ep / experts), cv = 0.292 fitted on vLLM PR "
        "#50647's measured max/mean 1.069 at EP 16 (dse/catalog/serving.toml [expert_routing]; "
        "DeepSeek-V3: 1.07 at ep 8, 1.37 at ep 72; 1 for ep = 1 and dense models)", low=1.0,
        open_=False, high=64.0, catalog_absent=True, blank="the published routing model"),
    count("serving.redundant_experts", "experts", "extra expert slots per EP group holding "
          "replicas of hot experts (EPLB): they take HBM and cut serving.expert_imbalance", 0,
          low=0, high=4096, zero="none"),
    enum("serving.kv_offload", ("none", "host", "ssd"), "none", "where the prefix cache keeps "
         "what HBM cannot (workload.cached_conversations): nowhere (evicted, its hits "
         "recomputed), host memory or local NVMe, a hit fetched once per request over the tier's "
         "link or recomputed, whichever is cheaper; running sequences' KV stays in HBM "
         "(dse/perf/kvtier.py)"),
    num("serving.prefill_chip_ratio", "ratio", "prefill chips per decode chip (disaggregated)", 0.0,
        open_=False, zero="the ratio that keeps the decodes fed"),
    count("serving.max_batch_size", "sequences", "sequences one scheduler (attention-DP rank) "
          "keeps in flight at most; blank = the runtime's default (serving.toml [runtimes])"),
    count("serving.max_num_tokens", "tokens", "tokens per step (the prefill chunk)"),
    num("serving.request_overhead_s", "s", "front-end time per request in both TTFTs (HTTP, "
        "tokenization, API-server and engine hand-offs, streaming the first token); blank = the "
        "runtime's, fitted end to end (efficiency.toml [runtimes])", open_=False,
        zero="none (an in-process benchmark)"),
    num("serving.seq_overhead_s", "s", "scheduler host time per running sequence per step "
        "(batch bookkeeping, sampling, detokenization) on each attention-DP rank; blank = the "
        "runtime's, fitted end to end (efficiency.toml [runtimes])", open_=False,
        zero="none"),
    num("serving.frontend_prompt_token_s", "s", "the runtime's serial front end's time per "
        "prompt token (tokenizing; one process for all requests, so it queues: "
        "dse/perf/frontend.py); blank = the runtime's, fitted end to end (efficiency.toml "
        "[runtimes])", open_=False, zero="none"),
    num("serving.frontend_token_s", "s", "the runtime's serial front end's time per output token "
        "(detokenizing and streaming; it bounds the TPOT of many streams and queues new "
        "requests: dse/perf/frontend.py); blank = the runtime's, fitted end to end "
        "(efficiency.toml [runtimes])", open_=False, zero="none"),
    num("serving.frontend_text_token_s", "s", "the runtime's serial front end's time per token "
        "of text a streamed chunk repeats (a runtime that streams the whole text so far, as "
        "SGLang by default); blank = the runtime's, fitted end to end (efficiency.toml "
        "[runtimes])", open_=False, zero="none (incremental streaming)"),
    num("serving.frontend_request_s", "s", "the serial front end's time per request, whatever "
        "its lengths (request setup and hand-offs one process does for each request, so it "
        "queues: dse/perf/frontend.py); blank = none, as on the runtimes' own servers (fitted "
        "for the Dynamo front end of aiconfigurator's benchmark rows: efficiency.toml "
        "[front_ends])", open_=False, zero="none"),
    count("serving.frontend_processes", "processes", "front-end processes the instance's "
          "requests are spread over, each a serial server (dse/perf/frontend.py); blank = the "
          "runtime's default (serving.toml [runtimes]: one for TensorRT-LLM and SGLang, one per "
          "data-parallel rank for vLLM)"),
    frac("serving.overlap_schedule", "1: the runtime's scheduler plans step k + 1 while the GPU "
         "runs step k, so a request that arrives during step k joins step k + 2 (SGLang's "
         "overlap loop, TensorRT-LLM's overlap scheduler, vLLM's async scheduling); 0: a "
         "synchronous loop, the request joins step k + 1 (dse/perf/phases.py, ttft); blank = "
         "the runtime's default (serving.toml [runtimes])"),
    count("serving.stream_interval", "tokens", "output tokens per streamed chunk after the "
          "first token, which goes out at once (SGLang --stream-interval, TensorRT-LLM "
          "stream_interval): the serial front end streams each chunk, so its work per answer "
          "falls with it (dse/perf/frontend.py); blank = the runtime's default (serving.toml "
          "[runtimes]: 1, every token)"),
    count("serving.batch_wait_iters", "steps", "steps the scheduler holds a prompt while decodes "
          "run, to batch more prompt tokens (TensorRT-LLM batch_wait_timeout_iters; "
          "dse/perf/phases.py batch_wait_s)", 0.0, low=0, zero="none"),
    frac("serving.batch_wait_tokens_fraction", "share of max_num_tokens the waiting prompts and "
         "running decodes must reach to end a batch wait early (TensorRT-LLM "
         "batch_wait_max_tokens_ratio; 0: no wait)", 0.0),
    frac("serving.kv_memory_fraction", "share of free HBM the KV cache gets", open_=True),
    num("serving.runtime_reserve_bytes", "bytes", "HBM the runtime holds per chip", open_=False),
    # -- cost --
    enum("cost.mode", ("ownership", "rental"), "ownership",
         "ownership: capex written off plus power; rental: the rental price"),
    enum("cost.capex_model", ("catalog", "components"), "catalog",
         "catalog capex and power, or priced by components from the chip's specs"),
    num("cost.amortization_years", "years", "capex write-off period", 4.0),
    num("cost.pue", "ratio", "power usage effectiveness", 1.3, low=1.0, open_=False),
    num("cost.electricity_usd_per_kwh", "USD/kWh", "electricity price", 0.08, open_=False,
        zero="free power"),
    num("cost.scaleup_tier_usd_per_800g", "USD", "capex per chip of a second scale-up switch "
        "tier, per 800 Gb/s of the chip's scale-up bandwidth, paid when the domain is larger "
        "than a rack and than the catalog system's own domain (cost_model.toml "
        "[scaleup_tier], sourced estimate)", open_=False,
        zero="a multi-rack domain costs nothing extra"),
    num("cost.scaleup_tier_w_per_800g", "W", "all-in power per chip of that second tier, per "
        "800 Gb/s (its optics)", open_=False, zero="no extra power"),
)

def _kernel_unit(key: str) -> str:
    for suffix, unit in (("_latency_s", "s"), ("_per_log2_s", "s"), ("_per_seq_s", "s"),
                         ("_kv_head_s", "s"), ("_s", "s"), ("_bytes", "bytes"),
                         ("_rows", "rows"), ("_tokens", "tokens"), ("_elements", "elements")):
        if key.endswith(suffix):
            return unit
    return "ratio"


# fitted per-op kernel parameters (dse/catalog/kernels/*.toml), one field per key; effective
# fractions may exceed 1 where the bytes model overcounts (e.g. deduplicated all-to-all)
FIELDS = FIELDS + tuple(
    num(f"accelerator.kernel.{k}", _kernel_unit(k), "fitted kernel parameter (python -m "
        "dse.calibration.kernels; meaning in dse/perf/kernel_*.py)", low=0.0, open_=False)
    for k in kernel_keys())

REGISTRY: dict[str, Field] = {f.path: f for f in FIELDS}
assert len(REGISTRY) == len(FIELDS), "a path is registered twice"


def field(path: str) -> Field | None:
    return REGISTRY.get(path)


def paths(resolved_only: bool = True) -> list[str]:
    return sorted(p for p, f in REGISTRY.items() if f.resolved or not resolved_only)


def string_paths() -> set[str]:
    return {p for p, f in REGISTRY.items() if not f.numeric}


def defaults() -> dict[str, object]:
    """Fields not read from a catalog entry, with their defaults (catalog-derived: dse.build.designs)."""
    return {p: f.default for p, f in REGISTRY.items() if f.default is not CATALOG and f.resolved}


# The metrics ``dse.perf.score`` returns: a short name and the unit of the value (SI, as stored).
# Every axis, column and table of a page labels a metric from here (``label``); a test checks
# that each of ``dse.perf.METRICS`` has an entry.
METRIC_INFO = {
    "ttft_s": ("TTFT", "s"),
    "ttft_unloaded_s": ("TTFT unloaded", "s"),
    "tpot_s": ("TPOT", "s"),
    "step_s": ("mean step time", "s"),
    "output_tokens_per_s_per_user": ("output speed per user", "tokens/s"),
    "output_tokens_per_s_per_chip": ("output tokens per chip", "tokens/s"),
    "input_tokens_per_s_per_chip": ("input tokens per chip", "tokens/s"),
    "output_tokens_per_s_per_instance": ("output tokens per instance", "tokens/s"),
    "output_tokens_per_s_per_rack": ("output tokens per rack", "tokens/s"),
    "usd_per_chip_hour": ("chip cost", "$/chip-hour"),
    "usd_per_mtok_output": ("output cost", "$/Mtok"),
    "usd_per_mtok_input": ("input cost", "$/Mtok"),
    "joules_per_output_token": ("energy per output token", "J"),
    "max_concurrent_sequences": ("max concurrent sequences", "sequences"),
    "weights_bytes_per_chip": ("weights per chip", "bytes"),
    "kv_bytes_per_chip": ("KV cache per chip", "bytes"),
    "hbm_used_fraction": ("HBM used", "fraction"),
    "kv_bytes_per_token": ("KV cache per token", "bytes"),
    "kv_bytes_per_element": ("KV element size", "bytes"),
    "kv_offloaded_fraction": ("KV offloaded", "fraction"),
    "total_params": ("total parameters", "params"),
    "active_params": ("active parameters", "params"),
    "dense_equivalent_params": ("dense-equivalent parameters", "params"),
    "num_chips": ("chips per instance", "chips"),
    "concurrency": ("concurrency", "sequences"),
    "decode_compute_s": ("decode step compute time", "s"),
    "decode_memory_s": ("decode step memory time", "s"),
    "decode_network_s": ("decode step network time", "s"),
    "instances_per_rack": ("whole instances per rack", "instances"),
    "instances_for_demand": ("instances for the demand", "instances"),
    "racks_for_demand": ("racks for the demand", "racks"),
    "usd_per_hour_for_demand": ("cost of the demand", "$/hour"),
    "bound": ("decode bound", ""),
    "feasible": ("feasible", ""),
    "reason": ("infeasibility reason bits", ""),
    "ttft_queue_wait_s": ("TTFT queue wait", "s"),
    "ttft_p90_s": ("TTFT p90", "s"),
    "ttft_p99_s": ("TTFT p99", "s"),
    "ttft_p90_length_s": ("TTFT of a 90th-percentile-length prompt", "s"),
    "prefix_cache_evicted_fraction": ("share of the prefix cache held nowhere (recomputed)",
                                      "fraction"),
    "tpot_p90_s": ("TPOT p90", "s"),
    "requests_per_s_per_instance": ("requests per instance", "requests/s"),
    "saturation_requests_per_s_per_instance": ("saturation rate per instance", "requests/s"),
    "goodput_requests_per_s_per_chip": ("goodput per chip", "requests/s"),
    "spec_expected_tokens": ("tokens per sequence per step", "tokens"),
}


# the metrics a training space scores (dse.scoring.train_space, dse.spec.train_fields): a short
# name and the unit (labels fall back to METRIC_INFO's for the names both tasks share)
TRAIN_METRIC_INFO = {
    "train_time_s": ("time to train the tokens", "s"),
    "train_cost_usd": ("cost to train the tokens", "USD"),
    "train_energy_j": ("energy to train the tokens", "J"),
    "usd_per_trillion_tokens": ("cost per trillion tokens", "$/Ttok"),
    "chip_hours_per_trillion_tokens": ("chip-hours per trillion tokens", "chip-h/Ttok"),
    "num_chips": ("chips", "chips"),
    "step_time_s": ("step time", "s"),
    "tokens_per_s": ("job throughput", "tokens/s"),
    "tokens_per_s_per_chip": ("tokens per chip", "tokens/s"),
    "model_tflops_per_chip": ("model TFLOP/s per chip", "TFLOP/s"),
    "mfu": ("MFU", "fraction"),
    "hfu": ("HFU", "fraction"),
    "memory_per_chip_bytes": ("peak memory per chip", "bytes"),
    "hbm_used_fraction": ("HBM used", "fraction"),
    "energy_j_per_token": ("energy per token", "J"),
    "compute_s": ("compute per step", "s"),
    "memory_s": ("HBM-bound work per step", "s"),
    "network_exposed_s": ("exposed communication per step", "s"),
    "network_total_s": ("communication per step", "s"),
    "bubble_s": ("pipeline bubble per step", "s"),
    "optimizer_s": ("optimizer step", "s"),
    "overhead_s": ("fixed per-layer time per step (fitted layer_overhead_s)", "s"),
    "train_steps": ("optimizer steps", "steps"),
    "weights_bytes": ("weights per chip", "bytes"),
    "grads_bytes": ("gradients per chip", "bytes"),
    "optimizer_bytes": ("optimizer state per chip", "bytes"),
    "activations_bytes": ("activations per chip", "bytes"),
    "bound": ("step bound", ""),
    "feasible": ("feasible", ""),
    "reason": ("infeasibility reason bits", ""),
}


def metric_unit(metric: str) -> str:
    """The unit of a metric's stored value ("" when it has none or is unknown)."""
    return METRIC_INFO.get(metric, TRAIN_METRIC_INFO.get(metric, ("", "")))[1]


def label(path: str, task: str | None = None) -> str:
    """A column's label with its unit: ``accelerator.hbm_bw_bytes_per_s [bytes/s]``, for a
    scale-factor column ``accelerator.hbm_bw_bytes_per_s.scale [factor]``, and for a metric its
    name and unit, ``TPOT [s]`` (``task = "train"``: a training metric's, where serving has one
    of the same name, ``num_chips``)."""
    if is_scale_column(path):
        return f"{path} [factor]"
    if task == "train" and path in TRAIN_METRIC_INFO:
        name, unit = TRAIN_METRIC_INFO[path]
        return f"{name} [{unit}]" if unit else name
    if path in METRIC_INFO or path in TRAIN_METRIC_INFO:
        name, unit = METRIC_INFO.get(path) or TRAIN_METRIC_INFO[path]
        return f"{name} [{unit}]" if unit else name
    f = REGISTRY.get(path)
    return f.label() if f else path


def objective_label(metric: str, direction: str) -> str:
    """An objective's axis title: its label and which way is better."""
    return f"{label(metric)}, {'lower' if direction == 'minimize' else 'higher'} is better"


# A space parameter given as ``{ scale = [...] }`` holds factors of the base design's value, not
# values in the field's unit: every table (score tables, front.csv, reports, what-ifs, the API's
# frames) names its column ``<path>.scale``. Run folders written before this rule name it
# ``<path>``; readers rename such columns with ``legacy_columns``.
SCALE_SUFFIX = ".scale"


def scale_column(path: str) -> str:
    """The column of a scale-factor parameter of ``path``."""
    return path + SCALE_SUFFIX


def is_scale_column(column: str) -> bool:
    return column.endswith(SCALE_SUFFIX) and column[:-len(SCALE_SUFFIX)] in REGISTRY


def legacy_columns(frame, scaled_paths):
    """``frame`` with the scale-factor columns of an old run folder (named ``<path>``) renamed
    ``<path>.scale``; ``scaled_paths``: the paths the run's space scales."""
    ren = {p: scale_column(p) for p in scaled_paths
           if p in frame.columns and scale_column(p) not in frame.columns}
    return frame.rename(columns=ren) if ren else frame
