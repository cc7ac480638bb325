"""The worked questions context-length, ep-domain, pipeline-racks and hardware-value: each space
is answered end to end into a temporary folder, and its numbers have the properties the
question is about, checked against the designs they name, re-scored independently."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dse.build.space import load_space
from dse.perf import OPS, score
from dse.questions.answer import QUESTIONS_DIR
from dse.questions.context import Context

KV = OPS.index("attn_core")


def space_of(name):
    return load_space(str(QUESTIONS_DIR / f"{name}.toml"))


def rescore(name: str, design_id: int, **changes) -> dict:
    """Metrics of one design of the space, with parameter values changed (by path)."""
    space = space_of(name)
    vals = space.values_at(np.array([design_id]))
    for k, v in changes.items():
        vals[k.replace("__", ".")] = np.array([v])
    b, _ = space.batch_from_values(vals)
    return {k: v[0] for k, v in score(b).items()}


def decode_kv_split(space, vals: dict):
    """(KV read, rest of the decode step) of the designs ``vals``, from the scorer directly."""
    b, _ = space.batch_from_values(vals)
    _, steps = score(b.expanded(), breakdown=True)
    kv = steps.decode.memory_s[KV]
    return kv, steps.decode.total_s - kv


def written(out: Path, figures=()):
    for f in ("README.md", "answer.json", "summary.md", "index.html", "front.csv", *figures):
        assert (out / f).is_file(), f
    text = (out / "README.md").read_text()
    assert text.index("## Answer") < text.index("## Method")
    return text


# ------------------------------------------------------------------ 5. context length

def test_context_length(answered):
    out, n = answered("context-length")
    written(out, ["cost-vs-context.png", "op-split-vs-context.png", "crossover-vs-batch.png"])
    best = pd.read_csv(out / "best-per-context.csv")
    cost = best["usd_per_mtok_output"].to_numpy()
    # cost per output token rises with the context, and strictly past the crossover
    assert np.all(np.diff(cost) > 0)
    assert n["output_price_step"] == pytest.approx(
        n["usd_per_mtok_output_long"] / n["usd_per_mtok_output_short"])
    assert n["output_price_step"] > 2 and n["input_price_step"] > 1
    # the named designs have the numbers the answer gives, and meet the SLO
    for tier in ("short", "long"):
        m = rescore("context-length", n[f"{tier}_best_design_id"])
        assert m["usd_per_mtok_output"] == pytest.approx(n[f"usd_per_mtok_output_{tier}"])
        assert m["feasible"] and m["tpot_s"] <= 0.05
    # the TTFT limit's edge: at the space's limit it is the answer's long price, and a looser
    # limit never costs more (it admits every design the tighter one did)
    edge = n["ttft_edge"]
    assert edge[0]["ttft_limit_s"] == pytest.approx(10.0)
    assert edge[0]["usd_per_mtok_output"] == pytest.approx(n["usd_per_mtok_output_long"])
    assert all(e["ttft_s"] <= e["ttft_limit_s"] for e in edge)
    prices = [e["usd_per_mtok_output"] for e in edge]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(prices, prices[1:]))


def test_context_length_crossover_is_where_kv_equals_the_rest(answered):
    _, n = answered("context-length")
    space = space_of("context-length")
    x = n["crossover_isl_at_short_best"]
    vals = space.values_at(np.repeat(n["short_best_design_id"], 3))
    vals["workload.isl"] = np.array([x, 0.8 * x, 1.25 * x])
    kv, rest = decode_kv_split(space, vals)
    assert kv[0] == pytest.approx(rest[0], rel=1e-6)
    assert kv[1] < rest[1] and kv[2] > rest[2]
    # the KV read grows with the batch, so the crossover moves to shorter prompts
    vals = space.values_at(np.repeat(n["short_best_design_id"], 2))
    vals["workload.isl"] = np.array([x, x])
    vals["workload.concurrency"] = vals["workload.concurrency"] * np.array([1, 2])
    kv, rest = decode_kv_split(space, vals)
    assert kv[1] / rest[1] > kv[0] / rest[0]


# ------------------------------------------------------------------ 6. EP inside vs across

def test_ep_domain(answered):
    out, n = answered("ep-domain")
    written(out, ["ep-inside-vs-across.png"])
    assert set(n["domains"]) == {"8", "72", "144", "576"}
    for d, v in n["domains"].items():
        inside, across = v["inside"], v["across"]
        # from one rack up, spanning two domains costs more; two 8-chip domains can cost less
        # than one: 8 chips cannot prefill the batch their decodes want within the 5 s TTFT
        # (closed loop), 16 can (the equal-chip pairs below are the like-for-like comparison)
        if int(d) >= 72:
            assert across["usd_per_mtok_output"] > inside["usd_per_mtok_output"], d
        m = rescore("ep-domain", inside["design_id"])
        assert m["usd_per_mtok_output"] == pytest.approx(inside["usd_per_mtok_output"])
        # several instances per domain: the instance divides the domain
        assert m["num_chips"] == inside["instance_chips"] and m["tpot_s"] <= 0.05
        assert int(d) % inside["instance_chips"] == 0
        assert inside["instances_per_domain"] == int(d) // inside["instance_chips"]
        assert rescore("ep-domain", across["design_id"])["num_chips"] == 2 * int(d)
        # a free second tier never makes a domain dearer
        assert inside["usd_per_mtok_output_tier_free"] <= inside["usd_per_mtok_output"] * (1 + 1e-12)
    # domains beyond the rack pay the tier: the same instance costs more per chip-hour there
    assert n["tier_usd_per_chip"] == pytest.approx(9 * n["tier_usd_per_800g"])
    big, rack = n["domains"]["576"]["inside"], n["domains"]["72"]["inside"]
    if big["instance_chips"] == rack["instance_chips"]:
        assert big["usd_per_mtok_output"] > rack["usd_per_mtok_output"]
    # at equal chips, the same layout and batch is slower across two domains when its expert
    # group spans them, and no faster when each expert group fits in one domain
    pairs = n["equal_chip_pairs"]
    spans = [p for p in pairs if p["ep"] > p["chips"] // 2]
    assert spans and all(p["tpot_across_ms"] > p["tpot_inside_ms"] for p in spans)
    assert all(p["tpot_across_ms"] >= p["tpot_inside_ms"] * (1 - 1e-9) for p in pairs)
    # one front-end process per instance is a subset of the designs: never cheaper
    if "one_frontend_cheapest_inside_usd_per_mtok_output" in n:
        assert n["one_frontend_cheapest_inside_usd_per_mtok_output"] >= \
            n["cheapest_inside_usd_per_mtok_output"] * (1 - 1e-12)


def test_tier_price_to_tie_is_where_two_straight_lines_cross():
    """Single-rack best $1.00; a 144-chip domain costs $0.80 with the tier free and $1.20 at the
    catalog price p: cost = 0.80 + 0.40 p' / p, equal to 1.00 at p' = p / 2. A 576-chip domain
    at $1.10 free never ties."""
    from dse.questions.ep_domain import tier_price_to_tie
    row = lambda d, c: {"topology.scaleup.domain_chips": d, "placement": "inside",  # noqa: E731
                        "usd_per_mtok_output": c}
    at = pd.DataFrame([row(8, 1.3), row(72, 1.0), row(144, 1.2), row(576, 1.5)])
    free = pd.DataFrame([row(8, 1.3), row(72, 1.0), row(144, 0.8), row(576, 1.1)])
    t = tier_price_to_tie(at, free, 72, 8000.0)
    assert t["single_rack_best_domain"] == 72
    assert t["tie_price_usd_per_800g"]["144"] == pytest.approx(4000.0)
    assert t["tie_price_usd_per_800g"]["576"] is None


def test_rack_size(answered):
    out, n = answered("rack-size")
    written(out, ["rack-size.png"])
    assert set(n["models"]) == {"llama-3.1-405b", "deepseek-v3"}
    for m, v in n["models"].items():
        per = {int(k): c for k, c in v["per_domain_usd_per_mtok_output"].items()}
        assert v["best_usd_per_mtok_output"] == pytest.approx(min(per.values()))
        assert per[v["best_domain"]] == pytest.approx(v["best_usd_per_mtok_output"])
        # the tier can only add cost: the tier-free optimum is no dearer
        assert v["best_usd_per_mtok_output_tier_free"] <= v["best_usd_per_mtok_output"] * (1 + 1e-12)
        assert v["best_instance_chips"] <= v["best_domain"] or v["best_domain"] < 72
    # a sparse model gains from a larger domain than a dense one that fits one node
    assert n["models"]["deepseek-v3"]["best_domain"] >= n["models"]["llama-3.1-405b"]["best_domain"]


def test_pipeline_racks_moe_latency_sweep(answered):
    out, n = answered("pipeline-racks-moe")
    written(out, ["pipeline-hop.png"])
    sweep = pd.DataFrame(n["latency_sweep"])
    # a slower hop never makes the best design cheaper, and the largest hop share grows with it
    assert (np.diff(sweep["usd_per_mtok_output"].to_numpy()) >= -1e-12).all()
    assert (np.diff(sweep["max_hop_share_feasible"].to_numpy()) >= -1e-12).all()
    if n["cheapest_pp"] > 1:
        assert 0 < n["latency_for_share_cheapest_s"] < float("inf")
    else:                      # one stage: no hop, no latency at which it reaches the share
        assert n["latency_for_share_cheapest_s"] is None and n["cheapest_hop_share"] == 0.0
        assert n["max_hop_share_feasible"] > 0     # the pipelined designs do hop


def test_ep_across_is_slower_when_scale_out_is_slower():
    space = space_of("ep-domain")
    ctx = Context(space, None, Path("."), {}, pd.DataFrame())
    vals = {"topology.scaleup.domain_chips": np.array([144, 72, 72]),
            "layout.dp": np.array([144] * 3), "layout.ep": np.array([144] * 3),
            "workload.concurrency": np.array([8192] * 3),
            # eight front-end processes (one would stream 8192 answers at a 267 ms TPOT floor)
            "serving.frontend_processes": np.array([8] * 3)}
    df = ctx.score(values=vals)
    inside, across = df.iloc[0], df.iloc[1]
    assert across["tpot_s"] > inside["tpot_s"]
    assert across["decode_network_s"] > inside["decode_network_s"]
    # a scale-out tier as fast as NVLink removes most of the penalty
    fast = ctx.score(values={k: v[2:] for k, v in vals.items()},
                     overrides={"topology.scaleout.link_bw_bytes_per_s": ("set", 900e9)})
    assert fast["tpot_s"].iloc[0] < across["tpot_s"]


# ------------------------------------------------------------------ 7. pipeline across nodes

def test_pipeline_racks(answered):
    from dse.questions.pipeline_racks import hop_times
    out, n = answered("pipeline-racks")
    written(out, ["pipeline-hop.png"])
    assert n["pp1_infeasible"]
    # the worst hop among designs meeting the SLO is no larger than among all feasible ones, and
    # the worst design sits at the slowest link (a fixed latency plus bytes per token)
    assert n["max_hop_share_under_slo"] <= n["max_hop_share_feasible"]
    assert n["worst_bw_bytes_per_s"] == n["slowest_bw_bytes_per_s"]
    assert n["network_bound_designs"] == 0
    assert n["best_cost_increase_at_slowest_bw_pct"] >= 0
    # at the solved bandwidth, the hop is exactly the threshold share of the stage step; more
    # bandwidth makes it smaller
    space = space_of("pipeline-racks")
    ctx = Context(space, None, Path("."), {}, pd.DataFrame())
    bw = n["bw_for_share_worst_bytes_per_s"]
    vals = space.values_at(np.repeat(n["worst_design_id"], 2))
    vals["topology.scaleout.link_bw_bytes_per_s"] = np.array([bw, 4 * bw])
    rows = ctx.score(values=vals)
    share = hop_times(ctx, rows, vals)["hop_share"].to_numpy()
    assert share[0] == pytest.approx(n["hop_share_max"], rel=1e-6)
    assert share[1] < share[0]
    m = rescore("pipeline-racks", n["cheapest_design_id"])
    assert m["usd_per_mtok_output"] == pytest.approx(n["cheapest_usd_per_mtok_output"])


# ------------------------------------------------------------------ 8. hardware upgrades

def test_hardware_value(answered):
    out, n = answered("hardware-value")
    written(out, ["upgrade-value.png"])
    rows = pd.DataFrame(n["rows"])
    # an upgrade at the same price never makes the best design dearer or slower
    assert (rows["cost_change_pct"] <= 1e-9).all()
    assert (rows["throughput_change_pct"] >= -1e-9).all()
    # under a TPOT limit the expert all-to-all sits on the critical path: more scale-up
    # bandwidth buys a cheaper design; without one the cheapest design is compute-bound with its
    # all-to-all hidden under two-batch overlap, and the bandwidth is worth nothing there
    up = rows[rows["upgrade"] == "2x scale-up bandwidth"]
    limited = up["slo"] != "no TPOT limit"
    assert limited.sum() == 2 and (up[limited]["cost_change_pct"] < 0).all()
    free = rows[(rows["slo"] == "no TPOT limit") & (rows["upgrade"] == "baseline")].iloc[0]
    if free["cheapest_bound"] == 0 and "overlap=tbo" in free["cheapest_layout"]:
        assert (up[~limited]["cost_change_pct"] == 0).all()
    for _, r in rows[rows["upgrade"] == "baseline"].iterrows():
        m = rescore("hardware-value", r["cheapest_design_id"])
        assert m["usd_per_mtok_output"] == pytest.approx(r["usd_per_mtok_output"])


def test_more_hbm_bandwidth_never_raises_cost():
    space = space_of("hardware-value")
    ctx = Context(space, None, Path("."), {}, pd.DataFrame())
    ids = np.arange(0, space.size, 7)
    before = ctx.score(ids)
    after = ctx.score(ids, overrides={"accelerator.hbm_bw_bytes_per_s": ("scale", 1.5)})
    ok = before["feasible"].to_numpy()
    assert (after["feasible"].to_numpy() == ok).all()
    assert (after["usd_per_mtok_output"].to_numpy()[ok]
            <= before["usd_per_mtok_output"].to_numpy()[ok] * (1 + 1e-12)).all()


@pytest.mark.parametrize("name", ["context-length", "ep-domain", "rack-size",
                                  "pipeline-racks", "pipeline-racks-moe", "hardware-value"])
def test_first_lines_lead_with_the_headline_number(answered, name):
    from helpers import check_first_lines
    check_first_lines(answered(name)[0])
