"""A design's values do not depend on the designs scored with it (issue 27, point 6): the
exhaustive strategy's chunk size (``--chunk-designs``) changes which designs share a batch, never
a number. The topology's reduced-graph numbers were computed up to the largest group of the
batch: a pipeline's two-chip hand-off of a tp = 1 design had another latency when a tp = 2
design shared its chunk, and a group between powers of two was interpolated or exact."""

from __future__ import annotations

import numpy as np

from dse.build.space import load_space
from dse.perf import score_chunked

SPACE = """
name = "chunks"
[accelerator]
id = "a100-sxm-80g"
[model]
id = "llama-3.1-70b"
[workload]
isl = 1024
osl = 512
[parameters]
"accelerator.id" = ["a100-sxm-80g", "h100-sxm"]
"layout.tp" = [1, 2, 6, 8]
"layout.pp" = [1, 2]
"workload.concurrency" = [1, 64]
[objectives]
usd_per_mtok_output = "minimize"
tpot_s = "minimize"
"""


def _scores(space, ids):
    distinct, rows, direct, _ = space.batch_parts(np.asarray(ids, np.int64), dtype=np.float32)
    return score_chunked(distinct, dtype=np.float32, rows=rows, direct=direct)


def test_a_designs_values_do_not_depend_on_its_batch(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text(SPACE)
    space = load_space(str(f))
    ids = np.arange(space.size)
    together = _scores(space, ids)
    for chunk in (1, 3, 7):
        parts = [_scores(space, ids[i:i + chunk]) for i in range(0, space.size, chunk)]
        moved = {}
        for m, v in together.items():
            if v.dtype.kind != "f":
                continue
            w = np.concatenate([p[m] for p in parts])
            same = (v == w) | (np.isnan(v) & np.isnan(w))
            if not same.all():
                moved[m] = int((~same).sum())
        print(f"chunks of {chunk}: metrics that moved {moved}")
        assert not moved


def test_request_rate_values_do_not_depend_on_the_batch(tmp_path):
    """At a request rate the concurrency is a root (dse.perf.roots): every row's points depend
    on its own values only, so a design's rate, percentiles and goodput are the same whether it
    is scored alone or with 47 others (the tail's sections once took more points when fewer
    rows were left: 1e-6 apart)."""
    f = tmp_path / "s.toml"
    f.write_text(SPACE.replace("[workload]\n", "[workload]\nrequest_rate_per_s = 0.5\n"
                               "ttft_slo_s = 2.0\ntpot_slo_s = 0.05\n")
                 .replace('"workload.concurrency" = [1, 64]',
                          '"workload.request_rate_per_s" = [0.05, 0.5, 2.0]'))
    space = load_space(str(f))
    ids = np.arange(space.size)
    together = _scores(space, ids)
    assert np.isfinite(together["goodput_requests_per_s_per_chip"]).sum() > space.size // 2
    for chunk in (1, 5):
        parts = [_scores(space, ids[i:i + chunk]) for i in range(0, space.size, chunk)]
        moved = [m for m, v in together.items() if v.dtype.kind == "f" and not (
            (v == (w := np.concatenate([p[m] for p in parts]))) | (np.isnan(v) & np.isnan(w))
        ).all()]
        print(f"rate designs in chunks of {chunk}: metrics that moved {moved}")
        assert not moved
