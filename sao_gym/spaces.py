"""Gymnasium spaces for chat environments.

- :class:`ChatSpace`: observations, a list of OpenAI-format messages.
- :class:`AssistantMessageSpace`: actions, one assistant message.

``contains`` checks *structure* (roles, types, tool-call shape); whether a
tool exists or its arguments parse is for the environment to judge, so
:meth:`AssistantMessageSpace.sample` deliberately yields structurally valid
messages whose tool calls are often semantically broken (unknown tools,
invalid JSON arguments), which is what a random agent should throw at an env.
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.spaces import Space

from sao_gym.types import ROLES, Message

_ALPHABET = string.ascii_letters + string.digits + string.punctuation + " \n"


def _tool_call_problem(call: Any) -> str | None:
    if not isinstance(call, dict):
        return f"a tool call must be an object, got {type(call).__name__}"
    if call.get("type", "function") != "function":
        return "a tool call's type must be 'function'"
    if "id" in call and not isinstance(call["id"], str):
        return "a tool call's id must be a string"
    fn = call.get("function")
    if not isinstance(fn, dict):
        return "a tool call needs a 'function' object with 'name' and 'arguments'"
    if not isinstance(fn.get("name"), str):
        return "a tool call's function.name must be a string"
    if not isinstance(fn.get("arguments"), (str, dict)):
        return "a tool call's function.arguments must be a JSON string or an object"
    return None


def message_problem(msg: Any, *, roles: Sequence[str] = ROLES) -> str | None:
    """Why ``msg`` is not a valid OpenAI-format message, or ``None`` if it is."""
    if not isinstance(msg, dict):
        return f"a message must be an object (dict), got {type(msg).__name__}"
    if msg.get("role") not in roles:
        return f"role must be one of {list(roles)}, got {str(msg.get('role'))[:40]!r}"
    content = msg.get("content")
    if content is not None and not isinstance(content, str):
        return f"content must be a string or null, got {type(content).__name__}"
    if msg["role"] != "assistant" and content is None:
        return f"a {msg['role']} message needs content"
    if "tool_calls" in msg:
        calls = msg["tool_calls"]
        if msg["role"] != "assistant":
            return "only assistant messages may have tool_calls"
        if not isinstance(calls, list):
            return f"tool_calls must be a list, got {type(calls).__name__}"
        for call in calls:
            problem = _tool_call_problem(call)
            if problem:
                return problem
    if msg["role"] == "tool" and not isinstance(msg.get("tool_call_id", ""), str):
        return "tool_call_id must be a string"
    if "name" in msg and not isinstance(msg["name"], str):
        return "name must be a string"
    return None


def is_message(msg: Any, *, roles: Sequence[str] = ROLES) -> bool:
    """Whether ``msg`` is a structurally valid OpenAI-format message."""
    return message_problem(msg, roles=roles) is None


class _MessageSpaceBase(Space):
    def __init__(self, max_text_length: int = 64, seed: int | np.random.Generator | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)
        self.max_text_length = max_text_length

    @property
    def is_np_flattenable(self) -> bool:
        """Chat messages cannot be flattened into a numpy array."""
        return False

    def _text(self) -> str:
        n = int(self.np_random.integers(0, self.max_text_length + 1))
        idx = self.np_random.integers(0, len(_ALPHABET), size=n)
        return "".join(_ALPHABET[i] for i in idx)

    def _tool_call(self, i: int) -> dict[str, Any]:
        names = ("calculator", "submit", "python", "bash", "unknown_tool", "")
        name = names[int(self.np_random.integers(0, len(names)))]
        kind = int(self.np_random.integers(0, 4))
        if kind == 0:  # well-formed JSON object
            args: str | dict[str, Any] = json.dumps({"arg": self._text()})
        elif kind == 1:  # malformed JSON
            args = "{" + self._text()
        elif kind == 2:  # JSON that is not an object
            args = json.dumps([self._text(), int(self.np_random.integers(-9, 10))])
        else:  # already-decoded dict with a wrongly typed value
            args = {"expression": int(self.np_random.integers(-1000, 1000))}
        fn = {"name": name, "arguments": args}
        return {"id": f"call_{i}", "type": "function", "function": fn}

    def _assistant(self) -> Message:
        msg: Message = {"role": "assistant", "content": self._text()}
        n_calls = int(self.np_random.integers(0, 3))
        if n_calls:
            msg["tool_calls"] = [self._tool_call(i) for i in range(n_calls)]
        return msg


class AssistantMessageSpace(_MessageSpaceBase):
    """The action space: one assistant message, possibly with tool calls.

    Example:
        >>> space = AssistantMessageSpace(seed=0)
        >>> space.contains({"role": "assistant", "content": "hi"})
        True
        >>> space.contains({"role": "user", "content": "hi"})
        False
        >>> space.sample() in space
        True

    """

    def contains(self, x: Any) -> bool:
        """Whether ``x`` is a structurally valid assistant message."""
        return is_message(x, roles=("assistant",))

    def sample(self, mask: Any = None, probability: Any = None) -> Message:
        """A random assistant message; its tool calls are often broken on purpose."""
        return self._assistant()

    def __repr__(self) -> str:
        return "AssistantMessageSpace()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AssistantMessageSpace)


class ChatSpace(_MessageSpaceBase):
    """The observation space: a non-empty list of chat messages.

    Example:
        >>> space = ChatSpace(seed=0)
        >>> space.contains([{"role": "user", "content": "2+2?"}])
        True
        >>> space.contains([])
        False

    """

    def __init__(
        self,
        max_messages: int = 4,
        max_text_length: int = 64,
        seed: int | np.random.Generator | None = None,
    ):
        super().__init__(max_text_length=max_text_length, seed=seed)
        self.max_messages = max_messages

    def contains(self, x: Any) -> bool:
        """Whether ``x`` is a non-empty list of valid messages."""
        return isinstance(x, list) and len(x) > 0 and all(is_message(m) for m in x)

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        """A random conversation fragment."""
        n = int(self.np_random.integers(1, self.max_messages + 1))
        out: list[Message] = []
        for i in range(n):
            role = ROLES[int(self.np_random.integers(0, len(ROLES)))]
            if role == "assistant":
                out.append(self._assistant())
            elif role == "tool":
                out.append({"role": "tool", "tool_call_id": f"call_{i}", "content": self._text()})
            else:
                out.append({"role": role, "content": self._text()})
        return out

    def __repr__(self) -> str:
        return f"ChatSpace(max_messages={self.max_messages})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ChatSpace)
