import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")


import pytest  # noqa: E402


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
def database():
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
