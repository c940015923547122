import json

import pytest

from sao_gym.spaces import AssistantMessageSpace, ChatSpace, message_problem


@pytest.mark.parametrize("msg", [
    {"role": "assistant", "content": "hi"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": {"x": 1}}}]},
])
def test_valid_assistant_messages(msg):
    assert msg in AssistantMessageSpace()


@pytest.mark.parametrize("msg, reason", [
    ("hi", "must be an object"),
    ({"role": "user", "content": "hi"}, "role must be one of"),
    ({"role": "assistant", "content": 3}, "content must be a string"),
    ({"role": "assistant", "content": "", "tool_calls": {}}, "tool_calls must be a list"),
    ({"role": "assistant", "content": "", "tool_calls": [{"type": "function"}]}, "'function'"),
    ({"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": 1, "arguments": "{}"}}]}, "name must be a string"),
    ({"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": 5}}]}, "arguments must be"),
])
def test_invalid_assistant_messages_are_explained(msg, reason):
    assert msg not in AssistantMessageSpace()
    assert reason in message_problem(msg, roles=("assistant",))


def test_chat_space_contains():
    space = ChatSpace()
    assert [{"role": "system", "content": "s"}, {"role": "tool", "tool_call_id": "a",
                                                  "content": "r"}] in space
    assert [] not in space
    assert [{"role": "user", "content": None}] not in space
    assert {"role": "user", "content": "x"} not in space


def test_samples_are_members_seeded_and_include_broken_tool_calls():
    a, b = AssistantMessageSpace(seed=3), AssistantMessageSpace(seed=3)
    samples = [a.sample() for _ in range(300)]
    assert samples == [b.sample() for _ in range(300)]
    assert all(s in a for s in samples)
    calls = [c for s in samples for c in s.get("tool_calls", [])]
    bad_json = 0
    for c in calls:
        args = c["function"]["arguments"]
        if isinstance(args, str):
            try:
                json.loads(args)
            except ValueError:
                bad_json += 1
    assert bad_json > 10
    assert any(c["function"]["name"] == "unknown_tool" for c in calls)
    chat = ChatSpace(seed=1)
    assert all(chat.sample() in chat for _ in range(100))
