"""Study segments of a shared (RDB) study: rotation when several workers share one study.

A study's history is capped at ``segment_trials`` trials, then a new study ``<name>-s<k>`` is
started, warm-started with the front's designs, so that samplers that scan the whole history
(NSGA-II, TPE) keep their speed over long runs. With a shared storage the segments live where
every worker sees them:

- the segment in use is the highest existing ``<name>-s<k>`` (probed by name before each batch,
  one query); a worker that finds it full creates the next one (``create_new_study`` is atomic:
  the worker that loses the race only loads it, so the warm start is enqueued once, or at worst
  a few times when a worker looks between creation and enqueue: never a lost trial);
- counts (completed, failed, running, waiting) are over every segment, by one SQL query, so a
  run of N trials stops at N in total;
- heartbeats: a segment with running trials has its stale ones failed; the retry lands in that
  segment as a waiting trial, which the next worker to look asks from that segment before asking
  the newest one, so a dead worker's trial is retried in whatever segment it was asked.
"""

from __future__ import annotations

import collections

import sqlalchemy as sa

# Optuna's RDB schema (the ``trials`` table), read with SQL instead of Optuna's private models
TRIALS = sa.table("trials", sa.column("trial_id"), sa.column("study_id"), sa.column("state"))

GRACE_S = 10     # a trial silent this long belongs to a dead worker: failed, then retried


def trial_id(storage, study_name: str, number: int) -> int:
    return storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name(study_name), number)


class Silent:
    """Trials whose worker died before its first heartbeat stay RUNNING with none, and Optuna's
    stale-trial check never sees them. A worker that finds a trial running for longer than the
    grace period records one heartbeat for it, once: a live owner keeps beating it, a dead
    one's goes stale one grace period later and the trial is failed and retried like any
    other."""

    def __init__(self):
        self.seen: set[tuple[str, int]] = set()

    def adopt(self, storage, study) -> None:
        import datetime as dt

        from optuna.trial import TrialState
        now = dt.datetime.now()
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            key = (study.study_name, t.number)
            if key in self.seen or t.datetime_start is None or \
                    (now - t.datetime_start).total_seconds() < GRACE_S:
                continue
            storage.record_heartbeat(trial_id(storage, study.study_name, t.number))
            self.seen.add(key)


def segment_name(base: str, k: int) -> str:
    return base if k == 0 else f"{base}-s{k}"


def study_ids(storage, base: str, start: int = 0) -> dict[int, int]:
    """{segment: study id} of every existing segment from ``start`` on (they are contiguous)."""
    out, k = {}, start
    while True:
        try:
            out[k] = storage.get_study_id_from_name(segment_name(base, k))
        except KeyError:
            return out
        k += 1


def state_counts(storage, ids: dict[int, int]) -> dict[int, collections.Counter]:
    """Per segment, trials per state name (COMPLETE, FAIL, RUNNING, WAITING, PRUNED)."""
    out = {k: collections.Counter() for k in ids}
    by_id = {v: k for k, v in ids.items()}
    engine = getattr(storage, "engine", None)
    if engine is None:                       # not an RDB storage: count the trials themselves
        for k, sid in ids.items():
            for t in storage.get_all_trials(sid, deepcopy=False):
                out[k][t.state.name] += 1
        return out
    q = (sa.select(TRIALS.c.study_id, TRIALS.c.state, sa.func.count())
         .where(TRIALS.c.study_id.in_(list(by_id))).group_by(TRIALS.c.study_id, TRIALS.c.state))
    with engine.connect() as c:
        for sid, state, n in c.execute(q):
            out[by_id[sid]][state.name if hasattr(state, "name") else str(state)] += int(n)
    return out


class Segments:
    """The segments of one shared study, as this worker sees them.

    ``load(k, newest)`` returns the Optuna study of segment ``k`` (``newest``: with the run's
    sampler; an older segment only hands out its retried, fixed trials). ``warm(new, previous)``
    enqueues the warm start of a segment this worker created.
    """

    def __init__(self, storage, base: str, cap: int, load, warm):
        self.storage, self.base, self.cap, self._load, self._warm = storage, base, cap, load, warm
        self.silent = Silent()
        self.ids = study_ids(storage, base, 0)
        self.studies: dict[int, object] = {}
        self.newest = max(self.ids)
        self.counts: dict[int, collections.Counter] = {}

    def study(self, k: int | None = None):
        k = self.newest if k is None else k
        if k not in self.studies:
            self.studies[k] = self._load(k, k == self.newest)
        return self.studies[k]

    def refresh(self) -> None:
        """Find segments other workers created; fail stale trials; count every state."""
        from optuna.storages import fail_stale_trials
        new = study_ids(self.storage, self.base, self.newest + 1)
        if new:
            self.ids.update(new)
            old = self.newest
            self.newest = max(new)
            self.studies.pop(old, None)       # asked from again only for retries: a cheap sampler
        counts = state_counts(self.storage, self.ids)
        stale = [k for k, c in counts.items() if c["RUNNING"]]
        for k in stale:
            self.silent.adopt(self.storage, self.study(k))   # died before a first heartbeat
            fail_stale_trials(self.study(k))
        self.counts = state_counts(self.storage, self.ids) if stale else counts

    def total(self, state: str) -> int:
        return sum(c[state] for c in self.counts.values())

    def full(self) -> bool:
        return sum(self.counts.get(self.newest, {}).values()) >= self.cap

    def rotate(self) -> bool:
        """Create the next segment (or find that another worker did); switch to it. True when
        this worker created it (and so enqueued its warm start)."""
        from optuna.exceptions import DuplicatedStudyError
        from optuna.study import StudyDirection
        cur = self.study()
        k = self.newest + 1
        try:
            self.storage.create_new_study(
                [StudyDirection[d.name] for d in cur.directions], segment_name(self.base, k))
            created = True
        except DuplicatedStudyError:
            created = False
        self.ids[k] = self.storage.get_study_id_from_name(segment_name(self.base, k))
        self.studies.pop(self.newest, None)
        self.newest = k
        if created:
            self._warm(self.study(), cur)
        self.counts[k] = collections.Counter()
        return created

    def waiting_elsewhere(self) -> int | None:
        """An older segment with waiting (retried) trials, if any: ask those first."""
        return next((k for k in sorted(self.counts)
                     if k != self.newest and self.counts[k]["WAITING"]), None)

    def all_studies(self) -> list:
        return [self.study(k) for k in sorted(self.ids)]
