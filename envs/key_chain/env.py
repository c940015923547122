"""``sao_gym/KeyChain-v0``: follow a chain of keys for ``hops`` lookups, then submit the last.

A long-horizon task with a horizon knob. The agent is given a start key;
``lookup(key)`` with the current key answers with the next one, and after
``hops`` correct lookups the agent must ``submit(key)`` the last key:

    user:  Follow the key chain for 8 hops. The start key is 4817. ...
    agent: lookup(4817)
    tool:  Hop 1/8: the next key is 2291.
    agent: lookup(2291)
    ...
    tool:  Hop 8/8: the last key is 5530. Submit it.
    agent: submit(5530)          -> reward 1, the only reward of the episode

Solving it takes ``hops + 1`` turns, each a copy of a number from the last
observation: a skill a small model learns, repeated ``hops`` times under one
terminal reward. What the horizon changes is credit assignment:

- **every turn can fail**: a miscopied key is answered with an error that
  names the current key again (``Error: no key 2219. Hop 1/8; the current key
  is 2291.``), so a mistake is recoverable but costs a turn;
- **the turn budget is finite**: an episode may take ``slack`` turns more
  than the ``hops + 1`` it needs (default ``max(2, hops // 4)``); once they
  are spent it is truncated with reward 0. Whether a mistake is fatal depends
  on how many were made before, which the context shows (the hop counter and
  the error messages), so the value of a state is visible to a value model;
- **the reward is terminal and shared**: with ``hops`` decisions under one
  reward, a baseline that gives every token of an episode the same advantage
  credits a good copy and the miscopy beside it alike; a value model can tell
  them apart by the error that follows the miscopy. The longer the chain,
  the more decisions share one reward, and the more mistakes end an episode
  (a per-turn slip rate ``p`` fails roughly ``1 - (1 - p)^hops`` of first
  tries somewhere).

Submitting early, or a wrong last key, ends the episode with reward 0.
Tasks come from ``np_random`` (``reset(seed=...)``); ``options={"task":
{"keys": [start, k1, ..., k_hops]}}`` fixes one, ``options={"hops": n}``
changes the horizon for one episode.
"""

from __future__ import annotations

import zlib
from typing import Any

from sao_gym.core import StepResult
from sao_gym.tools import ToolEnv, ToolResult, tool
from sao_gym.types import Message, StopReason

SYSTEM_PROMPT = (
    "Follow the key chain. Call lookup with the current key to get the next key. "
    "When the last key is reached, call submit with it."
)
MAX_HOPS = 256


class KeyChainEnv(ToolEnv):
    """Follow ``hops`` links of a key chain with ``lookup``, then ``submit`` the last key."""

    def __init__(self, *, hops: int = 8, slack: int | None = None, digits: int = 4):
        super().__init__()
        _check(hops, slack, digits)
        self.hops, self.slack, self.digits = hops, slack, digits
        self.task: dict[str, Any] | None = None
        self.hop = 0
        self.turns = 0
        self.mistakes = 0

    @property
    def turn_budget(self) -> int:
        """Turns an episode may take: ``hops + 1`` and the slack."""
        assert self.task is not None
        return self.task["hops"] + 1 + self.task["slack"]

    async def on_reset(self, options: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        """Pick a chain (``options["task"]``, or the seeded generator with ``options["hops"]``)."""
        hops = int(options.get("hops", self.hops))
        slack = options.get("slack", self.slack)
        if "task" in options:
            keys = _keys_from(options["task"])
            hops = len(keys) - 1
        else:
            _check(hops, slack, self.digits)
            keys = self._generate(hops)
        slack = max(2, hops // 4) if slack is None else int(slack)
        _check(hops, slack, self.digits)
        self.task = {
            "id": f"keychain:{hops}:{zlib.crc32(repr(keys).encode()):08x}",  # not the answer
            "keys": keys, "hops": hops, "slack": slack, "answer": str(keys[-1]),
        }
        self.hop, self.turns, self.mistakes = 0, 0, 0
        prompt = (f"Follow the key chain for {hops} hops. The start key is {keys[0]}. "
                  f"You have {self.turn_budget} turns.")
        obs: list[Message] = [{"role": "system", "content": SYSTEM_PROMPT},
                              {"role": "user", "content": prompt}]
        return obs, {"task_id": self.task["id"], "hops": hops, "turn_budget": self.turn_budget}

    def _generate(self, hops: int) -> list[int]:
        lo, hi = 10 ** (self.digits - 1), 10**self.digits
        keys: list[int] = []
        seen: set[int] = set()
        while len(keys) < hops + 1:
            k = int(self.np_random.integers(lo, hi))
            if k not in seen:
                seen.add(k)
                keys.append(k)
        return keys

    async def astep(self, action: Message | str) -> StepResult:
        """A turn (any action counts); once the budget is spent the episode is truncated."""
        obs, reward, terminated, truncated, info = await super().astep(action)
        self.turns += 1
        info = {**info, "hop": self.hop, "mistakes": self.mistakes}
        if not (terminated or truncated) and self.turns >= self.turn_budget:
            obs = [*obs, {"role": "user", "content": "Out of turns."}]
            truncated = True
            info["stop_reason"] = StopReason.MAX_TURNS
            self._episode_over = True
        return obs, reward, terminated, truncated, info

    async def on_text(self, message: Message) -> StepResult:
        """A turn without a tool call is a mistake too."""
        self.mistakes += 1
        return await super().on_text(message)

    def _where(self) -> str:
        assert self.task is not None
        key = self.task["keys"][self.hop]
        return f"Hop {self.hop}/{self.task['hops']}; the current key is {key}."

    @tool(
        description="Look up a key: returns the next key of the chain.",
        parameters={
            "type": "object",
            "properties": {"key": {"type": ["integer", "string"], "description": "e.g. 4817"}},
            "required": ["key"],
            "additionalProperties": False,
        },
    )
    async def lookup(self, key: int | str) -> ToolResult:
        """The next key after ``key`` when it is the current one; an error otherwise."""
        assert self.task is not None
        keys, hops = self.task["keys"], self.task["hops"]
        if self.hop == hops:
            self.mistakes += 1
            return ToolResult(f"Error: the chain is complete. Submit the last key, {keys[-1]}.")
        if _as_int(key) != keys[self.hop]:
            self.mistakes += 1
            return ToolResult(f"Error: no key {str(key).strip()[:16]}. {self._where()}")
        self.hop += 1
        if self.hop == hops:
            return ToolResult(f"Hop {hops}/{hops}: the last key is {keys[-1]}. Submit it.")
        return ToolResult(f"Hop {self.hop}/{hops}: the next key is {keys[self.hop]}.")

    @tool(
        description="Submit the last key of the chain. This ends the episode.",
        parameters={
            "type": "object",
            "properties": {"key": {"type": ["integer", "string"], "description": "e.g. 5530"}},
            "required": ["key"],
            "additionalProperties": False,
        },
    )
    async def submit(self, key: int | str) -> ToolResult:
        """Reward 1 for the last key after every hop; the episode ends either way."""
        assert self.task is not None
        done = self.hop == self.task["hops"]
        correct = done and _as_int(key) == self.task["keys"][-1]
        text = ("Correct." if correct else
                "Incorrect: the chain was not complete." if not done else "Incorrect.")
        return ToolResult(text, terminated=True, reward=float(correct),
                          info={"reward_components": {"correct": float(correct)}})


def _as_int(value: Any) -> int | None:
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def _keys_from(task: Any) -> list[int]:
    keys = task.get("keys") if isinstance(task, dict) else None
    if (not isinstance(keys, list) or len(keys) < 2
            or not all(isinstance(k, int) and k >= 0 for k in keys)
            or len(set(keys)) != len(keys)):
        raise ValueError('options["task"] must be {"keys": [start, k1, ...]}: at least two '
                         "distinct non-negative integers")
    return list(keys)


def _check(hops: int, slack: int | None, digits: int) -> None:
    if not 1 <= hops <= MAX_HOPS:
        raise ValueError(f"hops must be in [1, {MAX_HOPS}], got {hops}")
    if slack is not None and not 0 <= int(slack) <= 4 * MAX_HOPS:
        raise ValueError(f"slack must be in [0, {4 * MAX_HOPS}] or None, got {slack}")
    if not 3 <= digits <= 9:
        raise ValueError(f"digits must be in [3, 9], got {digits}")
