"""HAPMoE planner command line.  Thin: parse, call planner/, print or write.

Run `python cli.py --help` for the commands.
"""

from __future__ import annotations

import importlib

import click

from planner.cli_common import OneLineErrorsGroup

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


for _name in COMMAND_MODULES:
    main.add_command(importlib.import_module(_name).command)


if __name__ == "__main__":
    main()
