"""A scripted expert for ``sao_gym/Arithmetic-v0``, used to make demonstrations.

:func:`arithmetic_oracle` plays the two-turn solution a small model can learn
by copying alone: call the calculator on the question's expression, then
submit what the calculator answered. Both turns use the plain-text call syntax
``name(argument)`` that :func:`~sao_gym.agents.tool_parser.parse_tool_calls`
reads (and that :data:`~sao_gym.models.COMPACT_TOOLS_TEMPLATE` advertises),
because it is a third as many tokens as a JSON tool-call block.

Nothing is computed in the model's head: what is left to learn is the tool
protocol and exact copying. Two options make the demonstrator imperfect, so
that a model imitating it has something left for RL to improve:

- ``slip_rate``: on that share of the tasks the demonstrator miscopies one
  digit of the calculator's result when it submits (a sloppy teacher). A
  model trained on these demonstrations reproduces the slips at temperature
  1; reward tells RL which copies were right, and it learns to stop slipping
  (the embedded demo's warm start uses this).
- ``direct_rate``: on that share of the tasks it submits the answer at once,
  without the calculator, a habit a small model copies without the skill
  behind it; RL then learns that calling the calculator pays.

Which tasks get a slip or a direct answer is a stable hash of ``seed`` and the
task id, so the same task always gets the same demonstration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sao_gym.types import Message
from sao_gym.utils.slips import slip_digit, unit_hash


def arithmetic_oracle(
    messages: Sequence[Message],
    task: Mapping[str, Any],
    *,
    direct_rate: float = 0.0,
    slip_rate: float = 0.0,
    seed: int = 0,
) -> str:
    """Text of the next assistant turn that solves ``task``.

    ``messages`` is the conversation so far (the env's reset messages, then
    alternating assistant turns and observations). After a successful
    calculator result the oracle submits that result verbatim
    (``submit(-6)``); otherwise (first turn, or after an error) it calls the
    calculator on the task's expression (``calculator(9 - 15)``).

    With ``direct_rate`` > 0 the oracle is a mixture of two demonstrators: on
    that share of the tasks (chosen by a hash of ``seed`` and the task id, so
    the same task always gets the same choice) it submits the exact answer at
    once (``submit(-6)``), as a demonstrator that does arithmetic in its head
    would. A small model imitating the mixture copies that habit but not the
    skill behind it; RL can then learn that calling the calculator pays.

    With ``slip_rate`` > 0, on that share of the tasks (an independent hash)
    the submitted number has one digit replaced by another digit (``submit(-8)``
    after a result of ``-6``), so those demonstrations earn reward 0. Bind the
    options with ``functools.partial`` to get an ``oracle(messages, task)``.

    >>> arithmetic_oracle([{"role": "user", "content": "What is 9 - 15?"}],
    ...                   {"expression": "9 - 15"})
    'calculator(9 - 15)'
    >>> arithmetic_oracle([{"role": "tool", "name": "calculator", "content": "-6"}],
    ...                   {"expression": "9 - 15"})
    'submit(-6)'
    >>> arithmetic_oracle([{"role": "user", "content": "What is 9 - 15?"}],
    ...                   {"id": "t", "expression": "9 - 15", "answer": "-6"}, direct_rate=1.0)
    'submit(-6)'
    >>> arithmetic_oracle([{"role": "tool", "name": "calculator", "content": "-6"}],
    ...                   {"id": "t", "expression": "9 - 15"}, slip_rate=1.0) != 'submit(-6)'
    True
    """
    for name, rate in (("direct_rate", direct_rate), ("slip_rate", slip_rate)):
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {rate}")
    last = messages[-1] if messages else {}
    content = last.get("content")
    if (
        last.get("role") == "tool"
        and last.get("name") == "calculator"
        and isinstance(content, str)
        and content
        and not content.startswith("Error")
    ):
        key = f"{seed}:{task.get('id')}"
        if slip_rate > 0 and unit_hash(f"slip:{key}") < slip_rate:
            return f"submit({slip_digit(content, unit_hash(f'digit:{key}'))})"
        return f"submit({content})"
    if direct_rate > 0 and unit_hash(f"{seed}:{task['id']}") < direct_rate:
        return f"submit({task['answer']})"
    return f"calculator({task['expression']})"


__all__ = ["arithmetic_oracle"]
