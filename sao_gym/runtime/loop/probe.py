"""The sampler checked against the learner after every update: does it use the learner's weights.

An adapter that a backend silently fails to apply (an inference server
that keeps sampling the initial policy) leaves no trace in the rewards for
a long time. :class:`SamplerCheck` makes it loud: after each weight
publish, the backend samples a few tokens after a fixed prompt (the first
trained rollout's prompt, a fixed seed), and the learner scores the same
tokens; every token must carry the version just published and the two
logprobs must agree within ``tolerance`` (nats), or the run stops with
:class:`SamplerMismatch`. Runs with LoRA use it (``learner.lora``): the
check costs one short generation and one forward pass of a short sequence
per step.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from sao_gym.types import Rollout, SamplingParams

logger = logging.getLogger(__name__)

PROMPT_TOKENS = 128
"""Longest probe prompt (the end of the first rollout's prompt)."""


class SamplerMismatch(RuntimeError):
    """The sampler does not use the weights the learner trained; the run cannot go on."""


@dataclass
class SamplerCheck:
    """Compare the backend's logprobs with the learner's after each update (module docs).

    Args:
        tolerance: largest logprob difference (nats) that passes.
        temperature: the run's sampling temperature (the learner's too).
        tokens: tokens sampled per check.

    """

    tolerance: float
    temperature: float = 1.0
    tokens: int = 4
    prompt: list[int] | None = field(default=None)
    """The probe prompt (taken from the first batch it sees)."""

    def take_prompt(self, batch: list[Rollout]) -> None:
        """The prompt of the first rollout with action tokens, once."""
        if self.prompt is not None:
            return
        for r in batch:
            if r.num_action_tokens:
                start = list(r.loss_mask).index(1)
                self.prompt = list(r.token_ids[:start])[-PROMPT_TOKENS:]
                return

    async def check(self, backend: Any, learner: Any, version: int) -> float:
        """Sample, score, compare; the largest logprob difference (raises past ``tolerance``)."""
        if self.prompt is None:
            return float("nan")
        params = SamplingParams(max_new_tokens=self.tokens, temperature=self.temperature,
                                top_p=1.0, seed=0, stop_token_ids=())
        gen = await backend.generate(self.prompt, params)
        stale = sorted({v for v in gen.policy_versions if v != version})
        if stale:
            raise SamplerMismatch(f"the sampler answered the check with policy version(s) "
                                  f"{stale} after version {version} was published")
        ours = await asyncio.to_thread(learner.logprobs_of, self.prompt, gen.token_ids)
        gap = max((abs(a - b) for a, b in zip(gen.logprobs, ours, strict=True)), default=0.0)
        if not gap <= self.tolerance:
            raise SamplerMismatch(
                f"after update to policy version {version} the sampler's logprobs of "
                f"{len(gen.token_ids)} check tokens differ from the learner's by up to "
                f"{gap:.3g} nats (tolerance {self.tolerance:g}): the sampler is not using the "
                f"weights the learner trained (sampler {[round(x, 4) for x in gen.logprobs]}, "
                f"learner {[round(x, 4) for x in ours]})")
        return gap


__all__ = ["SamplerCheck", "SamplerMismatch"]
