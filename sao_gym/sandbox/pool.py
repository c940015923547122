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

Environments built once per episode (the trainer makes a new env for every
episode) share pools through :func:`shared_pool`: one pool per sandbox spec
and event loop, closed when the loop shuts down, with the sandboxes still
leased from it (an env nobody closed: ``asyncio.run(run_episode(make(...),
agent))``), so that no sandbox process outlives its loop. :class:`EpisodeSandbox`
is the life cycle an env holds: lease at reset, get on first use, release at
the next reset or at close.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sao_gym.sandbox.base import Sandbox, SandboxError, SandboxTimeout
from sao_gym.sandbox.spec import split_pool_options

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
        setup_timeout_s: limit on starting one sandbox (``None``: none).
        teardown_timeout_s: limit on closing one sandbox (``None``: none).

    """

    def __init__(
        self,
        factory: Callable[[], Sandbox],
        size: int = 0,
        max_concurrency: int = 16,
        *,
        setup_timeout_s: float | None = 60.0,
        teardown_timeout_s: float | None = 30.0,
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
        self._leased: dict[int, Sandbox] = {}  # by id(): sandboxes need not be hashable
        self._filling = 0
        self._tasks: set[asyncio.Task] = set()
        self._closed = False

    # ----- public API -----
    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called (acquisitions then fail)."""
        return self._closed

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
        self._leased[id(sandbox)] = sandbox
        self._refill()
        return sandbox

    async def release(self, sandbox: Sandbox) -> None:
        """Close a leased sandbox (single use) and free its slot. Never raises."""
        self._leased.pop(id(sandbox), None)
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

    async def aclose(self, *, leased: bool = False) -> None:
        """Stop refilling and close the warm sandboxes. Idempotent.

        With ``leased``, close the sandboxes in use too (their leases then
        hold closed sandboxes; releasing them still frees the slots): what a
        loop's shutdown does, after which no lease can be used.
        """
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        closing, self._warm = self._warm, []
        if leased:
            closing += self._leased.values()
            self._leased = {}
        await asyncio.gather(*(self._close_one(s) for s in closing))

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
        except BaseException as e:
            if not isinstance(e, asyncio.CancelledError):  # a released lease is no failure
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


# ----- pools shared by the envs of one event loop ---------------------------------------
@dataclass
class _LoopPools:
    """The shared pools of one event loop, and the async generator that closes them with it."""

    pools: dict[Hashable, SandboxPool] = field(default_factory=dict)
    closer: Any = None


_SHARED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopPools] = \
    weakref.WeakKeyDictionary()


def shared_pool(
    spec: str | Mapping[str, Any] = "local",
    *,
    make: Callable[[str | Mapping[str, Any]], Sandbox] | None = None,
) -> SandboxPool:
    """The pool of ``spec``'s sandboxes shared on the running event loop (made at first use).

    Everything on one loop asking for the same spec (same content, whatever
    the key order) and the same ``make`` gets the same pool, so envs built
    per episode share its warm sandboxes and its bound. The pool's options
    are the spec's ``"pool"`` entry (:data:`~sao_gym.sandbox.spec.POOL_OPTIONS`); its sandboxes are
    ``make(spec without "pool")`` (default :func:`sao_gym.sandbox.factory.make_sandbox`,
    looked up at each call; pass a module-level function, not a new lambda,
    or no pool is shared). A loop's pools are closed when it shuts down
    (``asyncio.run``, ``asyncio.Runner``, the sync API's ``env.close()``),
    with the sandboxes still leased from them, or by
    :func:`aclose_shared_pools`; a closed pool is replaced at the next call.
    """
    loop = asyncio.get_running_loop()
    if make is None:
        from sao_gym.sandbox import factory

        make = factory.make_sandbox
    key = (_spec_key(spec), make)
    shared = _SHARED.setdefault(loop, _LoopPools())
    pool = shared.pools.get(key)
    if pool is None or pool.closed:
        sandbox_spec, options = split_pool_options(spec)
        pool = shared.pools[key] = SandboxPool(lambda: make(sandbox_spec), **options)
    if shared.closer is None:  # close the pools and their leased sandboxes with the loop
        shared.closer = _close_at_shutdown(shared.pools)
        _start(shared.closer)
    return pool


async def aclose_shared_pools() -> None:
    """Close the running loop's shared pools now (their warm sandboxes). Idempotent.

    Leased sandboxes stay with their leases (closed when released).
    """
    shared = _SHARED.get(asyncio.get_running_loop())
    if shared is not None:
        await _aclose_all(shared.pools)


def _spec_key(spec: Any) -> str:
    options = {"backend": spec} if isinstance(spec, str) else dict(spec)
    options.setdefault("backend", "local")
    return json.dumps(options, sort_keys=True, default=repr)


async def _aclose_all(pools: dict[Hashable, SandboxPool], *, leased: bool = False) -> None:
    closing = list(pools.values())
    pools.clear()
    await asyncio.gather(*(pool.aclose(leased=leased) for pool in closing),
                         return_exceptions=True)


async def _close_at_shutdown(pools: dict[Hashable, SandboxPool]) -> AsyncIterator[None]:
    """Suspended until ``loop.shutdown_asyncgens()``, which closes it: then close ``pools``.

    asyncio offers no "loop closing" callback, but an async generator that has
    started is registered with its loop (the loop's ``firstiter`` hook), and
    ``shutdown_asyncgens()`` (run by ``asyncio.run``, ``asyncio.Runner`` and
    the sync API's ``close``) closes every such generator, running this
    ``finally`` while the loop still runs. The sandboxes still leased go too:
    an env nobody closed leaves its episode's sandbox leased, and a sandbox
    process left to the garbage collector after the loop closed makes its
    subprocess transport print "Event loop is closed" at exit. The generator
    refers to its loop (its finalizer), so the loop's registry entry lives
    until its shutdown; a loop closed without ``shutdown_asyncgens()`` keeps
    its entry.
    """
    try:
        yield
    finally:
        _SHARED.pop(asyncio.get_running_loop(), None)
        await _aclose_all(pools, leased=True)


def _start(agen: Any) -> None:
    """Run ``agen`` to its first ``yield`` (registering it with the running loop)."""
    step = agen.__anext__()
    try:
        step.send(None)
    except StopIteration:
        pass
    else:  # pragma: no cover - the generator yields before any await
        raise RuntimeError("the pool closer awaited before its first yield")


class EpisodeSandbox:
    """The sandbox of an environment's current episode, leased from a pool.

    In reset, ``await lease(spec)`` releases the previous episode's sandbox
    and starts provisioning a new one in the background, overlapping the
    model's first turn; ``await get()`` returns it, started, at first use (a
    failed start raises its :class:`SandboxError` there: an infra failure);
    ``await release()`` closes it (single use) at the episode's end or at
    close. Sandboxes come from ``pool`` when given (the caller owns it), else
    from :func:`shared_pool` of the spec.

    Args:
        pool: a pool the caller owns and closes; ``None``: shared pools.
        owner: the :class:`~sao_gym.core.AgentEnv` holding this; under its
            sync API provisioning starts at the first ``get`` instead.

    """

    def __init__(self, pool: SandboxPool | None = None, *, owner: Any = None):
        if pool is not None and not isinstance(pool, SandboxPool):
            raise ValueError(f"sandbox_pool must be a SandboxPool or None, got {pool!r}")
        self.pool = pool
        self.sandbox: Sandbox | None = None
        """The started sandbox once :meth:`get` returned it (``None`` before and after)."""
        self._owner = owner
        self._lease: SandboxLease | None = None
        self._deferred: SandboxPool | None = None

    @property
    def leased(self) -> bool:
        """Whether a sandbox is leased (or about to be) for the current episode."""
        return self._lease is not None or self._deferred is not None

    async def lease(self, spec: str | Mapping[str, Any] = "local", *,
                    make: Callable[[str | Mapping[str, Any]], Sandbox] | None = None) -> None:
        """Release the current sandbox and lease a new one (``spec``, ``make``: see shared_pool)."""
        await self.release()
        pool = self.pool if self.pool is not None else shared_pool(spec, make=make)
        if self._in_background():
            self._lease = pool.lease()
        else:
            self._deferred = pool

    async def get(self) -> Sandbox:
        """The leased sandbox, started (raises its start's ``SandboxError``)."""
        if self._lease is None:
            if self._deferred is None:
                raise SandboxError("no sandbox is leased: the episode is over or never started")
            self._lease, self._deferred = self._deferred.lease(), None
        self.sandbox = await self._lease.get()
        return self.sandbox

    async def release(self) -> None:
        """Close the sandbox or cancel its provisioning. Idempotent; never raises."""
        lease, self._lease, self._deferred, self.sandbox = self._lease, None, None, None
        if lease is not None:
            await lease.release()

    def _in_background(self) -> bool:
        # AgentEnv's sync API (reset/step/close) runs each call on a private loop that
        # stops in between: a start left pending there would stall while its time
        # limits (setup_timeout_s, the backend's own) ran on, so it waits for get().
        sync = getattr(self._owner, "_sync", None)
        return asyncio.get_running_loop() is not getattr(sync, "_loop", None)
