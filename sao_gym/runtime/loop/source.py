"""The rollout side of training: a task stream, episode workers, and the staleness rule.

:class:`RolloutSource` runs episodes concurrently on the event loop and hands
the learner batches of finished rollouts. It is the one place that knows
everything the staleness bound depends on (running episodes *and* finished
ones waiting to be trained), so the rule lives here whole.

**The clock** is the policy version: the optimizer steps that changed the
served weights (:attr:`~sao_gym.learner.learner.Learner.policy_version`). The
source learns it from :meth:`step_done` after each learner step.

**The rule.** With ``k = max_staleness``, every action token of every batch
handed out satisfies ``V - v <= k``, where ``V`` is the policy version when
the batch is handed out (the version the learner trains) and ``v`` the
version that sampled the token. A group (the ``group_size`` rollouts of one
task; 1 for SAO) is *admitted* at version ``v_g``; its tokens are sampled at
``v_g`` or later, so ``V - v_g <= k`` suffices. One learner step adds at most
``m = max_versions_per_step`` versions, so the ``j``-th batch from now
(``j = 0``: the next) trains at a version ``<= now + j * m``, and a group may
wait at most ``deadline = floor((v_g + k - now) / m)`` more batches (``now``
counts the step in progress as done, conservatively: ``V + m``). With ``N``
groups per batch, the open groups (admitted, not yet handed out) are
*feasible* when, for every ``j >= 0``, at most ``(j + 1) * N`` of them have a
deadline ``<= j``. Then:

- **admission**: a new group starts only if the open groups stay feasible
  with it (new episodes wait; no finished work is ever thrown away);
- **hand-out**: :meth:`next_batch` takes the ``N`` finished groups with the
  earliest deadlines, and only when the rest stays feasible after the step;
  otherwise it waits for older groups to finish.

Feasibility is kept at every admission and hand-out (taking the earliest
deadlines preserves it), so once the older groups finish a batch can always
be handed out: no deadlock, and the bound holds for queued rollouts too.
``k = 0`` is the synchronous baseline: ``N`` groups start, all must finish,
the learner trains while nothing runs, repeat.

**Failures.** An infra-failure episode is never delivered; it is counted and
retried (same group, its admission version kept) up to ``max_infra_retries``
times; then its whole group is dropped: its running members are cancelled,
its admission slots are released, and nothing more of it is retried. When
``max_failures_in_a_row`` episodes in a row fail (nothing works: every
inference server is down, the environment cannot start), :meth:`next_batch`
raises :class:`RolloutsFailing` instead of retrying forever.

**Task stream.** Group ``g`` plays seed ``seed + g`` (each of its members
resets with that seed, hence the same task); the seed is also its
``Rollout.group_id``. :meth:`state_dict` is the resume cursor.

**Difficulty.** With a curriculum (``difficulty``: its ``current()``), each
group is admitted at the curriculum's level then: its members (and retries)
play with that level's env options, and each rollout records the level's
index in ``metrics["curriculum_level"]`` (:mod:`sao_gym.curriculum`).

**Sampling seeds.** Each episode samples with its own seed,
:func:`episode_seed` of (``sample_seed``, task seed, member, attempt): the
members of a group sample differently, a retry differently from the failed
try, and an episode's draws do not depend on what else runs at the time.
With a batch-invariant backend and ``max_staleness = 0`` a run is therefore
reproducible bit for bit (docs/training.md), and a resumed run replays the
groups open at its checkpoint with the same draws.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sao_gym.curriculum import LEVEL_METRIC
from sao_gym.types import Rollout
from sao_gym.utils.seeds import mixed_seed

FAILURES_KEPT = 256
"""Infra-failure rollouts a source holds for :meth:`RolloutSource.take_failures`."""

logger = logging.getLogger(__name__)

class RolloutsFailing(RuntimeError):
    """Every recent episode failed; training cannot go on (the message says how)."""


PlayFn = Callable[..., Awaitable[Rollout]]
"""``play(seed, sample_seed[, env_kwargs]) -> Rollout``: one whole episode on the task of
``seed``, its agent sampling with ``sample_seed`` (``env_kwargs``: a curriculum level's
env options, passed only with a curriculum); errors as data."""


episode_seed = mixed_seed
"""An episode's sampling seed: :func:`~sao_gym.utils.seeds.mixed_seed` of (the run's
sampling seed, task seed, member, attempt)."""


@dataclass
class SourceCounters:
    """What the rollout side did since start (or resume)."""

    delivered: int = 0
    """Rollouts handed to the learner."""
    infra_failures: int = 0
    """Episodes that ended in an infrastructure failure (never delivered)."""
    dropped_groups: int = 0
    """Groups given up after ``max_infra_retries`` retries of one member."""
    action_tokens: int = 0
    """Sampled tokens in delivered rollouts."""


@dataclass(eq=False)
class _Group:
    seed: int
    admitted_version: int
    members: list[Rollout | None]
    attempts: list[int]
    running: dict[int, asyncio.Task] = field(default_factory=dict)
    level: tuple[int, Mapping[str, Any]] | None = None
    """The curriculum level it was admitted at: (index, env options)."""

    @property
    def ready(self) -> bool:
        return all(r is not None for r in self.members)


class RolloutSource:
    """Concurrent episodes, admitted and handed out under the staleness bound.

    Args:
        play: ``play(seed, sample_seed) -> Rollout`` for one episode (see :data:`PlayFn`);
            an infra failure comes back as a rollout with ``infra_failure``.
        batch_size: rollouts per learner step.
        group_size: rollouts per task, delivered together.
        concurrency: episodes running at once.
        max_staleness: ``k`` of the rule (module docs), in policy versions.
        max_versions_per_step: the most versions one learner step can add.
        max_infra_retries: retries of a failed episode before its group is dropped.
        seed: first task seed.
        sample_seed: the run's sampling seed (the same on resume), mixed into
            every episode's (module docs).
        version: the policy version now (nonzero on resume).
        max_failures_in_a_row: consecutive infra failures that end the run
            (default: ``max(16, 2 * concurrency)``).
        difficulty: ``() -> (level index, env options)``, a curriculum's
            ``current``, read as each group is admitted (None: no curriculum).

    """

    def __init__(self, play: PlayFn, *, batch_size: int, group_size: int = 1,
                 concurrency: int, max_staleness: int, max_versions_per_step: int = 1,
                 max_infra_retries: int = 3, seed: int = 0, sample_seed: int = 0,
                 version: int = 0, max_failures_in_a_row: int | None = None,
                 difficulty: Callable[[], tuple[int, Mapping[str, Any]]] | None = None):
        if batch_size < 1 or group_size < 1 or batch_size % group_size:
            raise ValueError(f"batch_size ({batch_size}) must be a positive multiple of "
                             f"group_size ({group_size})")
        if concurrency < 1 or max_staleness < 0 or max_versions_per_step < 1:
            raise ValueError("concurrency and max_versions_per_step must be >= 1, "
                             "max_staleness >= 0")
        self.play, self.difficulty = play, difficulty
        self.batch_size, self.group_size = batch_size, group_size
        self.groups_per_batch = batch_size // group_size
        self.concurrency = concurrency
        self.max_staleness, self.max_versions_per_step = max_staleness, max_versions_per_step
        self.max_infra_retries = max_infra_retries
        self.max_failures_in_a_row = max_failures_in_a_row or max(16, 2 * concurrency)
        self._failures_in_a_row = 0
        self._fatal: RolloutsFailing | None = None
        self.version = version
        self.counters = SourceCounters()
        self._next_seed = seed
        self.sample_seed = sample_seed
        self._open: dict[int, _Group] = {}  # admitted, not handed out; by seed, oldest first
        self._work: deque[tuple[_Group, int]] = deque()  # members waiting for a worker
        self._stepping = False
        self._changed = asyncio.Condition()
        self._workers: list[asyncio.Task] = []
        self._failures: deque[Rollout] = deque(maxlen=FAILURES_KEPT)

    def take_failures(self) -> list[Rollout]:
        """The infra-failure rollouts since the last call (at most :data:`FAILURES_KEPT`)."""
        out = list(self._failures)
        self._failures.clear()
        return out

    # ----- the rule -----
    def _deadline(self, admitted_version: int, *, after_step: bool) -> int:
        now = self.version + (self.max_versions_per_step if after_step else 0)
        return (admitted_version + self.max_staleness - now) // self.max_versions_per_step

    def _feasible(self, deadlines: list[int]) -> bool:
        n = self.groups_per_batch
        return all(d >= 0 and i < (d + 1) * n for i, d in enumerate(sorted(deadlines)))

    def _deadlines(self, groups: list[_Group], *, after_step: bool) -> list[int]:
        return [self._deadline(g.admitted_version, after_step=after_step) for g in groups]

    def _admissible(self) -> bool:
        deadlines = self._deadlines(list(self._open.values()), after_step=self._stepping)
        deadlines.append(self._deadline(self.version, after_step=self._stepping))
        return self._feasible(deadlines)

    def _pick(self) -> list[_Group] | None:
        """The batch to hand out now (earliest deadlines among finished groups), or None."""
        if self._stepping:
            return None
        ready = [g for g in self._open.values() if g.ready]  # oldest first: dicts keep order
        if len(ready) < self.groups_per_batch:
            return None
        batch = sorted(ready, key=lambda g: g.admitted_version)[:self.groups_per_batch]
        rest = [g for g in self._open.values() if g not in batch]
        return batch if self._feasible(self._deadlines(rest, after_step=True)) else None

    # ----- the learner's side -----
    async def next_batch(self) -> list[Rollout]:
        """Wait for the next batch allowed by the rule; hand it out (module docs).

        Call :meth:`step_done` when the learner step it feeds has finished.
        Raises :class:`RolloutsFailing` once ``max_failures_in_a_row``
        episodes in a row have failed.
        """
        async with self._changed:
            await self._changed.wait_for(lambda: self._fatal is not None
                                         or self._pick() is not None)
            if self._fatal is not None:
                raise self._fatal
            batch = self._pick()
            assert batch is not None
            for g in batch:
                del self._open[g.seed]
            self._stepping = True
            self._changed.notify_all()
        rollouts = [r for g in batch for r in g.members if r is not None]
        self.counters.delivered += len(rollouts)
        self.counters.action_tokens += sum(r.num_action_tokens for r in rollouts)
        return rollouts

    async def step_done(self, version: int) -> None:
        """The learner step fed by the last batch is over; the policy version is ``version``."""
        async with self._changed:
            if version < self.version:
                raise ValueError(f"policy version went back from {self.version} to {version}")
            if version - self.version > self.max_versions_per_step:
                logger.warning("one learner step added %d policy versions, more than "
                               "max_versions_per_step=%d: the staleness bound may not hold",
                               version - self.version, self.max_versions_per_step)
            self.version = version
            self._stepping = False
            self._changed.notify_all()

    # ----- control -----
    def start(self) -> None:
        """Start the episode workers."""
        if not self._workers:
            self._workers = [asyncio.ensure_future(self._worker())
                             for _ in range(self.concurrency)]

    async def stop(self) -> None:
        """Cancel running episodes and workers (unfinished work is lost, not delivered)."""
        episodes = [t for g in self._open.values() for t in g.running.values()]
        for t in [*self._workers, *episodes]:
            t.cancel()
        await asyncio.gather(*self._workers, *episodes, return_exceptions=True)
        self._workers = []

    @property
    def in_flight(self) -> int:
        """Episodes running now."""
        return sum(len(g.running) for g in self._open.values())

    @property
    def queued(self) -> int:
        """Finished rollouts waiting to be handed out."""
        return sum(r is not None for g in self._open.values() for r in g.members)

    def state_dict(self) -> dict[str, int]:
        """The resume cursor: the first seed whose group was not handed out yet.

        Groups open at a checkpoint are played again on resume.
        """
        return {"next_seed": min([self._next_seed, *self._open])}

    # ----- workers -----
    def _take(self) -> tuple[_Group, int] | None:
        if not self._work and self._admissible():
            g = _Group(self._next_seed, self.version, [None] * self.group_size,
                       [0] * self.group_size,
                       level=self.difficulty() if self.difficulty is not None else None)
            self._next_seed += 1
            self._open[g.seed] = g
            self._work.extend((g, m) for m in range(self.group_size))
        return self._work.popleft() if self._work else None

    async def _worker(self) -> None:
        while True:
            async with self._changed:
                await self._changed.wait_for(lambda: self._fatal is None
                                             and (bool(self._work) or self._admissible()))
                group, member = self._take()  # type: ignore[misc]
                sample_seed = episode_seed(self.sample_seed, group.seed, member,
                                           group.attempts[member])
                task = asyncio.ensure_future(
                    self.play(group.seed, sample_seed) if group.level is None
                    else self.play(group.seed, sample_seed, dict(group.level[1])))
                group.running[member] = task
            await asyncio.wait([task])
            async with self._changed:
                group.running.pop(member, None)
                self._finish(group, member, task)
                self._changed.notify_all()

    def _finish(self, group: _Group, member: int, task: asyncio.Task) -> None:
        if task.cancelled() or group.seed not in self._open:
            return  # its group was dropped meanwhile
        rollout = None if task.exception() is not None else task.result()
        if task.exception() is not None:
            logger.error("episode on seed %d raised", group.seed, exc_info=task.exception())
        if rollout is not None and not rollout.infra_failure:
            metrics = (rollout.metrics if group.level is None
                       else {**rollout.metrics, LEVEL_METRIC: float(group.level[0])})
            group.members[member] = dataclasses.replace(rollout, group_id=group.seed,
                                                        metrics=metrics)
            self._failures_in_a_row = 0
            return
        self.counters.infra_failures += 1
        if rollout is not None:
            self._failures.append(rollout)
        self._failures_in_a_row += 1
        if self._failures_in_a_row >= self.max_failures_in_a_row and self._fatal is None:
            how = rollout.stop_reason.value if rollout is not None else "raised"
            self._fatal = RolloutsFailing(
                f"{self._failures_in_a_row} episodes in a row failed (the last: {how}, seed "
                f"{group.seed}); stopping. The log above says why (e.g. no inference server "
                "left, an environment that cannot start).")
            logger.error("%s", self._fatal)
        if group.attempts[member] < self.max_infra_retries:
            group.attempts[member] += 1
            self._work.appendleft((group, member))
            return
        self.counters.dropped_groups += 1
        logger.warning("task seed %d dropped after %d retries", group.seed,
                       group.attempts[member])
        del self._open[group.seed]
        self._work = deque(w for w in self._work if w[0] is not group)
        for t in group.running.values():
            t.cancel()
