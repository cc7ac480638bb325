"""Expert load imbalance and redundant experts: the busiest expert-parallel rank sets the step.

``expert_imbalance`` is the routed tokens on the busiest EP rank over the mean (max/mean, 1 =
perfectly balanced: dse's model before issue 11). The routed experts' per-token work on that
rank (its grouped-GEMM rows, the permute/quantize bytes, the tokens its dispatch and combine
receive) is ``imbalance`` times the mean rank's, and every rank waits for it at the combine.

``redundant_experts`` are extra expert slots per EP group holding replicas of the hottest
experts (DeepSeek's EPLB, https://github.com/deepseek-ai/EPLB; DeepSeek-V3 serves with 32
redundant experts in prefill and 64 redundant/shared-expert GPUs in decode, technical report
section 3.4, https://arxiv.org/abs/2412.19437). They cost HBM (``arch.expert_slots``) and cut
the excess load: the assumption here (not a fit) is that a replica splits one hot expert's
load in two, so ``r`` replicas over ``ep`` ranks leave the excess
``(imbalance - 1) * ep / (ep + r)`` (one replica per rank halves it); the replicas include the
spare slots ep leaves when it does not divide the experts (256 experts on 72 ranks: 32).
"""

from __future__ import annotations

import numpy as np

from dse.perf import arch
from dse.perf.batch import Batch


def effective(b: Batch) -> np.ndarray:
    """max/mean routed tokens per EP rank after the redundant experts' rebalancing. The
    replicas are every slot beyond one per expert: the ``redundant_experts`` asked for and the
    spare slots when ep does not divide the experts (``arch.expert_slots``)."""
    ep = np.maximum(b.ep, 1.0)
    replicas = np.maximum(arch.expert_slots(b) - b.n_experts, 0.0)
    return 1.0 + (np.maximum(b.expert_imbalance, 1.0) - 1.0) * ep / (ep + replicas)


def factor(b: Batch):
    """The busiest rank's routed-token factor, or None when every row is balanced (the step
    model then runs exactly as before)."""
    if not b.has_on("expert_imbalance"):
        return None
    return b.memo("expert_imbalance_effective", lambda: effective(b))
