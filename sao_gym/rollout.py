"""Episodes: :func:`run_episode` (one env, one agent) and :func:`play_episode` (its life cycle).

Limits live in wrappers (:mod:`sao_gym.wrappers`), so the loop stays short.
A truncated episode's last observation is observed by the agent, so the
token record of an episode a limit cut ends where its next action would have
started (the state the learner can bootstrap from); a terminated episode's
last observation is kept in its messages only.
Failures travel as data: an exception from the environment or the agent, in
reset as in a step, ends the episode with ``infra_failure=True`` and a
:class:`StopReason` saying whose it was (``ENV_ERROR`` / ``AGENT_ERROR``),
instead of propagating into the training loop. Cancellation
(``asyncio.CancelledError``) still propagates.

:func:`play_episode` is the one episode life cycle that training, evaluation
and warm start share: build the env and the agent, run the episode, always
close the env.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sao_gym.core import Agent, AgentEnv, AgentWrapper, ContextExhausted
from sao_gym.episode import EpisodeRecord
from sao_gym.types import Message, Rollout, StopReason, Trajectory

logger = logging.getLogger(__name__)

Env = AgentEnv | AgentWrapper


async def run_episode(
    env: Env,
    agent: Agent,
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
) -> Rollout:
    """Play one episode of ``agent`` in ``env`` and return its token-exact record.

    Never raises for a failure of ``env`` or ``agent`` (see the module docs);
    a failed reset gives a rollout without tokens. Does not close ``env``.
    """
    try:
        obs, info = await env.areset(seed=seed, options=options)
    except Exception:
        logger.exception("environment reset failed (seed %s): an infra failure", seed)
        return _failure(StopReason.ENV_ERROR, env, seed)
    try:
        agent.reset(obs, info)
    except Exception:
        logger.exception("agent reset failed (seed %s): an infra failure", seed)
        return _failure(StopReason.AGENT_ERROR, env, seed, obs, task_id=None)
    ep = EpisodeRecord()
    while True:
        try:
            action = await agent.act()
        except ContextExhausted:
            ep.end(StopReason.MAX_TOKENS, truncated=True)
            break
        except Exception:
            logger.exception("agent failed; the episode is marked as an infra failure")
            ep.end(StopReason.AGENT_ERROR)
            break
        try:
            obs, reward, terminated, truncated, info = await env.astep(action)
            ended = ep.step(reward, terminated, truncated, info)
        except Exception:
            logger.exception("environment failed; the episode is marked as an infra failure")
            ep.end(StopReason.ENV_ERROR)
            break
        if ended:
            if ep.truncated:
                _observe_final(agent, ep, obs)
            else:
                ep.final_obs = obs
            break
        try:
            agent.observe(obs)
        except Exception:
            logger.exception("agent failed to observe; the episode is marked as an infra failure")
            ep.end(StopReason.AGENT_ERROR)
            break
    return ep.rollout(env, _trajectory(agent, ep), seed)


async def play_episode(
    make_env: Callable[[], Env],
    make_agent: Callable[[], Agent],
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
) -> Rollout:
    """Build an env and an agent, play one episode, and always close the env.

    The episode life cycle shared by training, evaluation and warm start.
    Never raises for a failure of the env or the agent: ``make_env()``
    raising gives an ``ENV_ERROR`` infra-failure rollout (``env_id`` ""),
    ``make_agent()`` raising an ``AGENT_ERROR`` one; reset and step failures
    are :func:`run_episode`'s. The env is closed (``await env.aclose()``)
    whatever happens, cancellation included; a failing close is logged and
    does not change the rollout. ``asyncio.CancelledError`` propagates.
    """
    try:
        env = make_env()
    except Exception:
        logger.exception("building the environment failed (seed %s): an infra failure", seed)
        return _failure(StopReason.ENV_ERROR, None, seed)
    try:
        try:
            agent = make_agent()
        except Exception:
            logger.exception("building the agent failed (seed %s): an infra failure", seed)
            return _failure(StopReason.AGENT_ERROR, env, seed)
        return await run_episode(env, agent, seed=seed, options=options)
    finally:
        try:
            await env.aclose()
        except Exception:
            logger.exception("closing the environment failed (the rollout is kept)")


def _failure(stop: StopReason, env: Env | None, seed: int | None,
             messages: list[Message] | None = None, *, task_id: str | None = "") -> Rollout:
    """The record of an episode that failed before its first turn: no tokens."""
    traj = Trajectory(messages=list(messages or []))
    return EpisodeRecord().end(stop).rollout(env, traj, seed, task_id=task_id)


def _observe_final(agent: Agent, ep: EpisodeRecord, obs: list[Message]) -> None:
    """Hand a truncated episode's last observation to the agent.

    Its record then ends at the state the learner bootstraps from; if the agent
    fails to take it, the observation is kept as messages only.
    """
    try:
        agent.observe(obs)
    except Exception:
        logger.warning("agent failed to observe the final observation; kept as messages only",
                       exc_info=True)
        ep.final_obs = obs


def _trajectory(agent: Agent, ep: EpisodeRecord) -> Trajectory:
    """The agent's record; an agent that cannot give one fails the episode."""
    try:
        return agent.trajectory()
    except Exception:
        logger.exception("agent.trajectory() failed; the episode is marked as an infra failure")
        ep.end(StopReason.AGENT_ERROR)
        return Trajectory()
