"""`python -m planner.bench_search`: the documented command, forwarded to the search-time benchmark,
a development tool that lives in tools/bench_search.py (`python -m tools.bench_search`, from the
repository root)."""

import importlib.util
import runpy
import sys

if __name__ == "__main__":
    try:
        found = importlib.util.find_spec("tools.bench_search") is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        sys.exit("error: the search benchmark is a development tool in tools/bench_search.py of the repository; "
                 "run this from its root")
    runpy.run_module("tools.bench_search", run_name="__main__", alter_sys=True)
