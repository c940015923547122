"""LLMAgent: token exactness, tool-call parsing, context budget, batching."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import sao_gym
from sao_gym.agents import LLMAgent
from sao_gym.evaluation import run_episodes
from sao_gym.inference import ScriptedBackend
from sao_gym.types import StopReason

IM_END = "<|im_end|>"


@pytest.fixture(scope="module")
def tok(tiny_model_path):
    return AutoTokenizer.from_pretrained(tiny_model_path)


def enc(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def chatml(messages):
    """Hand-written ChatML rendering of observation messages (the expected delta)."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}{IM_END}\n" for m in messages) + \
        "<|im_start|>assistant\n"


def tool_call_text(name, args):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


async def test_scripted_episode_is_token_exact(tok):
    env = sao_gym.make("sao_gym/Arithmetic-v0")
    g1 = enc(tok, tool_call_text("calculator", {"expression": "2+3"}) + IM_END)
    g2 = enc(tok, "The answer:\n" + tool_call_text("submit", {"answer": "5"}) + IM_END)
    backend = ScriptedBackend([g1, g2], logprob=-0.25, policy_version=7)
    agent = LLMAgent(backend, tok, max_new_tokens=64)
    r = await sao_gym.run_episode(env, agent, seed=0, options={"task": {"expression": "2 + 3"}})

    assert (r.reward, r.terminated, r.stop_reason) == (1.0, True, StopReason.TERMINATED)
    obs0, _info0 = [m for m in r.messages[:2]], None
    prompt = enc(tok, tok.apply_chat_template(obs0, tools=env.unwrapped.tool_schemas(),
                                              add_generation_prompt=True, tokenize=False))
    delta = enc(tok, "\n" + chatml([{"role": "tool", "content": "5"}]))
    assert r.token_ids == prompt + g1 + delta + g2
    assert r.loss_mask == [0] * len(prompt) + [1] * len(g1) + [0] * len(delta) + [1] * len(g2)
    assert r.rollout_logprobs == [0.0] * len(prompt) + [-0.25] * len(g1) + \
        [0.0] * len(delta) + [-0.25] * len(g2)
    assert set(r.policy_versions) == {-1, 7}
    # the backend saw the running sequence, never a re-tokenized history
    assert backend.calls[0].prompt_ids == prompt
    assert backend.calls[1].prompt_ids == prompt + g1 + delta
    # parsed messages
    calls = r.messages[2]["tool_calls"]
    assert calls[0]["function"] == {"name": "calculator", "arguments": '{"expression": "2+3"}'}
    assert r.messages[4]["content"] == "The answer:"
    assert r.messages[-1] == {"role": "tool", "tool_call_id": calls[0]["id"].replace("1_", "2_"),
                              "name": "submit", "content": "Correct."}


async def test_generation_cut_by_length_is_closed_by_the_observation(tok):
    env = sao_gym.make("sao_gym/Arithmetic-v0", max_episode_steps=2)
    g1 = enc(tok, "I am thinking about")  # no stop token: finish_reason "length"
    backend = ScriptedBackend([g1, enc(tok, "hm" + IM_END)])
    r = await sao_gym.run_episode(env, LLMAgent(backend, tok), seed=0)
    assert r.stop_reason is StopReason.MAX_TURNS and r.truncated
    start = len(backend.calls[0].prompt_ids) + len(g1)
    delta = r.token_ids[start:len(backend.calls[1].prompt_ids)]
    err = r.messages[3]["content"]
    assert tok.decode(delta) == IM_END + "\n" + chatml([{"role": "user", "content": err}])


async def test_a_truncated_episode_ends_where_its_next_action_would_start(tok):
    """The turn limit's final observation is in the token record, rendered exactly as the
    next turn would prefill it; a terminated episode's last observation is not."""
    env = sao_gym.make("sao_gym/Arithmetic-v0", max_episode_steps=2)
    g = enc(tok, tool_call_text("calculator", {"expression": "2+3"}) + IM_END)
    backend = ScriptedBackend([g, g])
    r = await sao_gym.run_episode(env, LLMAgent(backend, tok), seed=0)
    assert r.stop_reason is StopReason.MAX_TURNS and r.truncated
    second = backend.calls[1].prompt_ids
    tail = r.token_ids[len(second) + len(g):]
    assert tok.decode(tail) == "\n" + chatml([r.messages[-1]])  # ends "...assistant\n"
    assert r.token_ids == second + g + tail and r.loss_mask[-len(tail):] == [0] * len(tail)
    assert r.rollout_logprobs[-len(tail):] == [0.0] * len(tail)
    assert r.policy_versions[-len(tail):] == [-1] * len(tail)
    assert [m["role"] for m in r.messages].count("tool") == 2  # kept once, not twice

    env = sao_gym.make("sao_gym/Arithmetic-v0")
    done = enc(tok, tool_call_text("submit", {"answer": "5"}) + IM_END)
    backend = ScriptedBackend([done])
    r = await sao_gym.run_episode(env, LLMAgent(backend, tok), seed=0,
                                  options={"task": {"expression": "2 + 3"}})
    assert r.terminated and r.token_ids == backend.calls[0].prompt_ids + done
    assert r.messages[-1]["content"] == "Correct."


async def test_context_budget_caps_and_truncates(tok):
    env = sao_gym.make("sao_gym/Arithmetic-v0")
    obs, info = await env.areset(seed=0)
    prompt_len = len(enc(tok, tok.apply_chat_template(
        obs, tools=info["tools"], add_generation_prompt=True, tokenize=False)))
    # the second turn's prompt without a budget: the first turn and its observation
    probe = ScriptedBackend(lambda p, params: enc(tok, "x " * 200))
    await sao_gym.run_episode(env, LLMAgent(probe, tok, max_new_tokens=30), seed=0)
    second_prompt = len(probe.calls[1].prompt_ids)
    assert second_prompt > prompt_len + 30
    backend = ScriptedBackend(lambda p, params: enc(tok, "x " * 200))
    budget = second_prompt + 15
    agent = LLMAgent(backend, tok, max_new_tokens=30, max_context_tokens=budget)
    r = await sao_gym.run_episode(env, agent, seed=0)
    assert backend.calls[0].params.max_new_tokens == 30
    room = budget - len(backend.calls[1].prompt_ids)
    assert room == 15 and backend.calls[1].params.max_new_tokens == room
    assert (r.stop_reason, r.truncated, r.infra_failure) == (StopReason.MAX_TOKENS, True, False)
    assert len(r.token_ids) <= budget  # the observation that did not fit is not appended


def test_agent_rejects_templates_it_cannot_use(tok, tiny_model_path):
    bare = AutoTokenizer.from_pretrained(tiny_model_path)
    bare.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        LLMAgent(ScriptedBackend([]), bare)
    rev = AutoTokenizer.from_pretrained(tiny_model_path)
    rev.chat_template = ("{% for m in messages|reverse %}<|im_start|>{{ m.role }}\n"
                         "{{ m.content }}<|im_end|>\n{% endfor %}")
    agent = LLMAgent(ScriptedBackend([enc(tok, "a" + IM_END)]), rev)
    agent.reset([{"role": "user", "content": "q"}], {})
    agent.observe([{"role": "user", "content": "more"}])
    import asyncio

    with pytest.raises(ValueError, match="prefix-stable"):
        asyncio.run(agent.act())


def _forward_logprobs(model, token_ids, temperature):
    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits[0].double()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return [0.0] + [logp[t - 1, token_ids[t]].item() for t in range(1, len(token_ids))]


class Recorder:
    """Wraps a backend and keeps each call's prompt and generation."""

    def __init__(self, inner):
        self.inner, self.log = inner, []

    async def generate(self, prompt_ids, params):
        gen = await self.inner.generate(prompt_ids, params)
        self.log.append((list(prompt_ids), gen))
        return gen


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_five_turn_episode_matches_a_fresh_forward_pass(tiny_model_path, tok, temperature):
    from sao_gym.inference.hf.backend import HFBackend

    backend = HFBackend(tiny_model_path, seed=0)
    rec = Recorder(backend)
    env = sao_gym.make("sao_gym/Arithmetic-v0", max_episode_steps=5)
    agent = LLMAgent(rec, tok, max_new_tokens=12, temperature=temperature, seed=1)
    try:
        r = await sao_gym.run_episode(env, agent, seed=3)
    finally:
        await backend.aclose()
    assert r.metrics["turns"] == 5 and r.stop_reason is StopReason.MAX_TURNS

    # token_ids = prompt + each turn's sampled tokens + observation deltas
    expected = list(rec.log[0][0])
    obs_msgs = [m for m in r.messages[2:] if m["role"] != "assistant"]
    for i, (prompt, gen) in enumerate(rec.log):
        assert prompt == expected, f"turn {i}: the prompt is not the running sequence"
        expected += gen.token_ids
        closing = "\n" if gen.finish_reason == "stop" else IM_END + "\n"
        delta = enc(tok, closing + chatml([obs_msgs[i]]))
        if i + 1 < len(rec.log):
            assert tok.decode(rec.log[i + 1][0][len(expected):]) == tok.decode(delta)
        expected += delta  # after the last turn: the turn limit's final observation
    assert r.token_ids == expected
    assert sum(r.loss_mask) == sum(len(g.token_ids) for _, g in rec.log)

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    ref = _forward_logprobs(model, r.token_ids, temperature)
    diffs = [abs(a - b) for a, b, m in zip(r.rollout_logprobs, ref, r.loss_mask, strict=False) if m]
    assert len(diffs) >= 5 and max(diffs) < 1e-4


async def test_concurrent_episodes_are_batched_and_equal_unbatched_greedy(tiny_model_path, tok):
    from sao_gym.inference.hf.backend import HFBackend

    def agent_for(backend):
        return lambda: LLMAgent(backend, tok, max_new_tokens=8, temperature=0.0)

    def make_env():
        return sao_gym.make("sao_gym/Arithmetic-v0", max_episode_steps=3)

    batched = HFBackend(tiny_model_path, dtype="float64", max_batch_size=16)
    try:
        together = await run_episodes(make_env, agent_for(batched), 16, concurrency=16)
        assert batched.stats.max_batch_size > 1
    finally:
        await batched.aclose()
    alone_backend = HFBackend(tiny_model_path, dtype="float64", max_batch_size=1)
    try:
        alone = await run_episodes(make_env, agent_for(alone_backend), 16, concurrency=1)
        assert alone_backend.stats.max_batch_size == 1
    finally:
        await alone_backend.aclose()
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert [r.messages for r in together] == [r.messages for r in alone]


# ------------------------------------------------------------ tool-call format


def _reset(tok, env_id="sao_gym/Arithmetic-v0", **agent_kwargs):
    env = sao_gym.make(env_id)
    obs, info = env.reset(seed=0)
    env.close()
    agent = LLMAgent(ScriptedBackend([]), tok, **agent_kwargs)
    agent.reset(obs, info)
    return agent, info


def test_a_turn_is_written_in_the_templates_tool_call_format(tok):
    agent, _ = _reset(tok)
    written = agent.as_template_writes("calculator(2+3)")
    assert written == tool_call_text("calculator", {"expression": "2+3"})
    # content before the call stays, and the parser reads the written turn back
    both = agent.as_template_writes("Adding.\nsubmit(5)")
    assert both == "Adding.\n" + tool_call_text("submit", {"answer": "5"})
    fn = agent._parse(both, id_prefix="c")["tool_calls"][0]["function"]
    assert (fn["name"], json.loads(fn["arguments"])) == ("submit", {"answer": "5"})
    # a turn already in the template's format, or with no call, is unchanged
    assert agent.as_template_writes(written) == written
    assert agent.as_template_writes("I do not know.") == "I do not know."


def test_signature_tool_schemas_drop_what_a_python_signature_cannot_carry(tok):
    agent_env, info = _reset(tok, "sao_gym/KeyChain-v0")
    agent_sig, _ = _reset(tok, "sao_gym/KeyChain-v0", tool_schemas="signature")
    assert any(t["function"]["parameters"].get("additionalProperties") is False
               for t in info["tools"])
    prompt_env, prompt_sig = (tok.decode(a.trajectory().token_ids)
                              for a in (agent_env, agent_sig))
    assert '"additionalProperties": false' in prompt_env
    assert '"additionalProperties"' not in prompt_sig
    assert prompt_sig.replace("}}}", "") == prompt_env.replace(
        ', "additionalProperties": false', "").replace("}}}", "")
    # calls are still parsed against the env's own schemas
    assert agent_sig._parse("lookup(4817)", id_prefix="c")["tool_calls"][0]["function"][
        "name"] == "lookup"
    with pytest.raises(ValueError, match="tool_schemas"):
        LLMAgent(ScriptedBackend([]), tok, tool_schemas="python")


def test_signature_schemas_refuse_a_tool_no_python_function_can_be(tok):
    tool = {"type": "function", "function": {
        "name": "fetch", "description": "Fetch.", "parameters": {
            "type": "object", "properties": {"max-bytes": {"type": "integer"}}}}}
    obs = [{"role": "user", "content": "go"}]
    LLMAgent(ScriptedBackend([]), tok).reset(obs, {"tools": [tool]})  # env: shown as is
    with pytest.raises(ValueError, match="'max-bytes' is not a Python parameter name"):
        LLMAgent(ScriptedBackend([]), tok, tool_schemas="signature").reset(obs, {"tools": [tool]})
