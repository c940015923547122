"""What a run's parts are: small picklable factories, built once from the config.

:func:`sao_gym.runtime.config.build.run_parts` reads the config once and returns a
:class:`RunParts`; each factory holds only the values it uses, so the same
objects build the parts in this process (``runtime: local``) or are shipped
to Ray actors (``runtime: ray``), and no actor ever sees a config:

- :class:`EnvFactory`: one environment of the run (id, turn limit, options);
- the ``inference`` section (:mod:`sao_gym.inference.sections`): its own
  keys and builder of the backend (a Ray worker's share of the servers with
  its ``share``);
- :class:`AgentFactory`: the sampling settings of one agent per episode;
- :class:`RolloutFactory`: env + backend + agent -> :class:`Rollouts`
  (``play(seed, sample_seed)``, ``update_weights``, ``aclose``);
- :class:`LearnerFactory`: the learner (algorithm, learner config, run length,
  temperature), from a checkpoint on resume;
- :class:`SourceFactory`: the :class:`~sao_gym.runtime.loop.source.RolloutSource`
  (batch, groups, staleness bound);
- :class:`SinkFactory`: the metric loggers.

Where they run is the runtime's business (:mod:`sao_gym.runtime.place.local`,
:mod:`sao_gym.runtime.place.ray.build`); evaluation builds its rollouts from the
same :class:`RolloutFactory`, so ``inference.backend`` applies to it too.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sao_gym.curriculum import Curriculum
from sao_gym.inference.base import SamplesOn
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
class AgentFactory:
    """How each episode's agent samples."""

    max_new_tokens: int | None
    """Tokens one turn may sample (None: not fitted yet, :meth:`RolloutFactory.with_budgets`)."""
    max_context_tokens: int | None
    """Tokens of a whole episode (None: likewise)."""
    temperature: float = 1.0
    top_p: float = 1.0
    tool_schemas: str = "env"
    """How prompts show the tools (``rollout.tool_schemas``)."""

    def check(self) -> None:
        """Raise ``ValueError`` when a token budget is still null (not fitted)."""
        if self.max_new_tokens is None or self.max_context_tokens is None:
            raise ValueError("the token budgets (rollout.max_new_tokens / max_context_tokens) "
                             "are null: `sao-gym train` fits them to the env's demonstrations "
                             "(sao_gym.runtime.prepare.fit); set them to build agents without")

    def __call__(self, backend: Any, tokenizer: Any) -> Callable[..., Any]:
        """Builds one agent per episode on ``backend``.

        Extra keyword arguments of the returned factory (``seed``) go to the agent.
        """
        from sao_gym.agents import LLMAgent

        self.check()
        return functools.partial(LLMAgent, backend, tokenizer,
                                 max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                                 top_p=self.top_p, max_context_tokens=self.max_context_tokens,
                                 tool_schemas=self.tool_schemas)


class Rollouts(SamplesOn):
    """Episodes of one process: its environments, backend and agents.

    The ``play`` of a :class:`~sao_gym.runtime.loop.source.RolloutSource` and the
    ``backend`` of a :class:`~sao_gym.runtime.loop.trainer.Trainer` (it loads new
    weights). Evaluation plays through ``play`` too.
    """

    def __init__(self, make_env: EnvFactory, backend: Any, make_agent: Callable[..., Any]):
        self.make_env, self.backend, self.make_agent = make_env, backend, make_agent

    async def play(self, seed: int, sample_seed: int | None = None,
                   env_kwargs: Mapping[str, Any] | None = None) -> Any:
        """One episode on the task of ``seed``.

        Its agent samples with ``sample_seed`` (None: the backend's shared stream);
        ``env_kwargs`` override the env's constructor options (a curriculum's level).
        """
        from sao_gym.rollout import play_episode

        make_agent = (self.make_agent if sample_seed is None
                      else functools.partial(self.make_agent, seed=sample_seed))
        make_env = (self.make_env if not env_kwargs else dataclasses.replace(
            self.make_env, kwargs={**self.make_env.kwargs, **env_kwargs}))
        return await play_episode(make_env, make_agent, seed=seed)

    async def aclose(self) -> None:
        """Release the backend (and any servers it started)."""
        await self.backend.aclose()


@dataclass(frozen=True)
class HarnessFactory:
    """A harness of the user's as the agent: its tasks and how its reward is taken."""

    harness: Any
    """The :class:`~sao_gym.gateway.harness.Harness` (a program or a command)."""
    tasks: Any
    """The :class:`~sao_gym.gateway.tasks.TaskSource`."""
    reward: str | None = None
    """``MODULE:NAME`` of a verifier, or None."""
    workers: int = 0
    """Worker processes that run a program harness's episodes (0: the rollouts' own loop)."""

    def __call__(self, backend: Any, tokenizer: Any, agent: AgentFactory) -> Any:
        """The :class:`~sao_gym.gateway.rollouts.HarnessRollouts` over ``backend``."""
        from sao_gym.gateway.rollouts import HarnessRollouts

        agent.check()
        return HarnessRollouts(self.harness, self.tasks, backend, tokenizer,
                               max_new_tokens=agent.max_new_tokens,
                               max_context_tokens=agent.max_context_tokens,
                               temperature=agent.temperature, top_p=agent.top_p,
                               reward=self.reward, workers=self.workers)


@dataclass(frozen=True)
class RolloutFactory:
    """Env + backend + agent: the :class:`Rollouts` of one process.

    With a ``harness`` the episodes are the harness's, through the gateway
    (:class:`~sao_gym.gateway.rollouts.HarnessRollouts`, the same ``play``).
    """

    env: EnvFactory
    backend: Any
    """The inference section (:mod:`sao_gym.inference.sections`): builds the backend."""
    agent: AgentFactory
    harness: HarnessFactory | None = None

    def __call__(self, model_path: str, *, tokenizer_path: str | None = None, version: int = 0,
                 seed: int = 0, run_dir: str | Path | None = None,
                 launcher: Callable[..., Any] | None = None) -> Rollouts:
        """Rollouts sampling from ``model_path`` (its tokenizer: ``tokenizer_path``)."""
        from transformers import AutoTokenizer

        self.agent.check()  # null budgets fail here, before a backend starts
        backend = self.backend(model_path, version=version, seed=seed, run_dir=run_dir,
                               launcher=launcher)
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path or model_path)
        if self.harness is not None:
            return self.harness(backend, tokenizer, self.agent)
        return Rollouts(self.env, backend, self.agent(backend, tokenizer))

    def with_budgets(self, max_new_tokens: int | None, max_context_tokens: int | None
                     ) -> RolloutFactory:
        """These rollouts with the given token budgets.

        The one rule of a backend's context limit: an inference section whose
        ``max_model_len`` is null serves ``max_context_tokens`` (the agent's context).
        """
        agent = dataclasses.replace(self.agent, max_new_tokens=max_new_tokens,
                                    max_context_tokens=max_context_tokens)
        backend = self.backend
        if getattr(backend, "max_model_len", 0) is None and max_context_tokens is not None:
            backend = dataclasses.replace(backend, max_model_len=max_context_tokens)
        return dataclasses.replace(self, backend=backend, agent=agent)


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
        from sao_gym.learner.learner import build_learner

        learner = build_learner(self.algorithm, policy_path, self.config,
                                total_steps=self.total_steps, temperature=self.temperature,
                                group_size=self.group_size)
        if resume_from is not None:
            learner.load_state(resume_from)
        return learner


@dataclass(frozen=True)
class SourceFactory:
    """The run's :class:`~sao_gym.runtime.loop.source.RolloutSource` (the one staleness rule)."""

    batch_size: int
    group_size: int = 1
    max_staleness: int = 1
    max_infra_retries: int = 3

    def __call__(self, play: Any, *, concurrency: int, seed: int, version: int,
                 max_versions_per_step: int, sample_seed: int = 0,
                 difficulty: Callable[[], Any] | None = None) -> Any:
        """The source over ``play`` (an episode per seed), from task ``seed`` on.

        Its episodes' sampling seeds mix in ``sample_seed`` (the run's seed);
        ``difficulty``: a curriculum's ``current`` (each group's level).
        """
        from sao_gym.runtime.loop.source import RolloutSource

        return RolloutSource(play, batch_size=self.batch_size, group_size=self.group_size,
                             concurrency=concurrency, max_staleness=self.max_staleness,
                             max_versions_per_step=max_versions_per_step,
                             max_infra_retries=self.max_infra_retries, seed=seed,
                             sample_seed=sample_seed, version=version, difficulty=difficulty)


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
class RecorderFactory:
    """What the run keeps of its training rollouts (``logging.rollouts_*``)."""

    per_step: int = 4
    """Rollouts of each batch traced and kept (0: only infrastructure failures)."""
    segment_bytes: int = 64 << 20
    max_bytes: int | None = 1 << 30
    seed: int = 0

    def __call__(self, run_dir: Path, *, tokenizer_path: str | None = None) -> Any:
        """The rollout recorder of ``run_dir``'s ``train`` split.

        A :class:`~sao_gym.runtime.loop.recorder.RolloutRecorder`.
        ``tokenizer_path``: the tokenizer that decodes each kept token's text.
        """
        from sao_gym.rollout_store import RolloutWriter
        from sao_gym.runtime.loop.recorder import RolloutRecorder

        tokenizer = None
        if tokenizer_path is not None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        writer = RolloutWriter(run_dir, "train", segment_bytes=self.segment_bytes,
                               max_bytes=self.max_bytes)
        return RolloutRecorder(writer, per_step=self.per_step, tokenizer=tokenizer,
                               seed=self.seed)


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
    """``runtime: ray``: the run's :class:`~sao_gym.runtime.config.schema.RayConfig` (where the
    actors go); None for a local run."""
    episodes_per_worker: int = 1
    """``runtime: ray``: episodes each rollout worker runs at once."""
    recorder: RecorderFactory | None = None
    """What the run keeps of its training rollouts (None: nothing)."""
    curriculum: Curriculum | None = None
    """The run's difficulty curriculum at its first level (None: none): a template,
    :meth:`climb` gives each placement its own."""

    def climb(self, checkpoint: str | Path | None = None) -> Curriculum | None:
        """A fresh copy of :attr:`curriculum`, at ``checkpoint``'s level when it has one."""
        if self.curriculum is None:
            return None
        fresh = dataclasses.replace(self.curriculum)
        if checkpoint is not None:
            from sao_gym.runtime.loop.checkpoint import CheckpointManager

            state = CheckpointManager.trainer_state(checkpoint).get("curriculum")
            if state is not None:
                fresh.load_state_dict(state)
        return fresh

    def starting_at(self, level: int) -> RunParts:
        """These parts with the curriculum starting at ladder index ``level``.

        ``level``: where the warm start ended. Unchanged without a curriculum.
        """
        if self.curriculum is None:
            return self
        return dataclasses.replace(self, curriculum=dataclasses.replace(
            self.curriculum, index=min(level, len(self.curriculum.levels) - 1)))


__all__ = ["AgentFactory", "EnvFactory", "HarnessFactory", "LearnerFactory", "RecorderFactory",
           "RolloutFactory",
           "Rollouts", "RunParts", "SinkFactory", "SourceFactory"]
