"""One episode's chat calls, stitched into exact token segments.

A harness calls the model again and again, each time sending the whole
conversation: the previous messages, the reply it got, and what its tools
answered. :class:`ChatEpisode` keeps the episode's token sequence the way
:class:`~sao_gym.agents.LLMAgent` keeps an env episode's (it runs one per
segment):

- a call whose messages start with the previous call's messages followed by
  the reply the gateway gave (compared as messages: role, text, tool names
  and arguments, tool-call ids of tool messages) **continues** the segment:
  only the new messages are tokenized, as the chat template's delta after the
  sampled turn (``loss_mask`` 0), and the reply's tokens are the ones the
  sampler produced, with its logprobs and policy versions. The text the
  harness sends back is never re-tokenized, so a reply whose text tokenizes
  differently from the way it was sampled still trains on what was sampled;
- any other call (the harness truncated, summarised or edited its history,
  changed the tools, or inserted an assistant turn of its own) starts a new
  **segment**: its whole conversation is the new segment's prompt. The
  segments of an episode share its reward.

Calls of one episode run one at a time, in order.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from sao_gym.gateway.request import ChatRequest, GatewayError
from sao_gym.types import Generation, Message, Trajectory
from sao_gym.utils.seeds import mixed_seed


@dataclass(frozen=True)
class Completion:
    """One call's answer."""

    message: Message
    """The reply as the harness gets it (``content`` and any ``tool_calls``)."""
    generation: Generation
    """What the sampler produced, every token (the stop token included)."""
    prompt_ids: list[int]
    """The tokens the model was given: the segment so far."""
    finish_reason: str
    """OpenAI's: ``stop``, ``tool_calls`` or ``length``."""
    segment: int
    """Which segment of the episode the call extended or began (0-based)."""


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _key(message: Message) -> tuple[Any, ...]:
    """What must agree for two messages to be the same turn of a conversation."""
    calls = tuple((c["function"]["name"], json.dumps(_arguments(c["function"].get("arguments")),
                                                     sort_keys=True))
                  for c in message.get("tool_calls") or [])
    return (message.get("role"), message.get("content") or "", calls,
            message.get("tool_call_id") if message.get("role") == "tool" else None)


class ChatEpisode:
    """The calls of one episode (module docs).

    Args:
        backend: samples the replies (any inference backend).
        tokenizer: the served model's tokenizer, with its chat template.
        max_context_tokens: the segment's token budget (the served context).
        episode_id: named in errors.
        max_new_tokens: the most tokens one call samples, whatever it asks (None: the
            context's room).
        sampling: ``(temperature, top_p)`` every call samples with, whatever it asks
            (a training run's: the learner scores tokens at the run's temperature);
            None: each call's own.
        seed: the episode's sampling seed: a call without a ``seed`` of its own
            samples with one drawn from it (segment and turn mixed in); None: the
            backend's shared stream.

    """

    def __init__(self, backend: Any, tokenizer: Any, *, max_context_tokens: int,
                 episode_id: str = "", max_new_tokens: int | None = None,
                 sampling: tuple[float, float] | None = None, seed: int | None = None):
        self.backend, self.tokenizer = backend, tokenizer
        self.max_context_tokens, self.episode_id = max_context_tokens, episode_id
        self.max_new_tokens, self.sampling, self.seed = max_new_tokens, sampling, seed
        self._finished: list[Trajectory] = []
        self._agent: Any = None
        self._history: list[Message] = []
        self._tools: list[dict[str, Any]] = []
        self._segment_seed: int | None = None
        self._lock = asyncio.Lock()
        self.calls = 0
        """Calls answered so far."""
        self.overridden = 0
        """Calls that asked for a temperature or top_p other than ``sampling``'s."""
        self.reward: float | None = None
        """The reward posted for the episode (``POST /episodes/ID/reward``), if any."""
        self.exhausted = False
        """A call did not fit the context (answered ``context_length_exceeded``)."""

    def _continuation(self, request: ChatRequest) -> list[Message] | None:
        """The new messages of a call that continues the segment, else None."""
        n = len(self._history)
        if (self._agent is None or request.tools != self._tools
                or len(request.messages) <= n
                or not all(m == h or _key(m) == _key(h)
                           for m, h in zip(request.messages[:n], self._history, strict=True))):
            return None
        new = request.messages[n:]
        return None if any(m["role"] == "assistant" for m in new) else new

    def _segment(self, request: ChatRequest) -> Any:
        """A new segment whose prompt is the call's whole conversation."""
        from sao_gym.agents import LLMAgent

        if self._agent is not None:
            self._finished.append(self._agent.trajectory())
        self._segment_seed = (None if self.seed is None
                              else mixed_seed(self.seed, len(self._finished)))
        agent = LLMAgent(self.backend, self.tokenizer, max_new_tokens=1,
                         max_context_tokens=self.max_context_tokens)
        agent.reset(request.messages, {"tools": request.tools})
        self._agent, self._tools = agent, request.tools
        return agent

    async def complete(self, request: ChatRequest) -> Completion:
        """Answer one call, extending the episode's record (module docs)."""
        from sao_gym.core import ContextExhausted

        async with self._lock:
            new = self._continuation(request)
            if new is None:
                agent = self._segment(request)
            else:
                agent = self._agent
                agent.observe(new)
            limits = [n for n in (request.max_tokens, self.max_new_tokens) if n]
            agent.max_new_tokens = min(limits) if limits else self.max_context_tokens
            asked = (request.temperature, request.top_p)
            if self.sampling is not None and asked != self.sampling:
                self.overridden += 1
            agent.temperature, agent.top_p = self.sampling or asked
            agent.seed = request.seed if request.seed is not None else self._segment_seed
            agent.stop = request.stop
            try:
                reply = await agent.act()
            except ContextExhausted as e:
                self.exhausted = True
                raise GatewayError(f"this call does not fit the context of "
                                   f"{self.max_context_tokens} tokens ({e})",
                                   code="context_length_exceeded", param="messages") from None
            gen = agent.last_generation
            if request.tool_choice == "none" and reply.get("tool_calls"):
                reply = {"role": "assistant", "content": agent.last_text}
            self._history = [*request.messages, reply]
            self.calls += 1
            finish = ("length" if gen.finish_reason == "length"
                      else "tool_calls" if reply.get("tool_calls") else "stop")
            return Completion(reply, gen, agent.last_prompt_ids, finish, len(self._finished))

    def trajectory(self) -> Trajectory:
        """The current segment's record (an oracle behind the episode reads its messages)."""
        return self._agent.trajectory() if self._agent is not None else Trajectory()

    def as_template_writes(self, text: str) -> str:
        """``text`` with its tool calls written as the chat template writes them."""
        return self._agent.as_template_writes(text)

    def transcript(self) -> list[Message]:
        """The conversation as the harness last sent it, the last reply included."""
        return [dict(m) for m in self._history]  # type: ignore[misc]

    def segments(self) -> list[Trajectory]:
        """The episode's token-exact record so far, one trajectory per segment."""
        current = [self._agent.trajectory()] if self._agent is not None else []
        return [*self._finished, *current]


__all__ = ["ChatEpisode", "Completion"]
