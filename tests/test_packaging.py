"""A non-editable install (`pip install .`) carries every data file the planner reads: each file under the
packages that is not Python matches a `[tool.setuptools.package-data]` pattern (the published dispatch rates and
the calibration CSVs were missing from the wheel before)."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_data_file_of_the_packages_is_package_data():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = config["package-data"]["*"]
    roots = [p.rstrip("*") for p in config["packages"]["find"]["include"]]
    data = [p for r in roots for p in (ROOT / r).rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert any(p.suffix == ".csv" for p in data)  # the published tables are there to check
    missing = [str(p.relative_to(ROOT)) for p in data if not any(fnmatch.fnmatch(p.name, pat) for pat in patterns)]
    assert missing == []
