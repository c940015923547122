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
import functools
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sao_gym.core import Agent, AgentEnv, AgentWrapper
from sao_gym.rollout import play_episode
from sao_gym.types import Rollout

Z95 = 1.959964
"""The standard normal quantile of a two-sided 95% interval."""


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval (95% by default) of a success rate ``successes / n``.

    >>> [round(x, 3) for x in wilson_interval(8, 10)]
    [0.49, 0.943]
    """
    if n <= 0:
        return (0.0, 1.0)
    if not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # exact at the edges (0 of n: lower bound 0; n of n: upper bound 1), where
    # centre -/+ half only comes within rounding of them
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return (lo, hi)


def gain_interval(before: float, n_before: int, after: float, n_after: int,
                  z: float = Z95) -> tuple[float, float]:
    """Normal-approximation interval (95% by default) of ``after - before``.

    The two success rates are treated as independent samples (conservative
    when both were measured on the same tasks).

    >>> [round(x, 3) for x in gain_interval(0.4, 256, 0.6, 256)]
    [0.115, 0.285]
    """
    if n_before <= 0 or n_after <= 0:
        raise ValueError("both evaluations need at least one episode")
    se = math.sqrt(before * (1 - before) / n_before + after * (1 - after) / n_after)
    diff = after - before
    return (diff - z * se, diff + z * se)


def _counted(summary: Mapping[str, Any]) -> tuple[float, int]:
    """(success rate, episodes it is over) of a summary dict (infra failures excluded)."""
    return (float(summary["success_rate"]),
            max(1, int(summary["episodes"]) - int(summary.get("infra_failures", 0))))


def summary_interval(summary: Mapping[str, Any]) -> tuple[float, float]:
    """95% interval of the success rate of a summary dict (``eval_*.json``).

    An :class:`EpisodeSummary` as written by the job; recomputed (Wilson) for
    files written without ``success_interval``.
    """
    if summary.get("success_interval"):
        lo, hi = summary["success_interval"]
        return float(lo), float(hi)
    rate, n = _counted(summary)
    return wilson_interval(round(rate * n), n)


def summary_gain(before: Mapping[str, Any], after: Mapping[str, Any]
                 ) -> tuple[float, float, float]:
    """``(gain, low, high)``: ``after``'s success rate minus ``before``'s.

    ``low``/``high`` are its 95% interval (:func:`gain_interval`).
    """
    (b, nb), (a, na) = _counted(before), _counted(after)
    lo, hi = gain_interval(b, nb, a, na)
    return a - b, lo, hi


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
    success_interval: tuple[float, float] = (0.0, 1.0)
    """95% Wilson interval of ``success_rate`` over the episodes that were not infra failures."""

    @classmethod
    def of(cls, rollouts: list[Rollout]) -> EpisodeSummary:
        """Summarise ``rollouts`` (infra failures are counted, not averaged)."""
        ok = [r for r in rollouts if not r.infra_failure]
        n = max(len(ok), 1)
        wins = sum(r.reward >= 1.0 for r in ok)
        reasons: dict[str, int] = {}
        for r in rollouts:
            if r.infra_failure:
                reasons[r.stop_reason.value] = reasons.get(r.stop_reason.value, 0) + 1
        return cls(
            episodes=len(rollouts),
            success_rate=wins / n,
            return_mean=sum(r.reward for r in ok) / n,
            turns_mean=sum(r.metrics.get("turns", 0.0) for r in ok) / n,
            infra_failures=len(rollouts) - len(ok),
            failure_reasons=dict(sorted(reasons.items())),
            success_interval=wilson_interval(wins, len(ok)),
        )


async def run_episodes(
    make_env: Callable[[], AgentEnv | AgentWrapper],
    make_agent: Callable[[], Agent],
    episodes: int,
    *,
    concurrency: int = 8,
    seed: int = 0,
    on_done: Callable[[Rollout], None] | None = None,
    seed_agents: bool = False,
) -> list[Rollout]:
    """Play episodes with seeds ``seed, seed+1, ...``; results in seed order.

    With ``seed_agents`` each episode's agent is made as ``make_agent(seed=s)``
    with the episode's seed ``s``: an agent that seeds its sampling with it
    (``LLMAgent``) plays the same episode whatever else runs beside it.

    Env and agent failures come back as ``infra_failure`` rollouts. Only an
    exception of ``on_done`` or a cancellation propagates, after every
    episode still running is cancelled and its env closed.
    """

    async def play(s: int) -> Rollout:
        agent = functools.partial(make_agent, seed=s) if seed_agents else make_agent
        return await play_episode(make_env, agent, seed=s)

    return await play_seeds(play, episodes, concurrency=concurrency, seed=seed, on_done=on_done)


async def play_seeds(play: Callable[[int], Awaitable[Rollout]], episodes: int, *,
                     concurrency: int = 8, seed: int = 0,
                     on_done: Callable[[Rollout], None] | None = None) -> list[Rollout]:
    """``play(s)`` for ``s = seed, seed+1, ...``, ``concurrency`` at once; results in seed order.

    ``play`` returns failures as data (an ``infra_failure`` rollout). Only an
    exception of ``play`` or ``on_done``, or a cancellation, propagates, after
    every episode still running is cancelled.
    """
    if episodes < 1 or concurrency < 1:
        raise ValueError("episodes and concurrency must be >= 1")
    slots = asyncio.Semaphore(concurrency)

    async def one(i: int) -> Rollout:
        async with slots:
            rollout = await play(seed + i)
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


def progress_lines(episodes: int, say: Callable[[str], None], every: int = 8
                  ) -> Callable[[Any], None]:
    """An ``on_done`` for an evaluation (``run_episodes``) that says how far it is, ``every`` times.

    Each line: episodes done, their success so far (infra failures apart), the
    time taken.
    """
    start = time.monotonic()
    done = solved = failed = 0
    marks = {max(1, round(episodes * k / every)) for k in range(1, every)}

    def on_done(rollout: Any) -> None:
        nonlocal done, solved, failed
        done += 1
        failed += bool(rollout.infra_failure)
        solved += rollout.reward >= 1.0 and not rollout.infra_failure
        if done in marks:
            rate = f"{solved / (done - failed):.3f}" if done > failed else "-"
            extra = f", {failed} infra failures" if failed else ""
            say(f"  evaluated {done}/{episodes} episodes: success {rate}{extra} "
                f"({time.monotonic() - start:.0f} s)")

    return on_done
