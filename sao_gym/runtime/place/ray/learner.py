"""The learner as a Ray actor, and the driver's proxies for it.

:class:`LearnerService` is the actor of one learner rank: the run's learner
(built by the run's :class:`~sao_gym.runtime.parts.LearnerFactory` as in
one process, loaded from a checkpoint on resume) and its
:class:`~sao_gym.runtime.loop.checkpoint.CheckpointManager`, so checkpoints are
written where the learner's state is (the run directory must be on storage
every learner node sees). With ``learner.engine: fsdp`` the learner is
``learner.ranks`` such actors in one ``torch.distributed`` process group
(gloo on CPUs, NCCL on GPUs), each training its share of every batch and
writing its own checkpoint shards. After each step rank 0 puts the new
policy weights in Ray's object store once (``ray.put``); the step's answer
carries the ref, which the driver broadcasts to every rollout worker.

:class:`ActorRanks` is the group's :class:`~sao_gym.learner.ranks.RankDriver`
(the local group's is :class:`~sao_gym.learner.ranks.ProcessRanks`);
:class:`RemoteLearner` and :class:`RemoteCheckpointer` are what the driver's
:class:`~sao_gym.runtime.loop.trainer.Trainer` holds instead of a learner and a
checkpointer. A rank dying (its process killed, its node lost) raises
:class:`~sao_gym.learner.ranks.RankDied` after the other ranks are ended; the
job then rebuilds the run from its last checkpoint, up to
``ray.max_learner_restarts`` times (:func:`sao_gym.runtime.job.train`), and
past that the run ends: ``sao-gym train --resume RUN_DIR`` continues from the
last checkpoint. Either way the metrics file is cut back to the checkpoint, so
every step is logged once.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from sao_gym.learner.ranks import rank_died
from sao_gym.types import Rollout

logger = logging.getLogger(__name__)


def learner_threads(ray_config: Any) -> int:
    """The learner's torch threads: ``ray.learner_threads``, else Ray's rule.

    Ray's rule: :func:`~sao_gym.runtime.place.ray.cluster.actor_threads` of
    ``ray.learner_num_cpus``.
    """
    from sao_gym.runtime.place.ray.cluster import actor_threads

    if ray_config.learner_threads is not None:
        return ray_config.learner_threads
    return actor_threads(ray_config.learner_num_cpus)


class LearnerService:
    """One rank of the learner actor group (see module docs).

    Built in two calls so that the ranks can find each other: the actor
    starts empty; rank 0's :meth:`rendezvous` names an address on its node;
    :meth:`start` on every rank joins the process group there (for
    ``ranks > 1``) and builds the learner.
    """

    def __init__(self, factory: Any, policy_path: str, run_dir: str,
                 resume_from: str | None = None, *, keep: int = 2, threads: int = 1,
                 rank: int = 0, ranks: int = 1, timeout_s: float = 120.0):
        import torch

        torch.set_num_threads(threads)
        self._build = (factory, policy_path, resume_from)
        self.run_dir, self.keep = run_dir, keep
        self.rank, self.ranks, self.timeout_s = rank, ranks, timeout_s
        self.learner: Any = None

    def rendezvous(self) -> str:
        """``host:port`` on this actor's node where rank 0 will listen."""
        import ray

        from sao_gym.learner.ranks import free_port

        return f"{ray.util.get_node_ip_address()}:{free_port()}"

    def start(self, address: str | None) -> dict[str, Any]:
        """Join the group at ``address`` (several ranks), build the learner; :meth:`info`."""
        import ray

        from sao_gym.learner.ranks import join_ranks
        from sao_gym.runtime.loop.checkpoint import CheckpointManager

        factory, policy_path, resume_from = self._build
        if self.ranks > 1:
            gpus = ray.get_gpu_ids()
            join_ranks(self.rank, self.ranks, address, factory.config.device, self.timeout_s,
                       local_rank=0 if gpus else None)  # Ray shows each actor its own GPU
        self.learner = factory(policy_path, resume_from=resume_from)
        self.checkpoints = CheckpointManager(self.run_dir, keep=self.keep)
        return self.info()

    def info(self) -> dict[str, Any]:
        """pid, torch threads, steps done, policy version, most versions a step adds."""
        import torch

        return {"pid": os.getpid(), "threads": torch.get_num_threads(),
                "steps_done": self.learner.steps_done,
                "policy_version": self.learner.policy_version,
                "max_versions_per_step": self.learner.max_versions_per_step}

    def update(self, rollouts: list[Rollout], trace: list[int] | None = None
               ) -> tuple[dict[str, float], int, int, list, dict]:
        """One learner step: ``(metrics, steps_done, policy_version, [weights ref], trace)``.

        Every rank trains its share; the weights (gathered on rank 0) are put
        in the object store by rank 0, the others answer ``[None]``. ``trace``:
        positions whose per-token quantities come back (``Learner.trace``).
        """
        import ray

        from sao_gym.utils.memory import release_free_memory, rss_mb

        metrics = (self.learner.update(rollouts, trace=trace) if trace
                   else self.learner.update(rollouts))
        release_free_memory()
        metrics["perf/learner_rss_mb"] = rss_mb()
        weights = self.learner.weights()
        box = [ray.put(weights) if self.rank == 0 else None]
        return (metrics, self.learner.steps_done, self.learner.policy_version, box,
                self.learner.trace if trace else {})

    def weights_box(self) -> list:
        """``[object ref]`` of the current weights (rank 0's; ``[None]`` elsewhere)."""
        import ray

        weights = self.learner.weights()
        return [ray.put(weights) if self.rank == 0 else None]

    def save(self, step: int, trainer_state: dict[str, Any], token: str) -> str:
        """Write (this rank's part of) the checkpoint of ``step``; its path."""
        return str(self.checkpoints.save(step, self.learner, trainer_state, token=token))


class ActorRanks:
    """The :class:`~sao_gym.learner.ranks.RankDriver` of :class:`LearnerService` actors.

    One actor per rank. Every call runs on every rank (they train together); answers are rank
    0's. Any rank dying (its process killed, its node lost) kills the others
    (which would wait in a collective) and raises
    :class:`~sao_gym.learner.ranks.RankDied` naming it.

    Args:
        actors: the actor handles, rank 0 first.
        pids: each rank's process id.
        dead_errors: exceptions meaning an actor is gone.
        run_dir: named in the error's message.

    """

    def __init__(self, actors: list[Any], pids: list[int], *,
                 dead_errors: tuple[type[BaseException], ...], run_dir: str | Path):
        self.actors, self.pids = list(actors), list(pids)
        self.dead_errors, self.run_dir = dead_errors, Path(run_dir)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``actor.method(*args, **kwargs)`` on every rank, waited for; rank 0's answer."""
        import ray

        refs = [getattr(a, method).remote(*args, **kwargs) for a in self.actors]
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(ready[0])
            except self.dead_errors as e:
                rank = refs.index(ready[0])
                self.close()
                raise rank_died(rank, self.pids[rank], type(e).__name__, self.run_dir) from e
            except BaseException:
                self.close()  # the other ranks would wait in a collective
                raise
        return ray.get(refs[0])

    def close(self) -> None:
        """End every rank's actor (those already gone included)."""
        import ray

        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - it may be dead already
                pass


class RemoteLearner:
    """The trainer's learner: the learner's ranks as actors, over an :class:`ActorRanks`.

    Args:
        driver: the group's driver.
        info: rank 0's :meth:`LearnerService.info` answer.

    """

    def __init__(self, driver: ActorRanks, info: dict[str, Any]):
        self.driver = driver
        self.pids: list[int] = driver.pids
        self.pid: int = self.pids[0]
        self.threads: int = info["threads"]
        self.steps_done: int = info["steps_done"]
        self.policy_version: int = info["policy_version"]
        self.max_versions_per_step: int = info["max_versions_per_step"]
        self._box: list | None = None
        self.trace: dict[int, dict[str, list[float]]] = {}
        """Per-token quantities the last step traced (``Learner.trace``)."""

    def call(self, method: str, *args: Any) -> Any:
        """``method`` on every rank (:meth:`ActorRanks.call`)."""
        return self.driver.call(method, *args)

    def kill(self) -> None:
        """End every rank's actor."""
        self.driver.close()

    def update(self, rollouts: list[Rollout], trace: list[int] | None = None
               ) -> dict[str, float]:
        """One learner step on the actors; its metrics (``trace``: as ``Learner.update``)."""
        (metrics, self.steps_done, self.policy_version, self._box,
         self.trace) = self.call("update", rollouts, trace)
        return metrics

    def weights(self) -> list:
        """The box (``[object ref]``) of the weights of the last step (before any: now)."""
        if self._box is None:
            self._box = self.call("weights_box")
        return self._box


class RemoteCheckpointer:
    """The trainer's checkpointer: the learner's ranks write the checkpoint."""

    def __init__(self, learner: RemoteLearner):
        self.learner = learner

    def save(self, step: int, learner: Any, trainer_state: dict[str, Any]) -> Path:
        """Checkpoint ``step`` on the learner's actors; its path."""
        import uuid

        return Path(self.learner.call("save", step, trainer_state, uuid.uuid4().hex[:12]))
