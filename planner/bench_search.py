"""`python -m planner.bench_search`: the documented command, forwarded to the search-time benchmark,
a development tool that lives in tools/bench_search.py of the repository (`python -m
tools.bench_search`); nothing in planner/ imports it."""

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, which holds tools/
    runpy.run_module("tools.bench_search", run_name="__main__", alter_sys=True)
