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

Operator mode: does changing the *shape* of a formula fail a physics test?

    python tests/mutation.py --operators --fast --jobs 2 --out tests/MUTATION_OPERATORS.md \
        [--files serve.py step.py] [--kinds op,drop] [--limit N --seed S] [--state FILE]
    python tests/mutation.py --operators --list [--match TEXT]     # the mutants and their ids

The sites are found on the syntax tree of every ``dse/perf/*.py`` (not ``batch.py``, the struct
of arrays, nor ``__init__.py``), whatever its functions are called: the bodies of its functions
and methods and its module-level numeric constants, not docstrings, annotations, default
values, decorators, class bodies, indices and slices, f-strings, asserts and raises, nor the
arguments of shape, dtype and bookkeeping calls (``_SKIP_ARGS``). Kinds (``KINDS``): ``op`` an
operator swapped (``+ -``, ``* /``, ``& |``, also augmented), ``drop`` a term of a sum, the
subtrahend, the divisor, a factor of a product of two non-constants or one side of a
``max``/``min`` dropped (an augmented assignment dropped), ``minmax`` ``maximum <-> minimum``
(``max <-> min``), ``cmp`` a comparison's boundary or direction flipped (``< -> <=, >`` ...),
``round`` ``ceil``/``floor`` dropped, ``const`` a number times 1.2 (not 0, nor guards below 1e-5
or above 1e20), ``sign`` a unary minus dropped. A mutant's id hashes its file, kind, texts and
occurrence, not its line, so a table stays readable across edits.

Mechanism: one pytest session per job compiles the mutated module (``ast``) and puts the code
object of the function holding the site (its outermost ``def``) into the live function
(``__code__``), so every reference to it, imported or not, runs the mutant; a module-level
constant is rebound wherever it was imported. Nothing on disk changes; the undo puts the code
back, and memoised per-batch values are dropped both ways. Each mutant first scores a design
sample reaching every mechanism (``sample_frames``, 2,025 designs: every metric, the per-op
breakdown and the float32 chunked scoring): a site on a line that scoring the sample never runs
(a module-level constant's runs at import: it is judged by the numbers) is *unreachable*, a
mutant that changes no number is *equivalent*; neither counts against the
tests. The others run the physics tests (the test that caught the mutant in ``--out``'s previous
table first, then those that caught the latest mutants, then ``TESTS``) until one fails; a failure
counts only if the test passes unmutated; a mutant no physics test catches runs
``tests/test_goldens.py``, telling "goldens only" from "nothing". A test or the sample's scoring
over ``--test-timeout`` seconds counts as failing. ``--limit N`` runs a seeded random sample
(a larger N with the same ``--seed`` extends a smaller one); ``--state FILE`` as above.
``DSE_MUTATE_OP=id python -m pytest tests/test_x.py`` runs any tests under one mutant.

Training mode (``--train``, issue 25): the same two checks on the training model.

    python tests/mutation.py --train --fast --jobs 1 --out tests/MUTATION_TRAIN.md
    python tests/mutation.py --operators --train --fast --out tests/MUTATION_TRAIN_OPERATORS.md

Field mode mutates every field of ``dse.perf.train_batch.TrainBatch`` that is a term (not the
layout, job and switches: ``TRAIN_NOT_PHYSICS``) and, as ``kernel.KEY``, every kernel parameter
the training scorer reads, wherever it reads it (``set_train_mutation``: the class's attribute
access multiplies the field; ``replace`` and ``take`` copy the stored values). Operator mode
mutates ``dse/perf/train_*.py`` (the serving mode's default leaves them out) and judges
equivalence on ``train_sample``: a few training cases (dense and MoE, GQA and MLA, EP, CP,
ZeRO 0-3, every recompute policy and pipeline schedule, bf16 to NVFP4, a precision without
native support, MTP, tied embeddings) whose candidate layouts expand from the in-repo catalog,
scored by ``score_train`` with its micro-batch parts and the memory without flash attention;
the same rows again with the job's software switches drawn row by row (tp_comm_overlap,
overlap_p2p_comm, overlap_grad_reduce, p2p_scatter_gather, cp_comm_type, recompute_norms,
recompute_moe_act, moe_router_force_load_balancing, the unfused and other attention kernels),
MLA and GQA (tp filling the domain and past the key/value heads) under each context-parallel
exchange, ZeRO-3 under DualPipe, and layouts breaking each rule of ``train_layout.layout_bits``
and on its boundaries (judged by their bits and reasons: an invalid layout's numbers are never
shown). Both run ``TRAIN_TESTS`` (every ``tests/test_train_*.py``; ``--fast`` leaves out
``TRAIN_SLOW``: a subprocess, which runs unmutated code, two search runs and a minute of fit
restarts); the training model has no goldens.
``DSE_MUTATE_TRAIN=field=factor pytest ...`` runs any tests under one training mutation.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import functools
import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import types
import warnings
import weakref
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# fastest-catching first (one closed form per term), the slow invariant properties last
TESTS = [*sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_physics_*.py")),
    "tests/test_closed_form.py", "tests/test_ep_overlap.py", "tests/test_ttft_physics.py",
    "tests/test_disaggregated.py", "tests/test_perf_work.py",
    # the serving mechanisms (issue 11), each with its own hand-worked cases
    "tests/test_spec.py", "tests/test_imbalance.py", "tests/test_kvtier.py",
    "tests/test_lengths.py", "tests/test_queueing.py", "tests/test_queueing_disaggregated.py",
    "tests/test_precision.py",
    # the serial front end and the running cap, worked by hand; the fast roots against the
    # bisection they stand for
    "tests/test_frontend.py", "tests/test_admission_cap.py", "tests/test_queueing_roots.py",
    "tests/test_queueing_vs_bisection.py",
    "tests/test_cost_model.py", "tests/test_kernel_comm.py", "tests/test_properties.py"]
SLOW = ["tests/test_properties.py::test_chunked_scoring_equals_one_call",
        "tests/test_properties.py::test_scoring_a_batch_equals_scoring_each_row",
        "tests/test_properties.py::test_more_hbm_bandwidth_never_slows_a_step",
        "tests/test_properties.py::test_more_link_bandwidth_never_slows_a_step",
        "tests/test_properties.py::test_infeasible_rows_stay_flagged_with_a_reason",
        "tests/test_properties.py::test_times_are_positive_and_finite_where_defined",
        "tests/test_properties.py::test_more_flops_never_slow_a_step",
        "tests/test_kernel_comm.py::test_fit_report_on_measured_tables"]
GOLDENS = "tests/test_goldens.py"
# --train: the training model's tests (hand-worked terms first, the scorers' wiring after; no
# goldens: the training model has none) and the tests no mutant can fail (a subprocess runs the
# unmutated code) or that take ten seconds each (a search run), left out by --fast
_TRAIN_LAST = ["tests/test_train_predict.py", "tests/test_train_space.py",
               "tests/test_train_report.py", "tests/test_train_fit.py",
               "tests/test_train_whatif_bands.py", "tests/test_train_questions.py"]
TRAIN_TESTS = ["tests/test_train_physics.py", "tests/test_train_terms.py",
               *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_train_terms_*.py")),
               # every other tests/test_train_*.py, then the scorers' wiring
               *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_train_*.py")
                       if not p.name.startswith(("test_train_terms", "test_train_physics"))
                       and str(p.relative_to(ROOT)) not in _TRAIN_LAST),
               *_TRAIN_LAST]
TRAIN_SLOW = ["tests/test_train_predict.py::test_missing_required_column_and_subprocess_exit_code",
              "tests/test_train_space.py::test_report_compare_whatif_on_training_runs",
              "tests/test_train_space.py::test_optuna_run_finds_front_designs",
              # a minute of Nelder-Mead restarts: the fit's reproducibility, not a term's value
              "tests/test_train_fit.py::test_fit_ends_at_the_same_values_from_any_start"]
# the TrainBatch fields that are a design's layout, job or switches, not terms of the model
TRAIN_NOT_PHYSICS = {"tp", "pp", "dp", "ep", "cp", "vp", "micro_batch_seqs", "zero_stage",
                     "recompute", "recompute_layer_fraction", "schedule", "sequence_parallel",
                     "global_batch_seqs", "seq_len", "precision", "precision_native", "tied",
                     "mtp_layers", "attention_unfused", "tp_comm_overlap", "overlap_p2p_comm",
                     "overlap_grad_reduce", "p2p_scatter_gather", "cp_comm_type",
                     "recompute_norms", "recompute_moe_act",
                     "moe_router_force_load_balancing", "moe_grouped_gemm",
                     "layer_code"}      # (the space builder's grouping of designs, no number)
# layout, workload and switches: inputs a test sets itself, not terms of the model
NOT_PHYSICS = {"tp", "pp", "ep", "dp", "prefill_tp", "prefill_pp", "prefill_ep", "prefill_dp",
               "disaggregated", "phase", "isl", "osl", "concurrency", "prefill_concurrency",
               "demand_output_tokens_per_s", "use_rental", "a2a_mode", "two_batch_overlap",
               "dense_replicated", "tied", "prefill_chip_ratio", "spec_draft", "moe_kernel_missing",
               "tp_x", "kv_batch", "link_collectives"}


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


class _TrainState:
    name: str | None = None
    factor = 1.0
    raw = 0                      # > 0 inside TrainBatch.replace / take: the stored values


class _MutatedKernel(dict):
    def __getitem__(self, key):
        v = dict.__getitem__(self, key)
        return v * _TrainState.factor if "kernel." + key == _TrainState.name else v

    def get(self, key, default=None):        # (kp.get(KEY, default) reads are mutated too)
        try:
            return self[key]
        except KeyError:
            return default


def set_train_mutation(name: str | None, factor: float = 1.0) -> None:
    """From now on every TrainBatch (also those already built) reads ``name`` times ``factor``
    (a field of ``dse.perf.train_batch.TrainBatch``, or ``kernel.KEY``: one of its kernel
    parameters); ``None``: no mutation. ``replace`` and ``take`` copy the stored values, so a
    derived batch is mutated once, on read, like its parent."""
    from dse.perf import train_batch as tb

    cls = tb.TrainBatch
    if not getattr(cls, "_mutation_hook", False):
        get = object.__getattribute__

        def getattribute(self, key):
            v = get(self, key)
            if _TrainState.raw or _TrainState.name is None:
                return v
            if key == _TrainState.name:
                return v * _TrainState.factor
            if key == "kernel" and _TrainState.name.startswith("kernel."):
                return _MutatedKernel(v)
            return v

        def stored(method):
            def run(self, *args, **kwargs):
                _TrainState.raw += 1
                try:
                    return method(self, *args, **kwargs)
                finally:
                    _TrainState.raw -= 1
            return run
        cls.__getattribute__ = getattribute
        cls.replace = stored(cls.replace)
        cls.take = stored(cls.take)
        cls._mutation_hook = True
    _TrainState.name, _TrainState.factor = name, factor


def train_fields() -> list[str]:
    """Every field the training scorer reads: the TrainBatch fields and, as ``kernel.KEY``, the
    kernel parameters scoring the training sample (``train_sample``) reads."""
    import dataclasses

    from dse.perf.train_batch import TrainBatch
    from dse.perf.train_step import score_train
    read: list = []

    class Recording(dict):
        def __getitem__(self, key):
            if key not in read:
                read.append(key)
            return dict.__getitem__(self, key)

        def get(self, key, default=None):
            try:
                return self[key]
            except KeyError:
                return default
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for b in train_sample().values():
            score_train(dataclasses.replace(b, kernel=Recording(b.kernel)))
    return [f.name for f in dataclasses.fields(TrainBatch) if f.name != "kernel"] + \
        ["kernel." + k for k in sorted(read)]


# --- the pytest plugin: one session, the tests once per field --------------------------------

_failed: list = []


def pytest_configure(config):
    # a mutant's failing examples are not kept for later runs (tests/test_properties.py)
    try:
        from hypothesis import settings
    except ImportError:
        return
    settings.register_profile("dse-mutation", database=None)
    settings.load_profile("dse-mutation")


def pytest_runtest_logreport(report):
    if report.failed:
        _failed.append(report.nodeid)


def pytest_runtestloop(session):
    if os.environ.get("DSE_MUTATE_MODE") == "operators":
        _operators_loop(session)
        return True
    fields = os.environ["DSE_MUTATE_FIELDS"].split(",")
    factor = float(os.environ["DSE_MUTATE_FACTOR"])
    out = Path(os.environ["DSE_MUTATE_OUT"])
    items = list(session.items)
    hints = json.loads(os.environ.get("DSE_MUTATE_HINTS", "{}"))
    broken: set = set()
    mutate = set_train_mutation if os.environ.get("DSE_MUTATE_TASK") == "train" \
        else set_mutation

    def failed(item, nxt) -> bool:
        _failed.clear()
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nxt)
        return bool(_failed)

    for name in fields:
        mutate(name, factor)
        t0, caught = time.process_time(), None
        # the test that caught this field last time first (a re-run costs seconds per field)
        live = sorted((it for it in items if it.nodeid not in broken),
                      key=lambda it: it.nodeid != hints.get(name))
        for i, item in enumerate(live):
            if failed(item, live[i + 1] if i + 1 < len(live) else None):
                session._setupstate.teardown_exact(None)
                mutate(None)           # a catch counts only if the test passes unmutated
                if failed(item, None):
                    broken.add(item.nodeid)
                    mutate(name, factor)
                    continue
                caught = item.nodeid
                break
        with out.open("a") as f:
            f.write(json.dumps({"field": name, "caught": caught, "broken": sorted(broken),
                                "cpu_s": time.process_time() - t0}) + "\n")
    mutate(None)
    return True


# --- the driver ------------------------------------------------------------------------------

def _pytest_worker(env_vars: dict, tests: list, fast: bool, train: bool = False) \
        -> subprocess.Popen:
    """A pytest session with this plugin loaded (``-p mutation``) over ``tests``, told what to
    mutate by ``env_vars`` (``--fast``: the slow invariant properties left out; ``train``: the
    training model, ``TRAIN_SLOW``)."""
    env = dict(os.environ, **env_vars, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "tests"),
                                                        os.environ.get("PYTHONPATH")])))
    env.pop("DSE_MUTATE", None)
    env.pop("DSE_MUTATE_TRAIN", None)
    env["DSE_MUTATE_TASK"] = "train" if train else "serve"
    # -n 0: one process (the jobs run side by side; this plugin drives the session's test loop)
    args = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-p",
            "mutation", *tests]
    if fast:
        args += [f"--deselect={t}" for t in (TRAIN_SLOW if train else SLOW)]
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _start(fields, factor, fast, out, hints, train=False):
    return _pytest_worker({
        "DSE_MUTATE_FIELDS": ",".join(fields), "DSE_MUTATE_FACTOR": str(factor),
        "DSE_MUTATE_HINTS": json.dumps({f: hints[f] for f in fields if f in hints}),
        "DSE_MUTATE_OUT": str(out)}, TRAIN_TESTS if train else TESTS, fast, train)


def write_table(path: Path, rows: dict, names: list, argv: list, factor: float, fast: bool,
                broken: list, state: Path | None = None, train: bool = False) -> None:
    caught = sum(rows.get(n) is not None for n in names)
    lost = [n for n in names if n not in rows]
    what = ("Every training scorer field (`dse.perf.train_batch.TrainBatch`, and as `kernel.KEY` "
            "the kernel parameters it reads)" if train else "Every scorer field")
    lines = ["# Mutation check of the " + ("training model's tests" if train else
                                           "physics tests"), "",
             f"Generated {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC by",
             "", "    python tests/mutation.py " + " ".join(argv), "",
             f"{what} multiplied by {factor:g} wherever the scorer reads it; the "
             "first " + ("training test" if train else "physics test (not a golden)")
             + " that fails"
             + ((" (`--fast`: the subprocess and search-run tests left out)" if train else
                 " (`--fast`: the slow invariant properties left out)") if fast else "")
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
    ap.add_argument("--train", action="store_true",
                    help="the training model: its TrainBatch fields and kernel parameters (with "
                    "--operators: dse/perf/train_*.py on the training sample), against the "
                    "training tests (TRAIN_TESTS)")
    op = ap.add_argument_group("operator mode (--operators)")
    op.add_argument("--operators", action="store_true",
                    help="mutate the formulas of dse/perf/*.py (operators, terms, min/max, "
                    "comparisons, constants) instead of scaling fields")
    op.add_argument("--files", nargs="+", metavar="FILE",
                    help="perf modules to mutate (e.g. serve.py step.py; default: all but "
                    + ", ".join(sorted(OP_SKIP_FILES)) + ")")
    op.add_argument("--kinds", help="comma-separated mutation kinds (default: all of "
                    + ",".join(KINDS) + ")")
    op.add_argument("--limit", type=int, help="a seeded random sample of this many mutants")
    op.add_argument("--seed", type=int, default=0, help="the sample's seed (a larger --limit "
                    "with the same seed adds mutants to the smaller sample)")
    op.add_argument("--match", nargs="+", metavar="TEXT",
                    help="only mutants whose 'file:line function original => mutant id' "
                    "contains one of these")
    op.add_argument("--list", action="store_true", help="print the mutants, run nothing")
    op.add_argument("--test-timeout", type=float, default=120.0,
                    help="seconds a test (or the sample's scoring) may run under a mutant "
                    "before it counts as failing")
    a = ap.parse_args(argv)
    if a.operators:
        if a.fields:
            ap.error("--operators takes no field names (use --files, --kinds, --match)")
        return main_operators(a, argv)
    known = train_fields() if a.train else FIELDS
    unknown = [f for f in a.fields if f not in known]
    if unknown:
        print(f"mutation.py: unknown field(s) {', '.join(unknown)}; see "
              + ("dse/perf/train_batch.py TrainBatch (kernel.KEY: its kernel parameters)"
                 if a.train else "dse/perf/batch.py FIELDS"), file=sys.stderr)
        return 2
    skip = TRAIN_NOT_PHYSICS if a.train else NOT_PHYSICS
    names = a.fields or [f for f in known if f not in skip]
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
    procs = [_start(todo[j::jobs], a.factor, a.fast, outs[j], hints, a.train)
             for j in range(jobs)] if todo else []
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
        write_table(Path(a.out), rows, names, argv, a.factor, a.fast, sorted(broken), state,
                    a.train)
    return 1 if missed or lost else 0
# --- operator mode: mutations of the model's formulas ---------------------------------------
#
# ``--operators``: every mutation site of the perf modules' formulas, found on their syntax tree
# (nothing here names a function or a line of them), is compiled into the live function's code
# object in the pytest session, its scores on a broad design sample compared with the unmutated
# ones, and, where they differ, the physics tests run until one fails.

PERF = ROOT / "dse" / "perf"
# the struct of arrays and the package's re-exports: bookkeeping, not formulas
OP_SKIP_FILES = {"__init__.py", "batch.py"}
KINDS = ("op", "drop", "minmax", "cmp", "round", "const", "sign")
# calls whose arguments (all: None, or these positions) are shapes, dtypes, keys or Python
# bookkeeping, never a term of the model
_SKIP_ARGS = {
    "range": None, "len": None, "enumerate": None, "zip": None, "isinstance": None,
    "getattr": None, "hasattr": None, "setattr": None, "print": None, "int": None, "str": None,
    "repr": None, 
    "zeros": None, "ones": None, "empty": None, "full": None, "arange": None, "reshape": None,
    "astype": None, "view": None, "stack": None, "shape": None, "ndim": None, "result_type": None,
    "dtype": None, "finfo": None, "iinfo": None, "item": None, "empty_like": None,
    "zeros_like": None, "ones_like": None, "full_like": None, "format": None, "join": None,
    "append": None, "index": None, "get": None, "setdefault": None, "pop": None,
    "bit_length": None, "array_equal": None, "broadcast_shapes": None, "take": None,
    "gather": None, "copy": None, "memo": {0}, "broadcast_to": {1}, "atleast_1d": None,
    "asarray": {1}, "as_floating": None, "KeyError": None, "ValueError": None,
}
_SKIP_KEYWORDS = {"dtype", "axis", "out", "shape", "copy", "chunk_rows", "key"}
_MINMAX = {"maximum": "minimum", "minimum": "maximum", "max": "min", "min": "max",
           "fmax": "fmin", "fmin": "fmax"}
_ROUND = {"ceil", "floor", "round", "rint", "trunc"}
_BINOP = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.BitAnd: "&",
          ast.BitOr: "|"}
_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
         ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd}
_CMP = {ast.Lt: (ast.LtE, ast.Gt), ast.LtE: (ast.Lt, ast.GtE), ast.Gt: (ast.GtE, ast.Lt),
        ast.GtE: (ast.Gt, ast.LtE)}
CONST_FACTOR = 1.2


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _number(node) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def _text(node, limit: int | None = None) -> str:
    s = ast.unparse(node)
    return s if limit is None or len(s) <= limit else s[:limit - 3] + "..."


class _Sites(ast.NodeVisitor):
    """Walks one module's tree: for each node a mutation may change, its mutants as
    ``(kind, replacement)`` (a node, or ``ast.Pass()`` for a dropped augmented assignment).
    Sites: the bodies of functions and methods, and module-level ``NAME = number`` constants;
    not docstrings, annotations, default values, decorators, class bodies, subscripts and
    slices, f-strings, asserts and raises, or the arguments of shape, dtype and bookkeeping
    calls (``_SKIP_ARGS``)."""

    def __init__(self):
        self.found = []          # (node, kind, replacement, top-level function qualname)
        self.scope: list = []    # enclosing class/function names
        self.top: str | None = None
        self.live = False

    # -- context -------------------------------------------------------------------------
    def visit_Module(self, node):
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
                self.visit(stmt)
            elif (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                  and isinstance(stmt.targets[0], ast.Name) and self._numeric(stmt.value)):
                self.top, self.live = f"<module>:{stmt.targets[0].id}", True
                self.visit(stmt.value)
                self.live = False

    @staticmethod
    def _numeric(expr) -> bool:
        return all(isinstance(n, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator,
                                  ast.unaryop, ast.expr_context)) for n in ast.walk(expr)) \
            and any(_number(n) for n in ast.walk(expr))

    def visit_ClassDef(self, node):
        self.scope.append(node.name)
        for stmt in node.body:             # methods only: a class body's fields are not formulas
            if isinstance(stmt, ast.FunctionDef):
                self.visit(stmt)
        self.scope.pop()

    def visit_FunctionDef(self, node):
        self.scope.append(node.name)
        outer = self.top is None or not self.live
        if outer:
            self.top, self.live = ".".join(self.scope), True
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]                # the docstring
        for stmt in body:
            self.visit(stmt)
        if outer:
            self.top, self.live = None, False
        self.scope.pop()

    def visit_Lambda(self, node):
        self.visit(node.body)              # (its argument defaults are not formulas)

    def visit_Subscript(self, node):
        self.visit(node.value)             # an index is bookkeeping

    def visit_Slice(self, node):
        pass

    def visit_JoinedStr(self, node):
        pass

    def visit_Assert(self, node):
        pass

    def visit_Raise(self, node):
        pass

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self.visit(node.value)

    def visit_Call(self, node):
        name = _call_name(node)
        skip = _SKIP_ARGS.get(name, ())
        if skip is None:
            return
        self._call_mutants(node, name)
        self.visit(node.func)
        for i, a in enumerate(node.args):
            if i not in skip:
                self.visit(a)
        for kw in node.keywords:
            if kw.arg not in _SKIP_KEYWORDS:
                self.visit(kw.value)

    # -- mutants -------------------------------------------------------------------------
    def _add(self, node, kind, new):
        if self.live:
            self.found.append((node, kind, new, self.top))

    def _call_mutants(self, node, name):
        if name in _MINMAX and len(node.args) == 2 and not node.keywords:
            func = node.func
            new_func = (ast.Attribute(value=func.value, attr=_MINMAX[name], ctx=ast.Load())
                        if isinstance(func, ast.Attribute) else ast.Name(_MINMAX[name], ast.Load()))
            self._add(node, "minmax", ast.Call(func=new_func, args=node.args, keywords=[]))
            for a in node.args:            # one side of the max (min) dropped
                self._add(node, "drop", a)
        elif name in _ROUND and len(node.args) == 1 and not node.keywords:
            self._add(node, "round", node.args[0])

    def visit_BinOp(self, node):
        op = type(node.op)
        if op in _SWAP and not any(isinstance(x, ast.Constant) and isinstance(x.value, str)
                                   for x in (node.left, node.right)):
            self._add(node, "op", ast.BinOp(left=node.left, op=_SWAP[op](), right=node.right))
            if op is ast.Add:              # a term of a sum dropped
                self._add(node, "drop", node.left)
                self._add(node, "drop", node.right)
            elif op in (ast.Sub, ast.Div):   # the subtrahend / the divisor dropped
                self._add(node, "drop", node.left)
            elif op is ast.Mult and not (_number(node.left) or _number(node.right)):
                self._add(node, "drop", node.left)     # a factor dropped (a constant
                self._add(node, "drop", node.right)    # factor: "const")
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        op = type(node.op)
        if op in _SWAP and not isinstance(node.value, (ast.JoinedStr, ast.Constant)):
            self._add(node, "op", ast.AugAssign(target=node.target, op=_SWAP[op](),
                                                value=node.value))
            if op in (ast.Add, ast.Sub, ast.Mult, ast.Div):
                self._add(node, "drop", ast.Pass())
        self.visit(node.value)

    def visit_UnaryOp(self, node):
        if isinstance(node.op, ast.USub) and not _number(node.operand):
            self._add(node, "sign", node.operand)
        self.generic_visit(node)

    def visit_Compare(self, node):
        if len(node.ops) == 1 and type(node.ops[0]) in _CMP and not any(
                isinstance(x, ast.Constant) and isinstance(x.value, str)
                for x in (node.left, *node.comparators)):
            for op in _CMP[type(node.ops[0])]:
                self._add(node, "cmp", ast.Compare(left=node.left, ops=[op()],
                                                   comparators=node.comparators))
        self.generic_visit(node)

    def visit_Constant(self, node):
        v = node.value
        if type(v) in (int, float) and v != 0 and 1e-5 <= abs(v) <= 1e20:
            self._add(node, "const", ast.Constant(v * CONST_FACTOR))


def _loc(node) -> tuple:
    return (type(node).__name__, node.lineno, node.col_offset, node.end_lineno,
            node.end_col_offset)


def enumerate_mutants(files=None, kinds=KINDS) -> list[dict]:
    """Every mutant of the perf modules (``files``: their names, default all but
    ``OP_SKIP_FILES``): dicts with ``id`` (stable over edits elsewhere in the file: the file,
    kind, texts and occurrence), ``file``, ``line``, ``func``, ``kind``, ``orig``, ``mutated``,
    ``loc`` and ``variant`` (which of the node's mutants)."""
    paths = sorted(PERF.glob("*.py"))
    names = [p.name for p in paths if p.name not in OP_SKIP_FILES] if not files else list(files)
    out = []
    for name in names:
        path = PERF / name
        if not path.exists():
            raise FileNotFoundError(f"no module {name} in dse/perf")
        v = _Sites()
        v.visit(ast.parse(path.read_text(), filename=str(path)))
        seen: dict = {}
        variant: dict = {}
        for node, kind, new, top in v.found:
            loc = _loc(node)
            variant[loc] = variant.get(loc, -1) + 1
            if kind not in kinds:
                continue
            orig = _text(node)
            mutated = "(statement dropped)" if isinstance(new, ast.Pass) else _text(new)
            if orig == mutated:
                continue
            if isinstance(new, ast.AugAssign) or isinstance(new, ast.Pass):
                orig = _text(node).strip()
            base = f"{name}|{kind}|{orig}|{mutated}"
            seen[base] = seen.get(base, -1) + 1
            key = f"{base}|{seen[base]}"
            out.append({"id": hashlib.sha1(key.encode()).hexdigest()[:10], "file": name,
                        "line": node.lineno, "func": top, "kind": kind, "orig": orig,
                        "mutated": mutated, "loc": loc, "variant": variant[loc]})
    return out


class _Replace(ast.NodeTransformer):
    """Replaces one node (by identity) of a tree."""

    def __init__(self, target, new):
        self.target, self.new = target, new

    def visit(self, node):
        return self.new if node is self.target else super().visit(node)


def mutated_code(m: dict):
    """The module's tree and code object with mutant ``m`` applied."""
    path = PERF / m["file"]
    tree = ast.parse(path.read_text(), filename=str(path))
    v = _Sites()
    v.visit(tree)                      # the same walk as the enumeration: the same order
    own = [f for f in v.found if _loc(f[0]) == tuple(m["loc"])]
    if len(own) <= m["variant"]:
        raise LookupError(f"site {m['id']} ({m['file']}:{m['line']}) not found")
    node, _, new, _ = own[m["variant"]]
    tree = ast.fix_missing_locations(_Replace(node, new).visit(tree))
    return tree, compile(tree, str(path), "exec")


def default_files(train: bool = False) -> list[str]:
    """The perf modules operator mode mutates by default: the training model's
    (``train_*.py``) with ``--train``, else the serving model's (all others but
    ``OP_SKIP_FILES``)."""
    names = sorted(p.name for p in PERF.glob("*.py") if p.name not in OP_SKIP_FILES)
    return [n for n in names if n.startswith("train_") == train]


def mutant_by_id(mid: str) -> dict:
    """The mutant of that id (``--list`` prints them)."""
    for m in enumerate_mutants():
        if m["id"] == mid:
            return m
    raise KeyError(f"no mutant {mid} in dse/perf (python tests/mutation.py --operators --list)")


def _live_functions(mod) -> dict:
    """{code qualname: function object} of a module's functions and its classes' methods
    (decorated ones through ``__wrapped__``)."""
    out = {}

    def add(f):
        while f is not None:
            if isinstance(f, (staticmethod, classmethod)):
                f = f.__func__
            code = getattr(f, "__code__", None)
            if code is not None and code.co_filename == mod.__file__:
                out.setdefault(code.co_qualname, f)
            f = getattr(f, "__wrapped__", None)

    for v in list(vars(mod).values()):
        if isinstance(v, type) and v.__module__ == mod.__name__:
            for a in vars(v).values():
                if isinstance(a, property):
                    for f in (a.fget, a.fset):
                        add(f)
                elif isinstance(a, functools.cached_property):
                    add(a.func)
                else:
                    add(a)
        else:
            add(v)
    return out


def _find_code(code, qualname):
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            if c.co_qualname == qualname:
                return c
            found = _find_code(c, qualname)
            if found is not None:
                return found
    return None


def apply_mutant(m: dict):
    """Puts mutant ``m`` into the live modules: the code object of the function that holds the
    site (the outermost def: nested functions and lambdas are its constants) is replaced in
    place, so every reference to the function (``from ... import``) runs the mutant; a
    module-level constant is rebound in every ``dse`` module that imported it, and the defaults
    that name it are re-evaluated. Returns the undo."""
    import importlib

    mod = importlib.import_module(f"dse.perf.{m['file'][:-3]}")
    tree, code = mutated_code(m)
    func = m["func"]
    if not func.startswith("<module>:"):
        f = _live_functions(mod).get(func)
        new = _find_code(code, func)
        if f is None or new is None:
            raise LookupError(f"function {func} of {m['file']} not found")
        old = f.__code__
        f.__code__ = new

        def undo():
            f.__code__ = old
        return undo
    # a module-level constant: its mutated value, rebound wherever it was imported and in
    # the defaults of its module's functions that hold it
    name = func.split(":", 1)[1]
    assign = next(s for s in tree.body if isinstance(s, ast.Assign)
                  and isinstance(s.targets[0], ast.Name) and s.targets[0].id == name)
    old = vars(mod)[name]
    value = eval(compile(ast.Expression(assign.value), str(PERF / m["file"]), "eval"),
                 vars(mod))
    undo_list = []
    for other in [x for k, x in list(sys.modules.items()) if k == "dse" or k.startswith("dse.")]:
        if vars(other).get(name, None) is old:
            setattr(other, name, value)
            undo_list.append((other, name, old))
    for f in _live_functions(mod).values():
        d = f.__defaults__
        if d and any(x is old for x in d):
            f.__defaults__ = tuple(value if x is old else x for x in d)
            undo_list.append((f, "__defaults__", d))

    def undo():
        for obj, attr, v in undo_list:
            setattr(obj, attr, v)
    return undo


# --- operator mode: the design sample that judges equivalence ---------------------------------

def sample_frames(n: int = 1200, seed: int = 0) -> dict:
    """Designs (dotted columns) that reach every mechanism of the scorer: the mixed designs of
    tests/test_builder_equivalence.py (every accelerator and model, dtypes, runtimes,
    topologies, layouts, phases, cost modes, overrides, per-op dtypes, expert imbalance,
    prompt-length spread, a KV tier) and, on a share of their continuous-batching rows, prefix
    hits with output-length spread, a fleet demand and small prefill chunks; the KV offload
    tiers; request rates and SLOs; disaggregated pools (also at a rate); speculative decoding
    (MTP, a draft model); a recipe's stream interval; 2D tp and the KV split by
    sequence (dse.perf.tp2d)."""
    from dse import catalog
    from test_builder_equivalence import mixed_designs
    rng = np.random.default_rng(seed)
    base = mixed_designs(n, seed)
    frames = {"mixed": base}
    both = base[base["workload.phase"] == "both"].reset_index(drop=True)

    def pick(k):
        return both.iloc[rng.choice(len(both), min(k, len(both)), replace=False)] \
            .reset_index(drop=True).copy()
    k = max(n // 8, 20)
    f = pick(k)
    f["workload.prefix_hit_fraction"] = rng.choice([0.0, 0.3, 0.8], len(f))
    f["workload.osl_cv"] = rng.choice([0.0, 0.5, 1.2], len(f))
    f["workload.demand_output_tokens_per_s"] = rng.choice([0.0, 1e4, 1e6], len(f))
    f["serving.max_num_tokens"] = rng.choice([512, 2048, 8192], len(f))
    frames["prefix, lengths, demand"] = f
    f = pick(k)
    f["serving.kv_offload"] = rng.choice(["host", "ssd"], len(f))
    f["workload.prefix_hit_fraction"] = rng.choice([0.3, 0.7], len(f))
    f["workload.cached_conversations"] = rng.choice([16, 256, 4096], len(f))
    frames["kv tier"] = f
    f = pick(k // 2).drop(columns=["workload.concurrency"])
    f["workload.request_rate_per_s"] = rng.choice([0.2, 2.0, 20.0], len(f))
    f["workload.ttft_slo_s"] = rng.choice([0.0, 0.5, 3.0], len(f))
    f["workload.tpot_slo_s"] = rng.choice([0.0, 0.03, 0.2], len(f))
    frames["rate"] = f
    f = pick(k // 2)
    f["workload.ttft_slo_s"] = rng.choice([0.5, 3.0], len(f))
    f["workload.tpot_slo_s"] = rng.choice([0.0, 0.05], len(f))
    frames["slo"] = f
    f = pick(k)
    f["serving.mode"] = "disaggregated"
    f["layout.prefill_tp"] = rng.choice([1, 2, 4, 8], len(f))
    f["layout.prefill_dp"] = rng.choice([1, 2], len(f))
    f["layout.prefill_ep"] = np.where(f["layout.ep"] > 1,
                                      f["layout.prefill_tp"] * f["layout.prefill_dp"], 1)
    f["workload.prefill_concurrency"] = rng.choice([1, 4, 16], len(f))
    f["serving.prefill_chip_ratio"] = rng.choice([0.0, 0.0, 0.5, 2.0], len(f))
    frames["disaggregated"] = f
    g = f.iloc[: k // 2].drop(columns=["workload.concurrency"]).copy()
    g["workload.request_rate_per_s"] = rng.choice([0.5, 5.0], len(g))
    g["workload.ttft_slo_s"] = rng.choice([0.0, 2.0], len(g))
    frames["disaggregated at a rate"] = g
    f = pick(k)
    mtp = f["model.id"].map(lambda m: catalog.models()[m].num_nextn_predict_layers > 0)
    f["serving.spec_tokens"] = rng.choice([1, 2, 3], len(f))
    f["serving.spec_method"] = np.where(mtp, "mtp", "draft")
    f["serving.spec_draft_model"] = np.where(mtp, "", "llama-3.1-8b")
    f["serving.spec_acceptance"] = np.where(rng.random(len(f)) < 0.5,
                                            rng.uniform(0.5, 0.9, len(f)), np.nan)
    frames["speculative decoding"] = f
    frames["mtp alone"] = f[mtp.to_numpy()].reset_index(drop=True)   # (a batch with no draft
    # model takes spec.draft_s' MTP-only path)
    f = pick(k // 2)                  # a recipe's stream interval: the front end's chunks
    f["serving.stream_interval"] = rng.choice([1, 10, 20], len(f))
    frames["stream interval"] = f
    f = pick(k // 2)                  # 2D weight-stationary tp and the KV split by sequence
    dense = f["model.id"].map(lambda m: catalog.models()[m].num_experts == 0)
    f["layout.dp"] = np.where(dense, 1, f["layout.dp"])       # (2D tp: dense models, dp 1)
    f["layout.tp_x"] = np.where(dense & (f["layout.tp"] >= 4), rng.choice([1, 2], len(f)), 1)
    f["layout.kv_sharding"] = rng.choice(["heads", "batch"], len(f))
    frames["tp 2d, kv by sequence"] = f
    return frames


# --train: training cases whose candidate layouts reach every mechanism of the training model
# (blank columns expand to every valid value: tp, pp, cp, dp, ep, micro-batch, recompute
# none/selective/full on a share of the layers, vp); columns of dse.scoring.train_cases
_TRAIN_COLUMNS = ("case_id", "model", "hardware", "topology", "num_chips", "tp", "pp", "dp", "ep",
                  "cp", "vp", "zero_stage", "global_batch_seqs", "micro_batch_seqs", "seq_len",
                  "precision", "recompute", "pipeline_schedule", "sequence_parallel",
                  "mtp_layers")
TRAIN_SAMPLE = (
    # dense GQA, one HGX node, fp8, ZeRO 0, every tp/pp/cp/micro-batch/recompute
    ("dense-fp8-z0", "llama-3.1-8b", "h100-sxm", "", 8, "", "", "", "", "", "", 0, 32, "", 8192,
     "fp8", "", "1f1b", "", ""),
    # interleaved 1F1B across 8 nodes, bf16, ZeRO 1, sequence parallel, every vp
    ("dense-interleaved-z1", "llama-3.1-70b", "h100-sxm", "", 64, 4, 4, 4, "", 1, "", 1, 64, 1,
     4096, "bf16", "", "interleaved", "true", ""),
    # dense, zero-bubble schedule, ZeRO 2, context parallelism on a long sequence
    ("dense-cp-zb-z2", "llama-3.1-8b", "h200-sxm", "", 16, 2, 2, "", "", "", "", 2, 16, 1,
     32768, "bf16", "", "zero_bubble", "", ""),
    # tied, non-gated MHA, fp16 without native fp8 (A100), ZeRO 3 over two domains
    ("tied-fp8-not-native-z3", "mpt-7b", "a100-sxm-40g", "", 16, 1, 1, 16, "", 1, "", 3, 64, "",
     2048, "fp8", "", "", "", ""),
    ("tied-fp16-z3", "mpt-7b", "a100-sxm-80g", "", 16, 1, 1, 16, "", 1, "", 3, 64, "",
     2048, "fp16", "", "", "", ""),
    # MoE with expert parallelism (every ep), fp8 blockwise, ZeRO 1
    ("moe-ep-fp8block-z1", "qwen3-30b-a3b", "h100-sxm", "", 16, "", 2, "", "", 1, "", 1, 128, "",
     4096, "fp8_block", "", "", "", ""),
    # MoE, bf16, ep beyond one domain, ZeRO 2, no sequence parallelism
    ("moe-ep-wide-z2", "gpt-oss-120b", "h100-sxm", "", 64, 1, 4, 16, "", 1, "", 2, 512, 4, 4096,
     "bf16", "none", "", "false", ""),
    # MLA, MTP, DualPipe, MXFP8 on Blackwell, ZeRO 1
    ("mla-mtp-dualpipe", "deepseek-v3", "b200", "", 256, 1, 8, 32, "", 1, "", 1, 1024, 1, 4096,
     "mxfp8", "", "dualpipe", "", 1),
    # MoE with shared experts (Llama 4 Scout), NVFP4, ZeRO 3, context parallelism
    ("moe-shared-nvfp4-z3", "llama-4-scout", "b200", "", 32, 2, 2, "", "", "", "", 3, 64, 1,
     16384, "nvfp4", "selective", "1f1b", "true", ""),
    # tp without sequence parallelism, DualPipe with fewer micro-batches than stages, an MTP
    # module on a dense model, ZeRO 0
    ("dense-tp-nosp-dualpipe-mtp", "llama-3.1-70b", "h100-sxm", "", 32, 4, 4, 2, "", 1, "", 0,
     4, 1, 4096, "bf16", "", "dualpipe", "false", 1),
    # MoE over tp without sequence parallelism
    ("moe-tp-nosp", "mixtral-8x7b", "h100-sxm", "", 16, 2, 1, 8, "", 1, "", 1, 64, 1, 4096,
     "bf16", "none", "", "false", ""),
    # MLA split over tp, interleaved
    ("mla-tp-interleaved", "kimi-k2", "b200", "", 64, 2, 4, 8, "", 1, "", 1, 64, 1, 4096, "fp8",
     "selective", "interleaved", "", ""),
)


def train_sample(rows_per_case: int = 60, seed: int = 0) -> dict:
    """{case: TrainBatch} of training designs reaching every mechanism of the training model
    (``TRAIN_SAMPLE``: dense and MoE, GQA and MLA (with and without a query LoRA), EP within
    and across domains, CP, ZeRO 0-3, recompute none/selective/full on a share of the layers,
    the four pipeline schedules, tp with and without sequence parallelism, bf16, fp16, fp8,
    blockwise fp8, MXFP8, NVFP4, a precision without native support, MTP on dense and MoE
    models, tied embeddings), from the in-repo catalog: a seeded sample of each case's
    candidate layouts."""
    import pandas as pd

    from dse.scoring.train_cases import check_columns, parse
    from dse.scoring.train_layouts import candidates
    from dse.scoring.train_predict import build, resolve_case
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(list(TRAIN_SAMPLE), columns=list(_TRAIN_COLUMNS)).astype(object)
    df = df.map(lambda x: np.nan if x == "" else str(x))            # as read from a CSV
    check_columns(df, "train_sample")
    p = parse(df, "train_sample")
    resolved = [resolve_case(df, i, p, "train_sample") for i in range(len(df))]
    layouts = candidates(df, p, resolved, "train_sample")
    keep = []
    for i in range(len(df)):
        rows = np.flatnonzero(layouts["_case"].to_numpy() == i)
        keep.extend(np.sort(rng.choice(rows, min(rows_per_case, len(rows)), replace=False)))
    layouts = layouts.iloc[keep].reset_index(drop=True)
    every = build(resolved, layouts, {k: p[k] for k in (
        "global_batch_seqs", "seq_len", "precision", "mtp_layers")})
    case = layouts["_case"].to_numpy()
    # each case alone (a batch of one kind of model skips the terms it does not need) and all
    # of them in one batch, as ``dse predict --train`` scores them
    out = {name: every.take(np.flatnonzero(case == i))
           for i, name in enumerate(df["case_id"])}
    # MLA without a query LoRA (DeepSeek-V2-Lite's shape; no catalog model has it)
    out["mla-no-q-lora"] = out["mla-tp-interleaved"].replace(q_lora_rank=0.0)
    out["every case"] = every
    # the job's software switches, blank above (Megatron-Core's defaults): each drawn row by row
    # (both sides of every switch's np.where in one batch), each case alone and all together
    r = np.random.default_rng(seed + 1)
    n = len(every.tp)

    def draw(*values, size=n):
        return r.choice(np.asarray(values, float), size)
    switched = every.replace(
        tp_comm_overlap=draw(0, 1, 2), overlap_p2p_comm=draw(0, 1),
        overlap_grad_reduce=draw(0, 1), p2p_scatter_gather=draw(0, 1),
        cp_comm_type=draw(0, 1, 2), recompute_norms=draw(0, 1), recompute_moe_act=draw(0, 1),
        moe_router_force_load_balancing=draw(0, 1), attention_unfused=draw(0, 0, 1),
        attention_fwd_rate=draw(1.0, 0.7), attention_bwd_rate=draw(1.0, 0.6))
    for i, name in enumerate(df["case_id"]):
        out[name + " | switches"] = switched.take(np.flatnonzero(case == i))
    out["every case | switches"] = switched
    # MLA under context parallelism (the catalog cases run it at cp 1), each exchange
    mla = out["mla-tp-interleaved"]
    out["mla-cp | switches"] = mla.replace(cp=np.full(len(mla.tp), 2.0), cp_comm_type=draw(0, 1, 2, size=len(mla.tp)))
    # GQA under context parallelism with tp filling the domain and past it (more tp ranks than
    # key/value heads), each exchange; ZeRO-3 under DualPipe
    gqa = out["dense-cp-zb-z2"]
    out["gqa-cp-wide-tp | switches"] = gqa.replace(
        tp=draw(8, 16, size=len(gqa.tp)), cp=np.full(len(gqa.tp), 2.0), cp_comm_type=draw(0, 1, 2, size=len(gqa.tp)))
    # a 72-chip domain (NVL72) at tp 16: 4.5 tp groups a domain, 4 whole, under cp 8
    out["nvl72-tp16-cp8 | switches"] = gqa.replace(
        domain_chips=np.full(len(gqa.tp), 72.0), tp=np.full(len(gqa.tp), 16.0),
        cp=np.full(len(gqa.tp), 8.0), cp_comm_type=draw(0, 1, 2, size=len(gqa.tp)))
    dual = out["mla-mtp-dualpipe"]
    out["dualpipe-zero3"] = dual.replace(zero_stage=np.full(len(dual.tp), 3.0))
    # layouts breaking each rule of train_layout.layout_bits, and on its boundaries (pp = the
    # layers, pp vp = the layers, 2 pp micro-batches under DualPipe, a2a head splits): judged
    # by their bits and reasons only (an invalid layout's numbers are never shown)
    k = 600
    src = every.take(r.integers(0, n, k))
    layers = src.num_layers
    pp = np.where(r.random(k) < 0.25, layers, np.where(r.random(k) < 0.1, layers + 1,
                                                       draw(1, 2, 3, 4, 8, size=k)))
    vp = np.where(r.random(k) < 0.2, np.maximum(np.floor(layers / pp), 1.0),
                  draw(1, 1, 2, 3, size=k))
    dp, mb = draw(1, 2, 3, 4, 8, 1.5, size=k), draw(1, 2, 3, size=k)
    gbs = np.where(r.random(k) < 0.3, 2.0 * pp * dp * mb, draw(16, 24, 64, 96, 1000, size=k))
    out["layouts | rules"] = src.replace(
        tp=draw(1, 2, 3, 4, 8, 16, 128, size=k), pp=pp, vp=vp, dp=dp, micro_batch_seqs=mb,
        global_batch_seqs=gbs, ep=draw(1, 2, 3, 8, 16, 64, 128, size=k),
        cp=draw(1, 1, 2, 3, 4, 8, size=k), seq_len=draw(4096, 4097, 4098, 6000, size=k),
        schedule=draw(0, 1, 2, 3, size=k), cp_comm_type=draw(0, 1, 1, size=k))
    return out


# Why each mutant the training sample finds equivalent changes no number (by mutant id; the
# table prints the reason, and a new equivalent without one is listed as such)
TRAIN_EQUIVALENT_WHY = {
    "a guard against 0/0 where a model or layout lacks the feature: wherever its value is "
    "used it is an integer count of at least 2 (or the row is masked out)": (
        "8e12648600", "b008b8043e", "8ed1e54fcf", "7be7404c33", "528e1f7236",
        "e519cd0b86", "d976343bd2", "1a47d1b2eb",
        "c80c9200a2", "091874803f", "5edf9ac5c3", "e424cacde5", "dcceb9bc66",
        "67b61eaa0d", "22165af7aa", "c510136b28", "6b42716a2c", "758f38f607",
        "ce9ea05e8a", "90867a6596", "e2017b4bb6", "a2e41fc20d",
        "1e910fd9d5",
        # max(experts, 1), max(num_layers, 1), max(expert_ffn, 1) (MoE rows: E >= 8,
        # f_e > 0; every model: L >= 16)
        "95d5d97924", "ee53b0b021", "a5d13bae4b", "eedcad9df7", "94c207e8a6", "473a386f54",
        "3b8db15f38", "f989e80fb4", "1b7cfa73dc",
        # max(num_layers, 1) in layer_linears, max(ep, 1) in moe_sort_s (ep >= 1),
        # max(experts, 1) in ep_comm_s (read on MoE rows only)
        "8f8ab9ab92", "30df405b63", "4ffe595c74"),
    "layout degrees are integers (> 1 and > 1.2 agree) and a collective over one rank costs 0 "
    "in the kernel model already (its (g - 1) factors, its latency masked)": (
        "414bc1afaf",   # pp_comm_s: pp > 1 and pp > 1.2 agree
        "5367de5fbb", "3fe0a3161c", "62a997821f", "99b9f9f8e4", "b1cb0a16cd",
        "a9049d6720", "2bd6a89842", "9efb79196e", "d23e022b8f", "1ff7ad8428", "e490ff44bf",
        # bad_a2a's cp > 1, layout_bits' vp > 1 and cp > 1, dp_comm_s' dp cp > 1,
        # pp_comm_s' pp > 1, moe_sort_s' ep > 1 and local experts > 1 (E / ep: ep divides E)
        "8d244cbbdb", "cdf032f4aa", "4a0fe8abe7", "c61dfa8b78", "3c184b184c", "c37075e293",
        "2a67ba8596"),
    "the mask only repeats what the term's inputs imply: a dense row's MoE terms are weighted "
    "by its MoE share 0 (expert widths 0, ep 1, where the busiest-rank imbalance is 1), a row "
    "without a sliding window has no local layers, and `if np.any(...)` only skips work": (
        "db20c48977", "f6e658a810", "39857f74d8", "73e33436e9",
        "564c6250b6", "48cd523420", "0bd089a67e",
        "90ff896249", "a4a5d1c83f", "717b8237e4", "dda9df9696", "f29c62abf1", "f6dfd6fb00",
        "d919125001"),
    "the KV heads only size the attention core's HBM bytes, and at training sequence lengths "
    "the core is compute-bound (tests/test_train_terms_kernels.py pins the bytes at a low HBM "
    "fraction)": (
        "9aa52010b8", "e3930c6c62", "e76fe12e9e", "733ec87c22", "7202d43dca", "ab490dd502"),
    "every catalog MLA model has head_dim = qk_nope_head_dim + qk_rope_head_dim (192) and "
    "num_key_value_heads = num_attention_heads (DeepSeek-V3 128, Kimi K2 64): the MLA and "
    "GQA readings agree": ("b36178eaa3", "9c1f8a9edb"),
    "a factor equal to 1 (CAST_BYTES, FP8_COPY_BYTES; the constant's own mutant is caught)": (
        "a90dbd3f29", "31f38e8dce", "69d1f41615", "51ee2ff8f9"),
    "first_max keeps the first of two parts on an exact tie; the step time is the same either "
    "way and no design of the sample ties to the bit (only the bound's label could differ)": (
        "905131e29c",),
    "no design's memory equals its HBM capacity exactly (tests/test_train_terms_step.py pins "
    "the boundary)": ("aa0ef2f211",),
    "kernel_comm.alltoall_bytes clamps the ranks per node to the group itself": (
        "d54dc06521",),
    "layout_bits casts the sum to int64, which drops the 0.2, 0.4 or 0.8 a 0/1 rule flag times "
    "1.2, 2.4 or 4.8 adds (every other bit is a whole power of 2; "
    "tests/test_train_terms_layout_rules.py pins each bit)": (
        "6b2007cabe", "d6c4573e36", "340b667eed"),
    "a2a_splits' first test (tp cp divides the heads) follows from its second wherever "
    "bad_a2a reads it (cp > 1): there the key/value heads a tp rank, at least 1, are a "
    "multiple of cp, so kv_heads is a multiple of tp cp, and so are the heads (a multiple of "
    "kv_heads; MLA's key/value heads are its heads); a fraction of a head a rank (kv_heads < tp: 1, or 1.2) is never a "
    "multiple of cp >= 2 either way": (
        "c1e613c772", "d52874ecb1", "e7c71076d0", "e16814dc2c", "9fc2ca0a31"),
    "every local expert is touched at training token counts (1 - (1 - k/E)^T is 1 to double "
    "precision for the thousands of tokens a chip dispatches), so the group's tokens without "
    "sequence parallelism only matter at a handful of tokens "
    "(tests/test_train_terms_gaps.py pins 16)": ("3bb39269c2", "aa1bd946c5"),
}

_WHY = {i: why for why, ids in TRAIN_EQUIVALENT_WHY.items() for i in ids}


def _train_group_scores(name: str, b) -> dict:
    """Everything the training scorer returns for one case of the sample, its micro-batch
    parts, and the memory with the 2022 attention kernels (``flash=0``: the score matrix)."""
    from dse.perf.train_batch import TrainBatch
    from dse.perf.train_layout import layout_bits, layout_text
    from dse.perf.train_memory import memory_bytes
    from dse.perf.train_step import micro_batch_parts, score_train
    out = {}
    # the batch's cached properties (ep_imbalance, operand_bytes) computed again: a mutant of
    # their code changes them, and the tracer sees their lines
    for k, v in vars(TrainBatch).items():
        if isinstance(v, functools.cached_property):
            b.__dict__.pop(k, None)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if name.startswith("layouts"):
            bits = layout_bits(b)
            return {"layout_bits": bits, "reason": np.array([layout_text(x) for x in bits])}
        for k, v in score_train(b).items():
            out[k] = np.asarray(v)
        for k, v in micro_batch_parts(b).items():
            out[("parts", k)] = np.asarray(v)
        for k, v in memory_bytes(b, flash=0.0).items():
            out[("flash=0", k)] = np.asarray(v)
    return out


def _group_scores(name: str, b) -> dict:
    """Everything the scorer returns for one group of the sample: every metric, the per-op
    breakdown, and (the mixed designs) the float32 chunked scoring of the search."""
    from dse.perf import score
    from dse.perf.serve import score_chunked
    out = {}
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m, bd = score(b, breakdown=True)
        for k, v in m.items():
            out[k] = np.asarray(v)
        for step_name in ("decode", "mixed", "prefill"):
            st = getattr(bd, step_name)
            for f in ("compute_s", "memory_s", "network_s", "op_s", "overhead_s", "total_s",
                      "flops", "hbm_bytes", "net_bytes"):
                out[(step_name, f)] = np.asarray(getattr(st, f))
        if name == "mixed":
            for k, v in score_chunked(b, chunk_rows=len(b) // 3 + 1, dtype=np.float32).items():
                out[("float32", k)] = np.asarray(v)
    return out


def _scores(batches: dict, group=_group_scores) -> dict:
    return {name: group(name, b) for name, b in batches.items()}


def _same(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for k, x in a.items():
        y = b[k]
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if not np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"):
            return False
    return True


def _unchanged(base: dict, batches: dict, group=_group_scores) -> bool:
    """Every group of the sample scores as ``base`` (stops at the first group that does not)."""
    return all(_same(base[name], group(name, b)) for name, b in batches.items())


def _executed_lines(batches: dict, group=_group_scores) -> set:
    """(file name, line) of the perf modules that scoring the sample executes (its batches'
    memoised values dropped first: a line that only computes one, such as the drafter's weights
    in ``memory_fit.weights_bytes``, runs only when the memo is empty)."""
    _clear_memos()
    perf = str(PERF.resolve())
    lines: set = set()

    def local(frame, event, arg):
        if event == "line":
            lines.add((Path(frame.f_code.co_filename).name, frame.f_lineno))
        return local

    def glob(frame, event, arg):
        if str(Path(frame.f_code.co_filename).resolve().parent) == perf:
            lines.add((Path(frame.f_code.co_filename).name, frame.f_lineno))
            return local
        return None

    sys.settrace(glob)
    try:
        _scores(batches, group)
    finally:
        sys.settrace(None)
    return lines


def _track_batches():
    """Every Batch built from now on is tracked (``_State.batches``), so that a mutant's run can
    drop their memoised values (set_mutation installs the hook; no field is mutated)."""
    set_mutation(None)


def _clear_memos():
    for b in list(_State.batches):
        b.__dict__["_memo"].clear()


class _Timeout(Exception):
    pass


def _alarm(seconds):
    def handler(signum, frame):
        raise _Timeout(f"over {seconds} s")
    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)


def _operators_loop(session):
    from dse.build.designs import resolve, to_batch
    mutants = json.loads(Path(os.environ["DSE_MUTATE_MUTANTS"]).read_text())
    out = Path(os.environ["DSE_MUTATE_OUT"])
    hints = json.loads(os.environ.get("DSE_MUTATE_HINTS", "{}"))
    limit_s = float(os.environ.get("DSE_MUTATE_TEST_TIMEOUT", "120"))
    items = [it for it in session.items if not it.nodeid.startswith(GOLDENS)]
    goldens = [it for it in session.items if it.nodeid.startswith(GOLDENS)]
    broken: set = set()
    recent: list = []                   # tests that caught a mutant lately, latest first
    _track_batches()                    # (before the sample: its memoised values are dropped too)
    train = os.environ.get("DSE_MUTATE_TASK") == "train"
    group = _train_group_scores if train else _group_scores
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batches = train_sample() if train else {k: to_batch(resolve(f))
                                                for k, f in sample_frames().items()}
    base = _scores(batches, group)
    reached = _executed_lines(batches, group)

    def failed(item, nxt) -> bool:
        _failed.clear()
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nxt)
        return bool(_failed)

    def first_failure(candidates, m):
        """The first of ``candidates`` that fails under the mutant and passes without it."""
        undo = apply_mutant(m)
        _clear_memos()
        try:
            for i, item in enumerate(candidates):
                if item.nodeid in broken:
                    continue
                _alarm(limit_s)
                try:
                    bad = failed(item, candidates[i + 1] if i + 1 < len(candidates) else None)
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                if not bad:
                    continue
                session._setupstate.teardown_exact(None)
                undo()
                _clear_memos()
                ok = not failed(item, None)
                if ok:
                    return item.nodeid
                broken.add(item.nodeid)
                undo = apply_mutant(m)
                _clear_memos()
            return None
        finally:
            undo()
            _clear_memos()
            session._setupstate.teardown_exact(None)

    for m in mutants:
        t0 = time.process_time()
        rec = {"id": m["id"], "caught": None, "golden": None, "status": None, "note": ""}
        t_eq = 0.0
        lines = set(range(m["loc"][1], m["loc"][3] + 1))
        # (a module-level constant's line runs at import only: its uses decide, so it is
        # judged by the sample's numbers)
        if not m["func"].startswith("<module>:") and not any((m["file"], ln) in reached
                                                              for ln in lines):
            rec["status"] = "unreachable"
        else:
            try:
                undo = apply_mutant(m)
            except Exception as e:             # noqa: BLE001 (a mutant Python refuses)
                rec.update(status="invalid", note=f"{type(e).__name__}: {e}"[:200])
                undo = None
            if undo is not None:
                _clear_memos()
                try:
                    _alarm(limit_s)
                    same = _unchanged(base, batches, group)
                except Exception as e:         # noqa: BLE001 (the mutant breaks the scorer)
                    same, rec["note"] = False, f"scorer raises {type(e).__name__}"
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                    undo()
                    _clear_memos()
                    t_eq = time.process_time() - t0
                if same:
                    rec["status"] = "equivalent"
                else:
                    # the test that caught it last time, those that caught the latest mutants,
                    # then the list (fastest-catching first)
                    first = [hints.get(m["id"]), *recent]
                    order = sorted(items, key=lambda it: (first.index(it.nodeid)
                                                          if it.nodeid in first else len(first)))
                    rec["caught"] = first_failure(order, m)
                    if rec["caught"]:
                        rec["status"] = "caught"
                        if rec["caught"] in recent:
                            recent.remove(rec["caught"])
                        recent.insert(0, rec["caught"])
                        del recent[30:]
                    else:
                        rec["golden"] = first_failure(goldens, m)
                        rec["status"] = "golden only" if rec["golden"] else "not caught"
        rec["broken"] = sorted(broken)
        rec["cpu_s"] = time.process_time() - t0
        rec["eq_cpu_s"] = t_eq
        with out.open("a") as f:
            f.write(json.dumps(rec) + "\n")


def _cell(s: str, limit: int = 90) -> str:
    s = s if len(s) <= limit else s[:limit - 3] + "..."
    return "`" + s.replace("|", "\\|") + "`"


def _split_row(line: str) -> list:
    cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [c.strip() for c in cells]


def read_operator_table(path: Path) -> dict:
    """{mutant id: catching physics test} of a table ``--operators --out`` wrote."""
    out = {}
    for line in path.read_text().splitlines():
        if not line.startswith("| `"):
            continue
        cells = _split_row(line)
        if len(cells) == 6 and cells[5].startswith("tests/"):
            out[cells[0].strip("`")] = cells[5].split()[0]
    return out


def operator_summary(mutants: list, rows: dict) -> dict:
    count = {s: 0 for s in ("unreachable", "equivalent", "invalid", "caught", "golden only",
                            "not caught", "not run")}
    for m in mutants:
        r = rows.get(m["id"])
        count[r["status"] if r else "not run"] += 1
    return count


def write_operator_table(path: Path, mutants: list, rows: dict, argv: list, population: int,
                         files: list, fast: bool, broken: list, n_designs: int,
                         state: Path | None = None, train: bool = False) -> None:
    c = operator_summary(mutants, rows)
    live = len(mutants) - c["unreachable"] - c["equivalent"] - c["invalid"] - c["not run"]
    sample = (f"a seeded sample of {len(mutants)} of the {population} mutants"
              if len(mutants) < population else f"all {population} mutants")
    lines = ["# Mutation check of the " + ("training model's tests: its formulas" if train
                                           else "physics tests: the model's formulas"), "",
             f"Generated {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC by",
             "", "    python tests/mutation.py " + shlex.join(argv), "",
             f"Operator and term mutations of `dse/perf/` ({', '.join(files)}): {sample} "
             f"(kinds: {', '.join(sorted({m['kind'] for m in mutants}))}). A mutant that no "
             f"scored number changes on the sample ({n_designs} designs reaching every "
             "mechanism: " + ("`train_sample`, each case alone and all in one batch, again "
                              "with the software switches drawn row by row, and layouts "
                              "breaking each layout rule (judged by their bits): the "
                              "training scorer's metrics, micro-batch parts and memory with and "
                              "without flash attention"
                              if train else "`sample_frames`")
             + ") is equivalent (or, on a line that scoring the sample "
             "never runs, unreachable) and is not counted against the tests; each other one "
             + ("runs the training tests (`TRAIN_TESTS`; the training model has no goldens) "
                "until one fails"
                + (" (`--fast`: the subprocess and search-run tests left out)" if fast else "")
                + "." if train else
                "runs the physics tests (not the goldens) until one fails"
                + (" (`--fast`: the slow invariant properties left out)" if fast else "")
                + ", and those it passes run `tests/test_goldens.py`."), "",
             f"**{len(mutants)} mutants: {c['unreachable']} unreachable, {c['equivalent']} "
             f"equivalent, {c['invalid']} invalid; of the {live} others {c['caught']} caught by "
             f"a physics test, {c['golden only']} only by the goldens, {c['not caught']} by "
             "nothing" + (f"; {c['not run']} not run" if c["not run"] else "") + ".**", ""]
    if state:
        lines += [f"Results from `--state {state}`, kept by the resumed runs of this check "
                  "(each mutant ran once, against the tests present then).", ""]
    if broken:
        lines += ["Left out (failing without a mutation): " + ", ".join(broken), ""]
    lines += ["| file | mutants | unreachable | equivalent | physics test | goldens only | "
              "nothing |", "|---|---|---|---|---|---|---|"]
    for f in files:
        ms = [m for m in mutants if m["file"] == f]
        if ms:
            k = operator_summary(ms, rows)
            lines.append(f"| {f} | {len(ms)} | {k['unreachable']} | {k['equivalent']} | "
                         f"{k['caught']} | {k['golden only']} | {k['not caught']} |")
    head = ["| id | site | kind | original | mutant | result |", "|---|---|---|---|---|---|"]

    def row(m):
        r = rows.get(m["id"])
        if r is None:
            res = "not run"
        elif r["status"] == "caught":
            res = r["caught"]
        elif r["status"] == "golden only":
            res = "goldens only: " + r["golden"]
        elif r["status"] == "not caught":
            res = "**NOT CAUGHT**"
        else:
            res = r["status"] + (f" ({r['note']})" if r.get("note") else "")
            if train and r["status"] == "equivalent":
                res += f": {_WHY[m['id']]}" if m["id"] in _WHY else ": **no reason given**"
        if r and r["status"] == "caught" and r.get("note"):
            res += f" ({r['note']})"
        return (f"| `{m['id']}` | {m['file']}:{m['line']} {m['func']} | {m['kind']} | "
                f"{_cell(m['orig'])} | {_cell(m['mutated'])} | {res} |")

    for title, status in (("Not caught by a physics test", ("golden only", "not caught")),
                          ("Caught by a physics test", ("caught",)),
                          ("Equivalent, unreachable or invalid",
                           ("equivalent", "unreachable", "invalid")),
                          ("Not run", (None,))):
        sel = [m for m in mutants if (rows[m["id"]]["status"] if m["id"] in rows else None)
               in status]
        if sel:
            lines += ["", f"## {title} ({len(sel)})", "", *head, *map(row, sel)]
    path.write_text("\n".join(lines) + "\n")


def _start_operators(mutants, fast, out, hints, timeout_s, train=False):
    tmp = out.with_suffix(".mutants.json")
    tmp.write_text(json.dumps(mutants))
    return _pytest_worker({
        "DSE_MUTATE_MODE": "operators", "DSE_MUTATE_MUTANTS": str(tmp),
        "DSE_MUTATE_HINTS": json.dumps({m["id"]: hints[m["id"]] for m in mutants
                                     if m["id"] in hints}),
        "DSE_MUTATE_OUT": str(out), "DSE_MUTATE_TEST_TIMEOUT": str(timeout_s)},
        TRAIN_TESTS if train else [*TESTS, GOLDENS], fast, train)


def main_operators(a, argv) -> int:
    files = a.files or default_files(a.train)
    kinds = tuple(a.kinds.split(",")) if a.kinds else KINDS
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        print(f"mutation.py: unknown kind(s) {', '.join(bad)}; kinds: {', '.join(KINDS)}",
              file=sys.stderr)
        return 2
    try:
        population = enumerate_mutants(files, kinds)
    except FileNotFoundError as e:
        print(f"mutation.py: {e}", file=sys.stderr)
        return 2
    sel = population
    if a.match:
        sel = [m for m in sel if any(s in f"{m['file']}:{m['line']} {m['func']} {m['orig']} "
                                     f"=> {m['mutated']} {m['id']}" for s in a.match)]
        population = sel
    if a.limit and a.limit < len(sel):
        perm = np.random.default_rng(a.seed).permutation(len(sel))
        keep = set(perm[:a.limit].tolist())
        sel = [m for i, m in enumerate(sel) if i in keep]
    if a.list:
        for m in sel:
            print(f"{m['id']} {m['file']}:{m['line']} {m['func']} [{m['kind']}] {m['orig']}  =>  "
                  f"{m['mutated']}")
        print(f"{len(sel)} of {len(population)} mutants")
        return 0
    rows, broken = {}, set()
    state = Path(a.state) if a.state else None
    if state and state.exists():
        for line in state.read_text().splitlines():
            r = json.loads(line)
            if "id" in r:
                rows[r["id"]] = r
                broken.update(r.get("broken", []))
    todo = [] if a.no_run else [m for m in sel if m["id"] not in rows]
    jobs = max(1, min(a.jobs, len(todo)))
    tmp = Path(tempfile.mkdtemp(prefix="dse-mutation-"))
    outs = [tmp / f"job{j}.jsonl" for j in range(jobs)]
    hints = read_operator_table(Path(a.out)) if a.out and Path(a.out).exists() else {}
    procs = [_start_operators(todo[j::jobs], a.fast, outs[j], hints, a.test_timeout, a.train)
             for j in range(jobs)] if todo else []
    by_id = {m["id"]: m for m in sel}
    seen, t0 = 0, time.perf_counter()
    while True:
        done = all(p.poll() is not None for p in procs)
        for o in outs:
            for line in (o.read_text().splitlines() if o.exists() else []):
                r = json.loads(line)
                if r["id"] in rows:
                    continue
                rows[r["id"]] = r
                broken.update(r["broken"])
                if state:
                    with state.open("a") as f:
                        f.write(json.dumps(r) + "\n")
                seen += 1
                m = by_id[r["id"]]
                rate = (time.perf_counter() - t0) / seen
                res = {"caught": f"caught by {r['caught']}",
                       "golden only": f"caught only by {r['golden']}",
                       "not caught": "NOT CAUGHT"}.get(r["status"], r["status"])
                print(f"[{seen}/{len(todo)}, {rate:.1f} s each, ETA "
                      f"{rate * (len(todo) - seen) / 60:.0f} min] {m['file']}:{m['line']} "
                      f"{_text_short(m['orig'])} => {_text_short(m['mutated'])}: {res} "
                      f"({r['cpu_s']:.1f} CPU-s)", flush=True)
        if done:
            break
        time.sleep(2)
    lost = [m for m in sel if m["id"] not in rows]
    if lost and not a.no_run:
        errs = "; ".join((p.stderr.read() or "").strip().splitlines()[-1:][0]
                         if p.stderr else "" for p in procs)
        print(f"mutation.py: a pytest session ended early ({errs}); {len(lost)} not run",
              file=sys.stderr)
    c = operator_summary(sel, rows)
    print(f"{len(sel)} mutants: {c['unreachable']} unreachable, {c['equivalent']} equivalent, "
          f"{c['invalid']} invalid, {c['caught']} caught by a physics test, {c['golden only']} "
          f"only by the goldens, {c['not caught']} by nothing, {c['not run']} not run")
    if broken:
        print("left out (failing without a mutation): " + ", ".join(sorted(broken)))
    if a.out:
        n_designs = (sum(len(b.tp) for k, b in train_sample().items()
                         if not k.startswith("every case"))
                     if a.train
                     else sum(len(f) for f in sample_frames().values()))
        write_operator_table(Path(a.out), sel, rows, argv, len(population), files, a.fast,
                             sorted(broken), n_designs, state, a.train)
    return 1 if c["golden only"] or c["not caught"] or lost else 0


def _text_short(s: str, limit: int = 60) -> str:
    return s if len(s) <= limit else s[:limit - 3] + "..."


if __name__ == "__main__":
    raise SystemExit(main())
