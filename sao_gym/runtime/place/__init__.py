"""Where a run's parts run: the same factories, placed.

- :mod:`~sao_gym.runtime.place.local`: every part in this process (a learner
  of several ranks as a local rank group, :mod:`sao_gym.learner.ranks`);
- :mod:`~sao_gym.runtime.place.ray`: rollout workers, the learner's ranks and
  inference servers as Ray actors.

Each returns the same :class:`~sao_gym.runtime.loop.trainer.Trainer`;
:data:`~sao_gym.runtime.config.schema.RUNTIMES` names them.
"""
