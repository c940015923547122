"""Bug injection: tasks made from real packages and their own test suites.

:func:`find_mutations` lists small semantic changes to the functions of a
module (found with :mod:`ast`, applied as text edits so that the diff stays a
one-line change): arithmetic operator swaps, comparison flips, ``and``/``or``
swaps, off-by-one integer constants, ``True``/``False`` flips, dropped
``not`` and unary minus, swapped ``if``/``else`` branches and conditional
expressions, ``break``/``continue`` swaps and augmented-assignment swaps.

:func:`make_bug_tasks` runs the package's test suite in a sandbox on the
original source (the passing tests are the baseline), then on mutants, and
keeps a mutant when some baseline tests fail (``FAIL_TO_PASS``) but not too
many, and the failure reproduces. The result is a bug-task file
(:mod:`.tasks`): one package record, then one record per task with the bug as
a patch. ``sao-gym tasks make-code-repo --package NAME`` is the command line.
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import logging
import random
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sao_gym.envs.code_repo import grading
from sao_gym.envs.code_repo.packages import PackageSource
from sao_gym.envs.code_repo.tasks import unified_diff

logger = logging.getLogger(__name__)

_BINOPS = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "/"),
           ast.Div: ("/", "*"), ast.FloorDiv: ("//", "/"), ast.Mod: ("%", "//"),
           ast.Pow: ("**", "*"), ast.LShift: ("<<", ">>"), ast.RShift: (">>", "<<"),
           ast.BitAnd: ("&", "|"), ast.BitOr: ("|", "&"), ast.BitXor: ("^", "&")}
_CMPOPS = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="),
           ast.GtE: (">=", ">"), ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="),
           ast.In: ("in", "not in"), ast.NotIn: ("not in", "in"), ast.Is: ("is", "is not"),
           ast.IsNot: ("is not", "is")}
_AUGOPS = {ast.Add: ("+=", "-="), ast.Sub: ("-=", "+=")}


@dataclass(frozen=True)
class Mutation:
    """One mutant of a module."""

    path: str
    function: str
    """Qualified name of the mutated function (``Class.method``)."""
    line: int
    kind: str
    """``binop``, ``compare``, ``boolop``, ``constant``, ``bool``, ``not``, ``negate``,
    ``if_else``, ``ifexp``, ``loop_control`` or ``augassign``."""
    description: str
    source: str
    """The whole mutated module."""


class _Source:
    """A module's text with (line, column) <-> offset maps (columns are UTF-8 bytes)."""

    def __init__(self, text: str):
        self.text = text
        self.data = text.encode("utf-8")
        self.starts = [0]
        for i, byte in enumerate(self.data):
            if byte == 0x0A:
                self.starts.append(i + 1)

    def off(self, lineno: int, col: int) -> int:
        return self.starts[lineno - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (self.off(node.lineno, node.col_offset),
                self.off(node.end_lineno, node.end_col_offset))

    def get(self, a: int, b: int) -> str:
        return self.data[a:b].decode("utf-8")

    def edit(self, edits: Sequence[tuple[int, int, str]]) -> str:
        data = self.data
        for a, b, new in sorted(edits, reverse=True):
            data = data[:a] + new.encode("utf-8") + data[b:]
        return data.decode("utf-8")


def _gap_op(src: _Source, a: int, b: int, symbol: str) -> tuple[int, int] | None:
    """Where ``symbol`` sits in the text between two operands (None when unclear)."""
    gap = src.get(a, b)
    cleaned = re.sub(r"[\s()\\]+", " ", gap).strip()
    if cleaned != symbol:
        return None
    words = symbol.split()
    pattern = r"\s+".join(re.escape(w) for w in words)
    matches = list(re.finditer(pattern, gap))
    if len(matches) != 1:
        return None
    start = a + len(gap[:matches[0].start()].encode("utf-8"))
    return start, start + len(matches[0].group(0).encode("utf-8"))


def _describe(kind: str, old: str, new: str) -> str:
    old, new = old.strip(), new.strip()
    if kind == "if_else":
        return "swapped the if and else branches"
    if kind == "ifexp":
        return "swapped the branches of a conditional expression"
    if kind in ("not", "negate"):
        return f"dropped `{old}`"
    return f"`{old}` -> `{new}`"


class _Finder(ast.NodeVisitor):
    def __init__(self, src: _Source, path: str):
        self.src, self.path = src, path
        self.stack: list[str] = []
        self.in_function = 0
        self.found: list[tuple[str, int, str, list[tuple[int, int, str]], str]] = []

    # -- scopes --
    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.stack.append(node.name)
        for stmt in node.body:
            self.visit(stmt)
        self.stack.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.stack.append(node.name)
        self.in_function += 1
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:]  # the docstring
        for stmt in body:
            self.visit(stmt)
        self.in_function -= 1
        self.stack.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def add(self, node: ast.AST, kind: str, edits: list[tuple[int, int, str]],
            description: str) -> None:
        if self.in_function:
            self.found.append((".".join(self.stack), node.lineno, kind, edits, description))

    # -- mutation sites --
    def visit_BinOp(self, node: ast.BinOp) -> None:
        ops = _BINOPS.get(type(node.op))
        if ops:
            where = _gap_op(self.src, self.src.span(node.left)[1], self.src.span(node.right)[0],
                            ops[0])
            if where:
                self.add(node, "binop", [(*where, ops[1])], _describe("binop", *ops))
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        operands = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            ops = _CMPOPS.get(type(op))
            if not ops:
                continue
            where = _gap_op(self.src, self.src.span(operands[i])[1],
                            self.src.span(operands[i + 1])[0], ops[0])
            if where:
                self.add(node, "compare", [(*where, ops[1])], _describe("compare", *ops))
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        where = _gap_op(self.src, self.src.span(node.values[0])[1],
                        self.src.span(node.values[1])[0], old)
        if where:
            self.add(node, "boolop", [(*where, new)], _describe("boolop", old, new))
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        ops = _AUGOPS.get(type(node.op))
        if ops:
            where = _gap_op(self.src, self.src.span(node.target)[1],
                            self.src.span(node.value)[0], ops[0])
            if where:
                self.add(node, "augassign", [(*where, ops[1])], _describe("augassign", *ops))
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        a, b = self.src.span(node)
        text = self.src.get(a, b)
        if isinstance(node.value, bool):
            self.add(node, "bool", [(a, b, str(not node.value))],
                     _describe("bool", text, str(not node.value)))
        elif isinstance(node.value, int) and text.isdigit():
            for new in (node.value + 1, node.value - 1):
                if new >= 0:
                    self.add(node, "constant", [(a, b, str(new))],
                             _describe("constant", text, str(new)))

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        a, b = self.src.span(node)
        oa, ob = self.src.span(node.operand)
        prefix = self.src.get(a, oa)
        if isinstance(node.op, ast.Not) and re.fullmatch(r"not\s*", prefix):
            self.add(node, "not", [(a, oa, "")], _describe("not", "not", ""))
        elif isinstance(node.op, ast.USub) and prefix == "-" and not isinstance(
                node.operand, ast.Constant):
            self.add(node, "negate", [(a, oa, "")], _describe("negate", "-", ""))
        self.generic_visit(node)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        ba, bb = self.src.span(node.body)
        ea, eb = self.src.span(node.orelse)
        body, orelse = self.src.get(ba, bb), self.src.get(ea, eb)
        if body != orelse:
            self.add(node, "ifexp", [(ba, bb, orelse), (ea, eb, body)],
                     _describe("ifexp", "", ""))
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        edit = self._swap_if_else(node)
        if edit:
            self.add(node, "if_else", edit, _describe("if_else", "", ""))
        self.generic_visit(node)

    def _swap_if_else(self, node: ast.If) -> list[tuple[int, int, str]] | None:
        if not node.orelse or (len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If)
                               and node.orelse[0].col_offset == node.col_offset + 0
                               and self._is_elif(node.orelse[0])):
            return None
        body_first, body_last = node.body[0].lineno, node.body[-1].end_lineno
        else_first, else_last = node.orelse[0].lineno, node.orelse[-1].end_lineno
        lines = self.src.text.splitlines(keepends=True)
        if node.lineno == body_first or body_last >= else_first:
            return None
        else_lines = [i for i in range(body_last, else_first - 1)
                      if lines[i].strip() and not lines[i].strip().startswith("#")]
        if len(else_lines) != 1 or lines[else_lines[0]].strip() != "else:":
            return None
        indent = lambda s: len(s) - len(s.lstrip())  # noqa: E731
        if indent(lines[body_first - 1]) != indent(lines[else_first - 1]):
            return None
        a_body = self.src.starts[body_first - 1]
        b_body = self.src.starts[body_last] if body_last < len(self.src.starts) else len(
            self.src.data)
        a_else = self.src.starts[else_first - 1]
        b_else = self.src.starts[else_last] if else_last < len(self.src.starts) else len(
            self.src.data)
        body_text, else_text = self.src.get(a_body, b_body), self.src.get(a_else, b_else)
        if not body_text.endswith("\n") or not else_text.endswith("\n") or \
                body_text.strip() == else_text.strip():
            return None
        return [(a_body, b_body, else_text), (a_else, b_else, body_text)]

    def _is_elif(self, inner: ast.If) -> bool:
        line = self.src.text.splitlines()[inner.lineno - 1]
        return line.lstrip().startswith("elif")

    def visit_Break(self, node: ast.Break) -> None:
        a, b = self.src.span(node)
        self.add(node, "loop_control", [(a, b, "continue")], "`break` -> `continue`")

    def visit_Continue(self, node: ast.Continue) -> None:
        a, b = self.src.span(node)
        self.add(node, "loop_control", [(a, b, "break")], "`continue` -> `break`")

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        return  # positions inside f-strings are unreliable before Python 3.12


def find_mutations(path: str, source: str) -> list[Mutation]:
    """Every mutant of the functions in one module (each still parses)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    src = _Source(source)
    finder = _Finder(src, path)
    finder.visit(tree)
    out = []
    for function, line, kind, edits, description in finder.found:
        mutated = src.edit(edits)
        if mutated == source:
            continue
        try:
            ast.parse(mutated)
        except SyntaxError:
            continue
        out.append(Mutation(path, function, line, kind, description, mutated))
    return out


# ----- making tasks ---------------------------------------------------------------------------
@dataclass
class MakeStats:
    """What :func:`make_bug_tasks` tried and kept."""

    candidates: int = 0
    tried: int = 0
    kept: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    baseline_tests: int = 0
    seconds_per_run: float = 0.0


def _interleave(mutations: list[Mutation], rng: random.Random) -> Iterator[Mutation]:
    """Mutations shuffled, one function at a time (round robin), for variety."""
    by_function: dict[tuple[str, str], list[Mutation]] = {}
    for m in mutations:
        by_function.setdefault((m.path, m.function), []).append(m)
    groups = list(by_function.values())
    for group in groups:
        rng.shuffle(group)
    rng.shuffle(groups)
    while groups:
        for group in list(groups):
            yield group.pop()
            if not group:
                groups.remove(group)


async def make_bug_tasks(
    package: PackageSource,
    *,
    max_tasks: int = 20,
    seed: int = 0,
    sandbox: str | Mapping[str, Any] = "local",
    max_tries: int | None = None,
    max_fail_fraction: float = 0.5,
    per_function: int = 2,
    timeout_per_test: float = 5.0,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[dict[str, Any]], MakeStats]:
    """Validated bug-injection tasks for ``package`` (records of a bug-task file).

    The first record is the package's; each task record carries ``id``,
    ``bug_patch`` (original -> buggy), ``FAIL_TO_PASS`` and where the bug is.
    A mutant is kept when 1 to ``max_fail_fraction`` of the baseline tests fail
    on it, the run did not time out, and a second run fails the same tests; at
    most ``per_function`` mutants of one function are kept.
    """
    from sao_gym.sandbox import make_sandbox

    if max_tasks < 1:
        raise ValueError(f"max_tasks must be >= 1, got {max_tasks}")
    if not 0 < max_fail_fraction <= 1:
        raise ValueError(f"max_fail_fraction must be in (0, 1], got {max_fail_fraction}")
    say = progress or (lambda msg: logger.info("%s", msg))
    rng = random.Random(seed)
    stats = MakeStats()
    mutations = [m for path in package.source_files
                 for m in find_mutations(path, package.files[path])]
    stats.candidates = len(mutations)
    sb = make_sandbox(sandbox)
    async with sb:
        root = sb.workdir
        for path, text in package.files.items():
            await sb.write_file(path, text)
        base = await grading.run_builtin(sb, root, package.test_files, timeout_s=600,
                                         timeout_per_test=max(timeout_per_test, 30.0))
        baseline = [t for t, o in base.outcomes.items() if o in grading.PASSING]
        if not baseline:
            raise ValueError(f"{package.name}: no test passes on the original source "
                             f"({base.summary(2000)})")
        stats.baseline_tests = len(baseline)
        stats.seconds_per_run = base.duration_s
        say(f"{package.name} {package.version}: {len(baseline)} passing tests "
            f"({base.duration_s:.2f} s per run), {len(mutations)} candidate mutations")
        run_timeout = max(30.0, 5 * base.duration_s + 10)
        baseline_set = set(baseline)
        per_fn: dict[tuple[str, str], int] = {}
        records: list[dict[str, Any]] = [package.record(baseline)]
        seen_ids: set[str] = set()

        def reject(reason: str) -> None:
            stats.rejected[reason] = stats.rejected.get(reason, 0) + 1

        for m in _interleave(mutations, rng):
            if stats.kept >= max_tasks or (max_tries is not None and stats.tried >= max_tries):
                break
            key = (m.path, m.function)
            if per_fn.get(key, 0) >= per_function:
                continue
            stats.tried += 1
            await sb.write_file(m.path, m.source)
            try:
                run = await grading.run_builtin(sb, root, package.test_files,
                                                timeout_s=run_timeout,
                                                timeout_per_test=timeout_per_test)
                f2p = [t for t in baseline if run.outcomes.get(t) not in grading.PASSING]
                if run.timed_out:
                    reject("timed out")
                    continue
                if not f2p:
                    reject("no test fails")
                    continue
                if len(f2p) > max_fail_fraction * len(baseline):
                    reject("too many tests fail")
                    continue
                # The grader runs the whole suite in this order: the failures must recur.
                again = await grading.run_builtin(sb, root, package.test_files,
                                                  timeout_s=run_timeout,
                                                  timeout_per_test=timeout_per_test)
                if [t for t in baseline if again.outcomes.get(t) not in grading.PASSING] != f2p:
                    reject("flaky")
                    continue
            finally:
                await sb.write_file(m.path, package.files[m.path])
            patch = unified_diff(m.path, package.files[m.path], m.source)
            digest = hashlib.sha1(patch.encode()).hexdigest()[:6]
            task_id = f"{package.name}/{m.function}-{digest}"
            if task_id in seen_ids:
                reject("duplicate")
                continue
            seen_ids.add(task_id)
            per_fn[key] = per_fn.get(key, 0) + 1
            stats.kept += 1
            assert set(f2p) <= baseline_set
            records.append({"kind": "task", "id": task_id, "package": package.name,
                            "file": m.path, "function": m.function, "line": m.line,
                            "mutation": f"{m.kind}: {m.description}", "bug_patch": patch,
                            "FAIL_TO_PASS": f2p})
            say(f"  kept {task_id} ({m.kind}: {m.description}, line {m.line}): "
                f"{len(f2p)} failing test(s)")
    return records, stats


def make_bug_tasks_sync(package: PackageSource, **kwargs: Any) -> tuple[list[dict], MakeStats]:
    """:func:`make_bug_tasks` from synchronous code."""
    return asyncio.run(make_bug_tasks(package, **kwargs))
