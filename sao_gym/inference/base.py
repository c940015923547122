"""The interface every inference backend implements.

A backend turns token ids into sampled token ids plus the sampler's own
logprobs (the denominator of SAO's importance ratio), and accepts new weights
while generations are in flight. Backends: :class:`~sao_gym.inference.hf.backend.HFBackend`
(in-process transformers), :class:`~sao_gym.inference.scripted.ScriptedBackend`
(replays given outputs, for tests).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from sao_gym.types import Generation, SamplingParams


@runtime_checkable
class InferenceBackend(Protocol):
    """Token-in, token-out sampling with per-token logprobs and versions."""

    @property
    def policy_version(self) -> int:
        """Version of the weights currently used for sampling."""
        ...

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        """Sample a continuation of ``prompt_ids``.

        Must not block the event loop. Concurrent calls may be batched.
        """
        ...

    async def update_weights(self, weights: Mapping[str, Any] | str, version: int) -> None:
        """Load new weights (a state dict or a checkpoint directory) as ``version``.

        Generations in flight continue with the new weights from their next
        token on; each token records the version that sampled it.
        """
        ...

    async def aclose(self) -> None:
        """Release the model and worker threads. Idempotent."""
        ...


def prompt_list(prompt_ids: Sequence[int], params: Any) -> list[int]:
    """``prompt_ids`` as a list of ints; ``ValueError`` if empty or not integers.

    Also checks that ``params`` is a :class:`SamplingParams` (``TypeError``).
    """
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
    try:
        prompt = [operator.index(t) for t in prompt_ids]
    except TypeError as e:
        raise ValueError(f"prompt_ids must be integers: {e}") from None
    if not prompt:
        raise ValueError("prompt_ids is empty")
    return prompt


class BackendClosed(RuntimeError):
    """Raised by ``generate`` on a backend that has been closed."""


class InferenceError(RuntimeError):
    """Inference cannot go on: servers down or misconfigured, an engine that did not start."""


class SamplesOn:
    """Episodes that sample from one backend (``self.backend``): what a trainer asks of them.

    The base of a process's rollouts (:class:`~sao_gym.runtime.parts.Rollouts`,
    :class:`~sao_gym.gateway.rollouts.HarnessRollouts`): new weights, token
    counters and the sampler check go to the backend; closing is theirs.
    """

    backend: Any

    def counters(self) -> dict[str, int]:
        """The backend's token counters so far (``HFBackend.counters``); {} without any."""
        counters = getattr(self.backend, "counters", None)
        return dict(counters()) if counters is not None else {}

    async def generate(self, prompt_ids: list[int], params: Any) -> Any:
        """One generation of the backend (the trainer's sampler check)."""
        return await self.backend.generate(prompt_ids, params)

    async def update_weights(self, weights: Any, version: int) -> None:
        """Serve policy ``version`` from now on."""
        await self.backend.update_weights(weights, version)

