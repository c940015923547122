"""``runtime: ray``: the run's :class:`~sao_gym.runtime.loop.trainer.Trainer` over Ray actors.

What runs where:

- the **driver** (the ``sao-gym train`` process): the trainer loop, the one
  :class:`~sao_gym.runtime.loop.source.RolloutSource` (admission and the
  staleness bound), the metric sinks and the :class:`WorkerPool`;
- ``ray.rollout_workers`` **rollout workers**
  (:class:`~sao_gym.runtime.place.ray.worker.RolloutWorker`, spread over the
  nodes), each with its own environments, agents and backend: in-process
  (``hf``, ``vllm``), or clients of its share of the inference servers
  (``vllm_server``: ``inference.urls`` dealt round-robin, or
  ``inference.launch`` servers started by the workers, the same number on each,
  as child processes or, with ``ray.server_actors``, as actors of their own);
- the **learner** (:class:`~sao_gym.runtime.place.ray.learner.LearnerService`):
  one actor, or ``learner.ranks`` actors in one process group for
  ``learner.engine: fsdp``; it also writes the checkpoints.

Each actor receives a factory of the run's parts (:mod:`sao_gym.runtime.parts`:
the learner factory, the rollout factory with the worker's share of the
servers), never the config. Everything else is the single-process run's: the
same factories, the same resume (latest checkpoint, task cursor, metrics cut
back to it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sao_gym.runtime.config.schema import ConfigError
from sao_gym.runtime.parts import RunParts

logger = logging.getLogger(__name__)

WORKER_SEED_STRIDE = 1_000_003
"""Sampling seeds of rollout workers (and of their replacements) lie this far apart."""


def ray_trainer(parts: RunParts, run_dir: str | Path, *, policy_path: str,
                resume: bool = False, sinks: Sequence[Any] = ()) -> Any:
    """A :class:`~sao_gym.runtime.loop.trainer.Trainer` whose parts are Ray actors (module docs).

    Connects to Ray (``parts.ray.address``; a local instance on 127.0.0.1 when
    null, shut down when the trainer closes), ships the learner factory to the
    learner actor and the rollout factory to each rollout worker, and waits
    until each is ready (``ray.startup_timeout_s``).
    """
    from sao_gym.runtime.loop.checkpoint import CheckpointManager
    from sao_gym.runtime.loop.trainer import Trainer
    from sao_gym.runtime.place.ray.cluster import connect
    from sao_gym.runtime.place.ray.learner import RemoteCheckpointer

    rc = parts.ray
    try:  # a bad server share fails before Ray starts
        shares = [parts.rollouts.backend.share(i, rc.rollout_workers)
                  for i in range(rc.rollout_workers)]
    except ValueError as e:
        raise ConfigError(str(e)) from None
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    started = connect(rc.address, num_cpus=rc.num_cpus,
                      object_store_memory_mb=rc.object_store_memory_mb)
    import ray

    try:
        latest, next_seed = (CheckpointManager(run_dir).resume_point(parts.seed) if resume
                             else (None, parts.seed))
        learner = _start_learner(parts, policy_path, run_dir, latest)
        lora = parts.learner.config.lora  # adapters: workers keep the base, get the adapter
        pool = _start_pool(parts, shares, run_dir, learner,
                           serve_from=str(latest / "policy") if latest and lora is None
                           else policy_path,
                           tokenizer_path=policy_path, shutdown=started)
    except BaseException:
        if started:
            ray.shutdown()
        raise
    curriculum = parts.climb(latest)
    source = parts.source(pool.play, concurrency=pool.concurrency, seed=next_seed,
                          version=learner.policy_version,
                          max_versions_per_step=learner.max_versions_per_step,
                          sample_seed=parts.seed,
                          difficulty=curriculum.current if curriculum is not None else None)
    sink = parts.sink(run_dir, resume_step=learner.steps_done if resume else None, sinks=sinks)
    return Trainer(source=source, learner=learner, backend=pool, sink=sink,
                   checkpoints=RemoteCheckpointer(learner), total_steps=parts.total_steps,
                   checkpoint_every=parts.checkpoint_every, publish_first=lora is not None,
                   recorder=parts.recorder(run_dir, tokenizer_path=policy_path)
                   if parts.recorder is not None else None, curriculum=curriculum)


def _dead_errors() -> tuple[type[BaseException], ...]:
    import ray.exceptions

    return (ray.exceptions.RayActorError,)


def _start_learner(parts: RunParts, policy_path: str, run_dir: Path,
                   latest: Path | None) -> Any:
    """The learner's actors (``learner.ranks`` of them for ``engine: fsdp``), started."""
    import ray

    from sao_gym.runtime.place.ray.learner import (
        ActorRanks,
        LearnerService,
        RemoteLearner,
        learner_threads,
    )

    rc = parts.ray
    ranks = parts.learner.config.ranks
    actor_cls = ray.remote(LearnerService).options(
        num_cpus=rc.learner_num_cpus, num_gpus=rc.learner_num_gpus, max_restarts=0)
    actors = [actor_cls.remote(parts.learner, policy_path, str(run_dir),
                               str(latest) if latest is not None else None,
                               keep=parts.checkpoint_keep, threads=learner_threads(rc),
                               rank=rank, ranks=ranks) for rank in range(ranks)]
    try:
        address = (ray.get(actors[0].rendezvous.remote(), timeout=rc.startup_timeout_s)
                   if ranks > 1 else None)
        infos = ray.get([a.start.remote(address) for a in actors], timeout=rc.startup_timeout_s)
    except ray.exceptions.GetTimeoutError:
        for actor in actors:
            ray.kill(actor)
        raise TimeoutError(f"the learner's {ranks} actor(s) were not up within "
                           f"ray.startup_timeout_s={rc.startup_timeout_s} s (not enough "
                           "resources in the cluster?)") from None
    except BaseException:
        for actor in actors:
            ray.kill(actor)
        raise
    info = infos[0]
    logger.info("learner up: %d rank(s) (pids %s, %d torch threads each, step %d)", ranks,
                [i["pid"] for i in infos], info["threads"], info["steps_done"])
    return RemoteLearner(ActorRanks(actors, [i["pid"] for i in infos],
                                    dead_errors=_dead_errors(), run_dir=run_dir), info)


def _start_pool(parts: RunParts, shares: list[Any], run_dir: Path, learner: Any, *,
                serve_from: str, tokenizer_path: str, shutdown: bool) -> Any:
    import ray

    from sao_gym.runtime.place.ray.pool import WorkerPool
    from sao_gym.runtime.place.ray.worker import RolloutWorker, WorkerSpec

    rc = parts.ray
    capacity = parts.episodes_per_worker
    actor_cls = ray.remote(RolloutWorker).options(
        num_cpus=rc.worker_num_cpus, num_gpus=rc.worker_num_gpus, max_restarts=0,
        scheduling_strategy="SPREAD", max_concurrency=capacity + 16)
    start_version = learner.policy_version

    def spawn(index: int, generation: int) -> Any:
        seed = (parts.seed + learner.steps_done + WORKER_SEED_STRIDE *
                (index + 1 + rc.rollout_workers * generation))
        spec = WorkerSpec(rollouts=dataclasses.replace(parts.rollouts, backend=shares[index]),
                          policy_path=serve_from, tokenizer_path=tokenizer_path,
                          version=start_version, seed=seed,
                          run_dir=str(run_dir / "workers" / f"worker{index}"),
                          threads=rc.worker_threads,
                          server_actors=(rc.server_num_cpus, rc.server_num_gpus)
                          if rc.server_actors else None)
        return actor_cls.remote(spec, index)

    def kill(handle: Any) -> None:
        ray.kill(handle, no_restart=True)

    async def close() -> None:
        learner.kill()
        if shutdown:
            await asyncio.to_thread(ray.shutdown)

    pool = WorkerPool(spawn, workers=rc.rollout_workers, capacity=capacity,
                      dead_errors=_dead_errors(), max_restarts=rc.max_worker_restarts,
                      version=start_version, kill=kill,
                      startup_timeout_s=rc.startup_timeout_s, on_close=close)
    try:
        asyncio.run(pool.start())
    except BaseException:
        asyncio.run(pool.aclose())
        raise
    logger.info("%d rollout workers up (pids %s), %d episodes each", rc.rollout_workers,
                [s["pid"] for s in pool.stats()], capacity)
    return pool
