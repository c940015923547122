"""Parsing untrusted answer text safely: a whitelist sympy parser and a screen for scorers.

:func:`safe_sympify` turns Python-style math (``2**10``, ``3*pi``,
``sqrt(2)/2``, simple LaTeX fractions) into sympy objects through a
whitelist of syntax, never ``eval``. :func:`screen_for_scorer` refuses
answers that a generator's own ``score_answer`` (which may ``eval``) should
not see. Both are used by :mod:`sao_gym.envs.math_tir.verify`.
"""

from __future__ import annotations

import ast
import builtins
import re
from typing import Any

MAX_ANSWER_CHARS = 2000
"""Longer answers are not graded (they score 0)."""

# ---------------------------------------------------------------------------------------------
# sympy fallback: a whitelist parser (no eval)
# ---------------------------------------------------------------------------------------------
_MAX_SYMPY_CHARS = 500
_MAX_EXPONENT = 1000
_FUNCTIONS = ("sqrt", "exp", "log", "ln", "sin", "cos", "tan", "asin", "acos", "atan",
              "abs", "Abs", "factorial", "binomial", "floor", "ceiling", "Rational", "root")
_CONSTANTS = ("pi", "E", "I", "oo", "inf", "infinity")
_LATEX_REPLACEMENTS = (
    (r"\left", ""), (r"\right", ""), (r"\cdot", "*"), (r"\times", "*"), ("×", "*"),
    ("·", "*"), ("÷", "/"), ("−", "-"), (r"\pi", "pi"), ("π", "pi"), (r"\infty", "oo"),
    ("^", "**"), ("{", "("), ("}", ")"), (r"\sqrt", "sqrt"), ("$", ""), (r"\!", ""),
    (r"\,", ""),
)
_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")


def _sympy_tables() -> tuple[dict[str, Any], dict[str, Any]]:
    import sympy

    functions = {
        "sqrt": sympy.sqrt, "exp": sympy.exp, "log": sympy.log, "ln": sympy.log,
        "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan, "asin": sympy.asin,
        "acos": sympy.acos, "atan": sympy.atan, "abs": sympy.Abs, "Abs": sympy.Abs,
        "factorial": sympy.factorial, "binomial": sympy.binomial, "floor": sympy.floor,
        "ceiling": sympy.ceiling, "Rational": sympy.Rational, "root": sympy.root,
    }
    constants = {"pi": sympy.pi, "E": sympy.E, "I": sympy.I, "oo": sympy.oo, "inf": sympy.oo,
                 "infinity": sympy.oo}
    return functions, constants


def _normalize_for_sympy(text: str) -> str:
    text = text.strip()
    inner = extract_boxed(text)
    if inner is not None:
        text = inner
    for _ in range(8):  # nested \frac{}{}: innermost first
        new = _FRAC_RE.sub(r"((\1)/(\2))", text)
        if new == text:
            break
        text = new
    for old, new in _LATEX_REPLACEMENTS:
        text = text.replace(old, new)
    return text.strip().rstrip(".")


def safe_sympify(text: str) -> Any | None:
    r"""Parse a Python-style or simple LaTeX math expression into sympy, or ``None``.

    Only numbers, short symbol names, ``+ - * / ** %``, tuples/lists and
    calls of a few math functions (``sqrt``, ``exp``, ``log``, trig,
    ``factorial``, ...) are accepted; the tree is converted node by node,
    never evaluated as Python. Integer exponents above 1000 are refused.

    >>> safe_sympify("2**10"), safe_sympify("sqrt(8)/2"), safe_sympify(r"\frac{3}{4}")
    (1024, sqrt(2), 3/4)
    >>> safe_sympify("__import__('os')") is None
    True
    """
    if not isinstance(text, str) or len(text) > _MAX_SYMPY_CHARS:
        return None
    source = _normalize_for_sympy(text)
    if not source:
        return None
    try:
        tree = ast.parse(source, mode="eval")
        functions, constants = _sympy_tables()
        return _convert(tree.body, functions, constants, depth=0)
    except (SyntaxError, ValueError, TypeError, ArithmeticError, RecursionError, MemoryError,
            AttributeError):
        return None
    except Exception:  # noqa: BLE001 - sympy raises many kinds of errors on odd input
        return None


def _convert(node: ast.AST, functions: dict[str, Any], constants: dict[str, Any],
             depth: int) -> Any:
    import sympy

    if depth > 50:
        raise ValueError("expression nested too deeply")
    d = depth + 1
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if isinstance(node.value, float):
            return sympy.Float(repr(node.value))
        return sympy.Integer(node.value)
    if isinstance(node, ast.Name):
        if node.id in constants:
            return constants[node.id]
        if len(node.id) <= 2 and node.id.isalpha():
            return sympy.Symbol(node.id)
        raise ValueError(f"unknown name {node.id!r}")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _convert(node.operand, functions, constants, d)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left = _convert(node.left, functions, constants, d)
        right = _convert(node.right, functions, constants, d)
        op = type(node.op)
        if op is ast.Add:
            return left + right
        if op is ast.Sub:
            return left - right
        if op is ast.Mult:
            return left * right
        if op is ast.Div:
            return left / right
        if op is ast.Pow:
            if right.is_number and (not right.is_finite or abs(right) > _MAX_EXPONENT):
                raise ValueError("exponent too large")
            return sympy.Pow(left, right)
        raise ValueError(f"unsupported operator {op.__name__}")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        fn = functions.get(node.func.id)
        if fn is None or node.keywords or not 1 <= len(node.args) <= 2:
            raise ValueError(f"unsupported call {node.func.id!r}")
        args = [_convert(a, functions, constants, d) for a in node.args]
        if fn is sympy.factorial and (not args[0].is_number or abs(args[0]) > _MAX_EXPONENT):
            raise ValueError("factorial argument too large")
        return fn(*args)
    if isinstance(node, (ast.Tuple, ast.List)) and 0 < len(node.elts) <= 32:
        return sympy.Tuple(*[_convert(e, functions, constants, d) for e in node.elts])
    raise ValueError(f"unsupported syntax {type(node).__name__}")


# ---------------------------------------------------------------------------------------------
# screening answers before a generator's own scorer sees them
# ---------------------------------------------------------------------------------------------
_FORBIDDEN_CHARS = set("_'\"`@#;&|~")
_IDENTIFIER_RE = re.compile(r"[A-Za-z][A-Za-z0-9]*")
_CALL_RE = re.compile(r"([A-Za-z][A-Za-z0-9]*|[)\]}])[\s\\]*\(")
_ATTRIBUTE_RE = re.compile(r"\.\s*[A-Za-z]")
_SAFE_NAMES = frozenset(_FUNCTIONS) | frozenset(_CONSTANTS) | {"True", "False", "None"}


def _dangerous_names() -> frozenset[str]:
    names = {n for n in dir(builtins) if not n.startswith("_")}
    names |= {"lambda", "import", "exec", "eval", "compile", "open", "getattr", "setattr",
              "sympify", "parse", "expr", "lambdify", "preview", "var", "symbols", "S",
              "system", "popen", "subprocess", "os", "sys", "globals", "locals"}
    return frozenset(n for n in names if len(n) > 1 or n == "S") - _SAFE_NAMES


_DANGEROUS = _dangerous_names()


def screen_for_scorer(answer: str) -> str | None:
    """Why ``answer`` must not reach an ``eval``-based scorer, or ``None`` if it may.

    Refuses quotes (strings) and underscores, attribute access, ``:=`` and
    ``lambda``, names of Python builtins, and any call except of math
    functions (``sqrt(2)``). What remains cannot call arbitrary code when a
    scorer evaluates it (its time and memory stay bounded by the worker).

    >>> screen_for_scorer("94*4 - 61 - 6") is None
    True
    >>> screen_for_scorer("__import__('os').system('x')")
    'forbidden character'
    >>> screen_for_scorer("exec(chr(95))")
    "forbidden name 'exec'"
    """
    if len(answer) > MAX_ANSWER_CHARS:
        return "too long"
    if any(c in _FORBIDDEN_CHARS or (ord(c) < 32 and c not in "\n\t") for c in answer):
        return "forbidden character"
    if ":=" in answer:
        return "assignment expression"
    if _ATTRIBUTE_RE.search(answer):
        return "attribute access"
    for name in _IDENTIFIER_RE.findall(answer):
        if name in _DANGEROUS:
            return f"forbidden name {name!r}"
    for match in _CALL_RE.finditer(answer):
        if match.group(1) not in _FUNCTIONS:
            return f"call of {match.group(1)!r}"
    return None


def extract_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` (or ``\fbox{...}``) in ``text``, or ``None``.

    Braces are matched, so ``\boxed{\frac{1}{2}}`` gives ``\frac{1}{2}``.

    >>> extract_boxed(r"so the answer is \boxed{\frac{1}{2}}.")
    '\\frac{1}{2}'
    >>> extract_boxed("no box") is None
    True
    """
    if not isinstance(text, str):
        return None
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    while start >= 0:
        i = text.find("{", start)
        if i < 0:
            break
        between = text[start:i].removeprefix("\\boxed").removeprefix("\\fbox")
        if between.strip():
            break
        depth = 0
        for j in range(i, len(text)):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    return text[i + 1 : j].strip()
        break
    return None


__all__ = ["MAX_ANSWER_CHARS", "extract_boxed", "safe_sympify", "screen_for_scorer"]
