"""One command line run once per test run, for tests in several files that run the very same command and only read
what it printed and wrote (a solve takes seconds; the same solve in three files took it three times).  Under
pytest-xdist the workers share the run (tests/helpers/run_dir.py): the first to need it runs it under a lock, the
others wait and read its output, as tests/helpers/corpus.py does for the launcher corpus.

Only for commands whose result depends on their arguments alone: never under a monkeypatch, and never for a test
that writes into the output directory."""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from click.testing import CliRunner

from cli import main
from helpers.run_dir import worker_run_dir

_ROOT = worker_run_dir()
if _ROOT is None:
    _ROOT = Path(tempfile.mkdtemp(prefix="hapmoe-shared-cli-"))
    atexit.register(shutil.rmtree, _ROOT, True)


@dataclass(frozen=True)
class Ran:
    exit_code: int
    stdout: str
    stderr: str
    out: Path | None  # the --out directory, when asked for one


@lru_cache(maxsize=None)
def run_once(*args: str, out: bool = False) -> Ran:
    """`python cli.py ARGS` (with `--out DIR` appended when `out`), run once per test run."""
    key = hashlib.sha256(json.dumps([args, out]).encode()).hexdigest()[:16]
    where = _ROOT / f"cli-{key}"
    out_dir = where / "out" if out else None
    result = where / "result.json"
    with open(where.with_name(where.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker running it: wait, then read what it left
        if not result.exists():
            shutil.rmtree(where, ignore_errors=True)  # what a worker that failed left
            where.mkdir(parents=True)
            res = CliRunner().invoke(main, [*args, *(["--out", str(out_dir)] if out_dir else [])])
            saved = {"exit_code": res.exit_code, "stdout": res.stdout, "stderr": res.stderr}
            tmp = result.with_suffix(".tmp")
            tmp.write_text(json.dumps(saved))
            tmp.rename(result)
    saved = json.loads(result.read_text())
    return Ran(saved["exit_code"], saved["stdout"], saved["stderr"], out_dir)
