"""What a run's parts are: small picklable factories, built once from the config.

:func:`sao_gym.runtime.build.run_parts` reads the config once and returns a
:class:`RunParts`; each factory holds only the values it uses, so the same
objects build the parts in this process (``runtime: local``) or are shipped
to Ray actors (``runtime: ray``), and no actor ever sees a config:

- :class:`EnvFactory`: one environment of the run (id, turn limit, options);
- :class:`BackendFactory`: the inference backend (its section's values; a
  Ray worker's share of the servers with :meth:`BackendFactory.share`);
- :class:`AgentFactory`: the sampling settings of one agent per episode;
- :class:`RolloutFactory`: env + backend + agent -> :class:`Rollouts`
  (``play(seed)``, ``update_weights``, ``aclose``);
- :class:`LearnerFactory`: the learner (algorithm, learner config, run length,
  temperature), from a checkpoint on resume;
- :class:`SourceFactory`: the :class:`~sao_gym.runtime.source.RolloutSource`
  (batch, groups, staleness bound);
- :class:`SinkFactory`: the metric loggers.

Where they run is the runtime's business (:mod:`sao_gym.runtime.local`,
:mod:`sao_gym.runtime.ray.build`); evaluation builds its rollouts from the
same :class:`RolloutFactory`, so ``inference.backend`` applies to it too.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sao_gym.learner.config import LearnerConfig


@dataclass(frozen=True)
class EnvFactory:
    """Builds one environment of the run."""

    env_id: str
    max_episode_steps: int | None = None
    """Turn limit (None: the env's registered one)."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """The env's constructor options."""

    def __call__(self) -> Any:
        """A new environment."""
        import sao_gym

        return sao_gym.make(self.env_id, max_episode_steps=self.max_episode_steps,
                            **dict(self.kwargs))


@dataclass(frozen=True)
class BackendFactory:
    """Builds the inference backend that serves a checkpoint (docs/inference.md)."""

    kind: str = "hf"
    """``hf``, ``vllm`` or ``vllm_server``."""
    max_batch_size: int = 32
    max_model_len: int | None = None
    """Context limit of in-process vLLM and launched servers."""
    urls: tuple[str, ...] = ()
    """``vllm_server``: running servers."""
    launch: int = 0
    """``vllm_server``: servers to start (with ``server``, ``server_python``)."""
    server: str = "auto"
    server_python: str | None = None
    model_name: str = "policy"
    read_timeout_s: float = 120.0
    startup_timeout_s: float = 600.0
    max_server_restarts: int = 3

    def share(self, index: int, workers: int) -> BackendFactory:
        """Rollout worker ``index``'s share of the servers (of ``workers`` workers).

        ``urls`` are dealt round-robin (at least one per worker: a server is
        driven, weights included, by one worker); ``launch: N`` becomes
        ``N / workers`` servers each. Other backends are not shared.
        """
        if self.kind != "vllm_server":
            return self
        if self.urls:
            if len(self.urls) < workers:
                raise ValueError(f"runtime=ray with inference.urls needs at least one server per "
                                 f"rollout worker: {len(self.urls)} urls, "
                                 f"ray.rollout_workers={workers}")
            return dataclasses.replace(self, urls=tuple(self.urls[index::workers]))
        if self.launch % workers:
            raise ValueError(f"runtime=ray: inference.launch ({self.launch}) must be a multiple "
                             f"of ray.rollout_workers ({workers}); each worker starts its share")
        return dataclasses.replace(self, launch=self.launch // workers)

    def __call__(self, model_path: str, *, version: int, seed: int,
                 run_dir: str | Path | None = None,
                 launcher: Callable[..., Any] | None = None) -> Any:
        """The backend serving ``model_path`` at policy ``version``.

        ``vllm_server`` with ``launch: N`` starts N servers with ``launcher``
        (:class:`~sao_gym.inference.launch.LocalServers`' signature; default:
        LocalServers, child processes), their logs in ``run_dir/servers``; the
        backend starts a dead one again (``max_server_restarts``) and stops
        them when closed. Weights are published for servers under
        ``run_dir/weights``.
        """
        if self.kind == "hf":
            from sao_gym.inference.hf import HFBackend

            return HFBackend(model_path, max_batch_size=self.max_batch_size, seed=seed,
                             policy_version=version)
        if self.kind == "vllm":
            from sao_gym.inference.vllm import VLLMBackend

            return VLLMBackend(model_path, seed=seed, policy_version=version,
                               max_model_len=self.max_model_len)
        from sao_gym.inference.launch import LocalServers
        from sao_gym.inference.vllm_server import VLLMServerBackend

        work = Path(run_dir) if run_dir is not None else None
        urls, servers = list(self.urls), None
        if not urls:
            servers = (launcher or LocalServers)(
                model_path, self.launch, kind=self.server, python=self.server_python,
                log_dir=(work or Path(".")) / "servers", max_model_len=self.max_model_len,
                served_model_name=self.model_name, max_batch_size=self.max_batch_size,
                startup_timeout_s=self.startup_timeout_s, max_restarts=self.max_server_restarts)
            urls = servers.start()
        return VLLMServerBackend(urls, model=self.model_name, policy_version=version,
                                 sync_dir=work / "weights" if work is not None else None,
                                 read_timeout_s=self.read_timeout_s,
                                 initial_weights=model_path if self.urls else None,
                                 on_close=servers.stop if servers is not None else None,
                                 replace=servers.replace
                                 if servers is not None and self.max_server_restarts else None)


@dataclass(frozen=True)
class AgentFactory:
    """How each episode's agent samples."""

    max_new_tokens: int
    max_context_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0

    def __call__(self, backend: Any, tokenizer: Any) -> Callable[..., Any]:
        """Builds one agent per episode on ``backend``.

        Extra keyword arguments of the returned factory (``seed``) go to the agent.
        """
        from sao_gym.agents import LLMAgent

        return functools.partial(LLMAgent, backend, tokenizer,
                                 max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                                 top_p=self.top_p, max_context_tokens=self.max_context_tokens)


class Rollouts:
    """Episodes of one process: its environments, backend and agents.

    The ``play`` of a :class:`~sao_gym.runtime.source.RolloutSource` and the
    ``backend`` of a :class:`~sao_gym.runtime.trainer.Trainer` (it loads new
    weights); ``make_env`` and ``make_agent`` serve evaluation.
    """

    def __init__(self, make_env: EnvFactory, backend: Any, make_agent: Callable[..., Any]):
        self.make_env, self.backend, self.make_agent = make_env, backend, make_agent

    async def play(self, seed: int) -> Any:
        """One episode on the task of ``seed``."""
        from sao_gym.rollout import play_episode

        return await play_episode(self.make_env, self.make_agent, seed=seed)

    async def update_weights(self, weights: Any, version: int) -> None:
        """Serve policy ``version`` from now on."""
        await self.backend.update_weights(weights, version)

    async def aclose(self) -> None:
        """Release the backend (and any servers it started)."""
        await self.backend.aclose()


@dataclass(frozen=True)
class RolloutFactory:
    """Env + backend + agent: the :class:`Rollouts` of one process."""

    env: EnvFactory
    backend: BackendFactory
    agent: AgentFactory

    def __call__(self, model_path: str, *, tokenizer_path: str | None = None, version: int = 0,
                 seed: int = 0, run_dir: str | Path | None = None,
                 launcher: Callable[..., Any] | None = None) -> Rollouts:
        """Rollouts sampling from ``model_path`` (its tokenizer: ``tokenizer_path``)."""
        from transformers import AutoTokenizer

        backend = self.backend(model_path, version=version, seed=seed, run_dir=run_dir,
                               launcher=launcher)
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path or model_path)
        return Rollouts(self.env, backend, self.agent(backend, tokenizer))


@dataclass(frozen=True)
class LearnerFactory:
    """Builds the learner; on resume, loads a checkpoint's learner state."""

    algorithm: str
    config: LearnerConfig
    total_steps: int
    temperature: float = 1.0
    group_size: int = 1
    """Rollouts per group of a grouped algorithm."""

    def __call__(self, policy_path: str, resume_from: str | Path | None = None) -> Any:
        """The learner training ``policy_path`` (or ``resume_from``'s learner state)."""
        from sao_gym.learner.sao import build_learner
        from sao_gym.runtime.checkpoint import CheckpointManager

        learner = build_learner(self.algorithm, policy_path, self.config,
                                total_steps=self.total_steps, temperature=self.temperature,
                                group_size=self.group_size)
        if resume_from is not None:
            learner.load_state_dict(CheckpointManager.load(resume_from)[0])
        return learner


@dataclass(frozen=True)
class SourceFactory:
    """The run's :class:`~sao_gym.runtime.source.RolloutSource` (the one staleness rule)."""

    batch_size: int
    group_size: int = 1
    max_staleness: int = 1
    max_infra_retries: int = 3

    def __call__(self, play: Any, *, concurrency: int, seed: int, version: int,
                 max_versions_per_step: int) -> Any:
        """The source over ``play`` (an episode per seed), from task ``seed`` on."""
        from sao_gym.runtime.source import RolloutSource

        return RolloutSource(play, batch_size=self.batch_size, group_size=self.group_size,
                             concurrency=concurrency, max_staleness=self.max_staleness,
                             max_versions_per_step=max_versions_per_step,
                             max_infra_retries=self.max_infra_retries, seed=seed,
                             version=version)


@dataclass(frozen=True)
class SinkFactory:
    """The loggers of ``logging.loggers`` (the run's config recorded where they keep one)."""

    names: tuple[str, ...] = ("jsonl",)
    record: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self, run_dir: Path, *, resume_step: int | None, sinks: Sequence[Any] = ()
                 ) -> Any:
        """The loggers writing to ``run_dir``, then ``sinks``."""
        from sao_gym.logging import make_loggers

        sink = make_loggers(list(self.names), run_dir, config=dict(self.record),
                            resume_step=resume_step)
        sink.others.extend(sinks)
        return sink


@dataclass(frozen=True)
class RunParts:
    """Everything a runtime needs to train: the factories and the run's scalars."""

    learner: LearnerFactory
    rollouts: RolloutFactory
    source: SourceFactory
    sink: SinkFactory
    total_steps: int
    seed: int
    concurrency: int
    """Episodes at once (the whole run's, over all workers)."""
    checkpoint_every: int
    checkpoint_keep: int
    ray: Any = None
    """``runtime: ray``: the run's :class:`~sao_gym.runtime.config.RayConfig` (where the
    actors go); None for a local run."""
    episodes_per_worker: int = 1
    """``runtime: ray``: episodes each rollout worker runs at once."""


__all__ = ["AgentFactory", "BackendFactory", "EnvFactory", "LearnerFactory", "RolloutFactory",
           "Rollouts", "RunParts", "SinkFactory", "SourceFactory"]
