"""Training configuration: one dataclass, YAML files and ``--set`` overrides.

``load_config(path, overrides)`` reads an optional YAML file, applies
``key=value`` overrides (dotted keys reach the nested learner config:
``learner.lr=1e-4``), and validates everything at once: an unknown key or a
value of the wrong type fails with a message naming the valid keys.

Example:
    >>> cfg = load_config(None, ["total_steps=20", "batch_size=2", "learner.lr=1e-4"])
    >>> cfg.total_steps, cfg.batch_size, cfg.learner.lr
    (20, 2, 0.0001)

"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sao_gym.learner.sao import ALGORITHMS, LearnerConfig

MODES = ("async", "sync")

DEMO_LEARNER = LearnerConfig(lr=2e-4, critic_warmup_steps=0)
"""The learner of the embedded demo (a 0.5M-parameter model learns at a far
higher rate than the paper's 1e-6 for billion-parameter models; its critic
learns alongside from the first step). Paper values: ``LearnerConfig()``."""


DEMO_ENV_KWARGS: dict[str, dict[str, Any]] = {"sao_gym/Arithmetic-v0": {"operators": "+"}}
"""Environment options of the embedded demo, used when a config gives no ``env_kwargs``.

Additions only: the tiny model learns to copy numbers within a few hundred
supervised steps on every seed tried, while copying the operator out of
three took some seeds over 1,000 (docs/benchmarks.md)."""


class ConfigError(ValueError):
    """A configuration file or override is invalid."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything ``sao-gym train`` needs; YAML keys are these field names."""

    algorithm: str = "sao"
    """sao, vapo, grpo, grpo_dis or running_mean."""
    mode: str = "async"
    """async (SAO: each rollout trains as soon as a batch is in) or sync (batch baseline)."""
    env: str = "sao_gym/Arithmetic-v0"
    """Registered environment id."""
    env_kwargs: dict[str, Any] | None = None
    """Keyword arguments of the environment's constructor (None: ``DEMO_ENV_KWARGS[env]``
    when the demo has options for ``env``, else none)."""
    model: str = "tiny"
    """``tiny`` (the demo's random tiny model), ``smollm2`` or a local Hugging Face checkpoint."""
    total_steps: int = 100
    """Learner steps to run."""
    batch_size: int = 16
    """Rollouts per learner step."""
    group_size: int = 1
    """Rollouts per task (> 1 for the GRPO algorithms; batch_size must be a multiple)."""
    max_staleness: int = 1
    """Most policy versions between a token's sampler and the learner that trains on it."""
    concurrency: int = 16
    """Episodes running at once."""
    checkpoint_every: int = 50
    """Learner steps between checkpoints (0: only at the end and on signals)."""
    keep_checkpoints: int = 2
    """Complete checkpoints kept on disk."""
    seed: int = 0
    """Seeds the model, the task stream and sampling."""
    logger: str = "jsonl"
    """Metric loggers, comma-separated: jsonl (always on), tensorboard, wandb."""
    max_new_tokens: int = 24
    """Sampling budget per turn."""
    temperature: float = 1.0
    """Sampling temperature (1.0: the learner's logprobs are untempered)."""
    max_context_tokens: int = 512
    """Token budget of a whole episode."""
    max_episode_steps: int | None = None
    """Turn limit (None: the environment's registered limit)."""
    max_infra_retries: int = 3
    """Retries of a task whose episode failed for infrastructure reasons."""
    warm_start_steps: int = 1500
    """Most supervised steps on oracle demonstrations before RL (0: no warm start)."""
    warm_start_episodes: int = 2048
    """Demonstrations collected for the warm start."""
    warm_start_lr: float = 3e-3
    """Peak learning rate of the warm start (linear warm-up over its first 5% of steps)."""
    warm_start_batch_size: int = 16
    """Demonstrations per warm-start step."""
    warm_start_label_smoothing: float = 0.0
    """Label smoothing of the warm start (keeps the policy exploring at temperature 1)."""
    warm_start_target_success: float | None = 0.4
    """Stop the warm start early once it would solve this share of held-out tasks at
    temperature 1 (``sequence_success`` of ``warm_start_holdout_episodes``
    demonstrations); ``warm_start_steps`` is then the maximum. None: run every step."""
    warm_start_holdout_episodes: int = 64
    """Held-out demonstrations (tasks not trained on) for the early stop."""
    warm_start_oracle: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the environment's demonstration oracle (see ``ORACLES``)."""
    eval_episodes: int = 256
    """Evaluation episodes before and after RL (0: none)."""
    backend_max_batch_size: int = 32
    """Most sequences the inference backend decodes together."""
    learner: LearnerConfig = field(default_factory=lambda: DEMO_LEARNER)
    """Learner hyperparameters (see docs/learner.md); unset keys take ``DEMO_LEARNER``'s."""

    def __post_init__(self) -> None:
        if self.env_kwargs is None:
            object.__setattr__(self, "env_kwargs", dict(DEMO_ENV_KWARGS.get(self.env, {})))
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, got {self.mode!r}")
        for name in ("total_steps", "batch_size", "group_size", "concurrency",
                     "max_new_tokens", "max_context_tokens", "backend_max_batch_size",
                     "keep_checkpoints", "warm_start_batch_size",
                     "warm_start_holdout_episodes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_staleness", "checkpoint_every", "max_infra_retries",
                     "warm_start_steps", "eval_episodes"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        target = self.warm_start_target_success
        if target is not None and not 0.0 < target <= 1.0:
            raise ConfigError(f"warm_start_target_success must be in (0, 1] or null, got {target}")
        if self.batch_size % self.group_size:
            raise ConfigError(f"batch_size ({self.batch_size}) must be a multiple of "
                              f"group_size ({self.group_size})")
        if self.algorithm.startswith("grpo") and self.group_size < 2:
            raise ConfigError(f"{self.algorithm} needs group_size >= 2")
        if not self.temperature >= 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if self.algorithm.startswith("grpo") and self.learner.group_size != self.group_size:
            object.__setattr__(self, "learner",
                               dataclasses.replace(self.learner, group_size=self.group_size))

    @property
    def loggers(self) -> list[str]:
        """The logger names, ``jsonl`` first."""
        names = [n.strip() for n in self.logger.split(",") if n.strip()]
        return ["jsonl", *[n for n in names if n != "jsonl"]]

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (YAML-serialisable)."""
        return dataclasses.asdict(self)


def _type_ok(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    if origin is tuple:
        return isinstance(value, (list, tuple))
    return True


def _build(cls: type, data: Mapping[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(cls)
    defaults = {f.name: f.default_factory for f in dataclasses.fields(cls)
                if f.default_factory is not dataclasses.MISSING}
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ConfigError(f"unknown key(s) {[where + k for k in unknown]}; valid keys: "
                          f"{[where + k for k in sorted(fields)]}")
    kwargs = {}
    for key, value in data.items():
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{where}{key} must be a mapping of {hint.__name__} fields")
            base = dataclasses.asdict(defaults[key]()) if key in defaults else {}
            value = _build(hint, {**base, **value}, f"{key}.")
        elif not _type_ok(value, hint):
            raise ConfigError(f"bad value for {where}{key}: expected {hint}, got {value!r}")
        elif hint is float or typing.get_origin(hint) in (typing.Union, types.UnionType) \
                and float in typing.get_args(hint) and isinstance(value, int):
            value = float(value)
        kwargs[key] = value
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"invalid {where or 'train'} config: {e}") from None


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"learner.lr=1e-4"`` -> ``(["learner", "lr"], 0.0001)`` (values parsed as YAML)."""
    if "=" not in text:
        raise ConfigError(f"--set expects key=value, got {text!r}")
    key, raw = text.split("=", 1)
    if not key.strip():
        raise ConfigError(f"--set expects key=value, got {text!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str) and _looks_numeric(value):
        value = float(value)
    return key.strip().split("."), value


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return text.strip().lower() not in ("nan", "inf", "-inf", "infinity")


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read ``path`` (YAML, optional), apply ``key=value`` overrides, validate."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path} must hold a mapping of config keys")
        data = loaded
    for text in overrides:
        keys, value = parse_override(text)
        node = data
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"cannot set {text!r}: {k} is not a mapping")
        node[keys[-1]] = value
    return _build(TrainConfig, data, "")


def save_config(config: TrainConfig, path: str | Path) -> None:
    """Write ``config`` as YAML that :func:`load_config` reads back identically."""
    Path(path).write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
