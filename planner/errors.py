"""Typed errors.  The CLI maps `PlannerInputError` to exit status 2 with its message, no traceback."""


class _Located:
    """An error that names where it is (a flag, key or option; a script's file and line): `field`, and the message
    `field: message`."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


class PlannerInputError(_Located, ValueError):
    """Bad user input: names the field (flag, key, option) and what is allowed."""


class MissingProfileError(KeyError):
    """A profile lookup that missed; names the missing key."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want plain text
        return str(self.args[0]) if self.args else "missing profile entry"


class InfeasibleError(RuntimeError):
    """No plan fits.  `reason` says which stage is short and by how much; `hints` what would help."""

    def __init__(self, reason: str, hints: list[str] | None = None):
        self.reason = reason
        self.hints = hints or []
        text = reason + ("".join(f"\n  - {h}" for h in self.hints) if self.hints else "")
        super().__init__(text)


class SearchTimeLimitError(RuntimeError):
    """The search's time limit ran out before any plan was found (not a statement about feasibility)."""


class ReadingTimeLimitError(_Located, SearchTimeLimitError):
    """Reading a launcher script ran into the command's time limit: names the script line it reached.
    A time-limit error (exit status 3), like the timer's own, whichever of the two comes first."""


class ImplausiblePredictionError(RuntimeError):
    """A prediction that cannot be true (above the devices' peak, not finite): the input lies outside
    what the cost model covers.  Never reported as a result."""


class PlanCheckError(ValueError):
    """A plan the independent checker rejects (a search bug, never a valid answer): exit status 2
    (the CLI maps ValueError to 2)."""


class Interrupted(BaseException):
    """SIGINT, SIGTERM or SIGHUP arrived (raised by the CLI's signal handlers, planner/cli_group.py).
    A BaseException, so that no `except Exception` swallows it; the staged writer removes its staging
    directory on the way out and the CLI exits with 128 + the signal's number (130, 143, 129).  `found`: a
    line on what the command had found and did not write (an interrupted solve's best plan so far), which the
    CLI prints after its own."""

    def __init__(self, signum: int):
        self.signum = signum
        self.found: str | None = None
        super().__init__(signum)
