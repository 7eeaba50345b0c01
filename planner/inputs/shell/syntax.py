"""Parser for the launcher-script reader: tokens -> a small syntax tree (simple commands, if,
loops, case, groups and subshells, functions, && / || lists, pipelines, (( )) and [[ ]])."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.errors import PlannerInputError
from planner.inputs.shell.lexer import (
    ASSIGN_RE, MAX_NESTING, NAME_RE, ArithCmd, ArrayAssign, Heredoc, Lexer, Op, Token, Word, location,
)

RESERVED_END = {"then", "elif", "else", "fi", "do", "done", "esac", "}"}


# --------------------------------------------------------------------------------------------
# Parser: tokens -> a small syntax tree
# --------------------------------------------------------------------------------------------
@dataclass
class Redirect:
    """`op target`: the operator as written (`>`, `2>&1`, `<<<`, `<<`), its target word (None for a
    here-document), and a here-document's body."""

    op: str
    target: Word | None
    heredoc: Heredoc | None = None

    @property
    def stdout(self) -> bool:
        """The command's standard output goes elsewhere (a file, stderr)."""
        kind = self.op.lstrip("0123456789")
        return kind in (">", ">>", ">|", ">&", "&>", "&>>") and self.op[: len(self.op) - len(kind)] in ("", "1")

    @property
    def stdin_text(self) -> bool:
        """A here-document or here-string feeds the command's standard input."""
        return self.op.lstrip("0") in ("<<", "<<-", "<<<")


@dataclass
class Simple:
    assigns: list[Word | ArrayAssign]
    words: list[Word]
    line: int
    pos: int
    src: int  # which text: 0 = the script itself
    redirects: list[Redirect] = field(default_factory=list)


@dataclass
class If:
    arms: list[tuple[list, list]]  # (condition list, body list)
    orelse: list | None
    line: int
    end_line: int
    src: int


@dataclass
class Loop:
    kind: str  # while | until | for | cfor
    cond: list | None
    var: str | None
    items: list[Word] | None
    body: list
    line: int
    end_line: int
    arith: tuple[str, str, str] | None = None
    src: int = 0  # which text: 0 = the script itself


@dataclass
class Case:
    word: Word
    arms: list[tuple[list[Word], list]]
    line: int
    src: int = 0


@dataclass
class Group:
    body: list
    subshell: bool
    line: int


@dataclass
class Func:
    name: str
    body: list
    line: int


@dataclass
class AndOr:
    first: object
    rest: list[tuple[str, object]]  # ("&&"|"||", pipeline)
    line: int
    src: int = 0


@dataclass
class Pipe:
    cmds: list
    negate: bool
    line: int


@dataclass
class Arith:
    expr: str
    line: int


@dataclass
class Cond:  # [[ ... ]]
    words: list[Word | Op]
    line: int
    raw: str


class Parser:
    def __init__(self, tokens: list[Token], path: str | None, src: int, text: str):
        self.toks = tokens
        self.i = 0
        self.nesting = 0
        self.path = path
        self.src = src
        self.text = text

    def fail(self, line: int, message: str) -> PlannerInputError:
        return PlannerInputError(location(self.path, line), message)

    def peek(self) -> Token | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def _is_word(self, tok: Token | None, *values: str) -> bool:
        return isinstance(tok, Word) and tok.raw in values

    def _is_op(self, tok: Token | None, *values: str) -> bool:
        return isinstance(tok, Op) and tok.text in values

    def skip_newlines(self) -> None:
        while self._is_op(self.peek(), "\n", ";"):
            self.i += 1

    def program(self) -> list:
        body = self.compound_list(())
        if self.peek() is not None:
            tok = self.peek()
            text = tok.raw if isinstance(tok, Word) else getattr(tok, "text", "?")
            raise self.fail(tok.line, f"syntax error near unexpected token `{text}`")
        return body

    def compound_list(self, stops: tuple[str, ...]) -> list:
        out: list = []
        while True:
            self.skip_newlines()
            tok = self.peek()
            if tok is None:
                return out
            if isinstance(tok, Word) and tok.raw in stops:
                return out
            if self._is_op(tok, ")", ";;", ";&", ";;&"):
                return out
            if self._is_word(tok, *RESERVED_END) and tok.raw not in stops:
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
        return AndOr(first, rest, getattr(first, "line", 0), self.src) if rest else first

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
        return Pipe(cmds, negate, line)

    def _expect_word(self, value: str, opened: int) -> Word:
        self.skip_newlines()
        tok = self.peek()
        if not self._is_word(tok, value):
            raise self.fail(opened, f"syntax error: expected `{value}` for the block opened on this line")
        self.i += 1
        return tok

    def _redirects(self) -> None:
        while True:
            tok = self.peek()
            if isinstance(tok, Op) and tok.text.lstrip("0123456789")[:1] in "<>&" and tok.text not in ("&", "&&"):
                self.i += 1
                if isinstance(self.peek(), Word):
                    self.i += 1
                continue
            return

    def command(self):
        """One command; compound commands (if, loops, groups, functions) nest at most MAX_NESTING deep."""
        self.nesting += 1
        try:
            if self.nesting > MAX_NESTING:
                tok = self.peek()
                raise self.fail(getattr(tok, "line", 1), f"commands nested more than {MAX_NESTING} deep")
            return self._command()
        finally:
            self.nesting -= 1

    def _command(self):
        tok = self.peek()
        if tok is None:
            raise self.fail(self.toks[-1].line if self.toks else 1, "syntax error: unexpected end of script")
        if isinstance(tok, ArithCmd):
            self.i += 1
            self._redirects()
            return Arith(tok.expr, tok.line)
        if isinstance(tok, Word):
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
                return Loop(w, cond, None, None, body, tok.line, end.line, src=self.src)
            if w == "for":
                return self._for()
            if w == "case":
                return self._case()
            if w == "{":
                self.i += 1
                body = self.compound_list(("}",))
                self._expect_word("}", tok.line)
                self._redirects()
                return Group(body, False, tok.line)
            if w == "[[":
                return self._cond()
            if w == "function":
                self.i += 1
                name = self.peek()
                if not isinstance(name, Word):
                    raise self.fail(tok.line, "syntax error: `function` needs a name")
                self.i += 1
                if self._is_op(self.peek(), "(") and self._is_op(self.toks[self.i + 1] if self.i + 1 < len(self.toks) else None, ")"):
                    self.i += 2
                self.skip_newlines()
                return Func(name.raw, [self.command()], tok.line)
            nxt = self.toks[self.i + 1] if self.i + 1 < len(self.toks) else None
            nxt2 = self.toks[self.i + 2] if self.i + 2 < len(self.toks) else None
            if NAME_RE.fullmatch(w.replace("-", "_").replace(".", "_") or "-") and self._is_op(nxt, "(") and self._is_op(nxt2, ")"):
                self.i += 3
                self.skip_newlines()
                return Func(w, [self.command()], tok.line)
        if self._is_op(tok, "("):
            self.i += 1
            body = self.compound_list(())
            if not self._is_op(self.peek(), ")"):
                raise self.fail(tok.line, "syntax error: ( is not closed with )")
            self.i += 1
            self._redirects()
            return Group(body, True, tok.line)
        return self._simple()

    def _simple(self) -> Simple:
        assigns: list = []
        words: list[Word] = []
        redirects: list[Redirect] = []
        first = self.peek()
        line = getattr(first, "line", 0)
        pos = getattr(first, "pos", 0)
        while True:
            tok = self.peek()
            if tok is None:
                break
            if isinstance(tok, Op):
                if tok.text in ("\n", ";", "&", "&&", "||", "|", "|&", ")", ";;", ";&", ";;&", "("):
                    break
                self.i += 1  # a redirection: its target word follows
                target = self.peek() if isinstance(self.peek(), Word) else None
                if target is not None:
                    self.i += 1
                redirects.append(Redirect(tok.text, None if tok.heredoc else target, tok.heredoc))
                continue
            if isinstance(tok, ArithCmd):
                break
            if not words and (isinstance(tok, ArrayAssign) or ASSIGN_RE.match(tok.raw)):
                assigns.append(tok)
                self.i += 1
                continue
            if isinstance(tok, ArrayAssign):  # `declare -a A=(...)`
                words.append(tok)  # type: ignore[arg-type]
                self.i += 1
                continue
            if not words and not assigns and tok.raw in RESERVED_END:
                break
            words.append(tok)
            self.i += 1
        if not assigns and not words:
            tok = self.peek()
            text = tok.raw if isinstance(tok, Word) else getattr(tok, "text", "end of script")
            raise self.fail(line or getattr(tok, "line", 1), f"syntax error near unexpected token `{text.strip() or 'newline'}`")
        return Simple(assigns, words, line, pos, self.src, redirects)

    def _if(self) -> If:
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
            return If(arms, orelse, start.line, end.line, self.src)

    def _for(self) -> Loop:
        start = self.peek()
        self.i += 1
        tok = self.peek()
        if isinstance(tok, ArithCmd):
            self.i += 1
            pieces = tok.expr.split(";")
            if len(pieces) != 3:
                raise self.fail(start.line, "syntax error: for (( init; condition; step ))")
            self.skip_newlines()
            self._expect_word("do", start.line)
            body = self.compound_list(("done",))
            end = self._expect_word("done", start.line)
            return Loop("cfor", None, None, None, body, start.line, end.line, arith=tuple(pieces), src=self.src)  # type: ignore[arg-type]
        if not isinstance(tok, Word) or not NAME_RE.fullmatch(tok.raw):
            raise self.fail(start.line, "syntax error: `for` needs a variable name")
        var = tok.raw
        self.i += 1
        items: list[Word] | None = None
        while self._is_op(self.peek(), "\n"):
            self.i += 1
        if self._is_word(self.peek(), "in"):
            self.i += 1
            items = []
            while isinstance(self.peek(), Word) and not self._is_word(self.peek(), "do"):
                items.append(self.peek())
                self.i += 1
        self.skip_newlines()
        self._expect_word("do", start.line)
        body = self.compound_list(("done",))
        end = self._expect_word("done", start.line)
        self._redirects()
        return Loop("for", None, var, items, body, start.line, end.line, src=self.src)

    def _case(self) -> Case:
        start = self.peek()
        self.i += 1
        word = self.peek()
        if not isinstance(word, Word):
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
                return Case(word, arms, start.line, self.src)
            if self._is_op(tok, "("):
                self.i += 1
            patterns: list[Word] = []
            while True:
                tok = self.peek()
                if not isinstance(tok, Word):
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

    def _cond(self) -> Cond:
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
        return Cond(items, start.line, self.text[start.pos : end_pos] if self.src == 0 else "[[ ... ]]")


def parse(text: str, path: str | None, src: int, line_offset: int = 0, stray: list[int] | None = None) -> list:
    """The syntax tree of `text` (src: which text it is, 0 = the script itself; line_offset: for
    a string from line N of a file, so that errors name that line); the lines with a stray `\\ `
    are added to `stray`."""
    lexer = Lexer(text, path, line_offset)
    tokens = lexer.tokens()
    if stray is not None:
        stray.extend(lexer.stray_escapes)
    return Parser(tokens, path, src, text).program()
