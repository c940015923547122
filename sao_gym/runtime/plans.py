"""What a run does before and around training, as records: the plans.

The builder (:mod:`sao_gym.runtime.config.build`) reads a
:class:`~sao_gym.runtime.config.schema.TrainConfig` once and returns these
records; the code that prepares a model, warm-starts it, resumes, evaluates
and trains takes them and never sees the config:

- :class:`TrainPlan`: the whole ``sao-gym train`` job: its
  :class:`PreparePlan`, the run's parts (:class:`~sao_gym.runtime.parts.RunParts`),
  its :class:`EvalPlan`, where the parts run and how often a dead learner is
  restarted, and the run's config as a plain record (saved as ``config.yaml``);
- :class:`PreparePlan`: the model (:class:`ModelPlan`), the demonstrations
  (:class:`DemonstrationPlan`), the warm start's
  :class:`~sao_gym.learner.config.SFTSettings` and the :class:`Budgets` to fit;
- :class:`EvalPlan`: the rollouts of an evaluation, its episodes, temperature
  and seeds.

Budgets the config leaves null are fitted to the env's demonstrations
(:mod:`sao_gym.runtime.prepare.fit`), which returns a :class:`Budgets`
record; :meth:`TrainPlan.fitted` puts it into every record that uses it.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sao_gym.curriculum import Curriculum
from sao_gym.learner.config import SFTSettings
from sao_gym.runtime.parts import EnvFactory, RolloutFactory, RunParts

EVAL_SEED = 1_000_000
"""First env seed of evaluations (far from the training stream's)."""

DEMO_SEED_OFFSET = 10_000_000
"""Warm-start demonstrations are episodes ``seed + DEMO_SEED_OFFSET + i``."""

HOLDOUT_SEED_OFFSET = 20_000_000
"""... and the held-out ones ``seed + HOLDOUT_SEED_OFFSET + i``."""


@dataclass(frozen=True)
class Budgets:
    """A run's token budgets and its warm start's label smoothing; None: to be fitted."""

    max_new_tokens: int | None
    """Tokens one turn may sample (``rollout.max_new_tokens``)."""
    max_context_tokens: int | None
    """Tokens of a whole episode (``rollout.max_context_tokens``)."""
    label_smoothing: float | None = 0.0
    """The warm start's label smoothing (``warm_start.label_smoothing``)."""

    @property
    def complete(self) -> bool:
        """Nothing is left to fit."""
        return None not in (self.max_new_tokens, self.max_context_tokens, self.label_smoothing)

    def config_values(self, *, warm_start: bool) -> dict[str, Any]:
        """The config keys these values fill (dotted), for the run's saved config."""
        values: dict[str, Any] = {"rollout.max_new_tokens": self.max_new_tokens,
                                  "rollout.max_context_tokens": self.max_context_tokens}
        if warm_start:
            values["warm_start.label_smoothing"] = self.label_smoothing
        return values


@dataclass(frozen=True)
class ModelPlan:
    """The run's model before any warm start."""

    name: str
    """``tiny``, ``smollm2`` or a checkpoint directory (:func:`sao_gym.models.resolve_model`)."""
    seed: int = 0
    """Seeds a ``tiny`` model's weights."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """``tiny``: :func:`~sao_gym.models.tiny_model`'s size options."""
    chat_template: str | None = None
    """A chat template put on the model (:data:`sao_gym.models.CHAT_TEMPLATES`); None: keep."""
    corpus_episodes: int = 64
    """``tiny``: episodes whose text trains its tokenizer (with the general corpus)."""


@dataclass(frozen=True)
class DemonstrationPlan:
    """Where the warm start's demonstrations come from, and how many."""

    env: EnvFactory
    """The run's environments (an oracle plays them)."""
    oracle: Callable[..., str] | None = None
    """``oracle(messages, task) -> text`` of the env, its options bound; or None with
    ``conversations``."""
    conversations: str | None = None
    """A JSONL file of conversations, replayed instead of an oracle."""
    episodes: int = 2048
    """Training demonstrations an oracle plays."""
    holdout_episodes: int = 0
    """Held-out demonstrations for the warm start's early stop (0: none)."""
    seed: int = 0
    """The run's seed: demonstration ``i`` is env seed ``seed + DEMO_SEED_OFFSET + i``, a
    held-out one ``seed + HOLDOUT_SEED_OFFSET + i``."""
    template_format: bool = False
    """Write the oracle's tool calls as the chat template does (``demonstration_format``)."""
    tool_schemas: str = "env"
    """How prompts show the tools (``rollout.tool_schemas``)."""
    harness: Any = None
    """A harness run's :class:`~sao_gym.runtime.parts.HarnessFactory`: the oracle answers
    the harness's calls through the gateway (its prompt format); None: env episodes."""
    oracle_name: str | None = None
    """Where the oracle comes from, in words (None: the env's registered one)."""

    @property
    def what(self) -> str:
        """In words, for the run's output."""
        if self.conversations is not None:
            return f"the conversations of {self.conversations}"
        oracle = self.oracle_name or f"the oracle registered with {self.env.env_id}"
        if self.harness is not None:
            return f"{oracle}, answering {self.harness.harness.name} through the gateway"
        return oracle


@dataclass(frozen=True)
class PreparePlan:
    """Everything that turns a config's model into the run's starting checkpoint."""

    model: ModelPlan
    env: EnvFactory
    seed: int
    turn_limit: int | None
    """The episodes' turn limit (the run's or the env's registered one; None: none)."""
    budgets: Budgets
    """The config's budgets: None where they are to be fitted."""
    demonstrations: DemonstrationPlan | None = None
    """None: no warm start (:attr:`no_warm_start` says why)."""
    sft: SFTSettings | None = None
    """The warm start's settings (its ``label_smoothing`` is fitted when
    ``budgets.label_smoothing`` is None)."""
    no_warm_start: str = ""
    """Why the run starts from the raw model, in words (empty with a warm start)."""
    curriculum: Curriculum | None = None
    """The run's difficulty ladder (None: none): the warm start climbs it level by level."""


@dataclass(frozen=True)
class EvalPlan:
    """An evaluation: which episodes, played how, and what its result records."""

    rollouts: RolloutFactory
    """Env + backend + agent, at the evaluation's temperature."""
    episodes: int
    """Episodes played (0: no evaluation)."""
    temperature: float
    seed: int = EVAL_SEED
    """First env seed (episode ``i``: ``seed + i``, its sampling seeded by it)."""
    concurrency: int = 64
    """Episodes at once."""
    turn_limit: int | None = None
    """The turn limit, as the result records it."""
    keep: bool = True
    """Keep every episode in the run's rollouts (``logging.eval_rollouts``)."""
    rollout_bytes: tuple[int, int | None] = (64 << 20, 1 << 30)
    """``(segment_bytes, max_bytes)`` of kept episodes."""
    model_name: str = "tiny"
    """The config's model name (what trajectories say they came from)."""

    @property
    def env_id(self) -> str:
        """The evaluated environment."""
        return self.rollouts.env.env_id

    def with_budgets(self, budgets: Budgets) -> EvalPlan:
        """The plan with ``budgets``' token budgets."""
        return dataclasses.replace(self, rollouts=self.rollouts.with_budgets(
            budgets.max_new_tokens, budgets.max_context_tokens))

    def report(self) -> dict[str, Any]:
        """What an evaluation's result records about how it was played."""
        agent, env = self.rollouts.agent, self.rollouts.env
        return {"env": env.env_id, "env_kwargs": dict(env.kwargs), "seed": self.seed,
                "temperature": self.temperature, "max_episode_steps": self.turn_limit,
                "max_new_tokens": agent.max_new_tokens,
                "max_context_tokens": agent.max_context_tokens,
                "tool_schemas": agent.tool_schemas,
                "backend": getattr(self.rollouts.backend, "backend", None)}


@dataclass(frozen=True)
class TrainPlan:
    """The ``sao-gym train`` job (module docs)."""

    prepare: PreparePlan
    parts: RunParts
    eval: EvalPlan
    place: str
    """``module:function(parts, run_dir, *, policy_path, resume, sinks) -> Trainer``:
    where the parts run (:data:`~sao_gym.runtime.config.schema.RUNTIMES`)."""
    restarts: int = 0
    """Times the run rebuilds itself from its last checkpoint when a learner rank dies."""
    record: Mapping[str, Any] = field(default_factory=dict)
    """The run's config as a plain mapping (what ``config.yaml`` holds)."""
    title: str = ""
    """One line naming the run (algorithm, mode, env, model, steps)."""

    def fitted(self, budgets: Budgets) -> TrainPlan:
        """The plan with ``budgets`` (fitted, complete) in every record that uses them."""
        if not budgets.complete:
            raise ValueError(f"budgets {budgets} are not all fitted")
        prepare = dataclasses.replace(self.prepare, budgets=budgets)
        if prepare.sft is not None:
            prepare = dataclasses.replace(prepare, sft=dataclasses.replace(
                prepare.sft, label_smoothing=budgets.label_smoothing))
        record = copy.deepcopy(dict(self.record))
        for key, value in budgets.config_values(warm_start=bool(record.get("warm_start"))
                                                ).items():
            section, _, name = key.partition(".")
            record[section] = {**record[section], name: value}
        parts = dataclasses.replace(
            self.parts, rollouts=self.parts.rollouts.with_budgets(budgets.max_new_tokens,
                                                                  budgets.max_context_tokens),
            sink=dataclasses.replace(self.parts.sink, record=record))
        return dataclasses.replace(self, prepare=prepare, parts=parts,
                                   eval=self.eval.with_budgets(budgets), record=record)


__all__ = ["DEMO_SEED_OFFSET", "EVAL_SEED", "HOLDOUT_SEED_OFFSET", "Budgets",
           "DemonstrationPlan", "EvalPlan", "ModelPlan", "PreparePlan", "TrainPlan"]
