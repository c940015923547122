"""The TRL adapter against the real TRL 1.16 (the `trl` extra, in the test venv)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import sys

import pytest

import sao_gym
from sao_gym.adapters.callables import comparable
from sao_gym.adapters.trl import SaoGymTRLEnv, environment, environment_class
from sao_gym.agents.scripted import ScriptedAgent
from sao_gym.agents.tool_parser import parse_tool_calls
from sao_gym.envs.arithmetic.oracle import arithmetic_oracle

trl = pytest.importorskip("trl", reason="the `trl` extra is not installed")
from transformers.utils import get_json_schema  # noqa: E402

# The built-in envs that stand alone (the adapter envs wrap other servers or task dirs).
BUILT_IN = ["sao_gym/Arithmetic-v0", "sao_gym/MathTIR-v0", "sao_gym/CoqProof-v0",
            "sao_gym/CodeRepo-v0", "sao_gym/HeavyTail-v0"]
ORACLE = functools.partial(arithmetic_oracle, slip_rate=0.3)


def trl_tools(instance: object) -> list:
    """The tools GRPOTrainer takes from an environment instance, as its __init__ does."""
    return [getattr(instance, name)
            for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
            if name not in ("reset", "get_reward") and not name.startswith("_")]


@pytest.mark.parametrize("env_id", BUILT_IN)
def test_schemas_trl_derives_equal_the_env_tools(env_id):
    env = sao_gym.make(env_id)
    try:
        _, info = env.reset(seed=0)
    finally:
        env.close()
    expected = info.get("tools") or []
    cls = environment_class(env_id, expected)
    methods = trl_tools(cls.__new__(cls))  # no env built: only the class is read
    derived = {m.__name__: get_json_schema(m) for m in methods}
    assert sorted(derived) == sorted(t["function"]["name"] for t in expected)
    for schema in expected:
        got = derived[schema["function"]["name"]]
        assert comparable(got) == comparable(schema)
        raw = json.loads(json.dumps(schema["function"]))
        raw["parameters"].pop("additionalProperties", None)
        if not any(isinstance(p.get("type"), list)
                   for p in raw["parameters"]["properties"].values()):
            # Without type lists (whose order get_json_schema sorts), only the top-level
            # additionalProperties differs: the rest is equal as is, `required` order included.
            assert got["function"] == raw


@pytest.mark.parametrize("env_id", [*BUILT_IN, "sao_gym/KeyChain-v0"])
def test_the_agent_with_signature_schemas_prompts_as_grpo_trainer_does(env_id, tiny_model_path):
    """``rollout.tool_schemas: signature``: the prompt the agent samples from is, token
    for token, the one GRPOTrainer renders from the adapter's methods, so a model
    warm-started by sao-gym sees in TRL the prompt it was trained on."""
    from transformers import AutoTokenizer

    from sao_gym.agents import LLMAgent
    from sao_gym.inference import ScriptedBackend

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    row = environment(env_id, seeds=[5]).train_dataset[0]
    env = sao_gym.make(env_id)
    try:
        obs, info = env.reset(seed=row["seed"])
    finally:
        env.close()
    cls = environment_class(env_id, info.get("tools") or [])
    trl_prompt = tok.apply_chat_template(row["prompt"], tools=trl_tools(cls.__new__(cls)) or None,
                                         add_generation_prompt=True, tokenize=False)
    prompts = {}
    for schemas in ("env", "signature"):
        agent = LLMAgent(ScriptedBackend([]), tok, tool_schemas=schemas)
        agent.reset(obs, info)
        prompts[schemas] = agent.trajectory().token_ids
    assert prompts["signature"] == tok(trl_prompt, add_special_tokens=False)["input_ids"]
    strict = any(t["function"]["parameters"].get("additionalProperties") is False
                 for t in info.get("tools") or [])
    assert (prompts["env"] != prompts["signature"]) == strict


def test_no_helper_method_leaks_as_a_tool():
    env = environment("sao_gym/Arithmetic-v0", seeds=[0])
    names = [m.__name__ for m in trl_tools(env.environment_factory.__new__(
        env.environment_factory))]
    assert sorted(names) == ["calculator", "submit"]
    public_base = [n for n, _ in inspect.getmembers(SaoGymTRLEnv, inspect.isfunction)
                   if not n.startswith("_")]
    assert public_base == ["reset"]


@pytest.mark.parametrize("name", ["reset", "get_reward", "_hidden"])
def test_reserved_tool_names_are_refused(name):
    schema = {"type": "function", "function": {"name": name, "description": "x",
                                               "parameters": {"type": "object"}}}
    with pytest.raises(ValueError, match=name):
        environment_class("x/Y-v0", [schema])


def oracle_message(messages, task, tools):
    """The oracle's next turn as an assistant message with parsed tool calls."""
    content, calls = parse_tool_calls(ORACLE(messages, task), tools)
    return {"role": "assistant", "content": content or None, "tool_calls": calls}


async def native_reward(seed: int) -> tuple[float, bool]:
    env = sao_gym.make("sao_gym/Arithmetic-v0")
    holder = {}

    def policy(messages):
        return oracle_message(messages, env.unwrapped.task, holder["tools"])

    agent = ScriptedAgent(policy)
    original = agent.reset
    agent.reset = lambda obs, info: (holder.update(tools=info["tools"]), original(obs, info))
    rollout = await sao_gym.run_episode(env, agent, seed=seed)
    await env.aclose()
    return rollout.reward, rollout.terminated


def drive_like_trl(instance, row, tools, max_turns=8):
    """GRPOTrainer's loop: reset(**row), tool(**arguments), str() results; a final text turn."""
    assert instance.reset(**row) is None
    messages = list(row["prompt"])
    task = instance._session.env.unwrapped.task
    completion = []
    for _ in range(max_turns):
        message = oracle_message(messages, task, tools)
        if instance._session.done:  # the model has submitted: it answers in text and stops
            message = {"role": "assistant", "content": "Done."}
        messages.append(message)
        completion.append(message)
        if not message.get("tool_calls"):
            break
        for call in message["tool_calls"]:
            fn = call["function"]
            result = getattr(instance, fn["name"])(**json.loads(fn["arguments"]))
            tool_msg = {"role": "tool", "name": fn["name"], "content": str(result)}
            messages.append(tool_msg)
            completion.append(tool_msg)
    return completion


async def test_oracle_through_the_factory_scores_as_run_episode():
    seeds = list(range(100, 120))
    env = environment("sao_gym/Arithmetic-v0", seeds=seeds)
    pool = [env.environment_factory() for _ in range(4)]  # TRL reuses instances across rows
    trl_rewards = []
    for i, row in enumerate(env.train_dataset):
        instance = pool[i % len(pool)]
        completion = await asyncio.to_thread(drive_like_trl, instance, row, env.tools)
        [reward] = await asyncio.to_thread(env.reward_funcs[0], completions=[completion],
                                           environments=[instance])
        trl_rewards.append(reward)
    native = [await native_reward(s) for s in seeds]
    assert trl_rewards == [r for r, _ in native]
    assert all(t for _, t in native)
    assert 0.0 in trl_rewards and 1.0 in trl_rewards  # the slips make both outcomes occur
    for instance in pool:
        instance._session.close()


def test_dataset_rows_carry_the_env_prompt_and_seed():
    env = environment("sao_gym/Arithmetic-v0", seeds=[3, 4])
    native = sao_gym.make("sao_gym/Arithmetic-v0")
    obs, _ = native.reset(seed=4)
    native.close()
    row = env.train_dataset[1]
    assert row["seed"] == 4
    assert row["prompt"] == [{"role": m["role"], "content": m["content"]} for m in obs]
    assert row["prompt"][0]["role"] == "system"


def test_bad_calls_are_error_text_not_exceptions():
    env = environment("sao_gym/Arithmetic-v0", seeds=[0])
    instance = env.environment_factory()
    instance.reset(**env.train_dataset[0])
    assert instance.calculator(expression=5).startswith("Error")  # wrong type
    assert "unexpected argument" in instance.submit(answer=1, extra=2)
    assert "missing required" in instance.submit()
    instance._session.close()


def test_text_env_final_answer_is_scored():
    env = environment("sao_gym/HeavyTail-v0", seeds=[0], latency_median_s=0.0,
                      turns_median=1.0, turns_sigma=0.0)
    instance = env.environment_factory()
    assert trl_tools(instance) == []
    rewards = []
    for text in ("ab", "abc"):
        instance.reset(**env.train_dataset[0])
        rewards += env.reward_funcs[0](completions=[[{"role": "assistant", "content": text}]],
                                       environments=[instance])
    assert rewards == [1.0, 0.0]
    instance._session.close()


def test_infra_failure_is_excluded_not_zero(monkeypatch):
    env = environment("sao_gym/Arithmetic-v0", seeds=[0])
    instance = env.environment_factory()
    instance.reset(**env.train_dataset[0])

    async def broken(action):
        raise RuntimeError("sandbox died")

    monkeypatch.setattr(instance._session.env, "astep", broken)
    assert "sandbox died" in instance.calculator(expression="1+1")
    assert env.reward_funcs[0](completions=[[]], environments=[instance]) == [None]
    instance._session.close()


def teach_the_call_format(model, tokenizer, env, steps=200):
    """A few SFT steps on `submit` calls (answer 0 or 1 at random) in the Qwen3 format.

    The tasks of ``num_operands=1, max_value=1`` are "What is 0?" and "What is 1?",
    so a model that calls submit with a random bit scores about half the time: the
    rewards of a group differ and GRPO has a gradient.
    """
    import torch

    rng = torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rows = list(env.train_dataset)
    cls = env.environment_factory
    tools = trl_tools(cls.__new__(cls))  # rendered as TRL renders them (its schemas, not ours)
    for step in range(steps):
        row = rows[step % len(rows)]
        bit = int(torch.randint(0, 2, (1,), generator=rng))
        call = {"type": "function", "function": {"name": "submit", "arguments": {"answer": bit}}}
        prompt = tokenizer.apply_chat_template(row["prompt"], tools=tools, tokenize=False,
                                               add_generation_prompt=True)
        full = tokenizer.apply_chat_template(
            row["prompt"] + [{"role": "assistant", "content": "", "tool_calls": [call]}],
            tools=tools, tokenize=False)
        ids = tokenizer(full, return_tensors="pt").input_ids
        labels = ids.clone()
        labels[:, :len(tokenizer(prompt).input_ids)] = -100
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return float(loss.detach())


@pytest.mark.slow
def test_grpo_trainer_trains_two_steps_and_logs_the_env_reward(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_chat_template

    from sao_gym.models import tiny_model

    path = tiny_model(tmp_path / "model", hidden_size=64, num_layers=2,
                      chat_template=qwen3_chat_template)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    env = environment("sao_gym/Arithmetic-v0", seeds=range(16), num_operands=1, max_value=1)
    assert teach_the_call_format(model, tokenizer, env) < 0.1
    before = [p.detach().clone() for p in model.parameters()]
    config = GRPOConfig(
        output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=8,
        num_generations=8, max_completion_length=48, learning_rate=1e-4, beta=0.0,
        use_cpu=True, bf16=False, fp16=False, report_to="none", logging_steps=1,
        save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, seed=0,
        activation_checkpointing=False)
    trainer = GRPOTrainer(model=model, args=config, train_dataset=env.train_dataset,
                          processing_class=tokenizer, reward_funcs=env.reward_funcs,
                          environment_factory=env.environment_factory)
    trainer.train()
    assert trainer.state.global_step == 2
    logged = [h for h in trainer.state.log_history if "rewards/env_reward/mean" in h]
    assert len(logged) == 2
    rewards = [h["rewards/env_reward/mean"] for h in logged]
    assert any(0.0 < r < 1.0 for r in rewards), rewards  # some submits right, some wrong
    assert all(h["tools/call_frequency"] > 0 for h in logged)  # TRL ran the env's tools
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    for pool in trainer._environment_pool.values():
        assert all(e._session.started for e in pool)  # every instance was reset by TRL
        for e in pool:
            e._session.close()


def test_a_failing_reset_excludes_the_rollout(monkeypatch):
    env = environment("sao_gym/Arithmetic-v0", seeds=[0])
    instance = env.environment_factory()
    instance.reset(**env.train_dataset[0])  # builds the env

    async def broken(**kwargs):
        raise OSError("no sandbox")

    monkeypatch.setattr(instance._session.env, "areset", broken)
    text = instance.reset(**env.train_dataset[0])
    assert "no sandbox" in text
    assert instance.submit(answer=1).startswith("Error: the episode is over")
    assert env.reward_funcs[0](completions=[[]], environments=[instance]) == [None]
    instance._session.close()


def test_without_the_trl_extra_the_error_names_it(monkeypatch):
    from sao_gym.registration import MissingExtra

    monkeypatch.setitem(sys.modules, "trl", None)  # import trl: ModuleNotFoundError
    monkeypatch.setitem(sys.modules, "datasets", None)  # TRL's dependency goes with it
    with pytest.raises(MissingExtra, match=r"needs the module 'trl'.*pip install 'sao-gym\[trl\]'"):
        environment("sao_gym/Arithmetic-v0", seeds=[0])


def test_the_docs_snippet_runs_with_the_tiny_model_as_shipped(tmp_path):
    """docs/interop.md's GRPOTrainer with `tiny_model`'s own chat template: TRL needs to
    parse tool calls out of completions, and takes the tokenizer's response template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import parse_response

    from sao_gym.models import tiny_model

    path = tiny_model(tmp_path / "model", hidden_size=64, num_layers=2)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    env = environment("sao_gym/Arithmetic-v0", seeds=range(4), num_operands=1, max_value=1)
    # a call as the template renders it reads back as the same call
    prompt = tokenizer.apply_chat_template(env.train_dataset[0]["prompt"], tools=env.tools,
                                           add_generation_prompt=True, tokenize=False)
    call = {"type": "function", "function": {"name": "submit", "arguments": {"answer": 1}}}
    full = tokenizer.apply_chat_template(
        env.train_dataset[0]["prompt"] + [{"role": "assistant", "content": "So:",
                                           "tool_calls": [call]}],
        tools=env.tools, tokenize=False)
    assert full.startswith(prompt)
    ids = tokenizer(full[len(prompt):], add_special_tokens=False).input_ids
    prefix = tokenizer(prompt, add_special_tokens=False).input_ids
    parsed = parse_response(tokenizer, ids, prefix=prefix)
    assert (parsed["content"], parsed["tool_calls"]) == ("So:", [call])

    config = GRPOConfig(
        output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=4,
        num_generations=4, max_completion_length=8, use_cpu=True, bf16=False, fp16=False,
        report_to="none", save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        seed=0, activation_checkpointing=False)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=config,
                          train_dataset=env.train_dataset,
                          environment_factory=env.environment_factory,
                          reward_funcs=env.reward_funcs)
    trainer.train()
    assert trainer.state.global_step == 1
    for pool in trainer._environment_pool.values():
        for e in pool:
            e._session.close()
