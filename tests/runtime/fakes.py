"""Fakes for the runtime's tests: an env with random latencies, a token agent, a learner.

Nothing here loads a model: the agent samples from a real
:class:`~sao_gym.inference.scripted.ScriptedBackend`, whose per-token
policy versions follow the weight updates the trainer pushes.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from typing import Any

from sao_gym.core import AgentEnv
from sao_gym.inference.scripted import ScriptedBackend
from sao_gym.types import Rollout, SamplingParams, Trajectory


class LatencyEnv(AgentEnv):
    """Episodes of 1-4 turns whose steps take a random number of loop iterations.

    ``fail_rate`` of episodes end in an infra failure (reset or a step raises).
    """

    def __init__(self, rng: random.Random, fail_rate: float = 0.1, max_yields: int = 6):
        super().__init__()
        self.rng, self.fail_rate, self.max_yields = rng, fail_rate, max_yields

    async def _wait(self) -> None:
        for _ in range(self.rng.randrange(self.max_yields)):
            await asyncio.sleep(0)

    async def on_reset(self, options):
        await self._wait()
        self.turns = self.rng.randint(1, 4)
        self.fails_at = self.rng.randrange(-1, self.turns) if self.rng.random() < \
            self.fail_rate else None
        if self.fails_at == -1:
            raise RuntimeError("reset failed")
        self.task = {"id": f"task-{self.np_random.integers(3)}"}
        return [{"role": "user", "content": "go"}], {}

    async def on_step(self, action):
        await self._wait()
        self.turns -= 1
        if self.fails_at is not None and self.turns <= self.fails_at:
            raise RuntimeError("sandbox died")
        done = self.turns <= 0
        return [{"role": "user", "content": "more"}], float(done), done, False, {}


class TokenAgent:
    """Samples 1-3 tokens per turn from ``backend``; keeps the token record."""

    def __init__(self, backend: ScriptedBackend):
        self.backend = backend

    def reset(self, observation, info) -> None:
        self.ids, self.mask, self.logprobs, self.versions = [1, 2], [0, 0], [0.0, 0.0], [-1, -1]

    async def act(self):
        gen = await self.backend.generate(self.ids, SamplingParams(max_new_tokens=3))
        self.ids += gen.token_ids
        self.mask += [1] * len(gen.token_ids)
        self.logprobs += gen.logprobs
        self.versions += gen.policy_versions
        return {"role": "assistant", "content": "x"}

    def observe(self, observation) -> None:
        self.ids += [3]
        self.mask += [0]
        self.logprobs += [0.0]
        self.versions += [-1]

    def trajectory(self) -> Trajectory:
        return Trajectory(list(self.ids), list(self.mask), list(self.logprobs),
                          list(self.versions), [])


def token_backend(rng: random.Random) -> ScriptedBackend:
    """A scripted backend that answers 1-3 tokens after a random number of yields."""

    async def handler(prompt, params):
        for _ in range(rng.randrange(4)):
            await asyncio.sleep(0)
        return [rng.randint(10, 20) for _ in range(rng.randint(1, 3))]

    return ScriptedBackend(handler)


class FakeLearner:
    """Counts steps; each adds 0 (a warm-up step) to ``max_versions_per_step`` versions."""

    def __init__(self, rng: random.Random, max_versions_per_step: int = 1):
        self.rng = rng
        self.max_versions_per_step = max_versions_per_step
        self.steps_done = 0
        self.policy_version = 0
        self.batches: list[list[Rollout]] = []
        self.trained_at: list[int] = []

    def update(self, rollouts: list[Rollout]) -> dict[str, float]:
        self.batches.append(list(rollouts))
        self.trained_at.append(self.policy_version)
        self.steps_done += 1
        self.policy_version += self.rng.choice([0, *[self.max_versions_per_step] * 3])
        return {"loss/policy": 0.0}

    def weights(self) -> Mapping[str, Any]:
        return {}


class ListSink:
    """Keeps every logged step."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, float]]] = []
        self.closed = False

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.rows.append((step, dict(metrics)))

    def close(self) -> None:
        self.closed = True


def failed_rollout(seed: int) -> Rollout:
    """An infra-failure rollout with no tokens."""
    from sao_gym.types import StopReason

    return Rollout([], [], [], [], 0.0, False, False, StopReason.ENV_ERROR, True, [], "", "",
                   seed)


def fake_trainer(total_steps: int, *, stop_at: int | None = None,
                 stop: Any = None) -> Any:
    """A :class:`~sao_gym.runtime.loop.trainer.Trainer` over these fakes (no checkpoints).

    ``stop(trainer)`` is called after learner step ``stop_at``, in the
    learner's thread (as a signal may come: ``os.kill(os.getpid(), SIGINT)``).
    """
    from sao_gym.rollout import run_episode
    from sao_gym.runtime.loop.source import RolloutSource
    from sao_gym.runtime.loop.trainer import Trainer

    backend = token_backend(random.Random(0))

    async def play(task_seed: int, sample_seed: int = 0) -> Rollout:
        env = LatencyEnv(random.Random(task_seed), fail_rate=0.0)
        try:
            return await run_episode(env, TokenAgent(backend), seed=task_seed)
        finally:
            await env.aclose()

    class Stopping(FakeLearner):
        def update(self, rollouts: list[Rollout]) -> dict[str, float]:
            metrics = super().update(rollouts)
            if self.steps_done == stop_at:
                stop(trainer)
            return metrics

    trainer = Trainer(source=RolloutSource(play, batch_size=2, concurrency=2, max_staleness=1),
                      learner=Stopping(random.Random(0)), backend=backend, sink=ListSink(),
                      checkpoints=None, total_steps=total_steps)
    return trainer
