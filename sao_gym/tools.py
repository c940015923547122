"""Tool-calling environments.

:class:`ToolEnv` is an :class:`~sao_gym.core.AgentEnv` whose actions call
tools. An author declares tools as methods decorated with :func:`tool` (a
JSON schema for the arguments) and implements ``on_reset``; the base class
parses each tool call, validates its arguments against the schema and
answers every kind of bad call (invalid JSON, unknown tool, wrong types,
missing arguments) with an error ``tool`` message instead of an exception.

Example:
    >>> class Echo(ToolEnv):
    ...     async def on_reset(self, options):
    ...         return [{"role": "user", "content": "Say hi"}], {}
    ...     @tool(description="Repeat text.", parameters={
    ...         "type": "object", "properties": {"text": {"type": "string"}},
    ...         "required": ["text"]})
    ...     async def echo(self, text):
    ...         return ToolResult(text, terminated=True, reward=float(text == "hi"))
    >>> env = Echo()
    >>> obs, info = env.reset(seed=0)
    >>> [t["function"]["name"] for t in info["tools"]]
    ['echo']
    >>> call = {"id": "c1", "type": "function",
    ...         "function": {"name": "echo", "arguments": '{"text": "hi"}'}}
    >>> obs, reward, terminated, truncated, info = env.step(
    ...     {"role": "assistant", "content": None, "tool_calls": [call]})
    >>> obs[0]["content"], reward, terminated
    ('hi', 1.0, True)

"""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sao_gym.core import AgentEnv, StepResult, clean_text, error_observation
from sao_gym.types import Message

_TOOL_ATTR = "__sao_gym_tool__"


class ToolError(Exception):
    """Raised by a tool for bad input: becomes an error message to the agent."""


@dataclass(frozen=True)
class ToolResult:
    """What a tool returns (a plain ``str`` is shorthand for ``ToolResult(str)``)."""

    content: str
    """Text shown to the agent as the tool message."""
    terminated: bool = False
    """Whether this call ends the task (e.g. a submission)."""
    reward: float = 0.0
    """Reward earned by this call."""
    info: dict[str, Any] = field(default_factory=dict)
    """Merged into the step's info (e.g. ``reward_components``)."""


@dataclass(frozen=True)
class ToolSpec:
    """A declared tool: its name, description and JSON schema of arguments."""

    name: str
    description: str
    parameters: dict[str, Any]

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-tool schema."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": copy.deepcopy(self.parameters),
            },
        }


def tool(
    *, description: str, parameters: dict[str, Any], name: str | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare a method of a :class:`ToolEnv` as a tool.

    The method receives the validated arguments as keyword arguments and
    returns a ``str`` or a :class:`ToolResult`; it may be sync or async.
    """
    if parameters.get("type") != "object":
        raise ValueError("tool parameters must be a JSON schema of type 'object'")

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        setattr(fn, _TOOL_ATTR, ToolSpec(name or fn.__name__, description, parameters))
        return fn

    return mark


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def _type_ok(value: Any, kind: str | list[str]) -> bool:
    kinds = [kind] if isinstance(kind, str) else kind
    for k in kinds:
        types = _JSON_TYPES.get(k)
        if types is None:
            continue
        if isinstance(value, bool) and k in ("integer", "number"):
            continue  # JSON booleans are not numbers
        if isinstance(value, types):
            return True
    return False


def validate_arguments(args: Any, schema: dict[str, Any]) -> str | None:
    """Check decoded arguments against a tool's object schema.

    Covers what tool schemas use: required keys, property types, ``enum``
    and ``additionalProperties: false``. Returns a reason, or ``None``.
    """
    if not isinstance(args, dict):
        return f"arguments must be a JSON object, got {type(args).__name__}"
    props: dict[str, Any] = schema.get("properties", {})
    missing = [k for k in schema.get("required", []) if k not in args]
    if missing:
        return f"missing required argument(s): {', '.join(missing)}"
    for key, value in args.items():
        prop = props.get(key)
        if prop is None:
            if schema.get("additionalProperties", True) is False or not props:
                return f"unexpected argument {clean_text(str(key), 60)!r}"
            continue
        if "type" in prop and not _type_ok(value, prop["type"]):
            return f"argument {key!r} must be of type {prop['type']}, got {type(value).__name__}"
        if "enum" in prop and value not in prop["enum"]:
            return f"argument {key!r} must be one of {prop['enum']}"
    return None


def decode_arguments(raw: Any) -> tuple[dict[str, Any] | None, str | None]:
    """Decode a tool call's arguments (JSON text or an object)."""
    if isinstance(raw, dict):
        return raw, None
    if not isinstance(raw, str):
        return None, f"arguments must be a JSON string, got {type(raw).__name__}"
    if not raw.strip():
        return {}, None
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as e:
        return None, f"arguments are not valid JSON ({clean_text(str(e), 200)})"
    if not isinstance(value, dict):
        return None, f"arguments must be a JSON object, got {type(value).__name__}"
    return value, None


class ToolEnv(AgentEnv):
    """An :class:`AgentEnv` whose actions are tool calls (see module docs).

    ``reset`` info carries ``tools`` (the OpenAI schemas). A message without
    tool calls is answered by :meth:`on_text`. At most
    ``max_tool_calls_per_turn`` calls run per turn; a call that terminates the
    task stops the rest.
    """

    max_tool_calls_per_turn: int = 8

    def __init__(self) -> None:
        super().__init__()  # random actions call the declared tools (after reset: info's)
        self._sample_tools({"tools": [spec.schema() for spec in self.tool_specs().values()]})

    @classmethod
    def tool_specs(cls) -> dict[str, ToolSpec]:
        """The declared tools, by name."""
        return {name: spec for name, (_, spec) in _declared_tools(cls).items()}

    def tool_schemas(self) -> list[dict[str, Any]]:
        """Fresh copies of the OpenAI tool schemas."""
        return [spec.schema() for spec in self.tool_specs().values()]

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode; the info carries ``tools``."""
        obs, info = await super().areset(seed=seed, options=options)
        info.setdefault("tools", self.tool_schemas())
        self._sample_tools(info)
        return obs, info

    async def on_text(self, message: Message) -> StepResult:
        """Answer an assistant message that calls no tool (default: an error)."""
        names = ", ".join(self.tool_specs())
        return error_observation(f"no tool call found. Call one of the tools: {names}."), 0.0, \
            False, False, {"invalid_action": True}

    async def on_step(self, action: Message) -> StepResult:
        """Run the message's tool calls in order."""
        calls = action.get("tool_calls") or []
        if not calls:
            return await self.on_text(action)
        obs: list[Message] = []
        reward, terminated, info = 0.0, False, {}
        for i, call in enumerate(calls[: self.max_tool_calls_per_turn]):
            result = await self._run_call(call)
            name = call["function"]["name"]
            obs.append({
                "role": "tool",
                "tool_call_id": call.get("id") or f"call_{i}",
                "name": clean_text(name, 64),
                "content": result.content,
            })
            reward += result.reward
            info.update(copy.deepcopy(result.info))
            if result.terminated:
                terminated = True
                break
        if not terminated and len(calls) > self.max_tool_calls_per_turn:
            obs.append(error_observation(
                f"only the first {self.max_tool_calls_per_turn} tool calls of a turn run; "
                f"{len(calls) - self.max_tool_calls_per_turn} were ignored"
            )[0])
        return obs, reward, terminated, False, info

    async def _run_call(self, call: dict[str, Any]) -> ToolResult:
        name = call["function"]["name"]
        spec = self.tool_specs().get(name)
        if spec is None:
            known = ", ".join(self.tool_specs())
            return ToolResult(f"Error: unknown tool {clean_text(name, 64)!r}. Tools: {known}.")
        args, problem = decode_arguments(call["function"]["arguments"])
        if problem is None:
            problem = validate_arguments(args, spec.parameters)
        if problem is not None:
            return ToolResult(f"Error: {name}: {problem}")
        method = getattr(self, _declared_tools(type(self))[name][0])
        try:
            out = method(**args)
            if inspect.isawaitable(out):
                out = await out
        except (ToolError, ValueError, TypeError, ArithmeticError, RecursionError) as e:
            return ToolResult(f"Error: {name}: {clean_text(str(e), 500)}")
        return out if isinstance(out, ToolResult) else ToolResult(str(out))


def _declared_tools(cls: type) -> dict[str, tuple[str, ToolSpec]]:
    """Tool name -> (method name, spec), subclasses overriding bases."""
    found: dict[str, tuple[str, ToolSpec]] = {}
    for klass in reversed(cls.__mro__):
        for attr_name, attr in vars(klass).items():
            spec = getattr(attr, _TOOL_ATTR, None)
            if spec is not None:
                found[spec.name] = (attr_name, spec)
    return found
