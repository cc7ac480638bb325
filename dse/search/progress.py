"""Progress on stderr as a person reads it where it goes: on a terminal a bar rewritten in place
(``\\r``); in a log file or a pipe (stderr not a terminal) a plain line every ``LOG_INTERVAL_S``
seconds and a last one, each ended by a newline, so that ``tail`` and a CI log show them.

``bar(**tqdm_args)`` is the bar of ``dse run`` and ``dse answer`` (``working.Working``; its
postfix is set without a refresh, so that it does not print a line of its own);
``Ticker`` the single line of the answers' parameter samples (``dse.questions.sampled``).
"""

from __future__ import annotations

import math
import sys
import time

LOG_INTERVAL_S = 5.0      # seconds between two progress lines in a log


def is_terminal(f=None) -> bool:
    """Whether ``f`` (default stderr) is a terminal."""
    f = sys.stderr if f is None else f
    try:
        return bool(f.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class _Lines:
    """A file for tqdm that writes each refresh as one line (no ``\\r``, no padding)."""

    def __init__(self, f):
        self.f, self.prev = f, None

    def write(self, s: str) -> None:
        s = s.replace("\r", "").strip()
        if s and s != self.prev:            # closing redraws the last line: said once
            self.f.write(s + "\n")
            self.prev = s

    def flush(self) -> None:
        self.f.flush()


def bar(file=None, **kw):
    """A tqdm progress bar on ``file`` (default stderr): drawn in place on a terminal, plain
    newline-ended lines at most every ``LOG_INTERVAL_S`` seconds elsewhere."""
    from tqdm import tqdm
    f = sys.stderr if file is None else file
    if is_terminal(f):
        return tqdm(file=f, dynamic_ncols=True, mininterval=0.5, **kw)
    # ncols=0: no drawn bar, the counts, the time, the rate and the postfix (``front=...``)
    return tqdm(file=_Lines(f), mininterval=LOG_INTERVAL_S, maxinterval=math.inf, ncols=0, **kw)


class Ticker:
    """One progress line: rewritten in place on a terminal; in a log, written as a line at most
    every ``LOG_INTERVAL_S`` seconds, and the last one always."""

    def __init__(self, file=None):
        self.f = sys.stderr if file is None else file
        self.tty = is_terminal(self.f)
        self.last = -math.inf
        self.said = False

    def say(self, text: str, final: bool = False) -> None:
        if self.tty:
            self.f.write("\r" + text)
            self.said = True
        else:
            now = time.monotonic()
            if not (final or now - self.last >= LOG_INTERVAL_S):
                return
            self.f.write(text.rstrip() + "\n")
            self.last = now
        self.f.flush()

    def close(self) -> None:
        """End the line on a terminal (a log's lines are ended already)."""
        if self.tty and self.said:
            self.f.write("\n")
            self.f.flush()
