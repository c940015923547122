"""A scripted expert for ``sao_gym/KeyChain-v0``, with slips, for warm starts.

:func:`key_chain_oracle` reads the last observation and copies the key it
names into the next call: ``lookup(start)`` first, ``lookup(next key)`` after
each hop and after an error (which names the current key again), and
``submit(last key)`` at the end. With ``slip_rate`` > 0 each of its turns
miscopies one digit with that probability (a stable hash of ``seed``, the
task and the turn, so a demonstration is reproducible); the env answers the
miscopy with an error and the oracle copies the key again, so slipped
demonstrations show the recovery too, and fail when the slips outrun the
turn budget (or a submission slips).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from sao_gym.types import Message
from sao_gym.utils.slips import slip_digit, unit_hash

_KEY = re.compile(r"(?:next key is|current key is|last key is|last key,) (\d+)")


def key_chain_oracle(messages: Sequence[Message], task: Mapping[str, Any], *,
                     slip_rate: float = 0.0, seed: int = 0) -> str:
    """Text of the next assistant turn for ``task`` (``env.unwrapped.task``).

    >>> task = {"id": "t", "keys": [4817, 2291, 5530]}
    >>> key_chain_oracle([{"role": "user", "content": "The start key is 4817."}], task)
    'lookup(4817)'
    >>> key_chain_oracle([{"role": "tool", "content": "Hop 1/2: the next key is 2291."}], task)
    'lookup(2291)'
    >>> key_chain_oracle([{"role": "tool", "content": "Hop 2/2: the last key is 5530. Submit it."}],
    ...                  task)
    'submit(5530)'
    """
    if not 0.0 <= slip_rate <= 1.0:
        raise ValueError(f"slip_rate must be in [0, 1], got {slip_rate}")
    last = messages[-1] if messages else {}
    content = last.get("content") if last.get("role") == "tool" else None
    found = _KEY.findall(content) if isinstance(content, str) else []
    key = found[-1] if found else str(task["keys"][0])
    name = "submit" if isinstance(content, str) and (
        "Submit it" in content or "Submit the last key" in content) else "lookup"
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    if slip_rate > 0 and unit_hash(f"slip:{seed}:{task.get('id')}:{turn}") < slip_rate:
        key = slip_digit(key, unit_hash(f"digit:{seed}:{task.get('id')}:{turn}"))
    return f"{name}({key})"


__all__ = ["key_chain_oracle"]
