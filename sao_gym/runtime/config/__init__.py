"""A run's configuration, and the one reader that turns it into records.

- :mod:`~sao_gym.runtime.config.schema`: :class:`TrainConfig`, one frozen
  dataclass per component, validated on construction;
- :mod:`~sao_gym.runtime.config.loader`: YAML files, recipes and ``--set``
  overrides into a :class:`TrainConfig` (and back to YAML);
- :mod:`~sao_gym.runtime.config.build`: the builder, the only module that
  reads a config's fields: it returns the run's factories
  (:mod:`sao_gym.runtime.parts`) and plans (:mod:`sao_gym.runtime.plans`),
  which is all the rest of the package receives.
"""
