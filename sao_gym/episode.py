"""One episode's record: the reward, turns and how it ended, kept one way everywhere.

:class:`EpisodeRecord` is what :func:`~sao_gym.rollout.run_episode` (the
training and evaluation loop) and :class:`~sao_gym.adapters.session.EnvSession`
(the adapters' step-by-step episodes) both keep besides the agent's tokens:
the summed reward and per-step metrics, the turn count, terminated vs
truncated, the :class:`~sao_gym.types.StopReason` (from the env's
``info["stop_reason"]`` when it gives one) and whether the episode is an
infra failure (an env or agent error, or a step's ``info["infra_failure"]``:
then it is neither terminated nor truncated). :meth:`EpisodeRecord.rollout`
turns it and a trajectory into a :class:`~sao_gym.types.Rollout`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sao_gym.types import Message, Rollout, StopReason, Trajectory


def stop_reason(terminated: bool, info: Mapping[str, Any]) -> StopReason:
    """Why an episode ended: ``info["stop_reason"]``, else terminated or truncated."""
    if "stop_reason" in info:
        return StopReason(info["stop_reason"])
    return StopReason.TERMINATED if terminated else StopReason.TRUNCATED


@dataclass
class EpisodeRecord:
    """What an episode accumulates besides the agent's own trajectory (module docs)."""

    total: float = 0.0
    turns: int = 0
    terminated: bool = False
    truncated: bool = False
    infra_failure: bool = False
    stop: StopReason | None = None
    final_obs: list[Message] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        """The episode has ended."""
        return self.stop is not None

    def record(self, reward: float, info: dict[str, Any]) -> None:
        """Add one step's reward, metrics and infra-failure flag."""
        metrics = {k: float(v) for k, v in (info.get("metrics") or {}).items()}
        for k, v in (info.get("reward_components") or {}).items():
            self.metrics[f"reward/{k}"] = float(v)
        self.metrics.update(metrics)
        self.total += reward
        self.turns += 1
        self.infra_failure |= bool(info.get("infra_failure", False))

    def step(self, reward: float, terminated: bool, truncated: bool,
             info: dict[str, Any]) -> bool:
        """Record one env step; end the episode if it says so. Whether it ended."""
        self.record(reward, info)
        if terminated or truncated:
            self.end(stop_reason(terminated, info), terminated=terminated, truncated=truncated)
        return self.stop is not None

    def end(self, stop: StopReason, *, terminated: bool = False,
            truncated: bool = False) -> EpisodeRecord:
        """End the episode; an env or agent error makes it an infra failure."""
        self.stop = stop
        self.infra_failure |= stop in (StopReason.ENV_ERROR, StopReason.AGENT_ERROR)
        self.terminated = terminated and not self.infra_failure
        self.truncated = truncated and not self.infra_failure
        return self

    def rollout(self, env: Any, traj: Trajectory, seed: int | None, *,
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


__all__ = ["EpisodeRecord", "stop_reason"]
