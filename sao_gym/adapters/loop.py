"""A shared event loop on a daemon thread, for callers that are not ours.

Other RL tools call environments from wherever they run: OpenEnv's server and
NeMo Gym from inside async request handlers (a running event loop), TRL from
its main thread, SkyRL from a thread pool. :class:`~sao_gym.core.AgentEnv`'s
own sync shims refuse to run inside a running loop, and an env's resources
(subprocesses, sandboxes, aiohttp sessions) belong to the loop that created
them. So every adapter hands its environments to one :class:`BackgroundLoop`,
which owns them for their whole life: :meth:`BackgroundLoop.run` blocks the
calling thread (any thread, loop or not) until a coroutine finishes there, and
:meth:`BackgroundLoop.arun` awaits it from another loop without blocking that
loop.

:func:`shared_loop` is the process-wide instance (recreated in a forked child,
whose copy of the thread does not run). At interpreter exit the callbacks
registered with :meth:`BackgroundLoop.at_exit` run on the loop first (adapters
close their open environments there, so sandboxes are not left behind).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

logger = logging.getLogger(__name__)
T = TypeVar("T")

EXIT_TIMEOUT_S = 30.0
"""How long the exit callbacks may take in all before the interpreter goes on."""


class BackgroundLoop:
    """An asyncio loop running forever on a daemon thread (see module docs)."""

    def __init__(self, name: str = "sao-gym-adapters") -> None:
        self.loop = asyncio.new_event_loop()
        self._exit_callbacks: dict[int, Callable[[], Awaitable[Any]]] = {}
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()

    @property
    def running(self) -> bool:
        """Whether the loop still takes work."""
        return self._thread.is_alive() and not self.loop.is_closed()

    def in_loop_thread(self) -> bool:
        """Whether the caller is the loop's own thread (where :meth:`run` would deadlock)."""
        return threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; a thread-safe future of its result."""
        if not self.running:
            coro.close()
            raise RuntimeError("the background event loop is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and block until it finishes (from any other thread).

        Raises ``TimeoutError`` after ``timeout`` seconds (the coroutine is cancelled).
        """
        if self.in_loop_thread():
            coro.close()
            raise RuntimeError("BackgroundLoop.run called from its own loop: await the "
                               "coroutine instead")
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"timed out after {timeout} s") from None

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` running on this loop from another event loop (or this one)."""
        if self.in_loop_thread():
            return await coro
        future = self.submit(coro)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()
            raise

    def at_exit(self, key: int, callback: Callable[[], Awaitable[Any]] | None) -> None:
        """Register (or, with ``None``, drop) a coroutine function to await at exit."""
        if callback is None:
            self._exit_callbacks.pop(key, None)
        else:
            self._exit_callbacks[key] = callback

    def close(self, timeout: float = EXIT_TIMEOUT_S) -> None:
        """Await the exit callbacks, then stop the loop and its thread. Idempotent."""
        if not self.running:
            return
        callbacks = list(self._exit_callbacks.values())
        self._exit_callbacks.clear()

        async def finish() -> None:
            results = await asyncio.gather(*(cb() for cb in callbacks), return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException):
                    logger.warning("closing an adapter's environment failed: %r", r)

        if callbacks and not self.in_loop_thread():
            try:
                self.run(finish(), timeout)
            except TimeoutError:
                logger.warning("closing the adapters' environments took over %s s", timeout)
        self.loop.call_soon_threadsafe(self.loop.stop)
        if not self.in_loop_thread():
            self._thread.join(timeout=5)
            if not self._thread.is_alive():
                self.loop.close()


_shared: BackgroundLoop | None = None
_shared_pid = -1
_shared_lock = threading.Lock()


def shared_loop() -> BackgroundLoop:
    """The process-wide :class:`BackgroundLoop` (started on first use)."""
    global _shared, _shared_pid
    with _shared_lock:
        if _shared is None or _shared_pid != os.getpid() or not _shared.running:
            _shared, _shared_pid = BackgroundLoop(), os.getpid()
        return _shared


@atexit.register
def _close_shared() -> None:
    if _shared is not None and _shared_pid == os.getpid():
        _shared.close()
