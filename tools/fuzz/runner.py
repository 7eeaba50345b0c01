"""Run fuzz cases and sort their outcomes.

Each worker is a forked process that has imported the planner once; it runs one case at a time
in-process (click's CliRunner, in the case's own temporary directory, which is also the working
directory) and sends back the exit status, the output and, for an exception, its last frames.  The
parent gives every case a wall-clock limit and kills a worker whose case runs past it (a hang), then
starts a fresh one.  Outcomes:

- ok: the expected kind of exit (an invalid input refused with one clear line, or any clean exit);
- traceback: an exception escaped the command, or it exited with status 1 (an internal error), or
  with a status other than 0, 2 and 3;
- hang: killed after the case's time limit;
- silent_accept: an input the generator knows to be invalid was accepted (exit 0);
- unclear: a refusal that is not exactly one `error:` line (infeasibility hints and `warning:`
  lines aside), or that names none of the case's flag/field/file names;
- half_written: a failed command left its --out directory created or changed.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Callable, Iterable

from tools.fuzz.cases import Case

FAILURES = ("traceback", "hang", "silent_accept", "unclear", "half_written")
MEMORY_LIMIT_BYTES = 6 << 30  # per worker: a runaway allocation fails in the worker, not on the machine


@dataclass
class Outcome:
    case: Case
    verdict: str  # "ok" or one of FAILURES
    exit_code: int | None
    seconds: float
    detail: str = ""  # the error line, or the exception's last frames


@dataclass
class Summary:
    outcomes: list[Outcome] = field(default_factory=list)
    wall_s: float = 0.0

    def count(self, verdict: str) -> int:
        return sum(1 for o in self.outcomes if o.verdict == verdict)

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.verdict != "ok"]

    def by_kind(self) -> dict[str, dict[str, int]]:
        table: dict[str, dict[str, int]] = {}
        for o in self.outcomes:
            row = table.setdefault(o.case.kind, {"cases": 0, "rejected": 0, **{f: 0 for f in FAILURES}})
            row["cases"] += 1
            row["rejected"] += o.exit_code == 2
            if o.verdict != "ok":
                row[o.verdict] += 1
        return dict(sorted(table.items()))


# --------------------------------------------------------------------------------------------
# One case, in-process (inside a worker)
# --------------------------------------------------------------------------------------------


def _materialise(case: Case, root: Path) -> None:
    for rel, content in case.files:
        path = root / rel.rstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.write_bytes(content)


def _snapshot(path: Path) -> tuple[tuple[str, int, int], ...] | None:
    if not path.exists():
        return None
    if path.is_file():
        st = path.stat()
        return (("", st.st_size, st.st_mtime_ns),)
    out = []
    for p in sorted(path.rglob("*")):
        st = p.lstat()
        out.append((str(p.relative_to(path)), st.st_size, st.st_mtime_ns))
    return tuple(out)


def _leftovers(root: Path) -> list[str]:
    return [p.name for p in root.iterdir() if p.name.startswith(".hapmoe-")]


def execute(case: Case) -> tuple[int | None, str, str, float, bool]:
    """Run `case` in this process: (exit status, stdout+stderr, exception text, seconds, half-written)."""
    from click.testing import CliRunner

    from cli import main

    root = Path(tempfile.mkdtemp(prefix="hapmoe-fuzz-"))
    cwd = os.getcwd()
    try:
        _materialise(case, root)
        argv = [a.replace("{d}", str(root)) for a in case.argv]
        out_path = root / case.out if case.out else None
        before = _snapshot(out_path) if out_path else None
        os.chdir(root)
        start = time.perf_counter()
        result = CliRunner().invoke(main, argv, catch_exceptions=True, env={"HAPMOE_DEBUG": "1"})
        seconds = time.perf_counter() - start
        os.chdir(cwd)
        error = ""
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            error = "".join(traceback.format_exception(*result.exc_info)[-4:]) if result.exc_info else repr(
                result.exception)
        half = False
        if result.exit_code != 0:
            half = bool(_leftovers(root))
            if out_path is not None:
                half = half or _snapshot(out_path) != before
                half = half or (out_path.parent.is_dir() and bool(_leftovers(out_path.parent)))
        return result.exit_code, result.output, error, seconds, half
    finally:
        os.chdir(cwd)
        shutil.rmtree(root, ignore_errors=True)


def classify(case: Case, exit_code: int | None, output: str, error: str, half: bool) -> tuple[str, str]:
    """(verdict, detail) of one finished case."""
    lines = [ln for ln in output.splitlines() if ln.strip()]
    error_lines = [ln for ln in lines if ln.startswith("error:")]
    detail = error_lines[0] if error_lines else (lines[-1] if lines else "")
    if error or exit_code not in (0, 2, 3) or "Traceback (most recent call last)" in output:
        return "traceback", error.strip() or detail
    if half:
        return "half_written", detail
    if exit_code == 0:
        return ("silent_accept", "exit 0") if case.expect == "reject" else ("ok", "")
    if exit_code == 3:
        return "ok", detail
    if len(error_lines) != 1:
        return "unclear", f"{len(error_lines)} error lines: " + " | ".join(lines[-3:])
    extra = [ln for ln in lines if not ln.startswith(("error:", "warning:", "  - ", "wrote "))]
    if extra and not error_lines[0].startswith("error: infeasible"):
        return "unclear", "more than one line: " + " | ".join(lines[-3:])
    if case.expect == "reject" and case.names:
        text = error_lines[0].lower()
        if not any(n.lower() in text for n in case.names):
            return "unclear", f"names none of {list(case.names)}: {error_lines[0]}"
    return "ok", detail


# --------------------------------------------------------------------------------------------
# Workers
# --------------------------------------------------------------------------------------------


Executor = Callable[[Case], tuple[int | None, str, str, float, bool]]


def _worker(conn: Connection, executor: Executor) -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    except (ImportError, ValueError, OSError):
        pass
    import cli  # noqa: F401 - import once, before the first case

    while True:
        try:
            case = conn.recv()
        except EOFError:
            return
        if case is None:
            return
        try:
            exit_code, output, error, seconds, half = executor(case)
        except BaseException as exc:  # the harness itself: report, keep going
            exit_code, output, error, seconds, half = None, "", f"harness: {exc!r}", 0.0, False
        if len(output) > 8000:
            output = output[:4000] + "\n...\n" + output[-4000:]
        conn.send((exit_code, output, error[-4000:], seconds, half))


class _Slot:
    """One worker process and the case it is running."""

    def __init__(self, ctx: mp.context.BaseContext, executor: Executor):
        self.parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, executor), daemon=True)  # forked: not pickled
        self.proc.start()
        child.close()
        self.case: Case | None = None
        self.started = 0.0

    def give(self, case: Case) -> None:
        self.case, self.started = case, time.monotonic()
        self.parent.send(case)

    def kill(self) -> None:
        try:
            os.kill(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, TypeError):
            pass
        self.proc.join(timeout=5)
        self.parent.close()

    def stop(self) -> None:
        try:
            self.parent.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.kill()


def run_cases(cases: Iterable[Case], *, jobs: int = 2, timeout_s: float | None = None,
              progress: Callable[[int, Outcome], None] | None = None, executor: Executor = execute) -> Summary:
    """Run every case on `jobs` forked workers; a case past its limit (`timeout_s` or the case's own)
    is a hang and its worker is replaced.  `executor` runs one case in a worker (tests replace it)."""
    ctx = mp.get_context("fork")
    pending = list(cases)
    pending.reverse()
    summary = Summary()
    start = time.monotonic()
    slots = [_Slot(ctx, executor) for _ in range(max(1, min(jobs, len(pending) or 1)))]
    for slot in slots:
        if pending:
            slot.give(pending.pop())
    try:
        while any(s.case is not None for s in slots):
            busy = [s for s in slots if s.case is not None]
            ready = wait([s.parent for s in busy], timeout=0.5)
            now = time.monotonic()
            for i, slot in enumerate(slots):
                case = slot.case
                if case is None:
                    continue
                limit = timeout_s if timeout_s is not None else case.timeout_s
                if slot.parent in ready:
                    try:
                        exit_code, output, error, seconds, half = slot.parent.recv()
                    except (EOFError, OSError):  # the worker died (memory limit, a signal)
                        exit_code, output, error, seconds, half = None, "", "worker died", now - slot.started, False
                        slot.kill()
                        slots[i] = slot = _Slot(ctx, executor)
                    verdict, detail = classify(case, exit_code, output, error, half)
                    outcome = Outcome(case, verdict, exit_code, seconds, detail)
                elif now - slot.started > limit:
                    elapsed = now - slot.started
                    slot.kill()
                    slots[i] = slot = _Slot(ctx, executor)
                    outcome = Outcome(case, "hang", None, elapsed, f"killed after {limit:.0f} s")
                else:
                    continue
                summary.outcomes.append(outcome)
                if progress:
                    progress(len(summary.outcomes), outcome)
                slot.case = None
                if pending:
                    slot.give(pending.pop())
    finally:
        for slot in slots:
            slot.stop()
    summary.outcomes.sort(key=lambda o: o.case.index)
    summary.wall_s = time.monotonic() - start
    return summary


__all__ = ["FAILURES", "Outcome", "Summary", "classify", "execute", "run_cases"]
