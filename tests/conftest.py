import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")


import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "postgres(stops_server=False): uses the PostgreSQL server at "
                            "DSE_TEST_POSTGRES_URL (so does every test using `database`); "
                            "stops_server: stops and restarts it, alone on it")


@pytest.fixture(autouse=True)
def _postgres_server(request):
    """A test on the PostgreSQL server holds a shared lock on it for its duration, and a test
    that stops the server (test_faults' outage) holds it alone: the suite's processes
    (pytest-xdist workers: pyproject's addopts) and any other session on this machine using
    the same server never run a database test while it is down. A file lock in the temporary
    folder, named by the server's address (nothing without DSE_TEST_POSTGRES_URL)."""
    import fcntl
    import re
    import tempfile
    mark = request.node.get_closest_marker("postgres")
    url = os.environ.get("DSE_TEST_POSTGRES_URL")
    if not url or (mark is None and "database" not in request.fixturenames):
        yield
        return
    server = re.sub(r"[^A-Za-z0-9.]+", "-", url.split("@")[-1].rsplit("/", 1)[0])
    alone = bool(mark and mark.kwargs.get("stops_server"))
    with open(Path(tempfile.gettempdir()) / f"dse-test-postgres-{server}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    # DSE_DEBUG turns one-line internal errors into tracebacks; the tests check the default
    monkeypatch.delenv("DSE_DEBUG", raising=False)


@pytest.fixture(scope="session")
def answered(tmp_path_factory):
    """Answer each worked question once per test session: {name: (report folder, numbers)},
    its numbers at full precision (``digits=None``: the tests recompute them from the model;
    answer.json's rounding to 4 digits is tested in test_bands and test_readable_output)."""
    import json

    from dse.questions.answer import QUESTIONS_DIR, answer_space
    cache = {}

    def get(name):
        if name not in cache:
            tmp = tmp_path_factory.mktemp(name)
            out = answer_space(str(QUESTIONS_DIR / f"{name}.toml"), out=str(tmp / "report"),
                               run_dir=str(tmp / "run"), bands=0,   # bands: tests/test_bands.py
                               digits=None)
            cache[name] = (out, json.loads((out / "answer.json").read_text())["numbers"])
        return cache[name]
    return get


@pytest.fixture
def database(_postgres_server):
    """A fresh PostgreSQL database on DSE_TEST_POSTGRES_URL's server, dropped afterwards (tests
    that use it skip without the variable)."""
    import uuid

    import sqlalchemy
    url = os.environ["DSE_TEST_POSTGRES_URL"]
    name = "dse_test_" + uuid.uuid4().hex[:8]
    admin = sqlalchemy.create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
    admin.dispose()
    yield url.rsplit("/", 1)[0] + "/" + name
    admin = sqlalchemy.create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sqlalchemy.text(f"DROP DATABASE {name} WITH (FORCE)"))
    admin.dispose()



if os.environ.get("DSE_MUTATE"):
    # ``DSE_MUTATE=field=factor``: every Batch the scorer reads sees ``field`` multiplied by
    # ``factor`` (tests/mutation.py)
    from mutation import set_mutation
    _name, _factor = os.environ["DSE_MUTATE"].split("=")
    set_mutation(_name, float(_factor))
if os.environ.get("DSE_MUTATE_TRAIN"):
    # ``DSE_MUTATE_TRAIN=field=factor``: every TrainBatch reads ``field`` (or ``kernel.KEY``)
    # multiplied by ``factor`` (tests/mutation.py --train)
    from mutation import set_train_mutation
    _name, _factor = os.environ["DSE_MUTATE_TRAIN"].split("=")
    set_train_mutation(_name, float(_factor))
if os.environ.get("DSE_MUTATE_OP"):
    # ``DSE_MUTATE_OP=id``: the scorer runs with that operator mutant of its formulas
    # (``python tests/mutation.py --operators --list`` prints the ids)
    from mutation import apply_mutant, mutant_by_id
    apply_mutant(mutant_by_id(os.environ["DSE_MUTATE_OP"]))
