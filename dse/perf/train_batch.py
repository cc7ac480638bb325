"""The training model's input: one frozen struct-of-arrays, one row per training design.

A design is a model, an accelerator and its system, a parallel layout (tp, pp, dp, ep, cp, vp,
micro-batch, ZeRO stage, recompute, pipeline schedule, sequence parallelism) and a job (global
batch, sequence length, precision). Every numeric field is a float array (or a scalar that
broadcasts); choices are small integer codes into the tuples below. Pure numpy, no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from dse.perf.imbalance import published_imbalance

# precision of the transformer's linear layers (contracts/train-cases.md)
PRECISIONS = ("bf16", "fp16", "fp8", "fp8_block", "mxfp8", "nvfp4")
# the dense peak each precision's MFU is quoted against, and the GEMM kernel fit it runs on
PEAK_DTYPE = ("bf16", "fp16", "fp8", "fp8", "fp8", "fp4")
GEMM_FAMILY = ("bf16", "bf16", "fp8", "fp8_block", "fp8_block", "fp4")
# bytes per GEMM operand element, scales included. fp8_block (DeepSeek-V3, arXiv:2412.19437
# section 3.3.1: activations 1x128 tiles, weights 128x128 blocks, an fp32 scale each): the
# activation operand carries 4 / 128, the weight 4 / 128^2; charged 4 / 128 on both (the larger,
# within 3 % of an fp8 byte). MXFP8 (OCP Microscaling Formats v1.0 section 5: a block of 32
# elements shares one 8-bit E8M0 scale): 1 / 32. NVFP4 (NVIDIA Blackwell: 4-bit E2M1 values, an
# FP8 E4M3 scale per 16): 0.5 + 1 / 16.
OPERAND_BYTES = (2.0, 2.0, 1.0, 1.0 + 4.0 / 128.0, 1.0 + 1.0 / 32.0, 0.5 + 1.0 / 16.0)
# precisions whose GEMMs need a block-scaled MMA in the tensor cores (the scales applied inside
# the MMA: Blackwell's tcgen05.mma kind::mxf8f6f4 / kind::mxf4nvf4, PTX ISA 8.7; CDNA4's scaled
# MFMA); fp8_block rescales in the CUDA cores between WGMMAs on Hopper (DeepSeek-V3 3.3.2), so
# it runs wherever fp8 does. Every catalog part with an fp4 peak has such MMAs and no other
# does (fp4 tensor cores are block-scaled only): the catalog's fp4 peak marks the capability.
BLOCK_SCALED_MMA = (False, False, False, False, True, True)
RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "interleaved", "zero_bubble", "dualpipe")
# which tensor-parallel collectives run under the GEMMs (train_step.tp_exposed_s)
TP_COMM_OVERLAP = ("all", "backward", "none")
# how context parallelism exchanges attention's inputs (Megatron-Core's cp_comm_type;
# train_time.cp_comm_s): ring of K/V sends, Ulysses all-to-all of Q, K, V and O, K/V all-gather
CP_COMM_TYPES = ("p2p", "a2a", "all_gather")
# how the software launches an MoE layer's routed-expert GEMMs (train_time.layer_linears): one
# GEMM per local expert (Transformer Engine's GroupedLinear by default) or one grouped kernel
# per grouped linear layer (fc1, fc2)
MOE_GROUPED_GEMM = ("per_expert", "single")
# the layout and job fields (besides the model, chip and job numbers) the per-layer terms read
# (``train_step.layer_terms``): the designs of one ``layer_code`` share them
LAYER_LAYOUT = ("tp", "micro_batch_seqs", "seq_len", "cp", "ep", "sequence_parallel",
                "moe_router_force_load_balancing", "moe_grouped_gemm")
BOUNDS = ("compute", "memory", "network", "bubble")
REASONS = ("", "does not fit in memory", "no native support for the precision",
           "invalid layout")     # 3: the rules broken are train_layout.layout_bits


class GatheredKernel(Mapping):
    """Kernel parameters (``TrainBatch.kernel``) of designs that take them from a few
    combinations: ``scalars`` {key: value} the same in all, the others rows of ``table``
    (keys x combinations) that ``index`` (each design's combination) gathers on a key's first
    read. The per-layer terms, computed once per ``layer_code``, read most keys at a few
    designs only (``take``: their index, nothing gathered)."""

    def __init__(self, scalars: dict, keys: list, table: np.ndarray, index: np.ndarray):
        self._scalars, self._keys, self._table, self._index = scalars, keys, table, index
        self._row = {k: i for i, k in enumerate(keys)}
        self._gathered: dict = {}

    def __getitem__(self, key):
        if key in self._scalars:
            return self._scalars[key]
        v = self._gathered.get(key)
        if v is None:
            v = self._gathered[key] = np.take(self._table[self._row[key]], self._index)
        return v

    def __iter__(self):
        return iter([*self._scalars, *self._keys])

    def __len__(self) -> int:
        return len(self._scalars) + len(self._keys)

    def take(self, rows) -> GatheredKernel:
        return GatheredKernel(self._scalars, self._keys, self._table, self._index[rows])


@dataclass(frozen=True)
class TrainBatch:
    """Training designs as arrays (one row each). Model fields use Hugging Face names.

    Model: hidden_size, num_layers (transformer layers), moe_layers (of them MoE), heads,
    kv_heads, head_dim (elements), ffn (dense FFN width), mlp_mats (3 gated, 2 not), vocab,
    experts, topk, expert_ffn, shared_ffn (total shared-expert width), q_lora_rank,
    kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim (MLA; 0 = GQA/MHA),
    mtp_layers, tied (1 = tied embeddings).
    Chip: peak_flops_per_s (the dense peak the linear layers run at: the precision's, or the
    best the chip has when it has no native support), precision_native (1/0; MFU is quoted
    against ``peak_flops_per_s`` only where 1), peak_bf16_flops_per_s (attention core), hbm_bw_bytes_per_s, hbm_capacity_bytes, scaleup_bw_bytes_per_s,
    scaleout_bw_bytes_per_s (per chip, per direction), domain_chips (scale-up domain),
    hbm_fraction, usd_per_hour (per chip), all_in_power_w (per chip, facility power); ``kernel``: the fitted kernel parameters by name (``gemm_*`` of the
    precision's family, ``attn_prefill_*``, ``ar_nccl_*``, ``a2a_*``), arrays or scalars.
    Layout: tp, pp, dp, ep, cp, vp, micro_batch_seqs, zero_stage (0-3), recompute (code of
    RECOMPUTE), recompute_layer_fraction (with ``full``: the share of the layers recomputed,
    Megatron's ``--recompute-method block --recompute-num-layers``; 1 = every layer), schedule (code of SCHEDULES), sequence_parallel (0/1).
    Job: global_batch_seqs, seq_len (tokens), precision (code of PRECISIONS).
    Training parameters (dse/catalog/training.toml): compute_fraction_scale, overlap_fraction,
    layer_overhead_s (that of a dense layer's four linear layers: ``train_time.layer_overhead_s``),
    reserve_bytes, fragmentation_fraction, attention_bwd_ratio.
    Attention kernel: attention_fwd_rate, attention_bwd_rate (the job's kernel's forward and
    backward rate over the kernel the attention fits price; training.toml [attention_kernels];
    1 = that kernel); attention_unfused (1: Megatron's unfused core attention, timed by its
    own GEMMs and score passes, ``train_time.unfused_attention_s``).
    Communication overlap (the job's software; Megatron-Core's names): tp_comm_overlap (code of
    TP_COMM_OVERLAP: which tensor-parallel collectives run under the GEMMs), overlap_p2p_comm
    (1/0: the pipeline sends under the micro-batch), overlap_grad_reduce (1/0: the
    data-parallel gradient reduction under the backward); 0 puts that collective on the
    critical path whole. p2p_scatter_gather (1/0): without sequence parallelism, each
    tensor-parallel rank sends only its 1/tp share of the pipeline activations. cp_comm_type
    (code of CP_COMM_TYPES): how context parallelism exchanges attention's inputs.
    moe_grouped_gemm (code of MOE_GROUPED_GEMM): how the routed experts' GEMMs are launched,
    one per local expert or one grouped kernel per fc1 / fc2 (``train_time.layer_linears``).
    expert_load_cv: coefficient of variation of the routed tokens per expert (serving.toml
    [expert_routing]; 0 = balanced routing): the busiest EP rank's load
    (``train_time.expert_imbalance``); moe_router_force_load_balancing (1/0: Megatron-Core's
    switch that routes on random scores): no skew, the load of a cv of 0.
    recompute_norms, recompute_moe_act (1/0): Megatron-Core's selective ``recompute_modules``
    "layernorm" and "moe_act", whose forward passes the backward reruns
    (``train_time.recompute_elementwise_s``).
    sliding_window (tokens; 0 = none), local_layers: the model's sliding-window layers and
    their window (``train_time.attention_core_s``).
    """

    hidden_size: np.ndarray
    num_layers: np.ndarray
    moe_layers: np.ndarray
    heads: np.ndarray
    kv_heads: np.ndarray
    head_dim: np.ndarray
    ffn: np.ndarray
    mlp_mats: np.ndarray
    vocab: np.ndarray
    experts: np.ndarray
    topk: np.ndarray
    expert_ffn: np.ndarray
    shared_ffn: np.ndarray
    q_lora_rank: np.ndarray
    kv_lora_rank: np.ndarray
    qk_nope_head_dim: np.ndarray
    qk_rope_head_dim: np.ndarray
    v_head_dim: np.ndarray
    mtp_layers: np.ndarray
    tied: np.ndarray
    peak_flops_per_s: np.ndarray
    precision_native: np.ndarray
    peak_bf16_flops_per_s: np.ndarray
    hbm_bw_bytes_per_s: np.ndarray
    hbm_capacity_bytes: np.ndarray
    scaleup_bw_bytes_per_s: np.ndarray
    scaleout_bw_bytes_per_s: np.ndarray
    domain_chips: np.ndarray
    hbm_fraction: np.ndarray
    usd_per_hour: np.ndarray
    all_in_power_w: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    ep: np.ndarray
    cp: np.ndarray
    vp: np.ndarray
    micro_batch_seqs: np.ndarray
    zero_stage: np.ndarray
    recompute: np.ndarray
    recompute_layer_fraction: np.ndarray
    schedule: np.ndarray
    sequence_parallel: np.ndarray
    global_batch_seqs: np.ndarray
    seq_len: np.ndarray
    precision: np.ndarray
    compute_fraction_scale: np.ndarray
    overlap_fraction: np.ndarray
    layer_overhead_s: np.ndarray
    reserve_bytes: np.ndarray
    fragmentation_fraction: np.ndarray
    attention_bwd_ratio: np.ndarray
    kernel: dict
    attention_fwd_rate: np.ndarray = 1.0
    attention_bwd_rate: np.ndarray = 1.0
    attention_unfused: np.ndarray = 0.0
    tp_comm_overlap: np.ndarray = 0.0
    overlap_p2p_comm: np.ndarray = 1.0
    overlap_grad_reduce: np.ndarray = 1.0
    p2p_scatter_gather: np.ndarray = 0.0
    cp_comm_type: np.ndarray = 0.0
    moe_grouped_gemm: np.ndarray = 0.0
    expert_load_cv: np.ndarray = 0.0
    moe_router_force_load_balancing: np.ndarray = 0.0
    recompute_norms: np.ndarray = 0.0
    recompute_moe_act: np.ndarray = 0.0
    sliding_window: np.ndarray = 0.0
    local_layers: np.ndarray = 0.0
    # a code per design (ints; None: not known): designs of one code have equal values of every
    # field the per-layer terms read (``train_step.layer_terms``: every field but the layout and
    # job fields outside ``LAYER_LAYOUT``), which are then computed once per code
    layer_code: np.ndarray | None = None

    @classmethod
    def of(cls, **fields) -> TrainBatch:
        """Every field as a float array (``kernel`` values too)."""
        kernel = {k: np.asarray(v, float) for k, v in fields.pop("kernel").items()}
        return cls(kernel=kernel, **{k: np.asarray(v, float) for k, v in fields.items()})

    def replace(self, **fields) -> TrainBatch:
        """The designs with ``fields`` replaced (their ``layer_code`` dropped unless given: a
        replaced field may split a code's designs)."""
        return dataclasses.replace(self, **{"layer_code": None, **{
            k: v if k in ("kernel", "layer_code") else np.asarray(v, float)
            for k, v in fields.items()}})

    def take(self, rows) -> TrainBatch:
        """The designs ``rows`` (scalars stay scalars)."""
        def pick(v):
            return v if np.ndim(v) == 0 else v[rows]
        out = {f.name: pick(getattr(self, f.name)) for f in dataclasses.fields(self)
               if f.name != "kernel"}
        kernel = (self.kernel.take(rows) if isinstance(self.kernel, GatheredKernel) else
                  {k: pick(v) for k, v in self.kernel.items()})
        return TrainBatch(kernel=kernel, **out)

    @cached_property
    def ep_imbalance(self) -> np.ndarray:
        """Routed rows on the busiest EP rank over the mean (``train_time.expert_imbalance``;
        computed once per batch: three MoE terms read it)."""
        return np.where(self.moe_layers > 0,
                        published_imbalance(self.ep, np.maximum(self.experts, 1.0),
                                            self.expert_load_cv
                                            * (1.0 - self.moe_router_force_load_balancing)),
                        1.0)

    @cached_property
    def layer_batch(self) -> tuple[TrainBatch, np.ndarray] | None:
        """(one design of each distinct ``layer_code``, each design's index into them), or
        None (``layer_rows``); taken once per batch: the per-layer terms and the layout rules
        read it."""
        rows = layer_rows(self)
        return None if rows is None else (self.take(rows[0]), rows[1])

    @cached_property
    def operand_bytes(self) -> np.ndarray:
        # (in the precision's dtype: a float32 search chunk stays float32)
        return np.asarray(OPERAND_BYTES, self.precision.dtype)[self.precision.astype(int)]

    @property
    def full_share(self) -> np.ndarray:
        """Share of the layers whose forward is rerun whole (0 unless recompute is full)."""
        return np.where(self.recompute == 2, self.recompute_layer_fraction, 0.0)

    @property
    def micro_batches(self) -> np.ndarray:
        """Micro-batches per step per data-parallel rank: ``B / (dp mb)``."""
        return self.global_batch_seqs / (self.dp * self.micro_batch_seqs)


def layer_rows(b: TrainBatch) -> tuple[np.ndarray, np.ndarray] | None:
    """(one design of each distinct ``layer_code``, each design's index into them), or None:
    no codes, or too many distinct ones to be worth it (more than half the designs)."""
    code = b.layer_code
    if code is None or np.ndim(code) == 0 or len(code) == 0:
        return None
    n = len(code)
    size = int(code.max()) + 1
    if size > 4 * n:
        return None
    at = np.full(size, -1, np.int64)
    at[code] = np.arange(n)            # any design of a code stands for all of them
    present = np.flatnonzero(at >= 0)
    if 2 * len(present) > n:
        return None
    slot = np.empty(size, np.int64)
    slot[present] = np.arange(len(present))
    return at[present], slot[code]


def by_layer_code(b: TrainBatch, fn):
    """``fn(b)`` (an array or a dict of them) of a function that reads only the model, chip and
    job numbers and ``LAYER_LAYOUT``: computed once per distinct ``layer_code`` where the batch
    has them (``TrainBatch.layer_batch``) and gathered back, the same numbers."""
    lb = b.layer_batch
    if lb is None:
        return fn(b)
    sub, inverse = lb

    def back(v):
        return v if np.ndim(v) == 0 else np.take(v, inverse)
    out = fn(sub)
    return {k: back(v) for k, v in out.items()} if isinstance(out, dict) else back(out)
