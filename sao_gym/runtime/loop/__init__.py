"""The training loop, the same in every runtime.

- :mod:`~sao_gym.runtime.loop.source`: :class:`RolloutSource`, admission and
  the one staleness rule over running and queued work (one clock);
- :mod:`~sao_gym.runtime.loop.trainer`: :class:`Trainer`, the async loop
  (batch in, learner step, weights out, checkpoints) and its shutdown order;
- :mod:`~sao_gym.runtime.loop.checkpoint`: atomic checkpoints and the resume point;
- :mod:`~sao_gym.runtime.loop.recorder`: the training rollouts a run keeps;
- :mod:`~sao_gym.runtime.loop.probe`: the check that the sampler serves the
  learner's weights (LoRA).
"""
