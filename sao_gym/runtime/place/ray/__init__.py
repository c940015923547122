"""``runtime: ray``: the training run's parts as Ray actors (docs/scale.md).

- :mod:`~sao_gym.runtime.place.ray.cluster`: connecting to Ray with every node,
  raylet and worker on the loopback address when Ray is local, and a
  multi-node local cluster for tests and benchmarks;
- :mod:`~sao_gym.runtime.place.ray.worker`: :class:`RolloutWorker`, an asyncio
  loop of episodes with its own environments, agents and backend;
- :mod:`~sao_gym.runtime.place.ray.pool`: :class:`WorkerPool`, the driver's side of
  the workers: it plays each episode the rollout source admits on the least
  loaded worker, broadcasts new weights, and replaces a worker that died
  (its unfinished episodes run again; finished ones were delivered once);
- :mod:`~sao_gym.runtime.place.ray.learner`: the learner actor and the driver's
  proxies for it (learner and checkpointer);
- :mod:`~sao_gym.runtime.place.ray.servers`: inference servers as actors a worker
  owns (``ray.server_actors``), replaced when their process or actor dies;
- :mod:`~sao_gym.runtime.place.ray.build`: :func:`ray_trainer`, the same
  :class:`~sao_gym.runtime.loop.trainer.Trainer` and
  :class:`~sao_gym.runtime.loop.source.RolloutSource` as one process, with the
  pool as the source's ``play`` and the backend, and the learner remote.

The admission rule and the staleness bound stay in the one
:class:`~sao_gym.runtime.loop.source.RolloutSource` of the driver: a worker only
plays the episodes it is handed.
"""
