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


if __name__ == "__main__":  # while no command runs (planner/cli_group.py), a signal ends the program at once
    for _signum in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", signal.SIGTERM)):
        signal.signal(_signum, _interrupted_outside_a_command)

import importlib  # noqa: E402

import click  # noqa: E402
from click.utils import make_default_short_help  # noqa: E402

from planner import time_budget  # noqa: E402
from planner import cli_group  # noqa: E402
from planner.cli_group import OneLineErrorsGroup  # noqa: E402

COMMANDS = {
    "solve": ("planner.commands.solve", "Find the fastest plan that fits: degrees, layers and device type per stage, "
                                        "recompute."),
    "estimate": ("planner.commands.estimate", "Price one configuration: iteration time, TFLOP/s/GPU, MFU and memory "
                                              "per stage."),
    "compare": ("planner.commands.compare", "Run cpsat, hsdp (and brute force when small) on one request; print "
                                            "objective, bound, gap, time."),
    "profile": ("planner.commands.profile", "Measure kernels and collectives with torch; write a DeviceProfile "
                                            "(provenance measured)."),
    "calibrate": ("planner.commands.calibrate", "Compare a real run with the cost model and write corrections "
                                                "(provenance calibrated)."),
    "emit": ("planner.commands.emit", "Write megatron_args.txt, launch.sh and hostfile (plus FlagScale's YAML for the "
                                      "flagscale runtime) for a plan, after checking it as `solve` does (layers, GPUs, "
                                      "memory, Megatron's rules) for the model and cluster it was made for.  The "
                                      "input script is never modified."),
    "bench": ("planner.commands.bench", "Run every planner on the scenario suite and write the paper's comparisons."),
}
"""Each command: the module that defines it (a click command named `command`) and the first paragraph of its help,
which `--help` lists without loading the module (tests/test_startup.py checks the two agree)."""


class LazyCommands(OneLineErrorsGroup):
    """The commands of COMMANDS, each module loaded only when its command is named: `--help` loads none, and a
    command loads its own libraries only (`estimate` no search, no OR-Tools).  The one place the planner imports
    a module by name (tests/test_architecture.py)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        try:
            command = importlib.import_module(COMMANDS[cmd_name][0]).command
        except ImportError as exc:  # too little memory to load the libraries: OneLineErrorsGroup says so
            if cli_group.is_out_of_memory(exc):
                raise MemoryError() from exc
            raise
        cli_group.LOADED_KIB = cli_group.status_kib("VmSize")
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's list of the commands, each with its summary shortened to the line, from COMMANDS."""
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [(name, make_default_short_help(COMMANDS[name][1], limit).strip()) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyCommands, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option("0.1.0", prog_name="hapmoe")
def main() -> None:
    """Heterogeneity-aware parallelism planner for MoE (and dense) training on Megatron-LM."""


def load_every_command() -> list[click.Command]:
    """Every command, its module loaded now: for a process that runs many command lines and forks workers for them
    (tools/fuzz), so that each worker starts with the libraries loaded once, before the fork."""
    ctx = click.Context(main)
    return [main.get_command(ctx, name) for name in main.list_commands(ctx)]


if __name__ == "__main__":
    time_budget.PROCESS_STARTED = _STARTED
    main()
