"""The launcher corpus (tests/launchers/corpus.yaml) and its scripts solved once per test run, for the corpus tests
and Megatron's validator tests alike: under pytest-xdist the workers share the solves (tests/helpers/run_dir.py), the
first to need a script solving it under a lock while the others wait for it."""

from __future__ import annotations

import atexit
import fcntl
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

import yaml
from click.testing import CliRunner

from cli import main
from helpers.run_dir import worker_run_dir

CORPUS_DIR = Path(__file__).resolve().parents[1] / "launchers"
CORPUS = yaml.safe_load((CORPUS_DIR / "corpus.yaml").read_text())
NAMES = [c["script"] for c in CORPUS]

_SOLVED_ROOT = worker_run_dir()
if _SOLVED_ROOT is None:
    _SOLVED_ROOT = Path(tempfile.mkdtemp(prefix="hapmoe-corpus-"))
    atexit.register(shutil.rmtree, _SOLVED_ROOT, True)


def entry(name: str) -> dict:
    """The corpus.yaml entry of one script."""
    return next(c for c in CORPUS if c["script"] == name)


SOLVE_LIMIT_S = "5"
"""Each corpus solve's time limit: the tests read the launcher of whatever plan solve returns, not its optimality
(the largest take 20-26 s to certify, so nearly every solve runs to the limit).  On a 2-core machine at load 3.7 every
corpus script had a plan at --time-limit 2 (five of 17 had none at 1 s, two more at 0.6 s); at 10 s the 17 solves
took 137 s there."""


@lru_cache(maxsize=None)
def solved(name: str, runtime: str = "megatron", cluster: str | None = None) -> Path:
    """Run `solve` on one corpus script (once per test session) and return its --out directory
    (`cluster`: another cluster than the entry's)."""
    c = entry(name)
    out = _SOLVED_ROOT / f"{name}-{runtime}-{(cluster or 'own').replace(':', '_').replace(',', '+')}"
    args = ["solve", "--megatron-script", str(CORPUS_DIR / name), "--cluster", cluster or c["cluster"], "--backend", "hsdp",
            "--runtime", runtime, "--time-limit", SOLVE_LIMIT_S, "--quiet", "--out", str(out), "--", *c["args"]]
    done = out.with_name(out.name + ".done")
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker solving it: wait, then read its output
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)  # what a worker that failed left
            result = CliRunner().invoke(main, args)
            assert result.exit_code == 0, result.output
            done.write_text("")
    return out
