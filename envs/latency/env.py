"""``sao_gym/HeavyTail-v0``: heavy-tailed episode lengths and step latencies.

A stand-in for agentic workloads (tool calls that sometimes take long,
episodes that sometimes run many turns) for throughput benchmarks: every
action is answered after a lognormal delay, and the episode ends after a
lognormal number of turns, both drawn from the seeded ``np_random``. The
reward is 1 when the last action's text has an even length (something a
policy can pick up, so the learner has signal), else 0.

``sao-gym bench async-vs-sync`` runs it in both training modes.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from sao_gym.core import AgentEnv, StepResult
from sao_gym.types import Message


class HeavyTailEnv(AgentEnv):
    """Echo-style turns with lognormal latencies and lengths (see module docs).

    Args:
        latency_median_s: median delay before each observation.
        latency_sigma: lognormal sigma of the delay (0: constant).
        turns_median: median number of turns.
        turns_sigma: lognormal sigma of the number of turns.
        max_turns: cap on the number of turns.
        max_latency_s: cap on one delay.

    """

    def __init__(self, *, latency_median_s: float = 0.5, latency_sigma: float = 1.0,
                 turns_median: float = 3.0, turns_sigma: float = 0.8, max_turns: int = 16,
                 max_latency_s: float = 10.0):
        super().__init__()
        if latency_median_s < 0 or latency_sigma < 0 or turns_median < 1 or turns_sigma < 0:
            raise ValueError("latencies must be >= 0, turns_median >= 1, sigmas >= 0")
        self.latency_median_s, self.latency_sigma = latency_median_s, latency_sigma
        self.turns_median, self.turns_sigma = turns_median, turns_sigma
        self.max_turns, self.max_latency_s = max_turns, max_latency_s
        self._turns_left = 0

    async def on_reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        """Draw this episode's length."""
        rng = self.np_random
        turns = math.exp(math.log(self.turns_median) + self.turns_sigma * rng.standard_normal())
        self._turns_left = int(min(max(round(turns), 1), self.max_turns))
        self.task = {"id": f"heavytail-{self._turns_left}", "prompt": "Say anything.",
                     "turns": self._turns_left}
        return [{"role": "user", "content": "Say anything."}], {}

    async def on_step(self, action: Message) -> StepResult:
        """Answer after a lognormal delay; end after the drawn number of turns."""
        delay = self.latency_median_s * math.exp(self.latency_sigma *
                                                 self.np_random.standard_normal())
        await asyncio.sleep(min(delay, self.max_latency_s))
        self._turns_left -= 1
        done = self._turns_left <= 0
        text = action.get("content") or ""
        reward = float(done and len(text) % 2 == 0)
        return [{"role": "user", "content": "ok" if not done else "done"}], reward, done, \
            False, {}
