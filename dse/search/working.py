"""A run at work: SIGINT/SIGTERM as a request to stop after the work item at hand, and its
progress bar (rate, ETA, front size, hypervolume)."""

from __future__ import annotations

import sys
from pathlib import Path

from dse.search.progress import bar as progress_bar


class Interrupted(KeyboardInterrupt):
    """A run stopped by SIGINT/SIGTERM after its work item at hand: resumable; exit 128 + signal."""

    def __init__(self, signum: int, d: Path):
        self.signum, self.d = signum, d
        super().__init__(f"interrupted: the run is stopped and resumable "
                         f"(dse run --resume {d})")


class Working:
    """A run at work (its owner lock or live token is ``locks``'s, held by the caller): Ctrl-C
    and SIGTERM turned into a request to stop after the work item at hand (then ``Interrupted``
    is raised: exit 130 or 143, the run resumable), and a progress bar with rate, ETA, front
    size and hypervolume (``dse.search.progress.bar``: plain lines every few seconds when
    stderr is not a terminal)."""

    def __init__(self, d: Path, progress: bool, by_time: bool = False, **bar):
        self.d, self.progress, self.bar_args, self.stop, self.bar = Path(d), progress, bar, False, None
        self.signum, self.by_time = None, by_time
        self._said_reference = False

    def _on_signal(self, signum, frame):
        self.stop = True
        self.signum = signum

    def __enter__(self) -> Working:
        import signal
        self._old = [signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)]
        if self.progress:
            self.bar = progress_bar(**self.bar_args)
        return self

    def update(self, n: int, front_size: int, hv, elapsed: float | None = None,
               done: int | None = None, reference: str | None = None) -> None:
        """``n`` more work items done; a bar ``by_time`` (a run with a budget) shows the
        budget's seconds spent instead, and the work done as a figure. ``reference``: the
        hypervolume's reference point in words, printed above the bar once it is set (the bar's
        ``hv`` is measured against it)."""
        if not self.bar:
            return
        if reference and not self._said_reference:
            self.bar.write(f"hv: the front's hypervolume, {reference}", file=sys.stderr)
            self._said_reference = True
        post = {"front": front_size, "hv": f"{hv:.4g}" if hv is not None else "-"}
        if self.by_time and elapsed is not None and done is not None:
            post = {"done": f"{done:,}", **post}
        self.bar.set_postfix(post, refresh=False)      # shown by the update (a log: one line)
        if self.by_time and elapsed is not None:
            self.bar.update(max(min(round(elapsed), self.bar.total) - self.bar.n, 0))
        else:
            self.bar.update(n)

    def __exit__(self, *exc) -> None:
        import signal
        if self.bar:
            self.bar.close()
        for s, h in zip((signal.SIGINT, signal.SIGTERM), self._old):
            signal.signal(s, h)
        if self.signum is not None and (not exc or exc[0] is None):
            raise Interrupted(self.signum, self.d)


