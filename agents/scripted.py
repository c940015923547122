"""Agents without a model, for tests and environment checks.

- :class:`ScriptedAgent` replays fixed actions, or asks a function.
- :class:`RandomAgent` throws random messages at an env: samples of
  :class:`~sao_gym.spaces.AssistantMessageSpace` mixed with well-typed calls
  of the env's own tools.

Neither produces tokens: their trajectories hold only messages.
"""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sao_gym.spaces import AssistantMessageSpace
from sao_gym.types import Message, Trajectory


class ScriptedAgent:
    """Replay ``actions`` in order, or call ``policy(messages) -> action``.

    ``policy`` receives the conversation so far and may be sync or async.
    Running out of scripted actions raises ``IndexError`` (which
    :func:`~sao_gym.run_episode` records as an agent failure).
    """

    def __init__(
        self,
        actions: Sequence[Message | str] | Callable[[list[Message]], Any],
    ):
        self._policy = actions if callable(actions) else None
        self._actions = [] if callable(actions) else list(actions)
        self._messages: list[Message] = []
        self._turn = 0

    def reset(self, observation: list[Message], info: dict[str, Any]) -> None:
        """Start a new episode."""
        self._messages = copy.deepcopy(observation)
        self._turn = 0

    async def act(self) -> Message | str:
        """The next scripted action."""
        if self._policy is not None:
            action = self._policy(copy.deepcopy(self._messages))
            if inspect.isawaitable(action):
                action = await action
        else:
            if self._turn >= len(self._actions):
                raise IndexError(f"ScriptedAgent ran out of actions after {self._turn} turns")
            action = copy.deepcopy(self._actions[self._turn])
        self._turn += 1
        self._messages.append(
            {"role": "assistant", "content": action} if isinstance(action, str) else action
        )
        return action

    def observe(self, observation: list[Message]) -> None:
        """Record the env's answer."""
        self._messages += copy.deepcopy(observation)

    def trajectory(self) -> Trajectory:
        """Messages only (no tokens)."""
        return Trajectory(messages=copy.deepcopy(self._messages))


def _random_value(rng: np.random.Generator, kind: Any) -> Any:
    kind = kind[int(rng.integers(0, len(kind)))] if isinstance(kind, list) else kind
    if kind == "integer":
        return int(rng.integers(-100, 100))
    if kind == "number":
        return float(rng.normal() * 100)
    if kind == "boolean":
        return bool(rng.integers(0, 2))
    if kind == "array":
        return [int(x) for x in rng.integers(0, 10, size=int(rng.integers(0, 4)))]
    if kind == "object":
        return {}
    return "".join(chr(int(c)) for c in rng.integers(32, 127, size=int(rng.integers(0, 12))))


class RandomAgent:
    """Random actions: half space samples, half well-typed calls of the env's tools."""

    def __init__(self, seed: int | None = None):
        self.rng = np.random.default_rng(seed)
        self.space = AssistantMessageSpace(seed=int(self.rng.integers(2**31)))
        self._inner = ScriptedAgent(self._choose)
        self._tools: list[dict[str, Any]] = []

    def _choose(self, messages: list[Message]) -> Message:
        if not self._tools or self.rng.random() < 0.5:
            return self.space.sample()
        fn = self._tools[int(self.rng.integers(0, len(self._tools)))].get("function", {})
        props = fn.get("parameters", {}).get("properties", {})
        args = {k: _random_value(self.rng, v.get("type", "string")) for k, v in props.items()}
        call = {"id": "call_0", "type": "function",
                "function": {"name": fn.get("name", ""), "arguments": json.dumps(args)}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}

    def reset(self, observation: list[Message], info: dict[str, Any]) -> None:
        """Start a new episode; remembers the env's tools."""
        self._tools = copy.deepcopy(info.get("tools") or [])
        self._inner.reset(observation, info)

    async def act(self) -> Message | str:
        """A random action."""
        return await self._inner.act()

    def observe(self, observation: list[Message]) -> None:
        """Record the env's answer."""
        self._inner.observe(observation)

    def trajectory(self) -> Trajectory:
        """Messages only (no tokens)."""
        return self._inner.trajectory()
