"""A scripted expert for the arithmetic tasks of ``sao_gym/MathTIR-v0`` (warm-start demonstrations).

:func:`arithmetic_tool_oracle` plays the two-turn tool solution of an
arithmetic question (reasoning-gym's ``chain_sum``, ``basic_arithmetic``):
run the question's expression with the ``python`` tool, then submit what it
printed, both in the plain-text call syntax the tool parser reads
(``python(print(4 - 1))``, ``submit_answer(3)``). With ``slip_rate`` > 0 the
submitted number has one digit miscopied on that share of the tasks (a
stable hash of ``seed`` and the task id), so a model imitating the
demonstrations keeps a habit RL can remove.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from sao_gym.types import Message

_EXPR = re.compile(r"[-+*/()\d\s.]*\d[-+*/()\d\s.]*")
# Python prints tiny or huge floats in scientific notation (-3.5e-05): a number too.
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def question_expression(question: str) -> str:
    """The arithmetic expression in ``question``: its longest run of digits, operators, parens.

    >>> question_expression("State the final answer to the following arithmetic problem: 4 - 1 =")
    '4 - 1'
    >>> question_expression("Calculate -( 3 * 5 ) + 2.")
    '-( 3 * 5 ) + 2'
    """
    runs = [m.group().strip().rstrip(".").strip() for m in _EXPR.finditer(question)]
    runs = [r for r in runs if re.search(r"\d\s*[-+*/]\s*[-(\d]", r)]
    if not runs:
        raise ValueError(f"no arithmetic expression in {question!r}: this oracle only solves "
                         "arithmetic tasks (chain_sum, basic_arithmetic)")
    return max(runs, key=len)


def _hashed(seed: int, task_id: str, rate: float) -> bool:
    return zlib.crc32(f"{seed}:{task_id}".encode()) / 2**32 < rate


def _slip(number: str, seed: int, task_id: str) -> str:
    digits = [i for i, ch in enumerate(number) if ch.isdigit()]
    h = zlib.crc32(f"slip:{seed}:{task_id}".encode())
    i = digits[h % len(digits)]
    new = str((int(number[i]) + 1 + (h >> 8) % 9) % 10)
    return number[:i] + new + number[i + 1:]


def arithmetic_tool_oracle(messages: Sequence[Message], task: Mapping[str, Any], *,
                           slip_rate: float = 0.0, seed: int = 0) -> str:
    r"""Text of the next assistant turn solving an arithmetic MathTIR ``task``.

    After a ``python`` result that is a number, submit it (``slip_rate``:
    miscopy one digit); otherwise (first turn, or after an error) run the
    question's expression.

    >>> task = {"id": "t", "prompt": "Calculate 5 - 3 - 6."}
    >>> arithmetic_tool_oracle([{"role": "user", "content": task["prompt"]}], task)
    'python(print(5 - 3 - 6))'
    >>> arithmetic_tool_oracle([{"role": "tool", "name": "python", "content": "-4\n"}], task)
    'submit_answer(-4)'
    """
    if not 0.0 <= slip_rate <= 1.0:
        raise ValueError(f"slip_rate must be in [0, 1], got {slip_rate}")
    last = messages[-1] if messages else {}
    output = str(last.get("content") or "").strip()
    if last.get("role") == "tool" and last.get("name") == "python" and _NUMBER.fullmatch(output):
        task_id = str(task.get("id", ""))
        if _hashed(seed, task_id, slip_rate):
            output = _slip(output, seed, task_id)
        return f"submit_answer({output})"
    return f"python(print({question_expression(str(task['prompt']))}))"


__all__ = ["arithmetic_tool_oracle", "question_expression"]
