import json

from sao_gym.agents.tool_parser import parse_tool_calls

TOOLS = [
    {"type": "function", "function": {"name": "calculator", "parameters": {
        "type": "object", "properties": {"expression": {"type": "string"}},
        "required": ["expression"]}}},
    {"type": "function", "function": {"name": "submit", "parameters": {
        "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}},
]


def _fn(calls, i=0):
    return calls[i]["function"]["name"], calls[i]["function"]["arguments"]


def test_hermes_blocks():
    text = ('Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": '
            '{"expression": "2+3"}}\n</tool_call>\n<tool_call>{"name": "submit", '
            '"arguments": {"answer": "5"}}</tool_call>')
    content, calls = parse_tool_calls(text, TOOLS, id_prefix="t1_")
    assert content == "Let me compute."
    assert [c["id"] for c in calls] == ["t1_0", "t1_1"]
    assert _fn(calls) == ("calculator", json.dumps({"expression": "2+3"}))
    assert json.loads(_fn(calls, 1)[1]) == {"answer": "5"}


def test_broken_and_unclosed_blocks_still_become_calls():
    content, calls = parse_tool_calls('<tool_call>{"name": "submit", "arguments": {"ans')
    assert content == "" and _fn(calls) == ("submit", '{"name": "submit", "arguments": {"ans')
    content, calls = parse_tool_calls("hi <tool_call>garbage</tool_call> there")
    assert content == "hi  there" and _fn(calls) == ("", "garbage")
    _, calls = parse_tool_calls('<tool_call>{"name": "x", "parameters": {"a": 1}}</tool_call>')
    assert _fn(calls) == ("x", '{"a": 1}')


def test_plain_text_fallback():
    content, calls = parse_tool_calls("I will submit.\nsubmit(42)", TOOLS)
    assert content == "I will submit." and _fn(calls) == ("submit", '{"answer": "42"}')
    _, calls = parse_tool_calls("calculator((1+2)*3)", TOOLS)
    assert _fn(calls) == ("calculator", '{"expression": "(1+2)*3"}')
    _, calls = parse_tool_calls('submit("7")', TOOLS)
    assert json.loads(_fn(calls)[1]) == {"answer": "7"}
    _, calls = parse_tool_calls('{"name": "submit", "arguments": {"answer": "3"}}', TOOLS)
    assert json.loads(_fn(calls)[1]) == {"answer": "3"}


def test_no_fallback_without_tools_or_for_unknown_names():
    assert parse_tool_calls("submit(42)") == ("submit(42)", [])
    assert parse_tool_calls("launch(42)", TOOLS) == ("launch(42)", [])
    assert parse_tool_calls('{"name": "nope"}', TOOLS)[1] == []


def test_plain_text_argument_takes_the_type_its_parameter_declares():
    def schema(name, kind):
        return {"type": "function", "function": {"name": name, "parameters": {
            "type": "object", "properties": {"v": {"type": kind}}, "required": ["v"]}}}

    tools = [schema("count", "integer"), schema("weigh", "number"), schema("say", "string"),
             schema("flag", "boolean"), schema("either", ["integer", "string"])]
    cases = {"count(42)": 42, "count(-3)": -3, "count(4.5)": "4.5", "count(abc)": "abc",
             "count(true)": "true", "weigh(2.5)": 2.5, "weigh(7)": 7, "say(42)": "42",
             "flag(true)": True, "flag(1)": "1", "either(9)": "9", "either(x)": "x"}
    for text, value in cases.items():
        _, calls = parse_tool_calls(text, tools)
        assert json.loads(calls[0]["function"]["arguments"]) == {"v": value}, text


def test_plain_text_calls_of_tools_with_several_parameters():
    """Positional in the schema's order (what the compact template lists) or by name."""
    add = {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"]}}}
    move = {"type": "function", "function": {"name": "move", "parameters": {
        "type": "object", "properties": {"src": {"type": "string"}, "dst": {"type": "string"},
                                         "count": {"type": "integer"}}, "required": ["src"]}}}
    python = {"type": "function", "function": {"name": "python", "parameters": {
        "type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}
    tools = [add, move, python]
    cases = {
        "add(7, 12)": {"a": 7, "b": 12},
        "add(b=12, a=7)": {"a": 7, "b": 12},
        "add(7, b=12)": {"a": 7, "b": 12},
        "add(x, 3)": {"a": "x", "b": 3},  # not an integer: the env's schema check answers it
        "move('a, b', \"c\")": {"src": "a, b", "dst": "c"},
        "move(box, shelf, 3)": {"src": "box", "dst": "shelf", "count": 3},
        "move([1, 2], {'k': 1})": {"src": "[1, 2]", "dst": "{'k': 1}"},
        "move(crate)": {"src": "crate"},
        "move(a, b, 1, 2)": {"src": "a, b, 1, 2"},  # more arguments than parameters: one
        "python(print(1, 2))": {"code": "print(1, 2)"},  # one parameter: never split
    }
    for text, arguments in cases.items():
        _, calls = parse_tool_calls(text, tools)
        assert json.loads(calls[0]["function"]["arguments"]) == arguments, text
