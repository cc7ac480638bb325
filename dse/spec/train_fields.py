"""The settable fields of a training space (``task = "train"``) and the training metrics.

A training design is what one row of a ``dse predict --train`` case file is
(contracts/train-cases.md): a model, an accelerator and its system, a parallel layout and a
job, plus the tokens to train. Its fields reuse the serving registry's entries where the path
means the same thing (``model.*``, ``accelerator.*`` overrides, ``layout.tp``) and add the
training ones here; ``validate.check_value(..., registry=REGISTRY)`` checks them the same way.
The docs' field reference lists them (``dse.docs``).
"""

from __future__ import annotations

from dse.spec import fields as serving
from dse.spec.fields import count, enum, flag, frac, ident, num

ATTENTION_KERNELS = ("cudnn", "flash3", "flash2", "triton", "unfused")   # = dse.catalog.training
PRECISIONS = ("bf16", "fp16", "fp8", "fp8_block", "mxfp8", "nvfp4")   # = dse.perf.train_batch
RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "interleaved", "zero_bubble", "dualpipe")
TP_COMM_OVERLAP = ("all", "backward", "none")                        # = dse.perf.train_batch
CP_COMM_TYPES = ("p2p", "a2a", "all_gather")                         # = dse.perf.train_batch
MOE_GROUPED_GEMM = ("per_expert", "single")                          # = dse.perf.train_batch
CHIPS = "chips per instance"

# serving fields a training design may set with the same meaning (model shape and MoE shape,
# chip and system numbers: dse.scoring.train_space maps them onto the training model's inputs)
SHARED = (
    "model.hidden_size", "model.num_hidden_layers", "model.num_attention_heads",
    "model.num_key_value_heads", "model.head_dim", "model.intermediate_size",
    "model.vocab_size", "model.num_experts", "model.num_experts_per_tok",
    "model.moe_intermediate_size", "model.n_shared_experts",
    "model.shared_expert_intermediate_size",
    "accelerator.hbm_capacity_bytes", "accelerator.hbm_bw_bytes_per_s",
    "accelerator.peak_flops_per_s.bf16", "accelerator.peak_flops_per_s.fp16",
    "accelerator.peak_flops_per_s.fp8", "accelerator.peak_flops_per_s.fp4",
    "accelerator.scaleup_link_bw_bytes_per_s", "accelerator.scaleout_link_bw_bytes_per_s",
    "accelerator.scaleup_domain_chips", "accelerator.efficiency.hbm_fraction",
    "accelerator.price_usd_per_hour", "accelerator.all_in_power_w",
    "topology.domain_chips", "topology.scaleup.link_bw_bytes_per_s",
    "topology.scaleout.link_bw_bytes_per_s",
)

OWN = (
    ident("model.id", "catalog id of the model (the serving catalog's and dse/catalog/"
          "training.toml's)"),
    ident("accelerator.id", "catalog id of the accelerator (the serving catalog's and "
          "dse/catalog/training.toml's)"),
    serving.Field("topology.id", "id", "", "catalog id of the system topology", "",
                  blank="the accelerator's default system"),
    num("training.tokens", "tokens", "tokens to train (the run's whole budget: train_time_s, "
        "train_cost_usd and train_energy_j are for these)", 1e12),
    count("training.global_batch_seqs", "sequences", "sequences per optimizer step, whole job",
          1024, high=10**9),
    count("training.seq_len", "tokens", "tokens per sequence", 4096, high=10**8),
    enum("training.precision", PRECISIONS, "bf16", "precision of the transformer's linear "
         "layers (contracts/train-cases.md); attention core, norms and communication stay bf16"),
    enum("training.attention_kernel", ATTENTION_KERNELS, "cudnn", "attention kernel of the "
         "job: cudnn (the fused attention Megatron-Core and NeMo run through Transformer Engine, "
         "what the attention fits price), flash3, flash2, triton (llm-foundry's Triton "
         "FlashAttention), unfused (Megatron-LM's core attention before FlashAttention: batched "
         "GEMMs over the full score matrix, softmax and dropout passes); each kernel's rate by "
         "architecture from published benchmarks (dse/catalog/training.toml "
         "[attention_kernels])"),
    enum("training.tp_comm_overlap", TP_COMM_OVERLAP, "all", "which tensor-parallel "
         "collectives run under the layer's GEMMs: all (Megatron-Core with Transformer "
         "Engine's tp_comm_overlap, what NeMo and Megatron-Bridge recipes run), backward (only "
         "the backward's, under the weight- and data-gradient GEMMs: Megatron-LM's "
         "asynchronous tensor-parallel all-reduce of 2022, Megatron-Core without "
         "tp_comm_overlap), none (every one on the critical path: Megatron-LM of 2021)"),
    flag("training.overlap_p2p_comm", "the pipeline sends and receives run under the "
         "micro-batch's compute (Megatron-Core's overlap_p2p_comm); false: each one blocks the "
         "stage, as Megatron-LM's 2021 schedule waited on them", True),
    flag("training.overlap_grad_reduce", "the data-parallel gradient reduction runs under the "
         "backward (Megatron-Core's overlap_grad_reduce, PyTorch DDP's buckets); false: after "
         "the last micro-batch's backward, as Megatron-LM's local DDP ran it before 2023", True),
    flag("training.p2p_scatter_gather", "without sequence parallelism, each tensor-parallel "
         "rank sends only its 1/tp share of the pipeline activations and the receiver "
         "all-gathers them (Megatron-LM's --scatter-gather-tensors-in-pipeline, on from 2021-02 "
         "until Megatron-Core dropped it); false: the whole activation, as Megatron-Core sends "
         "it", False),
    flag("training.recompute_norms", "the backward reruns the layers' norms instead of "
         "keeping their outputs (Megatron-Core's recompute_modules \"layernorm\"): their "
         "elementwise passes once more, at the HBM rate", False),
    flag("training.recompute_moe_act", "the backward reruns the routed experts' activation "
         "instead of keeping its output (Megatron-Core's recompute_modules \"moe_act\"): its "
         "elementwise pass once more, at the HBM rate", False),
    flag("training.moe_router_force_load_balancing", "the MoE router routes on random scores "
         "so that every expert gets the same share of the tokens (Megatron-Core's "
         "moe_router_force_load_balancing, a benchmarking switch): no expert skew, the busiest "
         "expert-parallel rank carries the mean load; false: the skew of learned routing "
         "(serving.toml [expert_routing])", False),
    enum("training.cp_comm_type", CP_COMM_TYPES, "p2p", "how context parallelism exchanges "
         "attention's inputs (Megatron-Core's cp_comm_type): p2p (ring attention: cp - 1 K/V "
         "sends per layer, under the attention core), a2a (DeepSpeed-Ulysses, arXiv:2309.14509: "
         "all-to-alls of Q, K, V in and the output back, blocking; tp x cp must divide the "
         "attention heads and cp the key/value heads per tensor-parallel rank), all_gather (an "
         "all-gather of K and V before the attention, blocking)"),
    enum("training.moe_grouped_gemm", MOE_GROUPED_GEMM, "per_expert", "how the software "
         "launches an MoE layer's routed-expert GEMMs, which sets the fixed time the layer "
         "pays (dse.perf.train_time.layer_linears): per_expert (one GEMM, with its casts, per "
         "local expert: Megatron-Core's TEGroupedMLP on NVIDIA/TransformerEngine v2.9, the "
         "Megatron-Bridge 25.11 pin, whose GroupedLinear runs nvte_multi_tensor_gemm -> "
         "multi_stream_cublas_gemm, a loop over the experts, "
         "transformer_engine/common/gemm/cublaslt_gemm.cu; still TE's default through v2.18), "
         "single (one grouped kernel per grouped fc1 and fc2, as a dense MLP: TE's opt-in "
         "paths, NVTE_USE_CUTLASS_GROUPED_GEMM=1 on Hopper (cublaslt_gemm.cu, v2.9), "
         "NVTE_GROUPED_LINEAR_USE_FUSED_GROUPED_GEMM=1's cuBLASLt grouped GEMM (v2.17 "
         "transformer_engine/pytorch/module/grouped_linear.py, cuBLAS 13.3+), "
         "NVTE_CUTEDSL_FUSED_GROUPED_MLP=1's cuDNN CuTe DSL grouped MLP on Blackwell (v2.14 "
         "transformer_engine/pytorch/ops/fused/forward_grouped_mlp.py))"),
    count("training.mtp_layers", "layers", "multi-token-prediction modules trained with the "
          "model", 0, low=0, high=64, zero="none"),
    count("layout.num_chips", "chips", "chips of the job: dp = num_chips / (tp x pp x cp) "
          "where layout.dp is not given", 0, low=0, limit=CHIPS, zero="tp x pp x cp x dp"),
    count("layout.tp", "chips", "tensor-parallel degree", 1, limit=CHIPS),
    count("layout.pp", "stages", "pipeline-parallel degree", 1, limit=CHIPS),
    count("layout.dp", "chips", "data-parallel degree (blank with layout.num_chips: what is "
          "left)", 1, limit=CHIPS),
    count("layout.cp", "chips", "context-parallel degree (its exchange: training.cp_comm_type; "
          "2 cp must divide training.seq_len)", 1, limit=CHIPS),
    count("layout.ep", "chips", "expert-parallel degree, carved out of tp x cp x dp (1 for a "
          "dense model)", 1, limit=CHIPS),
    count("layout.vp", "stages", "virtual pipeline stages per rank (interleaved schedule only)",
          1, high=64),
    count("layout.micro_batch_seqs", "sequences", "sequences per micro-batch per data-parallel "
          "rank (global_batch_seqs / (dp x micro_batch_seqs) must be whole)", 1, high=4096),
    enum("layout.recompute", RECOMPUTE, "none", "activation recomputation: none, selective "
         "(the core attention) or full (the share layout.recompute_layer_fraction of the "
         "layers)"),
    frac("layout.recompute_layer_fraction", "with recompute = full: the share of the layers "
         "recomputed", 1.0, open_=True),
    count("layout.zero_stage", "", "ZeRO stage: 0 replicated optimizer, 1 optimizer sharded "
          "(Megatron's distributed optimizer), 2 + gradients, 3 + parameters (FSDP)", 1, low=0,
          high=3, zero="replicated optimizer state"),
    enum("layout.pipeline_schedule", SCHEDULES, "1f1b", "pipeline schedule (interleaved needs "
         "layout.vp >= 2, and layout.vp >= 2 needs interleaved)"),
    enum("layout.sequence_parallel", ("auto", "on", "off"), "auto", "activations outside the "
         "tensor-parallel matmuls sharded over tp; auto = on when tp > 1"),
    num("train.compute_fraction_scale", "ratio", "fitted training parameter "
        "(dse/catalog/training.toml [training]); blank = the fit"),
    frac("train.overlap_fraction", "fitted share of a collective hidden under its compute "
         "window (dse/catalog/training.toml [training]); blank = the fit"),
    num("train.layer_overhead_s", "s", "fitted fixed time per layer per micro-batch, that of "
        "a dense layer's four linear layers: a layer pays it per linear layer it runs, over 4 "
        "(an MoE layer's router, shared experts and two per local expert) "
        "(dse/catalog/training.toml [training]); blank = the fit", open_=False),
    num("train.attention_bwd_ratio", "ratio", "fitted backward / forward time of the attention "
        "core (dse/catalog/training.toml [training]); blank = the fit"),
)

FIELDS = OWN + tuple(serving.REGISTRY[p] for p in SHARED)
REGISTRY = {f.path: f for f in FIELDS}
assert len(REGISTRY) == len(FIELDS), "a training path is registered twice"
SECTIONS = ("accelerator", "topology", "model", "layout", "training", "train")

METRIC_INFO = serving.TRAIN_METRIC_INFO
METRICS = tuple(METRIC_INFO)
NUMERIC_METRICS = tuple(m for m in METRICS if m not in ("bound", "feasible", "reason"))
