"""The per-op error report's summary (``python -m dse.calibration.kernels``), worked by hand."""

import math

import pandas as pd
import pytest

from dse.calibration.kernels.__main__ import summary


def test_summary_median_worst_share_and_pooled_by_hand():
    rep = pd.DataFrame({"op_class": ["moe", "moe", "moe", "gemm"],
                        "error_held_out": [1.1, 1.3, 1.2, 1.05],
                        "shapes_held_out": [100, 300, 0, 10]})
    s = summary(rep).set_index("op_class")
    assert s.loc["moe", "groups"] == 3
    assert s.loc["moe", "median"] == pytest.approx(1.2)
    assert s.loc["moe", "worst"] == pytest.approx(1.3)
    assert s.loc["moe", "share_le_1.15"] == pytest.approx(1 / 3)
    # pooled over every held-out shape: the groups weighted by their shapes (the empty one 0)
    want = math.exp((100 * math.log(1.1) + 300 * math.log(1.3)) / 400)
    assert s.loc["moe", "pooled"] == pytest.approx(want, rel=1e-12)
    assert s.loc["gemm", "pooled"] == pytest.approx(1.05)
