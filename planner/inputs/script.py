"""Read a bash launcher script the way bash would run it, without running anything.

`parse_launcher_script(text, args=..., path=...)` evaluates the script in a small interpreter for
the subset of bash that training launchers use, until the statement that starts training (a
`torchrun ... pretrain_gpt.py <flags>`, `python -m torch.distributed.run|launch ...`,
`python <train>.py ...`, possibly behind `srun`/`mpirun`, inside `bash -c "..."`, or run by
`eval "$cmd"`), and returns the flags given to the entry script.

What it evaluates:
  * variables, `${X:-default}` and the other `${...}` forms, `$((...))`, quoting, word splitting,
    arrays (`A=(...)`, `A+=(...)`, `"${A[@]}"`, `${#A[@]}`), `export`/`declare`/`local`/`unset`;
  * the script's own arguments (`$1`, `"$@"`, `$#`, `shift`, `set --`), given by the caller;
  * `if`/`elif`/`else`, `case`, `for`, `while`/`until` (also `while [[ $# -gt 0 ]]; do case $1 in
    ...; esac; shift; done` and `while getopts ...` option loops), `&&`/`||`, `[ ]`, `[[ ]]`,
    `test`, `(( ))`, functions;
  * `source FILE` / `. FILE` (read relative to the script), `eval`, and `bash -c STRING`.

What it cannot know (a command's output `$(...)`, an environment variable the script never sets,
whether a file exists on the cluster) is handled so the result is predictable:
  * in a flag value it stays literal text (`${DATA_PATH}`, `$(date)`), listed in `unresolved`;
  * in a condition, an unset variable reads as unset (empty), and a test that cannot be decided
    (a file test, an external command) reads as false; the branch it guards is skipped.
  Every such reading of a branch that holds flags is recorded in `decisions` and reported in
  `warnings`: which line, which way it was read, and which flags the branch holds.

Limits (a hostile or broken script is refused with one line naming the file and line, never a
hang): expansions nested more than MAX_NESTING deep, unterminated quotes or brackets, arithmetic
with more than MAX_ARITH_CHARS characters (and 64-bit wrap-around, as bash), more than MAX_STEPS
evaluation steps (a loop that never ends), eval/source/function calls deeper than MAX_DEPTH.
Lexing and evaluation are linear in the script's size.
"""

from __future__ import annotations

import ast
import bisect
import fnmatch
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from planner.errors import PlannerInputError

FIELD = "--megatron-script"

MAX_NESTING = 64  # ${...${...}} / $(...$(...)) levels
MAX_ARITH_CHARS = 4096
MAX_STEPS = 1_000_000  # statements evaluated
MAX_DEPTH = 64  # nested eval / source / bash -c / function calls
MAX_SCRIPT_BYTES = 64 << 20

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_ASSIGN_RE = re.compile(r"^([A-Za-z_][A-Za-z_0-9]*)(\[[^\]]*\])?(\+?)=")
_ASSIGN_AT = re.compile(r"([A-Za-z_][A-Za-z_0-9]*)(\[[^\]]*\])?(\+?)=")  # for pattern.match(text, pos)
_OP_CHARS = frozenset(";&|()<>")
_SPACE = frozenset(" \t\r\n")
_PLAIN_RUN = re.compile(r"[^\s;&|()<>\\'\"$`]+")
_DQ_PLAIN_RUN = re.compile(r'[^"\\$`]+')
_DECLARE_WORDS = {"export", "declare", "typeset", "local", "readonly"}
_RESERVED_END = {"then", "elif", "else", "fi", "do", "done", "esac", "}"}
_TORCH_LAUNCH_MODULES = {"torch.distributed.run", "torch.distributed.launch"}
_WRAPPERS = {"srun", "mpirun", "mpiexec", "env", "nohup", "exec", "time", "numactl", "stdbuf", "taskset", "nice",
             "ionice", "singularity", "apptainer", "docker", "enroot", "xargs", "timeout", "ddp", "nsys"}
_ALWAYS_OK = {"echo", "printf", "mkdir", "cd", "pushd", "popd", "export", "set", "ulimit", "trap", "shopt", "umask",
              "alias", "hash", "wait", "sleep", "touch", "cp", "mv", "rm", "ln", "chmod", "tee", "cat", "date",
              "module", "conda", "ml", "pip", "nvidia-smi", "hostname", "ls", "sync"}
_TRAIN_ENTRY = re.compile(r"(pretrain|train|finetune|sft)", re.IGNORECASE)
_ASSIGNED_NAME = re.compile(r"(?:^|[\s;(&|])(?:(?:export|declare|local|typeset|readonly)(?:\s+-\w+)*\s+)?([A-Za-z_][A-Za-z_0-9]*)(?:\[[^\]]*\])?\+?=", re.M)
_FLAG_TEXT = re.compile(r"(?<![\w-])(--[A-Za-z][A-Za-z0-9_-]*)")


def _where(path: str | None, line: int) -> str:
    return f"{path or 'script'}:{line}"


# --------------------------------------------------------------------------------------------
# Result
# --------------------------------------------------------------------------------------------
@dataclass
class BranchDecision:
    """A condition that could not be decided from the script alone, and how it was read."""

    line: int
    condition: str
    reading: str  # what the planner did, e.g. "false: skipped lines 40-44"
    reason: str  # why it could not be decided
    flags_skipped: list[str] = field(default_factory=list)
    flags_taken: list[str] = field(default_factory=list)

    def message(self, path: str | None) -> str:
        held = []
        if self.flags_skipped:
            held.append("skipped flags " + " ".join(self.flags_skipped))
        if self.flags_taken:
            held.append("kept flags " + " ".join(self.flags_taken))
        detail = f" ({'; '.join(held)})" if held else ""
        return f"{_where(path, self.line)}: `{self.condition}` {self.reason}; read as {self.reading}{detail}"


@dataclass
class LaunchSite:
    """Where the launch happens in the script text: the statement the emitted launcher wraps.

    via: "direct" (the statement itself runs the launcher, possibly behind srun/mpirun), "eval"
    (`eval "$cmd"`), "string" (a `bash -c "..."` string, e.g. given to srun), "source" (a sourced
    file) or "function" (a function defined elsewhere runs it)."""

    line: int
    offset: int  # character offset of the statement's command word in the script text
    word: str  # that word as written
    via: str


@dataclass
class LauncherScript:
    """What the planner keeps from a launcher script."""

    text: str
    megatron_flags: list[str]
    entry_script: str
    launcher: list[str]  # torchrun | python -m torch.distributed.run | python
    launcher_args: list[str]  # the launcher's own options, before the entry script
    wrapper: list[str] = field(default_factory=list)  # srun/mpirun ... before the launcher
    path: str | None = None
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    arrays: dict[str, list[str]] = field(default_factory=dict)
    exported: list[str] = field(default_factory=list)
    launch_env: dict[str, str] = field(default_factory=dict)  # VAR=value before the launcher word
    site: LaunchSite | None = None
    extra_flags: list[str] = field(default_factory=list)  # --megatron-args given on top of the script
    sourced: dict[str, str] = field(default_factory=dict)  # files it sources from its own directory: path -> text
    self_relative: bool = False  # it locates files from its own directory ($(dirname "$0"), BASH_SOURCE)
    decisions: list[BranchDecision] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines()

    @property
    def world_size(self) -> int | None:
        """GPUs the script asks for: torchrun's nnodes * nproc-per-node (defaults 1, 1), or srun's
        nodes * tasks per node, or mpirun's -np; 1 for a plain `python train.py`; None when a
        count is not a plain integer."""
        if self.wrapper and self.wrapper[0].rsplit("/", 1)[-1] in ("srun", "mpirun", "mpiexec") and not self._torch_launcher:
            return _wrapper_world(self.wrapper)
        if not self._torch_launcher:
            return 1
        values = _options(self.launcher_args, {"nproc-per-node", "nnodes"})
        nproc = values.get("nproc-per-node", "1")
        nnodes = values.get("nnodes", "1")
        if ":" in nnodes:  # elastic min:max
            nnodes = nnodes.split(":")[-1]
        if not (nproc.isdigit() and nnodes.isdigit()):
            return None
        return int(nproc) * int(nnodes)

    @property
    def _torch_launcher(self) -> bool:
        return bool(self.launcher) and (self.launcher[0].rsplit("/", 1)[-1] == "torchrun" or "-m" in self.launcher)


def _options(args: list[str], keys: set[str]) -> dict[str, str]:
    """{key: value} of long options given as `--k v` or `--k=v` (`_` and `-` alike)."""
    out: dict[str, str] = {}
    for i, tok in enumerate(args):
        name, eq, val = tok.partition("=")
        key = name.lstrip("-").replace("_", "-")
        if tok.startswith("-") and key in keys:
            out[key] = val if eq else (args[i + 1] if i + 1 < len(args) else "")
    return out


def _wrapper_world(words: list[str]) -> int | None:
    """World size from srun (-N/--nodes times --ntasks-per-node, or -n/--ntasks) or mpirun -np."""
    short: dict[str, str] = {}
    for i, tok in enumerate(words[:-1]):
        if tok in ("-N", "-n", "-np", "-c"):
            short[tok] = words[i + 1]
    longs = _options(words, {"nodes", "ntasks-per-node", "ntasks", "np"})
    total = longs.get("ntasks") or short.get("-n") or short.get("-np") or longs.get("np")
    if total and total.isdigit():
        return int(total)
    nodes = longs.get("nodes") or short.get("-N") or "1"
    per = longs.get("ntasks-per-node")
    if per and per.isdigit() and nodes.isdigit():
        return int(nodes) * int(per)
    return None


# --------------------------------------------------------------------------------------------
# Lexer: words made of parts, array assignments, operators, heredocs
# --------------------------------------------------------------------------------------------
@dataclass
class _Part:
    kind: str  # lit | var | arr | idx | raw | arith | len | alen | pos
    text: str
    quoted: bool
    op: str = ""  # ${X<op>arg}
    arg: "_Word | None" = None
    arg2: "_Word | None" = None  # ${X/pat/rep}: the replacement; ${X:off:len}: the length


@dataclass
class _Word:
    parts: list[_Part]
    raw: str
    line: int
    pos: int


@dataclass
class _ArrayAssign:
    name: str
    append: bool
    words: list[_Word]
    raw: str
    line: int
    pos: int


@dataclass
class _Op:
    text: str
    line: int
    pos: int


@dataclass
class _ArithCmd:
    expr: str
    line: int
    pos: int


_Token = _Word | _ArrayAssign | _Op | _ArithCmd


class _Lexer:
    """Turns bash text into tokens.  Every scan moves forward, so lexing is linear."""

    def __init__(self, text: str, path: str | None, line_offset: int = 0):
        self.text = text
        self.path = path
        self.line_offset = line_offset
        self.pos = 0
        self.newlines = [i for i, c in enumerate(text) if c == "\n"]
        self.depth = 0
        self.heredocs: list[tuple[str, bool]] = []
        self.warnings: list[str] = []

    def line_at(self, pos: int) -> int:
        return bisect.bisect_left(self.newlines, pos) + 1 + self.line_offset

    def fail(self, pos: int, message: str) -> PlannerInputError:
        return PlannerInputError(_where(self.path, self.line_at(pos)), message)

    # -- tokens -------------------------------------------------------------------------------
    def tokens(self) -> list[_Token]:
        out: list[_Token] = []
        text = self.text
        n = len(text)
        expect_delim = False
        while self.pos < n:
            c = text[self.pos]
            if c in " \t\r":
                self.pos += 1
            elif c == "\\" and text.startswith("\n", self.pos + 1):
                self.pos += 2
            elif c == "\n":
                out.append(_Op("\n", self.line_at(self.pos), self.pos))
                self.pos += 1
                if self.heredocs:
                    self._skip_heredoc_bodies()
            elif c == "#" and (self.pos == 0 or text[self.pos - 1] in _SPACE or text[self.pos - 1] in _OP_CHARS):
                end = text.find("\n", self.pos)
                self.pos = n if end < 0 else end
            elif text.startswith("((", self.pos) and self._command_position(out):
                out.append(self._arith_command())
            elif c in _OP_CHARS or (c.isdigit() and re.match(r"\d+[<>]", text[self.pos : self.pos + 12])):
                op = self._operator()
                out.append(op)
                if op.text.lstrip("0123456789") in ("<<", "<<-"):
                    expect_delim = True
            else:
                tok = self._word_or_array()
                out.append(tok)
                if expect_delim and isinstance(tok, _Word):
                    strip_tabs = bool(out[-2].text.endswith("-")) if len(out) > 1 and isinstance(out[-2], _Op) else False
                    delim = "".join(p.text for p in tok.parts)
                    self.heredocs.append((delim, strip_tabs))
                expect_delim = False
        return out

    @staticmethod
    def _command_position(out: list[_Token]) -> bool:
        if not out:
            return True
        last = out[-1]
        if isinstance(last, _Op):
            return last.text in ("\n", ";", "&&", "||", "|", "&", "(", ";;")
        if isinstance(last, _Word):
            return last.raw in ("then", "do", "else", "elif", "{", "!", "for", "while", "until", "if")
        return False

    def _skip_heredoc_bodies(self) -> None:
        text = self.text
        for delim, strip_tabs in self.heredocs:
            while self.pos < len(text):
                end = text.find("\n", self.pos)
                end = len(text) if end < 0 else end
                line = text[self.pos : end]
                self.pos = min(end + 1, len(text))
                if (line.lstrip("\t") if strip_tabs else line) == delim:
                    break
        self.heredocs = []

    def _arith_command(self) -> _ArithCmd:
        start = self.pos
        close = self._match_close(start + 2, "(", ")")
        if close < 0 or not self.text.startswith(")", close + 1):
            raise self.fail(start, "unbalanced (( ... )): no matching ))")
        self.pos = close + 2
        return _ArithCmd(self.text[start + 2 : close], self.line_at(start), start)

    def _operator(self) -> _Op:
        text, start = self.text, self.pos
        m = re.match(r"\d*(>>|>&|<&|<<<|<<-|<<|&>>|&>|>\||>|<)|;;&|;;|;&|&&|\|\||\|&|[;&|()]", text[self.pos : self.pos + 8])
        assert m is not None
        self.pos += m.end()
        return _Op(m.group(0), self.line_at(start), start)

    # -- matching helpers -----------------------------------------------------------------------
    def _match_close(self, start: int, open_ch: str, close_ch: str) -> int:
        """Index of the bracket closing the one just before `start` (quotes and nesting aware),
        -1 when there is none."""
        depth, i, text = 1, start, self.text
        n = len(text)
        while i < n:
            c = text[i]
            if c == "\\":
                i += 2
                continue
            if c == "'" and open_ch != "{":
                j = text.find("'", i + 1)
                if j < 0:
                    return -1
                i = j + 1
                continue
            if c == '"':
                i = self._skip_dquote(i + 1)
                if i < 0:
                    return -1
                continue
            if c == open_ch:
                depth += 1
                if depth > MAX_NESTING:
                    raise self.fail(start, f"brackets nested more than {MAX_NESTING} deep")
            elif c == close_ch:
                depth -= 1
                if depth == 0:
                    return i
            i += 1
        return -1

    def _skip_dquote(self, i: int) -> int:
        text = self.text
        n = len(text)
        while i < n:
            c = text[i]
            if c == "\\":
                i += 2
                continue
            if c == '"':
                return i + 1
            if c == "$" and i + 1 < n and text[i + 1] in "({":
                close = self._match_close(i + 2, text[i + 1], ")" if text[i + 1] == "(" else "}")
                if close < 0:
                    return -1
                i = close + 1
                continue
            i += 1
        return -1

    # -- words --------------------------------------------------------------------------------
    def _word_or_array(self) -> _Token:
        start = self.pos
        m = _ASSIGN_AT.match(self.text, self.pos)
        if m and not m.group(2) and self.text.startswith("(", m.end()):
            self.pos = m.end() + 1
            words: list[_Word] = []
            text = self.text
            while True:
                if self.pos >= len(text):
                    raise self.fail(start, f"array assignment {m.group(1)}=( is not closed with )")
                c = text[self.pos]
                if c in _SPACE:
                    self.pos += 1
                elif c == "\\" and text.startswith("\n", self.pos + 1):
                    self.pos += 2
                elif c == "#" and text[self.pos - 1] in _SPACE:
                    end = text.find("\n", self.pos)
                    self.pos = len(text) if end < 0 else end
                elif c == ")":
                    self.pos += 1
                    break
                elif c in _OP_CHARS:
                    raise self.fail(self.pos, f"syntax error near unexpected token `{c}` in {m.group(1)}=( ... )")
                else:
                    words.append(self._word())
            return _ArrayAssign(m.group(1), bool(m.group(3)), words, text[start : self.pos], self.line_at(start), start)
        return self._word()

    def _word(self, stop_at_space: bool = True, end: int | None = None) -> _Word:
        """Read one word from self.pos (up to `end` when given)."""
        text = self.text
        limit = len(text) if end is None else end
        start = self.pos
        parts: list[_Part] = []
        buf: list[str] = []
        buf_quoted = False

        def flush() -> None:
            nonlocal buf
            if buf:
                parts.append(_Part("lit", "".join(buf), buf_quoted))
                buf = []

        def lit(s: str, quoted: bool) -> None:
            nonlocal buf_quoted
            if buf and buf_quoted != quoted:
                flush()
            buf_quoted = quoted
            buf.append(s)

        while self.pos < limit:
            c = text[self.pos]
            if stop_at_space and (c in _SPACE or c in _OP_CHARS):
                break
            if c == "\\":
                nxt = text[self.pos + 1 : self.pos + 2]
                if nxt == "\n":
                    self.pos += 2
                    continue
                lit(nxt, True)
                self.pos += 2
            elif c == "'":
                j = text.find("'", self.pos + 1)
                if j < 0 or j >= limit:
                    raise self.fail(self.pos, "unterminated ' quote")
                lit(text[self.pos + 1 : j], True)
                self.pos = j + 1
            elif c == '"':
                open_at = self.pos
                self.pos += 1
                flush()
                before = len(parts)
                self._dquote_body(parts, limit, open_at)
                if len(parts) == before:
                    parts.append(_Part("lit", "", True))
            elif c == "$":
                flush()
                parts.append(self._dollar(quoted=False, limit=limit))
            elif c == "`":
                j = text.find("`", self.pos + 1)
                if j < 0 or j >= limit:
                    raise self.fail(self.pos, "unterminated ` command substitution")
                flush()
                parts.append(_Part("raw", text[self.pos : j + 1], False))
                self.pos = j + 1
            else:
                m = _PLAIN_RUN.match(text, self.pos, limit)
                if m and stop_at_space:
                    lit(m.group(0), False)
                    self.pos = m.end()
                else:
                    lit(c, False)
                    self.pos += 1
        flush()
        return _Word(parts, text[start : self.pos], self.line_at(start), start)

    def _dquote_body(self, parts: list[_Part], limit: int, open_at: int) -> None:
        text = self.text
        buf: list[str] = []

        def flush() -> None:
            if buf:
                parts.append(_Part("lit", "".join(buf), True))
                buf.clear()

        while self.pos < limit:
            c = text[self.pos]
            if c == '"':
                self.pos += 1
                flush()
                return
            if c == "\\":
                nxt = text[self.pos + 1 : self.pos + 2]
                if nxt in ('"', "\\", "$", "`"):
                    buf.append(nxt)
                    self.pos += 2
                elif nxt == "\n":
                    self.pos += 2
                else:
                    buf.append("\\")
                    self.pos += 1
            elif c == "$":
                flush()
                parts.append(self._dollar(quoted=True, limit=limit))
            elif c == "`":
                j = text.find("`", self.pos + 1)
                if j < 0:
                    raise self.fail(self.pos, "unterminated ` command substitution")
                flush()
                parts.append(_Part("raw", text[self.pos : j + 1], True))
                self.pos = j + 1
            else:
                m = _DQ_PLAIN_RUN.match(text, self.pos, limit)
                buf.append(m.group(0))
                self.pos = m.end()
        raise self.fail(open_at, 'unterminated " quote')

    def _dollar(self, quoted: bool, limit: int) -> _Part:
        text, start = self.text, self.pos
        nxt = text[self.pos + 1 : self.pos + 2]
        if text.startswith("$((", self.pos):
            close = self._match_close(self.pos + 3, "(", ")")
            if close >= 0 and text.startswith(")", close + 1):
                self.pos = close + 2
                return _Part("arith", text[start + 3 : close], quoted)
        if nxt == "(":
            close = self._match_close(self.pos + 2, "(", ")")
            if close < 0:
                raise self.fail(start, "unbalanced $( ... ): no matching )")
            self.pos = close + 1
            return _Part("raw", text[start : self.pos], quoted)
        if nxt == "{":
            close = self._match_close(self.pos + 2, "{", "}")
            if close < 0:
                raise self.fail(start, "unbalanced ${ ... }: no matching }")
            self.pos = close + 1
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise self.fail(start, f"${{...}} expansions nested more than {MAX_NESTING} deep")
            try:
                return self._brace(text[start + 2 : close], text[start : self.pos], start + 2, quoted)
            finally:
                self.depth -= 1
        m = _NAME_RE.match(text, self.pos + 1)
        if m:
            self.pos = m.end()
            return _Part("var", m.group(0), quoted)
        if nxt and (nxt.isdigit() or nxt in "@*#?$!-"):
            self.pos += 2
            return _Part("var", nxt, quoted)
        self.pos += 1
        return _Part("lit", "$", quoted)

    def _sub_word(self, begin: int, end: int) -> _Word:
        saved = self.pos
        self.pos = begin
        try:
            return self._word(stop_at_space=False, end=end)
        finally:
            self.pos = saved

    def _brace(self, inner: str, raw: str, inner_pos: int, quoted: bool) -> _Part:
        m = re.fullmatch(r"([A-Za-z_][A-Za-z_0-9]*)\[([@*])\]", inner)
        if m:
            return _Part("arr", m.group(1), quoted, op=m.group(2))
        m = re.fullmatch(r"#([A-Za-z_][A-Za-z_0-9]*)\[[@*]\]", inner)
        if m:
            return _Part("alen", m.group(1), quoted)
        m = re.fullmatch(r"([A-Za-z_][A-Za-z_0-9]*)\[([^\]]+)\]", inner)
        if m:
            return _Part("idx", m.group(1), quoted, arg=self._sub_word(inner_pos + m.start(2), inner_pos + m.end(2)))
        m = re.fullmatch(r"#([A-Za-z_][A-Za-z_0-9]*|[@*])", inner)
        if m:
            return _Part("len", m.group(1), quoted)
        if re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*|\d+|[@*#?$!]", inner):
            return _Part("var", inner, quoted)
        m = re.match(r"([A-Za-z_][A-Za-z_0-9]*|\d+|[@*])(:?[-=+?]|##?|%%?|//?|\^\^?|,,?|:)", inner)
        if m:
            op = m.group(2)
            arg_start = inner_pos + m.end()
            arg_end = inner_pos + len(inner)
            if op in ("/", "//"):
                slash = _find_unescaped(inner, "/", m.end())
                if slash >= 0:
                    return _Part("var", m.group(1), quoted, op=op,
                                 arg=self._sub_word(arg_start, inner_pos + slash),
                                 arg2=self._sub_word(inner_pos + slash + 1, arg_end))
            if op == ":":
                colon = _find_unescaped(inner, ":", m.end())
                if colon >= 0:
                    return _Part("var", m.group(1), quoted, op=op, arg=self._sub_word(arg_start, inner_pos + colon),
                                 arg2=self._sub_word(inner_pos + colon + 1, arg_end))
            return _Part("var", m.group(1), quoted, op=op, arg=self._sub_word(arg_start, arg_end))
        return _Part("raw", raw, quoted)


def _find_unescaped(text: str, ch: str, start: int) -> int:
    i = start
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == ch:
            return i
        i += 1
    return -1


# --------------------------------------------------------------------------------------------
# Parser: tokens -> a small syntax tree
# --------------------------------------------------------------------------------------------
@dataclass
class _Simple:
    assigns: list[_Word | _ArrayAssign]
    words: list[_Word]
    line: int
    pos: int
    src: int  # which text: 0 = the script itself


@dataclass
class _If:
    arms: list[tuple[list, list]]  # (condition list, body list)
    orelse: list | None
    line: int
    end_line: int
    src: int


@dataclass
class _Loop:
    kind: str  # while | until | for | cfor
    cond: list | None
    var: str | None
    items: list[_Word] | None
    body: list
    line: int
    end_line: int
    arith: tuple[str, str, str] | None = None


@dataclass
class _Case:
    word: _Word
    arms: list[tuple[list[_Word], list]]
    line: int


@dataclass
class _Group:
    body: list
    subshell: bool
    line: int


@dataclass
class _Func:
    name: str
    body: list
    line: int


@dataclass
class _AndOr:
    first: object
    rest: list[tuple[str, object]]  # ("&&"|"||", pipeline)
    line: int


@dataclass
class _Pipe:
    cmds: list
    negate: bool
    line: int


@dataclass
class _Arith:
    expr: str
    line: int


@dataclass
class _Cond:  # [[ ... ]]
    words: list[_Word | _Op]
    line: int
    raw: str


class _Parser:
    def __init__(self, tokens: list[_Token], path: str | None, src: int, text: str):
        self.toks = tokens
        self.i = 0
        self.path = path
        self.src = src
        self.text = text

    def fail(self, line: int, message: str) -> PlannerInputError:
        return PlannerInputError(_where(self.path, line), message)

    def peek(self) -> _Token | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def _is_word(self, tok: _Token | None, *values: str) -> bool:
        return isinstance(tok, _Word) and tok.raw in values

    def _is_op(self, tok: _Token | None, *values: str) -> bool:
        return isinstance(tok, _Op) and tok.text in values

    def skip_newlines(self) -> None:
        while self._is_op(self.peek(), "\n", ";"):
            self.i += 1

    def program(self) -> list:
        body = self.compound_list(())
        if self.peek() is not None:
            tok = self.peek()
            text = tok.raw if isinstance(tok, _Word) else getattr(tok, "text", "?")
            raise self.fail(tok.line, f"syntax error near unexpected token `{text}`")
        return body

    def compound_list(self, stops: tuple[str, ...]) -> list:
        out: list = []
        while True:
            self.skip_newlines()
            tok = self.peek()
            if tok is None:
                return out
            if isinstance(tok, _Word) and tok.raw in stops:
                return out
            if self._is_op(tok, ")", ";;", ";&", ";;&"):
                return out
            if self._is_word(tok, *_RESERVED_END) and tok.raw not in stops:
                raise self.fail(tok.line, f"syntax error near unexpected token `{tok.raw}`")
            out.append(self.and_or())
            if self._is_op(self.peek(), "&"):
                self.i += 1

    def and_or(self):
        first = self.pipeline()
        rest = []
        while self._is_op(self.peek(), "&&", "||"):
            op = self.peek().text
            self.i += 1
            while self._is_op(self.peek(), "\n"):
                self.i += 1
            rest.append((op, self.pipeline()))
        return _AndOr(first, rest, getattr(first, "line", 0)) if rest else first

    def pipeline(self):
        negate = False
        tok = self.peek()
        line = getattr(tok, "line", 0)
        if self._is_word(tok, "!"):
            negate = True
            self.i += 1
        cmds = [self.command()]
        while self._is_op(self.peek(), "|", "|&"):
            self.i += 1
            while self._is_op(self.peek(), "\n"):
                self.i += 1
            cmds.append(self.command())
        if len(cmds) == 1 and not negate:
            return cmds[0]
        return _Pipe(cmds, negate, line)

    def _expect_word(self, value: str, opened: int) -> _Word:
        self.skip_newlines()
        tok = self.peek()
        if not self._is_word(tok, value):
            raise self.fail(opened, f"syntax error: expected `{value}` for the block opened on this line")
        self.i += 1
        return tok

    def _redirects(self) -> None:
        while True:
            tok = self.peek()
            if isinstance(tok, _Op) and tok.text.lstrip("0123456789")[:1] in "<>&" and tok.text not in ("&", "&&"):
                self.i += 1
                if isinstance(self.peek(), _Word):
                    self.i += 1
                continue
            return

    def command(self):
        tok = self.peek()
        if tok is None:
            raise self.fail(self.toks[-1].line if self.toks else 1, "syntax error: unexpected end of script")
        if isinstance(tok, _ArithCmd):
            self.i += 1
            self._redirects()
            return _Arith(tok.expr, tok.line)
        if isinstance(tok, _Word):
            w = tok.raw
            if w == "if":
                return self._if()
            if w in ("while", "until"):
                self.i += 1
                cond = self.compound_list(("do",))
                self._expect_word("do", tok.line)
                body = self.compound_list(("done",))
                end = self._expect_word("done", tok.line)
                self._redirects()
                return _Loop(w, cond, None, None, body, tok.line, end.line)
            if w == "for":
                return self._for()
            if w == "case":
                return self._case()
            if w == "{":
                self.i += 1
                body = self.compound_list(("}",))
                self._expect_word("}", tok.line)
                self._redirects()
                return _Group(body, False, tok.line)
            if w == "[[":
                return self._cond()
            if w == "function":
                self.i += 1
                name = self.peek()
                if not isinstance(name, _Word):
                    raise self.fail(tok.line, "syntax error: `function` needs a name")
                self.i += 1
                if self._is_op(self.peek(), "(") and self._is_op(self.toks[self.i + 1] if self.i + 1 < len(self.toks) else None, ")"):
                    self.i += 2
                self.skip_newlines()
                return _Func(name.raw, [self.command()], tok.line)
            nxt = self.toks[self.i + 1] if self.i + 1 < len(self.toks) else None
            nxt2 = self.toks[self.i + 2] if self.i + 2 < len(self.toks) else None
            if _NAME_RE.fullmatch(w.replace("-", "_").replace(".", "_") or "-") and self._is_op(nxt, "(") and self._is_op(nxt2, ")"):
                self.i += 3
                self.skip_newlines()
                return _Func(w, [self.command()], tok.line)
        if self._is_op(tok, "("):
            self.i += 1
            body = self.compound_list(())
            if not self._is_op(self.peek(), ")"):
                raise self.fail(tok.line, "syntax error: ( is not closed with )")
            self.i += 1
            self._redirects()
            return _Group(body, True, tok.line)
        return self._simple()

    def _simple(self) -> _Simple:
        assigns: list = []
        words: list[_Word] = []
        first = self.peek()
        line = getattr(first, "line", 0)
        pos = getattr(first, "pos", 0)
        while True:
            tok = self.peek()
            if tok is None:
                break
            if isinstance(tok, _Op):
                if tok.text in ("\n", ";", "&", "&&", "||", "|", "|&", ")", ";;", ";&", ";;&", "("):
                    break
                self.i += 1  # a redirection: its target word follows
                if isinstance(self.peek(), _Word):
                    self.i += 1
                continue
            if isinstance(tok, _ArithCmd):
                break
            if not words and (isinstance(tok, _ArrayAssign) or _ASSIGN_RE.match(tok.raw)):
                assigns.append(tok)
                self.i += 1
                continue
            if isinstance(tok, _ArrayAssign):  # `declare -a A=(...)`
                words.append(tok)  # type: ignore[arg-type]
                self.i += 1
                continue
            if not words and not assigns and tok.raw in _RESERVED_END:
                break
            words.append(tok)
            self.i += 1
        if not assigns and not words:
            tok = self.peek()
            text = tok.raw if isinstance(tok, _Word) else getattr(tok, "text", "end of script")
            raise self.fail(line or getattr(tok, "line", 1), f"syntax error near unexpected token `{text.strip() or 'newline'}`")
        return _Simple(assigns, words, line, pos, self.src)

    def _if(self) -> _If:
        start = self.peek()
        self.i += 1
        arms = []
        cond = self.compound_list(("then",))
        self._expect_word("then", start.line)
        body = self.compound_list(("elif", "else", "fi"))
        arms.append((cond, body))
        orelse = None
        while True:
            self.skip_newlines()
            tok = self.peek()
            if self._is_word(tok, "elif"):
                self.i += 1
                cond = self.compound_list(("then",))
                self._expect_word("then", tok.line)
                arms.append((cond, self.compound_list(("elif", "else", "fi"))))
                continue
            if self._is_word(tok, "else"):
                self.i += 1
                orelse = self.compound_list(("fi",))
            end = self._expect_word("fi", start.line)
            self._redirects()
            return _If(arms, orelse, start.line, end.line, self.src)

    def _for(self) -> _Loop:
        start = self.peek()
        self.i += 1
        tok = self.peek()
        if isinstance(tok, _ArithCmd):
            self.i += 1
            pieces = tok.expr.split(";")
            if len(pieces) != 3:
                raise self.fail(start.line, "syntax error: for (( init; condition; step ))")
            self.skip_newlines()
            self._expect_word("do", start.line)
            body = self.compound_list(("done",))
            end = self._expect_word("done", start.line)
            return _Loop("cfor", None, None, None, body, start.line, end.line, arith=tuple(pieces))  # type: ignore[arg-type]
        if not isinstance(tok, _Word) or not _NAME_RE.fullmatch(tok.raw):
            raise self.fail(start.line, "syntax error: `for` needs a variable name")
        var = tok.raw
        self.i += 1
        items: list[_Word] | None = None
        while self._is_op(self.peek(), "\n"):
            self.i += 1
        if self._is_word(self.peek(), "in"):
            self.i += 1
            items = []
            while isinstance(self.peek(), _Word) and not self._is_word(self.peek(), "do"):
                items.append(self.peek())
                self.i += 1
        self.skip_newlines()
        self._expect_word("do", start.line)
        body = self.compound_list(("done",))
        end = self._expect_word("done", start.line)
        self._redirects()
        return _Loop("for", None, var, items, body, start.line, end.line)

    def _case(self) -> _Case:
        start = self.peek()
        self.i += 1
        word = self.peek()
        if not isinstance(word, _Word):
            raise self.fail(start.line, "syntax error: `case` needs a word")
        self.i += 1
        while self._is_op(self.peek(), "\n"):
            self.i += 1
        if not self._is_word(self.peek(), "in"):
            raise self.fail(start.line, "syntax error: expected `in` after case WORD")
        self.i += 1
        arms = []
        while True:
            self.skip_newlines()
            tok = self.peek()
            if tok is None:
                raise self.fail(start.line, "syntax error: `case` is not closed with esac")
            if self._is_word(tok, "esac"):
                self.i += 1
                self._redirects()
                return _Case(word, arms, start.line)
            if self._is_op(tok, "("):
                self.i += 1
            patterns: list[_Word] = []
            while True:
                tok = self.peek()
                if not isinstance(tok, _Word):
                    raise self.fail(start.line, "syntax error in a case pattern")
                patterns.append(tok)
                self.i += 1
                if self._is_op(self.peek(), "|"):
                    self.i += 1
                    continue
                if self._is_op(self.peek(), ")"):
                    self.i += 1
                    break
                raise self.fail(tok.line, "syntax error: a case pattern must end with )")
            body = self.compound_list(("esac",))
            arms.append((patterns, body))
            if self._is_op(self.peek(), ";;", ";&", ";;&"):
                self.i += 1

    def _cond(self) -> _Cond:
        start = self.peek()
        self.i += 1
        items: list = []
        while True:
            tok = self.peek()
            if tok is None:
                raise self.fail(start.line, "syntax error: [[ is not closed with ]]")
            self.i += 1
            if self._is_word(tok, "]]"):
                break
            if self._is_op(tok, "\n"):
                continue
            items.append(tok)
        self._redirects()
        end_pos = tok.pos + 2
        return _Cond(items, start.line, self.text[start.pos : end_pos] if self.src == 0 else "[[ ... ]]")


# --------------------------------------------------------------------------------------------
# Arithmetic: bash's 64-bit integer arithmetic, without eval
# --------------------------------------------------------------------------------------------
def _wrap64(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def _arith_value(node: ast.AST) -> int:
    if isinstance(node, ast.Expression):
        return _arith_value(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return _wrap64(node.value)
    if isinstance(node, ast.UnaryOp):
        v = _arith_value(node.operand)
        if isinstance(node.op, ast.USub):
            return _wrap64(-v)
        if isinstance(node.op, ast.UAdd):
            return v
        if isinstance(node.op, ast.Invert):
            return _wrap64(~v)
        if isinstance(node.op, ast.Not):
            return int(not v)
    if isinstance(node, ast.IfExp):
        return _arith_value(node.body) if _arith_value(node.test) else _arith_value(node.orelse)
    if isinstance(node, ast.BoolOp):
        vals = node.values
        if isinstance(node.op, ast.And):
            return int(all(_arith_value(v) for v in vals))
        return int(any(_arith_value(v) for v in vals))
    if isinstance(node, ast.Compare):
        left = _arith_value(node.left)
        for op, comp in zip(node.ops, node.comparators):
            right = _arith_value(comp)
            ok = {ast.Lt: left < right, ast.LtE: left <= right, ast.Gt: left > right, ast.GtE: left >= right,
                  ast.Eq: left == right, ast.NotEq: left != right}.get(type(op))
            if ok is None:
                raise ValueError("unsupported comparison")
            if not ok:
                return 0
            left = right
        return 1
    if isinstance(node, ast.BinOp):
        a, b = _arith_value(node.left), _arith_value(node.right)
        op = node.op
        if isinstance(op, (ast.Div, ast.FloorDiv, ast.Mod)):
            if b == 0:
                raise ValueError("division by 0")
            q = abs(a) // abs(b)
            q = q if (a >= 0) == (b >= 0) else -q  # bash truncates toward zero
            return _wrap64(q) if not isinstance(op, ast.Mod) else _wrap64(a - q * b)
        if isinstance(op, ast.Pow):
            if b < 0:
                raise ValueError("exponent less than 0")
            return _wrap64(pow(a, b, 1 << 64))
        table: dict[type, Callable[[int, int], int]] = {
            ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y, ast.Mult: lambda x, y: x * y,
            ast.BitAnd: lambda x, y: x & y, ast.BitOr: lambda x, y: x | y, ast.BitXor: lambda x, y: x ^ y,
            ast.LShift: lambda x, y: x << (y & 63), ast.RShift: lambda x, y: x >> (y & 63),
        }  # fmt: skip
        fn = table.get(type(op))
        if fn is not None:
            return _wrap64(fn(a, b))
    raise ValueError("unsupported arithmetic")


def eval_arith(expr: str) -> int:
    """Evaluate a bash arithmetic expression whose variables are already integers.  Raises
    ValueError (too long, unsupported syntax, division by zero)."""
    if len(expr) > MAX_ARITH_CHARS:
        raise ValueError(f"arithmetic longer than {MAX_ARITH_CHARS} characters")
    text = expr.strip()
    if not text:
        return 0
    if text.count("?") == 1 and text.count(":") == 1 and text.index("?") < text.index(":"):
        cond, rest = text.split("?")
        yes, no = rest.split(":")  # a ? b : c (one level, as launch scripts use it)
        text = f"(({yes}) if ({cond}) else ({no}))"
    text = re.sub(r"&&", " and ", text)
    text = re.sub(r"\|\|", " or ", text)
    text = re.sub(r"!(?!=)", " not ", text)
    if re.search(r"[^\s0-9A-Za-z_+\-*/%<>=!&|^~()]", text) or re.search(r"\b(?!and\b|or\b|not\b|if\b|else\b)[A-Za-z_]\w*", re.sub(r"\b0x[0-9a-fA-F]+", "", text)):
        raise ValueError("unsupported arithmetic")
    text = re.sub(r"\b0x[0-9a-fA-F]+\b", lambda m: str(int(m.group(0), 16)), text)
    text = re.sub(r"\b0([0-7]+)\b", lambda m: str(int(m.group(1), 8)), text)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "1a" and friends: a SyntaxWarning before the error
            tree = ast.parse(text, mode="eval")
    except (SyntaxError, RecursionError, MemoryError, ValueError):
        raise ValueError("unsupported arithmetic") from None
    try:
        return _arith_value(tree)
    except RecursionError:
        raise ValueError("arithmetic nested too deep") from None


# --------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------
@dataclass
class _Var:
    value: str | list[str]
    resolved: bool = True


class _Break(Exception):
    def __init__(self, n: int):
        self.n = n


class _Continue(Exception):
    def __init__(self, n: int):
        self.n = n


class _Return(Exception):
    def __init__(self, status: int | None):
        self.status = status


class _Exit(Exception):
    def __init__(self, status: int | None, line: int, src: int, message: str = ""):
        self.status = status
        self.line = line
        self.src = src
        self.message = message


class _Launched(Exception):
    pass


@dataclass
class _Found:
    fields: list[str]
    wrapper: list[str]
    launcher: list[str]
    launcher_args: list[str]
    entry: str
    flags: list[str]
    prefix_env: dict[str, str]
    site: LaunchSite | None
    line: int


class _Unknown(Exception):
    """A test that cannot be decided."""

    def __init__(self, reason: str):
        self.reason = reason


class _Interp:
    """Variables, positional parameters, functions and the statement evaluator."""

    def __init__(self, text: str, path: str | None, args: list[str]):
        self.text = text
        self.path = path
        self.script_dir = str(Path(path).resolve().parent) if path else None
        self.vars: dict[str, _Var] = {}
        self.positional: list[str] = list(args)
        self.functions: dict[str, list] = {}
        self.exported: list[str] = []
        self.unresolved: list[str] = []
        self.misses = 0
        self.assumed: set[str] = set()  # env variables a condition read as unset
        self.test_mode = False
        self.steps = 0
        self.depth = 0
        self.sources: list[tuple[str | None, str]] = [(path, text)]  # src id -> (path, text)
        self.site: _Simple | None = None
        self.via: list[str] = []  # eval / string / source nesting of the statement being run
        self.site_depth = 0  # len(self.via) when `site` was set
        self.last_unknown = "cannot be decided from the script"
        self.cur = (1, 0)  # (line, source) of the statement being run
        self.decisions: list[BranchDecision] = []
        self.warnings: list[str] = []
        self.found: _Found | None = None
        self.skipped_launches: list[str] = []
        self.outer_wrapper: list[str] = []  # srun/mpirun words around a `bash -c` string
        self.self_relative = False  # the script locates files from its own directory ($0, BASH_SOURCE)
        self.sourced: list[Path] = []  # files it sourced
        # names the script assigns somewhere: unset at a given point, they are empty (as in bash);
        # names it never assigns come from the environment and stay literal in flag values
        self.assigned: set[str] = set(_ASSIGNED_NAME.findall(text))

    # -- errors / bookkeeping ------------------------------------------------------------------
    def where(self, line: int, src: int = 0) -> str:
        return _where(self.sources[src][0] if src < len(self.sources) else self.path, line)

    def step(self, line: int, src: int) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise PlannerInputError(
                self.where(line, src),
                f"the script runs more than {MAX_STEPS} statements before it launches training "
                "(a loop that never ends?)",
            )

    def _note(self, raw: str) -> str:
        self.misses += 1
        if not self.test_mode and raw not in self.unresolved:
            self.unresolved.append(raw)
        return raw

    # -- variables ------------------------------------------------------------------------------
    def scalar(self, name: str) -> tuple[str | None, bool]:
        """(value, resolved) of a variable or special parameter; None when unset."""
        if name.isdigit():
            k = int(name)
            if k == 0:
                return (self.path or "script.sh"), True
            if k <= len(self.positional):
                return self.positional[k - 1], True
            return None, True
        if name == "#":
            return str(len(self.positional)), True
        if name in ("@", "*"):
            return " ".join(self.positional), True
        if name == "?":
            return "0", True
        if name == "BASH_SOURCE":
            return (self.path or "script.sh"), True
        var = self.vars.get(name)
        if var is None:
            return None, True
        if isinstance(var.value, list):
            return (var.value[0] if var.value else ""), var.resolved
        return var.value, var.resolved

    def set_scalar(self, name: str, value: str, resolved: bool = True) -> None:
        self.vars[name] = _Var(value, resolved)

    # -- expansion ------------------------------------------------------------------------------
    def expand_part(self, part: _Part) -> tuple[list[str] | str, bool]:
        """One part: a string or a list (array elements / "$@"), and whether it may be
        word-split (an unquoted expansion)."""
        split = not part.quoted
        kind = part.kind
        if kind == "lit":
            return part.text, False
        if kind == "raw":
            special = self._known_substitution(part.text)
            if special is not None:
                return special, split
            if self.test_mode:
                raise _Unknown(f"depends on the output of {part.text}")
            return self._note(part.text), False
        if kind == "arith":
            try:
                return str(self.arith(part.text)), False
            except ValueError:
                if self.test_mode:
                    raise _Unknown(f"cannot evaluate $(({part.text}))") from None
                return self._note(f"$(({part.text}))"), False
        if kind == "arr":
            if part.text in ("@", "*"):
                return list(self.positional), split
            var = self.vars.get(part.text)
            if var is None:
                if self.test_mode or part.text in self.assigned:
                    if part.text not in self.assigned:
                        self.assumed.add(part.text)
                    return [], split
                return self._note("${" + part.text + "[" + part.op + "]}"), False
            values = var.value if isinstance(var.value, list) else [var.value]
            if part.op == "*" and part.quoted:
                return " ".join(values), False
            return list(values), split
        if kind == "alen":
            var = self.vars.get(part.text)
            values = [] if var is None else (var.value if isinstance(var.value, list) else [var.value])
            return str(len(values)), False
        if kind == "idx":
            var = self.vars.get(part.text)
            index_text, _ = self.expand_text(part.arg)
            if var is None:
                return self._note("${" + part.text + "[" + index_text + "]}"), False
            values = var.value if isinstance(var.value, list) else [var.value]
            try:
                i = self.arith(index_text)
            except ValueError:
                return self._note("${" + part.text + "[" + index_text + "]}"), False
            if i < 0:
                i += len(values)
            return (values[i] if 0 <= i < len(values) else ""), split
        if kind == "len":
            if part.text in ("@", "*", "#"):
                return str(len(self.positional)), False
            value, resolved = self.scalar(part.text)
            if value is None:
                return "0", False
            if not resolved:
                return self._note("${#" + part.text + "}"), False
            return str(len(value)), False
        return self._expand_var(part, split)

    def _known_substitution(self, raw: str) -> str | None:
        """$(dirname "$0"), $(cd "$(dirname ...)" && pwd), $(basename ...) and friends: the
        script's own directory, which is known."""
        if self.script_dir is None:
            return None
        body = raw[2:-1] if raw.startswith("$(") else raw[1:-1]
        if re.search(r"\$\{?(0|BASH_SOURCE)\b", body):
            self.self_relative = True
        if re.fullmatch(r"\s*dirname\s+[\"']?\$\{?(0|BASH_SOURCE(\[0\])?)\}?[\"']?\s*", body):
            return self.script_dir
        if re.fullmatch(r"\s*cd\s+[\"']?\$\(\s*dirname\s+[\"']?\$\{?(0|BASH_SOURCE(\[0\])?)\}?[\"']?\s*\)[\"']?\s*(&&|;)\s*pwd(\s+-P)?\s*", body):
            return self.script_dir
        if re.fullmatch(r"\s*realpath\s+[\"']?\$\(\s*dirname\s+[\"']?\$\{?(0|BASH_SOURCE(\[0\])?)\}?[\"']?\s*\)[\"']?\s*", body):
            return self.script_dir
        return None

    def _expand_var(self, part: _Part, split: bool) -> tuple[list[str] | str, bool]:
        name = part.text
        if name in ("@", "*") and not part.op:
            if part.quoted and name == "@":
                return list(self.positional), False
            return " ".join(self.positional), split
        is_name = bool(_NAME_RE.fullmatch(name))
        ref = "${" + name + "}" if is_name else "$" + name
        value, resolved = self.scalar(name)
        op = part.op
        if value is None and is_name and name not in self.assigned and self.test_mode:
            self.assumed.add(name)
        if op in (":-", "-", ":=", "=", ":+", "+", ":?", "?"):
            is_set = value is not None
            present = (is_set and value != "") if op.startswith(":") else is_set
            if op in (":+", "+"):
                if is_set and not resolved:
                    return self._note(ref), False
                return (self.expand_text(part.arg)[0] if present else ""), split
            if not present:
                if op.endswith("?"):
                    if name.isdigit() or name in self.assigned:  # bash stops the script here
                        message, _ = self.expand_text(part.arg)
                        raise _Exit(1, *self.cur, message=f"{ref}: {message or 'parameter null or not set'}")
                    return self._note(ref), False  # an environment variable: set where it runs
                arg_text, arg_ok = self.expand_text(part.arg)
                if op.endswith("=") and is_name:
                    self.vars[name] = _Var(arg_text, arg_ok)
                return arg_text, split
        if value is None:
            if self.test_mode or (is_name and name in self.assigned):
                return "", split
            return self._note(ref), False
        if not resolved:
            if self.test_mode:
                raise _Unknown(f"depends on {ref}, which holds text the planner cannot evaluate")
            self.misses += 1  # the value holds literal text (e.g. $(date)): expanded as that text
        if op and op not in (":-", "-", ":=", "=", ":+", "+", ":?", "?"):
            return self._string_op(value, part), split
        return value, split

    def _string_op(self, value: str, part: _Part) -> str:
        op = part.op
        if op in ("^^", "^"):
            return value.upper() if op == "^^" else value[:1].upper() + value[1:]
        if op in (",,", ","):
            return value.lower() if op == ",," else value[:1].lower() + value[1:]
        if op == ":":
            try:
                off = self.arith(self.expand_text(part.arg)[0])
                if part.arg2 is not None:
                    length = self.arith(self.expand_text(part.arg2)[0])
                    return value[off:][:length] if length >= 0 else value[off:length]
                return value[off:]
            except ValueError:
                return self._note("${" + part.text + ":...}")
        pattern, _ = self.expand_text(part.arg)
        regex = fnmatch.translate(pattern)[:-2]  # drop the \Z anchor  (Python's "(?s:...)\Z")
        if op in ("#", "##"):
            best = None
            for k in range(len(value) + 1):
                if re.fullmatch(regex, value[:k]):
                    best = k
                    if op == "#":
                        break
            return value[best:] if best is not None else value
        if op in ("%", "%%"):
            best = None
            for k in range(len(value), -1, -1):
                if re.fullmatch(regex, value[k:]):
                    best = k
                    if op == "%":
                        break
            return value[:best] if best is not None else value
        if op in ("/", "//"):
            rep, _ = self.expand_text(part.arg2)
            if not pattern:
                return value
            try:
                return re.sub(regex, lambda m: rep, value, count=0 if op == "//" else 1)
            except re.error:
                return value
        return value

    def arith(self, expr: str) -> int:
        """$((...)): variables replaced by their integer values (unset: 0), then evaluated."""
        if len(expr) > MAX_ARITH_CHARS:
            raise ValueError(f"arithmetic longer than {MAX_ARITH_CHARS} characters")

        def name_value(m: re.Match[str]) -> str:
            name = m.group(1) or m.group(2)
            if name.isdigit():
                value, resolved = self.scalar(name)
            else:
                value, resolved = self.scalar(name)
            if value is None:
                if name not in self.vars:
                    self.assumed.add(name)
                return "0"
            if not resolved:
                raise ValueError(f"{name} is not known")
            v = value.strip()
            if re.fullmatch(r"-?\d+", v):
                return f"({v})"
            if v == "":
                return "0"
            if len(v) < 200 and _NAME_RE.fullmatch(v):  # one level of indirection, as bash
                inner, ok = self.scalar(v)
                if inner is not None and ok and re.fullmatch(r"\s*-?\d+\s*", inner):
                    return f"({inner.strip()})"
            raise ValueError(f"{name}={value!r} is not an integer")

        text = re.sub(r"\$\{?([A-Za-z_][A-Za-z_0-9]*|\d+)\}?|\b(?<!0x)([A-Za-z_][A-Za-z_0-9]*)\b", name_value, expr)
        return eval_arith(text)

    def expand_text(self, word: _Word | None) -> tuple[str, bool]:
        """A word expanded without field splitting (as on the right of `X=`), and whether every
        part resolved."""
        if word is None:
            return "", True
        before = self.misses
        out: list[str] = []
        for part in word.parts:
            value, _ = self.expand_part(part)
            out.append(" ".join(value) if isinstance(value, list) else value)
        return "".join(out), self.misses == before

    def expand_fields(self, word: _Word) -> list[str]:
        """A command word expanded to fields (word splitting of unquoted expansions, arrays)."""
        fields: list[str] = []
        current: list[str] = []
        has_content = False

        def flush() -> None:
            nonlocal current, has_content
            if has_content:
                fields.append("".join(current))
            current, has_content = [], False

        for part in word.parts:
            value, split = self.expand_part(part)
            if part.kind == "lit" and part.quoted:
                has_content = True
            if isinstance(value, list):
                pieces: list[str] = []
                for v in value:
                    pieces.extend(v.split() if split else [v])
                for k, piece in enumerate(pieces):
                    if k > 0:
                        flush()
                    current.append(piece)
                    has_content = True
                continue
            if split and value:
                chunks = value.split()
                if not chunks:
                    continue
                if value[0].isspace():
                    flush()
                for k, chunk in enumerate(chunks):
                    if k > 0:
                        flush()
                    current.append(chunk)
                    has_content = True
                if value[-1].isspace():
                    flush()
                continue
            if value or part.quoted:
                current.append(value)
                has_content = has_content or bool(value) or part.quoted
        flush()
        return fields

    # -- assignments ----------------------------------------------------------------------------
    def assign(self, tok: _Word | _ArrayAssign) -> str:
        """`NAME=value`, `NAME+=value`, `NAME[i]=value`, `NAME=(...)`, `NAME+=(...)`; returns NAME."""
        if isinstance(tok, _ArrayAssign):
            values: list[str] = []
            for w in tok.words:
                values.extend(self.expand_fields(w))
            old = self.vars.get(tok.name)
            if tok.append and old is not None:
                if isinstance(old.value, list):
                    old.value.extend(values)  # in place: appending stays linear
                else:
                    self.vars[tok.name] = _Var([old.value, *values], old.resolved)
            else:
                self.vars[tok.name] = _Var(values)
            return tok.name
        m = _ASSIGN_RE.match(tok.raw)
        assert m is not None
        name, index, append = m.group(1), m.group(2), bool(m.group(3))
        prefix_len = m.end()
        parts = list(tok.parts)
        first = parts[0]
        value_parts = [_Part(first.kind, first.text[prefix_len:], first.quoted)] + parts[1:]
        value, resolved = self.expand_text(_Word(value_parts, tok.raw[prefix_len:], tok.line, tok.pos))
        old = self.vars.get(name)
        if index:
            try:
                i = self.arith(index[1:-1])
            except ValueError:
                return name
            arr = list(old.value) if old is not None and isinstance(old.value, list) else ([old.value] if old else [])
            while len(arr) <= i:
                arr.append("")
            arr[i] = (arr[i] + value) if append else value
            self.vars[name] = _Var(arr, resolved and (old.resolved if old else True))
            return name
        if append and old is not None:
            if isinstance(old.value, list):
                old.value.append(value)
            else:
                self.vars[name] = _Var(old.value + value, old.resolved and resolved)
        else:
            self.vars[name] = _Var(value, resolved)
        return name

    # -- statements -----------------------------------------------------------------------------
    def run_list(self, nodes: list) -> int | None:
        status: int | None = 0
        for node in nodes:
            status = self.run(node)
        return status

    def run(self, node) -> int | None:
        if isinstance(node, _Simple):
            return self.simple(node)
        if isinstance(node, _AndOr):
            return self.and_or(node)
        if isinstance(node, _Pipe):
            status = None
            for cmd in node.cmds:
                status = self.run(cmd)
            if node.negate:
                return None if status is None else int(status == 0)
            return status
        if isinstance(node, _If):
            return self.run_if(node)
        if isinstance(node, _Loop):
            return self.loop(node)
        if isinstance(node, _Case):
            return self.case(node)
        if isinstance(node, _Group):
            if node.subshell:
                saved = (dict(self.vars), list(self.positional))
                try:
                    return self.run_list(node.body)
                except _Exit as exc:
                    return exc.status
                finally:
                    if self.found is None:
                        self.vars, self.positional = saved
            return self.run_list(node.body)
        if isinstance(node, _Func):
            self.functions[node.name] = node.body
            return 0
        if isinstance(node, _Arith):
            self.step(node.line, 0)
            try:
                return 0 if self.arith_command(node.expr) != 0 else 1
            except ValueError:
                return None
        if isinstance(node, _Cond):
            return self.condition_status(lambda: self.cond_words(node.words))
        raise AssertionError(node)

    def arith_command(self, expr: str) -> int:
        """(( ... )): also the assignments i++, ++i, i--, i+=n, i=n (comma-separated)."""
        result = 0
        for piece in expr.split(","):
            piece = piece.strip()
            m = re.fullmatch(r"([A-Za-z_]\w*)\s*(\+\+|--)|(\+\+|--)\s*([A-Za-z_]\w*)", piece)
            if m:
                name = m.group(1) or m.group(4)
                old = self.arith(name)
                new = old + (1 if "+" in (m.group(2) or m.group(3)) else -1)
                self.set_scalar(name, str(new))
                result = old if m.group(1) else new
                continue
            m = re.fullmatch(r"([A-Za-z_]\w*)\s*([-+*/%]?)=(?!=)\s*(.+)", piece)
            if m:
                name, op, rhs = m.groups()
                value = self.arith(f"{name} {op} ({rhs})" if op else rhs)
                self.set_scalar(name, str(value))
                result = value
                continue
            result = self.arith(piece)
        return result

    def condition_status(self, fn: Callable[[], bool]) -> int | None:
        """Run a test in test mode: 0/1, or None when it cannot be decided."""
        saved = self.test_mode
        self.test_mode = True
        try:
            return 0 if fn() else 1
        except _Unknown as exc:
            self.last_unknown = exc.reason
            return None
        finally:
            self.test_mode = saved

    def and_or(self, node: _AndOr) -> int | None:
        status = self.run(node.first)
        for op, rhs in node.rest:
            if status is None:
                # cannot tell: the guarded command is skipped (`[ -f x ] || exit 1`, `[ -d d ] && X=...`)
                self._record_guard(node, op, rhs)
                status = 0 if op == "||" else 1
                continue
            if (op == "&&" and status == 0) or (op == "||" and status != 0):
                status = self.run(rhs)
        return status

    def _record_guard(self, node: _AndOr, op: str, rhs) -> None:
        flags = self._flags_in([rhs])
        if flags:
            self.decisions.append(
                BranchDecision(node.line, self._src_text(node.line), f"skipping the command after {op}",
                               self._unknown_reason(), flags_skipped=flags)
            )

    def _unknown_reason(self) -> str:
        return getattr(self, "last_unknown", "cannot be decided from the script")

    def _src_text(self, line: int) -> str:
        lines = self.text.splitlines()
        return lines[line - 1].strip() if 0 < line <= len(lines) else "?"

    def _flags_in(self, nodes: Iterable) -> list[str]:
        """The --flags written in a block's source (for reports)."""
        words: list[str] = []

        def visit(n) -> None:
            if isinstance(n, list):
                for x in n:
                    visit(x)
            elif isinstance(n, _Simple):
                for w in [*n.assigns, *n.words]:
                    words.append(w.raw)
            elif isinstance(n, (_If,)):
                for c, b in n.arms:
                    visit(c)
                    visit(b)
                if n.orelse:
                    visit(n.orelse)
            elif isinstance(n, _Loop):
                visit(n.body)
            elif isinstance(n, _Case):
                for _, b in n.arms:
                    visit(b)
            elif isinstance(n, (_Group, _Func)):
                visit(n.body)
            elif isinstance(n, _AndOr):
                visit(n.first)
                for _, r in n.rest:
                    visit(r)
            elif isinstance(n, _Pipe):
                visit(n.cmds)

        visit(list(nodes))
        found: list[str] = []
        for w in words:
            for m in _FLAG_TEXT.finditer(w):
                if m.group(1) not in found:
                    found.append(m.group(1))
        return found

    def _cond_status(self, cond: list) -> tuple[int | None, set[str]]:
        self.assumed = set()
        self.last_unknown = "cannot be decided from the script"
        status = self.run_list(cond)
        return status, set(self.assumed)

    def run_if(self, node: _If) -> int | None:
        for k, (cond, body) in enumerate(node.arms):
            status, assumed = self._cond_status(cond)
            others = [b for j, (_, b) in enumerate(node.arms) if j != k] + ([node.orelse] if node.orelse else [])
            cond_text = self._src_text(cond[0].line if cond and hasattr(cond[0], "line") else node.line)
            if status is None:
                skipped = self._flags_in([body])
                if skipped or self._flags_in(others):
                    self.decisions.append(BranchDecision(
                        getattr(cond[0], "line", node.line) if cond else node.line, cond_text,
                        "false: its branch was skipped", self._unknown_reason(), flags_skipped=skipped))
                continue
            if assumed and (self._flags_in([body]) or self._flags_in(others)):
                names = ", ".join(sorted(assumed))
                taken = status == 0
                reading = "true: its branch was taken" if taken else "false: its branch was skipped"
                self.decisions.append(BranchDecision(
                    getattr(cond[0], "line", node.line) if cond else node.line, cond_text, reading,
                    f"depends on {names}, which the script does not set (read as unset)",
                    flags_skipped=[] if taken else self._flags_in([body]),
                    flags_taken=self._flags_in([body]) if taken else []))
            if status == 0:
                return self.run_list(body)
        if node.orelse is not None:
            return self.run_list(node.orelse)
        return 0

    def loop(self, node: _Loop) -> int | None:
        status: int | None = 0
        if node.kind == "for" or node.kind == "cfor":
            if node.kind == "cfor":
                init, cond, stepx = node.arith  # type: ignore[misc]
                try:
                    if init.strip():
                        self.arith_command(init)
                except ValueError:
                    return None
                items = None
            else:
                items = []
                if node.items is None:
                    items = list(self.positional)
                else:
                    for w in node.items:
                        items.extend(self.expand_fields(w))
            k = 0
            while True:
                self.step(node.line, 0)
                if node.kind == "cfor":
                    try:
                        if cond.strip() and self.arith_command(cond) == 0:
                            break
                    except ValueError:
                        break
                else:
                    if k >= len(items):
                        break
                    self.set_scalar(node.var, items[k])  # type: ignore[arg-type]
                    k += 1
                status, stop = self._body(node.body)
                if stop:
                    break
                if node.kind == "cfor":
                    try:
                        if stepx.strip():
                            self.arith_command(stepx)
                    except ValueError:
                        break
            return status
        while True:
            self.step(node.line, 0)
            cond_status, assumed = self._cond_status(node.cond or [])
            if cond_status is None:
                if self._flags_in([node.body]):
                    self.decisions.append(BranchDecision(node.line, self._src_text(node.line),
                                                         "false: the loop stopped", self._unknown_reason(),
                                                         flags_skipped=self._flags_in([node.body])))
                break
            if (cond_status == 0) != (node.kind == "while"):
                break
            status, stop = self._body(node.body)
            if stop:
                break
        return status

    def _body(self, body: list) -> tuple[int | None, bool]:
        """Run a loop body once: (its status, whether `break` ended the loop)."""
        try:
            return self.run_list(body), False
        except _Break as b:
            if b.n > 1:
                raise _Break(b.n - 1) from None
            return 0, True
        except _Continue as c:
            if c.n > 1:
                raise _Continue(c.n - 1) from None
            return 0, False

    def case(self, node: _Case) -> int | None:
        self.step(node.line, 0)
        saved = self.test_mode
        self.test_mode = True  # an unset variable is empty here, as in bash
        try:
            value, ok = self.expand_text(node.word), True
            value = value[0]
        except _Unknown:
            value, ok = "", False
        finally:
            self.test_mode = saved
        for patterns, body in node.arms:
            for p in patterns:
                pat, _ = self.expand_text(p)
                if not ok:
                    if pat == "*":
                        return self.run_list(body)
                    continue
                if fnmatch.fnmatchcase(value, pat):
                    return self.run_list(body)
        if not ok:
            flags = self._flags_in([b for _, b in node.arms])
            if flags:
                self.decisions.append(BranchDecision(node.line, self._src_text(node.line), "no pattern matched",
                                                     f"the word {node.word.raw} is not known", flags_skipped=flags))
        return 0

    # -- simple commands ------------------------------------------------------------------------
    def simple(self, node: _Simple) -> int | None:
        self.step(node.line, node.src)
        self.cur = (node.line, node.src)
        if node.src == 0:
            self.site = node
            self.site_depth = len(self.via)
        if not node.words:
            for tok in node.assigns:
                self.assign(tok)
            return 0
        head = node.words[0]
        if isinstance(head, _Word) and head.raw in _DECLARE_WORDS:
            return self.declare(head.raw, node.words[1:])
        if isinstance(head, _Word) and head.raw in ("[", "test"):
            return self.condition_status(lambda: self.test_words(head.raw, node.words[1:]))
        fields: list[str] = []
        for tok in node.words:
            if isinstance(tok, _ArrayAssign):
                fields.append(tok.raw)
            else:
                fields.extend(self.expand_fields(tok))
        if not fields:
            for tok in node.assigns:
                self.assign(tok)
            return 0
        prefix_env: dict[str, str] = {}
        if node.assigns:
            saved = dict(self.vars)
            for tok in node.assigns:
                name = self.assign(tok)
                prefix_env[name] = self.scalar(name)[0] or ""
            self.vars = saved
        return self.command(fields, node, prefix_env)

    def declare(self, word: str, rest: list) -> int:
        exporting = word == "export"
        for tok in rest:
            if isinstance(tok, _Word) and tok.raw.startswith(("-", "+")) and not _ASSIGN_RE.match(tok.raw):
                exporting = exporting or "x" in tok.raw
                continue
            if isinstance(tok, _ArrayAssign) or _ASSIGN_RE.match(tok.raw):
                name = self.assign(tok)
            elif _NAME_RE.fullmatch(tok.raw):
                name = tok.raw
            else:
                continue
            if exporting and name not in self.exported:
                self.exported.append(name)
        return 0

    def command(self, fields: list[str], node: _Simple, prefix_env: dict[str, str]) -> int | None:
        name = fields[0]
        base = name.rsplit("/", 1)[-1]
        if self.found is None:
            split = _launch_split(fields)
            if split is not None and (split[0] == 0 or base in _WRAPPERS):
                start, after, entry = split
                if _TRAIN_ENTRY.search(fields[entry].rsplit("/", 1)[-1]) or after > start + 1 or fields[start].endswith("torchrun"):
                    self.found = self._found(fields, split, node, prefix_env)
                    raise _Launched()
                self.skipped_launches.append(f"{self.where(node.line, node.src)}: {fields[entry]}")
        if name in self.functions:
            return self.call(name, fields[1:], node)
        if base in ("bash", "sh") or (base in _WRAPPERS and ("bash" in fields or "sh" in fields)):
            idx = next((i for i, f in enumerate(fields) if f.rsplit("/", 1)[-1] in ("bash", "sh")), None)
            if idx is not None and "-c" in fields[idx + 1 : idx + 3]:
                c = fields.index("-c", idx)
                if c + 1 < len(fields):
                    saved_outer = self.outer_wrapper
                    self.outer_wrapper = saved_outer + fields[:idx]
                    try:
                        return self.run_string(fields[c + 1], node, "string", args=fields[c + 2 :])
                    finally:
                        if self.found is None:
                            self.outer_wrapper = saved_outer
            if idx is not None and idx + 1 < len(fields) and not fields[idx + 1].startswith("-"):
                return self.source(fields[idx + 1], fields[idx + 2 :], node, child=True)
            return None
        if name == "eval":
            return self.run_string(" ".join(fields[1:]), node, "eval")
        if name in ("source", "."):
            if len(fields) < 2:
                return 1
            return self.source(fields[1], fields[2:], node)
        if name == "shift":
            try:
                n = int(fields[1]) if len(fields) > 1 else 1
            except ValueError:
                return 1
            if n > len(self.positional):
                return 1
            self.positional = self.positional[n:]
            return 0
        if name == "set":
            if "--" in fields:
                self.positional = fields[fields.index("--") + 1 :]
            return 0
        if name == "unset":
            for f in fields[1:]:
                if not f.startswith("-"):
                    self.vars.pop(f, None)
            return 0
        if name in ("exit", "return"):
            status = int(fields[1]) if len(fields) > 1 and fields[1].lstrip("-").isdigit() else 0
            if name == "return" and self.depth > 0:
                raise _Return(status)
            raise _Exit(status, node.line, node.src)
        if name in ("break", "continue"):
            n = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 1
            raise (_Break(n) if name == "break" else _Continue(n))
        if name in ("true", ":"):
            return 0
        if name == "false":
            return 1
        if name == "getopts":
            return self.getopts(fields[1:])
        if name in _ALWAYS_OK:
            return 0
        if name == "read":
            return None
        self.last_unknown = f"depends on the exit status of `{name}`"
        return None

    def getopts(self, words: list[str]) -> int:
        """`getopts OPTSTRING NAME [ARG...]`, one option per word (`-n 4`, `-n4`), with OPTIND."""
        if len(words) < 2:
            return 2
        spec, var, args = words[0], words[1], words[2:] or list(self.positional)
        index = int(self.scalar("OPTIND")[0] or "1") if (self.scalar("OPTIND")[0] or "1").isdigit() else 1
        if index > len(args) or not args[index - 1].startswith("-") or args[index - 1] in ("-", "--"):
            if index <= len(args) and args[index - 1] == "--":
                self.set_scalar("OPTIND", str(index + 1))
            self.set_scalar(var, "?")
            return 1
        word = args[index - 1]
        opt = word[1]
        at = spec.find(opt)
        if at < 0 or opt == ":":
            self.set_scalar(var, "?")
            self.set_scalar("OPTIND", str(index + 1))
            return 0
        self.set_scalar(var, opt)
        if spec[at + 1 : at + 2] == ":":
            if len(word) > 2:
                self.set_scalar("OPTARG", word[2:])
                index += 1
            elif index < len(args):
                self.set_scalar("OPTARG", args[index])
                index += 2
            else:
                self.set_scalar(var, "?")
                index += 1
        else:
            index += 1
        self.set_scalar("OPTIND", str(index))
        return 0

    def call(self, name: str, args: list[str], node: _Simple) -> int | None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise PlannerInputError(self.where(node.line, node.src), f"function calls nested more than {MAX_DEPTH} deep")
        saved = self.positional
        self.positional = list(args)
        try:
            return self.run_list(self.functions[name])
        except _Return as r:
            return r.status
        finally:
            self.positional = saved
            self.depth -= 1

    def run_string(self, text: str, node: _Simple, via: str, args: list[str] | None = None) -> int | None:
        """eval / bash -c: parse and run a string in the current shell (bash -c: a copy)."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise PlannerInputError(self.where(node.line, node.src), f"eval / bash -c nested more than {MAX_DEPTH} deep")
        src = len(self.sources)
        self.sources.append((self.sources[node.src][0] if node.src < len(self.sources) else self.path, text))
        try:
            body = _parse(text, self.sources[node.src][0], src, line_offset=node.line - 1, whole_line=True)
        except PlannerInputError as exc:
            self.depth -= 1
            raise PlannerInputError(exc.field, f"in the string given to {via}: {str(exc).split(': ', 1)[-1]}") from None
        saved = (dict(self.vars), list(self.positional)) if via == "string" else None
        if via == "string" and args is not None:
            self.positional = list(args[1:]) if args else []
        self.via.append(via)
        try:
            return self.run_list(body)
        except _Exit as exc:
            if via == "string":
                return exc.status
            raise
        finally:
            self.via.pop()
            self.depth -= 1
            if saved is not None and self.found is None:
                self.vars, self.positional = saved

    def source(self, target: str, args: list[str], node: _Simple, child: bool = False) -> int | None:
        """source FILE (relative to the script's directory, then the current one)."""
        candidates = [Path(target)]
        if self.script_dir and not Path(target).is_absolute():
            candidates.insert(0, Path(self.script_dir) / target)
        path = next((p for p in candidates if p.is_file()), None)
        if path is None:
            if not child:
                self.warnings.append(f"{self.where(node.line, node.src)}: `source {target}`: file not found here; skipped")
            return None
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise PlannerInputError(self.where(node.line, node.src), f"source nested more than {MAX_DEPTH} deep")
        try:
            try:
                if path.stat().st_size > MAX_SCRIPT_BYTES:
                    raise PlannerInputError(str(path), f"larger than {MAX_SCRIPT_BYTES >> 20} MiB")
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise PlannerInputError(str(path), f"cannot read: {exc}") from None
            src = len(self.sources)
            self.sources.append((str(path), text))
            self.sourced.append(path)
            body = _parse(text, str(path), src)
            saved_pos = self.positional
            saved_vars = dict(self.vars) if child else None
            if args or child:
                self.positional = list(args)
            self.via.append("source")
            try:
                return self.run_list(body)
            except _Return as r:
                return r.status
            except _Exit as exc:
                if child:
                    return exc.status
                raise
            finally:
                self.via.pop()
                if self.found is None:
                    self.positional = saved_pos
                    if saved_vars is not None:
                        self.vars = saved_vars
        finally:
            self.depth -= 1

    # -- tests ----------------------------------------------------------------------------------
    def test_words(self, name: str, words: list[_Word]) -> bool:
        """`[ ... ]` / `test ...`: words expanded as bash does (unset variables are empty)."""
        args = [f for w in words for f in self.expand_fields(w)]
        if name == "[":
            if not args or args[-1] != "]":
                raise _Unknown("`[` without a closing `]`")
            args = args[:-1]
        return _TestEval(args, self, double=False).run()

    def cond_words(self, items: list) -> bool:
        """`[[ ... ]]`: expanded without word splitting; && || ( ) ! inside."""
        args: list[str] = []
        for tok in items:
            if isinstance(tok, _Op):
                args.append(tok.text)
            else:
                text, _ = self.expand_text(tok)
                if tok.raw in ("!", "(", ")", "&&", "||") and all(p.kind == "lit" and not p.quoted for p in tok.parts):
                    args.append(tok.raw)
                else:
                    args.append(_Quoted(text) if any(p.quoted for p in tok.parts) else text)
        return _TestEval(args, self, double=True).run()

    def _found(self, fields: list[str], split: tuple[int, int, int], node: _Simple, prefix_env: dict[str, str]) -> _Found:
        start, after, entry = split
        site = None
        if self.site is not None:
            site_node = self.site
            via = self.via[self.site_depth] if len(self.via) > self.site_depth else "direct"
            if via == "direct" and site_node is not node:
                via = "function"  # e.g. a function from a sourced file: the launcher is reached inside it
            words = site_node.words
            w = words[0] if words else None
            if w is not None:
                site = LaunchSite(line=site_node.line, offset=w.pos, word=w.raw, via=via)
        return _Found(fields, self.outer_wrapper + fields[:start], fields[start:after], fields[after:entry], fields[entry],
                      fields[entry + 1 :], prefix_env, site, node.line)


class _Quoted(str):
    """A [[ ]] operand that was quoted: matched literally, not as a pattern."""


_UNARY_FILE = {"-e", "-f", "-d", "-r", "-w", "-x", "-s", "-L", "-h", "-p", "-S", "-b", "-c", "-g", "-u", "-k", "-O", "-G", "-N"}
_BINARY = {"=", "==", "!=", "-eq", "-ne", "-lt", "-le", "-gt", "-ge", "=~", "<", ">", "-nt", "-ot", "-ef"}


class _TestEval:
    """test / [ ] / [[ ]] expressions; raises _Unknown when a part cannot be decided."""

    def __init__(self, args: list[str], interp: _Interp, double: bool):
        self.args = args
        self.i = 0
        self.interp = interp
        self.double = double

    def run(self) -> bool:
        if not self.args:
            return False
        value = self.expr_or()
        if self.i < len(self.args):
            raise _Unknown(f"cannot read the test near `{self.args[self.i]}`")
        return value

    def peek(self) -> str | None:
        return self.args[self.i] if self.i < len(self.args) else None

    def expr_or(self) -> bool:
        left = self.expr_and()
        while self.peek() in (("||",) if self.double else ("-o",)):
            self.i += 1
            right_unknown = None
            try:
                right = self.expr_and()
            except _Unknown as exc:
                right, right_unknown = None, exc
            if left:
                continue
            if right_unknown is not None:
                raise right_unknown
            left = bool(right)
        return left

    def expr_and(self) -> bool:
        left = self.expr_not()
        while self.peek() in (("&&",) if self.double else ("-a",)):
            self.i += 1
            try:
                right = self.expr_not()
            except _Unknown:
                if not left:
                    continue
                raise
            left = left and right
        return left

    def expr_not(self) -> bool:
        if self.peek() == "!" and self.i + 1 < len(self.args):
            self.i += 1
            return not self.expr_not()
        return self.primary()

    def primary(self) -> bool:
        tok = self.peek()
        if tok is None:
            raise _Unknown("an incomplete test")
        if tok == "(" and not isinstance(tok, _Quoted):
            self.i += 1
            value = self.expr_or()
            if self.peek() != ")":
                raise _Unknown("unbalanced ( in a test")
            self.i += 1
            return value
        nxt = self.args[self.i + 1] if self.i + 1 < len(self.args) else None
        if nxt in _BINARY and not isinstance(nxt, _Quoted) and self.i + 2 < len(self.args):
            a, b = tok, self.args[self.i + 2]
            self.i += 3
            return self.binary(a, nxt, b)
        if tok in ("-z", "-n") and nxt is not None:
            self.i += 2
            return (nxt == "") if tok == "-z" else (nxt != "")
        if tok in _UNARY_FILE and nxt is not None:
            self.i += 2
            raise _Unknown(f"tests a file on the machine that runs the script ({tok} {nxt})")
        if tok == "-v" and nxt is not None:
            self.i += 2
            return nxt in self.interp.vars
        self.i += 1
        return tok != ""

    def binary(self, a: str, op: str, b: str) -> bool:
        if op in ("=", "=="):
            if self.double and not isinstance(b, _Quoted):
                return fnmatch.fnmatchcase(a, b)
            return a == b
        if op == "!=":
            if self.double and not isinstance(b, _Quoted):
                return not fnmatch.fnmatchcase(a, b)
            return a != b
        if op == "=~":
            try:
                return re.search(b, a) is not None
            except re.error:
                raise _Unknown(f"cannot read the regular expression {b!r}") from None
        if op in ("<", ">"):
            return a < b if op == "<" else a > b
        if op in ("-nt", "-ot", "-ef"):
            raise _Unknown("compares files on the machine that runs the script")
        try:
            x, y = (self.interp.arith(a) if self.double else int(a.strip())), (self.interp.arith(b) if self.double else int(b.strip()))
        except ValueError:
            raise _Unknown(f"compares {a!r} and {b!r} as integers") from None
        return {"-eq": x == y, "-ne": x != y, "-lt": x < y, "-le": x <= y, "-gt": x > y, "-ge": x >= y}[op]


# --------------------------------------------------------------------------------------------
# Launch detection
# --------------------------------------------------------------------------------------------
def _launch_split(fields: list[str]) -> tuple[int, int, int] | None:
    """(launcher start, launcher end, entry index) when the fields run a Python entry script."""
    for i, f in enumerate(fields):
        base = f.rsplit("/", 1)[-1]
        if base == "torchrun":
            start, after = i, i + 1
        elif re.fullmatch(r"python[0-9.]*", base):
            start = i
            if fields[i + 1 : i + 2] == ["-m"] and i + 2 < len(fields):
                if fields[i + 2] not in _TORCH_LAUNCH_MODULES:
                    return None
                after = i + 3
            else:
                after = i + 1
                while after < len(fields) and fields[after] in ("-u", "-O", "-B", "-W", "-X"):
                    after += 1
        else:
            continue
        for j in range(after, len(fields)):
            if fields[j].endswith(".py") and not fields[j].startswith("-"):
                return start, after, j
        return None
    return None


def _parse(text: str, path: str | None, src: int, line_offset: int = 0, whole_line: bool = False) -> list:
    lexer = _Lexer(text, path, line_offset)
    tokens = lexer.tokens()
    return _Parser(tokens, path, src, text).program()


# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------
def parse_launcher_script(
    text: str, *, args: Iterable[str] | None = None, path: str | Path | None = None
) -> LauncherScript:
    """Evaluate a bash launcher script with the given arguments; see the module docstring.

    Raises PlannerInputError naming the script file and line for a syntax error, a hostile
    construct, or a script that exits before it launches; naming --megatron-script when no
    statement runs a Python entry script."""
    path_text = str(path) if path is not None else None
    given = list(args) if args is not None else []
    if len(text) > MAX_SCRIPT_BYTES:
        raise PlannerInputError(path_text or FIELD, f"larger than {MAX_SCRIPT_BYTES >> 20} MiB")
    body = _parse(text, path_text, 0)
    interp = _Interp(text, path_text, given)
    try:
        interp.run_list(body)
    except _Launched:
        pass
    except _Exit as exc:
        if interp.found is None:
            where = interp.where(exc.line, exc.src)
            hint = "" if given else "; pass the script's own arguments after `--`"
            why = f" ({exc.message})" if exc.message else ""
            raise PlannerInputError(
                where, f"the script exits here (status {exc.status}){why} before it runs a launch command{hint}"
            ) from None
    except (_Break, _Continue, _Return):
        pass
    found = interp.found
    if found is None:
        extra = f" (not a training entry: {', '.join(interp.skipped_launches)})" if interp.skipped_launches else ""
        raise PlannerInputError(
            FIELD,
            f"{path_text or 'the script'}: no command runs a Python training entry script (expected "
            "`torchrun [args] pretrain_gpt.py <flags>`, `python -m torch.distributed.run [args] <script>.py "
            f"<flags>` or `python <train>.py <flags>`, possibly behind srun/mpirun, eval or bash -c){extra}",
        )
    warnings = list(interp.warnings)
    for d in interp.decisions:
        warnings.append(d.message(path_text))
    if interp.unresolved:
        warnings.append(
            "kept as literal text (bash expands them when the launcher runs): " + ", ".join(interp.unresolved)
        )
    sourced: dict[str, str] = {}
    if interp.script_dir is not None:
        base = Path(interp.script_dir)
        for f in interp.sourced:
            try:
                rel = f.resolve().relative_to(base)
            except ValueError:
                continue  # outside the script's directory: it is the cluster's (e.g. set_env.sh)
            sourced[str(rel)] = f.read_text(encoding="utf-8")
    return LauncherScript(
        sourced=sourced,
        self_relative=interp.self_relative,
        text=text,
        megatron_flags=found.flags,
        entry_script=found.entry,
        launcher=found.launcher,
        launcher_args=found.launcher_args,
        wrapper=found.wrapper,
        path=path_text,
        args=given,
        env={n: v.value for n, v in interp.vars.items() if isinstance(v.value, str)},
        arrays={n: list(v.value) for n, v in interp.vars.items() if isinstance(v.value, list)},
        exported=list(interp.exported),
        launch_env=found.prefix_env,
        site=found.site,
        decisions=list(interp.decisions),
        unresolved=list(interp.unresolved),
        warnings=warnings,
    )


def read_launcher_script(path: str | Path, args: Iterable[str] | None = None) -> LauncherScript:
    """Read and evaluate a launcher script file; a missing or unreadable file names --megatron-script."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_SCRIPT_BYTES:
            raise PlannerInputError(FIELD, f"{p}: larger than {MAX_SCRIPT_BYTES >> 20} MiB")
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PlannerInputError(FIELD, f"file not found: {p}") from None
    except IsADirectoryError:
        raise PlannerInputError(FIELD, f"{p} is a directory, not a script") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PlannerInputError(FIELD, f"cannot read {p}: {exc}") from None
    return parse_launcher_script(text, args=args, path=str(p))
