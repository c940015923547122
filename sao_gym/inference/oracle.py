"""An oracle behind a backend: demonstrations in the agent's own token layout.

An oracle is a function ``oracle(messages, task) -> str``: the text of the
next assistant turn from the conversation so far and the task (an env's
``env.unwrapped.task``, which holds the reference answer, or a harness's
task). :class:`OracleTurns` makes one answer a
:class:`~sao_gym.inference.scripted.ScriptedBackend`'s calls, so whatever
records the conversation (an :class:`~sao_gym.agents.LLMAgent` in an env
episode, a gateway episode behind a harness) records the oracle's turns as it
would record sampled ones (``loss_mask`` 1, logprob 0).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sao_gym.types import Message, SamplingParams

Oracle = Callable[[Sequence[Message], Mapping[str, Any]], str]
"""``oracle(messages, task) -> text`` of the next assistant turn."""


class OracleTurns:
    """A :class:`~sao_gym.inference.scripted.ScriptedBackend` handler: the oracle's next turn.

    Its ``agent`` is whatever records the conversation (an
    :class:`~sao_gym.agents.LLMAgent`, or a gateway episode): the oracle reads
    ``agent.trajectory().messages``, and ``task``. The turn's text is
    tokenized (no special tokens) and closed with the first stop token; with
    ``template_format`` its tool calls are first written as the chat template
    writes them (``agent.as_template_writes``). An oracle that raises, returns
    no text or a turn over ``max_new_tokens`` fails the call; the error is kept
    in ``error``.
    """

    def __init__(self, tokenizer: Any, oracle: Oracle, template_format: bool = False):
        self.tokenizer = tokenizer
        self.oracle = oracle
        self.template_format = template_format
        self.agent: Any = None
        self.task: Mapping[str, Any] = {}
        self.error: Exception | None = None

    def __call__(self, prompt_ids: list[int], params: SamplingParams) -> list[int]:
        """The token ids of the oracle's next turn, its end-of-turn token last."""
        try:
            messages = self.agent.trajectory().messages
            text = self.oracle(messages, self.task)
            if not isinstance(text, str):
                raise TypeError(f"the oracle must return a str, got {type(text).__name__}")
            if self.template_format:
                text = self.agent.as_template_writes(text)
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            ids.append(params.stop_token_ids[0])
            if len(ids) > params.max_new_tokens:
                raise ValueError(
                    f"the oracle's turn {text!r} is {len(ids)} tokens (with end-of-turn), more "
                    f"than max_new_tokens={params.max_new_tokens}: raise max_new_tokens"
                )
        except Exception as e:
            self.error = e
            raise
        return ids


__all__ = ["Oracle", "OracleTurns"]
