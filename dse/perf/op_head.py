"""The ends of a step: ``logits`` (embedding lookup, output head and its logits all-gather) and
``pipeline`` (the activation hand-off to the next stage).

Per chip, one pipeline stage, one micro-batch; a multiply-add is 2 FLOPs. The head is
vocab-parallel over tp (the last stage carries it; the model charges it to every stage step).

logits
    FLOPs  2 x vocab / tp x hidden x logits rows / dp (the head GEMM; the lookup is a copy)
    HBM    the head's weights on this chip, once per micro-batch, plus one embedding row
           (hidden x activation bytes) per step token on its dp rank
    net    the all-gather of the logits over tp, once per step: (tp - 1) / tp of logits rows /
           dp x vocab x activation bytes (``forms.allgather_bytes``)
pipeline
    net    every step token's hidden state, split over the stage's tp*dp chips (pp > 1)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dse.perf import arch
from dse.perf.basis import Basis, Load
from dse.perf.batch import Batch
from dse.perf.forms import (
    AllReduces,
    affine,
    allgather_bytes,
    fastest,
    floor1,
    gemm_form,
    per_unit,
    work_field,
)
from dse.perf.network import p2p_coef


@dataclass(frozen=True)
class Head:
    """Embedding lookup and output head (per chip)."""

    dp: np.ndarray
    c: np.ndarray             # compute s = c (logits rows / dp + h) + w  (gemm_form)
    w: np.ndarray
    aff: tuple                # the same as (slope, intercept) in logits rows
    mem_s: np.ndarray         # head_bytes / GEMM HBM rate
    embed_s: np.ndarray       # embed_bytes / HBM rate, per step token
    net: tuple                # the logits all-gather, a per_unit form in rows per dp rank
    net_on: bool              # tp > 1 on some row
    # the work (``work``; left out of ``Coefficients.gather``)
    params: np.ndarray = work_field()        # vocab x hidden (elements)
    tp: np.ndarray = work_field()
    head_bytes: np.ndarray = work_field()    # the head's weights on this chip
    embed_bytes: np.ndarray = work_field()   # an embedding row per step token, per dp rank
    logits_bytes: np.ndarray = work_field()  # the gathered logits per row: vocab x act bytes

    def time(self, s: Load):
        rows = s.logits_rows
        c = self.c * (rows / self.dp + s.h) + self.w if s.tbo_on else affine(self.aff, rows)
        n = fastest(self.net, rows / self.dp) if self.net_on else None
        m = self.mem_s + self.embed_s * s.tok
        if s.tbo_on:
            m = m + self.mem_s * s.tbo
        return c, m, n, None

    def work(self, s: Load):
        rows = s.logits_rows / self.dp
        return (2.0 * self.params / self.tp * rows,
                s.twice(self.head_bytes) + self.embed_bytes * s.tok,
                allgather_bytes(self.tp, rows * self.logits_bytes))


def head_terms(b: Batch, c: Basis, allreduce: AllReduces) -> Head:
    """Embeddings and output head, vocab-parallel over tp. The head gathers its logits over tp
    every step (TensorRT-LLM's lm_head is a ColumnLinear with gather_output=True, in the model
    dtype: NVIDIA/TensorRT-LLM tensorrt_llm/models/llama/model.py): a ring all-gather moves
    (g-1)/g of the buffer, half an all-reduce's 2(g-1)/g (nccl-tests doc/PERFORMANCE.md), on
    NCCL's branches (no custom all-gather); one call per step."""
    tp, dp, d = c.tp, c.dp, c.d
    p_head = b.vocab * d
    ch, wh = gemm_form(b, ((floor1(b.vocab / tp), c.d1),), 1.0, c.inv_eff)
    head_bytes = p_head * c.wb / tp
    embed_bytes = d * c.ab / dp
    h0, h1 = allreduce(tp, b.tp_bw_rel)[:2]
    logits_bytes = b.vocab * c.ab
    return Head(params=p_head, tp=tp, dp=dp, head_bytes=head_bytes, embed_bytes=embed_bytes,
                c=ch, w=wh, aff=(ch / dp, ch * c.h + wh), mem_s=head_bytes / c.g_hbm,
                embed_s=embed_bytes / c.hbm, net=per_unit((h0[:2], h1[:2]), 1.0, 0.5, logits_bytes),
                net_on=c.tp_ar, logits_bytes=logits_bytes)


@dataclass(frozen=True)
class Pipeline:
    """The hand-off of the step's activations to the next stage (per chip)."""

    on: bool                  # pp > 1 on some row
    lat: np.ndarray           # s per step (0 where pp = 1)
    per_token: np.ndarray     # s per step token: its bytes on this chip / link rate
    # the work (``work``; left out of ``Coefficients.gather``)
    has_pp: np.ndarray = work_field()     # 1.0 where pp > 1
    d: np.ndarray = work_field()
    ab: np.ndarray = work_field()
    dp: np.ndarray = work_field()
    tp: np.ndarray = work_field()

    def time(self, s: Load):
        return None, None, (self.lat + self.per_token * s.tok if self.on else None), None

    def work(self, s: Load):
        """Each step token's hidden state, split over the stage's tp*dp chips."""
        return 0.0, 0.0, self.has_pp * self.d * self.ab / self.dp / self.tp * s.tok


def pipeline_terms(b: Batch, c: Basis) -> Pipeline:
    """One point-to-point transfer to the next stage, over scale-out when the instance spans
    more than one scale-up domain."""
    tp, dp, pp = c.tp, c.dp, c.pp
    q0, q1 = p2p_coef(b, tp * dp * pp > b.domain_chips)
    has_pp = arch.flag(pp > 1, pp)
    return Pipeline(on=bool(np.any(pp > 1)), has_pp=has_pp, lat=has_pp * q0,
                    per_token=has_pp * q1 * c.d * c.ab / dp / tp, d=c.d, ab=c.ab, dp=dp, tp=tp)
