"""What every op of the step shares: the design's per-chip basis and the step's load.

``Basis`` (once per design): the sharding (tp, dp, pp and the tp*dp group the MLPs split
over), the layers of one pipeline stage, element sizes and the achievable rates of the GEMMs
and of HBM. ``Load`` (once per step): the tokens one stage step of one micro-batch carries and
where they sit (the busiest attention data-parallel rank's rows), plus the step's switches
(two-batch overlap, rows without tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dse.perf import arch
from dse.perf.batch import Batch
from dse.perf.forms import floor1


@dataclass(frozen=True)
class Basis:
    """Per-design quantities the ops' terms share (one pipeline stage, per chip)."""

    tp: np.ndarray
    tp_ar: bool             # tp > 1 on some row (else no tp collective runs)
    dp: np.ndarray
    pp: np.ndarray
    ffn_g: np.ndarray       # tp * dp: the group the MoE (and, split, the dense MLP) runs over
    stage: np.ndarray       # 1 / pp: this stage's share of the layers
    layers: np.ndarray      # n_layers / pp
    d: np.ndarray           # hidden size
    d1: np.ndarray          # hidden size, at least 1 (a GEMM dimension)
    ab: np.ndarray          # bytes per activation element
    wb: np.ndarray          # bytes per weight element
    hbm: np.ndarray         # HBM rate of other traffic (embedding rows), bytes/s
    g_hbm: np.ndarray       # HBM rate of the GEMMs' weight streams, bytes/s
    peak: np.ndarray        # dense matmul FLOP/s of the compute dtype
    inv_eff: np.ndarray     # 2 / (peak * gemm_fraction): seconds per multiply-add
    h: np.ndarray           # gemm_half_rows: the rows a GEMM pads a small batch up by
    mla: np.ndarray         # 1.0 where the model uses multi-head latent attention


def basis(b: Batch) -> Basis:
    tp, dp, pp = b.tp, b.dp, b.pp
    stage = 1.0 / pp
    d = b.hidden
    peak = b.matmul_flops_per_s
    return Basis(
        tp=tp, tp_ar=bool(np.any(tp > 1)), dp=dp, pp=pp, ffn_g=tp * dp, stage=stage,
        layers=b.n_layers * stage, d=d,
        d1=floor1(d), ab=b.act_bytes, wb=b.weight_bytes,
        hbm=b.hbm_bw_bytes_per_s * b.hbm_fraction,
        g_hbm=b.hbm_bw_bytes_per_s * b.gemm_hbm_fraction,
        peak=peak, inv_eff=2.0 / (peak * b.gemm_fraction), h=b.gemm_half_rows,
        mla=arch.is_mla(b))


@dataclass(frozen=True)
class Load:
    """What one stage step of one micro-batch carries (tokens of the whole instance unless
    said otherwise), and the step's switches."""

    dec: np.ndarray          # decode tokens
    pre: np.ndarray          # prefill tokens
    tok: np.ndarray          # dec + pre
    rows: np.ndarray         # the busiest attention-DP rank's tokens: dec / dp + pre_rank
    pre_rank: np.ndarray     # prefill tokens on that rank
    seqs: np.ndarray         # decoding sequences (dec / seq_tokens with speculation)
    logits_rows: np.ndarray  # tokens that run the output head
    new: np.ndarray          # uncached tokens of a prompt (a request's prefill)
    prior: np.ndarray        # its cached tokens
    pairs: np.ndarray        # its causal (query, key) pairs summed over the layers
    new1: np.ndarray | None  # max(new, 1), where the step carries prompt tokens
    reqs: np.ndarray | None  # prompts (or their share) on the busiest rank: pre_rank / new1
    has_pre: bool            # some row carries prompt tokens
    decode_step: bool        # a decode-only step (the low-latency EP kernels under "auto")
    on_dec: np.ndarray | float   # 1.0 where the step decodes (the Python 1.0: every row)
    some: np.ndarray | None  # 1.0 where the step carries tokens (None: on every row)
    tbo: np.ndarray | float  # two_batch_overlap (0 or 1; 0.0: no MoE row)
    two: np.ndarray | float  # 1 + tbo: times each weight is read, each GEMM padded
    tbo_on: bool             # two-batch overlap on some row
    h: np.ndarray            # the GEMM padding rows (twice with two-batch overlap)
    dp: np.ndarray

    def masked(self, v):
        """``v`` where the step carries tokens, 0 elsewhere."""
        return v if self.some is None else v * self.some

    def twice(self, v):
        """``v`` once per micro-batch of the two-batch overlap (once without it)."""
        return v * self.two if self.tbo_on else v


def load(k, dec, pre, new, prior, pairs, logits_rows, pre_rank=None, seq_tokens=None,
         decode_step=False) -> Load:
    """The ``Load`` of a step of ``Coefficients`` ``k`` (``dse.perf.step.step``'s arguments)."""
    # (a decode-only step's prefill tokens are the Python 0.0: its tokens are its decodes)
    tok = dec if type(pre) is float and pre == 0.0 else dec + pre
    # tokens on every row (the usual case): no masking of the per-token terms (the least of
    # them positive: one reduction, no mask array; NaN is not)
    some = None if np.size(tok) == 0 or bool(np.min(tok) > 0) else arch.flag(tok > 0, tok)
    # two-batch overlap (serving.ep_overlap = "tbo"): the step runs as two micro-batches, so
    # every weight is read, every GEMM padded and every kernel launched twice, while one
    # micro-batch's all-to-all runs under the other's compute
    two = 1.0 + k.tbo
    h = k.h * two if k.tbo_on else k.h
    dp = k.dp
    # (a decode-only step has no prefill terms)
    has_pre = bool(np.any(pre)) or (pre_rank is not None and bool(np.any(pre_rank)))
    pre_rank = pre / dp if pre_rank is None else pre_rank
    rows = dec / dp
    new1 = reqs = None
    if has_pre:
        rows = rows + pre_rank                     # the busiest attention rank's rows
        new1 = np.maximum(new, 1.0)
        reqs = pre_rank / new1                     # prompts (or their share) on that rank
    seqs = dec if seq_tokens is None else dec / seq_tokens     # hook: dse.perf.spec
    # (every row decodes, the usual step: no flag array to multiply by)
    on_dec = 1.0 if np.size(dec) == 0 or bool(np.min(dec) > 0) else arch.flag(dec > 0, tok)
    return Load(dec=dec, pre=pre, tok=tok, rows=rows, pre_rank=pre_rank, seqs=seqs,
                logits_rows=logits_rows, new=new, prior=prior, pairs=pairs, new1=new1,
                reqs=reqs, has_pre=has_pre, decode_step=decode_step,
                on_dec=on_dec, some=some, tbo=k.tbo, two=two, tbo_on=k.tbo_on, h=h, dp=dp)
