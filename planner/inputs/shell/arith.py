"""bash's integer arithmetic for the launcher-script reader: 64-bit wrap-around, without eval."""

from __future__ import annotations

import ast
import functools
import operator
import re
import warnings
from typing import Callable

MAX_ARITH_CHARS = 4096


# --------------------------------------------------------------------------------------------
# Arithmetic: bash's 64-bit integer arithmetic, without eval
# --------------------------------------------------------------------------------------------
def _wrap64(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


Lookup = Callable[[str], int]


def _no_names(name: str) -> int:
    raise ValueError("unsupported arithmetic")


_BINARY: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_, ast.BitXor: operator.xor,
    ast.LShift: lambda x, y: x << (y & 63), ast.RShift: lambda x, y: x >> (y & 63),
}  # fmt: skip
_COMPARE: dict[type, Callable[[int, int], bool]] = {
    ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}  # fmt: skip


def _binary(op: ast.operator, a: int, b: int) -> int:
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
    fn = _BINARY.get(type(op))
    if fn is None:
        raise ValueError("unsupported arithmetic")
    return _wrap64(fn(a, b))


def _arith_value(node: ast.AST, lookup: Lookup = _no_names) -> int:
    kind = type(node)
    if kind is ast.BinOp:
        return _binary(node.op, _arith_value(node.left, lookup), _arith_value(node.right, lookup))
    if kind is ast.Name:
        return _wrap64(lookup(node.id))
    if kind is ast.Constant and type(node.value) is int:
        return _wrap64(node.value)
    if kind is ast.Expression:
        return _arith_value(node.body, lookup)
    if kind is ast.UnaryOp:
        v = _arith_value(node.operand, lookup)
        unary = {ast.USub: lambda: _wrap64(-v), ast.UAdd: lambda: v, ast.Invert: lambda: _wrap64(~v),
                 ast.Not: lambda: int(not v)}.get(type(node.op))
        if unary is not None:
            return unary()
    if kind is ast.IfExp:
        return _arith_value(node.body, lookup) if _arith_value(node.test, lookup) else _arith_value(node.orelse, lookup)
    if kind is ast.BoolOp:
        vals = node.values
        if isinstance(node.op, ast.And):
            return int(all(_arith_value(v, lookup) for v in vals))
        return int(any(_arith_value(v, lookup) for v in vals))
    if kind is ast.Compare:
        left = _arith_value(node.left, lookup)
        for op, comp in zip(node.ops, node.comparators):
            right = _arith_value(comp, lookup)
            fn = _COMPARE.get(type(op))
            if fn is None:
                raise ValueError("unsupported comparison")
            if not fn(left, right):
                return 0
            left = right
        return 1
    raise ValueError("unsupported arithmetic")


@functools.lru_cache(maxsize=4096)
def _compiled(text: str, names: bool) -> ast.Expression:
    """The expression as a Python AST (bash's ?:, &&, ||, !, hex and octal rewritten); `names`:
    variable names stay names (looked up when evaluated)."""
    if text.count("?") == 1 and text.count(":") == 1 and text.index("?") < text.index(":"):
        cond, rest = text.split("?")
        yes, no = rest.split(":")  # a ? b : c (one level, as launch scripts use it)
        text = f"(({yes}) if ({cond}) else ({no}))"
    text = re.sub(r"&&", " and ", text)
    text = re.sub(r"\|\|", " or ", text)
    text = re.sub(r"!(?!=)", " not ", text)
    if re.search(r"[^\s0-9A-Za-z_+\-*/%<>=!&|^~()]", text) or (not names and re.search(
            r"\b(?!and\b|or\b|not\b|if\b|else\b)[A-Za-z_]\w*", re.sub(r"\b0x[0-9a-fA-F]+", "", text))):
        raise ValueError("unsupported arithmetic")
    text = re.sub(r"\b0x[0-9a-fA-F]+\b", lambda m: str(int(m.group(0), 16)), text)
    text = re.sub(r"\b0([0-7]+)\b", lambda m: str(int(m.group(1), 8)), text)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "1a" and friends: a SyntaxWarning before the error
            return ast.parse(text, mode="eval")
    except (SyntaxError, RecursionError, MemoryError, ValueError):
        raise ValueError("unsupported arithmetic") from None


def eval_arith(expr: str, lookup: Lookup | None = None) -> int:
    """Evaluate a bash arithmetic expression; its variables are integers already, or names that
    `lookup` gives the values of.  Raises ValueError (too long, unsupported syntax, division by zero).
    The parsed expression is cached, so a loop re-evaluates it without parsing."""
    if len(expr) > MAX_ARITH_CHARS:
        raise ValueError(f"arithmetic longer than {MAX_ARITH_CHARS} characters")
    text = expr.strip()
    if not text:
        return 0
    tree = _compiled(text, lookup is not None)
    try:
        return _arith_value(tree, lookup or _no_names)
    except RecursionError:
        raise ValueError("arithmetic nested too deep") from None
