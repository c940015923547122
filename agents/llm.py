"""``LLMAgent``: a token-in/token-out multi-turn agent.

The agent owns tokenization. It keeps one running token sequence per
episode:

1. the chat-template rendering of the reset observation (the prompt);
2. each turn's sampled tokens, appended *exactly as sampled* (``loss_mask`` 1,
   with the sampler's logprob and policy version of every token);
3. each observation as a *delta*: the text the chat template would add after
   the assistant turn, tokenized on its own (``loss_mask`` 0).

History is never re-tokenized, so the learner scores exactly the tokens the
sampler produced. The delta is found by rendering a fixed two-message
conversation with and without the new messages; this needs a chat template
whose rendering of a conversation is a prefix of the rendering of any
continuation of it (ChatML templates are), and is checked.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Sequence
from typing import Any

from sao_gym.agents.tool_parser import parse_tool_calls
from sao_gym.core import ContextExhausted
from sao_gym.inference.base import InferenceBackend
from sao_gym.types import Generation, Message, SamplingParams, Trajectory

_DUMMY = "\u2063sao_gym_delta_anchor\u2063"
_DUMMY_TURN: list[Message] = [
    {"role": "user", "content": "-"},
    {"role": "assistant", "content": _DUMMY},
]


class LLMAgent:
    """Drive an :class:`~sao_gym.inference.base.InferenceBackend` through an episode.

    Args:
        backend: samples tokens with logprobs.
        tokenizer: a Hugging Face tokenizer with a chat template.
        max_new_tokens: per-turn sampling budget.
        temperature: sampling temperature (the learner scores tokens under the
            same tempered distribution; pass the same value to it).
        top_p: nucleus mass.
        max_context_tokens: the episode's whole token budget; when no room is
            left for a turn, :meth:`act` raises
            :class:`~sao_gym.core.ContextExhausted` (the episode is truncated).
        seed: base seed for per-turn sampling seeds (``None``: backend's stream).
        tool_schemas: how the prompt shows the env's tools: ``"env"`` (its
            schemas as declared, in its order) or ``"signature"`` (as a library
            that learns tools from a class's methods renders them:
            :func:`~sao_gym.adapters.callables.signature_schema` of each, in
            name order, the prompt TRL's GRPOTrainer builds for the env through
            :mod:`sao_gym.adapters.trl`). Tool calls are parsed and validated
            against the env's schemas either way.

    """

    def __init__(
        self,
        backend: InferenceBackend,
        tokenizer: Any,
        *,
        max_new_tokens: int = 256,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_context_tokens: int | None = None,
        seed: int | None = None,
        tool_schemas: str = "env",
    ):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("LLMAgent needs a tokenizer with a chat template")
        if tool_schemas not in TOOL_SCHEMAS:
            raise ValueError(f"tool_schemas must be one of {TOOL_SCHEMAS}, got {tool_schemas!r}")
        self.tool_schemas = tool_schemas
        self.backend = backend
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.max_context_tokens = max_context_tokens
        self.seed = seed
        self.stop: tuple[str, ...] = ()
        """Stop strings: a turn ends where its text first contains one (OpenAI's ``stop``)."""
        self.stop_token_ids = _stop_token_ids(tokenizer)
        self._stop_texts = {i: tokenizer.decode([i]) for i in self.stop_token_ids}
        SamplingParams(max_new_tokens, temperature, top_p)  # validate early
        self._tools: list[dict[str, Any]] = []
        self._shown_tools: list[dict[str, Any]] = []
        self._reset_record()

    def _reset_record(self) -> None:
        self._ids: list[int] = []
        self._mask: list[int] = []
        self._logprobs: list[float] = []
        self._versions: list[int] = []
        self._messages: list[Message] = []
        self._pending: list[Message] = []
        self._last_stop_text: str | None = None
        self._turn = 0
        self._session = uuid.uuid4().hex
        self.last_generation: Generation | None = None
        """The last turn's generation, exactly as the backend returned it."""
        self.last_prompt_ids: list[int] = []
        """The tokens of the episode before the last turn's generation: its prompt."""
        self.last_text = ""
        """The last turn's text as parsed (its end-of-turn or stop string left out)."""

    # ----- Agent protocol -----
    def reset(self, observation: list[Message], info: dict[str, Any]) -> None:
        """Render the prompt of a new episode."""
        self._reset_record()
        self._tools = copy.deepcopy(info.get("tools") or [])
        self._shown_tools = self._tools
        if self.tool_schemas == "signature":
            from sao_gym.adapters.callables import signature_schema

            shown = [signature_schema(t) for t in self._tools]
            self._shown_tools = sorted(shown, key=lambda t: t["function"]["name"])
        self._messages = copy.deepcopy(observation)
        prompt = self._render(observation, add_generation_prompt=True)
        self._append_observation(self._encode(prompt))

    async def act(self) -> Message:
        """Sample the next assistant turn and parse its tool calls."""
        delta = self._encode(self._observation_delta(self._pending)) if self._pending else []
        budget = self.max_new_tokens
        if self.max_context_tokens is not None:
            budget = min(budget, self.max_context_tokens - len(self._ids) - len(delta))
            if budget < 1:
                raise ContextExhausted(
                    f"{len(self._ids)} tokens used and {len(delta)} to observe, "
                    f"of max_context_tokens={self.max_context_tokens}"
                )
        self._append_observation(delta)
        self._pending = []
        seed = None if self.seed is None else self.seed * 100_003 + self._turn
        params = SamplingParams(budget, self.temperature, self.top_p, self.stop_token_ids, seed,
                                session_id=self._session)
        prompt = list(self._ids)
        gen = await self.backend.generate(prompt, params)
        gen, cut_text = self._stopped(gen)
        self.last_generation = gen
        self.last_prompt_ids = prompt
        self._ids += gen.token_ids
        self._mask += [1] * len(gen.token_ids)
        self._logprobs += gen.logprobs
        self._versions += gen.policy_versions
        self._turn += 1
        ids = gen.token_ids
        self._last_stop_text = None
        if gen.finish_reason == "stop" and ids and ids[-1] in self._stop_texts:
            self._last_stop_text = self._stop_texts[ids[-1]]
            ids = ids[:-1]
        text = self.tokenizer.decode(ids, skip_special_tokens=False) if cut_text is None \
            else cut_text
        self.last_text = text
        message = self._parse(text, id_prefix=f"call_{self._turn}_")
        self._messages.append(message)
        return copy.deepcopy(message)

    def _stopped(self, gen: Generation) -> tuple[Generation, str | None]:
        """``gen`` cut at the first of :attr:`stop` it contains, and the text before it.

        The turn keeps the sampled tokens up to the one that completes the stop
        string (a prefix of what was sampled, so its logprobs stay exact); its
        text ends before the stop string, as OpenAI's ``stop`` does. No stop
        string in it: ``(gen, None)``.
        """
        if not self.stop or not gen.token_ids:
            return gen, None
        ids = gen.token_ids
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        found = [(text.find(s), s) for s in self.stop if s and s in text]
        if not found:
            return gen, None
        at, stop = min(found)
        k = next(k for k in range(1, len(ids) + 1)
                 if len(self.tokenizer.decode(ids[:k], skip_special_tokens=False))
                 >= at + len(stop))
        cut = Generation(ids[:k], gen.logprobs[:k], "stop_string", gen.policy_versions[:k])
        return cut, text[:at]

    def _parse(self, text: str, *, id_prefix: str) -> Message:
        content, calls = parse_tool_calls(text, self._tools, id_prefix=id_prefix)
        message: Message = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        return message

    def as_template_writes(self, text: str) -> str:
        """``text`` (an assistant turn) as the chat template writes the message it parses into.

        The turn's tool calls (in any format the parser reads, such as
        ``lookup(4817)``) come out in the template's own tool-call format (for
        ChatML templates, ``<tool_call>`` JSON blocks): the form other tools
        (TRL's response parser, vLLM's tool parsers) read back. Needs the
        episode's tools, so call it after :meth:`reset`. A turn without tool
        calls comes back as its content.
        """
        message = self._parse(text, id_prefix="call_")
        base = self._render(_DUMMY_TURN[:1], add_generation_prompt=True)
        full = self._render([*_DUMMY_TURN[:1], message], add_generation_prompt=False)
        if not full.startswith(base):
            raise ValueError("the chat template does not render an assistant message after "
                             "its generation prompt; cannot write a turn as it does")
        body = full[len(base):]
        ends = [body.rfind(stop) for stop in self._stop_texts.values() if stop in body]
        if not ends:
            raise ValueError(f"the chat template closes an assistant message with none of the "
                             f"end-of-turn tokens {sorted(self._stop_texts.values())}")
        return body[:max(ends)]

    def observe(self, observation: list[Message]) -> None:
        """Queue the env's answer; it is tokenized when the next turn starts."""
        self._messages += copy.deepcopy(observation)
        self._pending += copy.deepcopy(observation)

    def trajectory(self) -> Trajectory:
        """The token-exact record of the episode so far.

        An observation not yet followed by a turn is in it, rendered as the
        next turn would prefill it (ending where the next action would
        start), when it fits ``max_context_tokens``; an episode cut by a
        limit after its last observation so keeps the state the learner
        bootstraps from.
        """
        delta = self._encode(self._observation_delta(self._pending)) if self._pending else []
        if (self.max_context_tokens is not None
                and len(self._ids) + len(delta) > self.max_context_tokens):
            delta = []
        return Trajectory(
            token_ids=self._ids + delta,
            loss_mask=self._mask + [0] * len(delta),
            logprobs=self._logprobs + [0.0] * len(delta),
            policy_versions=self._versions + [-1] * len(delta),
            messages=copy.deepcopy(self._messages),
        )

    # ----- rendering -----
    def _render(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages),
            tools=self._shown_tools or None,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _append_observation(self, ids: list[int]) -> None:
        self._ids += ids
        self._mask += [0] * len(ids)
        self._logprobs += [0.0] * len(ids)
        self._versions += [-1] * len(ids)

    def _observation_delta(self, observation: list[Message]) -> str:
        """Text the template adds after the last sampled token for ``observation``."""
        base = self._render(_DUMMY_TURN, add_generation_prompt=False)
        full = self._render([*_DUMMY_TURN, *observation], add_generation_prompt=True)
        if not full.startswith(base):
            raise ValueError(
                "the chat template is not prefix-stable (rendering a conversation and a "
                "continuation of it disagree on the shared part); LLMAgent cannot append "
                "observations without re-tokenizing history"
            )
        closing = base[base.rindex(_DUMMY) + len(_DUMMY):]
        stop = self._last_stop_text
        if stop is not None and closing.startswith(stop):
            closing = closing[len(stop):]
        return closing + full[len(base):]


TOOL_SCHEMAS = ("env", "signature")
"""Values of ``LLMAgent(tool_schemas=...)`` (``rollout.tool_schemas``)."""


def _stop_token_ids(tokenizer: Any) -> tuple[int, ...]:
    ids = []
    for token in (tokenizer.eos_token, "<|im_end|>", "<|eot_id|>", "<|end|>"):
        if token is None:
            continue
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid not in ids:
            ids.append(tid)
    if not ids:
        raise ValueError("the tokenizer has no end-of-turn token to stop generation at")
    return tuple(ids)
