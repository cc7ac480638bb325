"""Host time of a prompt step run eagerly: the host-side op calls of one forward pass.

A decode-only step replays a captured CUDA graph (``graph_layer_overhead_s``): the host issues
one launch. A step that carries prompt tokens runs eagerly on TensorRT-LLM's PyTorch backend
(graphs only "batches that consist of decoding requests *only*") and on SGLang (prefill/extend
batches outside ``--enable-piecewise-cuda-graph``): the host walks the model's Python forward
and issues every op one by one -- a torch or custom op (a GEMM, its activation quantization, a
norm, a copy, an allocation, a fused MoE call), each paying dispatch and argument handling on
the host. The launches are asynchronous, so the host runs ahead of the GPU until it is the
slower of the two: the step ends no sooner than the host has issued its last op,

    step >= host_ops x eager_op_s            (a floor: max with the GPU's time, not a sum)

``eager_op_s`` (``serving.eager_op_s``) is one fitted host time per op call, the same for
every runtime (dse.calibration.fit). What differs by runtime is how many op calls a block
takes, counted from each runtime's forward code per block type (serving.toml [runtimes.*]
``eager_ops``; the counts and their sources: reports/end-to-end/prefill-ttft.md, twelfth
pass), so a model the calibration never saw inherits the counts of its blocks:

    per layer:  attention (GQA ``eager_ops_gqa`` or MLA ``eager_ops_mla``)
              + the two residual norms (``eager_ops_norm``)
              + the all-reduces where tp > 1 (``eager_ops_allreduce``; 0 where the runtime
                fuses them into the norms)
    dense layer: + ``eager_ops_mlp``;  MoE layer: + ``eager_ops_moe`` (router, top-k, the
                fused expert call and its helpers) + ``eager_ops_shared`` per shared expert
                block (one where the model has shared experts)

vLLM compiles the forward and replays it as piecewise CUDA graphs split at attention
(``compilation_config``): per layer one piece replay and one attention call, nothing else.
"""

from __future__ import annotations

import numpy as np

from dse.perf import arch
from dse.perf.batch import Batch

KEYS = ("eager_ops_gqa", "eager_ops_mla", "eager_ops_norm", "eager_ops_allreduce",
        "eager_ops_mlp", "eager_ops_moe", "eager_ops_shared")


def host_ops(b: Batch, stage: np.ndarray) -> np.ndarray:
    """Host-side op calls of one eager forward of one pipeline stage (``stage`` = 1 / pp)."""
    mla = arch.is_mla(b)
    attn = b.eager_ops_gqa + (b.eager_ops_mla - b.eager_ops_gqa) * mla
    per_layer = attn + b.eager_ops_norm + b.eager_ops_allreduce * arch.flag(b.tp > 1, b.tp)
    moe = b.eager_ops_moe + b.eager_ops_shared * arch.flag(b.n_shared > 0, b.n_shared)
    return (b.n_layers * per_layer + b.n_dense_layers * b.eager_ops_mlp
            + b.n_moe_layers * moe) * stage


def floor_s(b: Batch, stage: np.ndarray) -> np.ndarray:
    """The host's floor under an eager prompt step (seconds)."""
    return host_ops(b, stage) * b.eager_op_s
