"""Quoting for the generated shell: the one way a value from the input reaches launch.sh, the files it
sources or runs, and megatron_args.txt.

  * `sh_quote(value)`: one bash word that gives `value` back exactly (a plain word as it is, anything else
    in single quotes; shlex.split reads it back too).  Every name, path, flag, module list, device type,
    host name and number the planner writes into shell goes through it.
  * `sh_word(value, live)`: the same, except that a run-time reference `${NAME}` with NAME in `live`
    (RUNTIME_REF: what the user's flags leave for the launcher's environment, e.g. --megatron-args
    "--data-path ${DATA_DIR}/x") stays live: `"${NAME}"` between quoted literal pieces.
  * `comment_lines(lines)`: `# ...` lines in which no control character (a newline above all) survives
    raw, so a comment can never end early and start a command.

No value becomes a shell identifier: function and variable names in the generated shell are the
planner's own (a vendor's visible-devices variable, from profiles/runtimes.yaml, is checked to be a name
when the profiles are read).
"""

from __future__ import annotations

import re
from typing import Collection, Iterable

from planner.errors import PlannerInputError
from planner.schemas.types import CONTROL_CHARACTER

_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
"""Words bash reads literally without quotes (no glob, tilde, expansion, blank or operator character)."""

RUNTIME_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
"""A run-time reference in a flag value: the launcher expands ${NAME} from its environment."""

_CONTROL = CONTROL_CHARACTER  # the characters the inputs' names may not hold (planner/schemas/types.py)
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def sh_quote(value: str) -> str:
    """`value` as one bash word, literally (no expansion of any kind).  PlannerInputError for a NUL
    character, which no shell word can hold (bash refuses a script file that contains one)."""
    if "\x00" in value:
        raise PlannerInputError("input", f"{value!r} holds a NUL character, which no shell word can pass")
    if _PLAIN.fullmatch(value):
        return value
    return "'" + value.replace("'", "'\\''") + "'"


def sh_word(value: str, live: Collection[str] = ()) -> str:
    """`value` as one bash word in which each ${NAME} (RUNTIME_REF) whose NAME is in `live` is expanded
    when the launcher runs, and everything else is literal."""
    out: list[str] = []
    at = 0
    for m in RUNTIME_REF.finditer(value):
        if m.group(1) not in live:
            continue
        if m.start() > at:
            out.append(sh_quote(value[at : m.start()]))
        out.append(f'"${{{m.group(1)}}}"')
        at = m.end()
    if at < len(value) or not out:
        out.append(sh_quote(value[at:]))
    return "".join(out)


def runtime_refs(values: Iterable[str]) -> list[str]:
    """The variable names the values refer to (RUNTIME_REF), in order of first use."""
    return list(dict.fromkeys(m.group(1) for v in values for m in RUNTIME_REF.finditer(v)))


def one_line(text: str) -> str:
    """`text` with every control character written as an escape (\\n, \\t, \\x1b, \\u2028)."""
    def esc(m: re.Match[str]) -> str:
        c = m.group(0)
        return _ESCAPES.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
    return _CONTROL.sub(esc, text)


def comment_lines(lines: Iterable[str]) -> list[str]:
    """Shell (and YAML) comment lines: `# line`, a blank line as `#`; no raw control character."""
    return ["# " + one_line(line) if line else "#" for line in lines]

