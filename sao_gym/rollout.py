"""``run_episode``: one environment, one agent, one :class:`~sao_gym.types.Rollout`.

Limits live in wrappers (:mod:`sao_gym.wrappers`), so the loop stays short.
Failures travel as data: an exception from the environment or the agent ends
the episode with ``infra_failure=True`` and a :class:`StopReason` saying whose
it was, instead of propagating into the training loop. Cancellation
(``asyncio.CancelledError``) still propagates.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from sao_gym.core import Agent, AgentEnv, AgentWrapper, ContextExhausted
from sao_gym.types import Message, Rollout, StopReason

logger = logging.getLogger(__name__)


async def run_episode(
    env: AgentEnv | AgentWrapper,
    agent: Agent,
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
) -> Rollout:
    """Play one episode of ``agent`` in ``env`` and return its token-exact record."""
    obs, info = await env.areset(seed=seed, options=options)
    agent.reset(obs, info)
    ep = _Episode()
    while ep.stop is None:
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
        except Exception:
            logger.exception("environment failed; the episode is marked as an infra failure")
            ep.end(StopReason.ENV_ERROR)
            break
        ep.record(reward, info)
        if terminated or truncated:
            ep.final_obs = obs
            ep.end(_stop_reason(terminated, info), terminated=terminated, truncated=truncated)
        else:
            agent.observe(obs)
    return ep.rollout(env, agent, seed)


def _stop_reason(terminated: bool, info: dict[str, Any]) -> StopReason:
    if "stop_reason" in info:
        return StopReason(info["stop_reason"])
    return StopReason.TERMINATED if terminated else StopReason.TRUNCATED


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
        self.total += reward
        self.turns += 1
        for k, v in (info.get("reward_components") or {}).items():
            self.metrics[f"reward/{k}"] = float(v)
        self.metrics.update({k: float(v) for k, v in (info.get("metrics") or {}).items()})
        self.infra_failure |= bool(info.get("infra_failure", False))

    def end(self, stop: StopReason, *, terminated: bool = False, truncated: bool = False) -> None:
        self.stop = stop
        self.infra_failure |= stop in (StopReason.ENV_ERROR, StopReason.AGENT_ERROR)
        self.terminated = terminated and not self.infra_failure
        self.truncated = truncated and not self.infra_failure

    def rollout(self, env: AgentEnv | AgentWrapper, agent: Agent, seed: int | None) -> Rollout:
        traj = agent.trajectory()
        task = getattr(env.unwrapped, "task", None) or {}
        spec = env.unwrapped.spec
        assert self.stop is not None
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
            task_id=str(task.get("id", "")),
            seed=seed,
            metrics={
                "turns": float(self.turns),
                "action_tokens": float(sum(traj.loss_mask)),
                "total_tokens": float(len(traj.token_ids)),
                **self.metrics,
            },
        )
