"""Storage errors classified (issue 27, point 2): a storage that waiting will never cure (a bad
URL or scheme, a missing driver, a wrong password, an unknown database, nothing listening when
the command starts) is one line naming the cause in full, exit 2, at once; only a connection
lost mid-run is retried, and a database dropped mid-run is permanent once reconnecting finds it
gone; "resumable" is said only where a run folder is kept; no third-party warning on stderr.

The PostgreSQL cases need DSE_TEST_POSTGRES_URL (an admin URL of a local server) and are
skipped without it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid

import pytest
from helpers import ROOT, SMALL_SPACE

URL = os.environ.get("DSE_TEST_POSTGRES_URL")
needs_pg = pytest.mark.skipif(not URL, reason="DSE_TEST_POSTGRES_URL not set (no PostgreSQL)")
AT_ONCE_S = 20        # a permanent error answers in this (in process: no interpreter start-up)


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    (tmp_path / "spaces").mkdir()
    (tmp_path / "spaces" / "s.toml").write_text(SMALL_SPACE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DSE_STORAGE_RETRY", raising=False)
    yield tmp_path
    from dse.search.optuna import study
    study.set_storage_retry(None)


def dse(capsys, *args):
    from dse.cli import main
    capsys.readouterr()
    t0 = time.monotonic()
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err.strip(), time.monotonic() - t0


def _with_url(url: str, **parts) -> str:
    from sqlalchemy.engine import make_url
    return make_url(url).set(**parts).render_as_string(hide_password=False)


def _refused(capsys, url, *needles, command=("run", "spaces/s.toml", "--strategy", "optuna",
                                             "--trials", "4", "--out", "runs/x", "--quiet")):
    rc, _, err, took = dse(capsys, *command, "--storage", url)
    print(f"{url} -> exit {rc} in {took:.1f} s: {err}")
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("dse: error: "), err
    assert "internal error" not in err and "Warning" not in err, err
    assert "resumable" not in err and "resume" not in err, err      # no run folder is kept
    for n in needles:
        assert n in err, err
    assert took < AT_ONCE_S
    assert not os.path.exists("runs/x")
    return err


def test_a_url_that_can_never_work_is_refused_at_once(cwd, capsys):
    """No server needed: a mistyped scheme, a missing driver, an unparsable URL, a bad port."""
    _refused(capsys, "postgresq://u:secret@127.0.0.1/db", "not a usable storage URL",
             "postgresq", "postgresql+psycopg2://")
    _refused(capsys, "mysql://u:secret@127.0.0.1/db", "not a usable storage URL", "install")
    _refused(capsys, "no url at all", "not a usable storage URL")
    err = _refused(capsys, "postgresql+psycopg2://u:secret@127.0.0.1:port/db",
                   "not a usable storage URL", "port")
    assert "secret" not in err                               # the password is never printed
    _refused(capsys, f"sqlite:///{cwd}/no/such/folder/x.db", "cannot open the database file")


@needs_pg
@pytest.mark.postgres
@pytest.mark.parametrize("case", ["wrong password", "unknown user", "unknown database",
                                  "nothing listens"])
def test_postgresql_refusals_name_their_cause_in_full(cwd, capsys, case):
    from sqlalchemy.engine import make_url
    u = make_url(URL)
    url, needles = {
        "wrong password": (_with_url(URL, password="not-the-password"),
                           ("authentication failed",
                            f'password authentication failed for user "{u.username}"')),
        "unknown user": (_with_url(URL, username="no_such_user_27"), ("no_such_user_27",)),
        "unknown database": (_with_url(URL, database="no_such_db_27"),
                             ('database "no_such_db_27" does not exist', "createdb")),
        "nothing listens": (_with_url(URL, port=1), ("connection refused", "port 1")),
    }[case]
    err = _refused(capsys, url, *needles)
    assert "not-the-password" not in err
    if case in ("wrong password", "unknown database"):      # a worker is told the same
        _refused(capsys, url, *needles, command=("worker", "--storage-retry", "300s",
                                                 "--study", "x", "--quiet"))


def _op_error(text: str):
    import sqlalchemy.exc
    from optuna.exceptions import StorageInternalError
    try:
        try:
            raise sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception(text))
        except sqlalchemy.exc.OperationalError as e:
            raise StorageInternalError("An exception is raised during the commit.") from e
    except StorageInternalError as e:
        return e


def test_what_is_retried_and_what_is_not():
    """Classified through Optuna's wrapper: a lost connection passes (retried), a database
    gone, a wrong password never do; a refused connection is a mistake only at the start."""
    from dse.errors import StorageError
    from dse.search.optuna.storage_errors import permanent
    cases = [
        ("server closed the connection unexpectedly", False, None),
        ("terminating connection due to administrator command", False, None),
        ("connection to server failed: Connection refused", False, None),
        ("connection to server failed: Connection refused", True, "connection refused"),
        ('FATAL: database "d" does not exist', False, "unknown database"),
        ('FATAL: password authentication failed for user "u"', False, "authentication failed"),
        ("FATAL: the database system is starting up", True, None),
        ("FATAL: the database system is shutting down", True, None),
    ]
    for text, start, expected in cases:
        got = permanent(_op_error(text), "postgresql://u:pw@h/d", start=start)
        print(f"{text!r} (start={start}) -> {got}")
        if expected is None:
            assert got is None
        else:
            assert isinstance(got, StorageError) and expected in str(got) and text in str(got)
            assert "pw@" not in str(got)


def test_a_database_gone_mid_run_stops_the_retries(monkeypatch, capsys):
    """A connection lost, then reconnecting finds the database dropped: permanent at once, not
    after the retry window."""
    from dse.errors import StorageError
    from dse.search.optuna import study as o
    monkeypatch.setattr(o.time, "sleep", lambda s: None)
    monkeypatch.setattr(o, "STORAGE_RETRY_S", 300.0)
    calls = []

    def dropped():
        calls.append(1)
        raise _op_error("terminating connection due to administrator command" if len(calls) == 1
                        else 'connection failed: FATAL: database "d" does not exist')
    with pytest.raises(StorageError, match='database "d" does not exist'):
        o.with_retry(dropped)
    assert len(calls) == 2
    assert "storage unreachable" not in capsys.readouterr().err     # no outage was announced


def _admin(sql: str) -> None:
    import sqlalchemy
    eng = sqlalchemy.create_engine(URL, isolation_level="AUTOCOMMIT")
    with eng.connect() as c:
        c.execute(sqlalchemy.text(sql))
    eng.dispose()


@needs_pg
@pytest.mark.postgres
def test_a_database_dropped_mid_run_is_permanent_at_once(cwd, capsys):
    name = "dse_test_drop_" + uuid.uuid4().hex[:8]
    _admin(f"CREATE DATABASE {name}")
    (cwd / "spaces" / "b.toml").write_text(SMALL_SPACE.replace("num = 10", "num = 600"))
    dropped = []

    url = _with_url(URL, database=name)

    def drop_when_running():
        deadline = time.time() + 60
        while time.time() < deadline and _completed(url) < 8:
            time.sleep(0.1)
        _admin(f"DROP DATABASE {name} WITH (FORCE)")
        dropped.append(time.monotonic())
    t = threading.Thread(target=drop_when_running, daemon=True)
    t.start()
    try:
        rc, _, err, _ = dse(capsys, "run", "spaces/b.toml", "--out", "runs/q", "--strategy",
                            "optuna", "--sampler", "random", "--population", "4", "--trials",
                            "100000", "--storage", url, "--quiet")
        ended = time.monotonic()
    finally:
        t.join(timeout=90)
        _admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    assert dropped, "the run ended before the database was dropped"
    print(f"dropped mid-run -> exit {rc} {ended - dropped[0]:.1f} s later: {err}")
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and f'database "{name}" does not exist' in err, err
    assert ended - dropped[0] < AT_ONCE_S
    kept = (cwd / "runs" / "q" / "manifest.json").is_file()
    print(f"run folder kept: {kept}")
    assert ("dse run --resume runs/q" in err) == kept     # "resumable" only with a folder


def _completed(url: str) -> int:
    import sqlalchemy
    eng = sqlalchemy.create_engine(url)
    try:
        with eng.connect() as c:
            return int(c.execute(sqlalchemy.text(
                "SELECT count(*) FROM trials WHERE state = 'COMPLETE'")).scalar())
    except sqlalchemy.exc.SQLAlchemyError:       # Optuna's tables are not made yet
        return 0
    finally:
        eng.dispose()


@needs_pg
def test_a_storage_run_prints_no_third_party_warning(cwd, database):
    """A fresh interpreter (warnings are shown once per process): an RDB run with the
    experimental NSGA-III sampler writes nothing to stderr."""
    env = {k: v for k, v in os.environ.items() if k not in ("DSE_DEBUG", "PYTHONWARNINGS")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-m", "dse", "run", "spaces/s.toml", "--out", "runs/w",
                        "--strategy", "optuna", "--sampler", "nsga3", "--population", "4",
                        "--trials", "8", "--storage", database, "--quiet"], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=180, check=False)
    print(f"stderr of an RDB run with nsga3: {r.stderr!r}")
    assert r.returncode == 0 and r.stderr == "", r.stderr


def _hold_flock(path) -> subprocess.Popen:
    """Another process holding ``path``'s flock (a live owner or worker) until killed."""
    code = ("import fcntl, sys, time; f = open(sys.argv[1], 'w'); "
            "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)")
    p = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "held"
    return p


@pytest.mark.parametrize("holder", ["owner", "live token"])
def test_a_known_url_that_refuses_under_a_live_run_is_an_outage(monkeypatch, tmp_path, holder):
    """The URL a run used already, refused while the run is live (another process owns its
    folder or holds a live token there: this one joins a run whose database went away): waited
    for (the server restarts), then StorageUnavailable (exit 1)."""
    from dse.errors import StorageUnavailable
    from dse.search.optuna import study as o
    monkeypatch.setattr(o, "STORAGE_RETRY_S", 1.0)
    monkeypatch.setattr(o, "_URL", None)
    url = "postgresql+psycopg2://u:pw@127.0.0.1:1/db"
    (tmp_path / "live").mkdir()
    p = _hold_flock(tmp_path / "lock" if holder == "owner" else tmp_path / "live" / "w-1")
    try:
        t0 = time.monotonic()
        with pytest.raises(StorageUnavailable, match="unreachable"):
            o.storage_for(tmp_path, url, known=True)
        print(f"{holder} live: waited {time.monotonic() - t0:.1f} s, then unavailable")
    finally:
        p.kill()
        p.wait()


def test_a_known_url_that_refuses_with_nobody_at_work_is_refused_at_once(monkeypatch, tmp_path):
    """The same URL, refused where no other process works on the run (a resume or a worker
    alone: nothing can be mid-run): one line naming the cause, at once, as a new URL is."""
    from dse.errors import StorageError
    from dse.search.optuna import study as o
    monkeypatch.setattr(o, "STORAGE_RETRY_S", 300.0)
    monkeypatch.setattr(o, "_URL", None)
    url = "postgresql+psycopg2://u:pw@127.0.0.1:1/db"
    for known, d in ((True, tmp_path), (True, None), (False, None)):
        t0 = time.monotonic()
        with pytest.raises(StorageError, match="connection refused") as e:
            o.storage_for(d, url, known=known)
        took = time.monotonic() - t0
        print(f"known={known}, folder={d is not None}: {took:.2f} s: {e.value}")
        assert took < 5 and "pw@" not in str(e.value)


@needs_pg
@pytest.mark.parametrize("command", ["resume", "worker"])
def test_a_resume_or_worker_whose_stored_url_refuses_exits_2_at_once(cwd, capsys, database,
                                                                    command):
    """Issue 27 point 2: `dse run --resume DIR` or `dse worker DIR` whose manifest's storage
    now refuses the connection (nothing listens there), with no other process at work on the
    run: one line naming the cause in full, exit 2, within seconds; the folder is kept."""
    import json
    rc, _, err, _ = dse(capsys, "run", "spaces/s.toml", "--strategy", "optuna", "--trials", "4",
                        "--out", "runs/x", "--storage", database, "--quiet")
    assert rc == 0, err
    mf = cwd / "runs" / "x" / "manifest.json"
    m = json.loads(mf.read_text())
    m["storage"] = _with_url(database, port=1)          # the server moved: nothing listens
    m["trials"] = 8                                     # (and the run asked more)
    mf.write_text(json.dumps(m))
    args = ["run", "--resume", "runs/x"] if command == "resume" else ["worker", "runs/x"]
    rc, _, err, took = dse(capsys, *args, "--quiet")
    print(f"{command} on a refused stored URL -> exit {rc} in {took:.1f} s: {err}")
    assert rc == 2 and len(err.splitlines()) == 1 and "connection refused" in err.lower(), err
    assert "internal error" not in err and took < AT_ONCE_S
    assert mf.is_file()
