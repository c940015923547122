"""``runtime: local``: every part of the run in this process.

:func:`local_trainer` calls the run's factories (:mod:`sao_gym.runtime.parts`)
here: the learner (restored from the latest checkpoint on resume; with
``learner.ranks > 1`` a group of local processes,
:func:`~sao_gym.learner.ranks.learner_on_ranks`), the rollouts (env + backend +
agent) serving the policy the learner starts from, the rollout source over
their ``play``, the metric sink and the checkpointer, and returns the
:class:`~sao_gym.runtime.loop.trainer.Trainer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sao_gym.runtime.parts import RunParts


def local_trainer(parts: RunParts, run_dir: str | Path, *, policy_path: str,
                  resume: bool = False, sinks: Sequence[Any] = ()) -> Any:
    """The run's :class:`~sao_gym.runtime.loop.trainer.Trainer`, all in this process.

    ``policy_path`` is the starting checkpoint (the model after any warm start);
    with ``resume`` the latest checkpoint's learner state, policy and task cursor
    win. ``sinks`` receive every step's metrics after the loggers.
    """
    from sao_gym.runtime.loop.checkpoint import CheckpointManager
    from sao_gym.runtime.loop.probe import SamplerCheck
    from sao_gym.runtime.loop.trainer import Trainer

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    parts.rollouts.env().close()  # fail fast on a bad env config
    checkpoints = CheckpointManager(run_dir, keep=parts.checkpoint_keep)
    latest, next_seed = checkpoints.resume_point(parts.seed) if resume else (None, parts.seed)
    if parts.learner.config.ranks > 1:  # the learner's ranks as local processes
        from sao_gym.learner.ranks import learner_on_ranks

        learner = learner_on_ranks(parts.learner, policy_path, resume_from=latest,
                                   run_dir=run_dir)
    else:
        learner = parts.learner(policy_path, resume_from=latest)
    lora = parts.learner.config.lora
    # with adapters the sampler keeps the base model and is sent the adapter first
    serve = str(latest / "policy") if latest and lora is None else policy_path
    rollouts = parts.rollouts(serve,
                              tokenizer_path=policy_path, version=learner.policy_version,
                              seed=parts.seed + learner.steps_done, run_dir=run_dir)
    curriculum = parts.climb(latest)
    source = parts.source(rollouts.play, concurrency=parts.concurrency, seed=next_seed,
                          version=learner.policy_version,
                          max_versions_per_step=learner.max_versions_per_step,
                          sample_seed=parts.seed,
                          difficulty=curriculum.current if curriculum is not None else None)
    sink = parts.sink(run_dir, resume_step=learner.steps_done if resume else None, sinks=sinks)
    return Trainer(source=source, learner=learner, backend=rollouts, sink=sink,
                   checkpoints=checkpoints, total_steps=parts.total_steps,
                   checkpoint_every=parts.checkpoint_every, publish_first=lora is not None,
                   sampler_check=SamplerCheck(lora.check_tolerance, parts.learner.temperature)
                   if lora is not None else None,
                   recorder=parts.recorder(run_dir, tokenizer_path=policy_path)
                   if parts.recorder is not None else None, curriculum=curriculum)
