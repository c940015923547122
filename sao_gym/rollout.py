"""``run_episode``: one environment, one agent, one :class:`~sao_gym.types.Rollout`.

Limits live in wrappers (:mod:`sao_gym.wrappers`), so the loop stays short.
Failures travel as data: an exception from the environment or the agent ends
the episode with ``infra_failure=True`` and a :class:`StopReason` saying whose
it was, instead of propagating into the training loop. Cancellation
(``asyncio.CancelledError``) still propagates.
"""

from __future__ import annotations

import logging
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
    total, turns, terminated, truncated, stop = 0.0, 0, False, False, None
    final_obs: list[Message] = []
    components: dict[str, float] = {}
    while stop is None:
        try:
            action = await agent.act()
        except ContextExhausted:
            truncated, stop = True, StopReason.MAX_TOKENS
            break
        except Exception:
            logger.exception("agent failed; the episode is marked as an infra failure")
            stop = StopReason.AGENT_ERROR
            break
        try:
            obs, reward, terminated, truncated, info = await env.astep(action)
        except Exception:
            logger.exception("environment failed; the episode is marked as an infra failure")
            stop = StopReason.ENV_ERROR
            break
        total, turns = total + reward, turns + 1
        for k, v in (info.get("reward_components") or {}).items():
            components[f"reward/{k}"] = float(v)
        if terminated or truncated:
            final_obs = obs
            stop = _stop_reason(terminated, info)
        else:
            agent.observe(obs)
    return _build_rollout(env, agent, seed, total, turns, terminated, truncated, stop,
                          final_obs, {**components, **(info.get("metrics") or {})}, info)


def _stop_reason(terminated: bool, info: dict[str, Any]) -> StopReason:
    if "stop_reason" in info:
        return StopReason(info["stop_reason"])
    return StopReason.TERMINATED if terminated else StopReason.TRUNCATED


def _build_rollout(env, agent, seed, total, turns, terminated, truncated, stop,
                   final_obs, metrics, info) -> Rollout:
    traj = agent.trajectory()
    infra = stop in (StopReason.ENV_ERROR, StopReason.AGENT_ERROR) or bool(
        info.get("infra_failure", False)
    )
    task = getattr(env.unwrapped, "task", None) or {}
    spec = env.unwrapped.spec
    return Rollout(
        token_ids=list(traj.token_ids),
        loss_mask=list(traj.loss_mask),
        rollout_logprobs=list(traj.logprobs),
        policy_versions=list(traj.policy_versions),
        reward=float(total),
        terminated=bool(terminated) and not infra,
        truncated=bool(truncated) and not infra,
        stop_reason=stop,
        infra_failure=infra,
        messages=[*traj.messages, *final_obs],
        env_id=spec.id if spec is not None else "",
        task_id=str(task.get("id", "")),
        seed=seed,
        metrics={
            "turns": float(turns),
            "action_tokens": float(sum(traj.loss_mask)),
            "total_tokens": float(len(traj.token_ids)),
            **{k: float(v) for k, v in metrics.items()},
        },
    )
