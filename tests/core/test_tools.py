import pytest

from sao_gym.tools import decode_arguments, tool, validate_arguments
from tests.helpers import CounterEnv, call, calls_msg

SCHEMA = {"type": "object", "properties": {
    "s": {"type": "string"}, "i": {"type": "integer"}, "n": {"type": ["number", "null"]},
    "b": {"type": "boolean"}, "e": {"type": "string", "enum": ["a", "b"]}},
    "required": ["s"], "additionalProperties": False}


@pytest.mark.parametrize("args, problem", [
    ({"s": "x"}, None),
    ({"s": "x", "i": 3, "n": None, "b": True, "e": "a"}, None),
    ({"s": "x", "n": 2.5}, None),
    ({}, "missing required argument(s): s"),
    ({"s": 1}, "'s' must be of type string"),
    ({"s": "x", "i": 1.5}, "'i' must be of type integer"),
    ({"s": "x", "i": True}, "'i' must be of type integer"),
    ({"s": "x", "e": "c"}, "must be one of"),
    ({"s": "x", "zz": 1}, "unexpected argument 'zz'"),
    ([1], "arguments must be a JSON object"),
])
def test_validate_arguments(args, problem):
    got = validate_arguments(args, SCHEMA)
    assert got == problem if problem is None else problem in got


@pytest.mark.parametrize("raw, ok", [
    ('{"a": 1}', True), ({"a": 1}, True), ("", True), ("  ", True),
    ("[1]", False), ("{", False), (5, False), ("[" * 50000 + "]" * 50000, False),
])
def test_decode_arguments(raw, ok):
    value, problem = decode_arguments(raw)
    assert (problem is None) == ok
    if ok:
        assert isinstance(value, dict)


def test_tool_decorator_requires_object_schema():
    with pytest.raises(ValueError):
        tool(description="x", parameters={"type": "string"})


def test_tools_dispatch_validate_and_answer_errors():
    env = CounterEnv(target=5)
    obs, info = env.reset(options={"start": 0})
    assert [t["function"]["name"] for t in info["tools"]] == ["add", "finish", "sleep", "crash"]
    obs, r, term, trunc, _ = env.step(calls_msg(call("add", {"n": 2}, "a"),
                                                call("add", '{"n": 3}', "b")))
    assert [(o["role"], o["tool_call_id"], o["content"]) for o in obs] == [
        ("tool", "a", "2"), ("tool", "b", "5")]
    bad = env.step(calls_msg(call("add", {"n": "3"}), call("add", "{oops"), call("nope", {}),
                             call("add", {"n": -1})))[0]
    assert "'n' must be of type integer" in bad[0]["content"]
    assert "not valid JSON" in bad[1]["content"]
    assert "unknown tool 'nope'" in bad[2]["content"]
    assert bad[3]["content"] == "Error: add: n must be >= 0"
    assert env.total == 5
    obs, r, term, trunc, info = env.step(calls_msg(call("finish"), call("add", {"n": 1})))
    assert (len(obs), r, term, info) == (1, 1.0, True, {"reward_components": {"hit": 1.0}})
    assert env.total == 5  # the call after the terminating one did not run


def test_text_without_tool_call_and_too_many_calls():
    env = CounterEnv()
    env.reset(options={"start": 0})
    obs, *_ , info = env.step("I think the answer is 3")
    assert "no tool call found" in obs[0]["content"] and info["invalid_action"]
    obs = env.step(calls_msg(*[call("add", {"n": 1}, f"c{i}") for i in range(10)]))[0]
    assert len(obs) == 9 and env.total == 8
    assert "2 were ignored" in obs[-1]["content"]


def test_infrastructure_errors_in_tools_propagate():
    env = CounterEnv()
    env.reset()
    with pytest.raises(OSError, match="sandbox died"):
        env.step(calls_msg(call("crash")))
