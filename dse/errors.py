"""User-facing errors: one line naming the file, the key or row, and what would be valid."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class InputError(Exception):
    """Bad user input. The CLI prints ``str(err)`` on one line and exits with code 2."""

    def __init__(self, message: str, *, file: str | None = None, where: str | None = None,
                 hint: str | None = None):
        self.message = message
        self.file = file
        self.where = where
        self.hint = hint
        super().__init__(self.render())

    def render(self) -> str:
        parts = []
        if self.file:
            parts.append(str(self.file))
        if self.where:
            parts.append(str(self.where))
        head = ": ".join(parts)
        text = f"{head}: {self.message}" if head else self.message
        if self.hint:
            text = f"{text} ({self.hint})"
        return " ".join(text.split())  # one line, always

    def at(self, *, file: str | None = None, where: str | None = None) -> "InputError":
        """The same error with the file and/or location filled in where missing."""
        return InputError(self.message, file=self.file or file,
                          where=self.where or where, hint=self.hint)


class StorageUnavailable(Exception):
    """The shared storage stayed unreachable past the retry window (exit 1, one line)."""


def suggest(word: str, choices: Iterable[str], what: str = "valid") -> str:
    """A hint naming the closest valid choices, e.g. "did you mean 'h100-sxm'?"."""
    choices = sorted(set(map(str, choices)))
    close = difflib.get_close_matches(str(word), choices, n=3, cutoff=0.5)
    if close:
        return "did you mean " + " or ".join(repr(c) for c in close) + "?"
    shown = ", ".join(choices[:12]) + (", ..." if len(choices) > 12 else "")
    return f"{what}: {shown}"
