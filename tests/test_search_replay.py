"""The in-memory replay the search defaults were chosen with scores the designs a real run does."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import ROOT

from dse.build.space import load_space
from dse.search import store, tables
from dse.search.driver import run_space
from dse.search.optuna import strategy as o
from dse.search.replay import Scored, replay

QUICK = ROOT / "spaces" / "quickstart.toml"


def _scored(d):
    return set(np.concatenate([tables.read_table(f)["design_id"].to_numpy()
                               for f in (d / "scores").glob("batch-*.parquet")]).tolist())


def test_the_replay_scores_the_same_designs_as_a_run_with_the_defaults(tmp_path):
    space = load_space(str(QUICK))
    sc = Scored(space)
    # 24 trials: the short-run default (pairs-covering start, then the additive surrogate)
    d = run_space(space, tmp_path / "run", strategy="optuna", trials=24, seed=1, progress=False)
    real = _scored(d)
    assert len(real) == 24
    assert replay(sc, "random", 1, 1, 24, local=1.0, local_after=8, model="additive",
                  start="pairs") == real
    # (and the random start differs: the start is part of what the replay reproduces)
    assert replay(sc, "random", 1, 1, 24, local=1.0, local_after=8, model="additive") != real
    # TPE at population 4 (the default from 33 trials on), asked for explicitly
    d = run_space(space, tmp_path / "tpe", strategy="optuna", trials=24, seed=1, sampler="tpe",
                  population=4, progress=False)
    real = _scored(d)
    assert replay(sc, "tpe", 4, 1, 24) == real
    # the share is of the exact front: all designs scored give 1, a seed's 24 less
    assert sc.share(range(space.size)) == pytest.approx(1.0, rel=1e-12)
    assert 0.0 < sc.share(real) < 1.0


def test_the_replay_scores_the_same_designs_as_a_polished_default_run(tmp_path):
    """120 trials (more than a short run's): TPE at the default population, then the local
    search of the front on the last POLISH_SHARE of them; the replay (how the share was chosen)
    follows the same path."""
    from dse.search.driver import plan
    space = load_space(str(QUICK))
    sc = Scored(space)
    d = run_space(space, tmp_path / "run", strategy="optuna", trials=120, seed=2, progress=False)
    m = store.load_manifest(d)
    p = plan(space, "optuna", 120, None, None, None, None)
    assert m["sampler"] == "tpe" and m["local_after"] == p["local_after"] < 120
    real = _scored(d)
    assert len(real) == 120
    pop = o.DEFAULT_POPULATION["optuna"]
    assert replay(sc, "tpe", pop, 2, 120, local=1.0, local_after=p["local_after"], adjacent=True,
                  margin=1.0, diagonal=True) == real
    # without the polish the last trials are TPE's: other designs
    assert replay(sc, "tpe", pop, 2, 120) != real
