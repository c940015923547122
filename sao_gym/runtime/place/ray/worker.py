"""The rollout-worker actor: an asyncio loop of episodes with its own parts.

A :class:`RolloutWorker` calls the run's rollout factory
(:class:`~sao_gym.runtime.parts.RolloutFactory`, with this worker's share of
the servers) as one process of ``runtime: local`` does: its environments,
its inference backend (in-process, or clients to inference servers) and its
agents. The driver's :class:`~sao_gym.runtime.place.ray.pool.WorkerPool`
calls :meth:`RolloutWorker.play` for each episode the rollout source
admits (many at once: Ray runs an async actor's calls concurrently on its
loop) and :meth:`RolloutWorker.update_weights` for every new policy version.

Weights travel as ``(version, box)``: ``box`` is a one-element list holding
the object ref of the learner's state dict (a list, so Ray hands the ref
over instead of resolving it for every call). Every call carries the latest
version, so a worker that started late (a replacement) catches up before
its first episode; the broadcast reaches the others while their episodes
are generating, as in one process.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerSpec:
    """What a rollout worker is built from."""

    rollouts: Any
    """The run's :class:`~sao_gym.runtime.parts.RolloutFactory`, with this worker's share
    of the inference servers (the inference section's ``share``)."""
    policy_path: str
    """The checkpoint the backend starts from (the run's start or resume point)."""
    tokenizer_path: str
    """Where the tokenizer is read."""
    version: int
    """The policy version of ``policy_path``."""
    seed: int
    """Sampling seed of this worker's backend."""
    run_dir: str | None = None
    """This worker's directory (logs of servers it launches, weights it publishes)."""
    threads: int = 1
    """torch threads of the worker."""
    server_actors: tuple[float, float] | None = None
    """``(num_cpus, num_gpus)`` of each launched server as an actor of its own; None:
    launched servers are child processes."""


class RolloutWorker:
    """Episodes on one worker (see module docs). Methods are called through Ray."""

    def __init__(self, spec: WorkerSpec, index: int):
        import torch

        torch.set_num_threads(spec.threads)
        self.index = index
        self.version = spec.version
        self.episodes = 0
        launcher = None
        if spec.server_actors is not None:  # servers as actors this worker owns
            from sao_gym.runtime.place.ray.servers import RayServers

            launcher = functools.partial(RayServers, num_cpus=spec.server_actors[0],
                                         num_gpus=spec.server_actors[1])
        self.rollouts = spec.rollouts(spec.policy_path, tokenizer_path=spec.tokenizer_path,
                                      version=spec.version, seed=spec.seed,
                                      run_dir=spec.run_dir, launcher=launcher)
        self._loading = asyncio.Lock()
        self._running: set[asyncio.Task] = set()

    def ready(self) -> dict[str, Any]:
        """Who and where this worker is: pid, Ray node id, policy version, episodes played."""
        import ray

        return {"index": self.index, "pid": os.getpid(), "version": self.version,
                "node_id": ray.get_runtime_context().get_node_id(), "episodes": self.episodes}

    async def play(self, seed: int, version: int, box: list | None,
                   sample_seed: int | None = None, env_kwargs: dict[str, Any] | None = None
                   ) -> tuple[Any, dict[str, int]]:
        """One episode on ``seed``'s task, and this worker's backend counters after it.

        The worker catches up to ``version`` first; its agent samples with
        ``sample_seed``, its env takes ``env_kwargs`` (a curriculum's level). The
        counters are ``Rollouts.counters``.
        """
        task = asyncio.current_task()
        assert task is not None
        self._running.add(task)
        try:
            await self.update_weights(version, box)
            rollout = await self.rollouts.play(seed, sample_seed, env_kwargs)
        finally:
            self._running.discard(task)
        self.episodes += 1
        return rollout, self.rollouts.counters()

    async def update_weights(self, version: int, box: list | None) -> int:
        """Load policy ``version`` from ``box`` unless it is here already; the version now."""
        if box is None or version <= self.version:
            return self.version
        async with self._loading:
            if version > self.version:
                weights = box[0]
                if hasattr(weights, "__await__"):  # an object ref
                    weights = await weights
                await self.rollouts.update_weights(weights, version)
                self.version = version
        return self.version

    async def close(self) -> None:
        """Cancel the episodes still running (the run is over), release the backend."""
        running = list(self._running)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await self.rollouts.aclose()
