"""Run many episodes concurrently and summarise them.

:func:`run_episodes` plays ``episodes`` seeded episodes, at most
``concurrency`` at a time, each with its own env and agent (built by the
given factories), reporting progress through a callback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from sao_gym.core import Agent, AgentEnv, AgentWrapper
from sao_gym.rollout import run_episode
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

    @classmethod
    def of(cls, rollouts: list[Rollout]) -> EpisodeSummary:
        """Summarise ``rollouts`` (infra failures are counted, not averaged)."""
        ok = [r for r in rollouts if not r.infra_failure]
        n = max(len(ok), 1)
        return cls(
            episodes=len(rollouts),
            success_rate=sum(r.reward >= 1.0 for r in ok) / n,
            return_mean=sum(r.reward for r in ok) / n,
            turns_mean=sum(r.metrics.get("turns", 0.0) for r in ok) / n,
            infra_failures=len(rollouts) - len(ok),
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
    """Play episodes with seeds ``seed, seed+1, ...``; results in seed order."""
    if episodes < 1 or concurrency < 1:
        raise ValueError("episodes and concurrency must be >= 1")
    slots = asyncio.Semaphore(concurrency)

    async def one(i: int) -> Rollout:
        async with slots:
            env = make_env()
            try:
                rollout = await run_episode(env, make_agent(), seed=seed + i)
            finally:
                await env.aclose()
        if on_done is not None:
            on_done(rollout)
        return rollout

    return list(await asyncio.gather(*(one(i) for i in range(episodes))))
