"""Shared CLI plumbing: one-line errors with exit status 2 (no traceback), strict number options,
and JSON output that is always valid JSON.

- `OneLineErrorsGroup`: click's usage errors (unknown option, missing value, bad choice) as one line
  on stderr, exit status 2, instead of click's four-line usage block.  It also turns SIGINT, SIGTERM
  and SIGHUP into `Interrupted`, so that a staged output is removed on the way out, and exits with
  128 + the signal's number (130, 143, 129), saying what the command had found (`Interrupted.found`).
- `handle_errors`: the planner's typed errors -> one line, exit 2 (3 when the search's time limit ran
  out before any plan was found; 4 when the process ran out of memory, saying how much it had and
  needed).  Anything else is a bug: one line saying so, exit 1 (set HAPMOE_DEBUG=1 for the traceback).
- `FiniteFloat`: a float option that refuses NaN and infinity (click's FloatRange lets NaN through).
- `echo_json` / `json_text`: JSON without NaN or Infinity (not valid JSON): a non-finite number is a
  bug caught by the prediction guard before it gets here; should one slip through it becomes null.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import signal
import sys
from typing import Any, Callable

import click
from pydantic import ValidationError

from planner.schemas.types import CONTROL_CHARACTER
from planner.signals import deliver, received
from planner.errors import (
    ImplausiblePredictionError, InfeasibleError, Interrupted, MissingProfileError, PlannerInputError,
    SearchTimeLimitError,
)

DEBUG_ENV = "HAPMOE_DEBUG"


def format_validation_error(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ())) or exc.title
        lines.append(f"{loc}: {str(err.get('msg')).removeprefix('Value error, ')}")
    return "; ".join(lines)


MAX_WORD_CHARS = 160  # a longer value or path in a message is shortened (a 5,000-digit number, say)


def one_line(message: str) -> str:
    """Collapse newlines and runs of spaces, so that an error is one line; shorten huge words."""
    words = str(message).split()
    return " ".join(w if len(w) <= MAX_WORD_CHARS else f"{w[:60]}...({len(w)} characters)...{w[-20:]}" for w in words)


def shown(message: str) -> str:
    """`message` with every control character but the newline escaped (\\x1b, \\r, \\u2028): a path or a
    value quoted in an error never reaches the terminal as a control sequence (CONTROL_CHARACTER)."""
    return CONTROL_CHARACTER.sub(lambda m: m.group(0) if m.group(0) == "\n" else ascii(m.group(0))[1:-1], message)


def fail(message: str, code: int = 2) -> None:
    click.echo(f"error: {shown(message)}", err=True)
    sys.exit(code)


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


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the planner's typed errors into one clear line on stderr and exit status 2 (3 when the
    search's time limit ran out before any plan was found)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PlannerInputError as exc:
            fail(one_line(str(exc)))
        except ValidationError as exc:
            fail(one_line(format_validation_error(exc)))
        except MissingProfileError as exc:
            fail(one_line(str(exc)))
        except InfeasibleError as exc:
            fail(f"infeasible: {exc}")
        except ImplausiblePredictionError as exc:
            fail(one_line(f"implausible prediction: {exc}"))
        except SearchTimeLimitError as exc:
            fail(one_line(f"time limit: {exc}"), code=3)
        except FileNotFoundError as exc:
            fail(one_line(f"file not found: {exc.filename or exc}"))
        except OSError as exc:  # the file system refused (permissions, a full disk): not a bug, not a traceback
            fail(one_line(f"{exc.filename or 'file system'}: {exc.strerror or exc}"))
        except (ValueError, KeyError) as exc:
            fail(one_line(str(exc).strip("'\"")))
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit, KeyboardInterrupt):
            raise
        except Exception as exc:  # a bug: say so in one line; the traceback on request
            if is_out_of_memory(exc):  # not a bug: too little memory for the request
                fail(out_of_memory_message(), code=OUT_OF_MEMORY_EXIT)
            if os.environ.get(DEBUG_ENV):
                raise
            fail(one_line(f"internal error ({type(exc).__name__}: {exc}); this is a bug in the planner, "
                          f"please report it with the command line (set {DEBUG_ENV}=1 for the traceback)"), code=1)

    return wrapper


class OneLineErrorsGroup(click.Group):
    """A click group whose usage errors are one line on stderr with exit status 2."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            received(reset=True)
            with signals_raise_interrupted():
                rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
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


class EnvDefaultOption(click.Option):
    """An option whose default an environment variable can set: a bad value names the variable only when it came
    from there (click's hint named it beside the option whatever the source: `--time-limit 0` on the command line
    was refused as "'--time-limit' (env var: 'HAPMOE_TIME_LIMIT')")."""

    def consume_value(self, ctx: click.Context, opts: Any) -> Any:
        value, source = super().consume_value(ctx, opts)
        ctx.meta[f"{__name__}.source.{self.name}"] = source
        return value, source

    def get_error_hint(self, ctx: click.Context | None) -> str:
        hint = click.Parameter.get_error_hint(self, ctx)
        source = None if ctx is None else ctx.meta.get(f"{__name__}.source.{self.name}")
        if self.envvar and source == click.core.ParameterSource.ENVIRONMENT:
            hint += f" (from the environment variable {self.envvar})"
        return hint


class FiniteFloat(click.ParamType):
    """A finite float in [min, max] (NaN and infinity are refused, unlike click.FloatRange)."""

    name = "float"

    def __init__(self, min: float | None = None, max: float | None = None):  # noqa: A002 - click's names
        self.min, self.max = min, max

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float) and math.isfinite(value):
            number = value
        else:
            try:
                number = float(str(value).strip())
            except ValueError:
                self.fail(f"{value!r} is not a number; {self._allowed()}", param, ctx)
            if not math.isfinite(number):
                self.fail(f"{value!r} is not a finite number; {self._allowed()}", param, ctx)
        if (self.min is not None and number < self.min) or (self.max is not None and number > self.max):
            self.fail(f"{number:g} is out of range; {self._allowed()}", param, ctx)
        return number

    def _allowed(self) -> str:
        if self.min is not None and self.max is not None:
            return f"allowed: {self.min:g} to {self.max:g}"
        if self.min is not None:
            return f"allowed: a finite number >= {self.min:g}"
        if self.max is not None:
            return f"allowed: a finite number <= {self.max:g}"
        return "allowed: a finite number"

    def __repr__(self) -> str:
        return f"FiniteFloat({self.min}, {self.max})"


def json_safe(obj: Any) -> Any:
    """A copy of `obj` in which every non-finite float is None (JSON has no NaN or Infinity)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def json_text(obj: Any) -> str:
    """Valid JSON text (no NaN/Infinity), indented, keys in insertion order."""
    return json.dumps(json_safe(obj), indent=2, sort_keys=False, default=str, allow_nan=False)


def echo_json(obj: Any) -> None:
    click.echo(json_text(obj))
