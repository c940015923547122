"""``runtime: ray``: the run's :class:`~sao_gym.runtime.trainer.Trainer` over Ray actors.

What runs where:

- the **driver** (the ``sao-gym train`` process): the trainer loop, the one
  :class:`~sao_gym.runtime.source.RolloutSource` (admission and the
  staleness bound), the metric sinks and the :class:`WorkerPool`;
- ``ray.rollout_workers`` **rollout workers**
  (:class:`~sao_gym.runtime.ray.worker.RolloutWorker`, spread over the
  nodes), each with its own environments, agents and backend: in-process
  (``hf``, ``vllm``), or clients of its share of the inference servers
  (``vllm_server``: ``inference.urls`` dealt round-robin, or
  ``inference.launch`` servers started by the workers, the same number on each,
  as child processes or, with ``ray.server_actors``, as actors of their own);
- one **learner** (:class:`~sao_gym.runtime.ray.learner.LearnerService`),
  which also writes the checkpoints.

Everything else is the single-process run's: the same config, the same
resume (latest checkpoint, task cursor, metrics cut back to it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sao_gym.runtime.config import ConfigError, TrainConfig

logger = logging.getLogger(__name__)

WORKER_SEED_STRIDE = 1_000_003
"""Sampling seeds of rollout workers (and of their replacements) lie this far apart."""


def worker_config(config: TrainConfig, index: int) -> TrainConfig:
    """``config`` with worker ``index``'s share of the inference servers.

    ``inference.urls`` are dealt round-robin (there must be at least one per
    worker: a server is driven, weights included, by one worker);
    ``inference.launch: N`` becomes ``N / rollout_workers`` servers each.
    """
    inf, workers = config.inference, config.ray.rollout_workers
    if inf.backend != "vllm_server":
        return config
    if inf.urls:
        if len(inf.urls) < workers:
            raise ConfigError(f"runtime=ray with inference.urls needs at least one server per "
                              f"rollout worker: {len(inf.urls)} urls, "
                              f"ray.rollout_workers={workers}")
        share = dataclasses.replace(inf, urls=list(inf.urls[index::workers]))
    else:
        if inf.launch % workers:
            raise ConfigError(f"runtime=ray: inference.launch ({inf.launch}) must be a multiple "
                              f"of ray.rollout_workers ({workers}); each worker starts its share")
        share = dataclasses.replace(inf, launch=inf.launch // workers)
    return dataclasses.replace(config, inference=share)


def build_ray_trainer(config: TrainConfig, run_dir: str | Path, *, policy_path: str,
                      resume: bool = False, sinks: Sequence[Any] = ()) -> Any:
    """A :class:`~sao_gym.runtime.trainer.Trainer` whose parts are Ray actors (module docs).

    Connects to Ray (``ray.address``; a local instance on 127.0.0.1 when null,
    shut down when the trainer closes), starts the learner and the rollout
    workers, and waits until each is ready (``ray.startup_timeout_s``).
    """
    from sao_gym.runtime.build import metric_sink, resume_point, rollout_source
    from sao_gym.runtime.ray.cluster import connect
    from sao_gym.runtime.trainer import Trainer

    for i in range(config.ray.rollout_workers):
        worker_config(config, i)  # a bad server share fails before Ray starts
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rc = config.ray
    started = connect(rc.address, num_cpus=rc.num_cpus,
                      object_store_memory_mb=rc.object_store_memory_mb)
    import ray

    try:
        latest, next_seed = resume_point(config, run_dir, resume=resume)
        learner = _start_learner(config, policy_path, run_dir, latest)
        pool = _start_pool(config, run_dir, learner,
                           serve_from=str(latest / "policy") if latest else policy_path,
                           tokenizer_path=policy_path, shutdown=started)
    except BaseException:
        if started:
            ray.shutdown()
        raise
    source = rollout_source(config, pool.play, concurrency=pool.concurrency, seed=next_seed,
                            version=learner.policy_version,
                            max_versions_per_step=learner.max_versions_per_step)
    sink = metric_sink(config, run_dir, resume_step=learner.steps_done if resume else None,
                       sinks=sinks)
    from sao_gym.runtime.ray.learner import RemoteCheckpointer

    return Trainer(source=source, learner=learner, backend=pool, sink=sink,
                   checkpoints=RemoteCheckpointer(learner), total_steps=config.total_steps,
                   checkpoint_every=config.checkpoint.every)


def _dead_errors() -> tuple[type[BaseException], ...]:
    import ray.exceptions

    return (ray.exceptions.RayActorError,)


def _start_learner(config: TrainConfig, policy_path: str, run_dir: Path,
                   latest: Path | None) -> Any:
    import ray

    from sao_gym.runtime.ray.learner import LearnerService, RemoteLearner

    rc = config.ray
    actor = ray.remote(LearnerService).options(
        num_cpus=rc.learner_num_cpus, num_gpus=rc.learner_num_gpus, max_restarts=0,
    ).remote(config, policy_path, str(run_dir), str(latest) if latest is not None else None)
    try:
        info = ray.get(actor.info.remote(), timeout=rc.startup_timeout_s)
    except ray.exceptions.GetTimeoutError:
        ray.kill(actor)
        raise TimeoutError(f"the learner actor was not up within ray.startup_timeout_s="
                           f"{rc.startup_timeout_s} s (not enough resources in the cluster?)"
                           ) from None
    logger.info("learner actor up (pid %d, %d torch threads, step %d)", info["pid"],
                info["threads"], info["steps_done"])
    return RemoteLearner(actor, info, dead_errors=_dead_errors(), run_dir=run_dir)


def _start_pool(config: TrainConfig, run_dir: Path, learner: Any, *, serve_from: str,
                tokenizer_path: str, shutdown: bool) -> Any:
    import ray

    from sao_gym.runtime.ray.pool import WorkerPool
    from sao_gym.runtime.ray.worker import RolloutWorker, WorkerSpec

    rc = config.ray
    capacity = config.episodes_per_worker
    actor_cls = ray.remote(RolloutWorker).options(
        num_cpus=rc.worker_num_cpus, num_gpus=rc.worker_num_gpus, max_restarts=0,
        scheduling_strategy="SPREAD", max_concurrency=capacity + 16)
    start_version = learner.policy_version

    def spawn(index: int, generation: int) -> Any:
        seed = (config.seed + learner.steps_done + WORKER_SEED_STRIDE *
                (index + 1 + rc.rollout_workers * generation))
        spec = WorkerSpec(config=worker_config(config, index), policy_path=serve_from,
                          tokenizer_path=tokenizer_path, version=start_version, seed=seed,
                          run_dir=str(run_dir / "workers" / f"worker{index}"))
        return actor_cls.remote(spec, index)

    def kill(handle: Any) -> None:
        ray.kill(handle, no_restart=True)

    async def close() -> None:
        try:
            ray.kill(learner.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - it may be dead already
            pass
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
