"""The gateway's routes in ``sao-gym serve``'s app, called by the real ``openai`` client.

The app runs in-process on a real port over a tiny HFBackend; the client is
the official ``openai`` package, as an unmodified harness would use it.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from aiohttp.test_utils import TestServer

from sao_gym.inference.hf.backend import HFBackend
from sao_gym.inference.server import build_app
from sao_gym.learner.batching import token_logprobs

openai = pytest.importorskip("openai")

TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look up a key.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                   "required": ["key"]}}}]
MESSAGES = [{"role": "system", "content": "Find the value."},
            {"role": "user", "content": "What is behind key 7?"}]


@pytest.fixture
async def served(tiny_model_path):
    backend = HFBackend(tiny_model_path, max_batch_size=4, seed=0)
    app = build_app(backend, max_model_len=512, tokenizer=backend.tokenizer, keepalive_s=0.05)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield backend, f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()


def _client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)


def _forward_logprobs(model, ids: list[int], start: int) -> list[float]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits
    return token_logprobs(logits, torch.tensor([ids]))[0, start:].tolist()


async def test_a_chat_completion_returns_the_sampled_tokens_and_their_logprobs(served):
    backend, url = served
    client = _client(f"{url}/v1")
    reply = await client.chat.completions.create(
        model="policy", messages=MESSAGES, tools=TOOLS, max_tokens=12, seed=5, logprobs=True,
        extra_body={"return_token_ids": True})
    choice = reply.choices[0]
    data = reply.model_dump()
    prompt, sampled = data["prompt_token_ids"], data["choices"][0]["token_ids"]
    rendered = backend.tokenizer.apply_chat_template(MESSAGES, tools=TOOLS,
                                                     add_generation_prompt=True, tokenize=False)
    assert prompt == backend.tokenizer.encode(rendered, add_special_tokens=False)
    assert 1 <= len(sampled) <= 12 and reply.usage.completion_tokens == len(sampled)
    assert reply.usage.prompt_tokens == len(prompt)
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    stored = [c.logprob for c in choice.logprobs.content]
    fresh = _forward_logprobs(backend.model, prompt + sampled, len(prompt))
    assert len(stored) == len(sampled)
    assert max(abs(a - b) for a, b in zip(stored, fresh, strict=True)) < 1e-4
    assert all(math.isfinite(x) for x in stored)
    # streamed, with the same seed: the same tokens, in OpenAI's chunk events
    stream = await client.chat.completions.create(
        model="policy", messages=MESSAGES, tools=TOOLS, max_tokens=12, seed=5, stream=True,
        stream_options={"include_usage": True}, extra_body={"return_token_ids": True})
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].model_dump()["choices"][0]["token_ids"] == sampled
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        choice.message.content or "")
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert chunks[-1].usage.completion_tokens == len(sampled)


async def test_an_episode_keeps_one_exact_sequence_over_its_calls(served):
    import aiohttp

    backend, url = served
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/episodes", json={"id": "ep-1"}) as r:
            assert r.status == 201
            opened = await r.json()
        assert opened == {"id": "ep-1", "base_url": "/episodes/ep-1/v1"}
        client = _client(url + opened["base_url"])
        assert [m.id for m in (await client.models.list()).data] == ["policy"]
        first = await client.chat.completions.create(
            model="policy", messages=MESSAGES, tools=TOOLS, max_tokens=8, seed=1,
            extra_body={"return_token_ids": True})
        reply = first.choices[0].message.model_dump(exclude_none=True)
        answer = {"role": "user", "content": "Look again."}
        second = await client.chat.completions.create(
            model="policy", messages=[*MESSAGES, reply, answer], tools=TOOLS, max_tokens=8,
            seed=2, extra_body={"return_token_ids": True})
        one, two = first.model_dump(), second.model_dump()
        # the second prompt starts with the first prompt and its sampled tokens, exactly
        prefix = one["prompt_token_ids"] + one["choices"][0]["token_ids"]
        assert two["prompt_token_ids"][:len(prefix)] == prefix
        async with http.delete(f"{url}/episodes/ep-1") as r:
            record = await r.json()
        [segment] = record["segments"]
        assert record["calls"] == 2
        assert segment["token_ids"] == two["prompt_token_ids"] + two["choices"][0]["token_ids"]
        mask = segment["loss_mask"]
        assert sum(mask) == len(one["choices"][0]["token_ids"]) + len(
            two["choices"][0]["token_ids"])
        starts = [i for i in range(len(mask)) if mask[i] and (i == 0 or not mask[i - 1])]
        assert starts == [len(one["prompt_token_ids"]), len(two["prompt_token_ids"])]
        fresh = _forward_logprobs(backend.model, segment["token_ids"], 0)
        stored = segment["logprobs"]
        assert max(abs(stored[i] - fresh[i]) for i in range(len(mask)) if mask[i]) < 1e-4
        # the episode has ended: its calls get 409; an unknown one, 404
        with pytest.raises(openai.ConflictError, match="has ended"):
            await client.chat.completions.create(model="policy", messages=MESSAGES)
        with pytest.raises(openai.NotFoundError, match="no episode"):
            await _client(f"{url}/episodes/nope/v1").chat.completions.create(
                model="policy", messages=MESSAGES)
        async with http.post(f"{url}/episodes", json={"id": "ep-1"}) as r:
            assert r.status == 409


async def test_bad_requests_get_openai_errors_naming_the_field(served):
    import aiohttp

    _, url = served
    client = _client(f"{url}/v1")
    with pytest.raises(openai.BadRequestError) as e:
        await client.chat.completions.create(model="policy", messages=MESSAGES,
                                             response_format={"type": "json_object"})
    assert e.value.body["param"] == "response_format"
    assert e.value.body["code"] == "unsupported_parameter"
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/chat/completions", data=b"{not json") as r:
            assert r.status == 400 and "not JSON" in (await r.json())["error"]["message"]
        async with http.post(f"{url}/episodes", json={"id": 3}) as r:
            assert r.status == 400


async def test_oversized_bodies_and_bad_rewards_get_json_errors(served):
    import aiohttp

    from sao_gym.gateway.app import MAX_BODY

    _, url = served
    async with aiohttp.ClientSession() as http:
        big = b'{"model": "policy", "messages": "' + b"x" * MAX_BODY + b'"}'
        async with http.post(f"{url}/v1/chat/completions", data=big,
                             headers={"Content-Type": "application/json"}) as r:
            body = await r.json()
            assert r.status == 413 and body["error"]["code"] == "request_too_large"
            assert str(MAX_BODY) in body["error"]["message"]
        async with http.post(f"{url}/episodes/nope/reward", json={"reward": 1}) as r:
            assert r.status == 404 and (await r.json())["error"]["code"] == "episode_not_found"
        async with http.post(f"{url}/episodes", json={"id": "e1"}) as r:
            assert r.status == 201
        for bad in ({"reward": "high"}, {"reward": float("inf")}, {"score": 1}, [1]):
            async with http.post(f"{url}/episodes/e1/reward",
                                 data=json.dumps(bad, allow_nan=True)) as r:
                assert r.status == 400, bad
                assert (await r.json())["error"]["param"] == "reward"
        async with http.post(f"{url}/episodes/e1/reward", json={"reward": 0.5}) as r:
            assert r.status == 200 and (await r.json()) == {"id": "e1", "reward": 0.5}
        async with http.delete(f"{url}/episodes/e1") as r:
            assert r.status == 200
        async with http.post(f"{url}/episodes/e1/reward", json={"reward": 1}) as r:
            assert r.status == 409
