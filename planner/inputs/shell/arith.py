"""bash's integer arithmetic for the launcher-script reader: 64-bit wrap-around, without eval."""

from __future__ import annotations

import ast
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
