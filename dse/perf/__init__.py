"""The serving performance model: pure numpy, struct-of-arrays in, score table out.

Nothing in this package does I/O or imports optuna, pandas or networkx (a test enforces it).
Every function takes arrays with one row per candidate design and never loops over rows.
"""

from dse.perf.batch import FIELDS, Batch
from dse.perf.memory_fit import BOUNDS, KNEE_FRACTION, REASONS, decode_bound
from dse.perf.serve import METRICS, OPS, Breakdown, score, score_chunked
from dse.perf.step import bound_shares, op_bound

__all__ = ["BOUNDS", "Batch", "Breakdown", "FIELDS", "KNEE_FRACTION", "METRICS", "OPS", "REASONS",
           "bound_shares", "decode_bound", "op_bound", "score", "score_chunked"]
