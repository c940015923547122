"""Training configuration, one frozen dataclass per component.

A config file is YAML whose top level holds the run's identity
(``algorithm, mode, runtime, env, env_kwargs, model, total_steps, seed``) and
one mapping per component: ``rollout``, ``inference``, ``ray``, ``learner``,
``warm_start`` (``null``: none), ``curriculum`` (``null``: none), ``agent``, ``eval``,
``checkpoint``, ``logging``.
``--set key=value`` overrides use dotted keys (``rollout.batch_size=8``,
``learner.lr=1e-4``). Unset keys take the library defaults, which are the
paper's where it states them; a recipe (``sao_gym/recipes/*.yaml``, e.g.
the embedded demo) holds a job's own choices.

This module is the schema: it describes and validates (an invalid value
fails with a :class:`ConfigError`). :mod:`sao_gym.runtime.config.loader` reads YAML
and ``--set`` overrides into it; the builder (:mod:`sao_gym.runtime.config.build`)
is the one reader that turns a config into parts.

"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sao_gym.inference.sections import HFSection, InferenceSection
from sao_gym.learner.config import LearnerConfig
from sao_gym.utils.checks import at_least

MODES = ("async", "sync")
RUNTIMES = {"local": "sao_gym.runtime.place.local:local_trainer",
            "ray": "sao_gym.runtime.place.ray.build:ray_trainer"}
"""Where each ``runtime`` places the run's parts: ``module:function(parts, run_dir, *,
policy_path, resume, sinks) -> Trainer`` (imported by the job when it runs)."""
TINY_OPTIONS = ("hidden_size", "num_layers", "head_dim", "vocab_size", "tie_embeddings")
"""The keyword arguments of ``tiny_model()`` a config's ``model_options`` may set."""
LOGGERS = ("jsonl", "tensorboard", "wandb")
RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"


class ConfigError(ValueError):
    """A configuration file or override is invalid."""


@dataclass(frozen=True)
class RolloutConfig:
    """How episodes are sampled and admitted."""

    batch_size: int = 128
    """Rollouts per learner step (paper: 128)."""
    group_size: int = 1
    """Rollouts per task sampled together (1: SAO; > 1 for the GRPO algorithms)."""
    concurrency: int = 64
    """Episodes running at once."""
    max_staleness: int = 1
    """Most policy versions between the version the learner trains and the one that
    sampled any of its tokens (queued rollouts included). 0: sync mode (``mode: sync``)."""
    max_new_tokens: int | None = 1024
    """Sampling budget per turn (null: fitted to the env's demonstrations before the run,
    :mod:`sao_gym.runtime.prepare.fit`; the run's saved config holds the value used)."""
    temperature: float = 1.0
    """Sampling temperature (> 0; the learner scores the same tempered distribution)."""
    top_p: float = 1.0
    """Nucleus mass; training needs 1.0 (the learner cannot reproduce a nucleus exactly)."""
    max_context_tokens: int | None = 8192
    """Token budget of a whole episode, the agent's context (null: fitted, as above)."""
    max_episode_steps: int | None = None
    """Turn limit (None: the environment's registered limit)."""
    max_infra_retries: int = 3
    """Retries of an episode that failed for infrastructure reasons (then its group is dropped)."""
    tool_schemas: str = "env"
    """How prompts show the env's tools: ``env`` (its schemas as declared) or ``signature``
    (as libraries that learn tools from a class's methods render them, e.g. TRL's
    GRPOTrainer through :mod:`sao_gym.adapters.trl`: a model that moves between the two
    then sees the same prompt; :class:`sao_gym.agents.LLMAgent`)."""

    def __post_init__(self) -> None:
        _at_least(self, 1, "batch_size", "group_size", "concurrency", "max_new_tokens",
                  "max_context_tokens")
        _at_least(self, 0, "max_staleness", "max_infra_retries")
        if self.max_episode_steps is not None and self.max_episode_steps < 1:
            raise ConfigError(f"rollout.max_episode_steps must be >= 1 or null, "
                              f"got {self.max_episode_steps}")
        if self.batch_size % self.group_size:
            raise ConfigError(f"rollout.batch_size ({self.batch_size}) must be a multiple of "
                              f"rollout.group_size ({self.group_size})")
        if not self.temperature > 0:
            raise ConfigError(f"rollout.temperature must be > 0 for training (greedy samples "
                              f"have no sampling distribution to learn from), got "
                              f"{self.temperature}")
        if self.top_p != 1.0:
            raise ConfigError(
                f"rollout.top_p={self.top_p}: training needs top_p = 1.0. The learner scores "
                "tokens under the full (tempered) softmax; a nucleus depends on exact logits, "
                "so the sampler's truncated distribution cannot be reproduced and every ratio "
                "would be biased. Use temperature to sharpen sampling instead.")
        if self.tool_schemas not in ("env", "signature"):
            raise ConfigError(f"rollout.tool_schemas must be 'env' or 'signature', got "
                              f"{self.tool_schemas!r}")


@dataclass(frozen=True)
class RayConfig:
    """``runtime: ray``: rollout workers and the learner as Ray actors (docs/scale.md)."""

    address: str | None = None
    """null: start a local Ray instance (on 127.0.0.1) for the run; ``auto``: join the
    cluster on this machine; ``host:port``: join that cluster's head."""
    rollout_workers: int = 2
    """Rollout-worker actors, each an asyncio loop of episodes with its own backend."""
    episodes_per_worker: int | None = None
    """Episodes one worker runs at once (null: ``rollout.concurrency`` shared out, so
    the same YAML runs the same number of episodes on both runtimes)."""
    worker_num_cpus: float = 0.0
    """Logical CPUs Ray reserves per rollout worker (0: light actors pack anywhere)."""
    worker_num_gpus: float = 0.0
    """GPUs per rollout worker (an in-process backend on its own GPU)."""
    learner_num_cpus: float = 0.0
    """Logical CPUs Ray reserves for the learner actor."""
    learner_num_gpus: float = 0.0
    """GPUs of the learner actor."""
    worker_threads: int = 1
    """torch threads of each rollout worker's in-process backend."""
    learner_threads: int | None = None
    """torch threads of the learner (null: Ray's own rule for an actor's threads,
    ``floor(learner_num_cpus)``, at least 1, so the learner does not contend for the
    cores of the workers it shares a node with)."""
    max_worker_restarts: int = 3
    """Times each rollout worker is replaced after dying before the run gives it up."""
    max_learner_restarts: int = 2
    """Times a run rebuilds itself from its last checkpoint when a learner rank dies
    (the learner's actors, with the rollout workers serving that checkpoint's policy);
    past that the run ends and ``--resume`` continues it."""
    num_cpus: int | None = None
    """Logical CPUs of a local instance (null: max(4, cores)); ignored when joining."""
    object_store_memory_mb: int | None = None
    """Object store of a local instance (null: Ray's default); ignored when joining."""
    startup_timeout_s: float = 300.0
    """Longest wait for an actor to come up (model loading included)."""
    server_actors: bool = False
    """``inference.launch`` servers as actors of their own, spread over the nodes, instead
    of child processes of each rollout worker (docs/scale.md)."""
    server_num_cpus: float = 0.0
    """Logical CPUs Ray reserves per server actor."""
    server_num_gpus: float = 0.0
    """GPUs per server actor."""

    def __post_init__(self) -> None:
        _at_least(self, 1, "rollout_workers", "worker_threads")
        _at_least(self, 0, "max_worker_restarts", "max_learner_restarts", "worker_num_cpus",
                  "worker_num_gpus", "learner_num_cpus", "learner_num_gpus", "server_num_cpus",
                  "server_num_gpus")
        for name in ("episodes_per_worker", "learner_threads", "num_cpus",
                     "object_store_memory_mb"):
            if getattr(self, name) is not None:
                _at_least(self, 1, name)
        if self.address is not None and (not isinstance(self.address, str)
                                         or not self.address.strip()):
            raise ConfigError("ray.address must be null, 'auto' or host:port")
        if not self.startup_timeout_s > 0:
            raise ConfigError("ray.startup_timeout_s must be > 0")


@dataclass(frozen=True)
class WarmStartConfig:
    """Supervised warm start on demonstrations before RL.

    The env's registered oracle (``sao_gym.register(..., oracle=...)``) plays
    them, or ``demonstrations`` names a file of conversations.
    """

    steps: int = 1500
    """Most supervised steps (0: none)."""
    episodes: int = 2048
    """Demonstrations collected."""
    lr: float = 3e-3
    """Peak learning rate (linear warm-up over the first 5% of steps)."""
    batch_size: int = 16
    """Demonstrations per step."""
    target_success: float | None = 0.4
    """Stop once the policy would solve this share of held-out tasks (estimated by
    ``target_metric``); ``steps`` is then the maximum. None: run every step."""
    target_metric: str = "sampled"
    """``"sampled"`` (temperature 1) or ``"greedy"``
    (:func:`~sao_gym.learner.sft.holdout_success`)."""
    min_sampled_success: float | None = None
    """... and only once the sampled estimate is at least this (None: no floor)."""
    holdout_episodes: int = 64
    """Held-out demonstrations (tasks not trained on) for the early stop."""
    oracle: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the environment's demonstration oracle."""
    demonstrations: str | None = None
    """A JSONL file of conversations to imitate instead of the oracle's episodes
    (:func:`sao_gym.runtime.prepare.conversations.load_conversations` has the format);
    the held-out ones are the last ``holdout_episodes`` (at most a quarter) of the file."""
    label_smoothing: float | None = 0.0
    """Label smoothing of the supervised loss (null: fitted to the demonstrations'
    length, :func:`sao_gym.runtime.prepare.fit.fit_label_smoothing`)."""
    demonstration_format: str = "oracle"
    """``oracle``: each demonstrated turn is the oracle's text as it is (e.g. a compact
    ``lookup(4817)``); ``template``: its tool calls as the chat template writes them
    (``<tool_call>`` JSON blocks for ChatML), the form TRL and vLLM's tool parsers read
    (:meth:`sao_gym.agents.LLMAgent.as_template_writes`)."""

    def __post_init__(self) -> None:
        _at_least(self, 0, "steps")
        _at_least(self, 1, "episodes", "batch_size", "holdout_episodes")
        if not self.lr > 0:
            raise ConfigError(f"warm_start.lr must be > 0, got {self.lr}")
        for name, ok, span in (("target_success", lambda v: 0 < v <= 1, "(0, 1]"),
                               ("min_sampled_success", lambda v: 0 <= v <= 1, "[0, 1]"),
                               ("label_smoothing", lambda v: 0 <= v < 1, "[0, 1)")):
            if getattr(self, name) is not None and not ok(getattr(self, name)):
                raise ConfigError(f"warm_start.{name} must be in {span} or null, got "
                                  f"{getattr(self, name)}")
        if self.target_metric not in ("sampled", "greedy"):
            raise ConfigError(f"warm_start.target_metric must be 'sampled' or 'greedy', got "
                              f"{self.target_metric!r}")
        if self.demonstration_format not in ("oracle", "template"):
            raise ConfigError(f"warm_start.demonstration_format must be 'oracle' or "
                              f"'template', got {self.demonstration_format!r}")


@dataclass(frozen=True)
class CurriculumConfig:
    """A difficulty curriculum: the env's declared knob raised as success rises.

    The env declares the knob when it registers (``sao_gym.register(...,
    difficulty={"hops": [4, 8, 16, ...]})``); the run climbs the declared
    levels below its own value (``env_kwargs``), then trains at that value
    (:mod:`sao_gym.curriculum`). An env that declares none trains at its one
    level, as without this section.
    """

    promote_at: float = 0.5
    """RL moves up a level once the training success over ``window`` episodes at the
    current level reaches this. (The warm start moves up once its held-out check
    passes the warm start's own target.)"""
    demote_below: float = 0.05
    """RL moves back down a level once the training success over ``window`` episodes at
    the current level falls below this (0: never): a collapsed policy, whose episodes
    all fail, gets no gradient at its level, and one level down it still succeeds."""
    window: int = 64
    """Episodes at the current level the training success is taken over."""
    knob: str | None = None
    """Another constructor keyword than the declared one (null: the declared knob)."""
    levels: list[Any] | None = None
    """The ladder's levels below the run's value, easiest first (null: the declared ones)."""

    def __post_init__(self) -> None:
        _at_least(self, 1, "window")
        if not 0 < self.promote_at <= 1:
            raise ConfigError(f"curriculum.promote_at must be in (0, 1], got {self.promote_at}")
        if not 0 <= self.demote_below < self.promote_at:
            raise ConfigError(f"curriculum.demote_below must be in [0, promote_at="
                              f"{self.promote_at}), got {self.demote_below}")
        if self.levels is not None and (not isinstance(self.levels, list) or not self.levels):
            raise ConfigError(f"curriculum.levels must be a non-empty list or null, got "
                              f"{self.levels!r}")
        if self.levels is not None and self.knob is None:
            raise ConfigError("curriculum.levels needs curriculum.knob: the constructor "
                              "keyword the levels are values of")


@dataclass(frozen=True)
class AgentConfig:
    """The agent: the package's own (``LLMAgent``), or a harness of yours behind the gateway.

    With ``program`` or ``command`` set, every episode runs that harness against a
    gateway episode (:mod:`sao_gym.gateway.rollouts`, docs/agents.md "Train the
    agent you already have"); tasks come from ``tasks`` or the seeds of ``env``.
    """

    program: str | None = None
    """``MODULE:NAME`` of ``[async] def run(client, task) -> float | None`` (an
    ``openai`` client whose base URL is the episode's)."""
    command: str | list[str] | None = None
    """A command line run per episode with ``OPENAI_BASE_URL`` set, the task as JSON
    on stdin (a string is split as a shell would)."""
    tasks: str | None = None
    """A JSONL file of tasks (null: the seeds of ``env``)."""
    reward: str | None = None
    """``MODULE:NAME`` of a verifier ``[async] def reward(task, transcript) -> float``
    (null: the harness's returned or posted reward)."""
    timeout_s: float = 600.0
    """Seconds one harness episode may take (then it is an infrastructure failure)."""
    workers: int = 0
    """Worker processes that run a ``program``'s episodes, off the process that samples
    (:mod:`sao_gym.gateway.workers`); 0: that process's event loop runs them."""
    oracle: str | None = None
    """``MODULE:NAME`` of ``oracle(messages, task) -> text``: it answers the harness's calls
    for the warm start's demonstrations (null: the env's registered oracle, for tasks
    from the env's seeds)."""

    def __post_init__(self) -> None:
        if self.program is not None and self.command is not None:
            raise ConfigError("agent.program and agent.command are two ways to name one "
                              "harness: set one")
        if not self.timeout_s > 0:
            raise ConfigError(f"agent.timeout_s must be > 0, got {self.timeout_s}")
        _at_least(self, 0, "workers")
        if self.harness is None and (self.tasks, self.reward, self.oracle) != (None,) * 3:
            raise ConfigError("agent.tasks, agent.reward and agent.oracle are for a harness: "
                              "set agent.program or agent.command")
        if self.workers and self.program is None:
            raise ConfigError("agent.workers runs agent.program's episodes in worker "
                              "processes; a command harness is a process of its own already")

    @property
    def harness(self) -> str | None:
        """What runs the episodes: the program or the command, or None (``LLMAgent``)."""
        return self.program or (" ".join(self.command) if isinstance(self.command, list)
                                else self.command)

    def argv(self) -> tuple[str, ...]:
        """The command as arguments (``()`` without one)."""
        import shlex

        if self.command is None:
            return ()
        return tuple(self.command) if isinstance(self.command, list) else tuple(
            shlex.split(self.command))


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation of the starting and the trained policy."""

    episodes: int = 64
    """Episodes before and after RL (0: none)."""
    temperature: float | None = None
    """Sampling temperature (None: ``rollout.temperature``)."""

    def __post_init__(self) -> None:
        _at_least(self, 0, "episodes")
        if self.temperature is not None and not self.temperature >= 0:
            raise ConfigError(f"eval.temperature must be >= 0, got {self.temperature}")


@dataclass(frozen=True)
class CheckpointConfig:
    """When checkpoints are written."""

    every: int = 50
    """Learner steps between checkpoints (0: only at the end and on signals)."""
    keep: int = 2
    """Complete checkpoints kept on disk."""

    def __post_init__(self) -> None:
        _at_least(self, 0, "every")
        _at_least(self, 1, "keep")


@dataclass(frozen=True)
class LoggingConfig:
    """Where metrics go."""

    loggers: str = "jsonl"
    """Comma-separated: jsonl (always on), tensorboard, wandb."""
    rollouts_per_step: int = 4
    """Training rollouts kept per learner step in ``RUN_DIR/rollouts/train``, drawn at random
    from the batch, each with the learner's per-token quantities at the step that trained
    it (0: none; infrastructure failures are kept whatever this says). docs/metrics.md."""
    eval_rollouts: bool = True
    """Keep every evaluation episode (``RUN_DIR/rollouts/eval_before``, ``eval_after``)."""
    rollouts_segment_mb: float = 64.0
    """Size at which a rollout file is closed and the next one started."""
    rollouts_max_mb: float | None = 1024.0
    """Most disk space each kind of kept rollouts (training, each evaluation) takes: past
    it the oldest files are deleted (null: unbounded). At least ``rollouts_segment_mb``."""

    def __post_init__(self) -> None:
        unknown = [n for n in self.names if n not in LOGGERS]
        if unknown:
            raise ConfigError(f"logging.loggers: unknown {unknown}; valid: {list(LOGGERS)}")
        if self.rollouts_per_step < 0:
            raise ConfigError(f"logging.rollouts_per_step must be >= 0, got "
                              f"{self.rollouts_per_step}")
        if not self.rollouts_segment_mb > 0 or (
                self.rollouts_max_mb is not None
                and not self.rollouts_max_mb >= self.rollouts_segment_mb):
            raise ConfigError(
                f"logging.rollouts_segment_mb must be > 0 and logging.rollouts_max_mb null or "
                f">= it; got {self.rollouts_segment_mb}, {self.rollouts_max_mb}")

    @property
    def names(self) -> list[str]:
        """The logger names, ``jsonl`` first."""
        names = [n.strip() for n in self.loggers.split(",") if n.strip()]
        return ["jsonl", *[n for n in names if n != "jsonl"]]


@dataclass(frozen=True)
class TrainConfig:
    """Everything ``sao-gym train`` needs (see the module docs for the layout)."""

    algorithm: str = "sao"
    """sao, vapo, grpo, grpo_dis, running_mean, or ``module:NAME`` (your own record)."""
    runtime: str = "local"
    """local (one process) or ray (rollout workers and the learner as Ray actors,
    set up by ``ray``); the same config otherwise."""
    env: str | None = None
    """Environment id; ``module:id`` imports ``module`` first (it registers the id). Required
    to build a run (a recipe or ``--set env=ID`` gives it)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the environment's constructor."""
    model: str = "tiny"
    """``tiny`` (a random tiny model), ``smollm2`` or a local Hugging Face checkpoint."""
    model_options: dict[str, Any] = field(default_factory=dict)
    """With ``model: tiny``: :func:`sao_gym.models.tiny_model`'s ``TINY_OPTIONS`` (its
    tokenizer learns a general corpus plus the env's own text)."""
    chat_template: str | None = None
    """Replace the model's chat template: ``compact`` (one line per tool, ``name(arg)``
    calls: a fraction of the prompt tokens) or ``chatml`` (JSON tool schemas); null: keep."""
    total_steps: int = 1000
    """Learner steps to run."""
    seed: int = 0
    """Seeds the model, the task stream and sampling."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Sampling and admission."""
    inference: InferenceSection = field(default_factory=HFSection)
    """The inference backend: ``backend`` picks the section (its own keys and builder,
    :mod:`sao_gym.inference.sections`)."""
    ray: RayConfig = field(default_factory=RayConfig)
    """Ray actors and cluster (used with ``runtime: ray``)."""
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    """Learner hyperparameters (the paper's by default; see docs/learner.md)."""
    warm_start: WarmStartConfig | None = None
    """Supervised warm start before RL (null: none)."""
    curriculum: CurriculumConfig | None = None
    """A difficulty curriculum over the env's declared knob (null: none)."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """The agent (default: the package's own; a harness of yours with ``agent.program``)."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation before and after RL."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpointing."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Metric loggers."""

    def __post_init__(self) -> None:
        from sao_gym.learner.algorithms import find_algorithm  # its losses need torch
        try:
            grouped = find_algorithm(self.algorithm).grouped
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if self.runtime not in RUNTIMES:
            raise ConfigError(f"runtime must be one of {tuple(RUNTIMES)}, got {self.runtime!r}")
        _at_least(self, 1, "total_steps")
        if self.chat_template not in (None, "compact", "chatml"):
            raise ConfigError(f"chat_template must be compact, chatml or null, got "
                              f"{self.chat_template!r}")
        if self.env is not None and (not self.env or not isinstance(self.env, str)):
            raise ConfigError("env must be an environment id")
        unknown = sorted(set(self.model_options) - set(TINY_OPTIONS))
        if unknown:
            raise ConfigError(f"model_options: unknown {unknown}; valid: {', '.join(TINY_OPTIONS)}")
        if grouped and self.rollout.group_size < 2:
            raise ConfigError(f"{self.algorithm} needs rollout.group_size >= 2")
        if not grouped and self.rollout.group_size != 1:
            raise ConfigError(f"{self.algorithm} trains single rollouts: rollout.group_size "
                              f"must be 1, got {self.rollout.group_size}")
        if self.ray.server_actors and not getattr(self.inference, "launch", 0):
            raise ConfigError("ray.server_actors runs the servers of inference.launch as "
                              "actors: set inference.backend=vllm_server and inference.launch")

    @property
    def episodes_per_worker(self) -> int:
        """Episodes each Ray rollout worker runs at once."""
        if self.ray.episodes_per_worker is not None:
            return self.ray.episodes_per_worker
        return -(-self.rollout.concurrency // self.ray.rollout_workers)

    @property
    def mode(self) -> str:
        """``sync`` when ``rollout.max_staleness`` is 0, else ``async``.

        Sync: generate a batch, wait for the slowest episode, train. In YAML,
        ``mode: sync`` is the spelling of ``rollout.max_staleness: 0``
        (:func:`~sao_gym.runtime.config.loader.load_config`).
        """
        return "sync" if self.rollout.max_staleness == 0 else "async"

    @property
    def max_staleness(self) -> int:
        """The staleness bound the run uses (``rollout.max_staleness``; 0 in sync mode)."""
        return self.rollout.max_staleness

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (YAML; :func:`~sao_gym.runtime.config.loader.load_config` reads it back)."""
        return dataclasses.asdict(self)


def _at_least(obj: Any, low: int, *names: str) -> None:
    prefix = {RolloutConfig: "rollout.", WarmStartConfig: "warm_start.", EvalConfig: "eval.",
              CheckpointConfig: "checkpoint.", RayConfig: "ray.",
              AgentConfig: "agent.", CurriculumConfig: "curriculum."}.get(type(obj), "")
    at_least({n: getattr(obj, n) for n in names}, low, prefix=prefix, error=ConfigError)
