"""One optimizer step of a training design, composed from the per-micro-batch times
(``train_time``), the pipeline schedule's bubble and the data-parallel collectives.

Per micro-batch on the slowest stage (the last: it adds the logits)::

    t_mb = sum over its L / p layers of  [fwd + bwd GEMMs + attention fwd / fwd rate
                                          + attention fwd x bwd ratio / bwd rate
                                          + elementwise fwd x 3 + MoE chunk sort x 2
                                          + exposed TP/EP collectives]
           + the fitted fixed time, layer_overhead_s per dense layer's four linear layers
             (launches, host gaps; a layer pays it per linear layer it runs, each local expert
             two: ``train_time.layer_overhead_s``; its own part ``overhead_s``, never the
             step's bound)
           + the recompute policy's rerun forward (full: every recomputed layer's; selective:
             the attention core's; the norms' and MoE activation's elementwise passes where
             recompute_norms / recompute_moe_act, train_time.recompute_elementwise_s)
           + the logits' GEMMs and the cross-entropy's pass over them (and each MTP module's
             layer, logits and loss)
           + exposed pipeline sends and context-parallel exchanges

    bubble = (p - 1) t_mb             1F1B: the fraction (p - 1) / (m + p - 1) of the step
           = (p - 1) / v t_mb         interleaved: (p - 1) / (v m + p - 1)
           = (p - 1) / 3 t_mb         zero bubble (ZB-H1, Qi et al. 2023: a third of 1F1B's)
           = (p / 2 - 1) 2 / 3 t_mb   DualPipe
    step   = m t_mb + bubble + exposed data-parallel collectives + optimizer step

DeepSeek-V3 (arXiv:2412.19437) Table 2 gives the bubbles in chunk times: F a forward chunk, B a
*full* backward chunk (input and weight gradients), W its weight-gradient half, F&B two
overlapped forward and backward chunks. With the usual F = W = t_mb / 3, B = 2 t_mb / 3 and
no overlap credit (F&B = F + B = t_mb): 1F1B (PP - 1)(F + B) = (p - 1) t_mb; ZB1P
(PP - 1)(F + B - 2W) = (p - 1) t_mb / 3; DualPipe (PP/2 - 1)(F&B + B - 3W) = (p/2 - 1) 2 t_mb / 3.
DualPipe needs an even pp and at least 2 pp micro-batches, an even number (deepseek-ai/DualPipe
dualpipe/dualpipe.py at 030ce43, ``step``'s asserts; checked as layout rules, ``train_layout``).

A collective that can run under compute is exposed by ``hide(t, window)``: what does not fit in
the window, plus ``1 - overlap_fraction`` of what does. TP collectives hide under the layer's
GEMMs (Megatron-Core's TP communication overlap splits them into chunks pipelined with the
GEMMs; without it, ``overlap_fraction`` of them is what the fit finds hidden); EP all-to-alls
sit on the critical path (exposed whole); ring-attention hops hide under the attention core
(the all-to-all and all-gather context parallelism block it: ``train_time.cp_layer_s``), pipeline
sends under the micro-batch, the gradient reduction (ZeRO 0-1) under the last micro-batch's
backward and the parameter all-gather under the first's forward; ZeRO-2 reduce-scatters the
gradients every micro-batch, under its backward (the gradient shards accumulate reduced:
DeepSpeed's deepspeed/runtime/zero/stage_1_and_2.py registers, with ``partition_gradients``,
``create_reduce_and_remove_grad_hooks``, which reduce each gradient bucket in every backward,
gradient accumulation or not) and all-gathers the updated parameters once a step; ZeRO-3 gathers and
reduces every micro-batch, under that micro-batch. The optimizer step streams 30 bytes per parameter
held (fp32 weight, gradient and two moments read and written, the bf16 copy written).
"""

from __future__ import annotations

import numpy as np

from dse.perf.train_batch import BOUNDS, PRECISIONS, REASONS, TrainBatch, by_layer_code
from dse.perf.train_flops import megatron_flops, recompute_flops
from dse.perf.train_layout import layout_bits
from dse.perf.train_memory import memory_bytes
from dse.perf.train_time import (
    allreduce_time_s,
    attention_core_s,
    cp_layer_s,
    elementwise_s,
    ep_comm_s,
    layer_gemms_s,
    layer_overhead_s,
    loss_s,
    moe_sort_s,
    pp_comm_s,
    recompute_elementwise_s,
    tp_comm_s,
    unfused_attention_s,
)

OPTIMIZER_BYTES_PER_PARAM = 30.0
GRAD_REDUCE_BYTES = 2.0           # bf16 gradients on the wire, bf16 parameters gathered
METRICS = ("step_time_s", "compute_s", "memory_s", "network_exposed_s", "network_total_s",
           "bubble_s", "optimizer_s", "overhead_s", "tokens_per_s_per_chip",
           "model_tflops_per_chip", "mfu", "hfu", "memory_per_chip_bytes",
           "chip_hours_per_trillion_tokens", "usd_per_trillion_tokens", "energy_j_per_token",
           "feasible", "reason", "layout_bits", "bound")


def hide(t_s, window_s, overlap_fraction):
    """Exposed seconds of a collective of ``t_s`` that may run under ``window_s`` of compute."""
    inside = np.minimum(t_s, window_s)
    return t_s - inside + (1.0 - overlap_fraction) * inside


def tp_exposed_s(tp_one, fwd_window_s, bwd_window_s, full, b: TrainBatch) -> np.ndarray:
    """Exposed seconds of one layer's tensor-parallel collectives (``tp_one``: those of one
    forward; the backward has as many, a recomputed forward ``full`` times as many), by the
    job's ``tp_comm_overlap`` (``TP_COMM_OVERLAP``): ``all`` hides every one under the
    layer's GEMMs; ``backward`` only the backward's, under the backward GEMMs (the forward's
    and the recomputed forward's output all-reduces are on the critical path); ``none``
    hides none."""
    tp_all = tp_one * (2.0 + full)
    every = hide(tp_all, fwd_window_s + bwd_window_s, b.overlap_fraction)
    bwd = tp_one * (1.0 + full) + hide(tp_one, bwd_window_s, b.overlap_fraction)
    code = b.tp_comm_overlap
    return np.where(code == 0, every, np.where(code == 1, bwd, tp_all))


def layer_terms(b: TrainBatch) -> dict:
    """One layer's times on one chip that read only the model, chip and job numbers and the
    layout fields ``LAYER_LAYOUT`` (forward and backward GEMMs and attention core, elementwise,
    TP / EP collectives, the MoE sort, the logits, the loss and the fixed time;
    ``micro_batch_parts`` weighs them by the recompute policy and the stage)."""
    g = layer_gemms_s(b)
    moe_share = b.moe_layers / np.maximum(b.num_layers, 1.0)
    mlp_f = moe_share * g["moe_mlp"][0] + (1.0 - moe_share) * g["dense_mlp"][0]
    mlp_b = moe_share * g["moe_mlp"][1] + (1.0 - moe_share) * g["dense_mlp"][1]
    core = attention_core_s(b)
    attn = core / b.attention_fwd_rate
    attn_b = core * b.attention_bwd_ratio / b.attention_bwd_rate
    if np.any(b.attention_unfused > 0):
        uf, ub = unfused_attention_s(b)
        attn = np.where(b.attention_unfused > 0, uf, attn)
        attn_b = np.where(b.attention_unfused > 0, ub, attn_b)
    win_f = g["attn"][0] + mlp_f
    win_b = g["attn"][1] + mlp_b
    return {"moe_share": moe_share, "attn": attn, "attn_both": attn + attn_b,
            "win_f": win_f, "win_b": win_b, "fwd": win_f + attn, "bwd": win_b + attn_b,
            "elem": elementwise_s(b), "tp_one": tp_comm_s(b), "ep": ep_comm_s(b),
            "sort": moe_sort_s(b), "logits": g["logits"][0] + g["logits"][1],
            "loss": loss_s(b), "overhead": layer_overhead_s(b)}


def micro_batch_parts(b: TrainBatch) -> dict:
    """Seconds of one micro-batch on the slowest stage, by part (module docstring)."""
    t = by_layer_code(b, layer_terms)
    moe_share, attn, fwd, bwd = t["moe_share"], t["attn"], t["fwd"], t["bwd"]
    full = b.full_share
    rerun = full * fwd + (b.recompute == 1) * attn
    elem = t["elem"] * (3.0 + full)
    tp_one = t["tp_one"]
    tp_all = tp_one * (2.0 + full)
    tp = tp_exposed_s(tp_one, t["win_f"] * (1.0 + full), t["win_b"], full, b)
    ep = t["ep"] * (2.0 + full) * moe_share
    ring, blocking = cp_layer_s(b)
    cp_all = ring + blocking
    cp = hide(ring, t["attn_both"], b.overlap_fraction) + blocking
    # the last stage also runs the MTP modules: a layer and a logits layer each
    heads_out = (1.0 + b.mtp_layers) * t["logits"]
    stage = b.num_layers / b.pp + b.mtp_layers
    compute = stage * (fwd + bwd + rerun) + heads_out
    sort = t["sort"] * (2.0 + full) * moe_share
    layers = stage * (elem + sort + recompute_elementwise_s(b)) + (1.0 + b.mtp_layers) * t["loss"]
    net = stage * (tp + ep + cp)
    pp_all = pp_comm_s(b)
    pp = hide(pp_all, compute, b.overlap_fraction * b.overlap_p2p_comm)
    return {"compute_s": compute, "memory_s": layers, "overhead_s": stage * t["overhead"],
            "network_exposed_s": net + pp,
            "network_total_s": stage * (tp_all + ep + cp_all) + pp_all,
            "forward_s": stage * fwd, "backward_s": stage * bwd}


def bubble_fraction_of_mb(b: TrainBatch) -> np.ndarray:
    """Idle time of a stage per step in micro-batch times, by schedule (module docstring)."""
    p, v = b.pp, b.vp
    s = b.schedule
    return np.where(s == 1, (p - 1.0) / v,
                    np.where(s == 2, (p - 1.0) / 3.0,
                             np.where(s == 3, np.maximum(p / 2.0 - 1.0, 0.0) * 2.0 / 3.0,
                                      p - 1.0)))


def dp_comm_s(b: TrainBatch, params_per_chip) -> tuple[np.ndarray, np.ndarray]:
    """(seconds per step, seconds per micro-batch) of the data-parallel collectives: ZeRO 0-1 one
    gradient reduction (reduce-scatter + all-gather, an all-reduce's time) per step; ZeRO-2 a
    gradient reduce-scatter (half an all-reduce) per micro-batch and the parameter all-gather
    (the other half) per step; ZeRO-3 two parameter all-gathers and one gradient reduce-scatter
    per micro-batch."""
    group = b.dp * b.cp
    msg = params_per_chip * GRAD_REDUCE_BYTES
    ar = allreduce_time_s(b, msg, group, b.tp)        # = reduce-scatter + all-gather
    z = b.zero_stage
    step = np.where(group > 1, np.where(z >= 3, 0.0, np.where(z == 2, 0.5 * ar, ar)), 0.0)
    per_mb = np.where(group > 1, np.where(z >= 3, 1.5 * ar, np.where(z == 2, 0.5 * ar, 0.0)),
                      0.0)
    return step, per_mb


def first_max(*parts) -> np.ndarray:
    """Index of the largest of ``parts`` per design, the first where tied or NaN (NaN counts
    as the largest): ``np.argmax`` over the stacked parts, without the stack."""
    parts = np.broadcast_arrays(*parts)
    best, index = parts[0], np.zeros(parts[0].shape, np.int64)
    for i, x in enumerate(parts[1:], 1):
        up = (x > best) | (np.isnan(x) & ~np.isnan(best))
        best, index = np.where(up, x, best), np.where(up, i, index)
    return index


def score_train(b: TrainBatch, layout_bits_known=None) -> dict:
    """Every training metric of every design (``METRICS``), arrays of one row per design.
    ``layout_bits_known``: the designs' layout bits where the caller has them already (a
    training space checks them before it scores only the valid layouts)."""
    parts = micro_batch_parts(b)
    mem = memory_bytes(b, flash=1.0 - b.attention_unfused)   # unfused: the score matrix kept
    m = b.micro_batches
    z_step, z_mb = dp_comm_s(b, mem["params_per_chip"])
    mb_compute = parts["compute_s"] + parts["memory_s"] + parts["overhead_s"]
    mb_net = parts["network_exposed_s"] + hide(z_mb, mb_compute, b.overlap_fraction)
    t_mb = mb_compute + mb_net
    bubble = bubble_fraction_of_mb(b) * t_mb
    window = parts["backward_s"] + parts["forward_s"]
    dp_exposed = hide(z_step, window, b.overlap_fraction * b.overlap_grad_reduce)
    dp_share = np.where(b.zero_stage >= 1, b.dp * b.cp, 1.0)
    optimizer = (OPTIMIZER_BYTES_PER_PARAM * mem["params_per_chip"] / dp_share
                 / (b.hbm_bw_bytes_per_s * b.hbm_fraction))
    step = m * t_mb + bubble + dp_exposed + optimizer
    chips = b.tp * b.pp * b.dp * b.cp
    flops = megatron_flops(b)
    peak = np.where(b.precision_native > 0, b.peak_flops_per_s, np.nan)
    out = {"step_time_s": step, "compute_s": m * parts["compute_s"],
           "memory_s": m * parts["memory_s"] + optimizer,
           "overhead_s": m * parts["overhead_s"],
           "network_exposed_s": m * mb_net + dp_exposed,
           "network_total_s": m * (parts["network_total_s"] + z_mb) + z_step,
           "bubble_s": bubble, "optimizer_s": optimizer,
           "tokens_per_s_per_chip": b.global_batch_seqs * b.seq_len / step / chips,
           "model_tflops_per_chip": flops / step / chips / 1e12}
    out["chip_hours_per_trillion_tokens"] = 1e12 / out["tokens_per_s_per_chip"] / 3600.0
    out["usd_per_trillion_tokens"] = out["chip_hours_per_trillion_tokens"] * b.usd_per_hour
    out["energy_j_per_token"] = b.all_in_power_w / out["tokens_per_s_per_chip"]
    out["mfu"] = flops / step / chips / peak
    out["hfu"] = (flops + recompute_flops(b, flops)) / step / chips / peak
    out.update(mem)
    fits = mem["memory_per_chip_bytes"] <= b.hbm_capacity_bytes
    native = b.precision_native > 0
    bits = layout_bits(b) if layout_bits_known is None else layout_bits_known
    valid = bits == 0
    out["feasible"] = fits & native & valid
    out["reason"] = np.where(~valid, 3, np.where(~native, 2, np.where(~fits, 1, 0)))
    out["layout_bits"] = bits
    out["bound"] = first_max(out["compute_s"], out["memory_s"], out["network_exposed_s"], bubble)
    return out


__all__ = ["BOUNDS", "METRICS", "PRECISIONS", "REASONS", "score_train"]
