"""One episode of an environment, driven one tool call (or message) at a time.

Every adapter meets the same shape of caller: something that resets an
environment with a seed, then calls its tools one by one with decoded
arguments (TRL's ``tool(**arguments)``, an MCP ``call_tool``, an OpenEnv
``CallToolAction``), and wants the reward when it is done. :class:`EnvSession`
is that, built once over any registered :class:`~sao_gym.core.AgentEnv`:

- the env lives on a :class:`~sao_gym.adapters.loop.BackgroundLoop`, so the
  sync methods work from any thread, inside a running event loop too, and
  the async ones from any loop;
- :meth:`~EnvSession.call_tool` is one :meth:`~sao_gym.core.AgentEnv.astep`
  of an assistant message with that one call; the env validates the
  arguments, so a bad call is an error text, never an exception;
- :meth:`~EnvSession.send` steps any assistant message (a final text answer);
- the episode's record (total reward, terminated vs truncated, stop reason,
  infra failure) is kept as :func:`~sao_gym.run_episode` keeps it: an
  exception from the env ends the episode as an infra failure (``ENV_ERROR``)
  instead of reaching the caller.

A session is reused across episodes (reset again); :meth:`~EnvSession.close`
releases the env, and open sessions are closed at interpreter exit.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sao_gym.adapters.loop import BackgroundLoop, shared_loop
from sao_gym.core import clean_text
from sao_gym.episode import EpisodeRecord
from sao_gym.types import Message, StopReason

logger = logging.getLogger(__name__)

EPISODE_OVER = "Error: the episode is over; no more tool calls run."


@dataclass
class StepOutcome:
    """What one step gave: the observation, as messages and as one text."""

    messages: list[Message]
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        """The episode ended (terminated or truncated)."""
        return self.terminated or self.truncated

    @property
    def text(self) -> str:
        """The observation's message contents, one per line (what a tool call returns)."""
        return observation_text(self.messages)


def observation_text(messages: list[Message]) -> str:
    """Join the text contents of ``messages`` with newlines."""
    parts = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if content:
            parts.append(str(content))
    return "\n".join(parts)


class EnvSession:
    """An environment held on a background loop, one call at a time (see module docs).

    Args:
        env_id: a registered id (``"my_ns/MyEnv-v0"``, ``"module:id"``),
            made with :func:`sao_gym.make` and ``env_kwargs``.
        make_env: instead of ``env_id``, a zero-argument factory of the env.
        loop: the loop that owns the env (default: :func:`shared_loop`).
        max_episode_steps: the turn limit passed to :func:`sao_gym.make`.
        **env_kwargs: constructor options of the env.

    """

    def __init__(self, env_id: str | None = None, *, make_env: Callable[[], Any] | None = None,
                 loop: BackgroundLoop | None = None, max_episode_steps: int | None = None,
                 **env_kwargs: Any) -> None:
        if (env_id is None) == (make_env is None):
            raise ValueError("give exactly one of env_id and make_env")
        if make_env is None:
            import sao_gym

            def make_env() -> Any:
                return sao_gym.make(env_id, max_episode_steps=max_episode_steps, **env_kwargs)
        self._make_env = make_env
        self._loop = loop or shared_loop()
        self._env: Any = None
        self._lock: asyncio.Lock | None = None
        self._calls = 0
        self._clear()

    def _clear(self) -> None:
        self.messages: list[Message] = []
        """The conversation so far (reset messages, actions, observations)."""
        self.info: dict[str, Any] = {}
        """The reset info of the current episode."""
        self.episode = EpisodeRecord()
        """The episode's record, kept as :func:`~sao_gym.run_episode` keeps it."""
        self.started = False

    # ----- state -----
    @property
    def done(self) -> bool:
        """The episode has ended (or never started)."""
        return not self.started or self.episode.done

    @property
    def reward(self) -> float:
        """The episode's total reward so far."""
        return self.episode.total

    @property
    def turns(self) -> int:
        """Steps taken."""
        return self.episode.turns

    @property
    def terminated(self) -> bool:
        """Ended by the task (not an infra failure)."""
        return self.episode.terminated

    @property
    def truncated(self) -> bool:
        """Ended by a limit (not an infra failure)."""
        return self.episode.truncated

    @property
    def infra_failure(self) -> bool:
        """The env failed (or said so): not the policy's doing."""
        return self.episode.infra_failure

    @property
    def stop_reason(self) -> StopReason | None:
        """Why the episode ended; None while it runs."""
        return self.episode.stop

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The episode's tool schemas (``info["tools"]``; empty for a text env)."""
        return list(self.info.get("tools") or [])

    @property
    def env(self) -> Any:
        """The wrapped env (``None`` before the first reset). Touch it only on the loop."""
        return self._env

    # ----- async API (any loop) -----
    async def areset(self, *, seed: int | None = None,
                     options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode; its first messages and info. Raises what the env's reset raises."""
        return await self._loop.arun(self._reset(seed, options))

    async def acall_tool(self, name: str, arguments: dict[str, Any] | str | None = None,
                         timeout: float | None = None) -> StepOutcome:
        """Step the env with one call of tool ``name`` (``timeout`` as in :meth:`call_tool`)."""
        return await self._loop.arun(self._step(self._call_message(name, arguments), timeout))

    async def asend(self, message: Message | str, timeout: float | None = None) -> StepOutcome:
        """Step the env with any assistant message (or text)."""
        return await self._loop.arun(self._step(message, timeout))

    async def aclose(self) -> None:
        """Close the env. Idempotent."""
        await self._loop.arun(self._close())

    # ----- sync API (any thread, running loop or not) -----
    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """Sync :meth:`areset`."""
        return self._loop.run(self._reset(seed, options))

    def call_tool(self, name: str, arguments: dict[str, Any] | str | None = None,
                  timeout: float | None = None) -> StepOutcome:
        """Sync :meth:`acall_tool`; ``timeout`` seconds: ``TimeoutError`` (an infra failure)."""
        return self._loop.run(self._step(self._call_message(name, arguments), timeout))

    def send(self, message: Message | str, timeout: float | None = None) -> StepOutcome:
        """Sync :meth:`asend`."""
        return self._loop.run(self._step(message, timeout))

    def close(self) -> None:
        """Sync :meth:`aclose`."""
        if self._loop.running:
            self._loop.run(self._close())

    # ----- on the loop -----
    def _guard(self) -> asyncio.Lock:
        """The lock serialising this env's calls (made on the loop, at first use)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def _reset(self, seed: int | None, options: dict[str, Any] | None
                     ) -> tuple[list[Message], dict[str, Any]]:
        async with self._guard():
            if self._env is None:
                self._env = self._make_env()
                self._loop.at_exit(id(self), self._close_unlocked)
            self._clear()
            obs, info = await self._env.areset(seed=seed, options=options)
            self.messages, self.info, self.started = list(obs), dict(info), True
            return obs, info

    async def _step(self, action: Message | str, timeout: float | None = None) -> StepOutcome:
        async with self._guard():
            if self.done:
                return StepOutcome([{"role": "user", "content": EPISODE_OVER}],
                                   info={"episode_over": True})
            message = {"role": "assistant", "content": action} if isinstance(action, str) \
                else action
            self.messages.append(message)
            try:
                obs, reward, terminated, truncated, info = await asyncio.wait_for(
                    self._env.astep(action), timeout)
            except Exception as e:  # noqa: BLE001 - an env failure is data, as in run_episode
                kind = "timed out" if isinstance(e, TimeoutError) else "failed"
                logger.exception("environment step %s; the episode is an infra failure", kind)
                self.episode.end(StopReason.ENV_ERROR)
                reason = f"{type(e).__name__}: {clean_text(str(e), 300)}"
                text = f"Error: the environment {kind} ({reason})"
                return StepOutcome([{"role": "user", "content": text}], terminated=True,
                                   info={"infra_failure": True})
            self.messages += obs
            self.episode.step(reward, terminated, truncated, info)
            return StepOutcome(list(obs), reward, terminated, truncated, info)

    async def _close(self) -> None:
        async with self._guard():
            await self._close_unlocked()

    async def _close_unlocked(self) -> None:
        env, self._env = self._env, None
        self._loop.at_exit(id(self), None)
        if env is not None:
            await env.aclose()

    def _call_message(self, name: str, arguments: dict[str, Any] | str | None) -> Message:
        self._calls += 1
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, str):  # what JSON cannot hold goes as text: the env says why
            arguments = json.dumps(arguments, ensure_ascii=False, default=str)
        return {"role": "assistant", "content": None, "tool_calls": [{
            "id": f"call_{self._calls}", "type": "function",
            "function": {"name": str(name), "arguments": arguments}}]}
