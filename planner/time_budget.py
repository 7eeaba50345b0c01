"""`--time-limit` over the parts of a command that are not the search: reading the inputs, drawing,
writing.

The search stops itself at its deadline (planner/search/settings.py).  Reading the inputs has no such
check everywhere (a launcher script can loop, a YAML file can be slow to parse), so `reading_within`
bounds it from outside: an interval timer (SIGALRM) raises, at the deadline, an exception no reader
catches, which leaves as SearchTimeLimitError (exit status 3, "time limit: ...").  Where the timer is
not available (not the main thread, no SIGALRM) the block runs unbounded and the check after it
stays, as before.

`Budget` is the command's clock: the search's deadline (the limit less what the output is expected to
take) and the hard end of the limit, which the output steps (`remaining_s`) measure against.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from dataclasses import dataclass
from typing import Iterator

from planner.errors import SearchTimeLimitError

OUTPUT_RESERVE_S = 0.5  # of --time-limit (at most 2% of it), kept for pricing, checking and printing the plan
PLOT_RESERVE_S = 3.5  # more when pictures are drawn (matplotlib's import and three figures, 2-core machine)
PLOT_RESERVE_SHARE = 0.1  # drawing never takes more than this share of the limit from the search (it is
# skipped, and the output says so, when the search leaves too little)


PROCESS_STARTED: float | None = None  # set by cli.py run as a program: the limit then counts its imports too


class _OutOfTime(BaseException):
    """Raised by the timer; a BaseException so that no reader's `except Exception` swallows it."""


@dataclass(frozen=True)
class Budget:
    """One command's time limit, counted from `started` (time.perf_counter())."""

    started: float
    limit_s: float
    reserve_s: float

    @classmethod
    def start(cls, limit_s: float, *, drawing: bool = False) -> "Budget":
        reserve = min(OUTPUT_RESERVE_S, 0.02 * limit_s)
        if drawing:
            reserve += min(PLOT_RESERVE_S, PLOT_RESERVE_SHARE * limit_s)
        now = time.perf_counter()
        return cls(min(now, PROCESS_STARTED) if PROCESS_STARTED is not None else now, limit_s, reserve)

    @property
    def search_deadline(self) -> float:
        """When the search (and reading the inputs before it) must stop."""
        return self.started + self.limit_s - self.reserve_s

    @property
    def end(self) -> float:
        return self.started + self.limit_s

    def reading_deadline_monotonic(self) -> float:
        """`search_deadline` on time.monotonic()'s clock, the script reader's (planner/inputs/shell): the reader
        stops there itself and names the script line, inside the timer of `reading_within`."""
        return time.monotonic() + (self.search_deadline - time.perf_counter())

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    def remaining_s(self) -> float:
        """Time left before the end of the limit (negative once past it)."""
        return self.end - time.perf_counter()


REFIRE_S = 0.05  # after the deadline the timer fires again every 50 ms until the block has ended


def _raise_out_of_time(_signum: int, _frame) -> None:
    raise _OutOfTime()


def _quiet_unraisable(default):
    """sys.unraisablehook that drops _OutOfTime: a timer that fires inside a finalizer (__del__, a weakref
    callback) has its exception swallowed there; the timer fires again, and nothing is printed."""
    def hook(unraisable) -> None:
        if not isinstance(unraisable.exc_value, _OutOfTime):
            default(unraisable)

    return hook


@contextlib.contextmanager
def reading_within(budget: Budget, what: str = "reading the inputs") -> Iterator[None]:
    """Run the block until `budget.search_deadline` at most; past it, SearchTimeLimitError."""
    disarm = _arm(budget.search_deadline - time.perf_counter())
    timed_out = False
    try:
        try:
            yield
        except _OutOfTime:
            timed_out = True
        finally:
            while disarm is not None:  # the timer may fire once more while it is being disarmed
                try:
                    disarm()
                    disarm = None
                except _OutOfTime:
                    timed_out = True
    except _OutOfTime:  # fired between the block's end and its handler above
        timed_out = True
    if timed_out or time.perf_counter() > budget.search_deadline:
        raise SearchTimeLimitError(_too_long(budget, what))


def _arm(left_s: float):
    """Start the timer (firing after `left_s`, then every REFIRE_S); returns what stops it, or None
    where no timer can run (no time left, no SIGALRM, not the main thread)."""
    if left_s <= 0 or not hasattr(signal, "setitimer"):
        return None
    hook = sys.unraisablehook
    try:
        previous = signal.signal(signal.SIGALRM, _raise_out_of_time)
    except ValueError:  # not the main thread
        return None

    def disarm() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
        sys.unraisablehook = hook

    sys.unraisablehook = _quiet_unraisable(hook)
    signal.setitimer(signal.ITIMER_REAL, left_s, REFIRE_S)
    return disarm


def _too_long(budget: Budget, what: str) -> str:
    return (f"{what} took {budget.elapsed_s():.1f} s of the {budget.limit_s:g} s time limit, which leaves no time "
            "to search; raise --time-limit")


__all__ = ["Budget", "OUTPUT_RESERVE_S", "PLOT_RESERVE_S", "reading_within"]
