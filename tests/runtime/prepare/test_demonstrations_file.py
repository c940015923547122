"""Demonstrations from a JSONL file of conversations: load_conversations, assistant_text,
and their replay through the agent into token-exact rollouts."""

from __future__ import annotations

import gzip
import json

import pytest
from transformers import AutoTokenizer

from sao_gym.models import COMPACT_TOOLS_TEMPLATE, IM_END, tiny_model
from sao_gym.runtime.prepare.conversations import (
    assistant_text,
    load_conversations,
    replay_env_factory,
    replay_oracle,
)
from sao_gym.runtime.prepare.demonstrations import collect_demonstrations
from sao_gym.types import StopReason
from tests.helpers import mask_runs

LOOKUP = {"type": "function", "function": {
    "name": "lookup", "description": "Look up a key.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                   "required": ["key"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}

TWO_CALLS = {
    "role": "assistant", "content": "Let me look.",
    "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "lookup", "arguments": '{"key": "crate 7"}'}},
        {"id": "c2", "type": "function", "function": {"name": "add", "arguments": {"a": 1,
                                                                                   "b": 41}}},
    ],
}

CONVERSATIONS = [
    {"messages": [
        {"role": "user", "content": "What is in crate 7, plus one?"},
        TWO_CALLS,
        {"role": "tool", "tool_call_id": "c1", "name": "lookup", "content": "41 apples"},
        {"role": "tool", "tool_call_id": "c2", "name": "add", "content": "42"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c3", "type": "function",
             "function": {"name": "lookup", "arguments": {"key": "answer"}}}]},
        {"role": "tool", "tool_call_id": "c3", "name": "lookup", "content": "ok"},
        {"role": "assistant", "content": "42 apples."},
     ], "reward": 0.5},
    {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": "Again."},
        {"role": "assistant", "content": "Hi again."},
     ]},  # no reward: 1.0
]


# ----- assistant_text -------------------------------------------------------------------------

def test_assistant_text_of_content_and_two_calls():
    assert assistant_text(TWO_CALLS) == (
        "Let me look.\n"
        "<tool_call>\n"
        '{"name": "lookup", "arguments": {"key": "crate 7"}}\n'
        "</tool_call>\n"
        "<tool_call>\n"
        '{"name": "add", "arguments": {"a": 1, "b": 41}}\n'
        "</tool_call>"
    )


def test_assistant_text_of_other_shapes():
    assert assistant_text({"role": "assistant", "content": "Just text."}) == "Just text."
    only_call = {"role": "assistant", "content": None,
                 "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}
    assert assistant_text(only_call) == '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    empty_content = {**only_call, "content": ""}
    assert assistant_text(empty_content) == assistant_text(only_call)
    # a call without the "function" wrapper, unparsable arguments kept as text, no escaping
    flat = {"role": "assistant", "content": "Voilà",
            "tool_calls": [{"name": "g", "arguments": "not json"},
                           {"name": "h", "arguments": {"q": "café"}}]}
    assert assistant_text(flat) == (
        'Voilà\n<tool_call>\n{"name": "g", "arguments": "not json"}\n</tool_call>\n'
        '<tool_call>\n{"name": "h", "arguments": {"q": "café"}}\n</tool_call>')


# ----- load_conversations ---------------------------------------------------------------------

def write_lines(path, *lines: str):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


GOOD = json.dumps(CONVERSATIONS[1])


def test_load_conversations_reads_every_line(tmp_path):
    path = write_lines(tmp_path / "demos.jsonl", *map(json.dumps, CONVERSATIONS), "",
                       json.dumps({"messages": CONVERSATIONS[1]["messages"], "reward": 2}))
    loaded = load_conversations(path)
    assert loaded == [*CONVERSATIONS, {"messages": CONVERSATIONS[1]["messages"], "reward": 2}]
    assert load_conversations(str(path)) == loaded  # a str path as well


BAD_LINES = {
    "{not json": r":2: not valid JSON \(",
    json.dumps({"reward": 1.0}): r':2: expected \{"messages": \[\.\.\.\], "reward": \.\.\.\}',
    json.dumps({"messages": "hello"}): r":2: expected \{\"messages\"",
    json.dumps([{"role": "user", "content": "x"}]): ":2: each line must be a JSON object",
    json.dumps({"messages": [{"content": "x"}]}): ":2: every message must be an object with "
                                                  "a role",
    json.dumps({"messages": [{"role": "user", "content": "x"}]}): ":2: no assistant turn to "
                                                                  "learn from",
    json.dumps({"messages": [{"role": "assistant", "content": "x"},
                             {"role": "user", "content": "y"}]}):
        r":2: the conversation must open with the task \(system/user messages\)",
    json.dumps({**CONVERSATIONS[1], "reward": "high"}): ":2: reward must be a number, got "
                                                        "'high'",
    json.dumps({**CONVERSATIONS[1], "reward": True}): ":2: reward must be a number, got True",
    json.dumps({**CONVERSATIONS[1], "reward": None}): ":2: reward must be a number, got None",
}


@pytest.mark.parametrize("line", list(BAD_LINES))
def test_a_bad_line_is_refused_with_its_line_number(tmp_path, line):
    path = write_lines(tmp_path / "demos.jsonl", GOOD, line, GOOD)
    with pytest.raises(ValueError, match=BAD_LINES[line]) as info:
        load_conversations(path)
    assert str(info.value).startswith(f"{path}:2: ") and "\n" not in str(info.value)


def test_a_gzipped_file_is_read_as_well(tmp_path):
    path = tmp_path / "demos.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps(c) + "\n" for c in CONVERSATIONS))
    assert load_conversations(path) == CONVERSATIONS


def test_blank_lines_count_in_the_line_numbers(tmp_path):
    path = write_lines(tmp_path / "demos.jsonl", GOOD, "", "   ", "{oops", GOOD)
    with pytest.raises(ValueError, match=r"demos\.jsonl:4: not valid JSON"):
        load_conversations(path)


def test_a_missing_or_empty_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"demonstrations file .*nope\.jsonl does not exist"):
        load_conversations(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="does not exist"):
        load_conversations(tmp_path)  # a directory is no file
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match=r"empty\.jsonl holds no conversations"):
        load_conversations(empty)
    write_lines(empty, "", "  ")
    with pytest.raises(ValueError, match="holds no conversations"):
        load_conversations(empty)


def test_two_assistant_turns_in_a_row_a_tool_opening_or_an_unknown_role_are_refused(tmp_path):
    user, a = {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "A."}
    for messages, why in (([user, a, a], "must be followed by the environment's answer"),
                          ([{"role": "tool", "content": "x"}, a], "must open with the task"),
                          ([user, a, {"role": "robot", "content": "x"}], "unknown roles")):
        with pytest.raises(ValueError, match=f":1: .*{why}"):
            load_conversations(write_lines(tmp_path / "demos.jsonl",
                                           json.dumps({"messages": messages})))


# ----- the replay -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = tiny_model(tmp_path_factory.mktemp("replay_model"), hidden_size=64, num_layers=1,
                      chat_template=COMPACT_TOOLS_TEMPLATE)
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def replayed(tok, tmp_path_factory):
    path = tmp_path_factory.mktemp("demos") / "demos.jsonl"
    write_lines(path, *map(json.dumps, CONVERSATIONS))
    convs = load_conversations(path)
    return collect_demonstrations(replay_env_factory(convs, [LOOKUP, ADD]), tok, replay_oracle,
                                  episodes=len(convs), max_new_tokens=64)


def test_each_turn_is_the_recorded_assistant_text_plus_end_of_turn(tok, replayed):
    assert len(replayed) == 2
    for conv, r in zip(CONVERSATIONS, replayed, strict=True):
        recorded = [m for m in conv["messages"] if m["role"] == "assistant"]
        acting = [(s, e) for bit, s, e in mask_runs(r.loss_mask) if bit == 1]
        assert len(acting) == len(recorded)
        for (s, e), message in zip(acting, recorded, strict=True):
            assert tok.decode(r.token_ids[s:e]) == assistant_text(message) + IM_END
            assert r.token_ids[s:e] == tok(assistant_text(message), add_special_tokens=False)[
                "input_ids"] + [tok.convert_tokens_to_ids(IM_END)]
        assert r.rollout_logprobs == [0.0] * len(r.token_ids)


def test_the_prompt_and_observations_are_the_recorded_messages(tok, replayed):
    first, second = replayed
    prompt_end = mask_runs(first.loss_mask)[0][2]
    assert tok.decode(first.token_ids[:prompt_end]) == tok.apply_chat_template(
        CONVERSATIONS[0]["messages"][:1], tools=[LOOKUP, ADD], add_generation_prompt=True,
        tokenize=False)
    for conv, r in zip(CONVERSATIONS, replayed, strict=True):
        assert [m for m in r.messages if m["role"] != "assistant"] == \
            [m for m in conv["messages"] if m["role"] != "assistant"]
    # what stands between the turns: the recorded answers as the template renders them
    between = [tok.decode(first.token_ids[s:e]) for bit, s, e in mask_runs(first.loss_mask)[1:]
               if bit == 0]
    assert between == [
        "\n<|im_start|>tool\n41 apples<|im_end|>\n<|im_start|>tool\n42<|im_end|>\n"
        "<|im_start|>assistant\n",
        "\n<|im_start|>tool\nok<|im_end|>\n<|im_start|>assistant\n",
    ]
    between = [tok.decode(second.token_ids[s:e]) for bit, s, e in mask_runs(second.loss_mask)[1:]
               if bit == 0]
    assert between == ["\n<|im_start|>user\nAgain.<|im_end|>\n<|im_start|>assistant\n"]
    assert tok.decode(second.token_ids[:mask_runs(second.loss_mask)[0][2]]).startswith(
        "<|im_start|>system\nBe brief.\n\nTools:\nlookup(key): Look up a key.\n"
        "add(a, b): Add two numbers.\n")


def test_the_reward_comes_on_the_last_turn(replayed):
    assert [r.reward for r in replayed] == [0.5, 1.0]
    assert all(r.terminated and not r.truncated and r.stop_reason is StopReason.TERMINATED
               and not r.infra_failure for r in replayed)
    assert [r.task_id for r in replayed] == ["demonstration-0", "demonstration-1"]


def test_the_recorded_tool_calls_come_back_parsed(replayed):
    def calls(messages):
        return [[(c["function"]["name"], c["function"]["arguments"])
                 for c in m.get("tool_calls") or []]
                for m in messages if m["role"] == "assistant"]

    def decoded(arguments):
        return json.loads(arguments) if isinstance(arguments, str) else arguments

    for conv, r in zip(CONVERSATIONS, replayed, strict=True):
        got, want = calls(r.messages), calls(conv["messages"])
        assert len(got) == len(want)
        for turn_got, turn_want in zip(got, want, strict=True):
            assert [(n, decoded(a)) for n, a in turn_got] == \
                [(n, decoded(a)) for n, a in turn_want]
    assert calls(replayed[0].messages)[0] == [("lookup", '{"key": "crate 7"}'),
                                              ("add", '{"a": 1, "b": 41}')]
    contents = [m["content"] for m in replayed[0].messages if m["role"] == "assistant"]
    assert contents == ["Let me look.", "", "42 apples."]


def test_more_episodes_than_conversations_cycle_and_own_tools_win(tok):
    own = {"messages": [{"role": "user", "content": "Go."},
                        {"role": "assistant", "content": "Gone."}],
           "tools": [ADD], "reward": 3}
    demos = collect_demonstrations(replay_env_factory([own, CONVERSATIONS[1]], [LOOKUP]), tok,
                                   replay_oracle, episodes=3, max_new_tokens=64)
    assert [d.task_id for d in demos] == ["demonstration-0", "demonstration-1",
                                          "demonstration-0"]
    assert [d.reward for d in demos] == [3.0, 1.0, 3.0]
    assert demos[0].token_ids == demos[2].token_ids
    prompt = tok.decode(demos[0].token_ids)
    assert "add(a, b): Add two numbers." in prompt and "lookup" not in prompt
    assert "lookup(key): Look up a key." in tok.decode(demos[1].token_ids)


def test_a_turn_longer_than_max_new_tokens_is_an_error(tok):
    with pytest.raises(RuntimeError, match="more than max_new_tokens=4"):
        collect_demonstrations(replay_env_factory(CONVERSATIONS[:1], [LOOKUP, ADD]), tok,
                               replay_oracle, episodes=1, max_new_tokens=4)
