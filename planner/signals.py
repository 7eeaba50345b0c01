"""Interrupting the planner: SIGINT, SIGTERM and SIGHUP become `Interrupted` (planner/errors.py) while
a command runs (planner/cli_group.py installs `deliver` as their handler), so that the staged writer
removes its staging directory on the way out and the CLI exits with 128 + the signal's number.

`held()` defers them: a signal that arrives inside the block is remembered and raised when the block
ends (the staged writer moves its files into place inside it, so an output directory is either as it
was or complete).  Python runs signal handlers in the main thread whatever thread the signal reached,
so this holds with solver threads running, where a thread's signal mask would not.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from planner.errors import Interrupted

_state: dict[str, Any] = {"depth": 0, "pending": None, "received": None}


def deliver(signum: int, _frame: Any = None) -> None:
    """The signal handler: raise Interrupted now, or when the `held()` block ends.  The signal is also
    remembered (`received`): an exception raised inside a finalizer is swallowed there, so the CLI
    checks once more when the command returns."""
    _state["received"] = signum
    if _state["depth"]:
        _state["pending"] = signum
        return
    raise Interrupted(signum)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Signals handled by `deliver` wait until the block ends."""
    _state["depth"] += 1
    try:
        yield
    finally:
        _state["depth"] -= 1
        pending = _state["pending"]
        if not _state["depth"] and pending is not None:
            _state["pending"] = None
            raise Interrupted(pending)


def received(reset: bool = False) -> int | None:
    """The last signal `deliver` handled (None: none); `reset` forgets it."""
    signum = _state["received"]
    if reset:
        _state["received"] = None
    return signum


__all__ = ["deliver", "held", "received"]
