"""Small envs and builders shared by tests."""

from __future__ import annotations

import asyncio
import importlib
import json
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
