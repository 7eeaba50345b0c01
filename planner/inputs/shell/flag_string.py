"""A flag string (`--megatron-args "..."`) split into words with bash's quoting, running nothing.

The words are what bash would pass, with one difference: a variable stays a reference for the launcher.

  * blanks separate words; `'...'` is literal; `"..."` keeps blanks and expands variables; `$'...'` is
    ANSI-C quoting (`$'/ckpt/a\\tb'` is /ckpt/a<TAB>b); a backslash outside quotes escapes the next character;
  * `$NAME` and `${NAME}` (outside single quotes) become the run-time reference `${NAME}` (RUNTIME_REF of
    planner/launcher/quoting.py): launch.sh expands it from its environment, and stops with a message naming
    the variable when it is not set;
  * refused, with the reason: `$(...)` and backquotes (nothing the user writes is run, by the planner or by
    launch.sh), other expansions (`${X:-d}`, `$1`, `$((...))`), whose value is not known here, and a quoted
    or escaped `$NAME`, which bash passes as text but which would read as a reference everywhere after;
  * unlike a bash command line, `; | & < > ( ) #` and glob characters are ordinary characters of a word (it
    is a flag list, not a command): `--moe-layer-freq ([1]*48)` is one value.
"""

from __future__ import annotations

import re

from planner.errors import PlannerInputError
from planner.inputs.shell.lexer import ansi_c_string

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BLANKS = " \t\n"
_LITERAL_DOLLAR = re.compile(r"\$(?=[A-Za-z0-9_{])")


def split_flag_string(text: str, field: str = "--megatron-args") -> list[str]:
    """The words of `text` (see the module docstring); PlannerInputError naming `field` for what
    cannot be passed faithfully."""
    return _Splitter(text, field).words()


class _Splitter:
    def __init__(self, text: str, field: str):
        self.text, self.field, self.pos = text, field, 0
        self.word: list[str] = []
        self.refs: set[int] = set()  # offsets in the word where a reference starts
        self.in_word = False

    def fail(self, message: str) -> PlannerInputError:
        return PlannerInputError(self.field, message)

    def words(self) -> list[str]:
        out: list[str] = []
        text = self.text
        while self.pos < len(text):
            c = text[self.pos]
            if c in _BLANKS:
                if self.in_word:
                    out.append(self.finish())
                self.pos += 1
                continue
            self.in_word = True
            if c == "'":
                end = text.find("'", self.pos + 1)
                if end < 0:
                    raise self.fail("unterminated ' quote")
                self.literal(text[self.pos + 1 : end])
                self.pos = end + 1
            elif c == '"':
                self.double_quoted()
            elif c == "\\":
                if text.startswith("\n", self.pos + 1):
                    self.in_word = bool(self.word)
                else:
                    self.literal(text[self.pos + 1 : self.pos + 2])
                self.pos += 2
            elif c == "$" and text.startswith("'", self.pos + 1):
                found = ansi_c_string(text, self.pos + 2)
                if found is None:
                    raise self.fail("unterminated $' quote")
                self.literal(found[0])
                self.pos = found[1]
            elif c == "$" and text.startswith('"', self.pos + 1):
                self.pos += 1
                self.double_quoted()
            elif c in "$`":
                self.dollar()
            else:
                self.literal(c)
                self.pos += 1
        if self.in_word:
            out.append(self.finish())
        return out

    def literal(self, s: str) -> None:
        self.word.append(s)

    def finish(self) -> str:
        word = "".join(self.word)
        for m in _LITERAL_DOLLAR.finditer(word):
            if m.start() not in self.refs:
                raise self.fail(f"{word!r} holds a quoted or escaped `$` before a name: bash passes it as text, but "
                                "launch.sh, megatron_args.txt and FlagScale's config read $NAME and ${NAME} as a "
                                "variable; write it unquoted to refer to the variable when launch.sh runs")
        self.word, self.refs, self.in_word = [], set(), False
        return word

    def double_quoted(self) -> None:
        text = self.text
        self.pos += 1
        while self.pos < len(text):
            c = text[self.pos]
            if c == '"':
                self.pos += 1
                return
            if c == "\\" and text[self.pos + 1 : self.pos + 2] in ('"', "\\", "$", "`", "\n"):
                if text[self.pos + 1] != "\n":
                    self.literal(text[self.pos + 1])
                self.pos += 2
            elif c in "$`":
                self.dollar()
            else:
                self.literal(c)
                self.pos += 1
        raise self.fail('unterminated " quote')

    def dollar(self) -> None:
        """At `$` or a backquote: a reference kept for launch.sh, a literal `$`, or a refusal."""
        text, at = self.text, self.pos
        if text[at] == "`" or text.startswith("$(", at):
            raise self.fail(f"{_excerpt(text, at)}: command substitution is never run (not by the planner, not by "
                            "launch.sh on the nodes); give the value itself, or ${NAME} for a variable launch.sh "
                            "expands when it runs")
        braced = text.startswith("${", at)
        m = _NAME.match(text, at + (2 if braced else 1))
        if m and (not braced or text.startswith("}", m.end())):
            self.refs.add(sum(map(len, self.word)))
            self.literal("${" + m.group(0) + "}")
            self.pos = m.end() + (1 if braced else 0)
            return
        nxt = text[at + 1 : at + 2]
        if braced or (nxt and (nxt.isdigit() or nxt in "@*#?$!-")):
            raise self.fail(f"{_excerpt(text, at)}: only $NAME and ${{NAME}} stay references (launch.sh expands them "
                            "when it runs); this expansion has no value here: give the value itself")
        self.literal("$")  # a `$` before anything else is an ordinary character, as in bash
        self.pos += 1


def _excerpt(text: str, at: int) -> str:
    end = at + 1
    while end < len(text) and text[end] not in _BLANKS and end - at < 40:
        end += 1
    return text[at:end]
