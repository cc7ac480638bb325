"""dse: design-space optimizer for LLM serving hardware and models.

The Python API (``dse.api``; the ``dse`` command line is a thin layer over it)::

    import dse
    ev = dse.evaluate("examples/llama70b-h100.toml")   # one design: .metrics, .breakdown
    df = dse.score(frame)                               # a DataFrame of designs, vectorized
    space = dse.load_space("spaces/quickstart.toml")    # or a dict with the file's structure
    run = dse.run(space, strategy="optuna", trials=500, sampler="tpe", population=4,
                  budget="10m", workers=2, seed=0, out="runs/x")   # every `dse run` setting
    run.front, run.scores, run.status                   # DataFrames; `dse status --json`
    run = dse.open_run("runs/...")                      # a run folder
    run = dse.resume("runs/...")                        # or run.resume(): `dse run --resume`
    dse.work("runs/...", trials=200)                    # `dse worker`: one more worker on it
    pred = dse.predict("cases.csv")                     # `dse predict`: a case table
    w = dse.whatif(run, set={"accelerator.id": "b300"}, scale={"cost.pue": 1.1})
    c = dse.compare(run_a, run_b)                       # hypervolumes, coverage; c.write(out)

Bad input raises ``dse.InputError`` (one line: the file, the key or row, what is valid).
"""

from typing import TYPE_CHECKING

from dse.version import __version__

_API = ("Bands", "Evaluation", "Run", "compare", "evaluate", "load_space", "open_run",
        "predict", "resume", "run", "score", "score_bands", "whatif", "work")

if TYPE_CHECKING:
    from dse.api import (
        Bands,
        Evaluation,
        Run,
        compare,
        evaluate,
        load_space,
        open_run,
        predict,
        resume,
        run,
        score,
        score_bands,
        whatif,
        work,
    )
    from dse.errors import InputError


def __getattr__(name: str):
    """The API is imported on first use: ``import dse.perf`` stays numpy-only."""
    if name in _API:
        from dse import api
        globals()[name] = value = getattr(api, name)
        return value
    if name == "InputError":
        from dse.errors import InputError
        return InputError
    raise AttributeError(f"module 'dse' has no attribute {name!r}")


__all__ = ["InputError", "__version__", *_API]


def __dir__() -> list[str]:
    """The public API (what ``dir(dse)`` and a notebook's completion list), not the
    submodules and helpers an import happens to bind."""
    return sorted(__all__)
