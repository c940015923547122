"""The training loop: batches in, learner steps out, weights back in flight.

:class:`Trainer` receives its parts, built elsewhere
(:func:`sao_gym.runtime.config.build.build_trainer` from a config, or by hand in
tests): a :class:`~sao_gym.runtime.loop.source.RolloutSource`, a learner, an
inference backend, a metric sink and a checkpointer. It imports no model
code. Its loop: take the next batch the source allows (the source owns the
staleness rule), train on it off the event loop (a thread), push the new
weights to the backend while episodes keep generating, tell the source the
new policy version, log, checkpoint. The same loop runs ``mode: sync``:
the source with ``max_staleness=0`` is the synchronous baseline.

Shutdown order (also on SIGINT/SIGTERM): stop the source (cancelling its
episodes), let a running learner step finish, checkpoint, close the sink,
close the backend.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from sao_gym.runtime.loop.source import RolloutsFailing, RolloutSource
from sao_gym.types import Rollout
from sao_gym.utils.memory import release_free_memory, rss_mb

logger = logging.getLogger(__name__)


class TrainableLearner(Protocol):
    """What the trainer needs of a learner (:class:`~sao_gym.learner.learner.Learner`)."""

    steps_done: int
    """Learner steps completed."""
    policy_version: int
    """Policy optimizer steps that changed the weights: the run's clock."""

    trace: dict[int, dict[str, list[float]]]
    """Per-token quantities of the rollouts the last step traced (``update``'s ``trace``)."""

    def update(self, rollouts: list[Rollout], trace: list[int] = ...) -> dict[str, float]:
        """One learner step; returns its metrics. ``trace``: positions to keep quantities of."""
        ...

    def weights(self) -> Mapping[str, Any]:
        """The policy weights the inference backend loads."""
        ...


class Checkpointer(Protocol):
    """Saves a checkpoint (:class:`~sao_gym.runtime.loop.checkpoint.CheckpointManager`)."""

    def save(self, step: int, learner: Any, trainer_state: dict[str, Any]) -> Path:
        """Write one; return its path."""
        ...


class Sink(Protocol):
    """Where each step's metrics go (loggers, the console)."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record learner step ``step``."""
        ...

    def close(self) -> None:
        """Flush and release."""
        ...


def batch_metrics(batch: list[Rollout], version: int) -> dict[str, float]:
    """Rollout statistics and token staleness of a batch trained at policy ``version``."""
    stale = [version - v for r in batch
             for v, m in zip(r.policy_versions, r.loss_mask, strict=True) if m]
    n = len(batch)
    return {
        "rollout/return_mean": sum(r.reward for r in batch) / n,
        "rollout/success_rate": sum(r.reward >= 1.0 for r in batch) / n,
        "rollout/turns_mean": sum(r.metrics.get("turns", 0.0) for r in batch) / n,
        "rollout/action_tokens_mean": sum(r.num_action_tokens for r in batch) / n,
        "rollout/truncated_rate": sum(r.truncated for r in batch) / n,
        "async/staleness_mean": sum(stale) / max(len(stale), 1),
        "async/staleness_max": float(max(stale, default=0)),
        "async/versions_per_rollout_max": float(max(
            len({v for v, m in zip(r.policy_versions, r.loss_mask, strict=True) if m})
            for r in batch)),
    }


def backend_counters(backend: Any) -> dict[str, float]:
    """The backend's token counters so far as ``inference/*`` metrics.

    None for a backend without ``counters()``.
    ``HFBackend``: tokens prefilled, and tokens whose KV an episode's earlier turn
    left in the session cache; on Ray, summed over the rollout workers.
    """
    counters = getattr(backend, "counters", None)
    if counters is None:
        return {}
    return {f"inference/{k}": float(v) for k, v in sorted(counters().items())}


def without_empty_groups(batch: list[Rollout]) -> list[Rollout]:
    """``batch`` less the groups holding a rollout without action tokens (nothing to train).

    Such a rollout comes from a prompt that left no room to sample
    (``rollout.max_context_tokens``); its whole group goes, so grouped
    algorithms still see full groups.
    """
    def key(r: Rollout) -> object:
        return r.group_id if r.group_id is not None else id(r)

    empty = {key(r) for r in batch if not r.num_action_tokens}
    return [r for r in batch if key(r) not in empty]


class Trainer:
    """One training run from injected parts (see module docs).

    Args:
        source: episodes and the staleness rule.
        learner: trains on batches (:class:`TrainableLearner`).
        backend: the sampling side: ``update_weights``, ``counters``, ``aclose`` (and
            ``generate``, for ``sampler_check``): a process's rollouts
            (:class:`~sao_gym.runtime.parts.Rollouts`, which closing stops a harness's
            gateway too) or the Ray runtime's worker pool.
        sink: metric sink (``log``/``close``).
        checkpoints: saves checkpoints; ``None``: never.
        total_steps: the learner step the run ends at.
        checkpoint_every: learner steps between checkpoints (0: only at the end).
        publish_first: publish the learner's weights to the backend before the first
            episode (a LoRA learner's adapter, which the backend's model lacks).
        sampler_check: after each publish, check that the backend samples with the
            learner's weights (:class:`~sao_gym.runtime.loop.probe.SamplerCheck`).
        recorder: keeps a traced sample of each batch and the infra failures
            (:class:`~sao_gym.runtime.loop.recorder.RolloutRecorder`); None: nothing kept.
        curriculum: the run's :class:`~sao_gym.curriculum.Curriculum` (the source
            admits episodes at its level); each batch is counted towards it, and its
            state is kept in checkpoints. None: none.

    """

    def __init__(self, *, source: RolloutSource, learner: TrainableLearner, backend: Any,
                 sink: Sink, checkpoints: Checkpointer | None, total_steps: int,
                 checkpoint_every: int = 0, publish_first: bool = False,
                 sampler_check: Any = None, recorder: Any = None, curriculum: Any = None):
        self.source, self.learner, self.backend = source, learner, backend
        self.curriculum = curriculum
        self.recorder = recorder
        self.publish_first, self.sampler_check = publish_first, sampler_check
        self.sink, self.checkpoints = sink, checkpoints
        self.total_steps, self.checkpoint_every = total_steps, checkpoint_every
        self._checkpointed_step = learner.steps_done
        self._stop = asyncio.Event()
        self.nonfinite_steps = 0
        self._empty_batches = 0
        self.last_checkpoint: Path | None = None
        self.loop_seconds = 0.0
        """Wall time of the training loop (set when it ends; excludes set-up)."""
        self.interrupted = False
        """Whether a stop (SIGINT/SIGTERM, :meth:`request_stop`) ended the run before
        ``total_steps`` (set when it ends; ``learner.steps_done`` is the last step trained)."""

    def run(self) -> Path | None:
        """Train to ``total_steps`` (or until SIGINT/SIGTERM); return the last checkpoint."""
        return asyncio.run(self.arun())

    async def arun(self) -> Path | None:
        """Async :meth:`run`."""
        self._install_signal_handlers()
        self._t0 = time.monotonic()
        self._last = (self._t0, 0, 0)
        try:
            if self.publish_first:
                await self.backend.update_weights(self.learner.weights(),
                                                  self.learner.policy_version)
            self.source.start()
            while self.learner.steps_done < self.total_steps and not self._stop.is_set():
                batch = await self._until_stop(self.source.next_batch())
                if batch is None:
                    break
                await self._train(batch)
        finally:
            self.loop_seconds = time.monotonic() - self._t0
            self.interrupted = (self._stop.is_set()
                                and self.learner.steps_done < self.total_steps)
            try:
                await self.source.stop()
                if self.learner.steps_done > self._checkpointed_step:
                    await asyncio.to_thread(self._checkpoint)
            finally:  # a checkpoint that cannot be written still closes the rest
                self.sink.close()
                if self.recorder is not None:
                    self.recorder.close()
                await self.backend.aclose()
                if hasattr(self.learner, "close"):  # a learner with processes of its own
                    self.learner.close()
                self._remove_signal_handlers()
        return self.last_checkpoint

    async def _until_stop(self, coro: Any) -> Any:
        """``await coro``, or None once a stop is requested."""
        task = asyncio.ensure_future(coro)
        stopper = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return None

    async def _train(self, batch: list[Rollout]) -> None:
        stats = batch_metrics(batch, self.learner.policy_version)
        queued, in_flight = self.source.queued, self.source.in_flight
        trainable = without_empty_groups(batch)
        if not trainable:
            self._empty_batches += 1
            logger.warning("a batch of %d rollouts had no action tokens to train on: skipped",
                           len(batch))
            await self.source.step_done(self.learner.policy_version)
            if self._empty_batches >= 3:
                raise RolloutsFailing(
                    "3 batches in a row had no action tokens to train on: the prompts leave no "
                    "room to sample (raise rollout.max_context_tokens)")
            return
        self._empty_batches = 0
        traced = (self.recorder.pick(self.learner.steps_done + 1, trainable)
                  if self.recorder is not None else [])
        metrics = await asyncio.to_thread(self._update, trainable, traced)
        metrics["rollout/untrainable"] = float(len(batch) - len(trainable))
        version = self.learner.policy_version
        await self.backend.update_weights(self.learner.weights(), version)
        if self.sampler_check is not None:
            self.sampler_check.take_prompt(trainable)
            metrics["check/sampler_logprob_gap"] = await self.sampler_check.check(
                self.backend, self.learner, version)
        await self.source.step_done(version)
        step = self.learner.steps_done
        counters = self.source.counters
        metrics.update(stats)
        metrics.update(self._rates(time.monotonic()))
        metrics.update(backend_counters(self.backend))
        if self.curriculum is not None:
            c = self.curriculum
            moved = c.observe(trainable)
            if moved > 0:
                logger.info("step %d: the curriculum moves up to %s=%r (level %d of %d)", step,
                            c.knob, c.level, c.index + 1, len(c.levels))
            elif moved < 0:
                logger.warning("step %d: under %.0f%% of the last %d episodes succeeded; the "
                               "curriculum moves back down to %s=%r (level %d of %d)", step,
                               100 * c.demote_below, c.window, c.knob, c.level, c.index + 1,
                               len(c.levels))
            metrics.update(self.curriculum.metrics())
        metrics.update({
            "policy_version": float(version),
            "rollout/infra_failures": float(counters.infra_failures),
            "rollout/dropped_tasks": float(counters.dropped_groups),
            "async/queue_depth": float(queued),
            "async/in_flight": float(in_flight),
        })
        if any(not math.isfinite(v) for v in metrics.values() if isinstance(v, float)):
            self.nonfinite_steps += 1
            logger.warning("step %d has non-finite metrics", step)
        self.sink.log(step, metrics)
        if self.recorder is not None:
            await asyncio.to_thread(self.recorder.record, step, trainable,
                                    self.learner.trace if traced else {},
                                    self.source.take_failures())
        if self.checkpoint_every and step % self.checkpoint_every == 0:
            await asyncio.to_thread(self._checkpoint)

    def _update(self, batch: list[Rollout], traced: list[int]) -> dict[str, float]:
        metrics = self.learner.update(batch, trace=traced) if traced else self.learner.update(batch)
        release_free_memory()  # keeps the resident size flat over long runs
        metrics["perf/rss_mb"] = rss_mb()
        return metrics

    def _rates(self, now: float) -> dict[str, float]:
        t, delivered, tokens = self._last
        dt = max(now - t, 1e-9)
        c = self.source.counters
        self._last = (now, c.delivered, c.action_tokens)
        return {
            "time/elapsed_s": now - self._t0,
            "perf/trajectories_per_s": (c.delivered - delivered) / dt,
            "perf/tokens_per_s": (c.action_tokens - tokens) / dt,
        }

    def _checkpoint(self) -> None:
        if self.checkpoints is None:
            return
        step = self.learner.steps_done
        state: dict[str, Any] = dict(self.source.state_dict())
        if self.curriculum is not None:
            state["curriculum"] = self.curriculum.state_dict()
        self.last_checkpoint = self.checkpoints.save(step, self.learner, state)
        self._checkpointed_step = step

    # ----- signals -----
    def request_stop(self) -> None:
        """Finish the current step, checkpoint and return (what SIGINT/SIGTERM do)."""
        self._stop.set()

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        self._signals = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self.request_stop)
                self._signals.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass  # not the main thread, or no signal support

    def _remove_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in getattr(self, "_signals", []):
            loop.remove_signal_handler(sig)


def summary(metrics: Mapping[str, float]) -> str:
    """A one-line human summary of a step's metrics."""
    keys = ("rollout/success_rate", "rollout/return_mean", "sao/clip_ratio",
            "critic/explained_variance", "async/staleness_mean")
    return ", ".join(f"{k.split('/')[-1]} {metrics[k]:.3f}" for k in keys if k in metrics)
