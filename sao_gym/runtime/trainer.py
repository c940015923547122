"""The training loop: rollouts in, learner steps out, weights back in flight.

Async mode (SAO): episodes run concurrently on the event loop
(:class:`~sao_gym.runtime.rollouts.RolloutSource`); each finished rollout is
queued at once; the learner (off the loop, in a thread) updates as soon as
``batch_size`` rollouts are in, and the new weights go to the inference
backend right after, while generations continue, so one trajectory may hold
tokens of several policy versions. Staleness is bounded without discarding
work: admission control holds back new episodes, and the learner waits
before an update that would leave a running or waiting rollout more than
``max_staleness`` versions behind.

Sync mode (the baseline): generate a batch, wait for the slowest episode,
train, repeat — the same components.

Shutdown order: stop the rollout workers (cancelling their episodes), let a
running learner step finish, checkpoint, close the loggers, close the backend.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import sao_gym
from sao_gym.runtime.checkpoint import CheckpointManager
from sao_gym.runtime.config import TrainConfig, save_config
from sao_gym.runtime.rollouts import RolloutSource, oldest_start
from sao_gym.types import Rollout
from sao_gym.utils.memory import release_free_memory, rss_mb

logger = logging.getLogger(__name__)


def batch_metrics(batch: list[Rollout], learner_version: int) -> dict[str, float]:
    """Rollout statistics and token staleness of a training batch."""
    stale = [learner_version - v for r in batch
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


class Trainer:
    """One training run in ``run_dir`` (see module docs).

    ``policy_path`` is the starting checkpoint (the model after any warm
    start); on resume, the latest checkpoint's policy and learner state win.
    """

    def __init__(self, config: TrainConfig, run_dir: str | Path, policy_path: str, *,
                 resume: bool = False, display: Any = None):
        self.config = config
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.policy_path = policy_path
        self.resume = resume
        self.display = display
        self.checkpoints = CheckpointManager(self.run_dir, keep=config.keep_checkpoints)
        self.step = 0
        self._checkpointed_step = 0
        self._stop = asyncio.Event()
        self._nonfinite_steps = 0
        self.loop_seconds = 0.0
        """Wall time of the training loop (set when it ends; excludes set-up)."""

    # ----- set-up -----
    def _build(self) -> dict[str, Any]:
        from transformers import AutoTokenizer

        from sao_gym.inference.hf import HFBackend
        from sao_gym.learner.sao import build_learner
        from sao_gym.logging import make_loggers

        cfg = self.config
        sao_gym.make(cfg.env, **cfg.env_kwargs).close()  # fail fast on a bad env config
        state: dict[str, Any] = {"next_seed": cfg.seed}
        self.learner = build_learner(cfg.algorithm, self.policy_path, cfg.learner,
                                     total_steps=cfg.total_steps)
        serve_from = self.policy_path
        latest = self.checkpoints.latest() if self.resume else None
        if latest is not None:
            learner_state, state = CheckpointManager.load(latest)
            self.learner.load_state_dict(learner_state)
            self.step = self._checkpointed_step = int(state["step"])
            serve_from = str(latest / "policy")
            logger.info("resuming from %s (step %d)", latest, self.step)
        elif not self.resume:
            save_config(cfg, self.run_dir / "config.yaml")
        self.tokenizer = AutoTokenizer.from_pretrained(self.policy_path)
        self.backend = HFBackend(serve_from, max_batch_size=cfg.backend_max_batch_size,
                                 seed=cfg.seed + self.step,
                                 policy_version=self.learner.policy_version)
        self.loggers = make_loggers(cfg.loggers, self.run_dir, config=cfg.to_dict(),
                                    resume_step=self.step if self.resume else None)
        return state

    def _make_env(self):
        cfg = self.config
        return sao_gym.make(cfg.env, max_episode_steps=cfg.max_episode_steps, **cfg.env_kwargs)

    def _make_agent(self):
        from sao_gym.agents import LLMAgent

        cfg = self.config
        return LLMAgent(self.backend, self.tokenizer, max_new_tokens=cfg.max_new_tokens,
                        temperature=cfg.temperature, max_context_tokens=cfg.max_context_tokens)

    # ----- the run -----
    def run(self) -> Path | None:
        """Train to ``total_steps`` (or until SIGINT/SIGTERM); return the last checkpoint."""
        return asyncio.run(self.arun())

    async def arun(self) -> Path | None:
        """Async :meth:`run`."""
        state = await asyncio.to_thread(self._build)
        self._install_signal_handlers()
        source = RolloutSource(
            self._make_env, self._make_agent, concurrency=self.config.concurrency,
            batch_size=self.config.batch_size, group_size=self.config.group_size,
            seed=int(state["next_seed"]), learner_step=self.step,
            max_staleness=self.config.max_staleness if self.config.mode == "async" else None,
            max_infra_retries=self.config.max_infra_retries)
        self.source = source
        self._t0 = time.monotonic()
        self._last = (self._t0, 0, 0)
        last = None
        try:
            if self.config.mode == "async":
                source.start()
                await self._async_loop(source)
            else:
                await self._sync_loop(source)
        finally:
            self.loop_seconds = time.monotonic() - self._t0
            await source.stop()
            if self.step > self._checkpointed_step:
                await asyncio.to_thread(self._checkpoint, source)
            last = self.checkpoints.latest()
            self.loggers.close()
            await self.backend.aclose()
            self._remove_signal_handlers()
        return last

    async def _async_loop(self, source: RolloutSource) -> None:
        cfg = self.config
        need = cfg.batch_size // cfg.group_size  # groups per batch
        pool: list[list[Rollout]] = []  # finished groups not trained on yet
        while self.step < cfg.total_steps and not self._stop.is_set():
            while len(pool) < need or self._must_wait(source, pool, need):
                pool += await self._get(source.queue, timeout=None if len(pool) < need else 0.05)
                if self._stop.is_set():
                    return
            pool.sort(key=oldest_start)
            batch, pool = pool[:need], pool[need:]
            depth = sum(map(len, pool)) + cfg.group_size * source.queue.qsize()
            await self._train([r for g in batch for r in g], source, queue_depth=depth)

    def _must_wait(self, source: RolloutSource, pool: list[list[Rollout]], need: int) -> bool:
        """Whether training now would leave a rollout more than ``max_staleness`` behind.

        The batch takes the ``need`` oldest finished groups; everything else
        (later finished groups, running episodes, partly finished groups) is
        trained at the next step at the earliest.
        """
        left = sorted(map(oldest_start, pool))[need:]
        running = source.oldest_start_step()
        oldest = min([*left, *([running] if running is not None else [])], default=None)
        return oldest is not None and self.step + 1 - oldest > self.config.max_staleness

    async def _sync_loop(self, source: RolloutSource) -> None:
        cfg = self.config
        groups_per_batch = cfg.batch_size // cfg.group_size
        while self.step < cfg.total_steps and not self._stop.is_set():
            source.start(max_tasks=groups_per_batch)
            groups: list[list[Rollout]] = []
            while len(groups) < groups_per_batch and not self._stop.is_set():
                groups += await self._get(source.queue)
            await source.stop()
            if self._stop.is_set():
                return
            await self._train([r for g in groups for r in g], source, queue_depth=0)

    async def _get(self, queue: asyncio.Queue, timeout: float | None = None
                   ) -> list[list[Rollout]]:
        """The next finished group (as a one-element list), or none on stop/timeout."""
        getter = asyncio.ensure_future(queue.get())
        stopper = asyncio.ensure_future(self._stop.wait())
        done, _ = await asyncio.wait({getter, stopper}, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if getter in done:
            return [getter.result()]
        getter.cancel()
        return []

    async def _train(self, batch: list[Rollout], source: RolloutSource, *,
                     queue_depth: int) -> None:
        cfg = self.config
        version = self.learner.policy_version
        stats = batch_metrics(batch, version)
        metrics = await asyncio.to_thread(self._update, batch)
        await self.backend.update_weights(self.learner.policy.state_dict(),
                                          self.learner.policy_version)
        await source.set_learner_step(self.step + 1)
        self.step += 1
        now = time.monotonic()
        metrics.update(stats)
        metrics.update(self._rates(source, now))
        metrics.update({
            "policy_version": float(self.learner.policy_version),
            "rollout/infra_failures": float(source.counters.infra_failures),
            "rollout/dropped_tasks": float(source.counters.dropped_tasks),
            "async/queue_depth": float(queue_depth),
            "async/in_flight": float(source.in_flight),
        })
        if any(not math.isfinite(v) for v in metrics.values() if isinstance(v, float)):
            self._nonfinite_steps += 1
            logger.warning("step %d has non-finite metrics", self.step)
        self.loggers.log(self.step, metrics)
        if self.display is not None:
            self.display.update(self.step, metrics)
        if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
            await asyncio.to_thread(self._checkpoint, source)

    def _update(self, batch: list[Rollout]) -> dict[str, float]:
        metrics = self.learner.update(batch)
        release_free_memory()  # keeps the resident size flat over long runs
        metrics["perf/rss_mb"] = rss_mb()
        return metrics

    def _rates(self, source: RolloutSource, now: float) -> dict[str, float]:
        t, finished, tokens = self._last
        dt = max(now - t, 1e-9)
        c = source.counters
        self._last = (now, c.finished, c.action_tokens)
        return {
            "time/elapsed_s": now - self._t0,
            "perf/trajectories_per_s": (c.finished - finished) / dt,
            "perf/tokens_per_s": (c.action_tokens - tokens) / dt,
        }

    def _checkpoint(self, source: RolloutSource) -> Path:
        path = self.checkpoints.save(self.step, self.learner, source.state_dict())
        self._checkpointed_step = self.step
        return path

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
