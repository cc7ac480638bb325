"""Mutation check of the physics tests: does changing one physics term by 20% fail a test that
is not a golden?

    python tests/mutation.py                          # every scorer field the model reads
    python tests/mutation.py gemm_fraction moe_fraction --factor 0.8
    python tests/mutation.py --fast --jobs 2 --out tests/MUTATION.md

For each field of the scorer's struct of arrays (``dse.perf.batch.FIELDS``: hardware specs,
fitted kernel and efficiency parameters, model structure, workload, serving mechanisms) it runs
the physics tests (hand-worked closed-form cases, network, memory, kernels, TTFT, EP
all-to-all and overlap, disaggregated serving, the serving mechanisms, properties: not
``tests/test_goldens.py``) with that field
multiplied by ``--factor`` wherever the scorer reads it, stopping at the first failure, and
prints which test caught it. A field no test catches is a term whose physics no test pins down.

Mechanism: every ``Batch`` reads its columns through a dict that multiplies the mutated field
on access (``set_mutation``); one pytest session per job runs the tests once per field,
fastest-catching files first, stopping at the first failure (each field's memoised per-batch
values are cleared first); a failure counts as a catch only if that test passes unmutated (else
the test is left out and reported). ``DSE_MUTATE=field=factor pytest ...``
(``tests/conftest.py``) runs any tests under one mutation by hand.

Cost: a caught field costs the tests up to the catching one (about a CPU-second when the
previous table's test catches it again; 1-25 CPU-s on the last run); an uncaught one the whole
list (minutes, six more without ``--fast``). ``--fast`` leaves ``SLOW`` out: equalities
between two ways of scoring and monotonicity laws, which hold under any scaling of one term (a
full run, without ``--fast``, is the check that they catch nothing the others miss).
``--jobs N`` splits the fields over N sessions. ``--out FILE`` writes the table (field ->
catching test) with the date and the command; when FILE exists, each field first tries the test
that caught it there. ``--state FILE`` keeps every result as it comes (a killed run resumes).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# fastest-catching first (one closed form per term), the slow invariant properties last
TESTS = [*sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_physics_*.py")),
    "tests/test_closed_form.py", "tests/test_ep_overlap.py", "tests/test_ttft_physics.py",
    "tests/test_disaggregated.py",
    # the serving mechanisms (issue 11), each with its own hand-worked cases
    "tests/test_spec.py", "tests/test_imbalance.py", "tests/test_kvtier.py",
    "tests/test_lengths.py", "tests/test_queueing.py", "tests/test_precision.py",
    "tests/test_cost_model.py", "tests/test_kernel_comm.py", "tests/test_properties.py"]
SLOW = ["tests/test_properties.py::test_chunked_scoring_equals_one_call",
        "tests/test_properties.py::test_scoring_a_batch_equals_scoring_each_row",
        "tests/test_properties.py::test_more_hbm_bandwidth_never_slows_a_step",
        "tests/test_properties.py::test_more_link_bandwidth_never_slows_a_step",
        "tests/test_properties.py::test_infeasible_rows_stay_flagged_with_a_reason",
        "tests/test_properties.py::test_times_are_positive_and_finite_where_defined",
        "tests/test_properties.py::test_more_flops_never_slow_a_step",
        "tests/test_kernel_comm.py::test_fit_report_on_measured_tables"]
# layout, workload and switches: inputs a test sets itself, not terms of the model
NOT_PHYSICS = {"tp", "pp", "ep", "dp", "prefill_tp", "prefill_pp", "prefill_ep", "prefill_dp",
               "disaggregated", "phase", "isl", "osl", "concurrency", "prefill_concurrency",
               "demand_output_tokens_per_s", "use_rental", "a2a_mode", "two_batch_overlap",
               "dense_replicated", "tied", "prefill_chip_ratio", "spec_draft", "moe_kernel_missing"}


# --- the mutation itself ---------------------------------------------------------------------

class _State:
    name: str | None = None
    factor = 1.0
    batches: "weakref.WeakSet" = weakref.WeakSet()


def set_mutation(name: str | None, factor: float = 1.0) -> None:
    """From now on every Batch (also those already built) reads ``name`` times ``factor``;
    ``None``: no mutation. Memoised per-batch values are dropped."""
    from dse.perf import batch as batch_mod

    if not getattr(batch_mod.Batch, "_mutation_hook", False):
        class _Mutated(dict):
            def __getitem__(self, key):
                v = dict.__getitem__(self, key)
                return v * _State.factor if key == _State.name else v

        init = batch_mod.Batch.__post_init__

        def post_init(self):
            if not isinstance(self.columns, _Mutated):
                object.__setattr__(self, "columns", _Mutated(self.columns))
            init(self)
            _State.batches.add(self)
        batch_mod.Batch.__post_init__ = post_init
        batch_mod.Batch._mutation_hook = True
    _State.name, _State.factor = name, factor
    for b in list(_State.batches):
        b.__dict__["_memo"].clear()


# --- the pytest plugin: one session, the tests once per field --------------------------------

_failed: list = []


def pytest_runtest_logreport(report):
    if report.failed:
        _failed.append(report.nodeid)


def pytest_runtestloop(session):
    fields = os.environ["DSE_MUTATE_FIELDS"].split(",")
    factor = float(os.environ["DSE_MUTATE_FACTOR"])
    out = Path(os.environ["DSE_MUTATE_OUT"])
    items = list(session.items)
    hints = json.loads(os.environ.get("DSE_MUTATE_HINTS", "{}"))
    broken: set = set()

    def failed(item, nxt) -> bool:
        _failed.clear()
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nxt)
        return bool(_failed)

    for name in fields:
        set_mutation(name, factor)
        t0, caught = time.process_time(), None
        # the test that caught this field last time first (a re-run costs seconds per field)
        live = sorted((it for it in items if it.nodeid not in broken),
                      key=lambda it: it.nodeid != hints.get(name))
        for i, item in enumerate(live):
            if failed(item, live[i + 1] if i + 1 < len(live) else None):
                session._setupstate.teardown_exact(None)
                set_mutation(None)           # a catch counts only if the test passes unmutated
                if failed(item, None):
                    broken.add(item.nodeid)
                    set_mutation(name, factor)
                    continue
                caught = item.nodeid
                break
        with out.open("a") as f:
            f.write(json.dumps({"field": name, "caught": caught, "broken": sorted(broken),
                                "cpu_s": time.process_time() - t0}) + "\n")
    set_mutation(None)
    return True


# --- the driver ------------------------------------------------------------------------------

def _start(fields, factor, fast, out, hints):
    env = dict(os.environ, DSE_MUTATE_FIELDS=",".join(fields), DSE_MUTATE_FACTOR=str(factor),
               DSE_MUTATE_HINTS=json.dumps({f: hints[f] for f in fields if f in hints}),
               DSE_MUTATE_OUT=str(out), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "tests"),
                                                        os.environ.get("PYTHONPATH")])))
    env.pop("DSE_MUTATE", None)
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "mutation",
            *TESTS]
    if fast:
        args += [f"--deselect={t}" for t in SLOW]
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def write_table(path: Path, rows: dict, names: list, argv: list, factor: float, fast: bool,
                broken: list, state: Path | None = None) -> None:
    caught = sum(rows.get(n) is not None for n in names)
    lost = [n for n in names if n not in rows]
    lines = ["# Mutation check of the physics tests", "",
             f"Generated {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC by",
             "", "    python tests/mutation.py " + " ".join(argv), "",
             f"Every scorer field multiplied by {factor:g} wherever the scorer reads it; the "
             "first physics test (not a golden) that fails"
             + (" (`--fast`: the slow invariant properties left out)" if fast else "")
             + f". {caught} of {len(names)} fields caught"
             + (f", {len(lost)} not run." if lost else "."), ""]
    if state:
        lines += [f"Results from `--state {state}`, kept by the resumed runs of this check "
                  "(each field ran once, against the tests present then).", ""]
    if broken:
        lines += ["Left out (failing without a mutation): " + ", ".join(broken), ""]
    lines += ["| field | caught by |", "|---|---|"]
    lines += [f"| `{n}` | {rows[n] or '**NOT CAUGHT**'} |" if n in rows else f"| `{n}` | not run |"
              for n in names]
    path.write_text("\n".join(lines) + "\n")


def read_table(path: Path) -> dict:
    """{field: catching test} of a table ``--out`` wrote (the first tries of the next run)."""
    out = {}
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`") and "::" in cells[1]:
            out[cells[0].strip("`")] = cells[1]
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    sys.path.insert(0, str(ROOT))
    from dse.perf.batch import FIELDS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fields", nargs="*", help="fields to mutate (default: every physics field)")
    ap.add_argument("--factor", type=float, default=1.2)
    ap.add_argument("--fast", action="store_true", help="leave out the slow invariants (SLOW)")
    ap.add_argument("--jobs", type=int, default=1, help="pytest sessions run at once")
    ap.add_argument("--out", help="write the table (Markdown) to this file")
    ap.add_argument("--state", help="results file (JSON lines): fields already in it are not "
                    "run again, new results are added (a killed run resumes)")
    ap.add_argument("--no-run", action="store_true",
                    help="only write --out from --state (fields without a result: 'not run')")
    a = ap.parse_args(argv)
    unknown = [f for f in a.fields if f not in FIELDS]
    if unknown:
        print(f"mutation.py: unknown field(s) {', '.join(unknown)}; see dse/perf/batch.py "
              "FIELDS", file=sys.stderr)
        return 2
    names = a.fields or [f for f in FIELDS if f not in NOT_PHYSICS]
    rows, broken = {}, set()
    state = Path(a.state) if a.state else None
    if state and state.exists():
        for line in state.read_text().splitlines():
            r = json.loads(line)
            if r.get("factor", a.factor) == a.factor and r["field"] in names:
                rows[r["field"]] = r["caught"]
                broken.update(r.get("broken", []))
    todo = [] if a.no_run else [n for n in names if n not in rows]
    jobs = max(1, min(a.jobs, len(todo)))
    tmp = Path(tempfile.mkdtemp(prefix="dse-mutation-"))
    outs = [tmp / f"job{j}.jsonl" for j in range(jobs)]
    hints = read_table(Path(a.out)) if a.out and Path(a.out).exists() else {}
    procs = [_start(todo[j::jobs], a.factor, a.fast, outs[j], hints) for j in range(jobs)] \
        if todo else []
    seen, t0 = 0, time.perf_counter()
    while True:
        done = all(p.poll() is not None for p in procs)
        for o in outs:
            for line in (o.read_text().splitlines() if o.exists() else []):
                r = json.loads(line)
                if r["field"] in rows:
                    continue
                rows[r["field"]] = r["caught"]
                broken.update(r["broken"])
                if state:
                    with state.open("a") as f:
                        f.write(json.dumps({**r, "factor": a.factor}) + "\n")
                seen += 1
                rate = (time.perf_counter() - t0) / seen
                print(f"[{seen}/{len(todo)}, {rate:.0f} s each, ETA "
                      f"{rate * (len(todo) - seen) / 60:.0f} min] {r['field']} x {a.factor:g}: "
                      + (f"caught by {r['caught']}" if r["caught"] else "NOT CAUGHT")
                      + f" ({r['cpu_s']:.0f} CPU-s)", flush=True)
        if done:
            break
        time.sleep(2)
    lost = [n for n in names if n not in rows]
    if lost and not a.no_run:
        errs = "; ".join((p.stderr.read() or "").strip().splitlines()[-1:][0]
                         if p.stderr else "" for p in procs)
        print(f"mutation.py: a pytest session ended early ({errs}); not run: {', '.join(lost)}",
              file=sys.stderr)
        return 2
    if broken:
        print("left out (failing without a mutation): " + ", ".join(sorted(broken)))
    missed = [n for n in names if n in rows and rows[n] is None]
    if lost:
        print(f"not run: {', '.join(lost)}")
    print(f"{len(names) - len(missed) - len(lost)} of {len(names)} fields caught; not caught: "
          f"{', '.join(missed) or 'none'}")
    if a.out:
        write_table(Path(a.out), rows, names, argv, a.factor, a.fast, sorted(broken), state)
    return 1 if missed or lost else 0


if __name__ == "__main__":
    raise SystemExit(main())
