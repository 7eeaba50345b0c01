"""The README's commands run as written, so that the README cannot rot.

Every ```bash block of README.md is one test: its commands run in order, verbatim, under bash, in a scratch
directory holding a copy of cli.py and examples/ (so `--out plans/...` writes there, never into the clone),
with the clone on PYTHONPATH, `COLUMNS=100` and `HAPMOE_TIME_LIMIT` set (the README names it), and each must
exit 0 and print its key lines (a plan and a search status for `solve`, a JSON object that follows
docs/schema/ for `--json`, a command per node for `launch.sh --dry-run`, ...).

Two parts of a command are not run: `pip install ...` (installing is what .ci/run and the user's machine do
before; this test runs in the installed environment), and the test command `python -m pytest ...` (running the
suite inside itself would recurse): .ci/run must run that command verbatim instead.

The README's example output of its main command is checked against the real output: the lines that do not
depend on the search (the header, the runtime, the idle-GPU note) always, the others when the search certifies
as the README says (on a machine too loaded for that within the limit the plan may differ). When the cost model
changes, run the command with COLUMNS=100 and paste the lines again.

Every `python cli.py ...` line of the docs/ pages is parsed by the command it names (options, types, required
values), without running it."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import click
import pytest

from cli import main
from helpers.json_schema import check_json

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
TIME_LIMIT_S = "20"  # HAPMOE_TIME_LIMIT for the README's searches: the README says so
MAX_LINES = 250
COMMAND_TIMEOUT_S = 180


def bash_blocks(text: str) -> list[list[str]]:
    """The commands of each ```bash block: continuation lines joined, blank and comment lines left out."""
    blocks = []
    for body in re.findall(r"^```bash\n(.*?)^```$", text, flags=re.M | re.S):
        commands = [ln.strip() for ln in body.replace("\\\n", " ").splitlines()]
        blocks.append([c for c in commands if c and not c.startswith("#")])
    return blocks


def runnable(command: str) -> tuple[str, list[str]]:
    """(what this test runs, the test commands it does not run) of one README line."""
    parts = [p.strip() for p in command.split(" && ")]
    tests = [p for p in parts if p.startswith("python -m pytest")]
    kept = [p for p in parts if not p.startswith("pip install") and p not in tests]
    return " && ".join(kept), tests


README_TEXT = README.read_text()
BLOCKS = [b for b in bash_blocks(README_TEXT) if any(runnable(c)[0] for c in b)]
MAIN_COMMAND = runnable(bash_blocks(README_TEXT)[0][0])[0]


def _scratch(tmp_path: Path) -> dict[str, str]:
    shutil.copy(ROOT / "cli.py", tmp_path / "cli.py")
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    env = dict(os.environ, COLUMNS="100", HAPMOE_TIME_LIMIT=TIME_LIMIT_S,
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env.pop("HAPMOE_NODE_RANK", None)
    return env


def _key_lines(command: str, out: str, cwd: Path) -> None:
    """What a successful run of `command` prints, by the kind of command."""
    words = shlex.split(command)
    if words[:2] == ["python", "cli.py"]:
        sub = words[2]
        if "--json" in words and sub in ("solve", "estimate", "compare"):
            check_json(sub, json.loads(out))
        elif sub == "solve":
            assert re.search(r"^plan: TP=\d+ PP=\d+", out, re.M), out
            assert re.search(r"^search: (OPTIMAL|FEASIBLE)", out, re.M), out
        elif sub == "estimate":
            assert re.search(r"^iteration [0-9.]+ s \(range", out, re.M), out
        elif sub == "compare":
            rows = {ln.split()[0] for ln in out.splitlines()[2:] if ln.strip()}
            assert {"cpsat", "hsdp"} <= rows, out
            assert "contradiction" not in out
        if "--out" in words:
            out_dir = cwd / words[words.index("--out") + 1]
            assert (out_dir / "launch.sh").exists() or (out_dir / "plan.json").exists(), sorted(out_dir.iterdir())
    elif words[0] == "bash" and "--dry-run" in words:
        nodes = re.findall(r"^# node \d+ \((\S+), (\S+)\)\n(.*)$", out, re.M)
        assert nodes, out
        assert all("torchrun" in line and "--node-rank" in line for _, _, line in nodes), out


def _block_id(i: int, block: list[str]) -> str:
    first = shlex.split(runnable(block[0])[0] or block[0])
    return f"block{i}-{first[2]}" if first[:2] == ["python", "cli.py"] else f"block{i}"


@pytest.mark.parametrize("block", BLOCKS, ids=[_block_id(i, b) for i, b in enumerate(BLOCKS)])
def test_readme_block_runs_as_written(block, tmp_path):
    env = _scratch(tmp_path)
    for line in block:
        command, _tests = runnable(line)
        if not command:
            continue
        res = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=COMMAND_TIMEOUT_S, stdin=subprocess.DEVNULL)
        assert res.returncode == 0, f"{command}\nexit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
        _key_lines(command, res.stdout, tmp_path)
        if command == MAIN_COMMAND:
            _matches_the_example(res.stdout)


def _example_output() -> list[str]:
    """The ```text block that follows "`MAIN_COMMAND` prints"."""
    at = README_TEXT.index(f"`{MAIN_COMMAND}` prints")
    block = re.search(r"^```text\n(.*?)^```$", README_TEXT[at:], re.M | re.S)
    return [ln.rstrip() for ln in block.group(1).splitlines()]


def _matches_the_example(out: str) -> None:
    actual = [ln.rstrip() for ln in out.splitlines()]
    shown = [ln for ln in _example_output() if ln != "[...]"]
    certified = any(ln.startswith("search: OPTIMAL") for ln in actual)
    plan_at = next(i for i, ln in enumerate(shown) if ln.startswith("plan:"))
    always = shown[:plan_at] + [ln for ln in shown if ln.startswith("note:")]
    for ln in always:
        assert ln in actual, f"README example line not in the output of {MAIN_COMMAND}:\n{ln}\n---\n{out}"
    if not certified:
        return  # a machine too loaded to certify within HAPMOE_TIME_LIMIT: the plan may differ
    pos = 0
    for ln in shown:
        if "searched for" in ln:  # the search time varies with the machine (the README says so)
            continue
        assert ln in actual[pos:], f"README example line not in the output of {MAIN_COMMAND}:\n{ln}\n---\n{out}"
        pos = actual.index(ln, pos) + 1


def test_the_readme_runs_the_test_command_ci_runs():
    """The set-up lines come first; .ci/run runs the README's test command verbatim."""
    first = bash_blocks(README_TEXT)[0]
    assert README_TEXT.splitlines()[2] == "```bash", "the README opens with its two set-up commands"
    assert first[0] == "pip install -e . && " + MAIN_COMMAND and MAIN_COMMAND.startswith("python cli.py solve ")
    tests = [t for line in first for t in runnable(line)[1]]
    assert tests, first
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for command in tests:
        assert command in ci, f".ci/run does not run the README's test command {command!r}"


def test_the_readme_is_short_and_links_only_inside_the_repository():
    assert len(README_TEXT.splitlines()) <= MAX_LINES
    for page in [README, *DOCS]:
        for target in re.findall(r"\]\(([^)]+)\)", page.read_text()):
            assert "://" not in target and not target.startswith("/"), (page.name, target)
            path = (page.parent / target.split("#")[0]).resolve()
            assert path.is_relative_to(ROOT), (page.name, target)
            assert path.exists(), \
                f"{page.relative_to(ROOT)} links to {target}, which is not in the repository"


def _cli_lines(page: Path) -> list[str]:
    return [c for block in bash_blocks(page.read_text()) for c in (runnable(c)[0] for c in block)
            if c.startswith("python cli.py ")]


@pytest.mark.parametrize("page", DOCS, ids=[p.name for p in DOCS])
def test_the_docs_commands_parse(page):
    """Each `python cli.py SUB ...` of the page is accepted by SUB's option parser (nothing is run)."""
    for command in _cli_lines(page):
        words = shlex.split(command, comments=True)
        sub = main.get_command(click.Context(main), words[2])
        try:
            sub.make_context(words[2], words[3:])
        except click.ClickException as exc:
            pytest.fail(f"{page.name}: {command}\n{exc.format_message()}")
