"""A case CSV read as a stream of chunks: memory bounded whatever the file's size.

``chunks(path, rows)`` yields (offset, table of strings) — at most ``rows`` cases and about
``CHUNK_CHARS`` characters each, the offset being the chunk's first case, so that every message
names the row as the file has it (``row 2`` is the first case; blank lines are skipped, as
pandas does). A field over ``MAX_FIELD_CHARS`` or a line (a record) over ``MAX_LINE_CHARS`` is
refused with its row, before it is held in memory: a case field is an id, a name or a number.
``DuplicateIds`` finds a case id seen before in bounded memory (8 bytes per case: hashes,
a match confirmed by reading the file again).
"""

from __future__ import annotations

import csv
import gc
import os
from collections.abc import Iterator

import numpy as np
import pandas as pd

from dse.errors import InputError

MAX_FIELD_CHARS = 1 << 20     # 1 MiB of text: longer is refused (a case field is short)
MAX_LINE_CHARS = 4 << 20      # ... and a record over 4 MiB (a CSV line, or lines of a quoted field)
CHUNK_CHARS = 16 << 20        # text per chunk at most, as read (the scoring chunks again by rows)


class _TooLong(Exception):
    pass


def _open(path: str):
    if os.path.isdir(path):
        raise InputError("is a directory, not a case file", file=path,
                         hint="give the path of a case CSV")
    try:
        return open(path, encoding="utf-8-sig", newline="")
    except FileNotFoundError:
        raise InputError("file not found", file=path, hint="give the path of a case CSV") from None
    except OSError as e:
        raise InputError(f"cannot read the file ({e.strerror or type(e).__name__})", file=path,
                         hint="give the path of a readable case CSV") from None


def records(path: str, chars: list[int] | None = None) -> Iterator[tuple[int, list[str]]]:
    """(row number, fields) of every non-blank record; the header is row 1. ``chars``: a
    one-item list that counts the characters read so far."""
    f = _open(path)
    taken = [0]
    read = chars if chars is not None else [0]

    def lines():
        while True:
            line = f.readline(MAX_LINE_CHARS + 1)
            if not line:
                return
            taken[0] += len(line)
            read[0] += len(line)
            if taken[0] > MAX_LINE_CHARS:
                # one field that long (no comma in it) is named as such, else the line
                raise _TooLong(max(map(len, line.split(","))) > MAX_FIELD_CHARS)
            yield line

    old = csv.field_size_limit()
    csv.field_size_limit(MAX_FIELD_CHARS)
    row = 1
    try:
        reader = csv.reader(lines())
        while True:
            try:
                rec = next(reader)
            except StopIteration:
                return
            except _TooLong as e:
                what = (f"a field longer than {MAX_FIELD_CHARS:,} characters" if e.args[0]
                        else f"a line longer than {MAX_LINE_CHARS:,} characters")
                raise InputError(what, file=path, where=f"row {row}", hint=_HINT) from None
            except csv.Error as e:
                if "field larger than field limit" in str(e):
                    raise InputError(f"a field longer than {MAX_FIELD_CHARS:,} characters",
                                     file=path, where=f"row {row}", hint=_HINT) from None
                raise InputError(f"not a readable CSV ({e})", file=path,
                                 where=f"row {row}") from None
            except UnicodeDecodeError as e:
                raise InputError(f"not a readable CSV ({str(e).splitlines()[0]})", file=path,
                                 where=f"row {row}", hint="save it as UTF-8") from None
            except OSError as e:
                raise InputError(f"cannot read the file ({e.strerror or type(e).__name__})",
                                 file=path) from None
            taken[0] = 0
            if not rec or (len(rec) == 1 and rec[0] == ""):
                continue             # a blank line
            yield row, rec
            row += 1
    finally:
        csv.field_size_limit(old)
        f.close()


_HINT = "a case field is an id, a name or a number: is this a case file?"


def chunks(path: str, rows: int) -> Iterator[tuple[list[str], int, pd.DataFrame]]:
    """(header, offset, chunk): the cases as tables of strings (blank: NaN), ``rows`` at most
    each. A header with no row after it yields nothing; an empty file is refused."""
    chars = [0]                  # the characters read (a chunk's: since its first record)
    it = records(path, chars)
    first = next(it, None)
    if first is None:
        raise InputError("not a readable CSV (the file is empty: no header row)", file=path,
                         hint="the first line names the columns (docs/predict-format.md)")
    header = first[1]
    width, buf, start, offset = len(header), [], chars[0], 0
    # Python's cycle collector is off while a chunk's records pile up: 50,000 lists of
    # strings that survive made it walk them again and again (a third of the reading time,
    # measured on 200,000 cases); they hold no cycles. It is on while the caller has the chunk.
    collect = gc.isenabled()
    gc.disable()
    try:
        for row, rec in it:
            if len(rec) != width:
                if len(rec) > width:
                    raise InputError(f"not a readable CSV (row {row} has {len(rec)} fields, "
                                     f"the header {width})", file=path, where=f"row {row}")
                rec.extend([""] * (width - len(rec)))
            buf.append(rec)
            if len(buf) >= rows or chars[0] - start >= CHUNK_CHARS:
                table = _table(header, buf)
                if collect:
                    gc.enable()
                yield header, offset, table
                gc.disable()
                offset += len(buf)
                buf, start = [], chars[0]
    finally:
        if collect:
            gc.enable()
    if buf or offset == 0:
        yield header, offset, _table(header, buf)


def _table(header: list[str], rows: list[list[str]]) -> pd.DataFrame:
    cols = _unique(header)
    df = pd.DataFrame(rows, columns=cols, dtype=object) if rows else \
        pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
    return df.where(df != "", np.nan) if rows else df


def _unique(header: list[str]) -> list[str]:
    """Column names as pandas makes them: a repeated name gets ``.1``, ``.2``."""
    seen: dict[str, int] = {}
    out = []
    for c in header:
        if c in seen:
            seen[c] += 1
            out.append(f"{c}.{seen[c]}")
        else:
            seen[c] = 0
            out.append(c)
    return out


class DuplicateIds:
    """Case ids seen so far, as 64-bit hashes in sorted arrays (8 bytes a case): a repeated id
    is found in bounded memory; a hash match is confirmed by reading the file's ids again."""

    def __init__(self, path: str):
        self.path, self.big, self.new = path, np.zeros(0, np.uint64), []

    def _seen(self, h: np.ndarray) -> np.ndarray:
        hit = np.zeros(len(h), bool)
        for a in (self.big, *self.new):
            if len(a):
                i = np.minimum(np.searchsorted(a, h), len(a) - 1)
                hit |= a[i] == h
        return hit

    def check(self, ids: pd.Series, offset: int) -> None:
        """Refuse the first id of this chunk (row ``offset + i + 2``) seen before in the file."""
        h = pd.util.hash_array(ids.astype(str).to_numpy(dtype=object))
        dup = self._seen(h)
        # ... or repeated within the chunk
        dup |= pd.Series(h).duplicated().to_numpy()
        for i in np.flatnonzero(dup):
            if self._confirm(str(ids.iloc[i]), offset + int(i)):
                raise InputError(f"duplicate case_id {ids.iloc[i]!r}", file=self.path,
                                 where=f"row {offset + int(i) + 2}", hint="case ids must be unique")
        self.new.append(np.sort(h))
        if sum(map(len, self.new)) > max(len(self.big), 1 << 16):
            self.big = np.sort(np.concatenate([self.big, *self.new]))
            self.new = []

    def _confirm(self, case_id: str, index: int) -> bool:
        """The id is that of an earlier case (not only its hash)."""
        k = None
        for row, rec in records(self.path):
            if row == 1:
                k = rec.index("case_id") if "case_id" in rec else None
                continue
            if row - 2 >= index or k is None:
                return False
            if k < len(rec) and rec[k] == case_id:
                return True
        return False
