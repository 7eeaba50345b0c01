"""A fuzzer for the command line (a development tool, not part of the planner package; `python -m
planner.fuzz` forwards here): every bad input must get a clear refusal, nothing may hang, nothing
invalid may be silently accepted.

    python -m tools.fuzz --cases 10000            # the benchmark: figures per outcome, wall time
    python -m tools.fuzz --cases 50 --seed 7 --show-all

- `tools.fuzz.cases`: one generator per input kind (CLI flags, Megatron flags, clusters, model
  YAML/JSON, HuggingFace configs, launcher scripts, plan.json, training logs, output directories).
  Each case is a command line plus the files it names, built from a valid input with one mutation,
  and says whether the input is certainly invalid (`expect="reject"`) and which names an error about
  it must mention.
- `tools.fuzz.runner`: runs cases in forked worker processes (the planner imported once, each case
  in-process through click's test runner), kills a case that runs past its time limit, and sorts each
  outcome into: ok, traceback (an exception escaped, or exit status 1), hang, silent accept (an invalid
  input with exit 0), unclear refusal (not one `error:` line naming the field), half-written output.
"""

from tools.fuzz.cases import KINDS, Case, make_case
from tools.fuzz.runner import Outcome, Summary, run_cases

__all__ = ["KINDS", "Case", "Outcome", "Summary", "make_case", "run_cases"]
