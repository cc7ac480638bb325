"""The layout rules of a training design: the parallel layouts the training model cannot take,
as reason bits (``LAYOUT_REASONS``), one int per design. Both ``dse predict --train`` (a row with
an invalid layout is infeasible, its reason says which rule) and a training space (its designs'
``reason`` bits) use these. Pure numpy, no I/O.

The rules and their sources:

- tp divides the attention heads (Megatron-Core splits heads over tensor-parallel ranks).
- ep divides the experts and the ``tp x cp x dp`` group it is carved from; 1 on a dense model
  (contracts/train-cases.md).
- pp x vp <= the layers: every (virtual) pipeline stage holds at least one layer. Megatron-LM
  splits the layers evenly when it can; an uneven split is a setting
  (``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``, Megatron-Core
  ``TransformerConfig.num_layers_in_first/last_pipeline_stage``, or
  ``pipeline_model_parallel_layout``), which Megatron-Bridge's Llama-3.1-405B (126 layers) and
  DeepSeek-V3 (61 layers) recipes use; so divisibility is not a rule here, one layer a chunk is.
  The step times the slowest stage as ``L / p`` layers (train_step).
- the micro-batches are whole: ``global_batch_seqs / (dp x micro_batch_seqs)``.
- 2 cp divides seq_len: the load-balanced causal split gives each context-parallel rank two
  halves of the sequence (Megatron-Core / Transformer Engine context parallelism).
- vp >= 2 needs pp >= 2 and the interleaved schedule, and the interleaved schedule vp >= 2.
- DualPipe needs an even pp and an even number of micro-batches, at least 2 pp
  (deepseek-ai/DualPipe dualpipe/dualpipe.py at 030ce43, ``DualPipe.step``: ``num_ranks % 2 ==
  0``, ``num_chunks % 2 == 0 and num_chunks >= num_ranks * 2``).
- dp is whole: num_chips a multiple of tp x pp x cp (a training space's layout.num_chips).
- a2a (Ulysses) context parallelism: tp x cp divides the attention heads and cp the key/value
  heads per tensor-parallel rank (Transformer Engine's AttnFuncWithCPAndQKVOA2A asserts both).
"""

from __future__ import annotations

import numpy as np

from dse.perf.train_batch import TrainBatch, by_layer_code

# bit -> why (bits 8 and 512, memory and precision, are the scorers'; train_space.REASONS)
LAYOUT_REASONS = {
    1: "tp does not divide num_attention_heads",
    2: "ep must divide num_experts and tp x cp x dp, and be 1 for a dense model",
    4: "pp exceeds num_hidden_layers",
    1024: "global_batch_seqs is not a whole number of micro-batches per data-parallel rank",
    2048: "2 x cp does not divide seq_len (load-balanced ring attention)",
    4096: "vp >= 2 needs pp >= 2 and the interleaved schedule, which needs vp >= 2",
    8192: "layout.num_chips is not a whole multiple of tp x pp x cp",
    16384: "pp x vp exceeds num_hidden_layers (every virtual pipeline stage needs a layer)",
    32768: "dualpipe needs an even pp and an even number of micro-batches, at least 2 x pp",
    65536: "a2a context parallelism needs tp x cp to divide the attention heads and cp the "
           "key/value heads per tensor-parallel rank",
}


def a2a_splits(heads, kv_heads, kv_lora_rank, tp, cp):
    """Whether Ulysses (``cp_comm_type`` a2a) can split the heads over ``cp`` ranks: each takes
    ``1 / cp`` of a tensor-parallel rank's query and key/value heads (Transformer Engine's
    AttnFuncWithCPAndQKVOA2A asserts both divide; MLA's key/value heads are its query heads).
    Elementwise: scalars or arrays."""
    kvh = np.where(np.asarray(kv_lora_rank) > 0, heads, kv_heads)
    return (np.fmod(heads, tp * cp) == 0) & (np.fmod(np.maximum(kvh / tp, 1.0), cp) == 0)


def bad_a2a(b: TrainBatch) -> np.ndarray:
    """Where a design runs a2a context parallelism whose heads do not split (``a2a_splits``)."""
    if not np.any(b.cp_comm_type == 1):
        return np.zeros((), bool)
    return ((b.cp_comm_type == 1) & (b.cp > 1)
            & ~a2a_splits(b.heads, b.kv_heads, b.kv_lora_rank, b.tp, b.cp))


def _code_rules(b: TrainBatch) -> dict:
    """The rules (broken where True) that read only the model and ``LAYER_LAYOUT``: tp divides
    the heads, ep the experts, 2 cp the sequence (computed once per layer code)."""
    return {"heads": np.fmod(b.heads, b.tp) != 0, "experts": np.fmod(b.experts, b.ep) != 0,
            "seq": np.fmod(b.seq_len, 2.0 * b.cp) != 0}


def layout_bits(b: TrainBatch, whole_dp=None) -> np.ndarray:
    """The reason bits (``LAYOUT_REASONS``) of each design's layout; 0 = valid. ``whole_dp``:
    where dp is a whole number (None: from ``b.dp``)."""
    tp, pp, dp, cp, ep, vp = b.tp, b.pp, b.dp, b.cp, b.ep, b.vp
    whole_dp = np.fmod(dp, 1.0) == 0 if whole_dp is None else np.asarray(whole_dp, bool)
    rules = by_layer_code(b, _code_rules)
    moe = b.experts > 0
    bad_ep = np.where(moe, rules["experts"] | (np.fmod(tp * cp * dp, ep) != 0), ep != 1)
    inter = b.schedule == 1
    bad_vp = ((vp > 1) & ((pp < 2) | ~inter)) | (inter & (vp < 2))
    m = b.global_batch_seqs / (dp * b.micro_batch_seqs)
    dual = b.schedule == 3
    bad_dual = (dual & ((np.fmod(pp, 2.0) != 0) | (np.fmod(m, 2.0) != 0) | (m < 2.0 * pp))
                if np.any(dual) else False)
    bits = (rules["heads"] * 1 + bad_ep * 2 + (pp > b.num_layers) * 4
            + (np.fmod(b.global_batch_seqs, dp * b.micro_batch_seqs) != 0) * 1024
            + rules["seq"] * (cp > 1) * 2048 + bad_vp * 4096
            + ~whole_dp * 8192 + (pp * vp > b.num_layers) * (pp <= b.num_layers) * 16384
            + bad_dual * 32768 + bad_a2a(b) * 65536)
    return np.asarray(bits, np.int64)


def layout_text(bits: int) -> str:
    """The rules a design's layout bits break, in words."""
    return "; ".join(t for k, t in LAYOUT_REASONS.items() if int(bits) & k)
