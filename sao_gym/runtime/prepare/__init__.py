"""Preparing a run, from a :class:`~sao_gym.runtime.plans.PreparePlan`.

- :mod:`~sao_gym.runtime.prepare.demonstrations`: an oracle's (or a file's)
  episodes played through the agent, so they have RL's exact token layout;
- :mod:`~sao_gym.runtime.prepare.conversations`: a JSONL file of
  conversations, replayed as environments;
- :mod:`~sao_gym.runtime.prepare.fit`: token budgets and label smoothing
  fitted to the demonstrations (a :class:`~sao_gym.runtime.plans.Budgets`
  record, not a new config);
- :mod:`~sao_gym.runtime.prepare.model`: the model before the warm start
  (``tiny`` with a tokenizer that learned the env's text, ``smollm2``, a path);
- :mod:`~sao_gym.runtime.prepare.start`: the model, the supervised warm start
  (:func:`~sao_gym.learner.sft.sft` with one settings record) and resuming an
  interrupted one: the run's starting checkpoint.
"""
