"""The builder: the one reader of a :class:`~sao_gym.runtime.config.TrainConfig`.

Everything else receives parts or scalars. :func:`build_trainer` turns a
config into a :class:`~sao_gym.runtime.trainer.Trainer` with its rollout
source, learner, inference backend, metric sink and checkpointer;
:func:`check_setup` finds the mistakes that would otherwise surface after
minutes of set-up (an unknown env, a warm start without an oracle, a model
that is not there); the small ``*_settings`` helpers give the job the
scalars it passes to the warm start and to evaluation.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import sao_gym
from sao_gym.learner.algorithms import find_algorithm
from sao_gym.runtime.config import ConfigError, TrainConfig, save_config
from sao_gym.runtime.source import RolloutSource

logger = logging.getLogger(__name__)

WARM_START_CHECKS = 16
"""Tasks the warm-start oracle is tried on before a run (a setup error if one fails)."""


class SetupError(ConfigError):
    """The config is valid but cannot run here (unknown env, no oracle, missing model)."""


def env_factory(config: TrainConfig) -> Callable[[], Any]:
    """Builds one environment of the run (its turn limit and constructor options applied)."""
    return functools.partial(sao_gym.make, config.env,
                             max_episode_steps=config.rollout.max_episode_steps,
                             **config.env_kwargs)


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


def learner_config(config: TrainConfig) -> Any:
    """The learner's config, with the group size of grouped algorithms taken from rollout."""
    if find_algorithm(config.algorithm).grouped:
        return dataclasses.replace(config.learner, group_size=config.rollout.group_size)
    return config.learner


def build_backend(config: TrainConfig, model_path: str, *, version: int, seed: int,
                  run_dir: str | Path | None = None, launcher: Callable[..., Any] | None = None
                  ) -> Any:
    """The inference backend named by ``inference.backend``, serving ``model_path``.

    ``vllm_server`` with ``inference.launch: N`` starts N servers here with
    ``launcher`` (:class:`~sao_gym.inference.launch.LocalServers`' signature
    and ``start``/``replace``/``stop``; default: LocalServers, child
    processes), their logs in ``run_dir/servers``; the backend starts a dead
    one again (``inference.max_server_restarts``) and stops them when
    closed. State dicts are published for servers under ``run_dir/weights``.
    """
    inf = config.inference
    if inf.backend == "hf":
        from sao_gym.inference.hf import HFBackend

        return HFBackend(model_path, max_batch_size=inf.max_batch_size, seed=seed,
                         policy_version=version)
    max_model_len = inf.max_model_len or config.rollout.max_context_tokens
    if inf.backend == "vllm":
        from sao_gym.inference.vllm import VLLMBackend

        return VLLMBackend(model_path, seed=seed, policy_version=version,
                           max_model_len=max_model_len)
    from sao_gym.inference.launch import LocalServers
    from sao_gym.inference.vllm_server import VLLMServerBackend

    work = Path(run_dir) if run_dir is not None else None
    urls, servers = list(inf.urls), None
    if not urls:
        servers = (launcher or LocalServers)(
            model_path, inf.launch, kind=inf.server, python=inf.server_python,
            log_dir=(work or Path(".")) / "servers", max_model_len=max_model_len,
            served_model_name=inf.model_name, max_batch_size=inf.max_batch_size,
            startup_timeout_s=inf.startup_timeout_s, max_restarts=inf.max_server_restarts)
        urls = servers.start()
    return VLLMServerBackend(urls, model=inf.model_name, policy_version=version,
                             sync_dir=work / "weights" if work is not None else None,
                             read_timeout_s=inf.read_timeout_s,
                             initial_weights=model_path if inf.urls else None,
                             on_close=servers.stop if servers is not None else None,
                             replace=servers.replace
                             if servers is not None and inf.max_server_restarts else None)


def agent_factory(config: TrainConfig, backend: Any, tokenizer: Any, *,
                  temperature: float | None = None) -> Callable[..., Any]:
    """Builds one agent per episode, sampling from ``backend``.

    ``temperature`` defaults to ``rollout.temperature``; extra keyword
    arguments of the factory (``seed``) go to the agent.
    """
    from sao_gym.agents import LLMAgent

    r = config.rollout
    if r.max_new_tokens is None or r.max_context_tokens is None:
        raise SetupError("rollout.max_new_tokens / max_context_tokens are null (fitted to the "
                         "env by `sao-gym train`): fit them first (sao_gym.runtime.fit)")
    return functools.partial(LLMAgent, backend, tokenizer, max_new_tokens=r.max_new_tokens,
                             temperature=r.temperature if temperature is None else temperature,
                             top_p=r.top_p, max_context_tokens=r.max_context_tokens)


def resume_point(config: TrainConfig, run_dir: Path, *, resume: bool) -> tuple[Path | None, int]:
    """``(latest checkpoint or None, first task seed)``; a fresh run saves its config here."""
    from sao_gym.runtime.checkpoint import CheckpointManager

    latest = CheckpointManager(run_dir).latest() if resume else None
    if latest is not None:
        state = json.loads((latest / "trainer.json").read_text())
        logger.info("resuming from %s (step %d)", latest, state["step"])
        return latest, int(state["next_seed"])
    if not resume:
        save_config(config, run_dir / "config.yaml")
    return None, config.seed


def rollout_source(config: TrainConfig, play: Any, *, concurrency: int, seed: int,
                   version: int, max_versions_per_step: int) -> RolloutSource:
    """The run's :class:`RolloutSource` (the one staleness rule) over ``play``."""
    r = config.rollout
    return RolloutSource(play, batch_size=r.batch_size, group_size=r.group_size,
                         concurrency=concurrency, max_staleness=config.max_staleness,
                         max_versions_per_step=max_versions_per_step,
                         max_infra_retries=r.max_infra_retries, seed=seed, version=version)


def metric_sink(config: TrainConfig, run_dir: Path, *, resume_step: int | None,
                sinks: Sequence[Any] = ()) -> Any:
    """The loggers of ``logging.loggers``, then ``sinks``."""
    from sao_gym.logging import make_loggers

    sink = make_loggers(config.logging.names, run_dir, config=config.to_dict(),
                        resume_step=resume_step)
    sink.others.extend(sinks)
    return sink


def build_trainer(config: TrainConfig, run_dir: str | Path, *, policy_path: str,
                  resume: bool = False, sinks: Sequence[Any] = ()) -> Any:
    """A :class:`~sao_gym.runtime.trainer.Trainer` for ``config`` in ``run_dir``.

    ``policy_path`` is the starting checkpoint (the model after any warm
    start); with ``resume`` the latest checkpoint's learner state, policy and
    task cursor win. ``sinks`` (e.g. the console display) receive every
    step's metrics after the loggers of ``logging.loggers``. ``runtime: ray``
    builds the same trainer over Ray actors
    (:func:`sao_gym.runtime.ray.build.build_ray_trainer`).
    """
    if config.runtime == "ray":
        from sao_gym.runtime.ray.build import build_ray_trainer

        return build_ray_trainer(config, run_dir, policy_path=policy_path, resume=resume,
                                 sinks=sinks)
    from transformers import AutoTokenizer

    from sao_gym.learner.sao import build_learner
    from sao_gym.rollout import play_episode
    from sao_gym.runtime.checkpoint import CheckpointManager
    from sao_gym.runtime.trainer import Trainer

    require_env(config)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    make_env = env_factory(config)
    make_env().close()  # fail fast on a bad env config
    learner = build_learner(config.algorithm, policy_path, learner_config(config),
                            total_steps=config.total_steps, temperature=config.rollout.temperature)
    latest, next_seed = resume_point(config, run_dir, resume=resume)
    serve_from = policy_path
    if latest is not None:
        learner.load_state_dict(CheckpointManager.load(latest)[0])
        serve_from = str(latest / "policy")
    backend = build_backend(config, serve_from, version=learner.policy_version,
                            seed=config.seed + learner.steps_done, run_dir=run_dir)
    make_agent = agent_factory(config, backend, AutoTokenizer.from_pretrained(policy_path))

    async def play(seed: int):
        return await play_episode(make_env, make_agent, seed=seed)

    source = rollout_source(config, play, concurrency=config.rollout.concurrency,
                            seed=next_seed, version=learner.policy_version,
                            max_versions_per_step=learner.max_versions_per_step)
    sink = metric_sink(config, run_dir, resume_step=learner.steps_done if resume else None,
                       sinks=sinks)
    return Trainer(source=source, learner=learner, backend=backend, sink=sink,
                   checkpoints=CheckpointManager(run_dir, keep=config.checkpoint.keep),
                   total_steps=config.total_steps, checkpoint_every=config.checkpoint.every)
