"""Gymnasium spaces for chat environments.

- :class:`ChatSpace`: observations, a list of OpenAI-format messages.
- :class:`AssistantMessageSpace`: actions, one assistant message.

``contains`` checks *structure* (roles, types, tool-call shape); whether a
tool exists or its arguments parse is for the environment to judge, so
:meth:`AssistantMessageSpace.sample` deliberately yields structurally valid
messages whose tool calls are often semantically broken, which is what a
random agent should throw at an env. Given the env's tool schemas
(``AssistantMessageSpace.tools``, which :class:`~sao_gym.core.AgentEnv` fills
from the reset info's ``tools``), samples call those tools, about half the
time with arguments that fit the schema (:func:`random_value`) and otherwise
with broken ones (invalid JSON, not an object, a wrongly typed value, a
missing required or an unexpected argument); they also call unknown tools.
"""

from __future__ import annotations

import json
import math
import string
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium.spaces import Space

from sao_gym.types import ROLES, Message

_ALPHABET = string.ascii_letters + string.digits + string.punctuation + " \n"
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,), "null": (type(None),),
}


def _is_of_type(value: Any, kind: str) -> bool:
    if isinstance(value, bool) and kind in ("integer", "number"):
        return False  # JSON booleans are not numbers
    return isinstance(value, _JSON_TYPES.get(kind, ()))


def _number(schema: Mapping[str, Any], key: str) -> float | None:
    value = schema.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) else None


def random_value(rng: np.random.Generator, schema: Mapping[str, Any], depth: int = 0) -> Any:
    """A random value that fits a JSON schema: what a tool's argument may hold.

    Covers what tool schemas use: ``type`` (one or a list), ``enum``,
    ``minimum``/``maximum`` of numbers (default range [-100, 100]), ``items`` of
    arrays (0 to 3 of them), ``properties``/``required`` of objects (every
    required key, each optional one half the time). A schema without a type
    gives a string of up to 12 characters.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> value = random_value(rng, {"type": "object", "required": ["n"],
        ...                            "properties": {"n": {"type": "integer", "minimum": 1}}})
        >>> isinstance(value["n"], int) and value["n"] >= 1
        True

    """
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[int(rng.integers(0, len(enum)))]
    kind = schema.get("type", "string")
    if isinstance(kind, list):
        kind = kind[int(rng.integers(0, len(kind)))] if kind else "string"
    if kind in ("integer", "number"):
        low, high = _number(schema, "minimum"), _number(schema, "maximum")
        low = low if low is not None else (high - 200 if high is not None else -100.0)
        high = high if high is not None and high >= low else low + 200
        if kind == "number":
            return float(rng.uniform(low, high))
        return int(rng.integers(math.ceil(low), max(math.floor(high), math.ceil(low)) + 1))
    if kind == "boolean":
        return bool(rng.integers(0, 2))
    if kind == "null":
        return None
    if kind == "array":
        items = schema.get("items")
        items = items if isinstance(items, Mapping) and depth < 3 else {"type": "integer"}
        return [random_value(rng, items, depth + 1) for _ in range(int(rng.integers(0, 4)))]
    if kind == "object":
        props = schema.get("properties")
        props = props if isinstance(props, Mapping) and depth < 3 else {}
        required = schema.get("required")
        required = [k for k in required if isinstance(k, str)] if isinstance(required, list) \
            else []
        out = {}
        for key in [*props, *(k for k in required if k not in props)]:
            if key in required or rng.random() < 0.5:
                sub = props.get(key)
                out[key] = random_value(rng, sub if isinstance(sub, Mapping) else {}, depth + 1)
        return out
    n = int(rng.integers(0, 13))
    return "".join(_ALPHABET[i] for i in rng.integers(0, len(_ALPHABET), size=n))


def _wrong_value(rng: np.random.Generator, kind: Any) -> Any:
    """A value of none of the JSON types ``kind`` names."""
    kinds = kind if isinstance(kind, list) else [kind]
    candidates = [v for v in (7, 2.5, "text", True, None, [1], {"x": 1})
                  if not any(_is_of_type(v, k) for k in kinds if isinstance(k, str))]
    return candidates[int(rng.integers(0, len(candidates)))] if candidates else {"x": [1]}


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

    def _tool_call(self, i: int, tools: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        """A call of one of ``tools`` (3 in 4 when there are some) or of an unknown tool."""
        rng = self.np_random
        fn: Any = {}
        if tools and rng.random() < 0.75:
            fn = tools[int(rng.integers(0, len(tools)))].get("function")
        fn = fn if isinstance(fn, Mapping) else {}
        name = fn.get("name") if isinstance(fn.get("name"), str) else \
            ("unknown_tool", "")[int(rng.integers(0, 2))]
        params = fn.get("parameters")
        schema: Mapping[str, Any] = params if isinstance(params, Mapping) else {}
        args: str | dict[str, Any]
        kind = int(rng.integers(0, 10))
        if kind < 5:  # fits the schema (JSON text, or now and then an already-decoded dict)
            value = random_value(rng, {"type": "object", **schema})
            args = value if kind == 0 else json.dumps(value)
        elif kind == 5:  # malformed JSON
            args = "{" + self._text()
        elif kind == 6:  # JSON that is not an object
            args = json.dumps([self._text(), int(rng.integers(-9, 10))])
        else:  # an object that breaks the schema in one place
            args = self._broken_arguments(schema, kind - 7)
        return {"id": f"call_{i}", "type": "function",
                "function": {"name": name, "arguments": args}}

    def _broken_arguments(self, schema: Mapping[str, Any], how: int) -> dict[str, Any]:
        """Arguments that break ``schema`` in one place, chosen by ``how``.

        0: a wrongly typed value, 1: a required argument left out, 2: an
        unexpected argument; where the schema offers no way to make one kind,
        the next kind.
        """
        rng = self.np_random
        args = random_value(rng, {"type": "object", **schema})
        props = schema.get("properties")
        props = props if isinstance(props, Mapping) else {}
        typed = [k for k, p in props.items() if isinstance(p, Mapping) and "type" in p]
        required = schema.get("required")
        required = [k for k in required if k in args] if isinstance(required, list) else []
        if how == 0 and typed:
            key = typed[int(rng.integers(0, len(typed)))]
            args[key] = _wrong_value(rng, props[key]["type"])
        elif how <= 1 and required:
            del args[required[int(rng.integers(0, len(required)))]]
        else:
            args["unexpected_" + self._text()[:8]] = self._text()
        return args

    def _assistant(self, tools: Sequence[Mapping[str, Any]] = ()) -> Message:
        msg: Message = {"role": "assistant", "content": self._text()}
        n_calls = int(self.np_random.integers(0, 3))
        if n_calls:
            msg["tool_calls"] = [self._tool_call(i, tools) for i in range(n_calls)]
        return msg


class AssistantMessageSpace(_MessageSpaceBase):
    """The action space: one assistant message, possibly with tool calls.

    ``tools`` (OpenAI tool schemas) are the tools that :meth:`sample` calls;
    an :class:`~sao_gym.core.AgentEnv` sets them from its reset info.

    Example:
        >>> space = AssistantMessageSpace(seed=0)
        >>> space.contains({"role": "assistant", "content": "hi"})
        True
        >>> space.contains({"role": "user", "content": "hi"})
        False
        >>> space.sample() in space
        True

    """

    def __init__(
        self,
        max_text_length: int = 64,
        seed: int | np.random.Generator | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ):
        super().__init__(max_text_length=max_text_length, seed=seed)
        self.tools: list[Mapping[str, Any]] = list(tools or [])
        """The OpenAI tool schemas whose tools :meth:`sample` calls."""

    def contains(self, x: Any) -> bool:
        """Whether ``x`` is a structurally valid assistant message."""
        return is_message(x, roles=("assistant",))

    def sample(self, mask: Any = None, probability: Any = None) -> Message:
        """A random assistant message; its tool calls are often broken on purpose."""
        tools = [t for t in self.tools if isinstance(t, Mapping)]
        return self._assistant(tools)

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
