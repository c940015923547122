"""Harness episodes in worker processes: the user's agent off the gateway's core.

A program harness (``agent.program``) runs, by default, on the event loop of
the process that serves the gateway and holds the inference backend. Its
Python then shares that process's one interpreter lock with the backend and
the gateway: the ``openai`` client alone spends milliseconds of CPU per call
building and parsing requests, and a harness that blocks its event loop (a
tool run synchronously inside ``async def``) stalls every episode.

:class:`HarnessWorkers` runs the episodes in ``processes`` worker processes
instead, each an event loop of its own with the harness's episodes on it
(:class:`~sao_gym.gateway.harness.LocalHarness`: one shared ``openai``
connection pool). Each worker talks to the gateway over
HTTP as any harness does; the process that opened the episode only sends
``(base_url, task)`` and gets the reward or the failure back. Same contract as
:meth:`Harness.run <sao_gym.gateway.harness.Harness.run>`:

- what the harness returns is the result; a harness that raises is
  :class:`~sao_gym.gateway.harness.HarnessFailed`;
- a cancelled run (its episode's time ran out) cancels the episode in its
  worker;
- a worker that dies fails its running episodes (``HarnessFailed``, with its
  exit status) and is started again for the next one; the others go on;
- a worker sees the same ``sys.path`` as the process that starts it, so a
  program importable there is importable in the worker; its standard output
  and error go to the run's standard error.

The protocol is JSON lines over the worker's standard input and a private
copy of its standard output: ``{"run": ID, "url": ..., "task": ...}`` and
``{"cancel": ID}`` in, ``{"done": ID, "reward": R}`` or ``{"done": ID,
"failure": "..."}`` out. A worker ends when its standard input closes (the
run ended, or the process that started it died).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from sao_gym.gateway.harness import Harness, HarnessFailed, LocalHarness

SYS_PATH = "SAO_GYM_WORKER_SYS_PATH"
"""The environment variable that hands a worker its starter's ``sys.path``."""

LINE_LIMIT = 1 << 30
"""The longest protocol line read (bytes): a task is any JSON a task file holds."""

_BOOT = ("import json, os, sys; sys.path[:] = json.loads(os.environ[{var!r}]); "
         "from sao_gym.gateway.workers import serve; serve(sys.argv[1], float(sys.argv[2]))")


class HarnessWorkers:
    """``processes`` worker processes running a program harness's episodes (module docs).

    Args:
        harness: a program harness (a command is a process of its own already).
        processes: how many workers; an episode goes to the one with the fewest
            episodes running.

    """

    def __init__(self, harness: Harness, processes: int):
        if harness.program is None:
            raise ValueError("harness workers run a program harness (agent.program); a "
                             "command harness runs as a process of its own already")
        if processes < 1:
            raise ValueError(f"harness workers need processes >= 1, got {processes}")
        self.harness = harness
        self._workers = [_Worker(harness) for _ in range(processes)]
        self._closed = False

    async def run(self, base_url: str, task: Mapping[str, Any]) -> float | None:
        """One episode in a worker; its reward (None: none), or :class:`HarnessFailed`."""
        if self._closed:
            raise HarnessFailed("the harness workers are closed")
        worker = min(self._workers, key=lambda w: w.load)
        return await worker.run(base_url, task)

    @property
    def pids(self) -> list[int | None]:
        """Each worker's process id (None: not running)."""
        return [w.pid for w in self._workers]

    async def aclose(self) -> None:
        """End the workers (their running episodes are cancelled)."""
        self._closed = True
        await asyncio.gather(*(w.aclose() for w in self._workers))


class _Worker:
    """One worker process, started on first use and again after it dies."""

    def __init__(self, harness: Harness):
        self.harness = harness
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._next = 0
        self._starting = asyncio.Lock()

    @property
    def load(self) -> int:
        return len(self._pending)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.returncode is None \
            else None

    async def _started(self) -> asyncio.subprocess.Process:
        async with self._starting:
            if self._reader is None or self._reader.done():  # none yet, or it exited
                env = {**os.environ, SYS_PATH: json.dumps(sys.path)}
                self._proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-c", _BOOT.format(var=SYS_PATH), self.harness.program or "",
                    repr(self.harness.timeout_s), stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE, env=env, limit=LINE_LIMIT,
                    start_new_session=True)  # a Ctrl-C of the run is the run's to handle
                self._reader = asyncio.ensure_future(self._read(self._proc, self._pending))
            return self._proc

    async def run(self, base_url: str, task: Mapping[str, Any]) -> float | None:
        self._next += 1
        key = self._next
        future = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            try:
                line = json.dumps({"run": key, "url": base_url, "task": dict(task)})
                proc = await self._started()
            except (TypeError, ValueError) as e:
                raise HarnessFailed(f"a harness worker takes JSON tasks: {e}") from e
            except OSError as e:
                raise HarnessFailed(f"the harness worker cannot start: {e}") from e
            try:
                assert proc.stdin is not None
                proc.stdin.write(line.encode() + b"\n")
                await proc.stdin.drain()
            except (ConnectionError, RuntimeError) as e:
                if not future.done():
                    raise HarnessFailed(f"the harness worker cannot take the episode: {e}"
                                        ) from e
            return await future
        except asyncio.CancelledError:
            self._cancel(key)
            raise
        finally:
            self._pending.pop(key, None)

    def _cancel(self, key: int) -> None:
        proc = self._proc
        if proc is None or proc.returncode is not None or proc.stdin is None:
            return
        try:
            proc.stdin.write(json.dumps({"cancel": key}).encode() + b"\n")
        except (ConnectionError, RuntimeError):
            pass  # the worker is gone: nothing runs there to cancel

    @staticmethod
    async def _read(proc: asyncio.subprocess.Process,
                    pending: dict[int, asyncio.Future]) -> None:
        assert proc.stdout is not None and proc.stdin is not None
        try:
            while line := await proc.stdout.readline():
                msg = json.loads(line)
                future = pending.get(msg.get("done"))
                if future is None or future.done():
                    continue  # cancelled meanwhile
                if "failure" in msg:
                    future.set_exception(HarnessFailed(msg["failure"]))
                else:
                    future.set_result(msg.get("reward"))
        except asyncio.CancelledError:  # the loop is going away unclosed: the worker ends
            proc.stdin.close()          # on the end of its input, its episodes cancelled
            raise
        code = await proc.wait()
        for future in pending.values():
            if not future.done():
                future.set_exception(HarnessFailed(
                    f"the harness worker process (pid {proc.pid}) exited with {code} "
                    "while the episode ran (the run's standard error says why)"))

    async def aclose(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.returncode is None:
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._reader is not None:
            await self._reader


# ----- the worker's side -----
def serve(program: str, timeout_s: float) -> None:
    """A worker's main: run ``program``'s episodes as the protocol asks (module docs)."""
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # what the harness prints goes to the run's standard error
    asyncio.run(_serve(Harness(program, timeout_s=timeout_s), out))


async def _serve(harness: Harness, out: Any) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    local = LocalHarness(harness)
    running: dict[int, asyncio.Task] = {}

    def answer(key: int, **result: Any) -> None:
        out.write(json.dumps({"done": key, **result}).encode() + b"\n")

    async def episode(key: int, url: str, task: dict[str, Any]) -> None:
        try:
            answer(key, reward=await local.run(url, task))
        except HarnessFailed as e:
            answer(key, failure=str(e))
        except asyncio.CancelledError:
            pass
        except Exception as e:  # the harness's import or set-up: its failure is data
            answer(key, failure=f"agent.program {harness.program}: {type(e).__name__}: {e}")
        finally:
            running.pop(key, None)

    try:
        while line := await reader.readline():
            msg = json.loads(line)
            if "run" in msg:
                running[msg["run"]] = asyncio.ensure_future(
                    episode(msg["run"], msg["url"], msg["task"]))
            elif msg.get("cancel") in running:
                running[msg["cancel"]].cancel()
    finally:
        for task in list(running.values()):
            task.cancel()
        await asyncio.gather(*running.values(), return_exceptions=True)
        await local.aclose()


__all__ = ["HarnessWorkers", "serve"]
