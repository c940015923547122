"""The learner: loss and advantage math (pure functions), the critic, and SAO.

- :mod:`~sao_gym.learner.losses`: DIS, PPO clip, value loss, aggregations.
- :mod:`~sao_gym.learner.advantages`: skip-observation GAE, length-adaptive
  lambda, GRPO normalisation, running-mean baseline, explained variance.
- :mod:`~sao_gym.learner.critic`: :class:`ValueModel`.
- :mod:`~sao_gym.learner.batching`: micro-batches under a token budget.
- :mod:`~sao_gym.learner.sao`: :class:`Learner`, :func:`build_learner`.

Nothing here touches environments.
"""
