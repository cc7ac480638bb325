"""Worked questions: a space file with an ``[answer]`` table, searched, reported and answered
(``answer``: the context an analysis gets, the run and the files written; ``common``: helpers
the analyses share; ``sampled``: an answer's numbers under parameter samples). Every other module
here is an analysis, named by its ``[answer] analysis`` (``fast-mode`` is ``fast_mode.py``)."""
