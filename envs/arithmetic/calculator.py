"""A safe evaluator for arithmetic expressions (no ``eval``).

Supports integers and decimals, ``+ - * / // % **`` and parentheses, with
bounds on length, exponent size and result magnitude so hostile input
cannot hang or exhaust the process.
"""

from __future__ import annotations

import ast
import operator
import warnings
from fractions import Fraction

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10**30

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def evaluate(expression: str) -> Fraction:
    """Evaluate ``expression`` exactly; raises ``ValueError`` with a reason."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        with warnings.catch_warnings():  # e.g. "invalid decimal literal" for "1x"
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError) as e:
        raise ValueError(f"cannot parse expression: {e.msg if hasattr(e, 'msg') else e}") from None
    return _eval(tree.body)


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            if right.denominator != 1 or abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponents must be integers with |n| <= {MAX_EXPONENT}")
            if left == 0 and right < 0:
                raise ValueError("division by zero")
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ValueError("division by zero")
        value = _BINARY[type(node.op)](left, right)
        value = Fraction(value)
        if abs(value) > MAX_MAGNITUDE:
            raise ValueError("result too large")
        return value
    raise ValueError(f"unsupported syntax: {type(node).__name__}")


def format_number(value: Fraction) -> str:
    """Integers as integers, other values as decimals (up to 10 places)."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.10g}"
