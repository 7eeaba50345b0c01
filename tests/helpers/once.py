"""Work done once per test run, for tests in several files (or on several pytest-xdist workers) that need the very
same result and only read it: a command line (a solve takes seconds; the same solve in two files took it twice), or
any JSON-able value (FlagScale's validator run).  Under pytest-xdist the workers share it (tests/helpers/run_dir.py):
the first to need it computes it under a lock, the others wait and read it, as tests/helpers/corpus.py does for the
launcher corpus.

Only for results that depend on their inputs alone: never under a monkeypatch, and never for a test that writes
into a shared output directory."""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import json
import shutil
import tempfile
import traceback
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from click.testing import CliRunner

from cli import main
from helpers.run_dir import worker_run_dir

_ROOT = worker_run_dir()
if _ROOT is None:
    _ROOT = Path(tempfile.mkdtemp(prefix="hapmoe-once-"))
    atexit.register(shutil.rmtree, _ROOT, True)


@dataclass(frozen=True)
class Ran:
    exit_code: int
    stdout: str
    stderr: str
    out: Path | None  # the --out directory, when asked for one

    @property
    def output(self) -> str:
        """Both streams (stdout first; click's Result.output interleaves them as written)."""
        return self.stdout + self.stderr


def once_per_run(name: str, compute: Callable[[], Any]) -> Any:
    """compute()'s JSON-able value, computed once per test run under the name `name` (a file name): the first
    worker to ask computes it under a lock, the others wait and read it."""
    result = _ROOT / f"{name}.json"
    with open(_ROOT / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker computing it: wait, then read what it left
        if not result.exists():
            value = compute()
            tmp = result.with_suffix(".tmp")
            tmp.write_text(json.dumps(value))
            tmp.rename(result)
    return json.loads(result.read_text())


@lru_cache(maxsize=None)
def run_once(*args: str, out: bool = False, columns: int | None = None) -> Ran:
    """`python cli.py ARGS` (with `--out DIR` appended when `out`, in a terminal `columns` wide when given), run once
    per test run.  An exception the command raised is in `stderr`, with its traceback."""
    key = hashlib.sha256(json.dumps([args, out, columns]).encode()).hexdigest()[:16]
    where = _ROOT / f"cli-{key}"
    out_dir = where / "out" if out else None

    def run() -> dict:
        shutil.rmtree(where, ignore_errors=True)  # what a worker that failed left
        where.mkdir(parents=True)
        res = CliRunner().invoke(main, [*args, *(["--out", str(out_dir)] if out_dir else [])],
                                 env={"COLUMNS": str(columns)} if columns else None)
        crashed = res.exception is not None and not isinstance(res.exception, SystemExit)
        return {"exit_code": res.exit_code, "stdout": res.stdout,
                "stderr": res.stderr + ("".join(traceback.format_exception(*res.exc_info)) if crashed else "")}

    saved = once_per_run(f"cli-{key}", run)
    return Ran(saved["exit_code"], saved["stdout"], saved["stderr"], out_dir)
