"""HAPMoE planner command line.  Thin: parse, call planner/, print or write.

Run `python cli.py --help` for the commands.
"""

from __future__ import annotations

import os
import signal
import sys
import time

_STARTED = time.perf_counter()  # before the imports: `--time-limit` counts them too when run as a program


def _interrupted_outside_a_command(signum: int, _frame) -> None:
    sys.stderr.write(f"error: interrupted by {signal.Signals(signum).name} (no command was writing)\n")
    os._exit(128 + signum)


if __name__ == "__main__":  # while no command runs (planner/cli_common.py), a signal ends the program at once
    for _signum in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", signal.SIGTERM)):
        signal.signal(_signum, _interrupted_outside_a_command)

import importlib  # noqa: E402

import click  # noqa: E402

from planner import time_budget  # noqa: E402
from planner import cli_common  # noqa: E402
from planner.cli_common import OneLineErrorsGroup  # noqa: E402

# Each module defines a click command named `command`; the order here is the order in --help.
COMMAND_MODULES = [
    "planner.commands.solve",
    "planner.commands.estimate",
    "planner.commands.compare",
    "planner.commands.profile",
    "planner.commands.calibrate",
    "planner.commands.emit",
    "planner.commands.bench",
]


@click.group(cls=OneLineErrorsGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option("0.1.0", prog_name="hapmoe")
def main() -> None:
    """Heterogeneity-aware parallelism planner for MoE (and dense) training on Megatron-LM."""


try:
    for _name in COMMAND_MODULES:
        main.add_command(importlib.import_module(_name).command)
except (MemoryError, ImportError) as _exc:  # too little memory to load the libraries: say so, no traceback
    if not cli_common.is_out_of_memory(_exc):
        raise
    sys.stderr.write(f"error: {cli_common.out_of_memory_message()}\n")
    sys.exit(cli_common.OUT_OF_MEMORY_EXIT)
cli_common.LOADED_KIB = cli_common.status_kib("VmSize")


if __name__ == "__main__":
    time_budget.PROCESS_STARTED = _STARTED
    main()
