r"""Lexer for the launcher-script reader: bash text -> words (made of literal, variable and
substitution parts), array assignments, operators and `(( ))` commands.  A here-document's body
is attached to its `<<` operator (as a word of expansions when its delimiter is unquoted).  A
backslash followed by blanks at the end of a line (`\ ` where a line continuation was meant) is
recorded in `stray_escapes`.  Every scan moves forward, so lexing is linear in the text; nesting
deeper than MAX_NESTING and unterminated quotes or brackets are refused with the file and line."""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from planner.errors import PlannerInputError

MAX_NESTING = 64  # ${...${...}} / $(...$(...)) levels
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
ASSIGN_RE = re.compile(r"^([A-Za-z_][A-Za-z_0-9]*)(\[[^\]]*\])?(\+?)=")
ASSIGN_AT = re.compile(r"([A-Za-z_][A-Za-z_0-9]*)(\[[^\]]*\])?(\+?)=")  # for pattern.match(text, pos)
OP_CHARS = frozenset(";&|()<>")
SPACE = frozenset(" \t\r\n")
_PLAIN_RUN = re.compile(r"[^\s;&|()<>\\'\"$`]+")
_DQ_PLAIN_RUN = re.compile(r'[^"\\$`]+')
_BLANKS_TO_EOL = re.compile(r"[ \t]+(?:\n|$)")
_NEWLINE = re.compile("\n")
_PLAIN_WORD = re.compile(r"[^\s;&|()<>\\'\"$`]+(?=[ \t\r\n;&|()<>]|\Z)")  # _PLAIN_RUN that ends the word


def location(path: str | None, line: int) -> str:
    """`file:line` for error messages."""
    return f"{path or 'script'}:{line}"


_ANSI_C_ESCAPES = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r", "t": "\t",
                   "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}
_ANSI_C_NUMBER = {"x": re.compile(r"[0-9A-Fa-f]{1,2}"), "u": re.compile(r"[0-9A-Fa-f]{1,4}"),
                  "U": re.compile(r"[0-9A-Fa-f]{1,8}")}
_OCTAL = re.compile(r"[0-7]{1,3}")


def ansi_c_string(text: str, start: int) -> tuple[str, int] | None:
    r"""The value of bash's ANSI-C quoting `$'...'` whose body starts at text[start] (just after `$'`), and
    the index after its closing quote; None when it is not closed.  Escapes as bash decodes them: \n \t
    \e ..., \NNN (octal), \xHH, \uHHHH, \UHHHHHHHH, \cX (control-X); an unknown escape stays as
    written; a NUL ends the value (bash drops the rest of the quoted text)."""
    out: list[str] = []
    i, n = start, len(text)
    while i < n:
        c = text[i]
        if c == "'":
            return "".join(out).split("\x00", 1)[0], i + 1
        if c != "\\" or i + 1 >= n:
            out.append(c)
            i += 1
            continue
        e = text[i + 1]
        number = _ANSI_C_NUMBER.get(e)
        if e in _ANSI_C_ESCAPES:
            out.append(_ANSI_C_ESCAPES[e])
            i += 2
        elif e in "01234567":
            m = _OCTAL.match(text, i + 1)
            assert m is not None
            out.append(chr(int(m.group(0), 8) & 0xFF))
            i = m.end()
        elif number is not None and (m := number.match(text, i + 2)):
            code = int(m.group(0), 16)
            valid = code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF  # else no character: kept as written
            out.append(chr(code) if valid else "\\" + e + m.group(0))
            i = m.end()
        elif e == "c" and i + 2 < n:
            ctl = text[i + 2]
            skip = 2 if ctl == "\\" and text.startswith("\\", i + 3) else 1  # \c\\ is control-backslash
            out.append("\x7f" if ctl == "?" else chr(ord(ctl) & 0x1F))
            i += 2 + skip
        else:
            out.append("\\" + e)
            i += 2
    return None


# --------------------------------------------------------------------------------------------
# Lexer: words made of parts, array assignments, operators, heredocs
# --------------------------------------------------------------------------------------------
@dataclass(slots=True)
class Part:
    kind: str  # lit | var | arr | aslice | idx | raw | arith | len | alen | pos
    text: str
    quoted: bool
    op: str = ""  # ${X<op>arg}
    arg: "Word | None" = None
    arg2: "Word | None" = None  # ${X/pat/rep}: the replacement; ${X:off:len}: the length


@dataclass(slots=True)
class Word:
    parts: list[Part]
    raw: str
    line: int
    pos: int


@dataclass
class ArrayAssign:
    name: str
    append: bool
    words: list[Word]
    raw: str
    line: int
    pos: int


@dataclass
class Heredoc:
    """A here-document: its body as written, and (delimiter unquoted) as a word whose parameter,
    command and arithmetic expansions bash performs; `line` is the body's first line."""

    text: str
    word: "Word | None"
    line: int


@dataclass
class Op:
    text: str
    line: int
    pos: int
    heredoc: Heredoc | None = None  # the body of a `<<` / `<<-` operator


@dataclass
class ArithCmd:
    expr: str
    line: int
    pos: int


Token = Word | ArrayAssign | Op | ArithCmd


class Lexer:
    """Turns bash text into tokens.  Every scan moves forward, so lexing is linear."""

    def __init__(self, text: str, path: str | None, line_offset: int = 0):
        self.text = text
        self.path = path
        self.line_offset = line_offset
        self.pos = 0
        self.newlines = [m.start() for m in _NEWLINE.finditer(text)]
        self.depth = 0
        self.scan_depth = 0
        self.heredocs: list[tuple[str, bool, bool, Op]] = []  # (delimiter, strip tabs, quoted, operator)
        self.warnings: list[str] = []
        self.stray_escapes: list[int] = []  # lines ending in a backslash and blanks

    def line_at(self, pos: int) -> int:
        return bisect.bisect_left(self.newlines, pos) + 1 + self.line_offset

    def fail(self, pos: int, message: str) -> PlannerInputError:
        return PlannerInputError(location(self.path, self.line_at(pos)), message)

    # -- tokens -------------------------------------------------------------------------------
    def tokens(self) -> list[Token]:
        out: list[Token] = []
        text = self.text
        n = len(text)
        expect_delim: Op | None = None
        while self.pos < n:
            c = text[self.pos]
            if c in " \t\r":
                self.pos += 1
            elif c == "\\" and text.startswith("\n", self.pos + 1):
                self.pos += 2
            elif c == "\n":
                out.append(Op("\n", self.line_at(self.pos), self.pos))
                self.pos += 1
                if self.heredocs:
                    self._skip_heredoc_bodies()
            elif c == "#" and (self.pos == 0 or text[self.pos - 1] in SPACE or text[self.pos - 1] in OP_CHARS):
                end = text.find("\n", self.pos)
                self.pos = n if end < 0 else end
            elif text.startswith("((", self.pos) and self._command_position(out):
                out.append(self._arith_command())
            elif c in OP_CHARS or (c.isdigit() and re.match(r"\d+[<>]", text[self.pos : self.pos + 12])):
                op = self._operator()
                out.append(op)
                if op.text.lstrip("0123456789") in ("<<", "<<-"):
                    expect_delim = op
            else:
                tok = self._word_or_array()
                out.append(tok)
                if expect_delim is not None and isinstance(tok, Word):
                    delim = "".join(p.text for p in tok.parts)
                    quoted = any(p.quoted for p in tok.parts)
                    self.heredocs.append((delim, expect_delim.text.endswith("-"), quoted, expect_delim))
                expect_delim = None
        return out

    @staticmethod
    def _command_position(out: list[Token]) -> bool:
        if not out:
            return True
        last = out[-1]
        if isinstance(last, Op):
            return last.text in ("\n", ";", "&&", "||", "|", "&", "(", ";;")
        if isinstance(last, Word):
            return last.raw in ("then", "do", "else", "elif", "{", "!", "for", "while", "until", "if")
        return False

    def _skip_heredoc_bodies(self) -> None:
        """Read the bodies of the pending here-documents (after the newline of their command) onto
        their operators."""
        text = self.text
        for delim, strip_tabs, quoted, op in self.heredocs:
            start, first_line, lines = self.pos, self.line_at(self.pos), []
            body_end = len(text)
            while self.pos < len(text):
                end = text.find("\n", self.pos)
                end = len(text) if end < 0 else end
                line = text[self.pos : end]
                if (line.lstrip("\t") if strip_tabs else line) == delim:
                    body_end = self.pos
                    self.pos = min(end + 1, len(text))
                    break
                lines.append(line.lstrip("\t") if strip_tabs else line)
                self.pos = min(end + 1, len(text))
            body = "".join(ln + "\n" for ln in lines)
            word = None
            if not quoted:
                saved = self.pos
                word = self.expansion_word(start, body_end) if not strip_tabs else Lexer(body, self.path,
                                                                                         first_line - 1).expansion_word(0, len(body))
                self.pos = saved
            op.heredoc = Heredoc(body, word, first_line)
        self.heredocs = []

    def expansion_word(self, start: int, end: int) -> Word:
        """text[start:end] as a word in which only `$...` and backquote expansions (and the escapes
        \\$ \\` \\\\ and backslash-newline) are special: a here-document body, or the text of
        $(( ... )).  Expanded without word splitting."""
        text = self.text
        parts: list[Part] = []
        buf: list[str] = []

        def flush() -> None:
            if buf:
                parts.append(Part("lit", "".join(buf), True))
                buf.clear()

        self.pos = start
        while self.pos < end:
            c = text[self.pos]
            if c == "\\" and self.pos + 1 < end and text[self.pos + 1] in "$`\\\n":
                if text[self.pos + 1] != "\n":
                    buf.append(text[self.pos + 1])
                self.pos += 2
            elif c == "$":
                flush()
                parts.append(self._dollar(quoted=True, limit=end))
            elif c == "`":
                j = text.find("`", self.pos + 1)
                if j < 0 or j >= end:
                    raise self.fail(self.pos, "unterminated ` command substitution")
                flush()
                parts.append(Part("raw", text[self.pos : j + 1], True))
                self.pos = j + 1
            else:
                buf.append(c)
                self.pos += 1
        flush()
        return Word(parts or [Part("lit", "", True)], text[start:end], self.line_at(start), start)

    def _arith_command(self) -> ArithCmd:
        start = self.pos
        close = self._match_close(start + 2, "(", ")")
        if close < 0 or not self.text.startswith(")", close + 1):
            raise self.fail(start, "unbalanced (( ... )): no matching ))")
        self.pos = close + 2
        return ArithCmd(self.text[start + 2 : close], self.line_at(start), start)

    def _operator(self) -> Op:
        text, start = self.text, self.pos
        m = re.match(r"\d*(>>|>&|<&|<<<|<<-|<<|&>>|&>|>\||>|<)|;;&|;;|;&|&&|\|\||\|&|[;&|()]", text[self.pos : self.pos + 8])
        assert m is not None
        self.pos += m.end()
        return Op(m.group(0), self.line_at(start), start)

    # -- matching helpers -----------------------------------------------------------------------
    def _match_close(self, start: int, open_ch: str, close_ch: str) -> int:
        """Index of the bracket closing the one just before `start` (quotes and nesting aware),
        -1 when there is none."""
        self.scan_depth += 1  # quotes and brackets nest through _skip_dquote too
        try:
            if self.scan_depth > MAX_NESTING:
                raise self.fail(start, f"quotes and brackets nested more than {MAX_NESTING} deep")
            return self._scan_close(start, open_ch, close_ch)
        finally:
            self.scan_depth -= 1

    def _scan_close(self, start: int, open_ch: str, close_ch: str) -> int:
        depth, i, text = 1, start, self.text
        n = len(text)
        while i < n:
            c = text[i]
            if c == "\\":
                i += 2
                continue
            if c == "$" and text.startswith("'", i + 1) and open_ch != "{":
                found = ansi_c_string(text, i + 2)
                if found is None:
                    return -1
                i = found[1]
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
    def _word_or_array(self) -> Token:
        start = self.pos
        m = ASSIGN_AT.match(self.text, self.pos)
        if m and not m.group(2) and self.text.startswith("(", m.end()):
            self.pos = m.end() + 1
            words: list[Word] = []
            text = self.text
            line = self.line_at(self.pos)  # the line of the next word
            while True:
                if self.pos >= len(text):
                    raise self.fail(start, f"array assignment {m.group(1)}=( is not closed with )")
                c = text[self.pos]
                if c in SPACE:
                    self.pos += 1
                    if c == "\n":
                        line += 1
                elif c == "\\" and text.startswith("\n", self.pos + 1):
                    self.pos += 2
                    line += 1
                elif c == "#" and text[self.pos - 1] in SPACE:
                    end = text.find("\n", self.pos)
                    self.pos = len(text) if end < 0 else end
                elif c == ")":
                    self.pos += 1
                    break
                elif c in OP_CHARS:
                    raise self.fail(self.pos, f"syntax error near unexpected token `{c}` in {m.group(1)}=( ... )")
                else:
                    plain = _PLAIN_WORD.match(text, self.pos)
                    if plain is None:
                        words.append(self._word())
                        line = self.line_at(self.pos)
                        continue
                    self.pos = plain.end()  # a plain word (most of a long list): read here, for speed
                    word_text = plain.group(0)
                    words.append(Word([Part("lit", word_text, False)], word_text, line, plain.start()))
            return ArrayAssign(m.group(1), bool(m.group(3)), words, text[start : self.pos], self.line_at(start), start)
        return self._word()

    def _word(self, stop_at_space: bool = True, end: int | None = None) -> Word:
        """Read one word from self.pos (up to `end` when given)."""
        text = self.text
        limit = len(text) if end is None else end
        start = self.pos
        if stop_at_space:  # fast path: a plain word (no quotes, escapes or expansions)
            m = _PLAIN_RUN.match(text, start, limit)
            if m and (m.end() == limit or text[m.end()] in SPACE or text[m.end()] in OP_CHARS):
                self.pos = m.end()
                return Word([Part("lit", m.group(0), False)], m.group(0), self.line_at(start), start)
        parts: list[Part] = []
        buf: list[str] = []
        buf_quoted = False

        def flush() -> None:
            nonlocal buf
            if buf:
                parts.append(Part("lit", "".join(buf), buf_quoted))
                buf = []

        def lit(s: str, quoted: bool) -> None:
            nonlocal buf_quoted
            if buf and buf_quoted != quoted:
                flush()
            buf_quoted = quoted
            buf.append(s)

        while self.pos < limit:
            c = text[self.pos]
            if stop_at_space and (c in SPACE or c in OP_CHARS):
                break
            if c == "\\":
                nxt = text[self.pos + 1 : self.pos + 2]
                if nxt == "\n":
                    self.pos += 2
                    continue
                if nxt in (" ", "\t") and _BLANKS_TO_EOL.match(text, self.pos + 1):
                    self.stray_escapes.append(self.line_at(self.pos))
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
                    parts.append(Part("lit", "", True))
            elif c == "$" and text.startswith('"', self.pos + 1):
                self.pos += 1  # $"...": a translated string; as "..." (no message catalog here)
            elif c == "$":
                flush()
                parts.append(self._dollar(quoted=False, limit=limit))
            elif c == "`":
                j = text.find("`", self.pos + 1)
                if j < 0 or j >= limit:
                    raise self.fail(self.pos, "unterminated ` command substitution")
                flush()
                parts.append(Part("raw", text[self.pos : j + 1], False))
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
        return Word(parts, text[start : self.pos], self.line_at(start), start)

    def _dquote_body(self, parts: list[Part], limit: int, open_at: int) -> None:
        text = self.text
        buf: list[str] = []

        def flush() -> None:
            if buf:
                parts.append(Part("lit", "".join(buf), True))
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
                parts.append(Part("raw", text[self.pos : j + 1], True))
                self.pos = j + 1
            else:
                m = _DQ_PLAIN_RUN.match(text, self.pos, limit)
                buf.append(m.group(0))
                self.pos = m.end()
        raise self.fail(open_at, 'unterminated " quote')

    def _dollar(self, quoted: bool, limit: int) -> Part:
        text, start = self.text, self.pos
        nxt = text[self.pos + 1 : self.pos + 2]
        if nxt == "'" and not quoted:  # $'...': ANSI-C quoting (inside double quotes, plain text)
            found = ansi_c_string(text[:limit], self.pos + 2)
            if found is None:
                raise self.fail(start, "unterminated $' quote")
            self.pos = found[1]
            return Part("lit", found[0], True)
        if text.startswith("$((", self.pos):
            close = self._match_close(self.pos + 3, "(", ")")
            if close >= 0 and text.startswith(")", close + 1):
                self.pos = close + 2
                return Part("arith", text[start + 3 : close], quoted)
        if nxt == "(":
            close = self._match_close(self.pos + 2, "(", ")")
            if close < 0:
                raise self.fail(start, "unbalanced $( ... ): no matching )")
            self.pos = close + 1
            return Part("raw", text[start : self.pos], quoted)
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
        m = NAME_RE.match(text, self.pos + 1)
        if m:
            self.pos = m.end()
            return Part("var", m.group(0), quoted)
        if nxt and (nxt.isdigit() or nxt in "@*#?$!-"):
            self.pos += 2
            return Part("var", nxt, quoted)
        self.pos += 1
        return Part("lit", "$", quoted)

    def _sub_word(self, begin: int, end: int) -> Word:
        saved = self.pos
        self.pos = begin
        try:
            return self._word(stop_at_space=False, end=end)
        finally:
            self.pos = saved

    def _brace(self, inner: str, raw: str, inner_pos: int, quoted: bool) -> Part:
        m = re.fullmatch(r"([A-Za-z_][A-Za-z_0-9]*)\[([@*])\]", inner)
        if m:
            return Part("arr", m.group(1), quoted, op=m.group(2))
        m = re.match(r"([A-Za-z_][A-Za-z_0-9]*)\[([@*])\]:", inner)
        if m:  # ${A[@]:offset[:length]}: a slice of the elements
            colon = find_unescaped(inner, ":", m.end())
            end = colon if colon >= 0 else len(inner)
            return Part("aslice", m.group(1), quoted, op=m.group(2), arg=self._sub_word(inner_pos + m.end(), inner_pos + end),
                        arg2=self._sub_word(inner_pos + colon + 1, inner_pos + len(inner)) if colon >= 0 else None)
        m = re.fullmatch(r"#([A-Za-z_][A-Za-z_0-9]*)\[[@*]\]", inner)
        if m:
            return Part("alen", m.group(1), quoted)
        m = re.fullmatch(r"([A-Za-z_][A-Za-z_0-9]*)\[([^\]]+)\]", inner)
        if m:
            return Part("idx", m.group(1), quoted, arg=self._sub_word(inner_pos + m.start(2), inner_pos + m.end(2)))
        m = re.fullmatch(r"#([A-Za-z_][A-Za-z_0-9]*|[@*])", inner)
        if m:
            return Part("len", m.group(1), quoted)
        if re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*|\d+|[@*#?$!]", inner):
            return Part("var", inner, quoted)
        m = re.match(r"([A-Za-z_][A-Za-z_0-9]*|\d+|[@*])(:?[-=+?]|##?|%%?|//?|\^\^?|,,?|:)", inner)
        if m:
            op = m.group(2)
            arg_start = inner_pos + m.end()
            arg_end = inner_pos + len(inner)
            if op in ("/", "//"):
                slash = find_unescaped(inner, "/", m.end())
                if slash >= 0:
                    return Part("var", m.group(1), quoted, op=op,
                                 arg=self._sub_word(arg_start, inner_pos + slash),
                                 arg2=self._sub_word(inner_pos + slash + 1, arg_end))
            if op == ":":
                colon = find_unescaped(inner, ":", m.end())
                if colon >= 0:
                    return Part("var", m.group(1), quoted, op=op, arg=self._sub_word(arg_start, inner_pos + colon),
                                 arg2=self._sub_word(inner_pos + colon + 1, arg_end))
            return Part("var", m.group(1), quoted, op=op, arg=self._sub_word(arg_start, arg_end))
        return Part("raw", raw, quoted)


def find_unescaped(text: str, ch: str, start: int) -> int:
    i = start
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == ch:
            return i
        i += 1
    return -1
