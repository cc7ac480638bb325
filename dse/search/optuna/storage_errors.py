"""Storage errors classified: what waiting cures (an outage) and what it never will.

A storage URL that cannot be parsed, names an unknown scheme or a driver that is not installed,
a wrong user or password, an unknown database, and (when a command starts) a server that
refuses the connection or a host that does not resolve are *permanent*: ``StorageError``, one
line naming the cause in full, exit 2, at once. Only a connection lost mid-run (a server
restart, a network blip) is retried (``study.with_retry``), and a database dropped mid-run is
permanent as soon as reconnecting finds it gone.
"""

from __future__ import annotations

import re

from dse.errors import StorageError

# the server is coming or going: worth waiting for even when a command starts
_PASSING = ("the database system is starting up", "the database system is shutting down",
            "the database system is in recovery mode", "too many clients", "sorry, too many",
            "database is locked")
# never cured by waiting, whenever they happen: (text in the driver's message, what it is, hint)
_FOR_GOOD = (
    ("password authentication failed", "authentication failed",
     "check the user and password in the storage URL"),
    ("no password supplied", "authentication failed", "give the password in the storage URL"),
    ("authentication failed", "authentication failed",
     "check the user and password in the storage URL"),
    ("no pg_hba.conf entry", "the server refuses this user, host or database",
     "the server's pg_hba.conf must allow it"),
    (("role \"", "does not exist"), "unknown user", "check the user in the storage URL"),
    (("database \"", "does not exist"), "unknown database (or dropped)",
     "create the database first (createdb NAME), or check its name in the storage URL"),
    ("does not exist", "the database lost Optuna's tables", "start the run on a fresh database"),
    ("access denied", "authentication failed", "check the user and password in the storage URL"),
    ("unknown database", "unknown database",
     "create the database first, or check its name in the storage URL"),
    ("unable to open database file", "cannot open the database file",
     "check that the file's folder exists and is writable"),
    ("permission denied", "permission denied",
     "the database user needs the right to create tables (e.g. own the database)"),
)
# when a command starts, also permanent: nothing listens, or nothing is there
_AT_START = (
    ("connection refused", "connection refused",
     "is the database server running, on that host and port?"),
    ("could not translate host name", "unknown host", "check the host in the storage URL"),
    ("name or service not known", "unknown host", "check the host in the storage URL"),
    ("timeout expired", "no answer from the server", "check the host and port in the storage URL"),
    ("could not connect", "cannot connect", "is the database server running and reachable?"),
)


def redact(url: str) -> str:
    """The URL with its password hidden (``user:***@host``)."""
    return re.sub(r"(://[^:/@\s]*):[^@\s]*@", r"\1:***@", str(url))


def text_of(e: BaseException) -> str:
    """The driver's own message of ``e`` (through Optuna's and SQLAlchemy's wrappers), in full
    on one line: SQLAlchemy's ``(psycopg2.OperationalError)`` prefix and its background link
    dropped."""
    root = chain_root(e)
    orig = getattr(root, "orig", None)
    msg = str(orig) if orig is not None else str(root)
    msg = msg.split("(Background on this error at:")[0]
    return " ".join(msg.split())


def chain_root(e: BaseException) -> BaseException:
    """The first SQLAlchemy (or driver) error in ``e``'s chain of causes, else ``e``."""
    seen, cur = set(), e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if type(cur).__module__.split(".")[0] in ("sqlalchemy", "psycopg2", "psycopg", "pymysql",
                                                  "MySQLdb", "sqlite3"):
            return cur
        cur = cur.__cause__ or cur.__context__
    return e


def _lookup(table, msg: str):
    low = msg.lower()
    return next(((what, hint) for needle, what, hint in table
                 if all(n in low for n in ((needle,) if isinstance(needle, str) else needle))),
                None)


def permanent(e: BaseException, url: str | None, *, start: bool) -> StorageError | None:
    """The ``StorageError`` that ``e`` (raised by a storage call) is, or None where it may pass
    (an outage: retried). ``start``: the command's first connection, where a refused connection
    or an unknown host is a mistake, not an outage."""
    import sqlalchemy.exc
    root = chain_root(e)
    msg = text_of(e)
    where = redact(url) if url else "storage"
    if isinstance(root, sqlalchemy.exc.ArgumentError) or (
            start and isinstance(e, (ImportError, ValueError)) and not
            isinstance(root, sqlalchemy.exc.SQLAlchemyError)):
        hint = ("e.g. postgresql+psycopg2://user:password@host:5432/database, "
                "sqlite:///path/to/file.db")
        if isinstance(e, ImportError):
            cause = e.__cause__ or e
            hint = f"{type(cause).__name__}: {cause}; install the database driver"
        return StorageError(f"not a usable storage URL: {msg}", file=where, hint=hint)
    if any(p in msg.lower() for p in _PASSING):
        return None
    found = _lookup(_FOR_GOOD, msg) or (_lookup(_AT_START, msg) if start else None)
    if found is None and start and isinstance(root, sqlalchemy.exc.DBAPIError) and \
            not isinstance(root, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)):
        found = ("the storage refused", "check the storage URL and the database server")
    if found is None:
        return None
    what, hint = found
    return StorageError(f"{what}: {msg}", file=where, hint=hint)
