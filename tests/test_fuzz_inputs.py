"""A seeded fuzzer of invalid inputs, generated from the field registry (dse/spec/fields.py).

Space, design and case files with wrong types, out-of-range values, misspelled keys and
columns, inconsistent model structure, huge sizes, directories and empty files: each must exit 2
with one line on stderr, no traceback, no output file, within seconds (issue 9, item 6). The
CLI is called in-process; a handful of the same files also go through a real subprocess.
"""

from __future__ import annotations

import random
import time

from helpers import run_subprocess

from dse.cli import main
from dse.spec.fields import LIMITS, REGISTRY
from dse.spec.validate import osa_distance_is_one

SEED = 9
DESIGN = {"accelerator.id": '"h100-sxm"', "model.id": '"llama-3.1-8b"',
          "model.weight_dtype": '"fp8"', "layout.tp": "1"}
MOE = {"accelerator.id": '"gb200"', "model.id": '"deepseek-v3"', "layout.num_chips": "8"}
OBJECTIVES = '[objectives]\ntpot_s = "minimize"\n'
SPACE_TAIL = ('\n[parameters]\n"workload.concurrency" = [1, 8]\n'
              '\n[objectives]\nusd_per_mtok_output = "minimize"\ntpot_s = "minimize"\n')
CASE_COLS = ["case_id", "model", "hardware", "num_chips", "tp", "pp", "ep", "dp", "weight_dtype",
             "kv_dtype", "isl", "osl", "concurrency", "prefix_hit_fraction", "phase", "runtime",
             "dense_mlp"]
CASE = dict(case_id="a", model="llama-3.1-8b", hardware="h100-sxm", num_chips="1", tp="1", pp="1",
            ep="1", dp="1", weight_dtype="fp8", kv_dtype="", isl="128", osl="128",
            concurrency="8", prefix_hit_fraction="", phase="", runtime="", dense_mlp="")
CASE_FIELDS = {"num_chips": "layout.num_chips", "tp": "layout.tp", "pp": "layout.pp",
               "ep": "layout.ep", "dp": "layout.dp", "isl": "workload.isl", "osl": "workload.osl",
               "concurrency": "workload.concurrency",
               "prefix_hit_fraction": "workload.prefix_hit_fraction"}


def toml(flat: dict) -> str:
    """{dotted path: TOML literal} as sections."""
    secs: dict = {}
    for k, v in flat.items():
        sec, rest = k.split(".", 1)
        secs.setdefault(sec, []).append(f"{rest} = {v}" if "." not in rest else f'"{rest}" = {v}')
    return "\n".join(f"[{s}]\n" + "\n".join(lines) + "\n" for s, lines in secs.items())


def bad_literals(f) -> list[str]:
    """TOML literals that are never a valid value of field ``f``."""
    if f.kind in ("enum", "id"):
        out = ([] if f.blank else ['""']) + ["5", "true", "[1]"]
        return out + (['"fp9"', '"nonsense"'] if f.kind == "enum" else [])
    out = ["nan", "inf", "-inf", "1e99999", '""', '"abc"', "[1, 2]"]
    if f.kind == "bool":
        return out + ["2", "0.5", '"true"']
    out += ["true", "false"]
    if f.low is not None:
        out.append("0" if f.low_open and f.low == 0 else repr(f.low - 1.0) if f.low_open
                   else repr(f.low - 1))
        if f.low >= 1 or f.low_open:
            out.append("0")
        out.append("-1")
    if f.upper is not None:
        out.append(repr(f.upper * 10 + 1))
    if f.kind == "int":
        out.append("2.5")
    return out


INCONSISTENT = [  # (base design, overrides) that contradict the model's structure
    (MOE, {"model.num_hidden_layers": "1"}), (MOE, {"model.num_hidden_layers": "2"}),
    (MOE, {"model.num_experts_per_tok": "300"}), (MOE, {"model.num_experts_per_tok": "0"}),
    (MOE, {"model.qk_rope_head_dim": "0"}), (MOE, {"model.v_head_dim": "0"}),
    (MOE, {"model.moe_intermediate_size": "0"}), (MOE, {"model.moe_layer_step": "0"}),
    (MOE, {"model.shared_expert_intermediate_size": "0"}),
    (MOE, {"model.first_k_dense_replace": "100"}), (MOE, {"model.intermediate_size": "0"}),
    (DESIGN, {"model.num_key_value_heads": "3"}), (DESIGN, {"model.num_key_value_heads": "64"}),
    (DESIGN, {"model.num_attention_heads": "7"}), (DESIGN, {"model.intermediate_size": "0"}),
    (DESIGN, {"model.num_local_attention_layers": "99"}),
    (DESIGN, {"model.num_local_attention_layers": "4"}),
    (DESIGN, {"model.num_experts": "8"}),                      # no top-k, no expert width
    (DESIGN, {"layout.tp": "256", "layout.pp": "256", "layout.dp": "2"}),   # > chips limit
    ({"accelerator.id": '"mi300x"', "model.id": '"llama-3.1-8b"', "topology.id": '"mi-8"'},
     {"topology.scaleup.domain_chips": "4096"}),             # a full mesh of 4096 chips
]


def typo(word: str, rng: random.Random) -> str:
    """``word`` with one random edit (missing, extra, changed or swapped characters)."""
    i = rng.randrange(len(word) - 1)
    kind = rng.choice(["drop", "add", "change", "swap"])
    if kind == "drop":
        return word[:i] + word[i + 1:]
    if kind == "add":
        return word[:i] + rng.choice("xqz") + word[i:]
    if kind == "change":
        return word[:i] + ("q" if word[i] != "q" else "x") + word[i + 1:]
    return word[:i] + word[i + 1] + word[i] + word[i + 2:] if word[i] != word[i + 1] else word + "x"


def design_inputs(rng: random.Random) -> list[tuple[str, str]]:
    out = []
    for path, f in sorted(REGISTRY.items()):
        base = MOE if path.startswith("layout.num_chips") else DESIGN
        lits = bad_literals(f)
        for lit in rng.sample(lits, min(len(lits), 4)):
            out.append((f"design {path} = {lit}", toml({**base, path: lit})))
    for base, ov in INCONSISTENT:
        out.append((f"design {ov}", toml({**base, **ov})))
    for path in rng.sample(sorted(REGISTRY), 20):            # misspelled keys
        sec, rest = path.split(".", 1)
        bad = f"{sec}.{typo(rest, rng)}"
        if bad not in REGISTRY:
            out.append((f"design key {bad}", toml({**DESIGN, bad: "1"})))
    out.append(("design section typo", toml(DESIGN) + "[layuot]\ntp = 1\n"))
    out.append(("design huge domain", toml({**DESIGN, "topology.scaleup.domain_chips": "1e7"})))
    out.append(("design huge chips", toml({**MOE, "layout.num_chips": "1000000000"})))
    out.append(("design binary", "\x00\x01\x02 not toml \xff"))
    return out


def space_inputs(rng: random.Random) -> list[tuple[str, str]]:
    base = toml({"accelerator.id": '"h100-sxm"', "model.id": '"llama-3.1-8b"'})
    out = []
    numeric = [p for p, f in sorted(REGISTRY.items()) if f.numeric and f.resolved]
    for path in rng.sample(numeric, 30):
        f = REGISTRY[path]
        lit = rng.choice([x for x in bad_literals(f) if not x.startswith("[")])
        out.append((f"space list {path} = {lit}",
                    base + f'\n[parameters]\n"{path}" = [{lit}]\n' + OBJECTIVES))
    for path in rng.sample(numeric, 15):
        f = REGISTRY[path]
        lit = rng.choice([x for x in bad_literals(f) if not x.startswith("[")])
        out.append((f"space base {path} = {lit}", toml({"accelerator.id": '"h100-sxm"',
                                                        "model.id": '"llama-3.1-8b"', path: lit})
                    + SPACE_TAIL))
    ranges = ["{ low = 1, high = 64, num = 1e9 }", "{ low = 1, high = 64, num = 1000000000 }",
              "{ low = 1, high = 64, num = 0 }", "{ low = 1, high = 64, num = 2.5 }",
              "{ low = 1, high = 1e9, step = 1 }", "{ low = 1, high = 64, step = 0 }",
              "{ low = nan, high = 64 }", "{ low = 1, high = inf }", "{ low = true, high = 4 }",
              "{ low = 64, high = 1 }", "{ low = 0, high = 64, num = 3, log = true }",
              "{ low = 1, high = 64, log = 1 }", "{ low = 1 }", "{ lo = 1, high = 4 }",
              "{ low = 0, high = 8, num = 3 }", "{ low = 1.0, high = 2.0, num = 4 }",
              "{ scale = [0.0] }", "{ scale = [-1] }", "{ scale = [nan] }", "{ scale = [inf] }",
              "{ scale = [true] }", "{ scale = [] }", "[]", "5", '"1, 2"']
    for r in ranges:
        out.append((f"space layout.tp = {r}", base + f'\n[parameters]\n"layout.tp" = {r}\n'
                    '"workload.concurrency" = [1, 8]\n[objectives]\ntpot_s = "minimize"\n'))
    for r in ("{ scale = [1e300] }", "{ scale = [0.5] }"):       # scaled out of range
        path = "accelerator.hbm_bw_bytes_per_s" if "300" in r else "topology.scaleout_oversubscription"
        out.append((f"space {path} {r}", base + f'\n[parameters]\n"{path}" = {r}\n'
                    '[objectives]\ntpot_s = "minimize"\n'))
    out.append(("space model combination", toml({"accelerator.id": '"gb200"',
                                                 "model.id": '"deepseek-v3"'})
                + '\n[parameters]\n"model.num_hidden_layers" = [61, 2]\n'
                '"model.num_experts" = [256, 64]\n[objectives]\ntpot_s = "minimize"\n'))
    for _, ov in INCONSISTENT[:8]:
        (path, v), = ov.items()
        out.append((f"space inconsistent {path}", toml({**{k: v for k, v in MOE.items()
                                                            if k != "layout.num_chips"}})
                    + f'\n[parameters]\n"{path}" = [{v}]\n[objectives]\ntpot_s = "minimize"\n'))
    for path in rng.sample(numeric, 10):                      # misspelled parameter paths
        sec, rest = path.split(".", 1)
        bad = f"{sec}.{typo(rest, rng)}"
        if bad not in REGISTRY:
            out.append((f"space key {bad}", base + f'\n[parameters]\n"{bad}" = [1]\n'
                        '[objectives]\ntpot_s = "minimize"\n'))
    out.append(("space huge list", base + '\n[parameters]\n"workload.isl" = ['
                + ", ".join(str(i + 1) for i in range(LIMITS["values per parameter"] + 1))
                + ']\n[objectives]\ntpot_s = "minimize"\n'))
    out.append(("space huge product", base + "\n[parameters]\n" + "".join(
        f'"{p}" = {{ low = 1, high = 100000, num = 100000 }}\n'
        for p in ("workload.isl", "workload.osl", "workload.concurrency", "serving.max_num_tokens"))
                + '[objectives]\ntpot_s = "minimize"\n'))
    out.append(("space bad objective", base + '\n[objectives]\ntpot = "minimize"\n'))
    out.append(("space bad direction", base + '\n[objectives]\ntpot_s = "min"\n'))
    return out


def case_inputs(rng: random.Random) -> list[tuple[str, list, list]]:
    """(label, columns, rows)."""
    out = []
    for col, path in CASE_FIELDS.items():
        f = REGISTRY[path]
        vals = ["nan", "inf", "-inf", "1e99999", "true", "false", "abc", "-1"]
        if f.low is not None and (f.low >= 1 or f.low_open):
            vals.append("0")
        if f.kind == "int":
            vals.append("2.5")
        if f.upper is not None:
            vals.append(str(int(f.upper * 10 + 1)))
        if col in ("num_chips", "isl", "osl"):
            vals.append("")                               # a required column left blank
        for v in vals:
            out.append((f"case {col} = {v!r}", CASE_COLS, [CASE, {**CASE, "case_id": "b", col: v}]))
    for col, vals in (("weight_dtype", ["fp9", "", "8"]), ("kv_dtype", ["fp9", "true"]),
                      ("phase", ["decod", "all"]), ("runtime", ["tensorrt", "vLLM", "1"]),
                      ("dense_mlp", ["both", "split "]), ("hardware", ["h100-sxn", ""]),
                      ("model", ["llama-3.1-8c"]), ("case_id", [""])):
        for v in vals:
            if col == "dense_mlp" and v == "split ":
                continue                                   # surrounding blanks are stripped
            out.append((f"case {col} = {v!r}", CASE_COLS, [CASE, {**CASE, "case_id": "b", col: v}]))
    known = [c for c in CASE_COLS if len(c) >= 5]
    typos = ["concurency", "num_chip", "weigth_dtype"]
    while len(typos) < 25:
        t = typo(rng.choice(known), rng)
        if len(t) >= 6 and t not in CASE_COLS and any(osa_distance_is_one(t, k) for k in CASE_COLS):
            typos.append(t)
    for t in dict.fromkeys(typos):
        out.append((f"case column {t}", CASE_COLS + [t], [{**CASE, t: "16"}]))
    for t, right in (("concurency", "concurrency"), ("num_chip", "num_chips"),
                     ("weigth_dtype", "weight_dtype")):     # the typo instead of the column
        cols = [t if c == right else c for c in CASE_COLS]
        out.append((f"case column {t} replacing", cols, [{**CASE, t: CASE[right]}]))
    out.append(("case duplicate id", CASE_COLS, [CASE, CASE]))
    out.append(("case header only", CASE_COLS, []))
    out.append(("case layout product", CASE_COLS, [{**CASE, "num_chips": "8"}]))
    out.append(("case ep on dense", CASE_COLS, [{**CASE, "num_chips": "2", "tp": "2", "ep": "2"}]))
    return out


def write_csv(path, cols, rows):
    import csv
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in cols})


def _check(capsys, label, args, out_path=None, where=None):
    capsys.readouterr()
    t0 = time.monotonic()
    rc = main([str(a) for a in args])
    dt = time.monotonic() - t0
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2, f"{label}: exit {rc}, stderr {err!r}, stdout {out[:200]!r}"
    assert len(lines) == 1 and "Traceback" not in err, f"{label}: {err!r}"
    assert "internal error" not in err, f"{label}: {err!r}"
    if where is not None:
        assert str(where) in lines[0], f"{label}: the file is not named: {lines[0]!r}"
    assert dt < 10, f"{label}: took {dt:.1f} s"
    if out_path is not None:
        assert not out_path.exists(), f"{label}: wrote {out_path}"
    return lines[0]


def test_fuzzed_invalid_inputs_all_refused(capsys, tmp_path):
    rng = random.Random(SEED)
    jobs = []   # (label, argv, file named in the error, output that must not appear)
    for i, (label, text) in enumerate(design_inputs(rng)):
        p = tmp_path / f"d{i}.toml"
        p.write_text(text)
        jobs.append((label, ["eval", p], p, None))
    for i, (label, text) in enumerate(space_inputs(rng)):
        p = tmp_path / f"s{i}.toml"
        p.write_text(text)
        if i % 5 == 0:      # some through `dse run`: no run folder may be left
            out = tmp_path / f"run{i}"
            jobs.append((label, ["run", p, "--out", out, "--quiet"], p, out))
        else:
            jobs.append((label, ["validate", p], p, None))
    for i, (label, cols, rows) in enumerate(case_inputs(rng)):
        p = tmp_path / f"c{i}.csv"
        write_csv(p, cols, rows)
        out = tmp_path / f"p{i}.csv"
        jobs.append((label, ["predict", p, "--out", out], p, out))
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    folder = tmp_path / "folder.csv"
    folder.mkdir()
    garbage = tmp_path / "garbage.csv"
    garbage.write_bytes(b"\xff\xfe\x00\x01" * 50)
    for p in (empty, folder, garbage):
        jobs.append((f"case file {p.name}", ["predict", p, "--out", tmp_path / "px.csv"], p,
                     tmp_path / "px.csv"))
    for kind in ("eval", "validate"):
        d = tmp_path / f"{kind}.toml"
        d.mkdir()
        jobs.append((f"{kind} of a directory", [kind, d], d, None))
        e = tmp_path / f"{kind}-empty.toml"
        e.write_text("")
        jobs.append((f"{kind} of an empty file", [kind, e], e, None))
    t0 = time.monotonic()
    failed = []
    for label, argv, where, out in jobs:
        try:
            _check(capsys, label, argv, out, where)
        except AssertionError as e:
            failed.append(str(e).splitlines()[0][:300])
    assert not failed, f"{len(failed)} of {len(jobs)} accepted or badly refused:\n" + "\n".join(failed[:40])
    with capsys.disabled():
        print(f"\nfuzzed {len(jobs)} invalid inputs (seed {SEED}): all exit 2 with one line, "
              f"in {time.monotonic() - t0:.1f} s")
    assert len(jobs) >= 300
    assert not list(tmp_path.glob("p*.csv*")) and not list(tmp_path.glob("run*"))


def test_fuzzed_inputs_subprocess(tmp_path):
    """A few of the same inputs through a real process: exit 2, one line, no traceback."""
    rng = random.Random(SEED)
    designs = design_inputs(rng)
    picks = [t for label, t in designs if "num_hidden_layers = 1" in label or "1e99999" in label][:2]
    picks += [toml({**MOE, "model.num_hidden_layers": "1"})]
    cases = tmp_path / "c.csv"
    write_csv(cases, CASE_COLS + ["concurency"], [{**CASE, "concurrency": "", "concurency": "16"}])
    argvs = []
    for i, text in enumerate(picks):
        p = tmp_path / f"d{i}.toml"
        p.write_text(text)
        argvs.append((["eval", p], p))
    argvs.append((["predict", cases, "--out", tmp_path / "p.csv"], cases))
    argvs.append((["predict", tmp_path, "--out", tmp_path / "p.csv"], tmp_path))
    for argv, where in argvs:
        r = run_subprocess(*argv)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, (argv, r.stderr)
        assert "Traceback" not in r.stderr and str(where) in lines[0] and r.stdout == ""
    assert not (tmp_path / "p.csv").exists()


def test_runtime_and_dense_mlp_columns_accepted(capsys, tmp_path):
    """The contract's optional columns: valid values (and blanks) pass through."""
    cases = tmp_path / "c.csv"
    rows = [{**CASE, "case_id": "x", "runtime": "sglang", "model": "deepseek-v3", "hardware": "gb200",
             "num_chips": "8", "tp": "", "pp": "", "ep": "", "dp": "", "dense_mlp": "replicated"},
            {**CASE, "case_id": "y", "runtime": "vllm"}, {**CASE, "case_id": "z"}]
    write_csv(cases, CASE_COLS, rows)
    out = tmp_path / "p.csv"
    assert main(["predict", str(cases), "--out", str(out)]) == 0, capsys.readouterr().err
    import pandas as pd
    pred = pd.read_csv(out)
    assert list(pred["case_id"]) == ["x", "y", "z"] and pred["feasible"].all()


def test_predict_chunks_give_the_same_predictions(monkeypatch):
    """Chunking by candidate rows (bounded memory) changes nothing in the result."""
    import pandas as pd

    from dse.scoring import predict
    rows = [{**CASE, "case_id": f"c{i}", "num_chips": str(2 ** (i % 4)), "tp": "", "pp": "",
             "ep": "", "dp": "", "concurrency": "" if i % 2 else "16", "isl": str(128 + i)}
            for i in range(12)]
    cases = pd.DataFrame(rows).replace({"": None})
    whole = predict.predict_frame(cases)
    monkeypatch.setattr(predict, "ROWS_PER_CHUNK", 100)
    assert len(predict.chunks(cases)) > 6
    pd.testing.assert_frame_equal(predict.predict_frame(cases), whole)


def test_issue_examples_are_refused(capsys, tmp_path):
    """The inputs issue 9 found accepted: each is now one line, exit 2."""
    texts = {
        "layers": toml({**MOE, "model.num_hidden_layers": "1"}),
        "hidden": toml({**DESIGN, "model.hidden_size": "0"}),
        "heads": toml({**DESIGN, "model.num_attention_heads": "0"}),
        "isl": toml({**DESIGN, "workload.isl": "0"}),
        "efficiency": toml({**DESIGN, "accelerator.efficiency.hbm_fraction": "0"}),
        "flops": toml({**DESIGN, "accelerator.peak_flops_per_s.bf16": "inf"}),
        "osl": toml({**DESIGN, "workload.osl": "1e99999"}),
        "nan": toml({**DESIGN, "accelerator.hbm_bw_bytes_per_s": "nan"}),
        "blank": toml({**DESIGN, "accelerator.hbm_bw_bytes_per_s": '""'}),
        "true": toml({**DESIGN, "layout.tp": "true"}),
        "domain": toml({**DESIGN, "topology.scaleup.domain_chips": "1e7"}),
        "chips": toml({**MOE, "layout.num_chips": "1e9"}),
    }
    for name, text in texts.items():
        p = tmp_path / f"{name}.toml"
        p.write_text(text)
        _check(capsys, name, ["eval", p], where=p)
