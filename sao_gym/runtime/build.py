"""The builder: the one reader of a :class:`~sao_gym.runtime.config.TrainConfig`.

Everything else receives factories or scalars. :func:`run_parts` turns a
config into the run's :class:`~sao_gym.runtime.parts.RunParts` (small
picklable factories: learner, rollouts = env + backend + agent, source,
sink), which a runtime places (:mod:`sao_gym.runtime.local`,
:mod:`sao_gym.runtime.ray.build`); :func:`check_setup` finds the mistakes
that would otherwise surface after minutes of set-up (an unknown env, a warm
start without an oracle, a model that is not there). This module imports
nothing of the runtimes.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from pathlib import Path
from typing import Any

from sao_gym.runtime.config import ConfigError, TrainConfig
from sao_gym.runtime.parts import (
    AgentFactory,
    EnvFactory,
    LearnerFactory,
    RecorderFactory,
    RolloutFactory,
    RunParts,
    SinkFactory,
    SourceFactory,
)

logger = logging.getLogger(__name__)

WARM_START_CHECKS = 16
"""Tasks the warm-start oracle is tried on before a run (a setup error if one fails)."""


class SetupError(ConfigError):
    """The config is valid but cannot run here (unknown env, no oracle, missing model)."""


def env_factory(config: TrainConfig) -> EnvFactory:
    """Builds one environment of the run (its turn limit and constructor options applied)."""
    return EnvFactory(require_env(config), config.rollout.max_episode_steps,
                      dict(config.env_kwargs))


def oracle_for(env_id: str, **kwargs: Any) -> Any:
    """The demonstration policy registered with ``env_id``, its options bound; None if none."""
    from sao_gym.registration import env_oracle

    oracle = env_oracle(env_id)
    if oracle is None:
        if kwargs:
            raise SetupError(f"warm_start.oracle sets options {sorted(kwargs)}, but {env_id} "
                             "registers no oracle (sao_gym.register(..., oracle=...))")
        return None
    return functools.partial(oracle, **kwargs) if kwargs else oracle


def require_env(config: TrainConfig) -> str:
    """The run's env id; a :class:`SetupError` when the config names none."""
    if config.env is None:
        raise SetupError("no environment: set env=ID in the config or --set env=ID "
                         "(module:ID for an env your own module registers)")
    return config.env


def check_setup(config: TrainConfig) -> None:
    """Raise :class:`SetupError` (one line) for what would fail later in the job."""
    env_id = require_env(config)
    try:
        env = env_factory(config)()
    except Exception as e:  # noqa: BLE001 - any failure to build is a setup error
        hint = ""
        if isinstance(e, TypeError) and config.env_kwargs:
            hint = (f" (env_kwargs {config.env_kwargs} come from the config or recipe; "
                    "--set 'env_kwargs={}' clears them)")
        raise SetupError(f"cannot make env {env_id!r}: {type(e).__name__}: {e}{hint}"
                         ) from None
    ws = config.warm_start
    try:
        if ws is not None and ws.steps and ws.demonstrations is not None:
            from sao_gym.runtime.conversations import load_conversations

            try:
                load_conversations(ws.demonstrations)
            except ValueError as e:
                raise SetupError(f"warm_start.demonstrations: {e}") from None
        elif ws is not None and ws.steps:
            oracle = oracle_for(env_id, **ws.oracle)
            try:  # it must play this env's tasks (it may know only some kinds); a sample of them
                for i in range(WARM_START_CHECKS if oracle is not None else 0):
                    obs, _ = env.reset(seed=config.seed + i)
                    oracle(obs, env.unwrapped.task)
            except Exception as e:  # noqa: BLE001 - any failure is a setup error
                raise SetupError(f"the warm-start oracle of {env_id} cannot play its tasks "
                                 f"(env_kwargs {config.env_kwargs}): {e}") from None
    finally:
        env.close()
    if config.model not in ("tiny", "smollm2") and not (Path(config.model) /
                                                        "config.json").is_file():
        raise SetupError(f"model {config.model!r} is neither 'tiny', 'smollm2' nor a local "
                         "Hugging Face checkpoint directory")


def learner_factory(config: TrainConfig) -> LearnerFactory:
    """The learner: algorithm, learner config, run length, sampler temperature, group size.

    The group size is ``rollout.group_size``, the one place it is set.
    """
    return LearnerFactory(config.algorithm, config.learner, config.total_steps,
                          config.rollout.temperature, config.rollout.group_size)


def backend_factory(config: TrainConfig, *, batch_invariant: bool = False) -> Any:
    """The ``inference`` section: its own keys and the builder of the backend.

    A null context limit of an in-process or launched vLLM is ``rollout.max_context_tokens``;
    a null ``batch_invariant`` of the hf backend is ``batch_invariant`` (training a
    sync run passes True: :func:`run_parts`); launched servers load adapters of the
    learner's LoRA rank.
    """
    inf = config.inference
    if getattr(inf, "max_lora_rank", 0) is None and config.learner.lora is not None:
        inf = dataclasses.replace(inf, max_lora_rank=config.learner.lora.rank)
    if getattr(inf, "max_model_len", 0) is None:
        inf = dataclasses.replace(inf, max_model_len=config.rollout.max_context_tokens)
    if getattr(inf, "batch_invariant", False) is None:
        inf = dataclasses.replace(inf, batch_invariant=batch_invariant)
    return inf


def agent_factory(config: TrainConfig, *, temperature: float | None = None) -> AgentFactory:
    """How agents sample (``temperature`` defaults to ``rollout.temperature``)."""
    r = config.rollout
    if r.max_new_tokens is None or r.max_context_tokens is None:
        raise SetupError("rollout.max_new_tokens / max_context_tokens are null (fitted to the "
                         "env by `sao-gym train`): fit them first (sao_gym.runtime.fit)")
    return AgentFactory(r.max_new_tokens, r.max_context_tokens,
                        temperature=r.temperature if temperature is None else temperature,
                        top_p=r.top_p, tool_schemas=r.tool_schemas)


def rollout_factory(config: TrainConfig, *, temperature: float | None = None,
                    training: bool = False) -> RolloutFactory:
    """Env + backend + agent of the run (evaluation passes its own ``temperature``).

    The ``training`` rollouts of a sync run are batch-invariant unless the config
    says otherwise: with each episode's own sampling seed
    (:func:`~sao_gym.runtime.source.episode_seed`) such a run is reproducible.
    """
    invariant = training and config.max_staleness == 0
    return RolloutFactory(env_factory(config), backend_factory(config, batch_invariant=invariant),
                          agent_factory(config, temperature=temperature))


def rollout_bytes(config: TrainConfig) -> tuple[int, int | None]:
    """``(segment_bytes, max_bytes)`` of the run's kept rollouts (``logging.rollouts_*_mb``)."""
    log = config.logging
    mb = 1 << 20
    return (int(log.rollouts_segment_mb * mb),
            None if log.rollouts_max_mb is None else int(log.rollouts_max_mb * mb))


def recorder_factory(config: TrainConfig) -> RecorderFactory:
    """What the run keeps of its training rollouts (``logging.rollouts_*``)."""
    segment, most = rollout_bytes(config)
    return RecorderFactory(config.logging.rollouts_per_step, segment, most, config.seed)


def run_parts(config: TrainConfig) -> RunParts:
    """The run's factories and scalars (:mod:`sao_gym.runtime.parts`): all a runtime needs."""
    r = config.rollout
    return RunParts(
        learner=learner_factory(config), rollouts=rollout_factory(config, training=True),
        source=SourceFactory(r.batch_size, r.group_size, config.max_staleness,
                             r.max_infra_retries),
        sink=SinkFactory(tuple(config.logging.names), config.to_dict()),
        total_steps=config.total_steps, seed=config.seed, concurrency=r.concurrency,
        checkpoint_every=config.checkpoint.every, checkpoint_keep=config.checkpoint.keep,
        ray=config.ray if config.runtime == "ray" else None,
        episodes_per_worker=config.episodes_per_worker,
        recorder=recorder_factory(config))
