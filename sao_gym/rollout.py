"""Episodes: :func:`run_episode` (one env, one agent) and :func:`play_episode` (its life cycle).

Limits live in wrappers (:mod:`sao_gym.wrappers`), so the loop stays short.
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sao_gym.core import Agent, AgentEnv, AgentWrapper, ContextExhausted
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
    ep = _Episode()
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
            ep.record(reward, info)
            stop = _stop_reason(terminated, info) if terminated or truncated else None
        except Exception:
            logger.exception("environment failed; the episode is marked as an infra failure")
            ep.end(StopReason.ENV_ERROR)
            break
        if stop is not None:
            ep.final_obs = obs
            ep.end(stop, terminated=terminated, truncated=truncated)
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
    return _Episode().end(stop).rollout(env, traj, seed, task_id=task_id)


def _stop_reason(terminated: bool, info: dict[str, Any]) -> StopReason:
    if "stop_reason" in info:
        return StopReason(info["stop_reason"])
    return StopReason.TERMINATED if terminated else StopReason.TRUNCATED


def _trajectory(agent: Agent, ep: _Episode) -> Trajectory:
    """The agent's record; an agent that cannot give one fails the episode."""
    try:
        return agent.trajectory()
    except Exception:
        logger.exception("agent.trajectory() failed; the episode is marked as an infra failure")
        ep.end(StopReason.AGENT_ERROR)
        return Trajectory()


@dataclass
class _Episode:
    """What the loop accumulates besides the agent's own trajectory."""

    total: float = 0.0
    turns: int = 0
    terminated: bool = False
    truncated: bool = False
    infra_failure: bool = False
    stop: StopReason | None = None
    final_obs: list[Message] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    def record(self, reward: float, info: dict[str, Any]) -> None:
        metrics = {k: float(v) for k, v in (info.get("metrics") or {}).items()}
        for k, v in (info.get("reward_components") or {}).items():
            self.metrics[f"reward/{k}"] = float(v)
        self.metrics.update(metrics)
        self.total += reward
        self.turns += 1
        self.infra_failure |= bool(info.get("infra_failure", False))

    def end(self, stop: StopReason, *, terminated: bool = False,
            truncated: bool = False) -> _Episode:
        self.stop = stop
        self.infra_failure |= stop in (StopReason.ENV_ERROR, StopReason.AGENT_ERROR)
        self.terminated = terminated and not self.infra_failure
        self.truncated = truncated and not self.infra_failure
        return self

    def rollout(self, env: Env | None, traj: Trajectory, seed: int | None, *,
                task_id: str | None = None) -> Rollout:
        """The record; ``task_id`` None: read from ``env.unwrapped.task``."""
        assert self.stop is not None
        unwrapped = env.unwrapped if env is not None else None
        spec = getattr(unwrapped, "spec", None)
        if task_id is None:
            task = getattr(unwrapped, "task", None)
            task_id = str(task.get("id", "")) if isinstance(task, Mapping) else ""
        return Rollout(
            token_ids=list(traj.token_ids),
            loss_mask=list(traj.loss_mask),
            rollout_logprobs=list(traj.logprobs),
            policy_versions=list(traj.policy_versions),
            reward=float(self.total),
            terminated=self.terminated,
            truncated=self.truncated,
            stop_reason=self.stop,
            infra_failure=self.infra_failure,
            messages=[*traj.messages, *self.final_obs],
            env_id=spec.id if spec is not None else "",
            task_id=task_id,
            seed=seed,
            metrics={
                "turns": float(self.turns),
                "action_tokens": float(sum(traj.loss_mask)),
                "total_tokens": float(len(traj.token_ids)),
                **self.metrics,
            },
        )
