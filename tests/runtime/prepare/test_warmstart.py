"""Warm start: oracle demonstrations in LLMAgent's token layout, and supervised fine-tuning."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

import sao_gym
from sao_gym.agents import LLMAgent, parse_tool_calls
from sao_gym.envs.arithmetic.oracle import arithmetic_oracle
from sao_gym.inference import ScriptedBackend
from sao_gym.learner.sft import SFTSettings, SFTStep, demonstration_loss, sft
from sao_gym.models import COMPACT_TOOLS_TEMPLATE, load_policy, tiny_model
from sao_gym.runtime.prepare.demonstrations import acollect_demonstrations, collect_demonstrations
from sao_gym.types import StopReason
from tests.helpers import mask_runs, run_sft

ENV_ID = "sao_gym/Arithmetic-v0"
IM_END = "<|im_end|>"


@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> str:
    """A very small compact-template model: fast enough to fine-tune in a test."""
    return tiny_model(tmp_path_factory.mktemp("warm_base"), hidden_size=128, num_layers=1,
                      seed=0, chat_template=COMPACT_TOOLS_TEMPLATE)


@pytest.fixture(scope="module")
def tok(small_model):
    return AutoTokenizer.from_pretrained(small_model)


def enc(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


# ------------------------------------------------------------------ oracle


def test_oracle_calls_the_calculator_then_submits_its_result():
    task = {"expression": "9 - 15", "answer": "-6"}
    assert arithmetic_oracle([{"role": "user", "content": "What is 9 - 15?"}], task) == \
        "calculator(9 - 15)"
    assert arithmetic_oracle([{"role": "tool", "name": "calculator", "content": "-6"}], task) == \
        "submit(-6)"
    # after an error (or any other observation) it asks the calculator again
    assert arithmetic_oracle([{"role": "tool", "name": "calculator", "content": "Error: x"}],
                             task) == "calculator(9 - 15)"


def test_a_slip_changes_exactly_one_digit_of_the_submitted_result():
    from sao_gym.utils.slips import slip_digit as _slip

    for number in ("0", "-6", "7", "120", "-305", "3.25", "99999"):
        for k in range(40):
            slipped = _slip(number, k / 40)
            assert len(slipped) == len(number), (number, slipped)
            diff = [(a, b) for a, b in zip(number, slipped, strict=True) if a != b]
            assert len(diff) == 1, (number, slipped)
            assert diff[0][0].isdigit() and diff[0][1].isdigit()


def test_slip_rate_picks_that_share_of_tasks_stably():
    tool = [{"role": "tool", "name": "calculator", "content": "-6"}]
    tasks = [{"id": f"t{i}", "expression": "9 - 15", "answer": "-6"} for i in range(2000)]
    slipped = [arithmetic_oracle(tool, t, slip_rate=0.3, seed=1) != "submit(-6)" for t in tasks]
    assert 0.26 < sum(slipped) / len(tasks) < 0.34
    # the same task and seed always get the same demonstration; another seed, other tasks
    assert slipped == [arithmetic_oracle(tool, t, slip_rate=0.3, seed=1) != "submit(-6)"
                       for t in tasks]
    assert slipped != [arithmetic_oracle(tool, t, slip_rate=0.3, seed=2) != "submit(-6)"
                       for t in tasks]
    # the calculator turn is never slipped
    assert arithmetic_oracle([{"role": "user", "content": "What is 9 - 15?"}], tasks[0],
                             slip_rate=1.0) == "calculator(9 - 15)"


# ------------------------------------------------------------ demonstrations


def test_demonstrations_have_the_agent_token_layout(tok):
    demos = collect_demonstrations(ENV_ID, tok, arithmetic_oracle, episodes=3, seed=5,
                                   max_new_tokens=32)
    assert [r.seed for r in demos] == [5, 6, 7]
    env = sao_gym.make(ENV_ID)
    for r in demos:
        obs, info = env.reset(seed=r.seed)
        task = env.unwrapped.task
        prompt = enc(tok, tok.apply_chat_template(obs, tools=info["tools"],
                                                  add_generation_prompt=True, tokenize=False))
        segs = mask_runs(r.loss_mask)
        assert [v for v, _, _ in segs] == [0, 1, 0, 1]
        (_, _, p_end), (_, a1, e1), (_, o1, f1), (_, a2, e2) = segs
        assert r.token_ids[:p_end] == prompt
        turn1, delta, turn2 = (r.token_ids[a1:e1], r.token_ids[o1:f1], r.token_ids[a2:e2])
        first = f"calculator({task['expression']})"
        second = f"submit({task['answer']})"
        # each action is the oracle's text tokenized on its own, closed by <|im_end|>
        assert turn1 == enc(tok, first) + [tok.convert_tokens_to_ids(IM_END)]
        assert turn2 == enc(tok, second) + [tok.convert_tokens_to_ids(IM_END)]
        # the observation is the chat template's delta for the tool message, mask 0
        assert tok.decode(delta) == f"\n<|im_start|>tool\n{task['answer']}{IM_END}\n" \
            "<|im_start|>assistant\n"
        # decoding the action tokens parses back into the intended tool calls
        for ids, name, args in ((turn1, "calculator", {"expression": task["expression"]}),
                                (turn2, "submit", {"answer": task["answer"]})):
            content, calls = parse_tool_calls(tok.decode(ids, skip_special_tokens=True),
                                              info["tools"])
            assert content == ""
            assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                    for c in calls] == [(name, args)]
        assert r.rollout_logprobs == [0.0] * len(r.token_ids)
        assert all((v == -1) == (m == 0) for v, m in zip(r.policy_versions, r.loss_mask,
                                                          strict=True))
        assert (r.reward, r.terminated, r.stop_reason) == (1.0, True, StopReason.TERMINATED)


async def test_demonstrations_match_what_llmagent_records_for_the_same_tokens(tok):
    """Replaying a demo's action tokens through a plain LLMAgent gives the same rollout."""
    [demo] = await acollect_demonstrations(ENV_ID, tok, arithmetic_oracle, episodes=1, seed=3,
                                           max_new_tokens=32)
    turns = [demo.token_ids[a:e] for v, a, e in mask_runs(demo.loss_mask) if v == 1]
    agent = LLMAgent(ScriptedBackend(turns), tok, max_new_tokens=32)
    again = await sao_gym.run_episode(sao_gym.make(ENV_ID), agent, seed=3)
    assert again.token_ids == demo.token_ids and again.loss_mask == demo.loss_mask
    assert again.messages == demo.messages


@pytest.mark.parametrize("template", ["compact", "chatml"])
def test_every_oracle_demo_is_rewarded(tok, tiny_model_path, template):
    tokenizer = tok if template == "compact" else AutoTokenizer.from_pretrained(tiny_model_path)
    demos = collect_demonstrations(ENV_ID, tokenizer, arithmetic_oracle, episodes=24, seed=100,
                                   max_new_tokens=32)
    assert len(demos) == 24
    assert all(r.reward == 1.0 and r.terminated and r.metrics["turns"] == 2 for r in demos)


def test_slipped_demonstrations_earn_nothing(tok):
    oracle = functools.partial(arithmetic_oracle, slip_rate=0.5, seed=3)
    demos = collect_demonstrations(ENV_ID, tok, oracle, episodes=40, seed=7)
    rewards = [r.reward for r in demos]
    assert set(rewards) == {0.0, 1.0} and 10 <= rewards.count(0.0) <= 30
    assert all(r.metrics["turns"] == 2 for r in demos)


def test_env_kwargs_and_agent_kwargs_are_passed_on(tok):
    demos = collect_demonstrations(ENV_ID, tok, arithmetic_oracle, episodes=4,
                                   env_kwargs={"num_operands": 4, "max_value": 999},
                                   max_new_tokens=40, max_context_tokens=400)
    for r in demos:
        assert r.reward == 1.0
        assert r.messages[1]["content"].count(" ") == 2 + 2 * 3  # "What is a + b - c * d?"
        assert len(r.token_ids) <= 400


def test_a_turn_longer_than_max_new_tokens_is_an_error(tok):
    with pytest.raises(RuntimeError, match="max_new_tokens=4"):
        collect_demonstrations(ENV_ID, tok, arithmetic_oracle, episodes=1, max_new_tokens=4)


def test_a_broken_oracle_is_an_error(tok):
    def oracle(messages, task):
        raise KeyError("boom")

    with pytest.raises(RuntimeError, match="demonstration 0 .*boom"):
        collect_demonstrations(ENV_ID, tok, oracle, episodes=2)
    with pytest.raises(RuntimeError, match="must return a str"):
        collect_demonstrations(ENV_ID, tok, lambda m, t: 42, episodes=1)
    with pytest.raises(ValueError, match="episodes"):
        collect_demonstrations(ENV_ID, tok, arithmetic_oracle, episodes=0)


async def test_async_collection_inside_an_event_loop(tok):
    demos = await acollect_demonstrations(ENV_ID, tok, arithmetic_oracle, episodes=2,
                                          max_new_tokens=32)
    assert [r.reward for r in demos] == [1.0, 1.0]


# ------------------------------------------------------------------------ sft


@pytest.fixture(scope="module")
def demos(tok):
    return collect_demonstrations(ENV_ID, tok, arithmetic_oracle, episodes=4, seed=0,
                                  max_new_tokens=32)


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(Path(path) / "model.safetensors"))


def test_sft_learns_the_demonstrations(small_model, tok, demos, tmp_path):
    base, _ = load_policy(small_model)
    before = demonstration_loss(base, demos[:2], pad_id=tok.pad_token_id)
    log: list[SFTStep] = []
    train = demos[:2]
    out = run_sft(small_model, train, out_dir=tmp_path / "warm", steps=40, lr=3e-3, batch_size=2,
              seed=0, callback=log.append)
    assert out == str(tmp_path / "warm")
    assert [s.step for s in log] == list(range(1, 41))
    model, tokenizer = load_policy(out)
    assert tokenizer.chat_template == COMPACT_TOOLS_TEMPLATE
    after = demonstration_loss(model, train, pad_id=tok.pad_token_id)
    assert after < 0.05 * before and after < 0.1
    assert log[-1].token_accuracy > log[0].token_accuracy
    # greedy decoding from a training prompt reproduces the oracle's first turn
    for demo in train:
        prompt_len = demo.loss_mask.index(1)
        first_turn_end = demo.loss_mask.index(0, prompt_len)
        prompt = torch.tensor([demo.token_ids[:prompt_len]])
        with torch.no_grad():
            out_ids = model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                     max_new_tokens=16, do_sample=False)
        generated = out_ids[0, prompt_len:first_turn_end].tolist()
        assert generated == demo.token_ids[prompt_len:first_turn_end]
        assert tokenizer.decode(generated, skip_special_tokens=True).startswith("calculator(")


def test_sequence_success_is_the_probability_of_each_demonstration(small_model, tok, demos):
    from sao_gym.learner.batching import token_logprobs
    from sao_gym.learner.sft import sequence_success

    model, _ = load_policy(small_model)
    expected = []
    for demo in demos:  # one rollout at a time, no padding: the slow reference
        ids = torch.tensor([demo.token_ids])
        with torch.no_grad():
            logp = token_logprobs(model(input_ids=ids).logits, ids)[0]
        mask = demo.loss_mask
        expected.append(math.exp(sum(lp for lp, m in zip(logp.tolist(), mask, strict=True) if m)))
    got = sequence_success(model, demos, pad_id=tok.pad_token_id)
    assert got == pytest.approx(sum(expected) / len(expected), rel=1e-4)
    assert 0.0 <= got < 0.01  # an untrained model reproduces nothing


def test_greedy_holdout_success_is_the_share_reproduced_by_argmax(small_model, tok, demos):
    from sao_gym.learner.sft import holdout_success

    model, _ = load_policy(small_model)
    expected = []
    for demo in demos:  # the slow reference: one rollout, every action token the argmax?
        ids = torch.tensor([demo.token_ids])
        with torch.no_grad():
            argmax = model(input_ids=ids).logits[0].argmax(-1).tolist()
        expected.append(all(argmax[t - 1] == demo.token_ids[t]
                            for t, m in enumerate(demo.loss_mask) if m))
    got = holdout_success(model, demos, pad_id=tok.pad_token_id)
    assert got["greedy"] == sum(expected) / len(expected)
    # a demonstration made of the model's own argmax tokens is reproduced greedily
    demo = demos[0]
    ids = list(demo.token_ids)
    for t, m in enumerate(demo.loss_mask):
        if m:
            with torch.no_grad():
                ids[t] = int(model(input_ids=torch.tensor([ids[:t]])).logits[0, -1].argmax())
    own = dataclasses.replace(demo, token_ids=ids)
    mixed = holdout_success(model, [own, *demos], pad_id=tok.pad_token_id)
    assert mixed["greedy"] == (1 + sum(expected)) / (1 + len(expected))
    assert mixed["sampled"] > got["sampled"]


def test_sft_stops_early_at_the_target_held_out_success(small_model, tok, demos, tmp_path):
    from sao_gym.learner.sft import sequence_success

    log: list[SFTStep] = []
    kw = {"steps": 60, "lr": 3e-3, "batch_size": 2, "seed": 0, "check_every": 5}
    out = run_sft(small_model, demos[:2], out_dir=tmp_path / "a", holdout=demos[:2],
              target_success=0.5, callback=log.append, **kw)
    checks = [s for s in log if s.holdout_success is not None]
    assert [s.step for s in checks] == list(range(5, log[-1].step + 1, 5))
    assert checks[-1].holdout_success >= 0.5 > max(s.holdout_success for s in checks[:-1])
    assert log[-1].step < 60  # stopped at the first check past the target
    model, _ = load_policy(out)
    assert sequence_success(model, demos[:2], pad_id=tok.pad_token_id) == pytest.approx(
        checks[-1].holdout_success, rel=1e-4)
    assert all(s.holdout_sampled == s.holdout_success for s in checks)
    assert all(0 <= s.holdout_greedy <= 1 for s in checks)
    # a greedy target stops on the greedy estimate
    log.clear()
    run_sft(small_model, demos[:2], out_dir=tmp_path / "g", holdout=demos[:2], target_success=1.0,
        target_metric="greedy", callback=log.append, **kw)
    checks = [s for s in log if s.holdout_success is not None]
    assert checks[-1].holdout_greedy == checks[-1].holdout_success == 1.0 and log[-1].step < 60
    assert all(s.holdout_greedy < 1.0 for s in checks[:-1])
    assert [s.step for s in log if s.reached] == [log[-1].step]
    # ... and a sampled floor holds it until sampling reaches the floor too
    greedy_stop, floor = log[-1].step, checks[-1].holdout_sampled + 0.05
    log.clear()
    run_sft(small_model, demos[:2], out_dir=tmp_path / "f", holdout=demos[:2], target_success=1.0,
        target_metric="greedy", min_sampled=floor, callback=log.append, **kw)
    checks = [s for s in log if s.holdout_success is not None]
    assert log[-1].step > greedy_stop and log[-1].reached and log[-1].step < 60
    assert checks[-1].holdout_greedy == 1.0 and checks[-1].holdout_sampled >= floor
    assert not any(s.holdout_greedy == 1.0 and s.holdout_sampled >= floor for s in checks[:-1])
    with pytest.raises(ValueError, match="min_sampled"):
        run_sft(small_model, demos[:2], out_dir=tmp_path / "x", holdout=demos[:2],
            target_success=0.5, min_sampled=1.5, **kw)
    with pytest.raises(ValueError, match="target_metric"):
        run_sft(small_model, demos[:2], out_dir=tmp_path / "x", holdout=demos[:2],
            target_success=0.5, target_metric="beam", **kw)
    # an unreachable target runs every step; no target, no checks
    log.clear()
    run_sft(small_model, demos[:2], out_dir=tmp_path / "b", holdout=demos[2:], target_success=1.0,
        callback=log.append, **{**kw, "steps": 6})
    assert [s.step for s in log if s.holdout_success is not None] == [5, 6]
    log.clear()
    run_sft(small_model, demos[:2], out_dir=tmp_path / "c", callback=log.append,
            **{**kw, "steps": 3})
    assert len(log) == 3 and all(s.holdout_success is None for s in log)


def test_sft_is_deterministic_for_a_seed(small_model, demos, tmp_path):
    kw = {"steps": 3, "lr": 1e-3, "batch_size": 2}
    a = _weights(run_sft(small_model, demos, out_dir=tmp_path / "a", seed=1, **kw))
    b = _weights(run_sft(small_model, demos, out_dir=tmp_path / "b", seed=1, **kw))
    c = _weights(run_sft(small_model, demos, out_dir=tmp_path / "c", seed=2, **kw))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)  # another data order


def test_sft_leaves_the_global_rng_alone(small_model, demos, tmp_path):
    torch.manual_seed(5)
    expected = torch.rand(2)
    torch.manual_seed(5)
    run_sft(small_model, demos, out_dir=tmp_path / "w", steps=1, lr=1e-3, batch_size=1)
    assert torch.equal(torch.rand(2), expected)


def test_sft_rejects_bad_input(small_model, demos, tmp_path):
    with pytest.raises(ValueError, match="no demonstrations"):
        run_sft(small_model, [], out_dir=tmp_path / "x", steps=1, lr=1e-3, batch_size=1)
    with pytest.raises(ValueError, match="steps >= 1"):
        run_sft(small_model, demos, out_dir=tmp_path / "x", steps=0, lr=1e-3, batch_size=1)
    with pytest.raises(ValueError, match="steps >= 1"):
        run_sft(small_model, demos, out_dir=tmp_path / "x", steps=1, lr=0.0, batch_size=1)
    no_actions = type(demos[0])(**{**demos[0].__dict__, "loss_mask": [0] * len(demos[0].loss_mask)})
    with pytest.raises(ValueError, match="no action tokens"):
        run_sft(small_model, [no_actions], out_dir=tmp_path / "x", steps=1, lr=1e-3, batch_size=1)
    with pytest.raises(ValueError, match="no demonstrations"):
        demonstration_loss(torch.nn.Linear(1, 1), [])
    with pytest.raises(ValueError, match="needs holdout"):
        run_sft(small_model, demos, out_dir=tmp_path / "x", steps=1, lr=1e-3, batch_size=1,
            target_success=0.5)
    with pytest.raises(ValueError, match="target_success"):
        run_sft(small_model, demos, out_dir=tmp_path / "x", steps=1, lr=1e-3, batch_size=1,
            holdout=demos, target_success=1.5)
    with pytest.raises(ValueError, match="label_smoothing"):
        run_sft(small_model, demos, out_dir=tmp_path / "x", steps=1, lr=1e-3, batch_size=1,
            label_smoothing=1.0)
    assert not (tmp_path / "x").exists()


def _action_entropy(path, demos, pad_id):
    from sao_gym.learner.batching import mean_entropy, micro_batches

    model, _ = load_policy(path)
    [mb] = list(micro_batches(demos, 1 << 20, pad_id))
    with torch.no_grad():
        logits = model(input_ids=mb.input_ids_BT, attention_mask=mb.attention_mask_BT).logits
    return float(mean_entropy(logits, mb.action_mask_BT))


def test_label_smoothing_keeps_the_policy_spread(small_model, tok, demos, tmp_path):
    """Same data and steps: smoothing leaves more entropy on the action tokens, and the
    reported loss is still the plain NLL (so it stays comparable)."""
    train = demos[:2]
    logs = {}
    for eps in (0.0, 0.3):
        log: list[SFTStep] = []
        out = run_sft(small_model, train, out_dir=tmp_path / f"ls{eps}", steps=30, lr=3e-3,
                  batch_size=2, seed=0, label_smoothing=eps, callback=log.append)
        logs[eps] = (log, _action_entropy(out, train, tok.pad_token_id))
    (plain_log, plain_h), (smooth_log, smooth_h) = logs[0.0], logs[0.3]
    assert smooth_h > plain_h + 0.5
    # step 1 runs before any update: identical NLL whatever the smoothing
    assert smooth_log[0].loss == pytest.approx(plain_log[0].loss, rel=1e-6)


def test_sft_takes_one_settings_record_and_checks_it(small_model, demos, tmp_path):
    with pytest.raises(TypeError, match="SFTSettings"):
        sft(small_model, demos, {"steps": 1, "lr": 1e-3, "batch_size": 1}, out_dir=tmp_path)
    settings = SFTSettings(steps=2, lr=1e-3, batch_size=1, seed=3)
    log: list[SFTStep] = []
    sft(small_model, demos, settings, out_dir=tmp_path / "w", callback=log.append)
    assert [s.step for s in log] == [1, 2]
    for bad, match in (({"check_every": 0}, "check_every"),
                       ({"min_sampled": -0.1}, "min_sampled"),
                       ({"batch_size": 0}, "batch_size >= 1")):
        with pytest.raises(ValueError, match=match):
            SFTSettings(**{"steps": 1, "lr": 1e-3, "batch_size": 1, **bad})


# ------------------------------------------------------------------ the train job's warm start
def test_train_warm_start_uses_the_config(small_model, tmp_path, monkeypatch):
    """The builder's plan binds the oracle options, seeds and batch size from the config,
    and the warm start gets them as one settings record."""
    from sao_gym.learner import sft as sft_module
    from sao_gym.runtime.config.build import prepare_plan
    from sao_gym.runtime.config.loader import load_config
    from sao_gym.runtime.prepare import start

    seen = {}

    def fake_sft(base, demos, settings, *, out_dir, holdout, callback, state_dir):
        seen.update(base=base, demos=demos, settings=settings, holdout=holdout,
                    state_dir=state_dir)
        Path(out_dir).mkdir(parents=True)
        return str(out_dir)

    monkeypatch.setattr(sft_module, "sft", fake_sft)
    cfg = load_config(None, ["warm_start.steps=7", "warm_start.episodes=6", "warm_start.lr=0.01",
                             "warm_start.batch_size=3", "warm_start.oracle={direct_rate: 1.0}",
                             "warm_start.target_success=0.7", "warm_start.holdout_episodes=5",
                             "warm_start.target_metric=greedy", "seed=4", f"env={ENV_ID}",
                             "warm_start.min_sampled_success=0.05",
                             "env_kwargs={max_value: 5}", "rollout.max_new_tokens=24",
                             "rollout.max_context_tokens=512", f"model={small_model}"])
    plan = prepare_plan(cfg)
    saved = []
    begin = start.prepare(plan, tmp_path, save=saved.append)
    assert begin.policy == str(tmp_path / "model" / "warm_start")
    assert saved == [begin.budgets] == [plan.budgets]  # budgets set: nothing to fit
    s = seen["settings"]
    assert (s.steps, s.lr, s.batch_size, s.seed, s.warmup_steps) == (7, 0.01, 3, 4, 0)
    demos = seen["demos"]
    assert len(demos) == 6 and all(r.reward == 1.0 for r in demos)
    # direct_rate 1: every demonstration submits at once, without the calculator
    assert all(r.metrics["turns"] == 1 for r in demos)
    assert all(int(n) <= 5 for r in demos for n in re.findall(r"\d+", r.task_id))
    # the early stop sees rewarded demonstrations of other episodes (other env seeds)
    assert s.target_success == 0.7 and s.target_metric == "greedy" and len(seen["holdout"]) == 5
    assert s.min_sampled == 0.05
    # the warm start keeps its state where --resume looks, and deletes it once done
    assert seen["state_dir"] == tmp_path / "model" / start.WARM_STATE / "level_0"
    assert not seen["state_dir"].exists()
    assert {r.seed for r in seen["holdout"]}.isdisjoint({r.seed for r in demos})


def test_oracle_for_finds_registered_oracles_and_rejects_options_without_one():
    from sao_gym.runtime.config.build import SetupError, oracle_for

    assert oracle_for("sao_gym/HeavyTail-v0") is None
    with pytest.raises(SetupError, match="registers no oracle"):
        oracle_for("sao_gym/HeavyTail-v0", slip_rate=0.1)
    for name in ("direct_rate", "slip_rate"):
        oracle = oracle_for(ENV_ID, **{name: 2.0})
        with pytest.raises(ValueError, match=name):
            oracle([{"role": "user", "content": "What is 1 + 1?"}],
                   {"id": "t", "expression": "1 + 1", "answer": "2"})


@pytest.mark.parametrize("tool_schemas", ["env", "signature"])
def test_template_format_writes_the_oracles_calls_as_the_chat_template_does(
        tiny_model_path, tool_schemas):
    """``warm_start.demonstration_format: template``: the same episodes (calls, rewards),
    but each demonstrated call in the template's ``<tool_call>`` JSON form, which the
    agent (and TRL's response parser) read back into the same calls."""
    from sao_gym.envs.key_chain.oracle import key_chain_oracle

    tok = AutoTokenizer.from_pretrained(tiny_model_path)  # the ChatML template
    runs = {fmt: collect_demonstrations("sao_gym/KeyChain-v0", tok, key_chain_oracle,
                                        episodes=3, seed=7, env_kwargs={"hops": 3},
                                        template_format=fmt, max_new_tokens=64,
                                        tool_schemas=tool_schemas)
            for fmt in (False, True)}

    def calls(rollout):
        return [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                for m in rollout.messages for c in m.get("tool_calls") or []]

    for plain, written in zip(runs[False], runs[True], strict=True):
        assert written.reward == plain.reward == 1.0
        assert calls(written) == calls(plain) and len(calls(plain)) == 4  # 3 hops + submit
        actions = [tok.decode(written.token_ids[a:b])
                   for v, a, b in mask_runs(written.loss_mask) if v]
        assert all(t.startswith('<tool_call>\n{"name": ') and t.endswith(f"</tool_call>{IM_END}")
                   for t in actions), actions
        plain_actions = [tok.decode(plain.token_ids[a:b])
                         for v, a, b in mask_runs(plain.loss_mask) if v]
        assert not any("<tool_call>" in t for t in plain_actions)
        prompt_end = written.loss_mask.index(1)
        assert written.token_ids[:prompt_end] == plain.token_ids[:prompt_end]
