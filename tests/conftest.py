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
