"""The rollout side of training: a task stream, episode workers, admission control.

:class:`RolloutSource` runs episodes on the event loop and delivers finished
:class:`~sao_gym.types.Rollout` s (or whole groups of them) to a queue the
moment they end. It owns:

- the task cursor: episode seeds ``seed, seed + 1, ...`` (a group of G
  rollouts shares one seed, hence one task), restorable from a checkpoint;
- retries: an infra-failure rollout is logged, counted, never delivered, and
  its task retried up to ``max_infra_retries`` times;
- admission control: with ``B = batch_size`` and ``k = max_staleness``, no
  episode starts once ``B * (learner_step + k + 1)`` episodes have started
  (failed ones don't count), nor while ``learner_step - oldest in-flight
  start step > k``. Since the learner consumes ``B`` rollouts per step, at
  most ``B`` unconsumed episodes can then have started ``k`` or more steps
  ago, so the learner can always train them in time
  (:class:`~sao_gym.runtime.trainer.Trainer` waits for them) and no finished
  work is ever thrown away;
- the in-flight bookkeeping the learner side uses for that wait. Each
  delivered rollout carries ``metrics["start_step"]``, the learner step at
  which its episode started.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sao_gym.core import Agent, AgentEnv, AgentWrapper
from sao_gym.rollout import run_episode
from sao_gym.types import Rollout

logger = logging.getLogger(__name__)


@dataclass
class RolloutCounters:
    """What the rollout side did since start (or resume)."""

    finished: int = 0
    """Rollouts delivered to the learner."""
    infra_failures: int = 0
    """Episodes that ended in an infrastructure failure (never delivered)."""
    dropped_tasks: int = 0
    """Tasks given up after ``max_infra_retries`` retries."""
    action_tokens: int = 0
    """Sampled tokens in delivered rollouts."""


@dataclass
class _Work:
    seed: int
    member: int = 0
    attempt: int = field(default=0, compare=False)


class RolloutSource:
    """Concurrent episodes feeding a queue of finished rollouts (or groups).

    Args:
        make_env: builds one environment (closed after its episode).
        make_agent: builds one agent for one episode.
        concurrency: episodes at once.
        batch_size: rollouts the learner consumes per step.
        group_size: rollouts per task; a group is delivered when all are done.
        seed: first task seed.
        learner_step: the learner's step now (nonzero on resume).
        max_staleness: admission bound in learner steps (see module docs);
            ``None`` disables admission control.
        max_infra_retries: retries of a failed task.

    """

    def __init__(
        self,
        make_env: Callable[[], AgentEnv | AgentWrapper],
        make_agent: Callable[[], Agent],
        *,
        concurrency: int,
        batch_size: int,
        group_size: int = 1,
        seed: int = 0,
        learner_step: int = 0,
        max_staleness: int | None = None,
        max_infra_retries: int = 3,
    ):
        self.make_env, self.make_agent = make_env, make_agent
        self.concurrency, self.batch_size, self.group_size = concurrency, batch_size, group_size
        self.max_staleness, self.max_infra_retries = max_staleness, max_infra_retries
        self.next_seed = seed
        self.learner_step = learner_step
        self._started = batch_size * learner_step  # consumed so far; none in flight
        self.counters = RolloutCounters()
        self.queue: asyncio.Queue[list[Rollout]] = asyncio.Queue()
        self._retry: deque[_Work] = deque()
        self._pending: deque[_Work] = deque()
        self._groups: dict[int, list[Rollout | None]] = {}
        self._in_flight: dict[int, int] = {}  # worker id -> version at episode start
        self._ids = itertools.count()
        self._changed = asyncio.Condition()
        self._workers: list[asyncio.Task] = []
        self._budget: int | None = None

    # ----- control -----
    def start(self, max_tasks: int | None = None) -> None:
        """Start the workers; with ``max_tasks``, they stop after that many tasks.

        A task dropped after its retries is replaced, so ``max_tasks`` groups
        always arrive (the sync mode's generation round).
        """
        self._budget = max_tasks
        self._workers = [asyncio.ensure_future(self._worker()) for _ in range(self.concurrency)]

    async def stop(self) -> None:
        """Cancel running episodes (their work is lost, not delivered)."""
        for w in self._workers:
            w.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []

    async def set_learner_step(self, step: int) -> None:
        """Tell admission control the learner's step (after each update)."""
        async with self._changed:
            self.learner_step = step
            self._changed.notify_all()

    @property
    def in_flight(self) -> int:
        """Episodes running now."""
        return len(self._in_flight)

    def oldest_start_step(self) -> int | None:
        """The earliest start step among running episodes and waiting group members."""
        steps = list(self._in_flight.values())
        steps += [start_step(r) for g in self._groups.values() for r in g if r is not None]
        return min(steps, default=None)

    def state_dict(self) -> dict[str, int]:
        """The task cursor: the first seed no episode has started on yet.

        Tasks in flight at a checkpoint are started again on resume.
        """
        pending = [w.seed for w in (*self._retry, *self._pending)]
        running = [s for s in self._groups]
        return {"next_seed": min([self.next_seed, *pending, *running])}

    # ----- workers -----
    def _take_work(self) -> _Work | None:
        if self._retry:
            return self._retry.popleft()
        if not self._pending:
            if self._budget is not None:
                if self._budget <= 0:
                    return None
                self._budget -= 1
            seed = self.next_seed
            self.next_seed += 1
            self._groups[seed] = [None] * self.group_size
            self._pending.extend(_Work(seed, m) for m in range(self.group_size))
        return self._pending.popleft()

    def _admissible(self) -> bool:
        if self.max_staleness is None:
            return True
        if self._started >= self.batch_size * (self.learner_step + self.max_staleness + 1):
            return False
        oldest = min(self._in_flight.values(), default=None)
        return oldest is None or self.learner_step - oldest <= self.max_staleness

    async def _worker(self) -> None:
        while True:
            async with self._changed:
                await self._changed.wait_for(self._admissible)
                work = self._take_work()
                if work is None:
                    return
                wid = next(self._ids)
                self._in_flight[wid] = self.learner_step
                self._started += 1
            rollout = None
            try:
                rollout = await self._play(work)
            finally:
                async with self._changed:
                    began = self._in_flight.pop(wid)
                    if rollout is None:  # failed or cancelled: it will not be consumed
                        self._started -= 1
                    self._changed.notify_all()
            if rollout is not None:
                rollout.metrics["start_step"] = float(began)
                self._deliver(work, rollout)

    async def _play(self, work: _Work) -> Rollout | None:
        try:
            env = self.make_env()
        except Exception:
            logger.exception("could not build the environment; retrying the task")
            self._failed(work)
            await asyncio.sleep(1.0)
            return None
        try:
            rollout = await run_episode(env, self.make_agent(), seed=work.seed)
        except Exception:  # reset or the agent's construction failed
            logger.exception("episode on seed %d failed before it started", work.seed)
            rollout = None
        finally:
            try:
                await env.aclose()
            except Exception:
                logger.exception("closing an environment failed")
        if rollout is None or rollout.infra_failure:
            self._failed(work)
            return None
        return rollout

    def _failed(self, work: _Work) -> None:
        self.counters.infra_failures += 1
        if work.attempt < self.max_infra_retries:
            self._retry.append(_Work(work.seed, work.member, work.attempt + 1))
        else:
            self.counters.dropped_tasks += 1
            logger.warning("task seed %d dropped after %d retries", work.seed, work.attempt)
            if self._groups.pop(work.seed, None) is not None and self._budget is not None:
                self._budget += 1

    def _deliver(self, work: _Work, rollout: Rollout) -> None:
        group = self._groups.get(work.seed)
        if group is None:  # the group was dropped meanwhile
            return
        group[work.member] = rollout
        if all(r is not None for r in group):
            del self._groups[work.seed]
            self.counters.finished += len(group)
            self.counters.action_tokens += sum(r.num_action_tokens for r in group)
            self.queue.put_nowait(list(group))


def start_step(rollout: Rollout) -> int:
    """The learner step at which the rollout's episode started."""
    return int(rollout.metrics.get("start_step", 0))


def oldest_start(group: list[Rollout]) -> int:
    """The earliest start step of a group."""
    return min(start_step(r) for r in group)
