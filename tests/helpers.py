"""Small envs and builders shared by tests."""

from __future__ import annotations

import asyncio
import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from sao_gym.core import AgentEnv
from sao_gym.tools import ToolEnv, ToolError, ToolResult, tool

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def import_benchmark(name: str) -> ModuleType:
    """Import ``benchmarks/NAME.py`` (a script, not a package) as module ``name``."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))


def call(name: str, args: Any = None, id: str = "c0") -> dict[str, Any]:
    """An OpenAI tool call."""
    if not isinstance(args, str):
        args = json.dumps(args or {})
    return {"id": id, "type": "function", "function": {"name": name, "arguments": args}}


def calls_msg(*calls: dict[str, Any], content: str | None = None) -> dict[str, Any]:
    """An assistant message with tool calls."""
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


class CounterEnv(ToolEnv):
    """A tiny tool env: add to a counter, finish with the total."""

    def __init__(self, target: int = 3):
        super().__init__()
        self.target = target
        self.total = 0

    async def on_reset(self, options):
        self.total = int(self.np_random.integers(0, 5)) if "start" not in options \
            else options["start"]
        self.task = {"id": f"counter-{self.total}", "prompt": "count", "answer": self.target}
        return [{"role": "user", "content": f"start at {self.total}"}], {}

    @tool(description="Add n.", parameters={
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
        "additionalProperties": False})
    def add(self, n: int) -> str:
        if n < 0:
            raise ToolError("n must be >= 0")
        self.total += n
        return str(self.total)

    @tool(description="Finish.", parameters={"type": "object", "properties": {}})
    async def finish(self) -> ToolResult:
        ok = self.total == self.target
        return ToolResult("done", terminated=True, reward=float(ok),
                          info={"reward_components": {"hit": float(ok)}})

    @tool(description="Sleep.", parameters={
        "type": "object", "properties": {"s": {"type": "number"}}, "required": ["s"]})
    async def sleep(self, s: float) -> str:
        await asyncio.sleep(s)
        return "slept"

    @tool(description="Crash the machine.", parameters={"type": "object", "properties": {}})
    async def crash(self) -> str:
        raise OSError("sandbox died")


class EchoEnv(AgentEnv):
    """A non-tool env: echoes text back, ends on 'bye'."""

    async def on_reset(self, options):
        return [{"role": "user", "content": "say something"}], {}

    async def on_step(self, action):
        text = action.get("content") or ""
        return ([{"role": "user", "content": f"you said {len(text)} chars"}],
                1.0 if text == "bye" else 0.0, text == "bye", False, {})


_ONE_TURN_SCRIPT = """
import asyncio, gc, json, sys
import sao_gym
from sao_gym.agents import ScriptedAgent

env_id, kwargs, action = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
for seed in (0, 1):  # each episode under its own asyncio.run; the env is never closed
    env = sao_gym.make(env_id, max_episode_steps=1, **kwargs)
    rollout = asyncio.run(sao_gym.run_episode(env, ScriptedAgent([action]), seed=seed))
    assert not rollout.infra_failure, rollout
    del env
    gc.collect()  # the first episode's env is garbage while the script goes on
print(rollout.messages[-1]["content"])
"""

EXIT_WARNINGS = ("Event loop is closed", "is closed", "Exception ignored", "unclosed")
"""What a sandbox process left open past its event loop makes Python print at exit."""


def play_in_a_script(env_id: str, action: dict[str, Any],
                     **env_kwargs: Any) -> subprocess.CompletedProcess:
    """Two one-turn episodes of ``env_id`` in a fresh ``python -X dev``, as a user's script
    plays them: each under its own ``asyncio.run``, the env never closed.

    Its stdout is the last observation's text; its stderr should hold none of
    :data:`EXIT_WARNINGS`.
    """
    return subprocess.run(
        [sys.executable, "-X", "dev", "-c", _ONE_TURN_SCRIPT, env_id, json.dumps(env_kwargs),
         json.dumps(action)], capture_output=True, text=True, timeout=300)


def mask_runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """``(value, start, end)`` of each run of equal values in a loss mask."""
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((mask[start], start, i))
            start = i
    return out


def run_sft(policy: str, demos: Any, *, out_dir: Any, holdout: Any = None, callback: Any = None,
            state_dir: Any = None, **settings: Any) -> str:
    """:func:`sao_gym.learner.sft.sft` with its :class:`SFTSettings` given as keywords."""
    from sao_gym.learner.sft import SFTSettings, sft

    return sft(policy, demos, SFTSettings(**settings), out_dir=out_dir, holdout=holdout,
               callback=callback, state_dir=state_dir)
