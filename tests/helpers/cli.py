"""Running the command line in-process, and what a clean refusal looks like (issues 13 and 23)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from click.testing import CliRunner

from cli import main


def run(args: list[str], cwd: Path | None = None):
    """`python cli.py ARGS` in this process (in `cwd` when given); click's Result."""
    old = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        return CliRunner().invoke(main, args, catch_exceptions=True)
    finally:
        os.chdir(old)


def refused(res, *names: str) -> str:
    """Exit 2, no exception, exactly one `error:` line that names one of `names`; returns the line."""
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exc_info
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1 and len(lines) == 1, res.output
    assert any(n.lower() in errors[0].lower() for n in names), (names, errors[0])
    assert "Traceback" not in res.output and "/tmp/.hapmoe" not in res.output
    return errors[0]


def tree(path: Path) -> dict[str, bytes]:
    """Every file under `path` with its bytes (symbolic links as their target text)."""
    out = {}
    for p in sorted(path.rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(path))] = b"-> " + os.readlink(p).encode()
        elif p.is_file():
            out[str(p.relative_to(path))] = p.read_bytes()
    return out


def compare_searches_once(monkeypatch) -> None:
    """In the calling test, `compare` searches for its first invocation only: a later one must ask for the very same
    comparison (its time limit aside: the clock runs on) and prints the first one's rows.  Each invocation still
    reads its inputs and prints end to end; for a test that reads the --json and the text of one comparison."""
    import planner.commands.compare as compare_command

    real = compare_command.compare_rows
    searched: list[tuple[dict, list[dict]]] = []  # (what was asked, the rows)

    def once(run, cluster_spec, profiles, **options):
        asked = {"run": run, "cluster": cluster_spec, **{k: v for k, v in options.items() if k != "time_limit_s"}}
        if not searched:
            searched.append((asked, real(run, cluster_spec, profiles, **options)))
        assert asked == searched[0][0]  # the very same comparison
        return searched[0][1]

    monkeypatch.setattr(compare_command, "compare_rows", once)


def solve_searches_once(monkeypatch) -> None:
    """In the calling test, `solve` searches each distinct request once: a later invocation that asks for the very same
    search (the same run, cluster, space, settings and objective; its deadline aside: the clock runs on) gets the first
    one's outcome, and prints it end to end; for a test that reads the --json and the text of one solve."""
    import planner.commands.solve as solve_command

    real = solve_command.solve
    searched: list[tuple[dict, object]] = []  # (what was asked, the outcome)

    def once(run, cluster, profiles, *, settings, space, progress=None, **options):
        asked = {"run": run, "cluster": cluster, "settings": replace(settings, deadline=None), "space": space,
                 **options}
        for was, outcome in searched:
            if was == asked:
                return outcome
        outcome = real(run, cluster, profiles, settings=settings, space=space, progress=progress, **options)
        searched.append((asked, outcome))
        return outcome

    monkeypatch.setattr(solve_command, "solve", once)
