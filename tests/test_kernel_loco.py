"""Leave-one-chip-out takes its donors from other chips' own fits only (common.loco_donors):
never a transferred catalog entry (which may have been derived from the chip left out), never
the chip itself under another runtime, never an entry with terms taken from the chip."""

import pandas as pd
import pytest

from dse.calibration.kernels import common


def test_loco_donors_rule():
    entries = {"x": 1, "y": 2, "t": 3, "d": 4}
    got = common.loco_donors(entries, "x", own={"x", "y", "d"}, derived_from={"d": {"x"}})
    assert got == {"y": 2}                   # x itself, transferred t, d derived from x: out
    assert common.loco_donors(entries, "y", own={"x", "y", "d"},
                              derived_from={"d": {"x"}}) == {"x": 1, "d": 4}
    keyed = {("x", "trtllm"): 1, ("x", "sglang"): 2, ("y", "sglang"): 3}
    # every runtime of the chip left out is unseen
    assert common.loco_donors(keyed, "x", own=keyed) == {("y", "sglang"): 3}


def _frame(chips, n=30):
    rows = [dict(chip=c, runtime="trtllm", dtype="bf16", held_out=(i % 5 == 0), i=i)
            for c in chips for i in range(n)]
    return pd.DataFrame(rows)


def test_attention_loco_ignores_transferred_entries(monkeypatch):
    """A transferred catalog entry (h200-nvl: no table) holding exactly h100-sxm's parameters
    would pull h100-sxm's LOCO towards exact; its donors must be the measured chips only."""
    from dse.calibration.kernels import attention
    from dse.catalog import accelerators
    accs = accelerators()
    op = "attn_prefill"
    names = [p.name for p in attention.PARAMS[op]]
    x = {n: p.x0 for n, p in zip(names, attention.PARAMS[op])}
    far = {n: min(v * 1.5, p.hi) for (n, v), p in zip(x.items(), attention.PARAMS[op])}
    measured = ["h100-sxm", "h200-sxm", "b200"]
    values = {(op, c, "trtllm", "bf16"): (x if c == "h100-sxm" else far) for c in measured}
    values[(op, "h200-nvl", "trtllm", "bf16")] = x          # transferred, derived from h100
    monkeypatch.setattr(attention, "_report_row",
                        lambda op, chip, rt, dt, g, vals, accs, suffix="": dict(chip=chip,
                                                                                vals=vals))
    rows = attention.loco_rows({op: _frame(measured)}, values, accs)
    h100 = [r for r in rows if r["chip"] == "h100-sxm"]
    assert len(h100) == 1 and "h200-nvl" not in {r["chip"] for r in rows}
    want, near, _ = common.transfer("h100-sxm", {c: far for c in ("h200-sxm", "b200")},
                                    attention.PARAMS[op], accs)
    assert near == ["h200-sxm", "b200"] or sorted(near) == ["b200", "h200-sxm"]
    for n in names:
        assert h100[0]["vals"][n] == pytest.approx(want[n], rel=1e-12), n


def test_gemm_loco_ignores_unsupported_donor(monkeypatch):
    """gemm.run (gemm and moe): a chip whose table the fit skipped (unsupported family) has a
    transferred catalog entry; it is no donor. Synthetic op: latency = rows / eff."""
    from dse.calibration.kernels import data, gemm
    P = (common.Param("eff", 1.0, 1e-3, 1e3),)

    class Mod:
        NAME = "fake"
        FIT_ROWS = 100

        @staticmethod
        def load():
            f = _frame(["h100-sxm", "h200-sxm", "b200"]).assign(family="bf16")
            eff = f["chip"].map({"h100-sxm": 1.0, "h200-sxm": 2.0, "b200": 2.0})
            return f.assign(rows=1.0 + f["i"], latency_s=(1.0 + f["i"]) / eff,
                            version="v")

        family_params = staticmethod(lambda fam: P)
        supported = staticmethod(lambda acc, fam: acc.id != "b200")
        predict = staticmethod(lambda g, fam, acc, v: g["rows"].to_numpy(float) / v["eff"])
        sample = staticmethod(lambda d, n: d)

    # the catalog: b200's entry was transferred (unsupported) and equals h100's own fit
    cat = {("h100-sxm", "trtllm"): {"eff": 1.0}, ("h200-sxm", "trtllm"): {"eff": 2.0},
           ("b200", "trtllm"): {"eff": 1.0}}
    monkeypatch.setattr(gemm, "_read_catalog", lambda name: cat)
    monkeypatch.setattr(gemm, "_read_covariances", lambda name: {})
    monkeypatch.setattr(data, "package_version", lambda: "test")
    rep = gemm.run(Mod, fit=False, write=False, loco=True)
    lo = rep[rep["op_class"] == "fake/loco"].set_index("chip")
    # h100 from h200's own fit only (eff 2 vs true 1: error exactly 2); with b200's
    # transferred entry it would be sqrt(2)
    assert lo.loc["h100-sxm", "error_held_out"] == pytest.approx(2.0, rel=1e-9)
    assert "b200" not in lo.index


def test_comm_loco_ignores_entries_derived_from_the_chip():
    """comm.entry_for(exclude=X): H800's NCCL entry (transferred from X and others, plus its
    one fitted fraction) is no donor of X."""
    from dse.calibration.kernels import comm
    from dse.catalog import accelerators
    accs = accelerators()
    base = {p.name: p.x0 for p in comm.NCCL_PARAMS}
    y = {k: v * 2.0 for k, v in base.items()}
    fits = {"nccl": {"h100-sxm": base, "b200": y, "h800-sxm": dict(base)},
            "custom": {}, "a2a": {}, "staged": {},
            "derived": {"nccl": {"h800-sxm": {"h100-sxm"}}}}
    v, how = comm.entry_for("h100-sxm", "sglang", fits, accs, exclude="h100-sxm")
    assert "ar_nccl: transfer from b200" in how
    want, _, _ = common.transfer("h100-sxm", {"b200": y}, comm.NCCL_PARAMS, accs)
    for p in comm.NCCL_PARAMS:
        assert v[p.name] == pytest.approx(want[p.name], rel=1e-12), p.name
    # not left out, h800's entry is a donor like any other
    _, how = comm.entry_for("h200-sxm", "sglang", fits, accs, exclude="h200-sxm")
    assert "h800-sxm" in how
    # a host-staged chip's group-size terms taken from b200: no donor of b200's LOCO, and its
    # own entry still reads (the staged branch of entry_for)
    fits["staged"] = {"h800-sxm": ([4.0], ["b200"])}
    fits["derived"]["nccl"]["h800-sxm"] = {"b200"}
    v, how = comm.entry_for("h800-sxm", "sglang", fits, accs)
    assert "from b200 (same fabric kind)" in how and v["ar_nccl_latency_s"] == base[
        "ar_nccl_latency_s"]
    _, how = comm.entry_for("b200", "sglang", fits, accs, exclude="b200")
    assert "ar_nccl: transfer from h100-sxm;" in how


def test_comm_fit_records_what_entries_were_derived_from():
    fits = {"a2a": {("b200", "sglang"): {"r": 1.0}, ("h100-sxm", "trtllm"): {"r": 2.0}}}
    from dse.calibration.kernels import comm
    free = {("b200", "sglang"): {"r"}, ("h100-sxm", "trtllm"): {"r"}}
    assert comm.rate_donors("h200-sxm", "sglang", ["r"], fits["a2a"], free) == \
        {"b200", "h100-sxm"}
    assert comm.rate_donors("b200", "trtllm", ["r"], fits["a2a"], free) == set()
    assert comm.rate_donors("h200-sxm", comm.NVLINK_RT, ["r"], fits["a2a"], free) == set()
