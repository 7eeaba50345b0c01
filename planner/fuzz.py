"""`python -m planner.fuzz`: the documented command, forwarded to the fuzzer, a development tool
that lives in tools/fuzz/ of the repository (`python -m tools.fuzz`); nothing in planner/ imports it.
Its usage names the command run (`python -m planner.fuzz`)."""

import runpy
import sys
from pathlib import Path

PROG = "python -m planner.fuzz"

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, which holds tools/
    fuzzer = runpy.run_module("tools.fuzz", run_name="tools.fuzz.__main__")  # defines its main(), runs nothing
    sys.exit(fuzzer["main"](prog=PROG))
