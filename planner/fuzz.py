"""`python -m planner.fuzz`: the documented command, forwarded to the fuzzer, a development tool
that lives in tools/fuzz/ of the repository (`python -m tools.fuzz`); nothing in planner/ imports it."""

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, which holds tools/
    runpy.run_module("tools.fuzz", run_name="__main__", alter_sys=True)
