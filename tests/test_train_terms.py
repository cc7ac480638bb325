"""Training-model terms added for accuracy (issue 25, point 3), hand-worked on the small
designs of test_train_physics (pure roofline: an HBM-bound pass at the bandwidth): the
cross-entropy's pass over the logits and the MoE dispatcher's permutation passes."""

from __future__ import annotations

import pytest
from test_train_physics import HBM, MOE, batch

from dse.perf.train_step import score_train
from dse.perf.train_time import elementwise_s, loss_s, moe_sort_s


def test_loss_reads_and_writes_16_bytes_per_logit():
    # 2048 tokens x 32000 vocabulary x 16 bytes (bf16 read, fp32 softmax written and read
    # back, bf16 gradient written) at 2 TB/s
    assert float(loss_s(batch())) == pytest.approx(2048 * 32000 * 16 / HBM, rel=1e-12)
    assert float(loss_s(batch())) == pytest.approx(5.2429e-4, rel=1e-4)
    # the vocabulary is split over tp; context parallelism splits the tokens
    assert float(loss_s(batch(tp=4))) == pytest.approx(2048 * 8000 * 16 / HBM, rel=1e-12)
    assert float(loss_s(batch(cp=2))) == pytest.approx(1024 * 32000 * 16 / HBM, rel=1e-12)


def test_loss_runs_once_per_micro_batch_and_per_mtp_module():
    b = batch(global_batch_seqs=4)
    s0, s1 = score_train(b), score_train(b.replace(mtp_layers=1))
    one = float(loss_s(b))
    extra_layer = 3 * float(elementwise_s(b))            # the MTP module's own layer
    per_step = (s1["memory_s"] - s1["optimizer_s"]) - (s0["memory_s"] - s0["optimizer_s"])
    assert float(per_step) == pytest.approx(4 * (one + extra_layer), rel=1e-9)


def test_moe_permutation_passes_move_each_routed_row_two_or_four_times():
    # ep 4 over 8 experts: 2 local experts; 2048 tokens x top-2 = 4096 routed rows, each
    # read and written (2 x 2 bytes) by the permute, the chunk sort after the dispatch, the
    # sort back before the combine and the unpermute: 4 passes x 2 x 2 x 1024 bytes a row
    b = batch(MOE, dp=4, ep=4, global_batch_seqs=8)
    assert float(moe_sort_s(b)) == pytest.approx(4096 * 4 * 2 * 2 * 1024 / HBM, rel=1e-12)
    assert float(moe_sort_s(b)) == pytest.approx(3.3554e-5, rel=1e-4)
    # one local expert (ep 8) or no expert parallelism: no chunk sort, permute and unpermute
    # only (2 passes)
    assert float(moe_sort_s(b.replace(ep=8, dp=8))) == pytest.approx(
        4096 * 2 * 2 * 2 * 1024 / HBM, rel=1e-12)
    assert float(moe_sort_s(batch(MOE))) == pytest.approx(4096 * 2 * 2 * 2 * 1024 / HBM,
                                                          rel=1e-12)
    # a dense model: none
    assert float(moe_sort_s(batch())) == 0.0


def test_moe_chunk_sort_paced_by_the_busiest_rank():
    """With a routing skew (expert_load_cv) the busiest of the ep ranks receives
    1 + z(ep) cv sqrt(ep / E) times the mean rows: its two chunk-sort passes grow by that factor,
    the sender's permute and unpermute do not. ep 4 over 8 experts, cv 0.3:
    z(4) = Phi^-1(3.625 / 4.25) = 1.0491 (Blom), imbalance 1 + 1.0491 x 0.3 x sqrt(1/2) =
    1.2226."""
    b = batch(MOE, dp=4, ep=4, global_batch_seqs=8, expert_load_cv=0.3)
    imb = float(b.ep_imbalance)
    assert imb == pytest.approx(1.2226, rel=1e-4)
    assert float(moe_sort_s(b)) == pytest.approx(4096 * (2 + 2 * imb) * 2 * 2 * 1024 / HBM,
                                                 rel=1e-9)


def test_moe_chunk_sort_in_the_step_forward_and_backward():
    """Memory time per micro-batch = layers x (3 x elementwise + 2 x permutation passes) +
    the loss."""
    b = batch(MOE, dp=4, ep=4, global_batch_seqs=4)          # one micro-batch
    s = score_train(b)
    layer = 3 * float(elementwise_s(b)) + 2 * float(moe_sort_s(b))
    assert float(s["memory_s"] - s["optimizer_s"]) == pytest.approx(
        8 * layer + float(loss_s(b)), rel=1e-9)
