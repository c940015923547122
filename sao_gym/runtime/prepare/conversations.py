"""Demonstrations from a file of conversations, replayed so they get the agent's token layout.

An environment without an oracle can still be warm-started from recorded
conversations (``warm_start.demonstrations: PATH``, a JSONL file):
:func:`load_conversations` reads and checks them, and
:func:`~sao_gym.runtime.prepare.demonstrations.collect_demonstrations` plays each one
through the agent with :func:`replay_env_factory`'s environments and
:func:`replay_oracle`, the same path an oracle's episodes take, so the
resulting rollouts have exactly the token layout RL produces.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sao_gym.core import AgentEnv, StepResult
from sao_gym.types import Message


def load_conversations(path: str | Path) -> list[dict[str, Any]]:
    """Read demonstrations from a JSONL file, one conversation per line.

    A line is ``{"messages": [...], "reward": 1.0}`` (``reward`` optional,
    default 1.0; ``tools`` optional: the tool schemas the conversation was
    held with, else the environment's). ``messages`` are OpenAI-format chat
    messages: the task's opening messages (system/user), then assistant turns
    (``content`` and/or ``tool_calls``) each followed by what the environment
    answered (``tool``/``user`` messages). Raises ``ValueError`` naming the
    line for anything else.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"demonstrations file {path} does not exist")
    from sao_gym.utils.jsonl import read_jsonl

    conversations = []
    for n, conv in read_jsonl(path):
        problem = _conversation_problem(conv)
        if problem:
            raise ValueError(f"{path}:{n}: {problem}")
        conversations.append(conv)
    if not conversations:
        raise ValueError(f"{path} holds no conversations")
    return conversations


def _conversation_problem(conv: Any) -> str | None:
    if not isinstance(conv, dict) or not isinstance(conv.get("messages"), list):
        return 'expected {"messages": [...], "reward": ...}'
    messages = conv["messages"]
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        return "every message must be an object with a role"
    roles = [m["role"] for m in messages]
    if "assistant" not in roles:
        return "no assistant turn to learn from"
    if roles[0] not in ("system", "user"):
        return "the conversation must open with the task (system/user messages)"
    unknown = sorted(set(roles) - {"system", "user", "assistant", "tool"})
    if unknown:
        return f"unknown roles {unknown} (system, user, assistant, tool)"
    if any(a == b == "assistant" for a, b in zip(roles, roles[1:], strict=False)):
        return ("an assistant turn must be followed by the environment's answer "
                "(tool/user messages) before the next one")
    reward = conv.get("reward", 1.0)
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        return f"reward must be a number, got {reward!r}"
    return None


def assistant_text(message: Message) -> str:
    """The text a model writes for an assistant ``message``: content, then tool-call blocks.

    Tool calls become ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
    blocks, which the agent's tool parser reads back into the same calls.
    """
    parts = [message["content"]] if isinstance(message.get("content"), str) and \
        message["content"] else []
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call)
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                pass
        parts.append("<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": args},
                                                   ensure_ascii=False) + "\n</tool_call>")
    return "\n".join(parts)


def replay_oracle(messages: Sequence[Message], task: Mapping[str, Any]) -> str:
    """The oracle of a replayed conversation: its next recorded assistant turn."""
    return task["turns"][sum(m.get("role") == "assistant" for m in messages)]


def replay_env_factory(conversations: Sequence[Mapping[str, Any]],
                       tools: Sequence[Mapping[str, Any]] = ()) -> Callable[[], Any]:
    """A factory of environments that replay ``conversations``, one per call, in order.

    Played with :func:`replay_oracle` by :func:`acollect_demonstrations`
    (whose episodes make one env each), they turn a file of conversations
    into rollouts with the agent's token layout; the last assistant turn
    earns the conversation's ``reward``. ``tools``: schemas for
    conversations that carry none.
    """
    pending = iter(itertools.cycle(enumerate(conversations)))
    return lambda: ConversationEnv(*next(pending), tools)


class ConversationEnv(AgentEnv):
    """Replays one recorded conversation whatever the agent does (:func:`replay_env_factory`)."""

    def __init__(self, index: int, conversation: Mapping[str, Any],
                 tools: Sequence[Mapping[str, Any]] = ()):
        super().__init__()
        self._index, self._conversation = index, conversation
        self._tools = list(conversation.get("tools") or tools)
        self._blocks: list[list[Message]] = []

    async def on_reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        """The conversation's opening messages; the task holds its assistant turns."""
        blocks: list[list[Message]] = [[]]
        turns = []
        for m in self._conversation["messages"]:
            if m["role"] == "assistant":
                turns.append(assistant_text(m))
                blocks.append([])
            else:
                blocks[-1].append(dict(m))
        self._blocks = blocks[1:]
        self.task = {"id": f"demonstration-{self._index}", "turns": turns}
        return blocks[0], {"tools": self._tools}

    async def on_step(self, action: Message) -> StepResult:
        """The recorded answer to the next assistant turn; the reward comes at the end."""
        obs = self._blocks.pop(0)
        done = not self._blocks
        reward = float(self._conversation.get("reward", 1.0)) if done else 0.0
        return obs, reward, done, False, {}


__all__ = ["ConversationEnv", "assistant_text", "load_conversations", "replay_env_factory",
           "replay_oracle"]
