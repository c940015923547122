"""Limits and statistics as wrappers, so the rollout loop stays short.

- :class:`TurnLimit`: truncate after ``max_turns`` steps (``max_episode_steps``).
- :class:`TokenBudget`: truncate once the conversation exceeds a token budget.
- :class:`WallClockLimit`: truncate when an episode runs out of time, even
  in the middle of a slow step.
- :class:`EpisodeStatistics`: ``info["episode"] = {"r", "l", "t"}`` at the end.

Each truncating wrapper sets ``info["stop_reason"]`` to a
:class:`~sao_gym.types.StopReason`.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from typing import Any

from sao_gym.core import AgentEnv, AgentWrapper, StepResult
from sao_gym.types import Message, StopReason


def _truncate(out: StepResult, reason: StopReason) -> StepResult:
    obs, reward, terminated, truncated, info = out
    if terminated or truncated:
        return out
    return obs, reward, False, True, {**info, "stop_reason": reason}


class TurnLimit(AgentWrapper):
    """Truncate the episode after ``max_turns`` actions."""

    def __init__(self, env: AgentEnv | AgentWrapper, max_turns: int):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        super().__init__(env)
        self.max_turns = max_turns
        self._turns = 0

    async def areset(self, *, seed=None, options=None):
        """Reset the turn counter and the wrapped env."""
        self._turns = 0
        return await super().areset(seed=seed, options=options)

    async def astep(self, action):
        """Step, truncating at the turn limit."""
        out = await super().astep(action)
        self._turns += 1
        if self._turns >= self.max_turns:
            out = _truncate(out, StopReason.MAX_TURNS)
            self._episode_over = True
        return out


def approx_token_count(text: str) -> int:
    """A tokenizer-free estimate: one token per 4 UTF-8 bytes."""
    return math.ceil(len(text.encode("utf-8", "replace")) / 4)


def message_text(message: Any) -> str:
    """All text of a message: its content and tool-call names and arguments."""
    if isinstance(message, str):
        return message
    if not isinstance(message, dict):
        return str(message)
    parts = [message.get("content") or ""]
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        args = fn.get("arguments", "")
        parts += [str(fn.get("name", "")), args if isinstance(args, str) else json.dumps(args)]
    return "".join(p if isinstance(p, str) else str(p) for p in parts)


class TokenBudget(AgentWrapper):
    """Truncate once the conversation's tokens exceed ``max_tokens``.

    Counts the text of every observation and action with ``count_tokens``
    (pass ``lambda s: len(tokenizer(s).input_ids)`` for exact counts; the
    default estimates 4 bytes per token). The step that crosses the budget
    is returned, truncated. Exposes ``tokens_used``.
    """

    def __init__(
        self,
        env: AgentEnv | AgentWrapper,
        max_tokens: int,
        count_tokens: Callable[[str], int] = approx_token_count,
    ):
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        super().__init__(env)
        self.max_tokens = max_tokens
        self.count_tokens = count_tokens
        self.tokens_used = 0

    def _count(self, messages: list[Message]) -> int:
        return sum(self.count_tokens(message_text(m)) for m in messages)

    async def areset(self, *, seed=None, options=None):
        """Reset the budget and the wrapped env."""
        obs, info = await super().areset(seed=seed, options=options)
        self.tokens_used = self._count(obs)
        return obs, info

    async def astep(self, action):
        """Step, truncating when the budget is exceeded."""
        self.tokens_used += self._count([action])
        out = await super().astep(action)
        self.tokens_used += self._count(out[0])
        if self.tokens_used > self.max_tokens:
            out = _truncate(out, StopReason.MAX_TOKENS)
            self._episode_over = True
        return out


class WallClockLimit(AgentWrapper):
    """Truncate an episode that runs longer than ``max_seconds``.

    A step still running when the time is up is cancelled and answered with a
    truncating observation, so a hung tool cannot hold an episode forever.
    """

    def __init__(self, env: AgentEnv | AgentWrapper, max_seconds: float):
        if not max_seconds > 0:
            raise ValueError(f"max_seconds must be > 0, got {max_seconds}")
        super().__init__(env)
        self.max_seconds = max_seconds
        self._deadline = math.inf

    async def areset(self, *, seed=None, options=None):
        """Start the clock (after the reset itself)."""
        out = await super().areset(seed=seed, options=options)
        self._deadline = time.monotonic() + self.max_seconds
        return out

    async def astep(self, action):
        """Step within the remaining time."""
        self._require_episode()
        remaining = self._deadline - time.monotonic()
        try:
            out = await asyncio.wait_for(super().astep(action), timeout=max(remaining, 0.0))
        except asyncio.TimeoutError:
            msg = {"role": "user", "content": "Time limit reached: the episode is over."}
            out = ([msg], 0.0, False, True, {"stop_reason": StopReason.TIME_LIMIT})
        else:
            if time.monotonic() >= self._deadline:
                out = _truncate(out, StopReason.TIME_LIMIT)
        if out[2] or out[3]:
            self._episode_over = True
        return out


class EpisodeStatistics(AgentWrapper):
    """Add ``info["episode"] = {"r": return, "l": turns, "t": seconds}`` at the end."""

    def __init__(self, env: AgentEnv | AgentWrapper):
        super().__init__(env)
        self._return, self._length, self._start = 0.0, 0, 0.0

    async def areset(self, *, seed=None, options=None):
        """Reset the statistics."""
        self._return, self._length, self._start = 0.0, 0, time.monotonic()
        return await super().areset(seed=seed, options=options)

    async def astep(self, action):
        """Step and accumulate."""
        obs, reward, terminated, truncated, info = await super().astep(action)
        self._return += reward
        self._length += 1
        if terminated or truncated:
            info = {**info, "episode": {
                "r": self._return, "l": self._length, "t": time.monotonic() - self._start,
            }}
        return obs, reward, terminated, truncated, info
