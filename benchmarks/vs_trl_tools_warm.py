"""The warm start of benchmarks/vs_trl_tools.py: oracle demonstrations, tokenized as both
trainers tokenize rollouts, and a few hundred SFT steps, so the model really calls tools.

``trl_tools`` is the list of tools GRPOTrainer takes from an environment instance
(TRL renders the prompt's tool schemas from these methods).
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from _runs import read_json, say, write_json


def trl_tools(instance: object) -> list:
    """The tools GRPOTrainer takes from an environment instance, as its __init__ does."""
    import inspect

    return [getattr(instance, name)
            for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
            if name not in ("reset", "get_reward") and not name.startswith("_")]


def demonstration(tokenizer: Any, session: Any, seed: int, tools: list, slip_rate: float
                  ) -> tuple[list[int], list[int]]:
    """The oracle's episode of ``seed`` as (token ids, labels), tokenized as both trainers do.

    The oracle (:func:`arithmetic_oracle` with ``slip_rate``) is played through
    the env (``session``, an :class:`~sao_gym.adapters.session.EnvSession` without
    latency): ``calculator`` on the task's expression, ``submit`` of its result (a
    miscopied digit on a share of the tasks, so the model also sees ``Incorrect.``),
    both as Hermes tool calls, then an empty final answer. The prompt, each turn (up to
    and with ``<|im_end|>``) and each observation (the text the template adds after
    that, up to the next generation prompt) are tokenized on their own, as TRL and our
    agent do; the labels cover the turns.
    """
    from sao_gym.agents.tool_parser import parse_tool_calls
    from sao_gym.envs.arithmetic.oracle import arithmetic_oracle

    def render(messages: list[dict], generation: bool) -> str:
        return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                             add_generation_prompt=generation)

    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    obs, info = session.reset(seed=seed)
    task = session.env.unwrapped.task
    messages = [{"role": m["role"], "content": m["content"]} for m in obs]
    ids = encode(render(messages, True))
    labels = [-100] * len(ids)
    for turn_index in range(3):
        before = render(messages, True)
        message: dict[str, Any] = {"role": "assistant", "content": ""}
        if turn_index < 2:
            text = arithmetic_oracle(messages, task, slip_rate=slip_rate, seed=seed)
            _, [call] = parse_tool_calls(text, info["tools"])
            name, arguments = call["function"]["name"], json.loads(call["function"]["arguments"])
            message["tool_calls"] = [{"type": "function",
                                      "function": {"name": name, "arguments": arguments}}]
        messages.append(message)
        after = render(messages, False)
        assert after.startswith(before), "the chat template is not prefix-stable"
        turn = after[len(before):]
        cut = turn.rindex("<|im_end|>") + len("<|im_end|>")
        turn_ids = encode(turn[:cut])
        ids += turn_ids
        labels += turn_ids
        if turn_index < 2:
            reply = session.call_tool(name, arguments).text
            messages.append({"role": "tool", "name": name, "content": reply})
            obs_ids = encode(turn[cut:] + render(messages, True)[len(after):])
            ids += obs_ids
            labels += [-100] * len(obs_ids)
    assert session.done, "the oracle's episode did not end at submit"
    return ids, labels


def warm_start(out: Path, cfg: dict[str, Any], env_id: str, sft: dict[str, Any]
               ) -> dict[str, Any]:
    """The shared warm checkpoint (``OUT/warm/model``) on ``env_id``, made once per setting.

    ``sft``: ``lr``, ``batch_size`` and the oracle's ``slip_rate``.
    """
    part = out / "warm"
    key = {k: cfg[k] for k in ("hidden_size", "layers", "sft_steps", "sft_episodes", "seed")}
    if (part / "result.json").exists():
        done = read_json(part / "result.json")
        if done.get("settings") == key:
            return done
        shutil.rmtree(part)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    from sao_gym.adapters.session import EnvSession
    from sao_gym.adapters.trl import environment
    from sao_gym.models import tiny_model

    start = time.monotonic()
    base = tiny_model(part / "base", hidden_size=cfg["hidden_size"], num_layers=cfg["layers"],
                      seed=cfg["seed"], chat_template=qwen2_5_chat_template)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    seeds = range(50_000_000, 50_000_000 + cfg["sft_episodes"])
    env = environment(env_id, seeds=seeds, latency_median_s=0.0)
    cls = env.environment_factory
    tools = trl_tools(cls.__new__(cls))  # rendered as TRL renders them (its schemas)
    session = EnvSession(env_id, latency_median_s=0.0)
    demos, prompt_tokens, identical = [], [], True
    try:
        for seed, row in zip(seeds, env.train_dataset, strict=True):
            obs, info = session.reset(seed=seed)
            trl_prompt = tokenizer.apply_chat_template(row["prompt"], tools=tools,
                                                       tokenize=False, add_generation_prompt=True)
            sao_prompt = tokenizer.apply_chat_template(obs, tools=info["tools"], tokenize=False,
                                                       add_generation_prompt=True)
            identical &= trl_prompt == sao_prompt
            prompt_tokens.append(len(tokenizer(sao_prompt, add_special_tokens=False).input_ids))
            demos.append(demonstration(tokenizer, session, seed, tools, sft["slip_rate"]))
    finally:
        session.close()
    if not identical:
        raise SystemExit("the prompts TRL and SAO render differ; the comparison would be unfair")
    say(f"warm start: {cfg['sft_steps']} SFT steps on {len(demos)} oracle episodes "
        f"({len(demos[0][0])} tokens, {sum(x != -100 for x in demos[0][1])} of them sampled)")
    torch.manual_seed(cfg["seed"])
    rng = random.Random(cfg["seed"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=sft["lr"], weight_decay=0.0)
    pad = tokenizer.pad_token_id
    model.train()
    loss = torch.tensor(float("nan"))
    for step in range(1, cfg["sft_steps"] + 1):
        batch = rng.sample(demos, min(sft["batch_size"], len(demos)))
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([i + [pad] * (width - len(i)) for i, _ in batch])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in batch])
        mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in batch])
        for group in optimizer.param_groups:  # linear decay to 10%
            group["lr"] = sft["lr"] * (1 - 0.9 * (step - 1) / max(cfg["sft_steps"], 1))
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        optimizer.zero_grad()
        out.loss.backward()
        loss = out.loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 25 == 0 or step == cfg["sft_steps"]:
            say(f"  sft step {step}: loss {float(loss):.4f} ({time.monotonic() - start:.0f} s)")
    model.save_pretrained(part / "model")
    tokenizer.save_pretrained(part / "model")
    result = {"settings": key, "model": str(part / "model"), "sft_loss": round(float(loss), 5),
              "sft_seconds": round(time.monotonic() - start, 1),
              "params": sum(p.numel() for p in model.parameters()),
              "prompt_tokens_max": max(prompt_tokens),
              "prompt_tokens_mean": round(statistics.mean(prompt_tokens), 1),
              "prompts_identical": identical}
    write_json(part / "result.json", result)
    return result
