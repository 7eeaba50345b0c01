"""Shared fixtures and the `slow` marker.

`python -m pytest -q tests` runs everything but the tests marked `slow` (long end-to-end checks);
`--runslow` runs those too, and `-m slow` only those (CI runs the default set, then `-m slow`).
Shared builders live in tests/helpers/."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from planner.profile_tables import ProfileSet
from helpers.run_dir import shared_run_dir
from tools.fuzz.inputs import TINY_MODEL
from tools.fuzz.mutations import to_yaml


def pytest_configure(config: pytest.Config) -> None:
    """On pytest-xdist's controller: fix the run's id before the workers start, so that their shared directory
    (tests/helpers/run_dir.py) is known here and removed at the end."""
    if not hasattr(config, "workerinput") and hasattr(config.option, "testrunuid"):
        config.option.testrunuid = config.option.testrunuid or uuid.uuid4().hex


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and getattr(config.option, "testrunuid", None):
        shutil.rmtree(shared_run_dir(config.option.testrunuid), ignore_errors=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False,
                     help="also run the tests marked slow (CI runs them)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the slow tests unless --runslow is given or the -m expression asks for them."""
    if config.getoption("--runslow") or "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow or -m slow (CI runs it)")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def profiles() -> ProfileSet:
    """The shipped profiles (device, link and correction tables)."""
    return ProfileSet.load()


@pytest.fixture()
def tiny(tmp_path: Path) -> Path:
    """The fuzzer's tiny MoE model (4 layers, 8 experts) as a model file."""
    path = tmp_path / "tiny.yaml"
    path.write_bytes(to_yaml(TINY_MODEL))
    return path
