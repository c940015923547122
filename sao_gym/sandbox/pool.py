"""A warm pool of sandboxes, with start-up overlapped with generation.

:class:`SandboxPool` keeps ``size`` started sandboxes ready and bounds the
sandboxes in use to ``max_concurrency``. Sandboxes are single-use: one per
episode, closed on release (nothing leaks from one episode to the next), and
the pool refills in the background.

An environment calls :meth:`SandboxPool.lease` in ``reset``: provisioning
starts at once, in the background, while the model generates its first turn;
the environment awaits :meth:`SandboxLease.get` on first use and calls
:meth:`SandboxLease.release` when the episode ends. Each phase has its own
time limit (setup, teardown; a command's own limit is ``run(timeout_s=...)``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from sao_gym.sandbox.base import Sandbox, SandboxError, SandboxTimeout

logger = logging.getLogger(__name__)


@dataclass
class PoolStats:
    """Counters of a :class:`SandboxPool`."""

    started: int = 0
    """Sandboxes started (warm or on demand)."""
    warm_hits: int = 0
    """Acquisitions served from the warm pool."""
    failures: int = 0
    """Starts or closes that failed or timed out."""
    in_use: int = 0
    """Sandboxes leased right now."""


class SandboxPool:
    """Warm, bounded, single-use sandboxes from ``factory``.

    Args:
        factory: builds an unstarted sandbox (e.g. ``lambda: LocalSandbox()``).
        size: started sandboxes kept ready.
        max_concurrency: sandboxes in use at once; further acquisitions wait.
        setup_timeout_s: limit on starting one sandbox.
        teardown_timeout_s: limit on closing one sandbox.

    """

    def __init__(
        self,
        factory: Callable[[], Sandbox],
        size: int = 0,
        max_concurrency: int = 16,
        *,
        setup_timeout_s: float = 60.0,
        teardown_timeout_s: float = 30.0,
    ):
        if size < 0 or max_concurrency < 1:
            raise ValueError("size must be >= 0 and max_concurrency >= 1")
        self.factory = factory
        self.size = size
        self.max_concurrency = max_concurrency
        self.setup_timeout_s = setup_timeout_s
        self.teardown_timeout_s = teardown_timeout_s
        self.stats = PoolStats()
        self._slots = asyncio.Semaphore(max_concurrency)
        self._warm: list[Sandbox] = []
        self._filling = 0
        self._tasks: set[asyncio.Task] = set()
        self._closed = False

    # ----- public API -----
    def lease(self) -> SandboxLease:
        """Start acquiring a sandbox in the background; await ``.get()`` to use it."""
        return SandboxLease(self)

    async def acquire(self) -> Sandbox:
        """A started sandbox: a warm one if ready, else a new one (waits for a slot)."""
        self._check_open()
        await self._slots.acquire()
        try:
            if self._warm:
                sandbox = self._warm.pop()
                self.stats.warm_hits += 1
            else:
                sandbox = await self._start_one()
        except BaseException:
            self._slots.release()
            raise
        self.stats.in_use += 1
        self._refill()
        return sandbox

    async def release(self, sandbox: Sandbox) -> None:
        """Close a leased sandbox (single use) and free its slot. Never raises."""
        try:
            await self._close_one(sandbox)
        finally:
            self.stats.in_use -= 1
            self._slots.release()
            self._refill()

    async def start(self) -> None:
        """Fill the warm pool now and wait until it is full (optional)."""
        self._check_open()
        need = self.size - len(self._warm) - self._filling
        if need > 0:
            self._filling += need
            try:
                results = await asyncio.gather(*(self._start_warm() for _ in range(need)),
                                               return_exceptions=True)
            finally:
                self._filling -= need
            for r in results:
                if isinstance(r, BaseException):
                    logger.warning("warm sandbox failed to start: %s", r)

    async def aclose(self) -> None:
        """Stop refilling and close the warm sandboxes. Idempotent."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        warm, self._warm = self._warm, []
        await asyncio.gather(*(self._close_one(s) for s in warm))

    async def __aenter__(self) -> SandboxPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ----- internals -----
    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("the sandbox pool is closed")

    async def _start_one(self) -> Sandbox:
        sandbox = self.factory()
        try:
            await asyncio.wait_for(sandbox.start(), self.setup_timeout_s)
        except asyncio.TimeoutError:
            self.stats.failures += 1
            await self._close_one(sandbox)
            raise SandboxTimeout(f"sandbox start took over {self.setup_timeout_s} s") from None
        except BaseException:
            self.stats.failures += 1
            await asyncio.shield(self._close_one(sandbox))
            raise
        self.stats.started += 1
        return sandbox

    async def _start_warm(self) -> None:
        sandbox = await self._start_one()
        if self._closed:
            await self._close_one(sandbox)
        else:
            self._warm.append(sandbox)

    def _refill(self) -> None:
        if self._closed:
            return
        while len(self._warm) + self._filling < self.size:
            self._filling += 1
            task = asyncio.ensure_future(self._start_warm())
            self._tasks.add(task)
            task.add_done_callback(self._refill_done)

    def _refill_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self._filling -= 1
        if not task.cancelled() and task.exception() is not None:
            logger.warning("warm sandbox failed to start: %s", task.exception())

    async def _close_one(self, sandbox: Sandbox) -> None:
        try:
            await asyncio.wait_for(sandbox.aclose(), self.teardown_timeout_s)
        except Exception as e:  # noqa: BLE001 - teardown problems are logged, not raised
            self.stats.failures += 1
            logger.warning("sandbox teardown failed: %r", e)


class SandboxLease:
    """A sandbox being provisioned for one episode (see :meth:`SandboxPool.lease`)."""

    def __init__(self, pool: SandboxPool):
        self._pool = pool
        self._task: asyncio.Task[Sandbox] = asyncio.ensure_future(pool.acquire())
        self._released = False

    async def get(self) -> Sandbox:
        """The sandbox, once started (raises the start's error, e.g. SandboxTimeout)."""
        if self._released:
            raise SandboxError("this sandbox lease was released")
        return await asyncio.shield(self._task)

    async def release(self) -> None:
        """Give the sandbox back (closing it), or cancel its provisioning. Idempotent."""
        if self._released:
            return
        self._released = True
        if not self._task.done():
            self._task.cancel()
        await asyncio.wait([self._task])
        if not self._task.cancelled() and self._task.exception() is None:
            await self._pool.release(self._task.result())
