"""Start-up: each command loads only what it needs.  `--help` loads no command (nor pydantic); `estimate` (which never searches),
`emit` and their `--help` load neither OR-Tools (nor the pandas it brings) nor the search backends.  Before, cli.py
imported every command, hence the whole search, for any command line: about 2 s of imports for `--help`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.utils import make_default_short_help

import cli

ROOT = Path(__file__).resolve().parents[1]
ESTIMATE = ["estimate", "--model", "mixtral-s", "--cluster", "H800:32", "--tp", "2", "--pp", "4", "--ep", "4"]
SEARCH = ("ortools", "pandas", "planner.search.pools", "planner.search.driver", "solver_models.cpsat")
"""What a command that does not search must not load: OR-Tools (which loads pandas) and the search's backends."""


def _loaded_after(argv: list[str]) -> tuple[int, str, set[str]]:
    """(exit code, output, the modules loaded) of `cli.py ARGV` run in a fresh interpreter."""
    code = ("import json, sys; from click.testing import CliRunner; import cli; "
            f"r = CliRunner().invoke(cli.main, {argv!r}); "
            "print(json.dumps([r.exit_code, r.output, sorted(sys.modules)]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    exit_code, output, modules = json.loads(out.stdout.splitlines()[-1])
    return exit_code, output, set(modules)


def _of(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


def test_help_loads_no_command():
    exit_code, output, modules = _loaded_after(["--help"])
    assert exit_code == 0 and "estimate" in output
    assert _of(modules, ("planner.commands", "planner.api", "planner.search", "solver_models", "ortools",
                         "pandas", "numpy", "pydantic", "planner.schemas", "planner.cli_common")) == []


@pytest.mark.parametrize("argv", [["estimate", "--help"], ESTIMATE, ESTIMATE + ["--json"], ["emit", "--help"],
                                  ["calibrate", "--help"], ["profile", "--help"]], ids=" ".join)
def test_commands_that_do_not_search_load_no_search(argv):
    exit_code, output, modules = _loaded_after(argv)
    assert exit_code == 0, output
    assert _of(modules, SEARCH) == []
    assert _of(modules, ("planner.commands",)) == sorted({"planner.commands", f"planner.commands.{argv[0]}",
                                                          "planner.commands.options"} & modules)


def test_solve_still_loads_the_search():
    """The other side: the search is loaded where it is needed (the test above is not vacuous)."""
    _, _, modules = _loaded_after(["solve", "--help"])
    assert "planner.search.pools" in modules and "ortools" in modules


def test_the_listing_is_each_commands_own_help():
    """`--help` lists the commands from cli.py's table without loading them: each name, in its module, is the
    command of that name, and the table's summary shortens as the command's own help does at every width."""
    ctx = click.Context(cli.main)
    assert cli.main.list_commands(ctx) == sorted(cli.COMMANDS)
    for name, (_module, summary) in cli.COMMANDS.items():
        command = cli.main.get_command(ctx, name)
        assert command.name == name and not command.hidden and not command.deprecated and command.short_help is None
        for limit in range(10, 200):
            assert make_default_short_help(summary, limit) == make_default_short_help(command.help, limit), name
