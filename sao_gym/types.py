"""Data records shared by environments, agents, inference and the learner.

Only data lives here: no behaviour beyond validation and (de)serialisation.

- :class:`Message`: one chat message in OpenAI format (a plain ``dict``).
- :class:`SamplingParams`: how a backend samples one generation.
- :class:`Generation`: what a backend returns for one prompt.
- :class:`StopReason`: every way an episode can end.
- :class:`Rollout`: one finished episode, token-exact, as the learner consumes it.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass, field
from typing import Any, TypedDict


class ToolCallFunction(TypedDict):
    """The ``function`` part of a tool call."""

    name: str
    """Name of the tool to call."""
    arguments: str | dict[str, Any]
    """JSON-encoded arguments (OpenAI format); a decoded dict is accepted too."""


class ToolCall(TypedDict, total=False):
    """One tool call inside an assistant message (OpenAI format)."""

    id: str
    """Identifier that the matching ``tool`` message repeats as ``tool_call_id``."""
    type: str
    """Always ``"function"``."""
    function: ToolCallFunction
    """Which tool, with which arguments."""


class Message(TypedDict, total=False):
    """One chat message in OpenAI format.

    Environments produce ``system``/``user``/``tool`` messages as observations;
    agents produce ``assistant`` messages as actions.
    """

    role: str
    """One of ``system``, ``user``, ``assistant``, ``tool``."""
    content: str | None
    """The text; ``None`` is allowed for an assistant message that only calls tools."""
    tool_calls: list[ToolCall]
    """Tool calls of an assistant message."""
    tool_call_id: str
    """For a ``tool`` message: the id of the call it answers."""
    name: str
    """For a ``tool`` message: the tool's name."""


ROLES = ("system", "user", "assistant", "tool")


class StopReason(str, enum.Enum):
    """Why an episode ended. Stored in :attr:`Rollout.stop_reason`."""

    TERMINATED = "terminated"
    """The task ended inside the environment: solved, failed or submitted."""
    MAX_TURNS = "max_turns"
    """The turn limit (``max_episode_steps``) cut the episode."""
    MAX_TOKENS = "max_tokens"
    """A token budget ran out: the agent's context or the environment's budget."""
    TIME_LIMIT = "time_limit"
    """The wall-clock limit of the episode ran out."""
    TRUNCATED = "truncated"
    """The environment truncated the episode for a reason of its own."""
    ENV_ERROR = "env_error"
    """The environment (its sandbox, its machine) failed: an infrastructure failure."""
    AGENT_ERROR = "agent_error"
    """The agent or its inference backend failed: an infrastructure failure."""
    ABORTED = "aborted"
    """The episode was cancelled from outside (shutdown)."""

    @property
    def is_truncation(self) -> bool:
        """Whether the episode was cut short, so the learner should bootstrap."""
        return self in (
            StopReason.MAX_TURNS,
            StopReason.MAX_TOKENS,
            StopReason.TIME_LIMIT,
            StopReason.TRUNCATED,
        )


@dataclass(frozen=True)
class SamplingParams:
    """How one generation is sampled."""

    max_new_tokens: int = 256
    """Upper bound on sampled tokens."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy decoding."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    stop_token_ids: tuple[int, ...] = ()
    """Generation stops after sampling any of these (the stop token is kept)."""
    seed: int | None = None
    """Seed of this request's own random stream; ``None`` uses the backend's stream."""
    session_id: str | None = None
    """The episode this request belongs to: a backend that spreads requests over several
    servers sends a session's requests to one server (whose prefix cache holds the
    context). Single-engine backends ignore it."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not (self.temperature >= 0.0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True)
class Generation:
    """One sampled continuation, exactly as the sampler produced it.

    ``logprobs[i]`` is the log-probability of ``token_ids[i]`` under the
    distribution it was actually sampled from (after temperature and top-p).
    For greedy decoding (temperature 0) it is the untempered log-probability.
    """

    token_ids: list[int]
    """Sampled token ids, the stop token included when one was sampled."""
    logprobs: list[float]
    """Sampler log-probability of each sampled token."""
    finish_reason: str
    """``"stop"`` (a stop token), ``"length"`` (``max_new_tokens``), ``"abort"``, or
    ``"stop_string"`` (an agent cut it at a stop string: :attr:`LLMAgent.stop`)."""
    policy_versions: list[int]
    """Policy (weights) version that sampled each token; may change mid-generation."""

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.logprobs) != n or len(self.policy_versions) != n:
            raise ValueError(
                "Generation fields must have equal lengths: "
                f"token_ids={n}, logprobs={len(self.logprobs)}, "
                f"policy_versions={len(self.policy_versions)}"
            )

    @property
    def policy_version(self) -> int:
        """Version of the last sampled token (-1 for an empty generation)."""
        return self.policy_versions[-1] if self.policy_versions else -1


@dataclass(frozen=True)
class Rollout:
    """One finished episode, token-exact: what the learner trains on.

    The token sequence is the rendered prompt, then each turn's sampled tokens
    exactly as sampled (``loss_mask`` 1), then each observation's chat-template
    rendering (``loss_mask`` 0). History is never re-tokenized.
    """

    token_ids: list[int]
    """The whole episode, prompt included."""
    loss_mask: list[int]
    """1 for a token sampled by the policy (an action token), else 0."""
    rollout_logprobs: list[float]
    """The sampler's logprob of each token (0.0 where ``loss_mask`` is 0)."""
    policy_versions: list[int]
    """Policy version that sampled each token (-1 where ``loss_mask`` is 0)."""
    reward: float
    """Total reward of the episode."""
    terminated: bool
    """The task ended inside the environment (no bootstrapping)."""
    truncated: bool
    """A limit cut the episode (the learner bootstraps from the critic)."""
    stop_reason: StopReason
    """Why the episode ended."""
    infra_failure: bool
    """The sandbox, machine or backend failed, not the agent: exclude from training."""
    messages: list[Message]
    """The whole conversation, final observation included, for logging."""
    env_id: str
    """Registered id of the environment (``""`` if it had no spec)."""
    task_id: str
    """Identifier of the task inside the environment."""
    seed: int | None
    """Seed passed to reset."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Numeric per-episode metrics (turns, tokens, reward components, ...)."""
    start_version: int | None = None
    """Policy version that sampled the episode's first action token (-1 when it has
    none). Derived from ``policy_versions`` when not given."""
    group_id: int | None = None
    """Id of the group the rollout source sampled this rollout in (rollouts of one
    task sampled together share it; GRPO normalises within it). ``None``: no group."""
    segment_starts: list[int] = field(default_factory=list)
    """Where each segment after the first begins in ``token_ids`` (empty: one segment).

    An episode whose agent rewrote its own history (a harness behind the
    gateway that truncated or summarised its conversation) is several token
    sequences, each with its own prompt: the learner runs each segment as a
    sequence of its own, and its GAE links the last action token of a segment
    to the first action token of the next (``docs/learner.md``)."""

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        lengths = {
            "loss_mask": len(self.loss_mask),
            "rollout_logprobs": len(self.rollout_logprobs),
            "policy_versions": len(self.policy_versions),
        }
        bad = {k: v for k, v in lengths.items() if v != n}
        if bad:
            raise ValueError(f"Rollout fields must have len(token_ids)={n}; got {bad}")
        bounds = [0, *self.segment_starts, n]
        if self.segment_starts and any(a >= b for a, b in zip(bounds, bounds[1:], strict=False)):
            raise ValueError(f"segment_starts must rise strictly inside (0, {n}); got "
                             f"{self.segment_starts}")
        if not isinstance(self.stop_reason, StopReason):
            object.__setattr__(self, "stop_reason", StopReason(self.stop_reason))
        if self.start_version is None:
            first = next((v for v, m in zip(self.policy_versions, self.loss_mask, strict=True)
                          if m), -1)
            object.__setattr__(self, "start_version", int(first))

    @property
    def num_action_tokens(self) -> int:
        """Number of tokens sampled by the policy."""
        return sum(self.loss_mask)

    @property
    def segment_spans(self) -> list[tuple[int, int]]:
        """``(start, stop)`` of each segment in ``token_ids``, in order."""
        bounds = [0, *self.segment_starts, len(self.token_ids)]
        return list(zip(bounds, bounds[1:], strict=False))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (``StopReason`` as its string value)."""
        d = dataclasses.asdict(self)
        d["stop_reason"] = self.stop_reason.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Rollout:
        """Inverse of :meth:`to_dict`."""
        return cls(**{**d, "stop_reason": StopReason(d["stop_reason"])})


@dataclass(frozen=True)
class Trajectory:
    """An agent's record of one episode: the token-level part of a :class:`Rollout`."""

    token_ids: list[int] = field(default_factory=list)
    """Prompt, sampled tokens and observation deltas, in order."""
    loss_mask: list[int] = field(default_factory=list)
    """1 for sampled tokens."""
    logprobs: list[float] = field(default_factory=list)
    """Sampler logprobs (0.0 where the mask is 0)."""
    policy_versions: list[int] = field(default_factory=list)
    """Sampling policy version per token (-1 where the mask is 0)."""
    messages: list[Message] = field(default_factory=list)
    """The conversation as the agent saw and produced it."""
