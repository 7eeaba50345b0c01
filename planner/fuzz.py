"""`python -m planner.fuzz`: the documented command, forwarded to the fuzzer, a development tool
that lives in tools/fuzz/ (`python -m tools.fuzz`, from the repository root)."""

import importlib.util
import runpy
import sys

if __name__ == "__main__":
    try:
        found = importlib.util.find_spec("tools.fuzz") is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        sys.exit("error: the fuzzer is a development tool in tools/fuzz/ of the repository; run this from its root")
    runpy.run_module("tools.fuzz", run_name="__main__", alter_sys=True)
