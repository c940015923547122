"""A backend that replays given outputs: :class:`ScriptedBackend`, for tests.

Like httpx's ``MockTransport``, it takes either a script (a list of outputs
returned in order) or a handler called with each request. No model, no torch.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

from sao_gym.inference.base import BackendClosed
from sao_gym.types import Generation, SamplingParams

Output = Union[Generation, Sequence[int]]
"""What a script entry or a handler gives: a full Generation or just token ids."""

Handler = Callable[[list[int], SamplingParams], Union[Output, Awaitable[Output]]]
"""``(prompt_ids, params) -> Generation | list[int]``, sync or async."""


class ScriptExhausted(RuntimeError):
    """Raised by ``generate`` when a scripted backend has no outputs left."""


@dataclass(frozen=True)
class ScriptedCall:
    """One ``generate`` call received by a :class:`ScriptedBackend`."""

    prompt_ids: list[int]
    """The prompt, as a list."""
    params: SamplingParams
    """The sampling parameters."""


class ScriptedBackend:
    """Replay scripted outputs; record every call.

    ``outputs_or_handler`` is either a sequence of outputs (each a
    :class:`Generation` or a list of token ids) returned in order, or a
    handler ``(prompt_ids, params) -> Generation | list[int]`` that may be a
    plain function or a coroutine function. A list of token ids becomes a
    Generation with logprob ``logprob`` for every token, the current
    ``policy_version`` for every token, and ``finish_reason`` ``"stop"`` when
    its last token is one of ``params.stop_token_ids``, else ``"length"``;
    it is cut to ``params.max_new_tokens``. Generations are returned as given.
    """

    def __init__(
        self,
        outputs_or_handler: Sequence[Output] | Handler,
        *,
        logprob: float = 0.0,
        policy_version: int = 0,
    ) -> None:
        if callable(outputs_or_handler):
            self._handler: Handler | None = outputs_or_handler
            self._script: list[Output] = []
        else:
            self._handler = None
            self._script = list(outputs_or_handler)
        self._next = 0
        self.logprob = logprob
        self._version = policy_version
        self._closed = False
        self.calls: list[ScriptedCall] = []
        """Every generate call, in order."""
        self.weight_updates: list[int] = []
        """Versions passed to :meth:`update_weights`, in order."""

    @property
    def policy_version(self) -> int:
        """The last version passed to :meth:`update_weights` (initially ``policy_version``)."""
        return self._version

    @property
    def remaining(self) -> int:
        """Scripted outputs not yet returned (0 for a handler)."""
        return len(self._script) - self._next

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        """Return the next scripted output (or the handler's) for this call."""
        if self._closed:
            raise BackendClosed("ScriptedBackend is closed")
        prompt = list(prompt_ids)
        self.calls.append(ScriptedCall(prompt, params))
        if self._handler is not None:
            out = self._handler(prompt, params)
            if inspect.isawaitable(out):
                out = await out
        else:
            if self._next >= len(self._script):
                raise ScriptExhausted(
                    f"ScriptedBackend ran out of outputs after {len(self._script)} "
                    f"generate calls (call {len(self.calls)} has no scripted output)"
                )
            out = self._script[self._next]
            self._next += 1
        return self._to_generation(out, params)

    def _to_generation(self, out: Any, params: SamplingParams) -> Generation:
        if isinstance(out, Generation):
            return out
        if isinstance(out, (str, bytes)) or not isinstance(out, Sequence):
            raise TypeError(
                f"a scripted output must be a Generation or a list of token ids, got {out!r}"
            )
        tokens = [int(t) for t in out][: params.max_new_tokens]
        stopped = bool(tokens) and tokens[-1] in params.stop_token_ids
        return Generation(
            token_ids=tokens,
            logprobs=[float(self.logprob)] * len(tokens),
            finish_reason="stop" if stopped else "length",
            policy_versions=[self._version] * len(tokens),
        )

    async def update_weights(
        self, weights: Mapping[str, Any] | str | os.PathLike[str], version: int
    ) -> None:
        """Record ``version`` (the weights themselves are ignored)."""
        if self._closed:
            raise BackendClosed("ScriptedBackend is closed")
        self.weight_updates.append(int(version))
        self._version = int(version)

    async def aclose(self) -> None:
        """Mark closed; later calls raise :class:`BackendClosed`. Idempotent."""
        self._closed = True
