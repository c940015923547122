"""Run many episodes concurrently and summarise them.

:func:`run_episodes` plays ``episodes`` seeded episodes, at most
``concurrency`` at a time, each with its own env and agent (built by the
given factories, through :func:`~sao_gym.rollout.play_episode`), reporting
progress through a callback. A failed episode (an env that cannot be built
or reset, a sandbox that does not start, an agent that raises) is an
infrastructure-failure rollout in the result, never an exception: one broken
episode does not end the evaluation; :class:`EpisodeSummary` counts them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from sao_gym.core import Agent, AgentEnv, AgentWrapper
from sao_gym.rollout import play_episode
from sao_gym.types import Rollout


@dataclass(frozen=True)
class EpisodeSummary:
    """Aggregate statistics of a set of rollouts."""

    episodes: int
    success_rate: float
    """Share of episodes with reward >= 1 (the binary-reward convention)."""
    return_mean: float
    turns_mean: float
    infra_failures: int
    """Episodes that ended as infrastructure failures (excluded from the means)."""
    failure_reasons: dict[str, int] = field(default_factory=dict)
    """Infra failures by :class:`~sao_gym.types.StopReason` value (``env_error``, ...)."""

    @classmethod
    def of(cls, rollouts: list[Rollout]) -> EpisodeSummary:
        """Summarise ``rollouts`` (infra failures are counted, not averaged)."""
        ok = [r for r in rollouts if not r.infra_failure]
        n = max(len(ok), 1)
        reasons: dict[str, int] = {}
        for r in rollouts:
            if r.infra_failure:
                reasons[r.stop_reason.value] = reasons.get(r.stop_reason.value, 0) + 1
        return cls(
            episodes=len(rollouts),
            success_rate=sum(r.reward >= 1.0 for r in ok) / n,
            return_mean=sum(r.reward for r in ok) / n,
            turns_mean=sum(r.metrics.get("turns", 0.0) for r in ok) / n,
            infra_failures=len(rollouts) - len(ok),
            failure_reasons=dict(sorted(reasons.items())),
        )


async def run_episodes(
    make_env: Callable[[], AgentEnv | AgentWrapper],
    make_agent: Callable[[], Agent],
    episodes: int,
    *,
    concurrency: int = 8,
    seed: int = 0,
    on_done: Callable[[Rollout], None] | None = None,
) -> list[Rollout]:
    """Play episodes with seeds ``seed, seed+1, ...``; results in seed order.

    Env and agent failures come back as ``infra_failure`` rollouts. Only an
    exception of ``on_done`` or a cancellation propagates, after every
    episode still running is cancelled and its env closed.
    """
    if episodes < 1 or concurrency < 1:
        raise ValueError("episodes and concurrency must be >= 1")
    slots = asyncio.Semaphore(concurrency)

    async def one(i: int) -> Rollout:
        async with slots:
            rollout = await play_episode(make_env, make_agent, seed=seed + i)
        if on_done is not None:
            on_done(rollout)
        return rollout

    tasks = [asyncio.ensure_future(one(i)) for i in range(episodes)]
    try:
        return list(await asyncio.gather(*tasks))
    finally:  # on an error, no episode is left running (and holding a sandbox)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
