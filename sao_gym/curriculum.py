"""A difficulty curriculum: a long horizon reached through shorter ones.

An environment declares its difficulty knob when it registers, as an
ordered list of a constructor keyword's values, easiest first::

    sao_gym.register("my/Maze-v0", "my_mod:MazeEnv",
                     difficulty={"size": [4, 8, 16, 32]})

A run trains towards the knob's value its config gives (``env_kwargs``, else
the registered or constructor default): its **ladder** is the declared
levels below that value, then the value itself (:func:`ladder`). With a
``curriculum`` section in the config (the CPU recipe has one), the run climbs
it (:class:`Curriculum`):

- the **warm start** imitates the oracle at the first level until its
  held-out check passes the warm start's target there, then moves to the
  next level, and so on (:func:`sao_gym.runtime.prepare.start.warm_start`);
- **RL** starts at the level the warm start reached and moves up once the
  training success over the last ``window`` episodes played at the current
  level reaches ``promote_at``. An episode keeps the level it was admitted
  at; the rollout records it (``Rollout.metrics["curriculum_level"]``, the
  level's index);
- RL moves **down** a level when the training success over a full window at
  the current level falls below ``demote_below``: a policy whose episodes
  stopped succeeding gets no reward and so no gradient back to success
  (every return is 0), while one level down its episodes still succeed and
  carry signal. It climbs again by the same rule as before.

Evaluation always plays the run's own value, the top of the ladder. The
state (the level, the window) is kept in the run's checkpoints, so a
resumed run continues on the level it stopped at.
"""

from __future__ import annotations

import collections
import inspect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

LEVEL_METRIC = "curriculum_level"
"""The ``Rollout.metrics`` key of the ladder index an episode was played at."""


@dataclass(frozen=True)
class Difficulty:
    """An env's declared difficulty knob: a constructor keyword and its levels, easiest first."""

    knob: str
    levels: tuple[Any, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.knob, str) or not self.knob.isidentifier():
            raise ValueError(f"a difficulty knob is a constructor keyword, got {self.knob!r}")
        if len(self.levels) < 1 or len(set(map(repr, self.levels))) != len(self.levels):
            raise ValueError(f"the levels of difficulty knob {self.knob!r} must be a non-empty "
                             f"list of distinct values, easiest first; got {list(self.levels)}")

    @classmethod
    def parse(cls, declared: Mapping[str, Sequence[Any]] | Difficulty) -> Difficulty:
        """From ``{"knob": [levels...]}`` (one knob), as ``register(difficulty=...)`` takes it."""
        if isinstance(declared, Difficulty):
            return declared
        if not isinstance(declared, Mapping) or len(declared) != 1:
            raise ValueError("difficulty must map one constructor keyword to its levels, "
                             f"easiest first, e.g. {{'hops': [4, 8, 16]}}; got {declared!r}")
        ((knob, levels),) = declared.items()
        if isinstance(levels, (str, bytes)) or not isinstance(levels, Iterable):
            raise ValueError(f"the levels of difficulty knob {knob!r} must be a list, "
                             f"got {levels!r}")
        return cls(knob, tuple(levels))


def knob_value(entry_point: Any, kwargs: Mapping[str, Any], knob: str) -> Any:
    """The value of ``knob`` an env made with ``kwargs`` has: given, else its constructor default.

    ``entry_point`` is the env class (or a callable); raises ``ValueError`` when
    neither gives a value.
    """
    if knob in kwargs:
        return kwargs[knob]
    try:
        parameter = inspect.signature(entry_point).parameters.get(knob)
    except (TypeError, ValueError):
        parameter = None
    if parameter is None or parameter.default is inspect.Parameter.empty:
        raise ValueError(f"the difficulty knob {knob!r} has no value: give it in env_kwargs")
    return parameter.default


def ladder(difficulty: Difficulty, target: Any) -> tuple[Any, ...]:
    """The levels a run climbs to ``target``: the declared levels below it, then ``target``.

    ``target`` among the declared levels cuts the list there; otherwise, for
    numbers, the levels below it come first. Any other ``target`` raises
    ``ValueError``.
    """
    levels = difficulty.levels
    if target in levels:
        return tuple(levels[:levels.index(target) + 1])
    if not all(_number(x) for x in (*levels, target)):
        raise ValueError(f"{difficulty.knob}={target!r} is not one of the declared levels "
                         f"{list(levels)}, and they are not numbers to compare it with")
    return (*[level for level in levels if level < target], target)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class Curriculum:
    """A run's climb up its ladder (module docs); plain state, kept in checkpoints.

    Args:
        knob: the constructor keyword.
        levels: the ladder, easiest first; the last is the run's own value.
        promote_at: the training success over ``window`` episodes at the current
            level that moves RL to the next one.
        demote_below: the training success over ``window`` episodes at the current
            level under which RL moves back to the previous one (0: never).
        window: episodes at the current level that the success is taken over.
        index: the current level's index.

    """

    knob: str
    levels: tuple[Any, ...]
    promote_at: float = 0.5
    window: int = 64
    index: int = 0
    demote_below: float = 0.05
    _recent: collections.deque = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.levels = tuple(self.levels)
        if not self.levels:
            raise ValueError("a curriculum needs at least one level")
        if not 0 < self.promote_at <= 1:
            raise ValueError(f"promote_at must be in (0, 1], got {self.promote_at}")
        if not 0 <= self.demote_below < self.promote_at:
            raise ValueError(f"demote_below must be in [0, promote_at={self.promote_at}), "
                             f"got {self.demote_below}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if not 0 <= self.index < len(self.levels):
            raise ValueError(f"index {self.index} is outside the {len(self.levels)} levels")
        self._recent = collections.deque(maxlen=self.window)

    @property
    def level(self) -> Any:
        """The current level's value."""
        return self.levels[self.index]

    @property
    def top(self) -> bool:
        """Whether the current level is the run's own value (the last)."""
        return self.index == len(self.levels) - 1

    def kwargs(self, index: int | None = None) -> dict[str, Any]:
        """The env keyword arguments of level ``index`` (default: the current one)."""
        return {self.knob: self.levels[self.index if index is None else index]}

    def current(self) -> tuple[int, dict[str, Any]]:
        """``(index, env kwargs)`` of the current level: what an episode admitted now plays."""
        return self.index, self.kwargs()

    def observe(self, rollouts: Iterable[Any]) -> int:
        """Count finished episodes; the move they caused: +1 up a level, -1 down, 0 none.

        Only rollouts played at the current level count (their
        ``metrics[LEVEL_METRIC]``); a success is a reward of at least 1. A move
        needs a full window at the current level: up at ``promote_at`` or more
        (not from the top), down under ``demote_below`` (not from the first).
        """
        for r in rollouts:
            if r.metrics.get(LEVEL_METRIC) == self.index:
                self._recent.append(r.reward >= 1.0)
        if len(self._recent) < self.window:
            return 0
        success = sum(self._recent) / len(self._recent)
        if success >= self.promote_at and not self.top:
            self.advance()
            return 1
        if success < self.demote_below and self.index > 0:
            self.retreat()
            return -1
        return 0

    def advance(self) -> None:
        """Move to the next level (no-op at the top) and forget the window."""
        self.index = min(self.index + 1, len(self.levels) - 1)
        self._recent.clear()

    def retreat(self) -> None:
        """Move back to the previous level (no-op at the first) and forget the window."""
        self.index = max(self.index - 1, 0)
        self._recent.clear()

    @property
    def success(self) -> float | None:
        """Training success over the window so far (None before any episode at this level)."""
        return sum(self._recent) / len(self._recent) if self._recent else None

    def metrics(self) -> dict[str, float]:
        """``curriculum/level`` (the index) and, once known, ``curriculum/success``."""
        out = {"curriculum/level": float(self.index)}
        if self.success is not None:
            out["curriculum/success"] = self.success
        return out

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (JSON-ready)."""
        return {"knob": self.knob, "levels": list(self.levels), "index": self.index,
                "recent": [bool(x) for x in self._recent]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict`; raises ``ValueError`` for another ladder's state."""
        if state.get("knob") != self.knob or list(state.get("levels", ())) != list(self.levels):
            raise ValueError(f"the checkpoint's curriculum ({state.get('knob')}: "
                             f"{state.get('levels')}) is not this run's ({self.knob}: "
                             f"{list(self.levels)})")
        self.index = int(state["index"])
        self._recent = collections.deque(state.get("recent", ()), maxlen=self.window)


__all__ = ["LEVEL_METRIC", "Curriculum", "Difficulty", "knob_value", "ladder"]
