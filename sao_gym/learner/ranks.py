"""A learner of several ranks: one driver protocol, one "a rank died" error.

A learner with ``learner.ranks > 1`` trains as a group of processes that
enter the same collectives in the same order. The trainer holds one object
standing for the whole group, which sends every call that runs the models
(:data:`MIRRORED`: a step, the weights, checkpoints) to every rank through a
:class:`RankDriver` and reads everything else (counters, the algorithm
record) from rank 0, whose answers are the group's. Two drivers, chosen the
same way (by the rank count) and failing the same way (:class:`RankDied`,
naming the rank, after ending the others):

- :class:`ProcessRanks` (``runtime: local``): ranks ``1 .. N-1`` are child
  processes (``spawn``) fed over pipes, rank 0 is this process
  (:func:`learner_on_ranks` starts them; :class:`RankedLearner` is the
  trainer's learner);
- ``ActorRanks`` (``runtime: ray``, :mod:`sao_gym.runtime.place.ray.learner`):
  every rank is a Ray actor.

The job rebuilds a run whose rank died from its last checkpoint, whichever
driver said so (:func:`sao_gym.runtime.job.train`). A rank of
:class:`ProcessRanks` whose rank 0 goes away sees its pipe close and exits.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

logger = logging.getLogger(__name__)

MIRRORED = frozenset({"update", "weights", "state_dict", "load_state_dict", "save_state",
                      "load_state", "save_policy", "save_models", "pretrain_critic",
                      "logprobs_of"})
"""Learner methods that every rank runs together."""


class RankDied(RuntimeError):
    """A learner rank is gone; the message names it and how to resume."""


def rank_died(rank: int, pid: int | None, how: str, run_dir: str | Path | None = None
              ) -> RankDied:
    """The :class:`RankDied` of ``rank`` (process ``pid``), ``how`` it went, in one wording."""
    where = str(run_dir) if run_dir is not None else "RUN_DIR"
    return RankDied(f"learner rank {rank} (pid {pid}) died: {how}; `sao-gym train --resume "
                    f"{where}` continues from the last checkpoint")


class RankDriver(Protocol):
    """Runs a learner's calls on every rank of its group (module docs)."""

    pids: list[int]
    """Each rank's process id, rank 0 first."""

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method`` on every rank, together; rank 0's answer.

        :class:`RankDied` if a rank is gone (the others are ended first).
        """

    def close(self) -> None:
        """End every rank. Idempotent."""


def free_port() -> int:
    """A TCP port free on this machine now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join_ranks(rank: int, world: int, address: str, device: str, timeout_s: float,
               local_rank: int | None = None) -> None:
    """Join the learner's process group as ``rank`` of ``world`` (rank 0 listens at ``address``).

    gloo on the CPU, NCCL for ``device: cuda`` (this rank's GPU: ``local_rank``,
    default ``rank``); a collective waits at most ``timeout_s``.
    """
    import torch.distributed as dist

    if device == "cuda":  # which GPU is this rank's (rank_device); the CPU needs none
        os.environ["LOCAL_RANK"] = str(rank if local_rank is None else local_rank)
    dist.init_process_group("nccl" if device == "cuda" else "gloo",
                            init_method=f"tcp://{address}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeout_s))


def _rank_main(rank: int, world: int, port: int, factory: Any, policy_path: str,
               resume_from: str | None, conn: Any, threads: int, timeout_s: float) -> None:
    """A rank other than 0: build the learner, then make the calls rank 0 sends."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    join_ranks(rank, world, f"127.0.0.1:{port}", factory.config.device, timeout_s)
    try:
        learner = factory(policy_path, resume_from=resume_from)
        conn.send(("ready", rank))
        while True:
            try:
                call = conn.recv()
            except EOFError:  # rank 0 is gone
                return
            if call is None:
                return
            name, args, kwargs = call
            getattr(learner, name)(*args, **kwargs)
    finally:
        dist.destroy_process_group()


class ProcessRanks:
    """The :class:`RankDriver` of a local group: rank 0 here, the others child processes.

    Args:
        learner: rank 0's learner (this process's).
        ranks: ``(process, pipe)`` of ranks ``1 .. N-1``.
        run_dir: named in :class:`RankDied`'s message.

    """

    def __init__(self, learner: Any, ranks: list[tuple[Any, Any]],
                 run_dir: str | Path | None = None):
        self.learner, self._ranks, self.run_dir = learner, ranks, run_dir
        self.pids: list[int] = [os.getpid(), *(proc.pid for proc, _ in ranks)]
        self._closed = False

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Send the call to every other rank, then make it here; rank 0's answer."""
        self.check()
        for _, conn in self._ranks:
            conn.send((method, args, kwargs))
        try:
            return getattr(self.learner, method)(*args, **kwargs)
        except Exception as e:
            self.check()  # a dead rank is the cause: say so
            raise RankDied(f"learner {method} failed on rank 0 ({e}); the other ranks may "
                           "have failed too") from e

    def check(self) -> None:
        """Raise :class:`RankDied` naming the first rank that is no longer running."""
        for rank, (proc, _) in enumerate(self._ranks, start=1):
            if not proc.is_alive():
                self.close()
                raise rank_died(rank, proc.pid, f"exit code {proc.exitcode}", self.run_dir)

    def close(self) -> None:
        """Stop the other ranks and leave the process group. Idempotent."""
        import torch.distributed as dist

        if self._closed:
            return
        self._closed = True
        for proc, conn in self._ranks:
            try:
                conn.send(None)
            except OSError:
                pass
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()
        if dist.is_initialized():
            dist.destroy_process_group()


class RankedLearner:
    """The trainer's learner over a :class:`ProcessRanks` (module docs).

    :data:`MIRRORED` calls go to every rank; everything else is rank 0's learner's.
    """

    def __init__(self, driver: ProcessRanks):
        self.driver = driver

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.driver.learner, name)
        if name not in MIRRORED:
            return attr
        return lambda *args, **kwargs: self.driver.call(name, *args, **kwargs)

    def close(self) -> None:
        """End the group (:meth:`ProcessRanks.close`)."""
        self.driver.close()


def learner_on_ranks(factory: Any, policy_path: str, *, resume_from: str | Path | None = None,
                     threads: int | None = None, timeout_s: float = 120.0,
                     run_dir: str | Path | None = None) -> RankedLearner:
    """The learner of ``factory`` on ``factory.config.ranks`` local processes (module docs).

    ``threads``: torch threads of each other rank (default: the CPUs shared out).
    ``timeout_s``: longest wait in one collective before it fails. ``run_dir``:
    named in :class:`RankDied`'s message.
    """
    import multiprocessing

    world = factory.config.ranks
    threads = threads or max(1, (os.cpu_count() or 1) // world)
    port = free_port()
    ctx = multiprocessing.get_context("spawn")
    ranks = []
    resume = str(resume_from) if resume_from is not None else None
    for rank in range(1, world):
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=_rank_main, name=f"learner-rank{rank}", daemon=True,
                           args=(rank, world, port, factory, policy_path, resume, theirs,
                                 threads, timeout_s))
        proc.start()
        theirs.close()
        ranks.append((proc, mine))
    try:
        join_ranks(0, world, f"127.0.0.1:{port}", factory.config.device, timeout_s)
        learner = factory(policy_path, resume_from=resume_from)
        for rank, (proc, conn) in enumerate(ranks, start=1):
            if not conn.poll(timeout_s) or conn.recv() != ("ready", rank):
                raise rank_died(rank, proc.pid, "it did not start", run_dir)
    except BaseException:
        for proc, _ in ranks:
            proc.kill()
        raise
    logger.info("learner on %d ranks (pids %s)", world,
                [os.getpid(), *(p.pid for p, _ in ranks)])
    return RankedLearner(ProcessRanks(learner, ranks, run_dir))


__all__ = ["MIRRORED", "ProcessRanks", "RankDied", "RankDriver", "RankedLearner", "free_port",
           "join_ranks", "learner_on_ranks", "rank_died"]
