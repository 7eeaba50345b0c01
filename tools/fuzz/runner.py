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
- half_written: a failed command left its --out directory created or changed (a signalled one: neither
  as it was nor complete by its manifest), or a staging directory behind;
- data_loss: a file of the case that the planner did not write (everything but `Case.owned`: the
  user's files in an output directory, the inputs) was changed or deleted, whatever the exit status.

Cases with `Case.signal` run `python cli.py` as a child process and send it the signal after the
delay: it must exit 0 (done before the signal), 2/3 (refused), or 128 + the signal's number.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Callable, Iterable

from tools.fuzz.cases import Case

FAILURES = ("data_loss", "traceback", "hang", "silent_accept", "unclear", "half_written")
ROOT = Path(__file__).resolve().parents[2]
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


def _protected(case: Case) -> dict[str, bytes]:
    """The case's files the planner did not write: all of them but `Case.owned`."""
    def owned(rel: str) -> bool:
        return any(rel == o or rel.startswith(o.rstrip("/") + "/") for o in case.owned)

    return {rel: content for rel, content in case.files if not rel.endswith("/") and not owned(rel)}


def _lost(root: Path, protected: dict[str, bytes]) -> list[str]:
    """Protected files that are gone or changed."""
    out = []
    for rel, content in protected.items():
        path = root / rel
        try:
            same = path.is_file() and not path.is_symlink() and path.read_bytes() == content
        except OSError:
            same = False
        if not same:
            out.append(rel)
    return out


def _complete(out_path: Path) -> bool:
    """A directory the planner wrote completely: every file its manifest lists is there, unchanged."""
    from planner.output.manifest import survey

    if not out_path.is_dir():
        return False
    found = survey(out_path)
    return found.family is not None and set(found.listed) <= found.ours


def _run_in_process(argv: list[str]) -> tuple[int | None, str, str]:
    from click.testing import CliRunner

    from cli import main

    result = CliRunner().invoke(main, argv, catch_exceptions=True, env={"HAPMOE_DEBUG": "1"})
    error = ""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        error = "".join(traceback.format_exception(*result.exc_info)[-4:]) if result.exc_info else repr(
            result.exception)
    return result.exit_code, result.output, error


def _run_signalled(case: Case, argv: list[str], root: Path) -> tuple[int | None, str, str]:
    """`python cli.py ARGV` as a child, signalled after the case's delay; (exit, output, error)."""
    name, delay = case.signal or ("SIGTERM", 1.0)
    proc = subprocess.Popen([sys.executable, str(ROOT / "cli.py"), *argv], cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env={**os.environ, "HAPMOE_DEBUG": "1"})
    try:
        proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        proc.send_signal(getattr(signal, name))
    try:
        output, _ = proc.communicate(timeout=max(5.0, case.timeout_s * 0.6))
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        return None, output.decode(errors="replace"), f"hang: still running {case.timeout_s * 0.6:.0f} s after {name}"
    code = proc.returncode
    return (128 - code if code < 0 else code), output.decode(errors="replace"), ""


def execute(case: Case) -> tuple[int | None, str, str, float, bool, list[str]]:
    """Run `case` in this process (a signalled case: in a child process): (exit status, stdout+stderr,
    exception text, seconds, half-written, protected files lost)."""
    root = Path(tempfile.mkdtemp(prefix="hapmoe-fuzz-"))
    cwd = os.getcwd()
    try:
        _materialise(case, root)
        protected = _protected(case)
        argv = [a.replace("{d}", str(root)) for a in case.argv]
        out_path = root / case.out if case.out else None
        before = _snapshot(out_path) if out_path else None
        os.chdir(root)
        start = time.perf_counter()
        if case.signal is not None:
            exit_code, output, error = _run_signalled(case, argv, root)
        else:
            exit_code, output, error = _run_in_process(argv)
        seconds = time.perf_counter() - start
        os.chdir(cwd)
        half = bool(_leftovers(root)) or (out_path is not None and out_path.parent.is_dir()
                                          and bool(_leftovers(out_path.parent)))
        if exit_code != 0 and out_path is not None and _snapshot(out_path) != before:
            half = half or case.signal is None or not _complete(out_path)
        return exit_code, output, error, seconds, half, _lost(root, protected)
    finally:
        os.chdir(cwd)
        shutil.rmtree(root, ignore_errors=True)


def classify(case: Case, exit_code: int | None, output: str, error: str, half: bool,
             lost: list[str] | tuple[str, ...] = ()) -> tuple[str, str]:
    """(verdict, detail) of one finished case."""
    lines = [ln for ln in output.splitlines() if ln.strip()]
    error_lines = [ln for ln in lines if ln.startswith("error:")]
    detail = error_lines[0] if error_lines else (lines[-1] if lines else "")
    if lost:
        return "data_loss", f"changed or deleted: {', '.join(lost[:5])}; " + detail
    if error.startswith("hang:"):
        return "hang", error
    signalled = 128 + getattr(signal, case.signal[0]) if case.signal is not None else None
    allowed = (0, 2, 3) if signalled is None else (0, 2, 3, signalled)
    if error or exit_code not in allowed or "Traceback (most recent call last)" in output:
        return "traceback", error.strip() or detail
    if signalled is not None and exit_code == signalled:
        return ("half_written", "signalled: " + detail) if half else ("ok", detail)
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


Executor = Callable[[Case], tuple]  # (exit, output, error, seconds, half-written[, lost files])


def _worker(conn: Connection, executor: Executor) -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    except (ImportError, ValueError, OSError):
        pass
    import cli

    cli.load_every_command()  # once, before the first case (already loaded where the parent loaded them)

    while True:
        try:
            case = conn.recv()
        except EOFError:
            return
        if case is None:
            return
        try:
            exit_code, output, error, seconds, half, *rest = executor(case)
        except BaseException as exc:  # the harness itself: report, keep going
            exit_code, output, error, seconds, half, rest = None, "", f"harness: {exc!r}", 0.0, False, []
        if len(output) > 8000:
            output = output[:4000] + "\n...\n" + output[-4000:]
        conn.send((exit_code, output, error[-4000:], seconds, half, list(rest[0]) if rest else []))


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
                        exit_code, output, error, seconds, half, lost = slot.parent.recv()
                    except (EOFError, OSError):  # the worker died (memory limit, a signal)
                        exit_code, output, error, seconds, half, lost = (None, "", "worker died", now - slot.started,
                                                                         False, [])
                        slot.kill()
                        slots[i] = slot = _Slot(ctx, executor)
                    verdict, detail = classify(case, exit_code, output, error, half, lost)
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
