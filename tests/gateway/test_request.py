"""parse_chat_request: what an OpenAI chat body may ask, and clear errors for the rest."""

from __future__ import annotations

import copy

import pytest

from sao_gym.gateway.request import GatewayError, parse_chat_request

USER = {"role": "user", "content": "hi"}


def parse(**kw):
    return parse_chat_request({"model": "policy", "messages": [USER], **kw},
                              models=("policy", "adapter"))


def test_the_supported_fields_are_read():
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    r = parse(tools=[tool], temperature=0.5, top_p=0.9, max_completion_tokens=7, seed=3,
              logprobs=True, top_logprobs=0, n=1, stream=True,
              stream_options={"include_usage": True}, parallel_tool_calls=True, user="u",
              metadata={"k": "v"}, return_token_ids=True, tool_choice="none")
    assert (r.temperature, r.top_p, r.max_tokens, r.seed) == (0.5, 0.9, 7, 3)
    assert r.logprobs and r.stream and r.include_usage and r.return_token_ids
    assert r.tools == [tool] and r.tool_choice == "none"
    assert parse(max_tokens=5).max_tokens == 5
    assert parse(stop="\n\n").stop == ("\n\n",) and parse(stop=["a", "b"]).stop == ("a", "b")
    assert parse().stop == ()
    d = parse()
    assert (d.temperature, d.top_p, d.max_tokens, d.seed, d.stream) == (1.0, 1.0, None, None,
                                                                        False)
    assert parse_chat_request({"model": "adapter", "messages": [USER]},
                              models=("policy", "adapter")).messages == [USER]


def test_messages_are_normalised_and_the_body_is_left_as_it_was():
    messages = [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "tool_calls": []},
    ]
    sent = copy.deepcopy(messages)
    r = parse_chat_request({"model": "policy", "messages": messages}, models=("policy",))
    assert r.messages == [{"role": "system", "content": "rules"}, {"role": "user", "content": "ab"},
                          {"role": "assistant", "content": None}]
    assert messages == sent


@pytest.mark.parametrize("body, param, code, status", [
    ({"response_format": {"type": "json_object"}}, "response_format", "unsupported_parameter", 400),
    ({"frequency_penalty": 0.5}, "frequency_penalty", "unsupported_parameter", 400),
    ({"model": "gpt-4o"}, "model", "model_not_found", 404),
    ({"n": 2}, "n", "unsupported_value", 400),
    ({"top_logprobs": 5}, "top_logprobs", "unsupported_value", 400),
    ({"tool_choice": "required"}, "tool_choice", "unsupported_value", 400),
    ({"parallel_tool_calls": False}, "parallel_tool_calls", "unsupported_value", 400),
    ({"temperature": 3}, "temperature", "invalid_value", 400),
    ({"max_tokens": 0}, "max_tokens", "invalid_value", 400),
    ({"seed": "7"}, "seed", "invalid_value", 400),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value", 400),
    ({"stop": [""]}, "stop", "invalid_value", 400),
    ({"stop": 3}, "stop", "invalid_value", 400),
    ({"stream": "yes"}, "stream", "invalid_value", 400),
    ({"stream_options": {"continuous_usage_stats": True}}, "stream_options", "unsupported_value",
     400),
    ({"messages": []}, "messages", "invalid_value", 400),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0]", "invalid_value", 400),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content", "unsupported_value", 400),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id",
     "invalid_value", 400),
    ({"tools": [{"type": "code_interpreter"}]}, "tools", "invalid_value", 400),
])
def test_what_is_not_supported_is_an_error_naming_the_field(body, param, code, status):
    with pytest.raises(GatewayError) as e:
        parse_chat_request({"model": "policy", "messages": [USER], **body}, models=("policy",))
    assert (e.value.param, e.value.code, e.value.status) == (param, code, status)
    error = e.value.body()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"] == str(e.value)


def test_a_body_that_is_not_an_object_is_an_error():
    with pytest.raises(GatewayError, match="JSON object"):
        parse_chat_request([USER], models=("policy",))
