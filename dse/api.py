"""The Python API of dse: what the ``dse`` command line, the worked questions and the tests use.

    import dse
    ev = dse.evaluate("examples/llama70b-h100.toml")      # or a dict of dotted paths
    ev.metrics["tpot_s"], ev.breakdown                     # every metric; per-op times
    table = dse.score(frame)                               # a DataFrame of designs, vectorized
    run = dse.run("spaces/quickstart.toml")                # search a space: a Run
    run = dse.run(space, strategy="optuna", sampler="tpe", population=4, trials=500,
                  budget="10m", seed=1, out="runs/x")     # every `dse run` setting
    run.front, run.scores, run.status                      # DataFrames and `dse status --json`
    run = dse.resume("runs/x")                             # or run.resume(): `dse run --resume`
    w = dse.whatif(run, set={"accelerator.id": "b300"})    # the front re-scored
    c = dse.compare(run, other)                            # two fronts on one reference point

Every bad input raises ``dse.InputError`` (one line naming the file, key or row and what is
valid), which the command line prints and exits 2 with. Units are SI (seconds, bytes, bytes/s,
FLOP/s, USD); a scale-factor parameter's column is ``<path>.scale`` (``dse.spec.fields``).
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

import numpy as np
import pandas as pd

from dse.build.designs import resolve, to_batch
from dse.build.space import Space
from dse.build.space import load_space as _load
from dse.errors import InputError, suggest
from dse.perf import BOUNDS, score_chunked
from dse.perf.memory_fit import reason_text
from dse.results import reader
from dse.results.compare import compare_runs
from dse.results.report import make_report
from dse.results.whatif import run_whatif
from dse.scoring import breakdown
from dse.scoring.bands import (
    DEFAULT_SAMPLES,
    check_samples,
    draw,
    frame_samples,
    summary,
)
from dse.scoring import train_eval
from dse.scoring.evaluate import evaluate_file, evaluate_flat
from dse.scoring.predict import csv_frame, predict_file, predict_frame, read_cases, write_csv
from dse.scoring.train_cases import read_train_cases
from dse.scoring.train_predict import predict_train_file, predict_train_frame
from dse.search import driver
from dse.search.driver import run_space
from dse.spec.bundled import space_path
from dse.spec.design import check_design, to_toml
from dse.spec.fields import REGISTRY
from dse.units import seconds

PathLike = str | Path


# ------------------------------------------------------------------------------ one design

@dataclass(frozen=True)
class Evaluation:
    """One design scored: ``dse eval``'s numbers."""

    metrics: dict[str, Any]        # every metric (SI units); bound, feasible and reason as text
    breakdown: pd.DataFrame        # per op of each step: times (compute_s, memory_s, network_s,
    #                                time_s), bound, and work per chip (flops, hbm_bytes, net_bytes)
    design: dict[str, Any]         # the resolved design: every settable path's value
    chosen: dict[str, Any]         # the layout and concurrency (chosen by dse when not given)
    result: dict = field(repr=False, default_factory=dict)   # ``dse eval --json``'s object

    def to_dict(self) -> dict:
        """The JSON object ``dse eval --json`` prints."""
        return self.result


def evaluate(design: PathLike | Mapping[str, Any],
             task: Literal["serve", "train"] | None = None) -> Evaluation:
    """Score one design: a design TOML file, or a dict of dotted paths
    (``{"accelerator.id": "h100-sxm", "model.id": "llama-3.1-70b", "layout.tp": 4}``) or of
    sections (``{"accelerator": {"id": "h100-sxm"}, ...}``). A layout left out (``layout.num_chips``
    without tp/pp/ep/dp) and a concurrency left out are chosen as ``dse eval`` chooses them.

    ``task="train"`` (or a file or dict with ``task = "train"``): a training design
    (``dse.scoring.train_eval``: ``[training]``, ``[model]``, ``[accelerator]``, ``[layout]``),
    its layout scored as given; ``metrics`` are the training metrics, ``breakdown`` the step's
    parts and the memory per chip (``part``, ``value``), ``chosen`` empty."""
    if task not in (None, "serve", "train"):
        raise InputError(f"task = {task!r} is not valid", hint='"serve" or "train"')
    given = (design.get("task") if isinstance(design, Mapping) else
             "train" if train_eval.is_train_file(str(design)) else None)
    if task == "serve" and given not in (None, "serve"):
        raise InputError(f"task = 'serve' but the design says task = {given!r}",
                         hint="leave task out to follow the design")
    if task == "train" or given == "train":
        res = (train_eval.evaluate_train(dict(design)) if isinstance(design, Mapping)
               else train_eval.evaluate_train_file(str(design)))
        parts = pd.DataFrame({"part": list(res["breakdown"]),
                              "value": list(res["breakdown"].values())})
        return Evaluation(dict(res["metrics"]), parts, dict(res["design"]), {}, res)
    if isinstance(design, Mapping):
        res = evaluate_flat(check_design(dict(design), "design"), file="design")
    else:
        res = evaluate_file(str(design))
    rows = [{"step": step, **op} for step, b in res["breakdown"].items() for op in b["ops"]]
    rows += [{"step": step, "op": "overhead", **{q: 0.0 for q in breakdown.QUANTITIES},
              "time_s": b["overhead_s"], "bound": ""} for step, b in res["breakdown"].items()]
    cols = ["step", "op", *breakdown.QUANTITIES, "bound"]
    return Evaluation(dict(res["metrics"]), pd.DataFrame(rows, columns=cols), dict(res["design"]),
                      dict(res["chosen"]), res)


def score(frame: pd.DataFrame, base: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Score a table of designs at once (vectorized): one row per design, one dotted path per
    column (``accelerator.id``, ``model.id``, ``layout.tp``, ``workload.concurrency``, ...), and
    ``base`` values for the paths every row shares. A path left out takes its catalog value or
    its default (``dse.spec.fields``): layouts default to 1 and are not chosen (``dse.evaluate`` and
    ``dse predict`` choose them). Columns without a dot are kept as labels.

    Returns a copy of ``frame`` with every metric added (``bound`` as compute, memory, network
    or capacity; ``reason`` as text, empty when feasible). A column that is not a settable path
    raises InputError naming it with the closest valid paths."""
    if not isinstance(frame, pd.DataFrame):
        raise InputError(f"dse.score takes a DataFrame, not a {type(frame).__name__}",
                         hint="one row per design, one dotted path per column")
    valid = sorted(p for p, f in REGISTRY.items() if f.resolved)
    table = frame.reset_index(drop=True)
    for k, v in (base or {}).items():
        if k in table.columns:
            raise InputError(f"{k!r} is both a column and a base value", hint="give it once")
        table[k] = [v] * len(table)
    dotted = [c for c in table.columns if "." in str(c)]
    for c in table.columns:
        c = str(c)
        if c == "layout.num_chips":
            raise InputError("column 'layout.num_chips' is not scored as given", file="frame",
                             where=f"column {c}", hint="give layout.tp/pp/ep/dp, or let "
                             "dse.evaluate choose a layout")
        if "." in c and (c not in REGISTRY or not REGISTRY[c].resolved):
            raise InputError(f"unknown column {c!r}", file="frame", where=f"column {c}",
                             hint=suggest(c, valid, "settable paths"))
        short = [p for p in valid if p.endswith("." + c)]
        if "." not in c and short:      # "concurrency" for workload.concurrency: not a label
            raise InputError(f"column {c!r} is not a dotted path", file="frame",
                             where=f"column {c}", hint=f"did you mean {short[0]!r}?")
    if len(table) == 0:
        raise InputError("the frame has no rows", file="frame", hint="one row per design")
    names = [f"row {i} (index {k})" for i, k in enumerate(frame.index)]
    resolved = resolve(table[dotted], file="frame", row_names=names)
    s = score_chunked(to_batch(resolved))
    out = frame.copy()
    for k, v in s.items():
        if k == "bound":
            out[k] = np.array(BOUNDS, dtype=object)[np.asarray(v, int)]
        elif k == "reason":
            out[k] = [reason_text(int(r), float(m)) for r, m in
                      zip(v, s["max_concurrent_sequences"])]
        elif k == "feasible":
            out[k] = np.asarray(v, bool)
        else:
            out[k] = np.asarray(v, float)
    return out


@dataclass(frozen=True)
class Bands:
    """Designs scored under parameter samples (``score_bands``): ``samples[metric]`` is an
    array (samples, designs); ``table()`` gives each metric's median and 90% band."""

    samples: dict                  # metric -> float array (n samples, designs)
    n: int
    seed: int
    note: str                      # what the samples cover and what is held exact

    def median(self, metric: str) -> np.ndarray:
        return summary(self.samples[metric])[0]

    def band(self, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """(5th, 95th percentile) of every design."""
        return summary(self.samples[metric])[1:]

    def table(self, metrics=None) -> pd.DataFrame:
        """One row per design: ``<metric>`` (median), ``<metric>_lo``, ``<metric>_hi``."""
        out = {}
        for m in metrics or self.samples:
            med, lo, hi = summary(self.samples[m])
            out[m], out[f"{m}_lo"], out[f"{m}_hi"] = med, lo, hi
        return pd.DataFrame(out)


def score_bands(frame: pd.DataFrame, n: int | None = None, seed: int = 0,
                base: Mapping[str, Any] | None = None, metrics=None) -> Bands:
    """``score`` under ``n`` samples of the fitted parameters (default ``dse.scoring.bands.
    DEFAULT_SAMPLES``), all samples x designs in one scorer call: each catalog entry (chip,
    runtime) gets one draw per sample, shared by every design that uses it (``dse.scoring.bands``)."""
    n = DEFAULT_SAMPLES if n is None else int(n)
    if n < 1:
        raise InputError(f"bands {n}: needs at least one sample", hint="e.g. 64; 0 is `score`")
    table = frame.reset_index(drop=True)
    for k, v in (base or {}).items():
        table[k] = [v] * len(table)
    score(table.iloc[:1].copy())           # the same input checks as ``score``
    dotted = [c for c in table.columns if "." in str(c)]
    resolved = resolve(table[dotted], file="frame",
                       row_names=[f"row {i}" for i in range(len(table))])
    d = draw(n, seed)
    s = frame_samples(resolved, d, metrics=None if metrics is None else tuple(metrics))
    keep = {k: np.asarray(v, float) for k, v in s.items() if k not in ("bound", "reason")}
    return Bands(keep, n, int(seed), d.note)


def predict(cases: PathLike | pd.DataFrame, out: PathLike | None = None) -> pd.DataFrame:
    """``dse predict``: the predictions of a case table (a CSV path, or a DataFrame with the
    CSV's columns, ``docs/predict-format.md``), blank layouts and concurrencies chosen, at
    full precision; ``out``: also write them as a CSV (atomically; 4 significant digits, the
    metrics of infeasible rows blank: ``dse.scoring.predict.csv_frame``)."""
    if isinstance(cases, pd.DataFrame):
        pred = predict_frame(cases, file="cases")
        if out is not None:
            write_csv(csv_frame(pred), str(out))
        return pred
    if out is not None:
        return predict_file(str(cases), str(out))
    return predict_frame(read_cases(str(cases)), file=str(cases))


def predict_train(cases: PathLike | pd.DataFrame, out: PathLike | None = None) -> pd.DataFrame:
    """``dse predict --train``: the predictions of a training case table (a CSV path, or a
    DataFrame with the CSV's columns, ``contracts/train-cases.md``), blank layouts chosen;
    ``out``: also write them as a CSV (atomically)."""
    if isinstance(cases, pd.DataFrame):
        pred = predict_train_frame(cases, file="cases")
        if out is not None:
            write_csv(pred, str(out))
        return pred
    if out is not None:
        return predict_train_file(str(cases), str(out))
    return predict_train_frame(read_train_cases(str(cases)), file=str(cases))


# ------------------------------------------------------------------------------ spaces

_SCRATCH: tempfile.TemporaryDirectory | None = None


def load_space(space: PathLike | Mapping[str, Any]):
    """A space (``dse.build.space.Space``) from a space TOML file, or from a dict with the file's
    structure (``{"accelerator": {"id": ...}, "model": {...}, "parameters": {"layout.tp":
    [1, 2, 4]}, "objectives": {"tpot_s": "minimize"}}``). A dict is written as a TOML file in a
    scratch folder first, so a run of it keeps its own copy like any run."""
    if isinstance(space, Space):
        return space
    if isinstance(space, Mapping):
        global _SCRATCH
        if _SCRATCH is None:
            _SCRATCH = tempfile.TemporaryDirectory(prefix="dse-spaces-")
        doc = dict(space)
        if isinstance(doc.get("objectives"), str):     # an objectives file: from the cwd
            doc["objectives"] = str(Path(doc["objectives"]).resolve())
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(doc.get("name") or "space"))
        text = to_toml(doc)
        import hashlib
        f = Path(_SCRATCH.name) / f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:8]}.toml"
        f.write_text(text)
        return _load(str(f))
    return _load(space_path(str(space)))


# ------------------------------------------------------------------------------ runs

class Run(reader.Run):
    """A run folder (``dse.results.reader.Run``: manifest, space, front, score tables, status,
    ``resume``), with its report."""

    def report(self, out: PathLike | None = None) -> Path:
        """``dse report``: the Pareto report's folder."""
        return make_report(str(self.path), None if out is None else str(out))


def open_run(path: PathLike | reader.Run) -> Run:
    """A run folder (what ``dse run`` printed last) as a Run."""
    return path if isinstance(path, Run) else Run(path if not isinstance(path, reader.Run)
                                                  else path.path)


Strategy = Literal["auto", "exhaustive", "optuna", "nested"]
Sampler = Literal["nsga2", "nsga3", "tpe", "random", "qmc", "gp"]


def run(space: PathLike | Mapping[str, Any], strategy: Strategy | None = "auto", *,
        trials: int | None = None, budget: float | str | None = None,
        out: PathLike | None = None, seed: int = 0, workers: int = 1,
        sampler: Sampler | None = None, population: int | None = None,
        storage: str | None = None, chunk_designs: int | None = None,
        segment_trials: int | None = None, storage_retry: float | str | None = None,
        progress: bool = False) -> Run:
    """Search a space (a file, a dict as ``load_space`` takes, or a loaded Space) as
    ``dse run`` does, and return the run. Every setting of ``dse run`` is an argument here:

    - ``strategy``: "auto" (or None: exhaustive up to 10^8 designs, else optuna), "exhaustive",
      "optuna" or "nested" (``--strategy``);
    - ``trials``: exhaustive: work items (chunks) to do now; optuna/nested: trials in the run
      (default: with a budget, until the budget or the space is spent; else at most 10,000;
      trials that cover the space enumerate it) (``--trials``);
    - ``budget``: seconds, or a duration such as "90s", "45m", "8h" (``--budget``);
    - ``out``: the run folder (default runs/<time>-<space name>) (``--out``);
    - ``seed`` (``--seed``); ``workers``: processes working on the run together, this one
      included; the others are ``dse worker`` processes on the run folder (``--workers``);
    - ``sampler``: Optuna's sampler, one of nsga2, nsga3, tpe, random, qmc, gp (default chosen
      by the run's length, as ``dse run --help`` says) (``--sampler``);
    - ``population``: trials asked and scored per batch (``--population``);
    - ``storage``: an Optuna RDB URL shared with workers (optuna, nested; exhaustive: its chunks
      as trials of a shared study) (``--storage``);
    - ``chunk_designs``: exhaustive designs per work item (``--chunk-designs``);
    - ``segment_trials``: trials per Optuna study before the run rotates to a new one
      warm-started from the front (``--segment-trials``);
    - ``storage_retry``: how long storage calls are retried while the database is unreachable
      (seconds or a duration; ``--storage-retry``);
    - ``progress``: draw the progress bar on stderr (``dse run`` without ``--quiet``).

    Raises ``InputError`` for bad settings (nothing is left behind); a run stopped by a signal
    raises ``KeyboardInterrupt`` and stays resumable (``dse.resume``)."""
    sp = space if isinstance(space, Space) else load_space(space)
    reader.set_storage_retry(storage_retry)
    d = run_space(sp.file, None if out is None else str(out),
                  strategy=None if strategy in (None, "auto") else strategy, trials=trials,
                  budget_s=seconds(budget), workers=workers, seed=seed, storage=storage,
                  population=population, sampler=sampler, progress=progress,
                  chunk_designs=chunk_designs, segment_trials=segment_trials)
    return Run(d)


def resume(path: PathLike | Run, *, trials: int | None = None, budget: float | str | None = None,
           workers: int = 1, storage_retry: float | str | None = None,
           progress: bool = False) -> Run:
    """Continue a stopped or killed run (``dse run --resume DIR``): the run's own settings, its
    copy of the space file, nothing lost and nothing counted twice. ``trials``: exhaustive:
    chunks to do now; optuna/nested: trials to add to the run's total (default: finish the
    run); ``budget``: wall time of this call; ``workers``: processes working together."""
    return open_run(path).resume(trials=trials, budget=budget, workers=workers,
                                 storage_retry=storage_retry, progress=progress)


def work(run: PathLike | Run | None = None, *, storage: str | None = None,
         study: str | None = None, out: PathLike | None = None, trials: int | None = None,
         budget: float | str | None = None, storage_retry: float | str | None = None,
         progress: bool = False) -> Run:
    """Join a run as one more worker (``dse worker``) and return it when the run, or this
    worker's ``trials`` or ``budget``, is done. ``run``: the run folder (workers on one machine
    or a shared filesystem); or, for a worker on another machine, ``storage`` (the Optuna RDB
    URL the run uses) and ``study`` (its study name, the run folder's name): the worker then
    works in a local folder ``out`` (default ``runs/<study>``) that it fills with the run's
    inputs and manifest as the run stored them in the study. ``trials``: trials (exhaustive:
    chunks) this worker does at most; ``budget``: its wall time (seconds or a duration)."""
    reader.set_storage_retry(storage_retry)
    if run is not None:
        d, url = open_run(run).path, None
    else:
        if not (storage and study):
            raise InputError("give a run folder, or a storage URL and a study name",
                             hint="dse.work(run_dir) or dse.work(storage=URL, study=NAME)")
        d, url = driver.worker_folder(storage, study, out), storage
    d = driver.run_space(run_dir=d, join=True, trials=trials, budget_s=seconds(budget),
                         storage_url=url, progress=progress)
    return Run(d)


# ------------------------------------------------------------------------------ analyses

def compare(a: PathLike | Run, b: PathLike | Run, *, bands: int | None = None, seed: int = 0):
    """Two runs' fronts on one reference point (``dse.results.compare.Comparison``): hypervolumes,
    coverage each way, the union front, the best of each objective, designs that appeared or
    vanished; ``.write(out)`` writes ``dse compare``'s files. ``bands``: parameter samples
    (default ``dse.scoring.bands.DEFAULT_SAMPLES``, 0: none) for each objective's best designs'
    90% bands and the probability that A's beats B's (``.bands``)."""
    return compare_runs(str(open_run(a).path), str(open_run(b).path), check_samples(bands),
                        seed)


def whatif(run: PathLike | Run, set: Mapping[str, Any] | list[str] | None = None,
           scale: Mapping[str, float] | list[str] | None = None, out: PathLike | None = None,
           *, reoptimize: bool = False, trials: int | None = None,
           budget: float | str | None = None, progress: bool = False,
           bands: int | None = None, seed: int = 0):
    """Re-score a run's front with fields given values (``set={"accelerator.id": "b300",
    "cost.capex_model": "components", "accelerator.hbm_bw_bytes_per_s": 8e12}``) or multiplied
    (``scale={"accelerator.hbm_bw_bytes_per_s": 1.5}``); ``--set``/``--scale`` strings
    ("PATH=VALUE") are taken too. Writes ``dse whatif``'s page into ``out`` (default
    DIR/whatif) and returns a ``dse.results.whatif.WhatIf`` (``.rescored``, ``.front``,
    ``.sensitivities``, ``.bands``). ``reoptimize``: also search the space again with the change.
    ``bands``: parameter samples for each change's 90% band (default
    ``dse.scoring.bands.DEFAULT_SAMPLES``, 0: none; ``seed``)."""
    r = open_run(run)
    return run_whatif(str(r.path), set, scale, None if out is None else str(out),
                      reoptimize=reoptimize, trials=trials, budget_s=seconds(budget),
                      progress=progress, bands=bands, seed=seed)


__all__ = ["Bands", "Evaluation", "InputError", "Run", "compare", "evaluate", "load_space",
           "open_run", "predict", "predict_train", "resume", "run", "score", "score_bands",
           "to_toml", "whatif"]
