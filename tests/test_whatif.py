"""dse whatif: the front re-scored under overrides, and its sensitivities."""

from __future__ import annotations

import pandas as pd
import pytest
from helpers import ROOT

from dse.cli import main

QUICK = ROOT / "spaces" / "quickstart.toml"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("w") / "run"
    assert main(["run", str(QUICK), "--out", str(d), "--quiet"]) == 0
    return d


def test_more_hbm_bandwidth_moves_every_front_design_the_right_way(run, tmp_path, capsys):
    out = tmp_path / "wi"
    assert main(["whatif", str(run), "--scale", "accelerator.hbm_bw_bytes_per_s=1.5",
                 "--out", str(out)]) == 0
    md = (out / "whatif.md").read_text()
    assert "accelerator.hbm_bw_bytes_per_s scale 1.5" in md
    # the page's table has each front design before and after: nothing got slower or costlier
    html = (out / "index.html").read_text()
    assert "tpot_s_before" in html and "data:image/png;base64" in html
    front = pd.read_csv(out / "front.csv")
    assert len(front) > 0 and "design_id" in front
    assert "| accelerator.hbm_bw_bytes_per_s |" in md and "| accelerator.capex_usd |" in md


def test_whatif_numbers_match_a_rescore(run, tmp_path, capsys):
    from dse.space import load_space
    from dse.whatif import _objective_table
    space = load_space(str(QUICK))
    ids = pd.read_csv(run / "front.csv")["design_id"].to_numpy()
    base = _objective_table(space, ids)
    faster = _objective_table(space, ids, {"accelerator.hbm_bw_bytes_per_s": ("scale", 2.0)})
    assert (faster["tpot_s"] <= base["tpot_s"] * (1 + 1e-12)).all()
    assert (faster["output_tokens_per_s_per_rack"] >= base["output_tokens_per_s_per_rack"]
            * (1 - 1e-12)).all()
    same = _objective_table(space, ids, {"accelerator.capex_usd": ("scale", 1.0)})
    pd.testing.assert_frame_equal(same, base)


@pytest.mark.parametrize("args,needle", [
    (["--scale", "accelerator.hbm_bw_bytes_per_sec=1.5"], "did you mean"),
    (["--set", "accelerator.hbm_bw_bytes_per_s"], "is not PATH=VALUE"),
    (["--scale", "accelerator.hbm_bw_bytes_per_s=fast"], "is not a number"),
    (["--scale", "accelerator.hbm_bw_bytes_per_s=-1"], "must be > 0"),
    ([], "nothing to change"),
    (["--reoptimize", "--scale", "accelerator.tdp_w=2"], "not available yet"),
])
def test_bad_whatif_input_exits_2(run, capsys, args, needle):
    assert main(["whatif", str(run), *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1
