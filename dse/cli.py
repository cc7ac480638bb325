"""The ``dse`` command line: a thin layer over the library (contracts/cli.md).

Exit codes (``dse --help`` lists them; ``dse.errors`` defines them):

- 0: done;
- 1: an internal error (one line; ``DSE_DEBUG=1`` shows the traceback), or a shared storage
  that stayed unreachable past ``--storage-retry`` (the run folder, where one is kept, resumes);
- 2: bad input, one line naming the file, key or row: a space or case file, a flag, a corrupt
  run folder, a storage URL that can never work (bad scheme, authentication, unknown or dropped
  database, nothing listening at the start);
- 3: the environment refused a file operation: disk full, read-only file system, permission
  denied; one line naming the path (no temporary file is left behind);
- 128 + N: stopped by signal N (130: Ctrl-C, 143: SIGTERM); the run is resumable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from dse.errors import (
    EXIT_ENVIRONMENT,
    EnvironmentFault,
    InputError,
    StorageUnavailable,
    writing,
)
from dse.units import parse_duration
from dse.version import __version__


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line and exit code 2, like every other bad input. Each parser keeps
    its ``arguments`` (the actions added, in order) and its sub-``commands`` (name -> (parser,
    help)), which the generated CLI reference reads (``python -m dse.docs``)."""

    def __init__(self, *args, **kwargs):
        self.arguments: list[argparse.Action] = []
        self.commands: dict[str, tuple[argparse.ArgumentParser, str]] = {}
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        self.arguments.append(action)
        return action

    def add_subparsers(self, **kwargs):
        action = super().add_subparsers(**kwargs)
        add, commands = action.add_parser, self.commands

        def add_parser(name, **kw):
            parser = add(name, **kw)
            commands[name] = (parser, kw.get("help", ""))
            return parser

        action.add_parser = add_parser
        return action

    def error(self, message):
        raise InputError(f"{message} (see `{self.prog} --help`)")


SINGULAR = {"accelerators": "accelerator", "topologies": "topology", "models": "model"}


def _catalog(a) -> int:
    from dse import catalog
    if a.action == "list":
        kinds = [a.kind] if a.kind else list(catalog.KINDS)
        for kind in kinds:
            entries = catalog.table(kind)
            print(f"{kind} ({len(entries)}):")
            for k, e in entries.items():
                print(f"  {k:<20} {_summary(kind, e)}")
        return 0
    kind, entry = catalog.find(a.id)
    print(f"{SINGULAR.get(kind, kind)} {a.id}")
    for k, v in _rows(entry.model_dump(exclude={"id"}), section=SINGULAR.get(kind, kind)):
        print(f"  {k:<44} {v}")
    return 0


def _memory(n: float) -> str:
    """``85.5 GB (79.6 GiB)``: a chip's marketed "80GB" is binary gigabytes."""
    return f"{n / 1e9:,.1f} GB ({n / 2**30:,.1f} GiB)"


def _summary(kind, e) -> str:
    if kind == "accelerators":
        return (f"{e.name}: {e.peak_flops_per_s.bf16 / 1e12:,.0f} TFLOP/s bf16, "
                f"{_memory(e.hbm_capacity_bytes)} at {e.hbm_bw_bytes_per_s / 1e12:.2f} TB/s, "
                f"scale-up {e.scaleup_domain_chips} x {e.scaleup_link_bw_bytes_per_s / 1e9:,.0f} GB/s")
    if kind == "topologies":
        dom = e.domain_chips or "accelerator's"
        return f"{e.name} [{e.kind}, domain {dom}, rack {e.rack_chips}]"
    moe = (f", MoE {e.num_experts} experts top-{e.num_experts_per_tok}" if e.num_experts else "")
    return (f"{e.name}: {e.total_params / 1e9:,.1f}B total / {e.active_params / 1e9:,.1f}B active, "
            f"{e.num_hidden_layers} layers{moe}")


UNIT_HINTS = (("_bytes_per_s", "bytes/s"), ("_flops_per_s", "FLOP/s"), ("_bytes", "bytes"),
              ("_params", "parameters"), ("usd_per_hour", "USD/h"), ("_usd", "USD"), ("_w", "W"),
              ("_s", "s"))
# a value in these units is written with an SI prefix: 3.35e12 bytes/s -> 3.35 TB/s
_SI = {"bytes/s": "B/s", "FLOP/s": "FLOP/s", "bytes": "B"}
_PREFIX = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def _si(v: float, unit: str) -> str:
    for f, p in _PREFIX:
        if abs(v) >= f:
            return f"{v / f:,.4g} {p}{unit}"
    return f"{v:,.4g} {unit}"


# what a field left blank means, where it means more than "not given"
MISSING = {"domain_chips": "the accelerator's scale-up domain (its scaleup_domain_chips)",
           "microbench": "not measured",
           "l2_cache_bytes": "not given (the kernel fits assume no warm L2 cache)"}


def catalog_value(v, unit: str, key: str = "") -> str:
    """A catalog field's value in words with its unit: SI prefixes for bytes, bytes/s and
    FLOP/s (memory also in GiB), seconds in s/ms/us/ns, money with $, counts with thousands
    separators; a missing value says so (no ``None``)."""
    if v is None:
        if "peak_flops_per_s" in key:
            return "not supported (no peak rate for this type)"
        return MISSING.get(key, "not given")
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (list, tuple)):
        return "; ".join(map(str, v)) if v else "none"
    if not isinstance(v, (int, float)):
        return str(v) if str(v) else "none"
    if unit == "bytes" and v >= 2**30:
        return _memory(v)
    if unit in _SI:
        return _si(float(v), _SI[unit])
    if unit == "s" and v:
        a = abs(v)
        return (f"{v:.4g} s" if a >= 1 else f"{v * 1e3:.4g} ms" if a >= 1e-3
                else f"{v * 1e6:.4g} us" if a >= 1e-6 else f"{v * 1e9:.4g} ns")
    if unit == "USD":
        return f"${v:,.6g}"
    if unit == "USD/h":
        return f"${v:,.2f}/h"
    if unit == "parameters" and v >= 1e6:
        return f"{v / 1e9:,.4g}B parameters" if v >= 1e9 else f"{v / 1e6:,.4g}M parameters"
    text = f"{int(v):,}" if float(v).is_integer() and abs(v) < 1e15 else f"{v:.6g}"
    return f"{text} {unit}".strip()


def _rows(d: dict, prefix="", section=""):
    """An entry's fields with units: the field registry's (dse.spec.fields), else from the name."""
    from dse.spec.fields import REGISTRY
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from _rows(v, key + ".", section)
            continue
        f = REGISTRY.get(f"{section}.{key}")
        unit = f.unit if f is not None and f.unit not in ("", "fraction", "ratio") else \
            "FLOP/s" if ".peak_flops_per_s." in f".{key}" or key.startswith("peak_flops_per_s") \
            else next((u for suf, u in UNIT_HINTS if key.endswith(suf)), "")
        yield key, catalog_value(v, unit, key)


def _eval(a) -> int:
    from dse.api import evaluate
    from dse.scoring import evaluate as serving
    from dse.scoring import train_eval
    res = evaluate(a.design).to_dict()
    out = train_eval if res.get("task") == "train" else serving
    print(out.render_json(res) if a.json else out.render_text(res, a.design))
    return 0


def _predict(a) -> int:
    from dse.api import predict_train
    if os.path.abspath(a.out) == os.path.abspath(a.cases):
        raise InputError("--out would overwrite the case file", file=a.out,
                         hint="write predictions to another path")
    if a.train:
        n = len(predict_train(a.cases, a.out))
    else:       # streamed: the file is read, scored and written a chunk at a time
        from dse.scoring.predict import predict_file
        n = predict_file(a.cases, a.out, keep=False)
    print(f"wrote {n} predictions to {a.out}")
    return 0


def _validate(a) -> int:
    from dse.build.space import describe, load_space
    from dse.spec.bundled import space_path
    print(describe(load_space(space_path(a.space))))
    return 0


def _run(a) -> int:
    from dse import api
    budget = parse_duration(a.budget) if a.budget else None
    retry = _storage_retry_s(a)
    if a.resume:
        r = api.resume(a.resume, trials=a.trials, budget=budget, workers=a.workers,
                       storage_retry=retry, progress=not a.quiet)
    else:
        if not a.space:
            raise InputError("give a space file, or --resume DIR")
        from dse.spec.bundled import space_path
        r = api.run(space_path(a.space), a.strategy, trials=a.trials, budget=budget, out=a.out,
                    seed=a.seed,
                    workers=a.workers, sampler=a.sampler, population=a.population,
                    storage=a.storage, chunk_designs=a.chunk_designs,
                    segment_trials=a.segment_trials, storage_retry=retry, progress=not a.quiet)
    return _ran(r)


def _storage_retry_s(a) -> float | None:
    """``--storage-retry``, else ``$DSE_STORAGE_RETRY``, in seconds (None: neither is given)."""
    if getattr(a, "storage_retry", None) is not None:
        return parse_duration(a.storage_retry, "--storage-retry")
    if os.environ.get("DSE_STORAGE_RETRY"):
        return parse_duration(os.environ["DSE_STORAGE_RETRY"], "DSE_STORAGE_RETRY")
    return None


def _storage_retry(a) -> None:
    from dse.search.optuna import study
    retry = _storage_retry_s(a)
    if retry is not None:
        study.set_storage_retry(retry)


def _ran(r) -> int:
    """What a finished (or stopped) run did, its warning when no design met the constraints, and
    its folder as the last line."""
    st, m, d = r.status, r.manifest, r.path
    from dse.results.terminal import completed_words
    if m["strategy"] == "exhaustive":
        what = f"{st['designs_scored']:,} of {m.get('size') or 0:,} designs scored"
    else:
        what = f"{completed_words(st, 'trials')} trials scored"
    print(f"{st['state']}: {what} in {st['elapsed_s']:.1f} s, front of {st['front_size']} designs")
    if st["front_size"] == 0 and st["designs_scored"]:
        cons = ", ".join(f"{c['metric']} {'<=' if c['max'] is not None else '>='} "
                         f"{c['max'] if c['max'] is not None else c['min']}"
                         for c in m.get("constraints", []))
        print(f"dse: warning: no scored design is feasible{' and meets ' + cons if cons else ''}; "
              "the front is empty", file=sys.stderr)
    _front_table(d, m)
    print(d)
    return 0


def _front_table(d, m) -> None:
    """The front's best design of each objective and its knee, with units (dse.results.terminal)."""
    from dse.build.space import Objective
    from dse.results import terminal
    from dse.search import store
    front = store.read_front(d)
    if front is None or not len(front):
        return
    objs = [Objective(o["name"], o["direction"]) for o in m["objectives"]]
    params = [p for p in front.columns if p not in {o.metric for o in objs} | {"design_id"}]
    kv = None
    try:                 # the KV dtype each design runs (a blank one follows the weights)
        space = store.space_of(d, m)
        kv = None if space.task == "train" else space.kv_dtypes(
            front["design_id"].to_numpy(dtype="int64"))
    except (InputError, OSError, KeyError, ValueError):
        kv = None
    for line in terminal.front_lines(front.reset_index(drop=True), objs, params, kv):
        print(line)


def _worker(a) -> int:
    from dse import api
    _storage_retry(a)
    if not a.dir and not (a.storage and a.study):
        raise InputError("give a run folder, or --storage URL and --study NAME")
    r = api.work(a.dir, storage=a.storage, study=a.study, out=a.out, trials=a.trials,
                 budget=a.budget, progress=not a.quiet)
    st, m = r.status, r.manifest
    from dse.results.terminal import completed_words
    what = "chunks" if m["strategy"] == "exhaustive" else "trials"
    print(f"worker done: the run has {completed_words(st, what)} {what} complete (every "
          f"worker's together), front of {st['front_size']}")
    print(r.path)
    return 0


def _dashboard(a) -> int:
    """optuna-dashboard on a run's study: its journal, or the RDB the run used."""
    from pathlib import Path

    from dse.search import store
    d = Path(a.dir)
    m = store.load_manifest(d)
    if m["strategy"] == "exhaustive" and not m.get("storage"):
        raise InputError("an exhaustive run has no Optuna study to show", file=str(d),
                         hint="`dse report DIR` shows its front; dashboards show optuna and "
                              "nested runs")
    try:
        from optuna_dashboard import run_server
    except ImportError:
        raise InputError("dse dashboard needs optuna-dashboard",
                         hint="pip install 'dse[dashboard]' (or pip install optuna-dashboard)") \
            from None
    from dse.search.optuna.study import storage_for
    storage = storage_for(d, m.get("storage"))
    print(f"optuna-dashboard on http://{a.host}:{a.port}/ (study {m['study_name']}; Ctrl-C stops)")
    run_server(storage, host=a.host, port=a.port)
    return 0


def _report(a) -> int:
    from pathlib import Path

    from dse.results.report import make_report
    with writing(a.out or Path(a.dir) / "report"):
        out = make_report(a.dir, a.out)
    print(f"wrote {out / 'index.html'}, {out / 'summary.md'}, {out / 'front.csv'} and figures")
    print(out)
    return 0


def _compare(a) -> int:
    from pathlib import Path

    from dse.api import compare
    c = compare(a.dir_a, a.dir_b, bands=a.bands)
    for w in c.warnings:
        print(f"dse: warning: {w}", file=sys.stderr)
    out = a.out or Path("runs") / f"compare-{Path(a.dir_a).name}-vs-{Path(a.dir_b).name}"
    with writing(out):
        out = c.write(out)
    from dse.results.bands_report import compare_headline, compare_lines
    from dse.results.pages import plain
    print(plain("\n".join(compare_headline(c))))    # first: each best with its band
    for line in c.terminal_lines():                 # hypervolumes, reference point, coverage
        print(line)
    if c.bands:
        print(plain("\n".join(compare_lines(c.bands)).strip()))
    print(f"wrote {out / 'index.html'}, {out / 'compare.md'}, {out / 'union_front.csv'}")
    print(out)
    return 0


def _whatif(a) -> int:
    from dse.api import whatif
    if not a.reoptimize and (a.trials is not None or a.budget):
        raise InputError("--trials and --budget go with --reoptimize",
                         hint="add --reoptimize to search again")
    budget = parse_duration(a.budget) if a.budget else None
    from pathlib import Path
    with writing(a.out or Path(a.dir) / "whatif"):
        w = whatif(a.dir, a.set, a.scale, a.out, reoptimize=a.reoptimize, trials=a.trials,
                   budget=budget, progress=not a.quiet, bands=a.bands)
    out = w.path
    from dse.results.pages import plain
    print(plain("\n".join(w.headline)))         # first: each change with its band
    if w.bands:
        from dse.results.bands_report import whatif_lines
        print(plain("\n".join(whatif_lines(w.bands)).strip()))
    print(f"wrote {out / 'index.html'}, {out / 'whatif.md'}, {out / 'front.csv'}")
    if a.reoptimize:
        print(f"re-optimized run: {out / 'run'} (dse status / report / compare / run --resume)")
    print(out)
    return 0


def _answer(a) -> int:
    from dse.questions.answer import answer_space, first_lines
    from dse.results.pages import plain
    from dse.spec.bundled import space_path
    out = answer_space(space_path(a.space), a.out, a.run_dir, progress=not a.quiet,
                       bands=a.bands, publish=a.publish)
    print(plain(first_lines(out)))
    print(f"wrote {out / 'README.md'} (the answer), {out / 'index.html'} and figures")
    print(out)
    return 0


def _bands_option(p, what: str) -> None:
    from dse.scoring.bands import DEFAULT_SAMPLES
    p.add_argument("--bands", type=int, default=None, metavar="N",
                   help=f"uncertainty bands: {what} (N samples of the fitted parameters, default "
                        f"{DEFAULT_SAMPLES}; 0 turns them off; see README 'Uncertainty bands')")


def _schema(a) -> int:
    from dse.spec.schema import design_schema, space_schema, train_space_schema
    make = {"space": space_schema, "train-space": train_space_schema}.get(a.kind, design_schema)
    print(json.dumps(make(), indent=1))
    return 0


def _repair(a) -> int:
    from pathlib import Path

    from dse.search import repair
    for line in repair.repair(Path(a.dir)):
        print(line)
    print(a.dir)
    return 0


def _status(a) -> int:
    from dse.api import open_run
    st = open_run(a.dir).status
    if a.json:
        print(json.dumps(st))
    else:
        from pathlib import Path

        from dse.results import terminal
        from dse.search import store
        for line in terminal.status_lines(st, store.load_manifest(Path(a.dir))):
            print(line)
    return 0


SPACE_HELP = ("a space file, or the name of a shipped example space (quickstart, moe-codesign, "
              "...: dse.spec.bundled)")


def _run_commands(sub) -> None:
    """Sub-commands of the search: validate, run, worker."""
    v = sub.add_parser("validate", help="check a space file; print its parameters and size")
    v.add_argument("space", help=SPACE_HELP)
    v.set_defaults(func=_validate)

    r = sub.add_parser("run", help="search a space; the last line printed is the run folder")
    r.add_argument("space", nargs="?", help=SPACE_HELP)
    r.add_argument("--strategy", choices=["exhaustive", "optuna", "nested"],
                   help="exhaustive: every design, exact front (default up to 10^8 designs); "
                        "optuna: Optuna's samplers, asked and told in batches; nested: the "
                        "sampler picks hardware/model points, every layout and batch under each "
                        "is scored")
    r.add_argument("--sampler", choices=["nsga2", "nsga3", "tpe", "random", "qmc", "gp"],
                   help="Optuna sampler (default: tpe; optuna runs of more than 2000 trials: "
                        "nsga2; of at most 96 trials, with no --sampler/--population: 8 pairs-covering "
                        "designs, then an additive surrogate's proposals)")
    r.add_argument("--population", type=int,
                   help="trials asked and scored per batch (default 2, nested 4; nsga2 on long "
                        "runs: 32; short runs: 1)")
    r.add_argument("--workers", type=int, default=1,
                   help="processes working on the run together, this one included (optuna, "
                        "nested; exhaustive with --storage): the others are `dse worker`s")
    r.add_argument("--storage", help="Optuna RDB URL, shared with `dse worker`s (default: a journal "
                   "file in the run folder; exhaustive: chunk files, no study)")
    r.add_argument("--trials", type=int,
                   help="exhaustive: chunks to do now; optuna: trials in the run (default: "
                        "with --budget, until the budget or the space is spent; else "
                        "min(space size, 10000); trials that cover the space enumerate it), "
                        "or to add now with --resume")
    r.add_argument("--budget", help="wall time, e.g. 90s, 45m, 8h: the run goes on until it is "
                                    "spent (or the space, or --trials)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--out", help="run folder (default runs/<time>-<space>)")
    r.add_argument("--resume", metavar="DIR", help="continue a stopped or killed run")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.add_argument("--storage-retry", metavar="DURATION",
                   help="how long storage calls are retried while the database is unreachable, "
                        "e.g. 300s, 10m (default: $DSE_STORAGE_RETRY, else 300s)")
    r.add_argument("--chunk-designs", type=int, help="exhaustive: designs per work item, one trial "
                   "of the shared study with --storage (default 65536)")
    r.add_argument("--segment-trials", type=int,
                   help="trials per Optuna study before a new one is started from the front "
                        "(default 10000: keeps samplers fast on long runs)")
    r.set_defaults(func=_run)

    w = sub.add_parser("worker", help="join a running optuna study (or an exhaustive run's "
                       "shared chunks) and work until it is done")
    w.add_argument("dir", nargs="?", help="the run folder (shared with the run)")
    w.add_argument("--storage", help="Optuna RDB URL, e.g. postgresql+psycopg2://user:pw@host/db")
    w.add_argument("--study", help="study name (the run folder's name)")
    w.add_argument("--out", help="local folder for this worker's score tables")
    w.add_argument("--trials", type=int, help="at most this many trials (chunks) from this worker")
    w.add_argument("--budget", help="wall time, e.g. 8h")
    w.add_argument("--quiet", action="store_true")
    w.add_argument("--storage-retry", metavar="DURATION",
                   help="how long storage calls are retried while the database is unreachable "
                        "(default: $DSE_STORAGE_RETRY, else 300s)")
    w.set_defaults(func=_worker)


def _run_readers(sub) -> None:
    """Sub-commands of what a run gives: report, compare, whatif, answer."""
    rp = sub.add_parser("report", help="the Pareto report of a run (HTML, PNG, CSV, Markdown)")
    rp.add_argument("dir")
    rp.add_argument("--out", help="output folder (default DIR/report)")
    rp.set_defaults(func=_report)

    cp = sub.add_parser("compare", help="two runs' fronts on one reference point")
    cp.add_argument("dir_a")
    cp.add_argument("dir_b")
    cp.add_argument("--out", help="output folder (default runs/compare-A-vs-B)")
    _bands_option(cp, "each objective's best designs under parameter samples: their 90%% bands "
                      "and the probability that A's beats B's")
    cp.set_defaults(func=_compare)

    wi = sub.add_parser("whatif", help="re-score a run's front under overrides; sensitivities")
    wi.add_argument("dir")
    wi.add_argument("--set", action="append", metavar="PATH=VALUE", help="give a field a value")
    wi.add_argument("--scale", action="append", metavar="PATH=FACTOR", help="multiply a field")
    wi.add_argument("--reoptimize", action="store_true",
                    help="also search the space again with the change, warm-started from the run, "
                         "into the run folder OUT/run (same strategy, seed and sampler: exhaustive "
                         "runs give the exact new front; optuna/nested runs start a new study whose "
                         "first trials are the old front's designs); OUT/front.csv is then the "
                         "re-optimized front")
    wi.add_argument("--trials", type=int,
                    help="with --reoptimize: optuna/nested trials in the new run (default: the "
                         "run's count, at least the old front's designs); exhaustive: chunks to do "
                         "now (resume the rest with dse run --resume OUT/run)")
    wi.add_argument("--budget", help="with --reoptimize: wall time of the search, e.g. 90s, 45m")
    wi.add_argument("--quiet", action="store_true", help="no progress bar")
    wi.add_argument("--out", help="output folder (default DIR/whatif)")
    _bands_option(wi, "the front re-scored before and after under parameter samples: each "
                      "change's median and 90%% band")
    wi.set_defaults(func=_whatif)

    an = sub.add_parser("answer", help="a worked question: run its space, report, answer in numbers")
    an.add_argument("space", help="a space file with an [answer] table (spaces/questions/), or "
                    "a shipped question's name (fast-mode)")
    an.add_argument("--out", help="report folder (default runs/answers/<space name>; with "
                                  "--publish reports/<space name>)")
    an.add_argument("--publish", action="store_true",
                    help="write into reports/<space name>, the published answers (tracked in git; "
                         "their pages share reports/_static/plotly.min.js)")
    an.add_argument("--run-dir", help="run folder (default runs/<time>-<space name>)")
    an.add_argument("--quiet", action="store_true", help="no progress bar")
    _bands_option(an, "the analysis re-run under parameter samples: each [answer] number's "
                      "median and 90%% band")
    an.set_defaults(func=_answer)


def _design_commands(sub) -> None:
    """Sub-commands of one design or a case table, and the catalog: catalog, eval, predict, schema."""
    c = sub.add_parser("catalog", help="list or show catalog entries")
    csub = c.add_subparsers(dest="action", required=True, parser_class=_Parser)
    cl = csub.add_parser("list", help="catalog ids with a one-line summary")
    cl.add_argument("kind", nargs="?", choices=["accelerators", "topologies", "models"])
    cs = csub.add_parser("show", help="every field of one entry, with units and sources")
    cs.add_argument("id", help="a catalog id: an accelerator, topology or model (dse catalog list)")
    c.set_defaults(func=_catalog)

    e = sub.add_parser("eval", help="score one design file: per-op breakdown and every metric")
    e.add_argument("design", help="design TOML file")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.set_defaults(func=_eval)

    pr = sub.add_parser("predict", help="score the cases of a CSV (docs/predict-format.md)")
    pr.add_argument("cases", help="case CSV")
    pr.add_argument("--out", required=True, help="predictions CSV to write")
    pr.add_argument("--train", action="store_true",
                    help="the cases are training jobs (contracts/train-cases.md)")
    pr.set_defaults(func=_predict)

    sc = sub.add_parser("schema", help="JSON Schema of space or design files, for editors")
    sc.add_argument("kind", choices=["space", "design", "train-space"])
    sc.set_defaults(func=_schema)


def _run_care(sub) -> None:
    """Sub-commands of a run's upkeep: repair, dashboard, status."""
    rr = sub.add_parser("repair", help="move a run's corrupt files to DIR/quarantine/, re-queue "
                        "their work and rebuild front.csv and progress.json")
    rr.add_argument("dir")
    rr.set_defaults(func=_repair)

    db = sub.add_parser("dashboard", help="open an optuna/nested run's study in optuna-dashboard "
                        "(the optional extra dse[dashboard])")
    db.add_argument("dir")
    db.add_argument("--host", default="127.0.0.1")
    db.add_argument("--port", type=int, default=8080)
    db.set_defaults(func=_dashboard)

    st = sub.add_parser("status", help="state of a run")
    st.add_argument("dir")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=_status)


def _installed_version() -> str:
    """The version in the installed package's metadata (distribution ``dse-llm``); from a
    checkout that is not installed, the source's ``dse.version.__version__``."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("dse-llm")
    except PackageNotFoundError:
        return __version__


EXIT_CODES = f"""exit codes:
  0    done
  1    internal error (DSE_DEBUG=1 shows the traceback); storage unreachable past --storage-retry
  2    bad input: a file, flag, corrupt run folder or storage URL, named on one line
  {EXIT_ENVIRONMENT}    disk full, read-only file system or permission denied, naming the path
  128+N  stopped by signal N (130: Ctrl-C); the run is resumable"""


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="dse", description="Design-space optimizer for LLM serving hardware and models.",
                epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"dse {_installed_version()}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in (_design_commands, _run_commands, _run_readers, _run_care):
        add(sub)
    return p


def main(argv=None) -> int:
    args = None
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except InputError as e:
        print(f"dse: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        from dse.search.working import Interrupted
        if isinstance(e, Interrupted):
            print(f"dse: {e}", file=sys.stderr)
            return 128 + e.signum
        print("dse: interrupted", file=sys.stderr)
        return 130
    except StorageUnavailable as e:
        print(f"dse: error: {e}", file=sys.stderr)
        return 1
    except EnvironmentFault as e:
        print(f"dse: error: {e}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    except BrokenPipeError:
        return 0
    except OSError as e:       # disk full, read-only, permission: the environment's, named
        fault = EnvironmentFault.of(e, e.filename or _output_of(args))
        if fault is None:
            return _internal(e)
        print(f"dse: error: {fault}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    except Exception as e:  # an internal error: one line unless DSE_DEBUG asks for the traceback
        return _internal(e)


def _output_of(args) -> str:
    """What a command writes, for an environment error that names no file: its --out, else its
    run folder, else the working directory."""
    for name in ("out", "run_dir", "resume", "dir"):
        if getattr(args, name, None):
            return str(getattr(args, name))
    return os.getcwd()


def _internal(e: Exception) -> int:
    if os.environ.get("DSE_DEBUG"):
        raise e
    print(f"dse: internal error: {type(e).__name__}: {e} (set DSE_DEBUG=1 for the traceback)",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
