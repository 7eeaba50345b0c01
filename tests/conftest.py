"""Shared fixtures and the `slow` marker.

`python -m pytest -q tests` runs everything but the tests marked `slow` (long end-to-end checks);
`--runslow` runs those too, and `-m slow` only those (CI runs the default set, then `-m slow`).
Shared builders live in tests/helpers/."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.profile_tables import ProfileSet
from tools.fuzz.inputs import TINY_MODEL
from tools.fuzz.mutations import to_yaml


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
