"""A scripted expert for ``sao_gym/Arithmetic-v0``, used to make demonstrations.

:func:`arithmetic_oracle` plays the two-turn solution a small model can learn
by copying alone: call the calculator on the question's expression, then
submit what the calculator answered. Both turns use the plain-text call syntax
``name(argument)`` that :func:`~sao_gym.agents.tool_parser.parse_tool_calls`
reads (and that :data:`~sao_gym.models.COMPACT_TOOLS_TEMPLATE` advertises),
because it is a third as many tokens as a JSON tool-call block.

Nothing is computed in the model's head: what is left to learn is the tool
protocol and exact copying, and with a short warm start (few supervised
steps) sampling at temperature 1 still copies wrongly often enough for RL to
have something to improve.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sao_gym.types import Message


def arithmetic_oracle(messages: Sequence[Message], task: Mapping[str, Any]) -> str:
    """Text of the next assistant turn that solves ``task``.

    ``messages`` is the conversation so far (the env's reset messages, then
    alternating assistant turns and observations). After a successful
    calculator result the oracle submits that result verbatim
    (``submit(-6)``); otherwise (first turn, or after an error) it calls the
    calculator on the task's expression (``calculator(9 - 15)``).

    >>> arithmetic_oracle([{"role": "user", "content": "What is 9 - 15?"}],
    ...                   {"expression": "9 - 15"})
    'calculator(9 - 15)'
    >>> arithmetic_oracle([{"role": "tool", "name": "calculator", "content": "-6"}],
    ...                   {"expression": "9 - 15"})
    'submit(-6)'
    """
    last = messages[-1] if messages else {}
    content = last.get("content")
    if (
        last.get("role") == "tool"
        and last.get("name") == "calculator"
        and isinstance(content, str)
        and content
        and not content.startswith("Error")
    ):
        return f"submit({content})"
    return f"calculator({task['expression']})"


__all__ = ["arithmetic_oracle"]
