"""Shared fixtures.  Shared builders live in tests/helpers/."""

from __future__ import annotations

import pytest

from planner.profile_tables import ProfileSet


@pytest.fixture(scope="session")
def profiles() -> ProfileSet:
    """The shipped profiles (device, link and correction tables)."""
    return ProfileSet.load()
