"""Shared CLI plumbing: error handling (exit 2, no traceback) and the common input options."""

from __future__ import annotations

import functools
import json
import sys
from typing import Any, Callable

import click
from pydantic import ValidationError

from planner.errors import InfeasibleError, MissingProfileError, PlannerInputError, SearchTimeLimitError


def format_validation_error(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ())) or exc.title
        lines.append(f"{loc}: {err.get('msg')}")
    return "; ".join(lines)


def fail(message: str, code: int = 2) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the planner's typed errors into one clear line on stderr and exit status 2 (3 when the
    search's time limit ran out before any plan was found)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PlannerInputError as exc:
            fail(str(exc))
        except ValidationError as exc:
            fail(format_validation_error(exc))
        except MissingProfileError as exc:
            fail(str(exc))
        except InfeasibleError as exc:
            fail(f"infeasible: {exc}")
        except SearchTimeLimitError as exc:
            fail(f"time limit: {exc}", code=3)
        except FileNotFoundError as exc:
            fail(f"file not found: {exc.filename or exc}")
        except (ValueError, KeyError) as exc:
            fail(str(exc).strip("'\""))

    return wrapper


def echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=False, default=str))
