"""The learner: loss and advantage math (pure functions), the critic, and SAO.

- :mod:`~sao_gym.learner.losses`: DIS, PPO clip, value loss, aggregations.
- :mod:`~sao_gym.learner.advantages`: skip-observation GAE, length-adaptive
  lambda, GRPO normalisation, running-mean baseline, explained variance.
- :mod:`~sao_gym.learner.algorithms`: the algorithms as records of functions;
  :mod:`~sao_gym.learner.estimators`: their advantage estimators.
- :mod:`~sao_gym.learner.engine`: what touches devices and optimizers (one model).
- :mod:`~sao_gym.learner.critic`: :class:`ValueModel`, frozen attention projections.
- :mod:`~sao_gym.learner.batching`: micro-batches under a token budget, policy
  minibatches, logprobs at the sampling temperature.
- :mod:`~sao_gym.learner.schedule`: learning-rate schedules.
- :mod:`~sao_gym.learner.learner`: :class:`Learner`, :func:`build_learner`.

Nothing here touches environments.
"""
