"""``learner.engine: fsdp`` in a local run: the learner as ``learner.ranks`` processes.

:func:`learner_on_ranks` starts ranks ``1 .. N-1`` as child processes
(``spawn``), joins them in a ``torch.distributed`` process group (gloo on the
CPU, NCCL on GPUs) as rank 0, and has every rank build the learner from the
same :class:`~sao_gym.runtime.parts.LearnerFactory`. It returns a
:class:`RankedLearner`: the trainer's learner, whose calls that run the
models (:data:`MIRRORED`: a step, the weights, checkpoints) are sent to
every other rank over a pipe first and then made here, so all ranks enter
the same collectives in the same order. Everything else (counters, the
algorithm record) is read from rank 0's learner: every rank's is the same.

A rank that dies ends the run: rank 0 checks its ranks before each call and
a collective with a dead peer fails; the error names the rank. When rank 0
goes away, the other ranks' pipes close and they exit.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MIRRORED = frozenset({"update", "weights", "state_dict", "load_state_dict", "save_state",
                      "load_state", "save_policy", "save_models", "pretrain_critic",
                      "logprobs_of"})
"""Learner methods that every rank runs together."""


class RankDied(RuntimeError):
    """A learner rank is gone; the run cannot go on (resume from the last checkpoint)."""


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


class RankedLearner:
    """Rank 0's learner; the calls in :data:`MIRRORED` run on every rank (module docs)."""

    def __init__(self, learner: Any, ranks: list[tuple[Any, Any]]):
        self._learner, self._ranks = learner, ranks  # (process, pipe) of ranks 1..N-1
        self._closed = False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._learner, name)
        if name not in MIRRORED:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.check()
            for _, conn in self._ranks:
                conn.send((name, args, kwargs))
            try:
                return attr(*args, **kwargs)
            except Exception as e:
                self.check()  # a dead rank is the cause: say so
                raise RankDied(f"learner {name} failed on rank 0 ({e}); the other ranks may "
                               "have failed too") from e
        return call

    def check(self) -> None:
        """Raise :class:`RankDied` naming the first rank that is no longer running."""
        for rank, (proc, _) in enumerate(self._ranks, start=1):
            if not proc.is_alive():
                raise RankDied(f"learner rank {rank} (pid {proc.pid}) died with exit code "
                               f"{proc.exitcode}; the run stops. `sao-gym train --resume "
                               "RUN_DIR` continues from the last checkpoint.")

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


def learner_on_ranks(factory: Any, policy_path: str, *, resume_from: str | Path | None = None,
                     threads: int | None = None, timeout_s: float = 120.0) -> RankedLearner:
    """The learner of ``factory`` on ``factory.config.ranks`` processes (module docs).

    ``threads``: torch threads of each other rank (default: the CPUs shared out).
    ``timeout_s``: longest wait in one collective before it fails.
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
                raise RankDied(f"learner rank {rank} (pid {proc.pid}) did not start")
    except BaseException:
        for proc, _ in ranks:
            proc.kill()
        raise
    logger.info("learner on %d ranks (pids %s)", world,
                [os.getpid(), *(p.pid for p, _ in ranks)])
    return RankedLearner(learner, ranks)


__all__ = ["MIRRORED", "RankDied", "RankedLearner", "free_port", "join_ranks",
           "learner_on_ranks"]
