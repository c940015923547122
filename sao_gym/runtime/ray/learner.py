"""The learner as a Ray actor, and the driver's proxies for it.

:class:`LearnerService` is the actor: the run's learner (built by the run's
:class:`~sao_gym.runtime.parts.LearnerFactory` as in one process, loaded from a
checkpoint on resume) and its
:class:`~sao_gym.runtime.checkpoint.CheckpointManager`, so checkpoints are
written where the learner's state is (the run directory must be on storage
the learner's node sees). After each step it puts the new policy weights in
Ray's object store once (``ray.put``); the step's answer carries the ref,
which the driver broadcasts to every rollout worker.

:class:`RemoteLearner` and :class:`RemoteCheckpointer` are what the driver's
:class:`~sao_gym.runtime.trainer.Trainer` holds instead of a learner and a
checkpointer. The learner dying (its process killed, its node lost) raises
:class:`LearnerDied`: the run ends, and ``sao-gym train --resume RUN_DIR``
continues from the last checkpoint (the metrics file is cut back to it, so
every step is logged once).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from sao_gym.types import Rollout

logger = logging.getLogger(__name__)


class LearnerDied(RuntimeError):
    """The learner actor is gone; the message says how to resume."""


def learner_threads(ray_config: Any) -> int:
    """The learner's torch threads: ``ray.learner_threads``, else Ray's rule.

    Ray's rule: :func:`~sao_gym.runtime.ray.cluster.actor_threads` of
    ``ray.learner_num_cpus``.
    """
    from sao_gym.runtime.ray.cluster import actor_threads

    if ray_config.learner_threads is not None:
        return ray_config.learner_threads
    return actor_threads(ray_config.learner_num_cpus)


class LearnerService:
    """The learner actor's body (see module docs)."""

    def __init__(self, factory: Any, policy_path: str, run_dir: str,
                 resume_from: str | None = None, *, keep: int = 2, threads: int = 1):
        import torch

        from sao_gym.runtime.checkpoint import CheckpointManager

        torch.set_num_threads(threads)
        self.learner = factory(policy_path, resume_from=resume_from)
        self.checkpoints = CheckpointManager(run_dir, keep=keep)

    def info(self) -> dict[str, Any]:
        """pid, torch threads, steps done, policy version, most versions a step adds."""
        import torch

        return {"pid": os.getpid(), "threads": torch.get_num_threads(),
                "steps_done": self.learner.steps_done,
                "policy_version": self.learner.policy_version,
                "max_versions_per_step": self.learner.max_versions_per_step}

    def update(self, rollouts: list[Rollout]) -> tuple[dict[str, float], int, int, list]:
        """One learner step: ``(metrics, steps_done, policy_version, [weights ref])``."""
        import ray

        from sao_gym.utils.memory import release_free_memory, rss_mb

        metrics = self.learner.update(rollouts)
        release_free_memory()
        metrics["perf/learner_rss_mb"] = rss_mb()
        box = [ray.put(self.learner.weights())]
        return metrics, self.learner.steps_done, self.learner.policy_version, box

    def save(self, step: int, trainer_state: dict[str, Any]) -> str:
        """Write a checkpoint of ``step``; its path."""
        return str(self.checkpoints.save(step, self.learner, trainer_state))


class RemoteLearner:
    """The trainer's learner, living in a :class:`LearnerService` actor.

    Args:
        actor: the actor handle.
        info: its :meth:`LearnerService.info` answer.
        dead_errors: exceptions meaning the actor is gone.
        run_dir: named in :class:`LearnerDied`'s message.

    """

    def __init__(self, actor: Any, info: dict[str, Any], *,
                 dead_errors: tuple[type[BaseException], ...], run_dir: str | Path):
        self.actor, self.dead_errors, self.run_dir = actor, dead_errors, Path(run_dir)
        self.pid: int = info["pid"]
        self.threads: int = info["threads"]
        self.steps_done: int = info["steps_done"]
        self.policy_version: int = info["policy_version"]
        self.max_versions_per_step: int = info["max_versions_per_step"]
        self._box: list | None = None

    def call(self, method: str, *args: Any) -> Any:
        """``actor.method(*args)``, waited for; :class:`LearnerDied` if the actor is gone."""
        import ray

        try:
            return ray.get(getattr(self.actor, method).remote(*args))
        except self.dead_errors as e:
            raise LearnerDied(
                f"the learner actor (pid {self.pid}) died: {type(e).__name__}; "
                f"`sao-gym train --resume {self.run_dir}` continues from the last "
                "checkpoint") from e

    def update(self, rollouts: list[Rollout]) -> dict[str, float]:
        """One learner step on the actor; its metrics."""
        metrics, self.steps_done, self.policy_version, self._box = self.call("update", rollouts)
        return metrics

    def weights(self) -> list | None:
        """The box (``[object ref]``) of the weights of the last step."""
        return self._box


class RemoteCheckpointer:
    """The trainer's checkpointer: the learner actor writes the checkpoint."""

    def __init__(self, learner: RemoteLearner):
        self.learner = learner

    def save(self, step: int, learner: Any, trainer_state: dict[str, Any]) -> Path:
        """Checkpoint ``step`` on the learner actor; its path."""
        return Path(self.learner.call("save", step, trainer_state))
