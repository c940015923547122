"""Random actions call the env's own tools, with arguments that do and do not fit their schema."""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

from sao_gym.agents import RandomAgent
from sao_gym.spaces import AssistantMessageSpace
from sao_gym.tools import ToolEnv, decode_arguments, tool, validate_arguments

ROOT = Path(__file__).resolve().parents[2]


class Workshop(ToolEnv):
    """Tools no built-in env has, with several argument types."""

    async def on_reset(self, options):
        self.task = {"id": "workshop", "prompt": "build something"}
        return [{"role": "user", "content": "build something"}], {}

    @tool(description="Shape a part.", parameters={
        "type": "object",
        "properties": {
            "count": {"type": "integer"},
            "label": {"type": "string"},
            "finish": {"type": "string", "enum": ["matte", "gloss"]},
            "weights": {"type": "array", "items": {"type": "number"}},
            "fragile": {"type": "boolean"},
        },
        "required": ["count", "label", "finish"],
        "additionalProperties": False})
    def frobnicate(self, count, label, finish, weights=(), fragile=False):
        return "shaped"

    @tool(description="Done.", parameters={"type": "object", "properties": {}})
    def wrap_up(self):
        return "wrapped"


def _calls(actions, name):
    calls = [c for a in actions for c in a.get("tool_calls") or []]
    return [c for c in calls if c["function"]["name"] == name]


def _verdicts(calls):
    schema = Workshop.tool_specs()["frobnicate"].parameters
    out = []
    for c in calls:
        args, problem = decode_arguments(c["function"]["arguments"])
        out.append((problem or validate_arguments(args, schema)) is None)
    return out


def test_the_action_space_of_a_tool_env_calls_its_tools_well_and_badly():
    env = Workshop()
    env.reset(seed=0)
    env.action_space.seed(0)
    samples = [env.action_space.sample() for _ in range(400)]
    assert all(s in env.action_space for s in samples)
    ok = _verdicts(_calls(samples, "frobnicate"))
    assert sum(ok) >= 20 and ok.count(False) >= 20
    assert _calls(samples, "wrap_up")
    names = {c["function"]["name"] for s in samples for c in s.get("tool_calls") or []}
    assert names - {"frobnicate", "wrap_up"}, "unknown tools are still tried"


def test_a_space_given_tool_schemas_calls_them():
    space = AssistantMessageSpace(seed=1, tools=Workshop().tool_schemas())
    samples = [space.sample() for _ in range(400)]
    ok = _verdicts(_calls(samples, "frobnicate"))
    assert sum(ok) >= 20 and ok.count(False) >= 20


async def test_random_agent_calls_the_tools_of_the_reset_info_well_and_badly():
    env = Workshop()
    obs, info = await env.areset(seed=0)
    agent = RandomAgent(seed=0)
    agent.reset(obs, info)
    actions = [await agent.act() for _ in range(300)]
    ok = _verdicts(_calls(actions, "frobnicate"))
    assert sum(ok) >= 20 and ok.count(False) >= 20


def test_no_builtin_tool_name_is_hard_coded_in_random_actions():
    builtin = {"calculator", "submit", "python", "bash", "submit_answer", "check_proof",
               "submit_proof", "read_file", "write_file", "str_replace", "run_tests"}
    for path in (ROOT / "sao_gym" / "spaces.py", ROOT / "agents" / "scripted.py"):
        tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        strings = [t.string for t in tokens if t.type == tokenize.STRING]
        named = {n for n in builtin for s in strings if n in s.strip("'\"").split()}
        assert not named, f"{path.name} names built-in tools {sorted(named)}"
