"""The agent you already have: a program that calls a chat API, run for one episode.

A *harness* is the user's agent, unmodified, pointed at a gateway episode's
base URL (:mod:`sao_gym.gateway.app`). It is one of:

- a **function** ``MODULE:NAME``: ``async def run(client, task) -> float | None``
  gets an :class:`openai.AsyncOpenAI` client whose ``base_url`` names the
  episode; a plain ``def run(client, task)`` gets an :class:`openai.OpenAI`
  client and runs in a thread (a harness that is synchronous, as most
  agent frameworks' loops are);
- a **command** line, run with ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` set
  to the episode's, the task as JSON on its standard input. A last line of
  standard output that is a number is its reward.

What it returns is the episode's reward, unless the episode was given one by
``POST /episodes/ID/reward`` or the run names a verifier
(:func:`verifier`); :mod:`sao_gym.gateway.rollouts` decides. A harness that
raises, exits nonzero, answers with something that is not a number or runs
past its time is :class:`HarnessFailed`: the episode is an infrastructure
failure, never a reward of 0.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import signal
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

from sao_gym.utils.imports import import_reference

API_KEY = "sao-gym"
"""The API key harnesses are given (the gateway checks none)."""

OUTPUT_KEPT = 2000
"""Characters of a failed command's standard error kept in its error."""


class HarnessFailed(RuntimeError):
    """The harness crashed, timed out or returned something that is not a reward."""


def as_reward(value: Any, *, where: str) -> float | None:
    """``value`` as a reward: a finite number or None; else :class:`HarnessFailed`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise HarnessFailed(f"{where} returned {value!r}: a reward is a finite number or None")
    return float(value)


@dataclass(frozen=True)
class Harness:
    """One episode of the user's agent against a base URL (module docs).

    Exactly one of ``program`` and ``command`` is set.
    """

    program: str | None = None
    """``MODULE:NAME`` of ``[async] def run(client, task) -> float | None``."""
    command: tuple[str, ...] = ()
    """A command line (argv): the task on stdin, the episode's URL in ``OPENAI_BASE_URL``."""
    timeout_s: float = 600.0
    """Seconds one episode may take (then it is an infrastructure failure)."""

    def __post_init__(self) -> None:
        if (self.program is None) == (not self.command):
            raise ValueError("a harness is a program (MODULE:NAME) or a command, exactly one")
        if not self.timeout_s > 0:
            raise ValueError(f"a harness's timeout_s must be > 0, got {self.timeout_s}")

    @property
    def name(self) -> str:
        """The program, or the command line, in words."""
        return self.program or " ".join(self.command)

    def function(self) -> Callable[..., Any]:
        """The program's function (imported now)."""
        assert self.program is not None
        found = import_reference(self.program, what="agent.program")
        if not callable(found):
            raise TypeError(f"agent.program {self.program!r} is not callable")
        return found

    async def run(self, base_url: str, task: Mapping[str, Any], *,
                  threads: Executor | None = None,
                  clients: OpenAIClients | None = None) -> float | None:
        """Run one episode; its reward (None: it gave none), or :class:`HarnessFailed`.

        The time limit is the caller's (the episode runner's). ``threads`` runs a
        synchronous program (None: the event loop's default executor, a few
        threads); ``clients`` gives a program its client on shared connections
        (None: a client of its own, made and closed here).
        """
        if self.program is None:
            return await self._command(base_url, task)
        if clients is not None:
            return await self._call(base_url, task, threads, clients)
        own = OpenAIClients(self.timeout_s)
        try:
            return await self._call(base_url, task, threads, own)
        finally:
            await own.aclose()

    async def _call(self, base_url: str, task: Mapping[str, Any],
                    threads: Executor | None, clients: OpenAIClients) -> float | None:
        fn = self.function()
        where = f"agent.program {self.program}"
        sync = not inspect.iscoroutinefunction(fn)
        client = clients.client(base_url, sync=sync)
        try:
            if sync:
                value = await asyncio.get_running_loop().run_in_executor(
                    threads, fn, client, dict(task))
            else:
                value = await fn(client, dict(task))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            raise HarnessFailed(f"{where} raised {type(e).__name__}: {e}") from e
        return as_reward(value, where=where)

    async def _command(self, base_url: str, task: Mapping[str, Any]) -> float | None:
        env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": API_KEY}
        where = f"agent.command {' '.join(self.command)!r}"
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True)
        except OSError as e:
            raise HarnessFailed(f"{where} cannot start: {e}") from e
        try:
            out, err = await proc.communicate(json.dumps(dict(task)).encode())
        finally:
            if proc.returncode is None:  # cancelled (its time ran out): the whole group goes
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                await proc.wait()
        if proc.returncode != 0:
            tail = err.decode(errors="replace")[-OUTPUT_KEPT:].strip()
            raise HarnessFailed(f"{where} exited with {proc.returncode}: {tail}")
        lines = [line.strip() for line in out.decode(errors="replace").splitlines()
                 if line.strip()]
        if not lines:
            return None
        try:
            value = json.loads(lines[-1])
        except ValueError:
            return None
        return as_reward(value, where=where) if isinstance(value, (int, float)) else None


class OpenAIClients:
    """The episodes' ``openai`` clients, on one connection pool per kind (async, sync).

    A client made afresh builds an SSL context and opens its own connections
    (tens of milliseconds, and a DNS lookup in a thread, per episode); these
    are copies of one client (``with_options(base_url=...)``), each with its
    episode's base URL, sharing the pool. :meth:`aclose` closes the pools.
    """

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._roots: dict[bool, Any] = {}

    def client(self, base_url: str, *, sync: bool = False) -> Any:
        """An ``openai.AsyncOpenAI`` (``sync``: ``openai.OpenAI``, thread-safe) on ``base_url``."""
        import openai

        if sync not in self._roots:
            kind = openai.OpenAI if sync else openai.AsyncOpenAI
            self._roots[sync] = kind(base_url=base_url, api_key=API_KEY, max_retries=0,
                                     timeout=self.timeout_s)
        return self._roots[sync].with_options(base_url=base_url)

    async def aclose(self) -> None:
        """Close the shared connections."""
        for sync, root in self._roots.items():
            if sync:
                root.close()
            else:
                await root.close()
        self._roots = {}


class DaemonThreads(Executor):
    """An executor of a daemon thread per call.

    A synchronous harness that hangs (its episode timed out, the run ended)
    holds no pool's worker and cannot keep the process from exiting.
    """

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future:
        """Run ``fn(*args, **kwargs)`` on a new daemon thread; its future."""
        future: Future = Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as e:  # the caller's await raises it
                future.set_exception(e)

        threading.Thread(target=run, name="harness", daemon=True).start()
        return future


class LocalHarness:
    """A harness's episodes on this process's event loop.

    :meth:`run` is :meth:`Harness.run` with a synchronous program on daemon
    threads (:class:`DaemonThreads`) and every program's client on one
    connection pool (:class:`OpenAIClients`); the same interface as
    :class:`~sao_gym.gateway.workers.HarnessWorkers`, which runs them in worker
    processes (each worker one of these).
    """

    def __init__(self, harness: Harness):
        self.harness = harness
        self._threads = DaemonThreads()
        self._clients = OpenAIClients(harness.timeout_s)

    async def run(self, base_url: str, task: Mapping[str, Any]) -> float | None:
        """One episode; its reward (None: none), or :class:`HarnessFailed`."""
        return await self.harness.run(base_url, task, threads=self._threads,
                                      clients=self._clients)

    async def aclose(self) -> None:
        """Close the shared connections."""
        await self._clients.aclose()


def verifier(reference: str) -> Callable[..., Any]:
    """The verifier ``MODULE:NAME``: ``[async] def reward(task, transcript) -> float``.

    ``transcript``: the episode's conversation as the harness last sent it,
    the gateway's reply included (OpenAI messages).
    """
    found = import_reference(reference, what="agent.reward")
    if not callable(found):
        raise TypeError(f"agent.reward {reference!r} is not callable")
    return found


__all__ = ["API_KEY", "DaemonThreads", "Harness", "HarnessFailed", "LocalHarness", "OpenAIClients",
           "as_reward", "verifier"]
