"""Registering and making environments on Gymnasium's registry.

Ids follow Gymnasium's ``namespace/Name-vN`` form; the built-in ones are
``sao_gym/<Name>-v<N>``. Both ``sao_gym.make(id)`` (async-capable wrapper
stack) and ``gymnasium.make(id)`` (Gymnasium's own sync wrappers) work once
``sao_gym`` is imported.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium
from gymnasium.envs.registration import EnvSpec, load_env_creator, parse_env_id

from sao_gym.core import AgentEnv, AgentWrapper
from sao_gym.wrappers import EpisodeStatistics, TokenBudget, TurnLimit, WallClockLimit

_AGENT_ENV_IDS: set[str] = set()


def register(
    id: str,
    entry_point: str | type[AgentEnv],
    *,
    max_episode_steps: int | None = None,
    nondeterministic: bool = False,
    kwargs: dict[str, Any] | None = None,
) -> None:
    """Register an :class:`AgentEnv` under a versioned id (``namespace/Name-vN``).

    ``entry_point`` is a class or a lazy ``"module:Class"`` string.
    ``max_episode_steps`` is the turn limit.
    """
    _, _, version = parse_env_id(id)
    if version is None:
        raise ValueError(f"env ids must be versioned like 'my_ns/MyTask-v0', got {id!r}")
    gymnasium.register(
        id=id,
        entry_point=entry_point,
        max_episode_steps=max_episode_steps,
        nondeterministic=nondeterministic,
        kwargs=dict(kwargs or {}),
    )
    _AGENT_ENV_IDS.add(id)


def env_ids() -> list[str]:
    """Ids registered through :func:`register`, sorted."""
    return sorted(_AGENT_ENV_IDS)


def make(
    id: str,
    *,
    max_episode_steps: int | None = None,
    max_seconds: float | None = None,
    max_tokens: int | None = None,
    record_statistics: bool = True,
    **kwargs: Any,
) -> AgentEnv | AgentWrapper:
    """Build a registered env with async-capable wrappers.

    Wrappers, innermost first: :class:`TurnLimit` (``max_episode_steps``,
    default from the registration), :class:`TokenBudget` (``max_tokens``),
    :class:`WallClockLimit` (``max_seconds``), :class:`EpisodeStatistics`.
    Extra ``kwargs`` go to the environment's constructor.
    """
    if id not in gymnasium.registry:
        known = ", ".join(env_ids()) or "(none)"
        raise gymnasium.error.UnregisteredEnv(
            f"no environment registered as {id!r}; registered agent envs: {known}"
        )
    spec: EnvSpec = gymnasium.spec(id)
    creator = (
        load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str)
        else spec.entry_point
    )
    env_kwargs = {**spec.kwargs, **kwargs}
    env = creator(**env_kwargs)
    if not isinstance(env, AgentEnv):
        raise TypeError(f"{id} is a {type(env).__name__}, not an AgentEnv: use gymnasium.make")
    steps = max_episode_steps if max_episode_steps is not None else spec.max_episode_steps
    env.unwrapped.spec = dataclasses.replace(spec, kwargs=env_kwargs, max_episode_steps=steps)
    wrapped: AgentEnv | AgentWrapper = env
    if steps is not None:
        wrapped = TurnLimit(wrapped, steps)
    if max_tokens is not None:
        wrapped = TokenBudget(wrapped, max_tokens)
    if max_seconds is not None:
        wrapped = WallClockLimit(wrapped, max_seconds)
    if record_statistics:
        wrapped = EpisodeStatistics(wrapped)
    return wrapped
