"""The driver's side of the rollout workers: dispatch, weights, replacement.

:class:`WorkerPool` is the ``play`` of the driver's
:class:`~sao_gym.runtime.loop.source.RolloutSource` (each admitted episode runs
on the least loaded worker, at most ``capacity`` at once per worker) and the
backend of its :class:`~sao_gym.runtime.loop.trainer.Trainer` (``update_weights``
broadcasts the new ``(version, box)`` to every worker, generations keep
running).

**A worker that dies** (its process killed, its node lost) fails every call
in flight on it with one of ``dead_errors``. The first such failure replaces
it: a new actor is spawned with the current weights and version, the death
and the new pid are logged, and each unfinished episode of the dead worker
is played again (same seed, on whichever worker is free): the source sees
only an episode that took longer. Episodes that had finished were already
delivered, once. After ``max_restarts`` replacements of one worker it is
given up; when no worker is left, every episode fails with
:class:`NoWorkersLeft` and the source ends the run (``RolloutsFailing``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sao_gym.types import Rollout
from sao_gym.utils.restarts import GivenUp, Restarts

logger = logging.getLogger(__name__)

Spawn = Callable[[int, int], Any]
"""``spawn(index, generation) -> actor handle`` of a new rollout worker (``generation``:
0 at start, then 1, 2, ... for each replacement)."""


class NoWorkersLeft(RuntimeError):
    """Every rollout worker died more often than ``max_restarts`` allows."""


@dataclass(eq=False)
class _Slot:
    index: int
    handle: Any = None
    pid: int | None = None
    generation: int = 0
    load: int = 0
    alive: bool = False
    episodes: int = 0
    versions: set[int] = field(default_factory=set)
    counters: dict[str, int] = field(default_factory=dict)  # this generation's, latest


class WorkerPool:
    """Rollout workers seen from the driver (see module docs).

    Args:
        spawn: builds worker ``index``'s actor (:data:`Spawn`); its ``ready``
            method answers once it can play.
        workers: how many.
        capacity: episodes one worker plays at once.
        dead_errors: exceptions meaning "the worker is gone" (Ray's ``RayActorError``).
        max_restarts: replacements per worker before it is given up.
        version, box: the weights a (re)spawned worker loads once ready (``box``
            None: the ones it was spawned with).
        kill: ends a dead worker's actor for good (best effort).
        startup_timeout_s: longest wait for a (re)spawned worker.
        on_close: called by :meth:`aclose` after the workers are closed.

    """

    def __init__(self, spawn: Spawn, *, workers: int, capacity: int,
                 dead_errors: tuple[type[BaseException], ...], max_restarts: int = 3,
                 version: int = 0, box: list | None = None,
                 kill: Callable[[Any], None] | None = None, startup_timeout_s: float = 300.0,
                 on_close: Callable[[], Awaitable[None]] | None = None):
        if workers < 1 or capacity < 1:
            raise ValueError("workers and capacity must be >= 1")
        self.spawn, self.kill = spawn, kill
        self.capacity, self.dead_errors = capacity, dead_errors
        self.max_restarts, self.startup_timeout_s = max_restarts, startup_timeout_s
        self.version, self.box = version, box
        self.slots = [_Slot(i) for i in range(workers)]
        self._restarts = Restarts(workers, limit=max_restarts)
        self._changed = asyncio.Condition()
        self._replacing: dict[int, asyncio.Task] = {}
        self._on_close = on_close
        self._closed = False
        self._retired: collections.Counter[str] = collections.Counter()  # dead workers'

    @property
    def restarts(self) -> int:
        """Workers replaced so far."""
        return self._restarts.total

    @property
    def concurrency(self) -> int:
        """Episodes the pool plays at once when every worker is up."""
        return len(self.slots) * self.capacity

    async def start(self) -> None:
        """Spawn every worker and wait until each one is ready (or raise)."""
        await asyncio.gather(*(self._bring_up(s) for s in self.slots))

    async def _bring_up(self, slot: _Slot) -> None:
        """Spawn ``slot``'s worker, wait until it is ready and has the current weights."""
        handle = self.spawn(slot.index, slot.generation)

        async def up() -> dict[str, Any]:
            info = await handle.ready.remote()
            if self.box is not None:
                await handle.update_weights.remote(self.version, self.box)
            return info

        info = await asyncio.wait_for(up(), self.startup_timeout_s)
        slot.handle, slot.pid, slot.alive = handle, info["pid"], True

    # ----- play -----
    async def play(self, seed: int, sample_seed: int | None = None,
                   env_kwargs: Mapping[str, Any] | None = None) -> Rollout:
        """One episode on the task of ``seed`` on some worker, again if that worker died.

        Its agent samples with ``sample_seed``; ``env_kwargs`` override the env's
        options (a curriculum's level).
        """
        while True:
            slot = await self._acquire()
            generation = slot.generation
            try:
                rollout, counters = await slot.handle.play.remote(
                    seed, self.version, self.box, sample_seed,
                    dict(env_kwargs) if env_kwargs else None)
            except self.dead_errors as e:
                await self._release(slot)
                await self._lost(slot, generation, e)
                continue
            except BaseException:
                await self._release(slot)
                raise
            await self._release(slot)
            if slot.generation == generation:
                slot.counters = counters
            slot.episodes += 1
            slot.versions.update(v for v, m in zip(rollout.policy_versions, rollout.loss_mask,
                                                   strict=True) if m)
            return rollout

    async def _acquire(self) -> _Slot:
        async with self._changed:
            def free() -> _Slot | None:
                up = [s for s in self.slots if s.alive and s.load < self.capacity]
                return min(up, key=lambda s: s.load) if up else None

            await self._changed.wait_for(lambda: free() is not None or self._gone())
            if self._gone():
                raise NoWorkersLeft(
                    f"every rollout worker died more than ray.max_worker_restarts="
                    f"{self.max_restarts} times; the log above says why")
            slot = free()
            assert slot is not None
            slot.load += 1
            return slot

    async def _release(self, slot: _Slot) -> None:
        async with self._changed:
            slot.load -= 1
            self._changed.notify_all()

    def _gone(self) -> bool:
        return not any(s.alive for s in self.slots) and not self._replacing

    # ----- deaths -----
    async def _lost(self, slot: _Slot, generation: int, error: BaseException) -> None:
        """Worker ``slot`` (as of ``generation``) died: replace it once, whoever noticed."""
        async with self._changed:
            if slot.generation != generation or self._closed:
                return  # already being replaced (or closing)
            slot.generation += 1
            slot.alive = False
            self._retired.update(slot.counters)
            slot.counters = {}
            self._changed.notify_all()
            try:
                n = self._restarts.spend(slot.index, f"rollout worker {slot.index}")
            except GivenUp as e:
                logger.error("rollout worker %d (pid %s) died: %s; given up: %s", slot.index,
                             slot.pid, _short(error), e)
                return
            logger.warning("rollout worker %d (pid %s) died: %s; restarting it (restart %d of "
                           "%d), its unfinished episodes run again", slot.index, slot.pid,
                           _short(error), n, self.max_restarts)
            self._replacing[slot.index] = asyncio.ensure_future(self._replace(slot))

    async def _replace(self, slot: _Slot) -> None:
        old, old_pid = slot.handle, slot.pid
        if self.kill is not None:
            try:
                self.kill(old)
            except Exception:  # noqa: BLE001 - it is dead already
                pass
        try:
            await self._bring_up(slot)
            async with self._changed:
                self._changed.notify_all()
            logger.warning("rollout worker %d restarted: pid %s -> %s, at policy version %d",
                           slot.index, old_pid, slot.pid, self.version)
        except Exception as e:  # noqa: BLE001 - a worker that cannot come back is given up
            logger.error("rollout worker %d could not be restarted: %s", slot.index, _short(e))
        finally:
            async with self._changed:
                self._replacing.pop(slot.index, None)
                self._changed.notify_all()

    # ----- the trainer's backend -----
    @property
    def policy_version(self) -> int:
        """The newest version broadcast."""
        return self.version

    async def update_weights(self, box: list, version: int) -> None:
        """Broadcast ``(version, box)``; every live worker loads it, episodes keep running.

        A worker that fails the update is left to :meth:`play` to replace
        (its next call fails the same way).
        """
        self.version, self.box = int(version), box
        live = [s for s in self.slots if s.alive]
        results = await asyncio.gather(*(_awaitable(s.handle.update_weights.remote(version, box))
                                         for s in live), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, self.dead_errors):
                raise result

    async def aclose(self) -> None:
        """Close every worker (best effort), then ``on_close``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for task in list(self._replacing.values()):
            task.cancel()
        live = [s for s in self.slots if s.alive]
        await asyncio.gather(*(asyncio.wait_for(_awaitable(s.handle.close.remote()), 30)
                               for s in live), return_exceptions=True)
        for s in self.slots:
            if s.handle is not None and self.kill is not None:
                try:
                    self.kill(s.handle)
                except Exception:  # noqa: BLE001 - best effort
                    pass
        if self._on_close is not None:
            await self._on_close()

    def counters(self) -> dict[str, int]:
        """The workers' backend counters summed (``Rollouts.counters``).

        As of each worker's latest finished episode; dead workers' last reports
        included.
        """
        total = collections.Counter(self._retired)
        for s in self.slots:
            total.update(s.counters)
        return dict(total)

    def stats(self) -> list[dict[str, Any]]:
        """Per worker: index, pid, restarts, episodes delivered, policy versions sampled."""
        return [{"index": s.index, "pid": s.pid, "restarts": self._restarts.used[s.index],
                 "alive": s.alive,
                 "episodes": s.episodes, "versions": sorted(s.versions)} for s in self.slots]


async def _awaitable(ref: Any) -> Any:
    return await ref


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]

