"""Agents without a model, for tests and environment checks.

- :class:`ScriptedAgent` replays fixed actions, or asks a function.
- :class:`RandomAgent` throws random messages at an env: samples of
  :class:`~sao_gym.spaces.AssistantMessageSpace` that call the env's own tools
  (those of the reset info), with arguments that fit their schemas or not.

Neither produces tokens: their trajectories hold only messages.
"""

from __future__ import annotations

import copy
import inspect
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


class RandomAgent:
    """Random actions: samples of an :class:`AssistantMessageSpace` given the env's tools.

    Each ``seed`` gives its own sequence of actions (for the same observations).
    """

    def __init__(self, seed: int | None = None):
        self.rng = np.random.default_rng(seed)
        self.space = AssistantMessageSpace(seed=int(self.rng.integers(2**31)))
        self._inner = ScriptedAgent(lambda messages: self.space.sample())

    def reset(self, observation: list[Message], info: dict[str, Any]) -> None:
        """Start a new episode; its actions call the tools of ``info["tools"]``."""
        tools = info.get("tools")
        self.space.tools = copy.deepcopy(tools) if isinstance(tools, list) else []
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
