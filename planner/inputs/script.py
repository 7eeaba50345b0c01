"""Read a bash launcher script written the way Megatron-LM's example scripts are.

`parse_launcher_script(text)` finds the `torchrun ... pretrain_gpt.py <flags>` (or
`python -m torch.distributed.run ...`, or `python train.py ...`) command and returns the flags
passed to the entry script with bash variables, `${X:-default}` forms, arrays (`ARR=( ... )`,
`ARR+=( ... )`, `"${ARR[@]}"`), quoting, comments and line continuations resolved.

What it cannot resolve (`$(cmd)`, back-ticks, positional parameters such as `$1`, variables the
script never sets) stays as literal text (`$(cmd)`, `$1`, `${NAME}`), never a crash; those texts
are listed in `LauncherScript.unresolved` so the emitted launcher can let bash expand them at
run time.  Statements inside `if/for/while/case` blocks are not evaluated (the planner cannot know
their conditions); they are recorded in `conditional_blocks` and reported in `warnings`.

This is a small interpreter for the subset of bash such scripts use, not a bash implementation.
"""

from __future__ import annotations

import ast
import bisect
import operator
import re
from dataclasses import dataclass, field
from pathlib import Path

from planner.errors import PlannerInputError

FIELD = "--megatron-script"

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_ASSIGN_RE = re.compile(r"^([A-Za-z_][A-Za-z_0-9]*)(\+?)=")
_OP_CHARS = set(";&|()<>")
_DECLARE_WORDS = {"export", "declare", "typeset", "local", "readonly"}
_OPEN_WORDS = {"if", "for", "while", "until", "case", "select"}
_CLOSE_WORDS = {"fi", "done", "esac"}
_TORCH_LAUNCH_MODULES = {"torch.distributed.run", "torch.distributed.launch"}


# --------------------------------------------------------------------------------------------
# Result
# --------------------------------------------------------------------------------------------
@dataclass
class ConditionalBlock:
    """An if/for/while/case block (1-based inclusive line range) and the arrays it modifies."""

    start_line: int
    end_line: int
    arrays: list[str] = field(default_factory=list)


@dataclass
class LauncherScript:
    """What the planner keeps from a launcher script."""

    text: str
    megatron_flags: list[str]
    entry_script: str
    launcher: list[str]
    launcher_args: list[str]
    env: dict[str, str]
    exported: list[str]
    preamble_lines: list[str]
    launch_start_line: int
    launch_end_line: int
    flag_arrays: list[str | None] = field(default_factory=list)
    arrays: dict[str, list[str]] = field(default_factory=dict)
    launch_env: dict[str, str] = field(default_factory=dict)
    launch_arrays: list[str] = field(default_factory=list)
    array_statements: list[tuple[int, int, str]] = field(default_factory=list)
    conditional_blocks: list[ConditionalBlock] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines()

    @property
    def world_size(self) -> int | None:
        """nnodes * nproc-per-node from the launcher's own arguments, when both are plain
        integers (torchrun defaults: 1 node, 1 process); None when unknown."""
        if self.launcher and self.launcher[0].rsplit("/", 1)[-1].startswith("python") and "-m" not in self.launcher:
            return 1
        values: dict[str, str] = {}
        args = self.launcher_args
        for i, tok in enumerate(args):
            name, eq, val = tok.partition("=")
            key = name.lstrip("-").replace("_", "-")
            if key in ("nproc-per-node", "nnodes"):
                values[key] = val if eq else (args[i + 1] if i + 1 < len(args) else "")
        nproc = values.get("nproc-per-node", "1")
        nnodes = values.get("nnodes", "1")
        if not (nproc.isdigit() and nnodes.isdigit()):
            return None
        return int(nproc) * int(nnodes)


# --------------------------------------------------------------------------------------------
# Lexer: words made of parts
# --------------------------------------------------------------------------------------------
@dataclass
class _Part:
    kind: str  # lit | var | arr | idx | raw | arith | len
    text: str
    quoted: bool
    op: str = ""  # ${X<op>arg}: ':-' '-' ':=' '=' ':+' '+' ':?' '?'
    arg: "_Word | None" = None


@dataclass
class _Word:
    parts: list[_Part]
    raw: str
    line: int


@dataclass
class _ArrayAssign:
    name: str
    append: bool
    words: list[_Word]
    raw: str
    line: int
    end_line: int


@dataclass
class _Op:
    text: str
    line: int


_Token = _Word | _ArrayAssign | _Op


class _Lexer:
    """Turns bash text into words (with parts), array assignments and operators."""

    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.newlines = [i for i, c in enumerate(text) if c == "\n"]
        self.warnings: list[str] = []

    def line_at(self, pos: int) -> int:
        return bisect.bisect_left(self.newlines, pos) + 1

    def peek(self, k: int = 0) -> str:
        i = self.pos + k
        return self.text[i] if i < len(self.text) else ""

    # -- matching helpers -------------------------------------------------------------------
    def _match_close(self, start: int, open_ch: str, close_ch: str) -> int:
        """Index of the bracket closing the one just before `start` (quotes and nesting aware)."""
        depth, i, text = 1, start, self.text
        while i < len(text):
            c = text[i]
            if c == "\\":
                i += 2
                continue
            if c == "'" and open_ch != "{":
                j = text.find("'", i + 1)
                i = (j if j >= 0 else len(text)) + 1
                continue
            if c == '"':
                i = self._skip_dquote(i + 1)
                continue
            if c == open_ch:
                depth += 1
            elif c == close_ch:
                depth -= 1
                if depth == 0:
                    return i
            i += 1
        return -1

    def _skip_dquote(self, i: int) -> int:
        text = self.text
        while i < len(text):
            c = text[i]
            if c == "\\":
                i += 2
                continue
            if c == '"':
                return i + 1
            if c == "$" and i + 1 < len(text) and text[i + 1] in "({":
                close = self._match_close(i + 2, text[i + 1], ")" if text[i + 1] == "(" else "}")
                i = (close if close >= 0 else len(text)) + 1
                continue
            i += 1
        return i

    # -- tokens -------------------------------------------------------------------------------
    def tokens(self) -> list[_Token]:
        out: list[_Token] = []
        text = self.text
        while self.pos < len(text):
            c = text[self.pos]
            if c in " \t\r":
                self.pos += 1
            elif c == "\\" and self.peek(1) == "\n":
                self.pos += 2
            elif c == "\n":
                out.append(_Op("\n", self.line_at(self.pos)))
                self.pos += 1
            elif c == "#":
                end = text.find("\n", self.pos)
                self.pos = len(text) if end < 0 else end
            elif c in _OP_CHARS or (c.isdigit() and self._is_fd_redirect()):
                out.append(self._operator())
            else:
                out.append(self._word_or_array())
        return out

    def _is_fd_redirect(self) -> bool:
        m = re.match(r"\d+[<>]", self.text[self.pos :])
        return bool(m)

    def _operator(self) -> _Op:
        text, line = self.text, self.line_at(self.pos)
        m = re.match(r"\d*(>>|>&|<&|<<<|<<|&>>|&>|>\||>|<)|;;|&&|\|\||\|&|[;&|()]", text[self.pos :])
        assert m is not None
        self.pos += m.end()
        op = m.group(0)
        if op.lstrip("0123456789") in ("<<",):
            self.warnings.append(f"line {line}: here-documents are not interpreted")
        return _Op(op, line)

    def _word_or_array(self) -> _Token:
        start = self.pos
        m = _ASSIGN_RE.match(self.text[self.pos :])
        if m and self.text[self.pos + m.end() : self.pos + m.end() + 1] == "(":
            self.pos += m.end() + 1
            words: list[_Word] = []
            while self.pos < len(self.text):
                c = self.text[self.pos]
                if c in " \t\r\n":
                    self.pos += 1
                elif c == "\\" and self.peek(1) == "\n":
                    self.pos += 2
                elif c == "#":
                    end = self.text.find("\n", self.pos)
                    self.pos = len(self.text) if end < 0 else end
                elif c == ")":
                    self.pos += 1
                    break
                else:
                    words.append(self._word())
            return _ArrayAssign(
                name=m.group(1),
                append=bool(m.group(2)),
                words=words,
                raw=self.text[start : self.pos],
                line=self.line_at(start),
                end_line=self.line_at(self.pos - 1),
            )
        return self._word()

    def _word(self, stop_at_space: bool = True, end: int | None = None) -> _Word:
        """Read one word from self.pos (up to `end` when given, whitespace then literal)."""
        text = self.text
        limit = len(text) if end is None else end
        start = self.pos
        parts: list[_Part] = []

        def lit(s: str, quoted: bool) -> None:
            if parts and parts[-1].kind == "lit" and parts[-1].quoted == quoted:
                parts[-1].text += s
            else:
                parts.append(_Part("lit", s, quoted))

        while self.pos < limit:
            c = text[self.pos]
            if stop_at_space and (c in " \t\r\n" or c in _OP_CHARS):
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
                j = limit if j < 0 else j
                lit(text[self.pos + 1 : j], True)
                if text[self.pos + 1 : j] == "":
                    parts.append(_Part("lit", "", True))
                self.pos = j + 1
            elif c == '"':
                self.pos += 1
                before = len(parts)
                self._dquote_body(parts, lit)
                if len(parts) == before:
                    parts.append(_Part("lit", "", True))
            elif c == "$":
                parts.append(self._dollar(quoted=False))
            elif c == "`":
                j = text.find("`", self.pos + 1)
                j = limit if j < 0 else j
                parts.append(_Part("raw", text[self.pos : j + 1], False))
                self.pos = j + 1
            else:
                lit(c, False)
                self.pos += 1
        return _Word(parts, text[start : self.pos], self.line_at(start))

    def _dquote_body(self, parts: list[_Part], lit) -> None:  # noqa: ANN001 - local closure
        text = self.text
        while self.pos < len(text):
            c = text[self.pos]
            if c == '"':
                self.pos += 1
                return
            if c == "\\":
                nxt = text[self.pos + 1 : self.pos + 2]
                if nxt in ('"', "\\", "$", "`"):
                    lit(nxt, True)
                    self.pos += 2
                elif nxt == "\n":
                    self.pos += 2
                else:
                    lit("\\", True)
                    self.pos += 1
            elif c == "$":
                parts.append(self._dollar(quoted=True))
            elif c == "`":
                j = text.find("`", self.pos + 1)
                j = len(text) if j < 0 else j
                parts.append(_Part("raw", text[self.pos : j + 1], True))
                self.pos = j + 1
            else:
                lit(c, True)
                self.pos += 1

    def _dollar(self, quoted: bool) -> _Part:
        text, start = self.text, self.pos
        nxt = text[self.pos + 1 : self.pos + 2]
        if text.startswith("$((", self.pos):
            close = self._match_close(self.pos + 3, "(", ")")
            if close >= 0 and text[close + 1 : close + 2] == ")":
                self.pos = close + 2
                return _Part("arith", text[start + 3 : close], quoted)
        if nxt == "(":
            close = self._match_close(self.pos + 2, "(", ")")
            self.pos = (close if close >= 0 else len(text) - 1) + 1
            return _Part("raw", text[start : self.pos], quoted)
        if nxt == "{":
            close = self._match_close(self.pos + 2, "{", "}")
            if close < 0:
                self.pos = len(text)
                return _Part("raw", text[start:], quoted)
            self.pos = close + 1
            return self._brace(text[start + 2 : close], text[start : self.pos], start + 2, quoted)
        m = _NAME_RE.match(text, self.pos + 1)
        if m:
            self.pos = m.end()
            return _Part("var", m.group(0), quoted)
        if nxt and (nxt.isdigit() or nxt in "@*#?$!-"):
            self.pos += 2
            return _Part("var", nxt, quoted)
        self.pos += 1
        return _Part("lit", "$", quoted)

    def _brace(self, inner: str, raw: str, inner_pos: int, quoted: bool) -> _Part:
        m = re.fullmatch(r"([A-Za-z_][A-Za-z_0-9]*)\[([@*])\]", inner)
        if m:
            return _Part("arr", m.group(1), quoted)
        m = re.fullmatch(r"([A-Za-z_][A-Za-z_0-9]*)\[(\d+)\]", inner)
        if m:
            return _Part("idx", f"{m.group(1)}:{m.group(2)}", quoted)
        m = re.fullmatch(r"#([A-Za-z_][A-Za-z_0-9]*)", inner)
        if m:
            return _Part("len", m.group(1), quoted)
        if re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*|\d+", inner):
            return _Part("var", inner, quoted)
        m = re.match(r"([A-Za-z_][A-Za-z_0-9]*|\d+)(:?[-=+?])", inner)
        if m:
            saved = self.pos
            self.pos = inner_pos + m.end()
            arg = self._word(stop_at_space=False, end=inner_pos + len(inner))
            self.pos = saved
            return _Part("var", m.group(1), quoted, op=m.group(2), arg=arg)
        return _Part("raw", raw, quoted)


# --------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------
@dataclass
class _Var:
    value: str | list[str]
    resolved: bool = True


_ARITH_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def _eval_int_expr(node: ast.AST) -> int:
    if isinstance(node, ast.Expression):
        return _eval_int_expr(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval_int_expr(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITH_OPS:
        left, right = _eval_int_expr(node.left), _eval_int_expr(node.right)
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ValueError("division by zero")
        if isinstance(node.op, (ast.Div, ast.FloorDiv)):
            q = abs(left) // abs(right)
            return _int64(q if (left >= 0) == (right >= 0) else -q)  # bash truncates toward zero
        if isinstance(node.op, ast.Pow):
            if right < 0:
                raise ValueError("exponent less than 0")
            return _int64(pow(left, right, 1 << 64))  # bash wraps at 64 bits; never builds 9**9**9
        return _int64(_ARITH_OPS[type(node.op)](left, right))
    raise ValueError("unsupported arithmetic")


def _int64(value: int) -> int:
    """Bash arithmetic is signed 64-bit and wraps on overflow."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


class _Shell:
    """Variable store and word expansion."""

    def __init__(self) -> None:
        self.vars: dict[str, _Var] = {}
        self.exported: list[str] = []
        self.unresolved: list[str] = []
        self.misses = 0

    def _note(self, raw: str) -> str:
        """Record text left literal (unresolvable) and return it."""
        self.misses += 1
        if raw not in self.unresolved:
            self.unresolved.append(raw)
        return raw

    def lookup(self, name: str) -> _Var | None:
        return self.vars.get(name)

    def scalar(self, name: str) -> tuple[str | None, bool]:
        """(value, resolved) of a variable, None when unset; arrays give element 0."""
        var = self.vars.get(name)
        if var is None:
            return None, True
        if isinstance(var.value, list):
            return (var.value[0] if var.value else ""), var.resolved
        return var.value, var.resolved

    def expand_part(self, part: _Part) -> tuple[list[str] | str, bool]:
        """One part: a string (joined into the current field) or a list (array elements),
        and whether the value may be word-split (unquoted expansion)."""
        split = not part.quoted
        if part.kind == "lit":
            return part.text, False
        if part.kind == "raw":
            return self._note(part.text), False
        if part.kind == "arith":
            expr = re.sub(
                r"\$\{?([A-Za-z_][A-Za-z_0-9]*)\}?|\b([A-Za-z_][A-Za-z_0-9]*)\b",
                lambda m: self._arith_name(m.group(1) or m.group(2)),
                part.text,
            )
            try:
                return str(_eval_int_expr(ast.parse(expr.strip(), mode="eval"))), False
            except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
                return self._note(f"$(({part.text}))"), False
        if part.kind == "arr":
            var = self.vars.get(part.text)
            if var is None:
                return self._note("${" + part.text + "[@]}"), False
            values = var.value if isinstance(var.value, list) else [var.value]
            return list(values), split
        if part.kind == "idx":
            name, index = part.text.split(":")
            var = self.vars.get(name)
            if var is None:
                return self._note("${" + name + "[" + index + "]}"), False
            values = var.value if isinstance(var.value, list) else [var.value]
            i = int(index)
            return (values[i] if i < len(values) else ""), split
        if part.kind == "len":
            value, resolved = self.scalar(part.text)
            if value is None or not resolved:
                return self._note("${#" + part.text + "}"), False
            return str(len(value)), False
        # var
        name = part.text
        is_name = bool(_NAME_RE.fullmatch(name))
        ref = "${" + name + "}" if is_name else "$" + name
        value, resolved = self.scalar(name) if is_name else (None, True)
        op = part.op
        if op:
            is_set = value is not None
            present = (is_set and value != "") if op.startswith(":") else is_set
            if op in (":+", "+"):
                if is_set and not resolved:
                    return self._note(ref), False
                return (self.expand_text(part.arg)[0] if present else ""), split
            if not present:
                if op.endswith("?"):
                    return self._note(ref), False
                arg_text, arg_ok = self.expand_text(part.arg)
                if op.endswith("=") and is_name:
                    self.vars[name] = _Var(arg_text, arg_ok)
                return arg_text, split
        if value is None or not resolved:
            return self._note(ref), False
        return value, split

    def _arith_name(self, name: str) -> str:
        """A variable inside $((...)) as an integer literal; an unusable one poisons the
        expression (an unknown name makes the evaluator refuse it)."""
        value, resolved = self.scalar(name)
        if value is None or not resolved or not re.fullmatch(r"\s*-?\d+\s*", value):
            return "unresolved_" + name
        return value.strip()

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
        has_content = False  # the current field exists even if empty (quoted "")

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

    def assign(self, word: _Word) -> None:
        """`NAME=value` or `NAME+=value` (a word)."""
        m = _ASSIGN_RE.match(word.raw)
        assert m is not None
        name, append = m.group(1), bool(m.group(2))
        # the value is the word with its `NAME=` prefix removed from the first literal part
        prefix_len = m.end()
        parts = [p for p in word.parts]
        first = parts[0]
        value_parts = [_Part(first.kind, first.text[prefix_len:], first.quoted)] + parts[1:]
        value, resolved = self.expand_text(_Word(value_parts, word.raw[prefix_len:], word.line))
        old = self.vars.get(name)
        if append and old is not None:
            if isinstance(old.value, list):
                self.vars[name] = _Var(old.value + [value], old.resolved)
            else:
                self.vars[name] = _Var(old.value + value, old.resolved and resolved)
        else:
            self.vars[name] = _Var(value, resolved)

    def assign_array(self, token: _ArrayAssign) -> None:
        values: list[str] = []
        for w in token.words:
            values.extend(self.expand_fields(w))
        old = self.vars.get(token.name)
        if token.append and old is not None:
            base = old.value if isinstance(old.value, list) else [old.value]
            self.vars[token.name] = _Var(base + values)
        else:
            self.vars[token.name] = _Var(values)


# --------------------------------------------------------------------------------------------
# Statements
# --------------------------------------------------------------------------------------------
@dataclass
class _Stmt:
    tokens: list[_Word | _ArrayAssign]
    line: int
    end_line: int
    depth: int
    block_start: int  # line of the enclosing top-level compound command, or 0


def _statements(tokens: list[_Token]) -> list[_Stmt]:
    """Split tokens into simple commands; redirections are dropped; depth counts compound
    commands (if/for/while/case/{ }) around each statement."""
    out: list[_Stmt] = []
    depth, block_start = 0, 0
    current: list[_Word | _ArrayAssign] = []
    skip_next_word = False
    separators = {"\n", ";", "&&", "||", "|", "&", "|&", ";;", "(", ")"}

    def close() -> None:
        nonlocal current
        if current:
            first = current[0]
            line = first.line
            last = current[-1]
            end = last.end_line if isinstance(last, _ArrayAssign) else last.line
            out.append(_Stmt(current, line, end, depth, block_start))
        current = []

    for tok in tokens:
        if isinstance(tok, _Op):
            if tok.text in separators:
                close()
            else:  # redirection: its target word follows
                skip_next_word = True
            continue
        if skip_next_word:
            skip_next_word = False
            continue
        if isinstance(tok, _Word) and not current:
            word = tok.raw
            if word in _OPEN_WORDS or word == "{":
                if depth == 0:
                    block_start = tok.line
                depth += 1
                if word in ("if", "while", "until", "{"):
                    continue  # the condition / body follows as a statement
                current.append(tok)
                continue
            if word in _CLOSE_WORDS or word == "}":
                close()
                depth = max(0, depth - 1)
                out.append(_Stmt([tok], tok.line, tok.line, depth, block_start))
                if depth == 0:
                    block_start = 0
                continue
            if word in ("then", "do", "else", "elif"):
                continue
        current.append(tok)
    close()
    return out


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
        else:
            continue
        for j in range(after, len(fields)):
            if fields[j].endswith(".py") and not fields[j].startswith("-"):
                return start, after, j
        return None
    return None


def _conditional_blocks(stmts: list[_Stmt]) -> list[ConditionalBlock]:
    """The compound blocks (if/for/while/case) with the arrays their statements assign."""
    blocks: dict[int, ConditionalBlock] = {}
    for st in stmts:
        if st.block_start:
            blk = blocks.setdefault(st.block_start, ConditionalBlock(st.block_start, st.end_line))
            blk.end_line = max(blk.end_line, st.end_line)
            for tok in st.tokens:
                if isinstance(tok, _ArrayAssign) and tok.name not in blk.arrays:
                    blk.arrays.append(tok.name)
    return list(blocks.values())


def parse_launcher_script(text: str) -> LauncherScript:
    """Parse a bash launcher script; see the module docstring.

    Raises PlannerInputError("--megatron-script", ...) when no command runs a *.py entry
    script through torchrun, `python -m torch.distributed.run|launch` or python."""
    lexer = _Lexer(text)
    stmts = _statements(lexer.tokens())
    shell = _Shell()
    lines = text.splitlines()
    warnings = list(lexer.warnings)
    array_statements: list[tuple[int, int, str]] = []
    array_origin: dict[str, list[tuple[str, str]]] = {}  # array -> [(value, array)]
    launch: LauncherScript | None = None

    for st in stmts:
        first = st.tokens[0]
        if st.depth > 0 and not (isinstance(first, _Word) and _would_launch(shell, st)):
            continue
        # leading assignments
        k = 0
        prefix_env: dict[str, str] = {}
        assigns: list[_Word | _ArrayAssign] = []
        while k < len(st.tokens):
            tok = st.tokens[k]
            if isinstance(tok, _ArrayAssign) or (isinstance(tok, _Word) and _ASSIGN_RE.match(tok.raw)):
                assigns.append(tok)
                k += 1
                continue
            break
        rest = st.tokens[k:]
        if not rest:
            for tok in assigns:
                _do_assign(shell, tok, array_statements, st)
            continue
        head = rest[0]
        if isinstance(head, _Word) and head.raw in _DECLARE_WORDS:
            exporting = head.raw == "export"
            for tok in rest[1:]:
                if isinstance(tok, _Word) and tok.raw.startswith("-"):
                    exporting = exporting or "x" in tok.raw
                    continue
                if isinstance(tok, _ArrayAssign) or _ASSIGN_RE.match(tok.raw):
                    _do_assign(shell, tok, array_statements, st)
                    name = tok.name if isinstance(tok, _ArrayAssign) else _ASSIGN_RE.match(tok.raw).group(1)
                elif _NAME_RE.fullmatch(tok.raw):
                    name = tok.raw
                else:
                    continue
                if exporting and name not in shell.exported:
                    shell.exported.append(name)
            continue
        # a command: expand its words
        fields: list[str] = []
        origins: list[str | None] = []
        used_arrays: list[str] = []
        for tok in rest:
            if isinstance(tok, _ArrayAssign):
                fields.append(tok.raw)
                origins.append(None)
                continue
            expanded = shell.expand_fields(tok)
            arr_names = [p.text for p in tok.parts if p.kind == "arr"]
            origin = arr_names[0] if len(arr_names) == 1 and len(tok.parts) == 1 else None
            if origin and origin not in used_arrays:
                used_arrays.append(origin)
            fields.extend(expanded)
            origins.extend([origin] * len(expanded))
        split = _launch_split(fields)
        if split is None:
            continue
        for tok in assigns:
            if isinstance(tok, _Word):
                m = _ASSIGN_RE.match(tok.raw)
                assert m is not None
                saved = dict(shell.vars)
                shell.assign(tok)
                value, _ = shell.scalar(m.group(1))
                shell.vars = saved
                prefix_env[m.group(1)] = value or ""
        start, after, entry = split
        # a launch command inside an if/for block: the preamble stops before that block
        cut = st.block_start if st.depth > 0 and st.block_start else st.line
        if cut != st.line:
            warnings.append(
                f"line {st.line}: the launch command sits in a block starting at line {cut}; "
                "the emitted launcher keeps only the lines before that block"
            )
        launch = LauncherScript(
            text=text,
            megatron_flags=fields[entry + 1 :],
            flag_arrays=origins[entry + 1 :],
            entry_script=fields[entry],
            launcher=fields[start:after],
            launcher_args=fields[after:entry],
            env={},
            exported=[],
            preamble_lines=lines[: cut - 1],
            launch_start_line=cut,
            launch_end_line=st.end_line,
            launch_env=prefix_env,
            launch_arrays=used_arrays,
        )
        if start > 0:
            warnings.append(
                f"line {st.line}: the launch command is wrapped by {' '.join(fields[:start])!r}; "
                "the emitted launcher runs torchrun directly"
            )
        break

    if launch is None:
        raise PlannerInputError(
            FIELD,
            "no command runs a Python entry script (expected `torchrun [args] pretrain_gpt.py "
            "<flags>`, `python -m torch.distributed.run [args] <script>.py <flags>` or "
            "`python <script>.py <flags>`)",
        )

    if launch.preamble_lines and launch.preamble_lines[0].startswith("#!"):
        launch.preamble_lines = launch.preamble_lines[1:]
    launch.env = {
        name: var.value for name, var in shell.vars.items() if isinstance(var.value, str)
    }
    launch.arrays = {
        name: list(var.value) for name, var in shell.vars.items() if isinstance(var.value, list)
    }
    launch.exported = list(shell.exported)
    launch.unresolved = list(shell.unresolved)
    used = set(launch.launch_arrays)
    launch.array_statements = [
        (a, b, name)
        for a, b, name in array_statements
        if name in used and b < launch.launch_start_line
    ]
    blocks = [
        blk
        for blk in _conditional_blocks(stmts)
        if blk.end_line < launch.launch_start_line
    ]
    launch.conditional_blocks = blocks
    for blk in blocks:
        touched = [a for a in blk.arrays if a in used]
        detail = f" (modifies {', '.join(touched)})" if touched else ""
        warnings.append(
            f"lines {blk.start_line}-{blk.end_line}: conditional block not evaluated{detail}; "
            "it is kept in the emitted launcher"
        )
    if launch.unresolved:
        warnings.append(
            "kept as literal text (bash expands them when the launcher runs): "
            + ", ".join(launch.unresolved)
        )
    launch.warnings = warnings
    return launch


def _would_launch(shell: _Shell, st: _Stmt) -> bool:
    """A statement inside a block that is itself the launch command (if/else around torchrun)."""
    fields: list[str] = []
    for tok in st.tokens:
        if isinstance(tok, _Word) and not _ASSIGN_RE.match(tok.raw):
            fields.append(tok.raw.strip("\"'").rsplit("/", 1)[-1])
    return any(f == "torchrun" or re.fullmatch(r"python[0-9.]*", f) for f in fields[:3])


def _do_assign(
    shell: _Shell,
    tok: _Word | _ArrayAssign,
    array_statements: list[tuple[int, int, str]],
    st: _Stmt,
) -> None:
    """Run one assignment; remember where top-level array assignments are."""
    if isinstance(tok, _ArrayAssign):
        shell.assign_array(tok)
        if st.depth == 0:
            array_statements.append((tok.line, tok.end_line, tok.name))
    else:
        shell.assign(tok)


def read_launcher_script(path: str | Path) -> LauncherScript:
    """Read and parse a launcher script file; a missing file names --megatron-script."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PlannerInputError(FIELD, f"file not found: {p}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PlannerInputError(FIELD, f"cannot read {p}: {exc}") from None
    return parse_launcher_script(text)
