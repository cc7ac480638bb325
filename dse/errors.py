"""User-facing errors: one line naming the file, the key or row, and what would be valid.

Exit codes of the ``dse`` command: 0 done; 1 an internal error, or a shared storage that stayed
unreachable past its retry window (``StorageUnavailable``); 2 bad input (``InputError``: a file,
a flag, a corrupt run folder, a storage URL that can never work: ``StorageError``); 3 the
environment refused a file operation (``EnvironmentFault``: disk full, read-only file system,
permission denied), naming the path; 128 + N stopped by signal N (130: Ctrl-C), resumable.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from contextlib import contextmanager


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


class RowNames:
    """The rows' names for messages (``names[i]``, ``len(names)``), each made when a message
    asks for it: a table of 200,000 rows names one row when it fails, not all of them."""

    def __init__(self, n: int, name):
        self.n, self.name = n, name

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i) -> str:
        i = int(i)
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.name(i)


class StorageError(InputError):
    """A storage that waiting will not cure (exit 2, one line naming the cause in full): a bad
    URL or scheme, a missing driver, authentication, an unknown or dropped database, nothing
    listening when the command starts."""

    def resumable(self, note: str) -> StorageError:
        """The same error saying how to pick the run up again (where a run folder exists)."""
        return StorageError(self.message, file=self.file, where=self.where,
                            hint=f"{self.hint}; {note}" if self.hint else note)


class StorageUnavailable(Exception):
    """The shared storage stayed unreachable past the retry window (exit 1, one line)."""

    def resumable(self, note: str) -> StorageUnavailable:
        return StorageUnavailable(f"{self}; {note}")


EXIT_ENVIRONMENT = 3
ENVIRONMENT_ERRNOS = {"ENOSPC": "no space left on the device", "EDQUOT": "disk quota exceeded",
                      "EROFS": "read-only file system", "EACCES": "permission denied",
                      "EPERM": "operation not permitted"}


class EnvironmentFault(Exception):
    """The environment refused a file operation: disk full (ENOSPC, EDQUOT), read-only file
    system (EROFS), permission denied (EACCES, EPERM). Exit 3, one line naming the path."""

    def __init__(self, path, cause: str):
        self.path, self.cause = str(path), cause
        super().__init__(f"{self.path}: {cause}")

    @classmethod
    def of(cls, e: OSError, path=None) -> EnvironmentFault | None:
        """The fault an ``OSError`` is (None: another OSError, not the environment's), named by
        ``path`` (the file the user asked for), else the error's own file name. pyarrow's
        errors carry no errno: their text is read."""
        import errno
        name = errno.errorcode.get(e.errno or 0, "")
        if name not in ENVIRONMENT_ERRNOS:
            text = str(e).lower()
            name = next((n for n, t in _STRERRORS.items() if t in text), "")
            if not name:
                return None
        where = path or e.filename or "the output"
        return cls(where, ENVIRONMENT_ERRNOS[name])


_STRERRORS = {"ENOSPC": "no space left on device", "EDQUOT": "disk quota exceeded",
              "EROFS": "read-only file system", "EACCES": "permission denied"}


@contextmanager
def writing(path, *cleanup):
    """Around a write of ``path``: an ``OSError`` of the environment (disk full, read-only,
    permission) becomes an ``EnvironmentFault`` naming ``path``; on any failure the files in
    ``cleanup`` (temporary ones) are removed."""
    import os
    try:
        yield
    except BaseException as e:
        for f in cleanup:
            try:
                os.unlink(f)
            except OSError:
                pass
        fault = EnvironmentFault.of(e, path) if isinstance(e, OSError) else None
        if fault is None:
            raise
        raise fault from None


def suggest(word: str, choices: Iterable[str], what: str = "valid") -> str:
    """A hint naming the closest valid choices, e.g. "did you mean 'h100-sxm'?"."""
    choices = sorted(set(map(str, choices)))
    close = difflib.get_close_matches(str(word), choices, n=3, cutoff=0.5)
    if close:
        return "did you mean " + " or ".join(repr(c) for c in close) + "?"
    shown = ", ".join(choices[:12]) + (", ..." if len(choices) > 12 else "")
    return f"{what}: {shown}"
