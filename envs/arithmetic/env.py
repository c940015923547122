"""``sao_gym/Arithmetic-v0``: multi-turn arithmetic with a calculator tool.

The agent sees a question such as "What is 37 + 12 * 4?", may call
``calculator(expression)`` any number of times and ends the episode with
``submit(answer)``: reward 1 for the exact answer, 0 otherwise. Episodes are
short and regular so that small models can learn them.

Tasks are generated from ``np_random`` (so ``reset(seed=...)`` picks them)
with a difficulty set by ``num_operands`` and ``max_value``, both settable
at construction or per reset through ``options``; ``options={"task":
{"expression": "2+3"}}`` fixes the task.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from sao_gym.envs.arithmetic.calculator import evaluate, format_number
from sao_gym.tools import ToolEnv, ToolResult, tool
from sao_gym.types import Message

SYSTEM_PROMPT = (
    "Solve the arithmetic problem. Use the calculator tool if needed, "
    "then call submit with the final answer."
)


class ArithmeticEnv(ToolEnv):
    """Arithmetic questions answered with ``calculator`` and ``submit`` tools."""

    def __init__(
        self,
        *,
        num_operands: int = 2,
        max_value: int = 20,
        operators: str = "+-*",
    ):
        super().__init__()
        _check_difficulty(num_operands, max_value, operators)
        self.num_operands = num_operands
        self.max_value = max_value
        self.operators = operators
        self.task: dict[str, Any] | None = None

    async def on_reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        """Pick a task (from ``options["task"]`` or the seeded generator)."""
        if "task" in options:
            self.task = self._task_from(options["task"])
        else:
            n = int(options.get("num_operands", self.num_operands))
            m = int(options.get("max_value", self.max_value))
            ops = str(options.get("operators", self.operators))
            _check_difficulty(n, m, ops)
            self.task = self._task_from({"expression": self._generate(n, m, ops)})
        obs: list[Message] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": self.task["prompt"]},
        ]
        return obs, {"task_id": self.task["id"]}

    def _generate(self, n: int, m: int, ops: str) -> str:
        rng = self.np_random
        parts = [str(int(rng.integers(0, m + 1)))]
        for _ in range(n - 1):
            parts += [ops[int(rng.integers(0, len(ops)))], str(int(rng.integers(0, m + 1)))]
        return " ".join(parts)

    @staticmethod
    def _task_from(task: Any) -> dict[str, Any]:
        if not isinstance(task, dict) or not isinstance(task.get("expression"), str):
            raise ValueError('options["task"] must be a dict with an "expression" string')
        expression = task["expression"]
        answer = format_number(evaluate(expression))
        return {
            "id": task.get("id", f"arithmetic:{expression.replace(' ', '')}"),
            "prompt": task.get("prompt", f"What is {expression}?"),
            "expression": expression,
            "answer": task.get("answer", answer),
        }

    @tool(
        description="Evaluate an arithmetic expression with + - * / // % ** and parentheses.",
        parameters={
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. (3 + 4) * 5"}},
            "required": ["expression"],
            "additionalProperties": False,
        },
    )
    async def calculator(self, expression: str) -> str:
        """Evaluate an expression."""
        return format_number(evaluate(expression))

    @tool(
        description="Submit the final answer. This ends the episode.",
        parameters={
            "type": "object",
            "properties": {"answer": {"type": ["string", "number"], "description": "e.g. 42"}},
            "required": ["answer"],
            "additionalProperties": False,
        },
    )
    async def submit(self, answer: str | int | float) -> ToolResult:
        """Check the answer and end the episode."""
        assert self.task is not None
        correct = _same_number(answer, self.task["answer"])
        return ToolResult(
            "Correct." if correct else "Incorrect.",
            terminated=True,
            reward=1.0 if correct else 0.0,
            info={"reward_components": {"correct": float(correct)}},
        )


def _same_number(given: Any, expected: str) -> bool:
    try:
        text = str(given).strip().replace(",", "")
        return abs(Fraction(text) - Fraction(expected)) <= Fraction(1, 10**6)
    except (ValueError, ZeroDivisionError, OverflowError):
        return False


def _check_difficulty(num_operands: int, max_value: int, operators: str) -> None:
    if not 1 <= num_operands <= 16:
        raise ValueError(f"num_operands must be in [1, 16], got {num_operands}")
    if not 1 <= max_value <= 10**6:
        raise ValueError(f"max_value must be in [1, 10**6], got {max_value}")
    if not operators or set(operators) - set("+-*"):
        raise ValueError(f"operators must be a non-empty subset of '+-*', got {operators!r}")
