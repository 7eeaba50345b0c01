"""The command line's group, light enough that `cli.py --help` loads nothing more (no pydantic, no command):
usage errors as one line with exit status 2, SIGINT/SIGTERM/SIGHUP during a command, running out of memory.

- `OneLineErrorsGroup`: click's usage errors (unknown option, missing value, bad choice) as one line
  on stderr, exit status 2, instead of click's four-line usage block.  It also turns SIGINT, SIGTERM
  and SIGHUP into `Interrupted`, so that a staged output is removed on the way out, and exits with
  128 + the signal's number (130, 143, 129), saying what the command had found (`Interrupted.found`).
- `out_of_memory_message`: what a MemoryError (or a library that could not be mapped) means for the user, exit 4.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from typing import Any

import click

from planner.errors import Interrupted
from planner.signals import deliver, received

MAX_WORD_CHARS = 160  # a longer value or path in a message is shortened (a 5,000-digit number, say)


def one_line(message: str) -> str:
    """Collapse newlines and runs of spaces, so that an error is one line; shorten huge words."""
    words = str(message).split()
    return " ".join(w if len(w) <= MAX_WORD_CHARS else f"{w[:60]}...({len(w)} characters)...{w[-20:]}" for w in words)


OUT_OF_MEMORY_EXIT = 4
LOADED_KIB: int | None = None  # address space in use once cli.py has loaded the commands (their libraries)
_NO_MEMORY_TEXTS = ("failed to map segment", "cannot allocate memory")  # dlopen's words when mmap fails


def is_out_of_memory(exc: BaseException) -> bool:
    """A MemoryError, or an import that failed because the shared library could not be mapped."""
    return isinstance(exc, MemoryError) or (
        isinstance(exc, ImportError) and any(t in str(exc).lower() for t in _NO_MEMORY_TEXTS))


def status_kib(field: str) -> int | None:
    """A `VmPeak:`-style line of /proc/self/status, in KiB (None where there is no such file)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def out_of_memory_message() -> str:
    """Why a MemoryError happened, for the user: the address-space limit (`ulimit -v`) or the machine's
    memory, what the process had in use when the allocation failed, hence what the request needs."""
    import resource

    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    peak_kib = status_kib("VmPeak")
    if peak_kib is None:  # no /proc: the resident peak (KiB on Linux) is the best lower bound there is
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    need = max(peak_kib * 1024, limit if limit != resource.RLIM_INFINITY else 0)
    loaded = (f"; loading the planner's libraries alone took {LOADED_KIB / 1024:,.0f} MiB"
              if LOADED_KIB is not None else "")
    if limit != resource.RLIM_INFINITY:
        return (f"out of memory: the process may use {limit / 2**20:,.0f} MiB of address space (ulimit -v){loaded}; "
                f"this request needs more than {need / 2**20:,.0f} MiB: raise the limit (ulimit -v), or make the "
                "request smaller (a smaller cluster or model)")
    return (f"out of memory: an allocation failed with {peak_kib / 1024:,.0f} MiB of address space in use{loaded}; "
            f"this request needs more than {need / 2**20:,.0f} MiB, more than the machine could give it: free memory, "
            "or make the request smaller")

class OneLineErrorsGroup(click.Group):
    """A click group whose usage errors are one line on stderr with exit status 2."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            received(reset=True)
            try:
                with signals_raise_interrupted():
                    rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            except Exception as exc:  # an Interrupted raised inside a library's C code (a module's initialization,
                signum = received()  # mid-import: "ImportError: initialization failed") reaches here as its error
                if signum is None or isinstance(exc, (Interrupted, click.ClickException)):
                    raise
                raise Interrupted(signum) from exc
            late = received(reset=True)
            if late is not None:  # its exception was swallowed (raised inside a finalizer): exit as signalled
                raise Interrupted(late)
        except Interrupted as exc:
            name = _signal_name(exc.signum)
            click.echo(f"error: interrupted by {name}; nothing is left half-written (an output directory is either "
                       "as it was or complete)", err=True)
            if exc.found:
                click.echo(exc.found, err=True)
            sys.exit(128 + exc.signum)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else (prog_name or "cli.py")
            click.echo(f"error: {one_line(exc.format_message())} (see '{where} --help')", err=True)
            sys.exit(2)
        except click.ClickException as exc:
            click.echo(f"error: {one_line(exc.format_message())}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("aborted", err=True)
            sys.exit(1)
        except MemoryError:  # outside a command (importing it, parsing the command line)
            click.echo(f"error: {out_of_memory_message()}", err=True)
            sys.exit(OUT_OF_MEMORY_EXIT)
        sys.exit(rv if isinstance(rv, int) and not isinstance(rv, bool) else 0)


INTERRUPT_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@contextlib.contextmanager
def signals_raise_interrupted():
    """While the block runs, SIGINT/SIGTERM/SIGHUP raise Interrupted (outside the main thread: unchanged);
    the previous handlers come back afterwards.  An Interrupted a finalizer swallows is not printed
    (OneLineErrorsGroup exits as signalled all the same)."""
    previous = {}
    hook = sys.unraisablehook
    try:
        for signum in INTERRUPT_SIGNALS:
            previous[signum] = signal.signal(signum, deliver)
    except ValueError:  # not the main thread
        pass
    sys.unraisablehook = lambda u: None if isinstance(u.exc_value, Interrupted) else hook(u)
    try:
        yield
    finally:
        sys.unraisablehook = hook
        for signum, handler in previous.items():
            signal.signal(signum, handler)
