"""Shared CLI plumbing of the commands: one-line errors with exit status 2 (no traceback), strict number
options, and JSON output that is always valid JSON (the group itself, its usage errors and signals:
planner/cli_group.py).

- `handle_errors`: the planner's typed errors -> one line, exit 2 (3 when the search's time limit ran
  out before any plan was found; 4 when the process ran out of memory, saying how much it had and
  needed).  Anything else is a bug: one line saying so, exit 1 (set HAPMOE_DEBUG=1 for the traceback).
- `FiniteFloat`: a float option that refuses NaN and infinity (click's FloatRange lets NaN through).
- `echo_json` / `json_text`: JSON without NaN or Infinity (not valid JSON): a non-finite number is a
  bug caught by the prediction guard before it gets here; should one slip through it becomes null.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from typing import Any, Callable

import click
from pydantic import ValidationError

from planner.cli_group import OUT_OF_MEMORY_EXIT, is_out_of_memory, one_line, out_of_memory_message
from planner.schemas.types import CONTROL_CHARACTER
from planner.errors import (
    ImplausiblePredictionError, InfeasibleError, MissingProfileError, PlannerInputError, SearchTimeLimitError,
)

DEBUG_ENV = "HAPMOE_DEBUG"


def format_validation_error(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ())) or exc.title
        lines.append(f"{loc}: {str(err.get('msg')).removeprefix('Value error, ')}")
    return "; ".join(lines)


def shown(message: str) -> str:
    """`message` with every control character but the newline escaped (\\x1b, \\r, \\u2028): a path or a
    value quoted in an error never reaches the terminal as a control sequence (CONTROL_CHARACTER)."""
    return CONTROL_CHARACTER.sub(lambda m: m.group(0) if m.group(0) == "\n" else ascii(m.group(0))[1:-1], message)


def fail(message: str, code: int = 2) -> None:
    click.echo(f"error: {shown(message)}", err=True)
    sys.exit(code)


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
