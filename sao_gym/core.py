"""The public interface: environments, wrappers and agents.

- :class:`AgentEnv`: a :class:`gymnasium.Env` whose observations are chat
  messages and whose actions are assistant messages. Its native API is async
  (:meth:`~AgentEnv.areset`, :meth:`~AgentEnv.astep`, :meth:`~AgentEnv.aclose`);
  ``reset``/``step``/``close`` are sync shims over a private event loop, so
  ``gymnasium.make`` and Gymnasium's ``check_env`` work unchanged.
- :class:`AgentWrapper`: the async-aware base of every wrapper.
- :class:`Agent`: what :func:`sao_gym.run_episode` drives.

An environment author subclasses :class:`AgentEnv` (or
:class:`sao_gym.tools.ToolEnv` for tool-calling tasks) and fills the hooks
:meth:`~AgentEnv.on_reset` and :meth:`~AgentEnv.on_step`; the base class owns
seeding, action validation and the episode's life cycle.

``terminated`` vs ``truncated``: ``terminated`` means the task itself ended
(solved, failed, submitted): the value of the final state is known, nothing to
bootstrap. ``truncated`` means a limit outside the task (turns, tokens, time)
cut the episode: the learner bootstraps from the critic's value.
"""

from __future__ import annotations

import abc
import asyncio
import copy
import math
from collections.abc import Coroutine
from typing import Any, Protocol, TypeVar, runtime_checkable

import gymnasium
from gymnasium.error import ResetNeeded as _GymResetNeeded

from sao_gym.spaces import AssistantMessageSpace, ChatSpace, message_problem
from sao_gym.types import Message, Trajectory

T = TypeVar("T")
StepResult = tuple[list[Message], float, bool, bool, dict[str, Any]]
"""``(observation, reward, terminated, truncated, info)``."""


class ResetNeeded(_GymResetNeeded):
    """``step`` was called before ``reset`` or after the episode ended."""


def clean_text(text: str, limit: int = 2000) -> str:
    """Make untrusted text safe to echo in an observation.

    Lone surrogates are replaced (a tokenizer cannot encode them) and long
    text is cut to ``limit`` characters with a marker.
    """
    text = text.encode("utf-8", "replace").decode("utf-8")
    if len(text) > limit:
        text = text[:limit] + f"... [{len(text) - limit} more characters]"
    return text


def error_observation(text: str) -> list[Message]:
    """The observation for an action the environment cannot use."""
    return [{"role": "user", "content": f"Error: {clean_text(text)}"}]


def coerce_action(action: Any) -> tuple[Message | None, str | None]:
    """Turn an action into an assistant message, or explain why it is not one.

    A plain string becomes ``{"role": "assistant", "content": action}``.
    Returns ``(message, None)`` or ``(None, reason)``.
    """
    if isinstance(action, str):
        return {"role": "assistant", "content": action}, None
    problem = message_problem(action, roles=("assistant",))
    if problem is not None:
        return None, f"invalid action: {problem}"
    return copy.deepcopy(action), None


def _reset_result(env_name: str, out: Any) -> tuple[list[Message], dict[str, Any]]:
    """``on_reset``'s ``(messages, info)``, or a ``TypeError`` that says what it returned."""
    if isinstance(out, (tuple, list)) and len(out) == 2 and isinstance(out[0], list) \
            and isinstance(out[1], dict):
        return out[0], out[1]
    if isinstance(out, (tuple, list)) and len(out) == 2:
        got = f"({type(out[0]).__name__}, {type(out[1]).__name__})"
    elif isinstance(out, (tuple, list)):
        got = f"a {type(out).__name__} of {len(out)}"
    else:
        got = type(out).__name__
    raise TypeError(f"{env_name}.on_reset must return (messages, info): a list of message "
                    f"dicts and a dict; got {got}")


class _SyncRunner:
    """Runs coroutines to completion on a private event loop (the sync API)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise RuntimeError(
                "the sync API (reset/step/close) cannot run inside a running event loop; "
                "use `await env.areset()`, `await env.astep()` and `await env.aclose()`"
            )
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coro)

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()
        self._loop = None


class AgentEnv(gymnasium.Env, abc.ABC):
    """A multi-turn chat environment with an async API.

    Subclasses implement :meth:`on_reset` and :meth:`on_step` (and
    :meth:`on_close` if they hold resources). Observations are lists of *new*
    messages; the action is an assistant message (or a plain string). Any
    action, however malformed, yields an observation and never an exception:
    actions that are not assistant messages are answered by an error
    observation before :meth:`on_step` sees them.

    Use the async API inside event loops and the sync API elsewhere, not
    both on one instance: resources created by one loop belong to it.
    """

    metadata: dict[str, Any] = {"render_modes": []}
    task: dict[str, Any] | None = None
    """The current task (with its reference solution; never shown to the model)."""

    def __init__(self) -> None:
        self.observation_space = ChatSpace()
        self.action_space = AssistantMessageSpace()
        self._episode_over = True
        self._sync = _SyncRunner()

    # ----- hooks for environment authors -----
    @abc.abstractmethod
    async def on_reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        """Start a new task; return its first messages and the reset info.

        ``self.np_random`` is already seeded. ``options`` may carry
        ``{"task": ...}`` to pick a task explicitly.
        """

    @abc.abstractmethod
    async def on_step(self, action: Message) -> StepResult:
        """Answer a valid assistant message."""

    async def on_close(self) -> None:
        """Release resources. Called once per :meth:`aclose` of an open env."""

    # ----- async API -----
    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode. ``seed`` seeds ``self.np_random`` (Gymnasium semantics)."""
        if options is not None and not isinstance(options, dict):
            raise TypeError(f"options must be a dict or None, got {type(options).__name__}")
        gymnasium.Env.reset(self, seed=seed, options=options)
        obs, info = _reset_result(type(self).__name__, await self.on_reset(dict(options or {})))
        self._episode_over = False
        self._sample_tools(info)
        return obs, info

    def _sample_tools(self, info: dict[str, Any]) -> None:
        """Let random actions (``action_space.sample()``) call the tools of ``info``."""
        if isinstance(self.action_space, AssistantMessageSpace) and \
                isinstance(info.get("tools"), list):
            self.action_space.tools = list(info["tools"])

    async def astep(self, action: Message | str) -> StepResult:
        """Apply one action; raises :class:`ResetNeeded` outside an episode."""
        if self._episode_over:
            raise ResetNeeded(
                "the episode is over (terminated or truncated) or was never started: "
                "call reset()/areset() before step()/astep()"
            )
        message, problem = coerce_action(action)
        if message is None:
            obs, reward, terminated, truncated, info = (
                error_observation(problem or "invalid action"), 0.0, False, False, {}
            )
            info["invalid_action"] = True
        else:
            obs, reward, terminated, truncated, info = await self.on_step(message)
        reward = float(reward)
        if not math.isfinite(reward):
            raise ValueError(f"{type(self).__name__}.on_step returned a non-finite reward {reward}")
        if terminated or truncated:
            self._episode_over = True
        return obs, reward, bool(terminated), bool(truncated), info

    async def aclose(self) -> None:
        """Release resources. Idempotent; the env may be reset again afterwards."""
        self._episode_over = True
        await self.on_close()

    # ----- sync shims (gymnasium API) -----
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Sync :meth:`areset`."""
        return self._sync.run(self.areset(seed=seed, options=options))

    def step(self, action: Message | str) -> StepResult:
        """Sync :meth:`astep`."""
        return self._sync.run(self.astep(action))

    def close(self) -> None:
        """Sync :meth:`aclose`; also closes the private event loop. Idempotent."""
        self._sync.run(self.aclose())
        self._sync.close()


class AgentWrapper(gymnasium.Wrapper):
    """Base of async-aware wrappers around an :class:`AgentEnv`.

    Subclasses override :meth:`areset`/:meth:`astep`; the sync methods drive
    them on the wrapped env's private loop. Stepping outside an episode raises
    :class:`ResetNeeded` at every level of the stack.
    """

    def __init__(self, env: AgentEnv | AgentWrapper):
        if not isinstance(env.unwrapped, AgentEnv):
            raise TypeError(f"{type(self).__name__} wraps AgentEnv instances, got {env!r}")
        super().__init__(env)
        self._episode_over = True

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode of the wrapped env."""
        out = await self.env.areset(seed=seed, options=options)
        self._episode_over = False
        return out

    def _require_episode(self) -> None:
        if self._episode_over:
            raise ResetNeeded("the episode is over: call reset()/areset() before step()/astep()")

    async def astep(self, action: Message | str) -> StepResult:
        """Step the wrapped env; subclasses post-process the result."""
        self._require_episode()
        out = await self.env.astep(action)
        if out[2] or out[3]:
            self._episode_over = True
        return out

    async def aclose(self) -> None:
        """Close the wrapped env. Idempotent."""
        await self.env.aclose()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Sync :meth:`areset`."""
        return self.unwrapped._sync.run(self.areset(seed=seed, options=options))

    def step(self, action: Message | str) -> StepResult:
        """Sync :meth:`astep`."""
        return self.unwrapped._sync.run(self.astep(action))

    def close(self) -> None:
        """Sync :meth:`aclose`. Idempotent."""
        self.unwrapped._sync.run(self.aclose())
        self.unwrapped._sync.close()


@runtime_checkable
class Agent(Protocol):
    """What :func:`sao_gym.run_episode` drives: one episode at a time.

    The loop is ``reset(obs, info)``, then ``act()`` / ``observe(obs)`` turn by
    turn, then ``trajectory()``.
    """

    def reset(self, observation: list[Message], info: dict[str, Any]) -> None:
        """Start an episode from the environment's first messages and reset info."""
        ...

    async def act(self) -> Message | str:
        """Produce the next action from everything observed so far."""
        ...

    def observe(self, observation: list[Message]) -> None:
        """Record the environment's answer to the last action."""
        ...

    def trajectory(self) -> Trajectory:
        """The episode so far: tokens, masks, logprobs, versions and messages."""
        ...


class ContextExhausted(RuntimeError):
    """Raised by an agent whose context window has no room for another turn."""
