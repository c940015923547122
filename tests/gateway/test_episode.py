"""ChatEpisode: chat calls stitched into exact token segments (scripted sampler, real tokenizer)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from sao_gym.agents import LLMAgent
from sao_gym.gateway.episode import ChatEpisode
from sao_gym.gateway.request import GatewayError, parse_chat_request
from sao_gym.inference.scripted import ScriptedBackend
from sao_gym.models import IM_END
from sao_gym.types import Generation

TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look up a key.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                   "required": ["key"]}}}]
SYSTEM = {"role": "system", "content": "Find the value."}
USER = {"role": "user", "content": "What is behind key 7?"}


@pytest.fixture(scope="module")
def tok(tiny_model_path):
    return AutoTokenizer.from_pretrained(tiny_model_path)


def _split_word(tok) -> tuple[str, list[int]]:
    """A word the tokenizer writes as one token, and ids that spell it piece by piece."""
    for token, token_id in sorted(tok.get_vocab().items(), key=lambda kv: kv[1]):
        text = tok.convert_tokens_to_string([token])
        if len(text) >= 3 and text.isalpha() and tok.encode(text, add_special_tokens=False) == [
                token_id]:
            pieces = [i for ch in text for i in tok.encode(ch, add_special_tokens=False)]
            if pieces != [token_id]:
                return text, pieces
    raise AssertionError("no merged word in the vocabulary")


def _gen(ids: list[int], version: int = 0) -> Generation:
    return Generation(ids, [-0.5 - 0.01 * i for i in range(len(ids))], "stop", [version] * len(ids))


def _request(messages, **kw):
    return parse_chat_request({"model": "policy", "messages": messages, "tools": TOOLS, **kw},
                              models=("policy",))


async def test_calls_that_extend_the_history_record_what_an_llm_agent_records(tok):
    """Two calls of a harness (tool call, tool answer, final text) give the very tokens an
    LLMAgent records for the same conversation; the reply the harness echoes back is a word
    whose text re-tokenizes differently, and the record keeps the sampled pieces."""
    end = tok.convert_tokens_to_ids(IM_END)
    word, pieces = _split_word(tok)
    first = tok.encode('lookup("7")', add_special_tokens=False) + [end]
    second = pieces + [end]
    outputs = [_gen(first, 0), _gen(second, 1)]

    episode = ChatEpisode(ScriptedBackend(list(outputs)), tok, max_context_tokens=4096)
    one = await episode.complete(_request([SYSTEM, USER]))
    assert one.message["tool_calls"][0]["function"]["name"] == "lookup"
    assert one.finish_reason == "tool_calls" and one.segment == 0
    tool = {"role": "tool", "tool_call_id": one.message["tool_calls"][0]["id"],
            "content": "value 12"}
    two = await episode.complete(_request([SYSTEM, USER, one.message, tool]))
    assert two.message == {"role": "assistant", "content": word} and two.segment == 0
    assert two.finish_reason == "stop"

    agent = LLMAgent(ScriptedBackend(list(outputs)), tok, max_new_tokens=4096)
    agent.reset([SYSTEM, USER], {"tools": TOOLS})
    await agent.act()
    agent.observe([tool])
    await agent.act()
    [record] = episode.segments()
    expected = agent.trajectory()
    assert record.token_ids == expected.token_ids
    assert record.loss_mask == expected.loss_mask and record.logprobs == expected.logprobs
    assert record.policy_versions == expected.policy_versions
    # the sampled pieces are in the record, as sampled, and they end it
    assert record.token_ids[-len(second):] == second and all(record.loss_mask[-len(second):])
    assert tok.encode(word, add_special_tokens=False) != pieces  # re-tokenizing would differ
    assert two.prompt_ids == record.token_ids[:len(record.token_ids) - len(second)]


async def test_a_rewritten_history_starts_a_segment(tok):
    end = tok.convert_tokens_to_ids(IM_END)
    reply = tok.encode('lookup("7")', add_special_tokens=False) + [end]
    episode = ChatEpisode(ScriptedBackend([_gen(reply), _gen(reply), _gen(reply)]), tok,
                          max_context_tokens=4096)
    one = await episode.complete(_request([SYSTEM, USER]))
    tool = {"role": "tool", "tool_call_id": one.message["tool_calls"][0]["id"],
            "content": "value 12"}
    summary = {"role": "user", "content": "Earlier: key 7 holds 12. Submit it."}
    two = await episode.complete(_request([SYSTEM, summary]))  # the harness summarised
    assert two.segment == 1
    three = await episode.complete(_request([SYSTEM, summary, two.message, tool]))
    assert three.segment == 1  # and the new segment goes on
    first, second = episode.segments()
    prompt = tok.encode(tok.apply_chat_template([SYSTEM, summary], tools=TOOLS,
                                                add_generation_prompt=True, tokenize=False),
                        add_special_tokens=False)
    assert second.token_ids[:len(prompt)] == prompt and not any(second.loss_mask[:len(prompt)])
    assert first.token_ids[-len(reply):] == reply and sum(first.loss_mask) == len(reply)
    assert sum(second.loss_mask) == 2 * len(reply)


@pytest.mark.parametrize("change", ["tools", "assistant"])
async def test_other_tools_or_a_turn_of_the_harness_start_a_segment(tok, change):
    end = tok.convert_tokens_to_ids(IM_END)
    reply = tok.encode('lookup("7")', add_special_tokens=False) + [end]
    episode = ChatEpisode(ScriptedBackend([_gen(reply), _gen(reply)]), tok,
                          max_context_tokens=4096)
    one = await episode.complete(_request([SYSTEM, USER]))
    tool = {"role": "tool", "tool_call_id": one.message["tool_calls"][0]["id"], "content": "12"}
    if change == "tools":
        body = {"model": "policy", "messages": [SYSTEM, USER, one.message, tool]}
    else:
        body = {"model": "policy", "tools": TOOLS, "messages": [
            SYSTEM, USER, one.message, tool, {"role": "assistant", "content": "thinking"},
            {"role": "user", "content": "go on"}]}
    two = await episode.complete(parse_chat_request(body, models=("policy",)))
    assert two.segment == 1 and len(episode.segments()) == 2


async def test_tool_choice_none_answers_text_and_a_full_context_is_an_error(tok):
    end = tok.convert_tokens_to_ids(IM_END)
    reply = tok.encode('lookup("7")', add_special_tokens=False) + [end]
    episode = ChatEpisode(ScriptedBackend([_gen(reply)]), tok, max_context_tokens=4096)
    done = await episode.complete(_request([SYSTEM, USER], tool_choice="none"))
    assert done.message == {"role": "assistant", "content": 'lookup("7")'}
    assert done.finish_reason == "stop"
    small = ChatEpisode(ScriptedBackend([_gen(reply)]), tok, max_context_tokens=8)
    with pytest.raises(GatewayError, match="does not fit the context of 8") as e:
        await small.complete(_request([SYSTEM, USER]))
    assert e.value.code == "context_length_exceeded" and e.value.status == 400


async def test_a_stop_string_ends_the_reply_and_the_record_keeps_the_tokens_up_to_it(tok):
    """The sampler runs past "END"; the reply's text ends before it, the record keeps the
    sampled tokens up to the one completing it (a prefix of the generation, logprobs and
    versions alike), and the next call continues from there (no segment)."""
    end = tok.convert_tokens_to_ids(IM_END)
    head = tok.encode("The answer is 12", add_special_tokens=False)
    stop = tok.encode(" END", add_special_tokens=False)
    tail = tok.encode(" and more text", add_special_tokens=False)
    sampled = _gen(head + stop + tail + [end])
    later = _gen(tok.encode("ok", add_special_tokens=False) + [end], version=1)
    episode = ChatEpisode(ScriptedBackend([sampled, later]), tok, max_context_tokens=4096)
    one = await episode.complete(_request([SYSTEM, USER], stop=["END", "never"]))
    assert one.message == {"role": "assistant", "content": "The answer is 12"}
    assert one.finish_reason == "stop"
    kept = len(head) + len(stop)
    assert one.generation.token_ids == (head + stop)
    assert one.generation.logprobs == sampled.logprobs[:kept]
    record = episode.segments()[0]
    actions = [t for t, m in zip(record.token_ids, record.loss_mask, strict=True) if m]
    assert actions == head + stop
    two = await episode.complete(_request([SYSTEM, USER, one.message,
                                           {"role": "user", "content": "go on"}]))
    assert two.segment == 0 and len(episode.segments()) == 1
    # the turn's close (never sampled) is part of the observation delta, masked
    record = episode.segments()[0]
    between = record.token_ids[len(two.prompt_ids) - 10:len(two.prompt_ids)]
    assert end in between
    assert record.loss_mask[record.token_ids.index(end, len(one.prompt_ids))] == 0
