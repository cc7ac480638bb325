"""Frozen specs of accelerators, topologies, models and the parts of a design.

Specs reject unknown keys and impossible values; every catalog entry carries its source.
Numbers are SI with the unit in the name.
"""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

DTYPES = ("bf16", "fp16", "fp8", "fp4", "int8", "int4")
# bytes per element, block scales included (NVFP4: one fp8 scale per 16; int4: per 128-group)
DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5625, "int8": 1.0, "int4": 0.53}
# dtype the matrix units run for weights of each dtype, best first; the first the chip has wins
# (e.g. fp8 weights on an A100 run as weight-only quantization with bf16 math)
COMPUTE_FALLBACK = {
    "bf16": ("bf16",), "fp16": ("fp16", "bf16"), "fp8": ("fp8", "bf16"),
    "fp4": ("fp4", "fp8", "bf16"), "int8": ("int8", "bf16"), "int4": ("bf16",),
}
Dtype = Literal["bf16", "fp16", "fp8", "fp4", "int8", "int4"]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FlopsTable(Frozen):
    """Peak dense FLOP/s per dtype (no 2:4 sparsity). Absent = no native support."""

    bf16: PositiveFloat
    fp16: PositiveFloat | None = None
    fp8: PositiveFloat | None = None
    fp4: PositiveFloat | None = None
    int8: PositiveFloat | None = None
    int4: PositiveFloat | None = None


class Price(Frozen):
    usd_per_hour: PositiveFloat
    capex_usd: PositiveFloat
    all_in_power_w: PositiveFloat
    estimate: bool = True
    source_url: str
    notes: str = ""


class Microbench(Frozen):
    matmul_bf16_flops_per_s: PositiveFloat | None = None
    matmul_fp8_flops_per_s: PositiveFloat | None = None
    source_url: str


class Efficiency(Frozen):
    """Empirical efficiencies; fitted ones say what they were fitted on."""

    hbm_fraction: float = Field(gt=0, le=1)
    scaleup_fraction: float = Field(gt=0, le=1)
    scaleout_fraction: float = Field(gt=0, le=1)
    layer_overhead_s: float = Field(ge=0)
    # a decode-only step replayed as a CUDA graph: its fixed time per layer (None: as every
    # other step's, layer_overhead_s)
    graph_layer_overhead_s: float | None = Field(default=None, ge=0)
    step_overhead_s: float = Field(ge=0)
    network_overlap_fraction: float = Field(default=0.0, ge=0, le=1)
    fitted_on: str = ""


class Accelerator(Frozen):
    id: str
    name: str
    vendor: str
    source_url: str
    hbm_capacity_bytes: PositiveFloat
    hbm_bw_bytes_per_s: PositiveFloat
    tdp_w: PositiveFloat
    tdp_estimate: bool = False
    default_topology: str
    scaleup_link_bw_bytes_per_s: PositiveFloat
    scaleup_domain_chips: PositiveInt
    scaleout_link_bw_bytes_per_s: PositiveFloat
    peak_flops_per_s: FlopsTable
    price: Price
    microbench: Microbench | None = None
    # on-chip last-level (L2) cache; read only when fitting kernel tables (a benchmark that
    # re-runs one call finds a working set smaller than this in the cache), None = unknown
    l2_cache_bytes: PositiveFloat | None = None
    efficiency: Efficiency
    # a variant of another catalog part (the same die, other memory or clocks): the part whose
    # kernel fits (dse/catalog/kernels) and kernel uncertainty this one uses; None: its own
    kernel_base: str | None = None
    sources: tuple[str, ...] = ()
    notes: str = ""


TopologyKind = Literal["switched", "full_mesh", "torus", "pcie_tree"]


class Topology(Frozen):
    """A system graph family; bandwidths come from the accelerator unless overridden."""

    id: str
    name: str
    kind: TopologyKind
    source_url: str
    domain_chips: PositiveInt | None = None          # None: the accelerator's domain
    rack_chips: PositiveInt
    switch_planes: PositiveInt = 1                   # switched: switch chips per domain
    torus_axes: PositiveInt = 3                      # torus: number of axes
    axis_bw_weights: tuple[PositiveFloat, ...] = ()        # torus: relative link bandwidth per axis
    chips_per_switch: PositiveInt = 4                # pcie_tree: GPUs under one PCIe switch
    uplink_bw_fraction: float = Field(default=1.0, gt=0)   # pcie_tree: switch uplink / chip link
    scaleup_base_latency_s: float = Field(ge=0)
    scaleup_hop_latency_s: float = Field(ge=0)
    scaleout_latency_s: float = Field(ge=0)
    # collectives run on the links themselves (TPU ICI: DMA engines, no collective kernels):
    # the tp group's are modelled from the topology graph's links (dse.perf.tp2d), not from the
    # collective kernels fitted on GPUs
    link_collectives: bool = False
    scaleout_oversubscription: float = Field(default=1.0, ge=1)
    sources: tuple[str, ...] = ()
    notes: str = ""


class Model(Frozen):
    """Model architecture in Hugging Face config vocabulary."""

    id: str
    name: str
    source_url: str
    sources: tuple[str, ...] = ()
    notes: str = ""
    hidden_size: PositiveInt
    num_hidden_layers: PositiveInt
    num_attention_heads: PositiveInt
    num_key_value_heads: PositiveInt
    head_dim: PositiveInt
    intermediate_size: int = Field(ge=0)
    vocab_size: PositiveInt
    tie_word_embeddings: bool = False
    mlp_gated: bool = True
    max_position_embeddings: PositiveInt
    total_params: PositiveFloat
    active_params: PositiveFloat
    num_experts: int = Field(default=0, ge=0)
    num_experts_per_tok: int = Field(default=0, ge=0)
    moe_intermediate_size: int = Field(default=0, ge=0)
    n_shared_experts: int = Field(default=0, ge=0)
    shared_expert_intermediate_size: int = Field(default=0, ge=0)
    first_k_dense_replace: int = Field(default=0, ge=0)
    moe_layer_step: int = Field(default=0, ge=0)
    q_lora_rank: int = Field(default=0, ge=0)
    kv_lora_rank: int = Field(default=0, ge=0)
    qk_nope_head_dim: int = Field(default=0, ge=0)
    qk_rope_head_dim: int = Field(default=0, ge=0)
    v_head_dim: int = Field(default=0, ge=0)
    sliding_window: int = Field(default=0, ge=0)
    num_local_attention_layers: int = Field(default=0, ge=0)
    num_nextn_predict_layers: int = Field(default=0, ge=0)   # MTP modules (not in the counts)

    @model_validator(mode="after")
    def _consistent(self):
        if self.num_experts > 0:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise ValueError("num_experts_per_tok must be between 1 and num_experts")
            if self.moe_intermediate_size <= 0:
                raise ValueError("an MoE model needs moe_intermediate_size > 0")
            if self.moe_layer_step <= 0:
                raise ValueError("an MoE model needs moe_layer_step >= 1")
        if self.num_local_attention_layers > self.num_hidden_layers:
            raise ValueError("num_local_attention_layers exceeds num_hidden_layers")
        if self.num_local_attention_layers > 0 and self.sliding_window <= 0:
            raise ValueError("local attention layers need sliding_window > 0")
        if self.num_attention_heads % self.num_key_value_heads and self.kv_lora_rank == 0:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        return self

    @property
    def n_moe_layers(self) -> int:
        if self.num_experts == 0:
            return 0
        return (self.num_hidden_layers - self.first_k_dense_replace) // self.moe_layer_step

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0
