"""A scratch directory shared by every pytest-xdist worker of one test run, for work that each worker would
otherwise repeat (the corpus solves of tests/helpers/corpus.py).  Workers know the run by PYTEST_XDIST_TESTRUNUID;
the controller (tests/conftest.py) fixes that id before the workers start and removes the directory at the end."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def shared_run_dir(uid: str) -> Path:
    return Path(tempfile.gettempdir()) / f"hapmoe-run-{uid}"


def worker_run_dir() -> Path | None:
    """This run's shared directory (created on first use), or None outside pytest-xdist's workers."""
    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not uid:
        return None
    root = shared_run_dir(uid)
    root.mkdir(exist_ok=True)
    return root
