"""Optuna bookkeeping shared by the optuna, nested and sharded strategies, on Optuna's public API.

- the storage (a run folder's journal, or an RDB reached with retries while it is down);
- heartbeats of running trials and the errors of trials another worker finished;
- how a design's parameters are written into a trial so that Optuna's tools (optuna-dashboard,
  ``study.trials_dataframe()``) show what a user expects: a categorical parameter by its value
  (``accelerator.id = "h100-sxm"``), a numeric grid of equal steps by its value (an
  ``IntDistribution``/``FloatDistribution`` with that step, so samplers see the order), any other
  numeric grid (``layout.tp = [1, 2, 4, 8]``, log-spaced batch sizes) as its position
  ``layout.tp[i]`` (samplers see the order; the values are in the study's user attr ``grids``),
  its real value beside it as the trial's user attr ``layout.tp`` (optuna-dashboard lists user
  attrs with each trial; ``trials_dataframe()`` has them as ``user_attrs_layout.tp``); a
  scale-factor parameter is named ``<path>.scale`` (``accelerator.hbm_bw_bytes_per_s.scale``:
  factors of the base design's value, not bytes per second), as in every table;
- constraint values in the trial's system attr ``constraints`` (a list, where Optuna's own
  samplers put them and optuna-dashboard reads them; their names are the study's user attr
  ``constraint_names``) and objective names set with ``study.set_metric_names``;
- the fronts stored with trials (small JSON payloads) and fronts assembled from studies.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dse import pareto
from dse.errors import StorageUnavailable
from dse.search import journal, locks
from dse.search.optuna import segments, storage_errors
from dse.units import parse_duration

HEARTBEAT_S = 2      # a worker records each running trial's heartbeat this often
GRACE_S = segments.GRACE_S   # a trial silent this long belongs to a dead worker: failed, retried
CONSTRAINTS_ATTR = "constraints"   # the trial system attr Optuna's samplers write and read


# --- storage and retries ----------------------------------------------------------------------

def storage_for(d, url: str | None, known: bool = False):
    """The run's Optuna storage: the RDB at ``url``, else the run folder's journal (absolute
    path, owner-recording lock: see ``journal.open_journal``). A URL that can never work (bad
    scheme, authentication, unknown database) is a ``StorageError`` at once
    (``storage_errors``), and so is nothing listening or an unknown host where the URL is new
    (typed for a new run or a worker). ``known``: the URL of a run that used it already (its
    manifest's: a resume, a worker joining its folder ``d``). There a refused connection is
    an outage, waited for, only while the run is live: another process owns the run folder or
    holds a live token in it (``locks.at_work``), so this one joins a run whose database went
    away under it. A resume or a worker alone on its folder is a start like any other: nothing
    listening is one line, exit 2, at once. A server starting or stopping is always waited for."""
    if url:
        import warnings

        import optuna

        def connect():
            with warnings.catch_warnings():     # heartbeats are experimental in Optuna
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    url, engine_kwargs=_engine_kwargs(url), heartbeat_interval=HEARTBEAT_S,
                    grace_period=GRACE_S,
                    heartbeat_stale_trial_callback=optuna.storages.
                    RetryHeartbeatStaleTrialCallback(max_retry=3))
        global _URL
        live = known and d is not None and locks.at_work(d)
        storage = _retrying(connect, url, start=url != _URL and not live)
        _URL = url
        return storage
    return journal.open_journal(d)


_URL: str | None = None    # the RDB last connected to: named by the errors of later calls
CONNECT_TIMEOUT_S = 10     # PostgreSQL: a host that never answers is given up on at the start


def _engine_kwargs(url: str) -> dict:
    kw: dict = {"pool_pre_ping": True}
    if url.split(":", 1)[0].split("+")[0] in ("postgresql", "postgres") and \
            "connect_timeout" not in url:
        kw["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
    return kw


STORAGE_RETRY_S: float | None = None   # set by --storage-retry; else DSE_STORAGE_RETRY, else 300 s


def set_storage_retry(seconds: float | None) -> None:
    global STORAGE_RETRY_S
    STORAGE_RETRY_S = seconds


def _retry_window() -> float:
    text = os.environ.get("DSE_STORAGE_RETRY", "")
    if not text:
        return 300.0
    return parse_duration(text, "DSE_STORAGE_RETRY")


def _transient(e: BaseException) -> bool:
    import sqlalchemy.exc
    from optuna.exceptions import StorageInternalError
    if isinstance(e, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError,
                      StorageInternalError, ConnectionError)):
        return True
    return isinstance(e, sqlalchemy.exc.DBAPIError) and bool(e.connection_invalidated)


def with_retry(fn, *args, **kw):
    """Call a storage operation, retrying with backoff (0.5 s doubling to 15 s) while the
    database is unreachable (a server restart, a network blip), for the storage retry window
    (``--storage-retry``, ``DSE_STORAGE_RETRY``; default 300 s); a warning once the first retry
    fails too and every 30 s, then ``StorageUnavailable`` once the window is spent. An error that waiting
    never cures (a dropped database, a changed password) is a ``StorageError`` at once."""
    return _retrying(lambda: fn(*args, **kw), _URL)


def _retrying(call, url: str | None, start: bool = False):
    window = STORAGE_RETRY_S if STORAGE_RETRY_S is not None else _retry_window()
    t0, delay, said, tries = time.monotonic(), 0.5, -1e9, 0
    while True:
        try:
            return call()
        except Exception as e:
            tries += 1
            bad = storage_errors.permanent(e, url, start=start)
            if bad is not None:
                raise bad from None
            if not _transient(e):
                raise
            waited = time.monotonic() - t0
            msg = storage_errors.text_of(e)
            if waited + delay > window:
                raise StorageUnavailable(f"the storage has been unreachable for {waited:.0f} s "
                                         f"({msg}); --storage-retry sets how long to wait") \
                    from None
            if tries >= 2 and waited - said >= 30:   # the first retry failed too: an outage
                print(f"dse: warning: storage unreachable ({msg}); retrying for up to "
                      f"{window:.0f} s", file=sys.stderr)
                said = waited
            time.sleep(delay)
            delay = min(delay * 2, 15.0)


def told_already(e: BaseException) -> bool:
    """A tell whose commit reached the database before the connection dropped: retried, it
    finds the trial complete (our own result, stored once)."""
    return isinstance(e, ValueError) and "Cannot tell a COMPLETE trial" in str(e)


def finished_elsewhere(e: BaseException) -> bool:
    """A write to a trial another process has finished: a worker's trial failed as stale (its
    heartbeat stopped, e.g. during a database outage) and retried elsewhere."""
    from optuna.exceptions import UpdateFinishedTrialError
    return isinstance(e, UpdateFinishedTrialError) or (
        isinstance(e, RuntimeError) and "finished" in str(e).lower()) or (
        isinstance(e, ValueError) and "Cannot tell a " in str(e) and not told_already(e))


class TrialIds:
    """Storage trial ids by (study name, trial number), from Optuna's public storage API."""

    def __init__(self, storage):
        self.storage, self.studies = storage, {}

    def __call__(self, study_name: str, number: int) -> int:
        if study_name not in self.studies:
            self.studies[study_name] = self.storage.get_study_id_from_name(study_name)
        return self.storage.get_trial_id_from_study_id_trial_number(self.studies[study_name],
                                                                    number)


class Heartbeat:
    """Records the heartbeat of running trials every HEARTBEAT_S while they are scored (a
    batch may take longer than the grace period)."""

    def __init__(self, storage, trial_ids: list[int]):
        import threading
        self.storage, self.ids, self.done = storage, list(trial_ids), threading.Event()
        self._beat_once()
        self.thread = threading.Thread(target=self._beat, daemon=True)
        self.thread.start()

    def _beat_once(self):
        for tid in self.ids:
            try:
                self.storage.record_heartbeat(tid)
            except Exception:     # a lost connection: the main thread's retries report it
                return

    def _beat(self):
        while not self.done.wait(HEARTBEAT_S):
            self._beat_once()

    def stop(self):
        self.done.set()
        self.thread.join()


# --- parameters: real values where Optuna can hold them --------------------------------------

def is_ordered(p) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in p.values)


@dataclass(frozen=True)
class Param:
    """How one space parameter is written into a trial: its name, distribution, and whether the
    trial holds the value itself (``by_value``) or its grid position."""
    name: str
    distribution: object
    by_value: bool
    values: tuple
    legacy: str = ""      # the name runs before the ``<path>.scale`` rule gave it (read only)

    def encode(self, i: int):
        return self.values[int(i)] if self.by_value else int(i)

    def decode(self, v) -> int:
        if not self.by_value:
            return int(v)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and _ordered_values(self.values):
            return int(np.argmin(np.abs(np.asarray(self.values, np.float64) - float(v))))
        return self.values.index(v)


def _ordered_values(values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _equal_steps(values) -> float | None:
    v = np.asarray(values, dtype=np.float64)
    if len(v) < 2 or not np.all(np.diff(v) > 0):
        return None
    d = np.diff(v)
    return float(d[0]) if np.allclose(d, d[0], rtol=1e-9, atol=0) else None


def encoding(space) -> dict[str, Param]:
    """{parameter path: Param}: the same grid as the exhaustive strategy (designs have the same
    ids whatever strategy scored them), each parameter as close to its real value as Optuna's
    distributions allow."""
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )
    cache = space.__dict__.setdefault("_optuna_encoding", {})
    if cache:
        return cache
    for p in space.parameters:
        vals = tuple(p.values)
        step = _equal_steps(vals) if is_ordered(p) else None
        # a scale factor is named as such (``accelerator.hbm_bw_bytes_per_s.scale``): never
        # stored under the name of the field, whose unit (bytes/s) it does not have
        name, old = p.column, (p.path if p.scale else "")
        if not is_ordered(p) or len(vals) == 1:
            cache[p.path] = Param(name, CategoricalDistribution(list(vals)), True, vals, old)
        elif step is not None and all(isinstance(v, int) for v in vals):
            cache[p.path] = Param(name, IntDistribution(vals[0], vals[-1], step=int(step)),
                                  True, vals, old)
        elif step is not None:
            cache[p.path] = Param(name, FloatDistribution(float(vals[0]), float(vals[-1]),
                                                          step=step), True, vals, old)
        else:
            cache[p.path] = Param(f"{name}[i]", IntDistribution(0, len(vals) - 1), False, vals,
                                  f"{old}[i]" if old else "")
    return cache


def distributions(space, positions=None) -> dict:
    """{trial parameter name: Optuna distribution} of the parameters at ``positions``
    (default: all)."""
    enc = list(encoding(space).values())
    idx = range(len(enc)) if positions is None else positions
    return {enc[i].name: enc[i].distribution for i in idx}


def params_of(space, coords, positions) -> dict:
    """A trial's parameters for grid coordinates ``coords`` (one per position)."""
    enc = list(encoding(space).values())
    return {enc[i].name: enc[i].encode(c) for i, c in zip(positions, coords)}


def real_values(params: dict, space) -> dict:
    """{parameter path: its value} of the trial's parameters stored by grid position (the
    trial's user attrs: what optuna-dashboard shows beside the position)."""
    out = {}
    for p in encoding(space).values():
        if not p.by_value and p.name in params:
            v = p.values[int(params[p.name])]
            out[p.name[:-3]] = v.item() if hasattr(v, "item") else v
    return out


def set_real_values(trial, space) -> None:
    """Write ``real_values`` of a trial (an asked ``optuna.Trial``) as its user attrs."""
    for k, v in real_values(trial.params, space).items():
        trial.set_user_attr(k, v)


def coords_of(space, params: dict, positions) -> list[int] | None:
    """Grid coordinates of a trial's parameters at ``positions`` (None: one is missing)."""
    enc = list(encoding(space).values())
    try:
        return [enc[i].decode(params[enc[i].name] if enc[i].name in params or not enc[i].legacy
                              else params[enc[i].legacy]) for i in positions]
    except (KeyError, ValueError):
        return None


def point_key(space, params: dict, positions) -> int | None:
    """A trial's design (every position) or nested point (the outer positions) as one flat
    index of that grid; None when a parameter is missing."""
    c = coords_of(space, params, positions)
    if c is None:
        return None
    return int(np.ravel_multi_index(c, [space.shape[i] for i in positions])) if positions else 0


def grid_index(space, trials) -> np.ndarray:
    """Per trial, the index into each parameter's values (columns in parameter order)."""
    pos = range(len(space.parameters))
    return np.array([coords_of(space, t.params, pos) for t in trials], dtype=np.int64)


def describe(study, space, nested: bool, constraint_names: list[str]) -> None:
    """Names Optuna's tools show: the objectives (``set_metric_names``), the constraints, and
    the grids of parameters stored by position."""
    names = ["front_hypervolume"] if nested else [o.metric for o in space.objectives]
    if study.metric_names != names:
        with_retry(study.set_metric_names, names)
    attrs = with_retry(lambda: study.user_attrs)
    if attrs.get("constraint_names") != constraint_names:
        with_retry(study.set_user_attr, "constraint_names", constraint_names)
    grids = {p.name: list(p.values) for p in encoding(space).values() if not p.by_value}
    if grids and attrs.get("grids") != grids:
        with_retry(study.set_user_attr, "grids", grids)


def set_constraints(storage, trial_id: int, values) -> None:
    """A trial's constraint values (<= 0 feasible), where Optuna's samplers and dashboard read
    them."""
    storage.set_trial_system_attr(trial_id, CONSTRAINTS_ATTR, [float(v) for v in values])


def feasible(t) -> bool:
    cons = t.constraints or {}
    return not any(v > 0 for v in (cons.values() if isinstance(cons, dict) else cons))


# --- fronts stored with trials ----------------------------------------------------------------

def front_payload(ids: np.ndarray, values: dict) -> str:
    """A trial's front as a small JSON payload: design ids and objective values (row-major)."""
    F = np.column_stack([np.asarray(v, dtype=np.float64) for v in values.values()]) \
        if len(ids) else np.zeros((0, len(values)))
    return json.dumps({"ids": [int(i) for i in ids], "F": F.ravel().tolist()},
                      separators=(",", ":"))


def payload_frame(payload: str, space) -> pd.DataFrame:
    """A ``front_payload`` back as a table of design_id and objective values."""
    f = json.loads(payload)
    metrics = [o.metric for o in space.objectives]
    df = pd.DataFrame(np.asarray(f["F"], dtype=np.float64).reshape(len(f["ids"]), len(metrics)),
                      columns=metrics)
    df.insert(0, "design_id", np.asarray(f["ids"], dtype=np.int64))
    return df


def _with_parameters(front: pd.DataFrame, space) -> pd.DataFrame:
    if len(front):
        for p, v in space.values_at(front["design_id"].to_numpy()).items():
            front[p] = v
    return front


def front_from_payloads(studies, space) -> pd.DataFrame:
    """The Pareto set of the fronts stored with the completed trials of a shared nested run
    (every worker's, every segment's), with the parameters of each design."""
    from optuna.trial import TrialState
    frames = [payload_frame(t.user_attrs["front"], space)
              for s in studies for t in s.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
              if "front" in t.user_attrs]
    return _with_parameters(pareto.front_of([f for f in frames if len(f)], space.objectives),
                            space)


def front_from_study(study, space) -> pd.DataFrame:
    """The Pareto set of every completed, feasible trial of a (shared) study, or of a list of
    studies (its segments): objective values are the trial values, parameters follow from the
    trial's parameters."""
    from optuna.trial import TrialState
    studies = study if isinstance(study, (list, tuple)) else [study]
    pos = range(len(space.parameters))
    rows = []
    for s in studies:
        for t in s.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            coords = coords_of(space, t.params, pos)
            if not feasible(t) or coords is None:
                continue
            rows.append({"design_id": int(np.ravel_multi_index(coords, space.shape)) if coords
                         else 0, **{o.metric: v for o, v in zip(space.objectives, t.values)}})
    if not rows:
        return pd.DataFrame()
    return pareto.front_of([_with_parameters(pd.DataFrame(rows), space)], space.objectives)
