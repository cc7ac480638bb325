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

**Default** (``serving.expert_imbalance`` blank: ``published_imbalance``): the experts of a layer
receive routed tokens with a coefficient of variation ``cv`` (dse/catalog/serving.toml
[expert_routing], from a published max/mean measurement); a rank holds ``E / ep`` of them placed
without regard to their load, so its load has CV ``cv / sqrt(E / ep)``, and the busiest of ``ep``
ranks sits ``z(ep)`` (the expected maximum of ep standard normals, Blom) of those above the mean:
``1 + z(ep) cv sqrt(ep / E)``; 1 at ep = 1 and for dense models.
"""

from __future__ import annotations

import numpy as np

from dse.perf import arch
from dse.perf.batch import Batch, as_floating
from dse.perf.lengths import expected_max_normal


def published_imbalance(ep, n_experts, cv) -> np.ndarray:
    """max/mean routed tokens per EP rank of ``ep`` ranks over ``n_experts`` experts whose loads
    have coefficient of variation ``cv``: ``1 + z(ep) cv sqrt(ep / E)`` (1 for dense models)."""
    ep = np.maximum(as_floating(ep), 1.0)
    e = as_floating(n_experts)
    share = np.where(e > 0, ep / np.maximum(e, 1.0), 0.0)
    return 1.0 + expected_max_normal(ep) * cv * np.sqrt(np.minimum(share, 1.0))


def effective(b: Batch) -> np.ndarray:
    """max/mean routed tokens per EP rank after the redundant experts' rebalancing. The
    replicas are every slot beyond one per expert: the ``redundant_experts`` asked for and the
    spare slots when ep does not divide the experts (``arch.expert_slots``)."""
    ep = np.maximum(b.ep, 1.0)
    replicas = np.maximum(arch.expert_slots(b) - b.n_experts, 0.0)
    return 1.0 + (np.maximum(raw(b), 1.0) - 1.0) * ep / (ep + replicas)


def raw(b: Batch) -> np.ndarray:
    """max/mean routed tokens per EP rank before the redundant experts: ``expert_imbalance``
    where a design gives it, else (0: "the published model") the routing model of the row's own
    EP size (a disaggregated prefill pool has its own) and ``expert_load_cv``."""
    imb = b.expert_imbalance
    return np.where(imb > 0, imb, published_imbalance(b.ep, b.n_experts, b.expert_load_cv))


def factor(b: Batch):
    """The busiest rank's routed-token factor, or None when every row is balanced (the step
    model then runs exactly as before)."""
    if not b.has_on("expert_imbalance"):
        return None
    return b.memo("expert_imbalance_effective", lambda: effective(b))
