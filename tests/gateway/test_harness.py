"""Harness episodes through the gateway as rollouts: rewards, segments, failures as data.

The harnesses (tests/gateway/harnesses.py) use the official ``openai`` client over
HTTP against the gateway; a scripted sampler answers with the tiny model's tokenizer.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import pytest
from transformers import AutoTokenizer

from sao_gym.gateway.harness import Harness
from sao_gym.gateway.rollouts import HarnessRollouts
from sao_gym.gateway.tasks import TaskSource
from sao_gym.inference.scripted import ScriptedBackend
from sao_gym.learner.batching import collate
from sao_gym.models import IM_END
from sao_gym.types import StopReason

H = "tests.gateway.harnesses"


@pytest.fixture(scope="module")
def tok(tiny_model_path):
    return AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture
def tasks(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"k{i}", "key": str(i), "value": 40 + i}) + "\n"
                            for i in range(4)))
    return TaskSource(path=str(path))


def agent_backend(tok):
    """First turn of a conversation: a tool call; after a tool answer: the value."""
    end = tok.convert_tokens_to_ids(IM_END)

    def answer(prompt, params):
        text = tok.decode(prompt)
        if "value: " in text:
            value = text.rsplit("value: ", 1)[1].split("<")[0].strip()
            return tok.encode(f"The value is {value}.", add_special_tokens=False) + [end]
        return tok.encode('lookup("3")', add_special_tokens=False) + [end]

    return ScriptedBackend(answer, logprob=-0.25)


def rollouts(tok, tasks, program=None, *, command=(), timeout_s=30.0, reward=None,
             max_context_tokens=2048):
    return HarnessRollouts(Harness(program, tuple(command), timeout_s), tasks, agent_backend(tok),
                           tok, max_new_tokens=64, max_context_tokens=max_context_tokens,
                           reward=reward)


async def test_an_episode_is_one_rollout_of_sampled_tokens_under_its_reward(tok, tasks):
    runs = rollouts(tok, tasks, f"{H}:lookup_loop")
    try:
        ro = await runs.play(3, sample_seed=11)
    finally:
        await runs.aclose()
    assert not ro.infra_failure and ro.stop_reason is StopReason.TERMINATED and ro.terminated
    assert ro.reward == 1.0 and ro.task_id == "k3" and ro.seed == 3
    assert ro.metrics["turns"] == 2 and ro.metrics["segments"] == 1 and ro.segment_starts == []
    end = tok.convert_tokens_to_ids(IM_END)
    call = tok.encode('lookup("3")', add_special_tokens=False) + [end]
    final = tok.encode("The value is 43.", add_special_tokens=False) + [end]
    actions = [t for t, m in zip(ro.token_ids, ro.loss_mask, strict=True) if m]
    assert actions == call + final
    assert [lp for lp, m in zip(ro.rollout_logprobs, ro.loss_mask, strict=True) if m] == \
        [-0.25] * len(actions)
    assert ro.messages[-1] == {"role": "assistant", "content": "The value is 43."}
    # every call sampled at the run's temperature with the episode's own seeds
    params = [c.params for c in runs.backend.calls]
    assert [p.temperature for p in params] == [1.0, 1.0] and params[0].max_new_tokens == 64
    assert params[0].seed is not None and params[0].seed != params[1].seed


async def test_the_reward_is_the_verifiers_else_the_posted_else_the_returned(tok, tasks):
    runs = rollouts(tok, tasks, f"{H}:posts_reward")
    verified = rollouts(tok, tasks, f"{H}:lookup_loop", reward=f"{H}:final_has_value")
    try:
        posted = await runs.play(0)
        checked = await verified.play(1)
    finally:
        await runs.aclose()
        await verified.aclose()
    assert posted.reward == 0.75 and not posted.infra_failure
    assert checked.reward == 1.0 and not checked.infra_failure  # "The value is 41."


async def test_a_rewritten_history_gives_two_segments_the_learner_lays_out(tok, tasks):
    runs = rollouts(tok, tasks, f"{H}:rewrites")
    try:
        ro = await runs.play(0)
    finally:
        await runs.aclose()
    assert ro.metrics["segments"] == 2 and len(ro.segment_starts) == 1
    start = ro.segment_starts[0]
    second = tok.decode(ro.token_ids[start:])
    assert "Summary: you looked up the key already." in second and "What is behind" not in second
    mb = collate([ro], [0])
    assert mb.indices == [0, 0] and mb.spans == [(0, start), (start, len(ro.token_ids))]
    assert mb.rewards_BT.sum().item() == 1.0 and mb.rewards_BT[1].sum().item() == 1.0


async def test_a_synchronous_program_and_a_command_are_harnesses_too(tok, tasks):
    sync = rollouts(tok, tasks, f"{H}:sync_loop")
    command = rollouts(tok, tasks, command=(sys.executable, "-m", H, "double"))
    try:
        a, b = await asyncio.gather(sync.play(0), command.play(1))
    finally:
        await sync.aclose()
        await command.aclose()
    assert a.reward == 0.5 and not a.infra_failure and a.metrics["turns"] == 1
    assert b.reward == 1.0 and not b.infra_failure and b.metrics["turns"] == 1


@pytest.mark.parametrize("program, says", [
    (f"{H}:crashes", "RuntimeError: the agent's own bug"),
    (f"{H}:no_reward", "gave no reward"),
    (f"{H}:no_call", "made no model call"),
    (f"{H}:says_text", "returned 'great'"),
])
async def test_a_failing_harness_is_an_infra_failure(tok, tasks, caplog, program, says):
    runs = rollouts(tok, tasks, program)
    try:
        ro = await runs.play(0)
    finally:
        await runs.aclose()
    assert ro.infra_failure and ro.stop_reason is StopReason.AGENT_ERROR and ro.reward == 0.0
    assert says in caplog.text


async def test_a_failing_verifier_or_command_is_an_infra_failure(tok, tasks, caplog):
    verified = rollouts(tok, tasks, f"{H}:lookup_loop", reward=f"{H}:broken_verifier")
    command = rollouts(tok, tasks, command=(sys.executable, "-m", H, "fail"))
    try:
        a, b = await asyncio.gather(verified.play(0), command.play(0))
    finally:
        await verified.aclose()
        await command.aclose()
    assert a.infra_failure and b.infra_failure
    assert "the verifier failed: KeyError" in caplog.text
    assert "exited with 3: cannot reach the sandbox" in caplog.text


async def test_a_hanging_harness_times_out_alone_and_its_late_calls_are_refused(tok, tasks):
    hanging = rollouts(tok, tasks, f"{H}:hangs", timeout_s=1.5)
    good = rollouts(tok, tasks, f"{H}:lookup_loop")
    start = time.monotonic()
    try:
        hung, ok = await asyncio.gather(hanging.play(0), good.play(2))
        assert time.monotonic() - start < 10
        assert hung.infra_failure and hung.metrics["turns"] == 1
        assert not ok.infra_failure and ok.reward == 1.0
        # the hung episode has ended: a call of it now is refused (409), not answered
        assert hanging.gateway.ended and not hanging.gateway.episodes
        import openai

        (ended,) = hanging.gateway.ended
        late = openai.AsyncOpenAI(base_url=f"{await hanging.url()}/episodes/{ended}/v1",
                                  api_key="x", max_retries=0)
        with pytest.raises(openai.ConflictError, match="has ended"):
            await late.chat.completions.create(model="policy",
                                               messages=[{"role": "user", "content": "hi"}])
        await late.close()
    finally:
        await hanging.aclose()
        await good.aclose()


async def test_a_call_past_the_context_truncates_the_episode(tok, tasks):
    """The policy's own doing: truncated (MAX_TOKENS), not an infra failure, though the
    harness raised on the 400 it got."""
    runs = rollouts(tok, tasks, f"{H}:lookup_loop", max_context_tokens=60)
    try:
        ro = await runs.play(0)
    finally:
        await runs.aclose()
    assert not ro.infra_failure and ro.truncated and ro.stop_reason is StopReason.MAX_TOKENS
    assert ro.reward == 0.0


def test_tasks_from_a_file_or_an_env_and_bad_task_files(tmp_path, tasks):
    assert tasks.task(5) == ("k1", {"id": "k1", "key": "1", "value": 41})  # 5 mod 4
    env = TaskSource(env="sao_gym/KeyChain-v0", env_kwargs={"hops": 2})
    assert env.task(7) == ("7", {"env_id": "sao_gym/KeyChain-v0", "seed": 7,
                                 "env_kwargs": {"hops": 2}})
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: not valid JSON"):
        TaskSource(path=str(bad)).load()
    bad.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match="must be a JSON object"):
        TaskSource(path=str(bad)).load()
    with pytest.raises(ValueError, match="exactly one"):
        TaskSource()
    with pytest.raises(ValueError, match="exactly one"):
        Harness()
    with pytest.raises(ImportError, match="agent.program 'nowhere.at_all:run' cannot be"):
        Harness("nowhere.at_all:run").function()
    with pytest.raises(ValueError, match="MODULE:NAME"):
        Harness("run").function()


async def test_an_oracle_behind_the_gateway_records_demonstrations_in_the_harness_format(tok):
    """KeyChain's own oracle answers the openai-loop harness's calls: rewarded episodes whose
    action tokens are the oracle's turns (and the end-of-turn token), in the harness's
    prompt format; a failing oracle raises, naming the task seed."""
    from sao_gym.registration import env_oracle

    oracle = env_oracle("sao_gym/KeyChain-v0")
    tasks = TaskSource(env="sao_gym/KeyChain-v0", env_kwargs={"hops": 3})
    runs = HarnessRollouts(Harness("examples.harnesses.openai_loop:run"), tasks, None, tok,
                           max_new_tokens=48, max_context_tokens=4096)
    try:
        demo = await runs.demonstrate(4, oracle)
        with pytest.raises(RuntimeError, match="the oracle failed on task seed 5: boom"):
            await runs.demonstrate(5, lambda messages, task: (_ for _ in ()).throw(
                ValueError("boom")))
    finally:
        await runs.aclose()
    assert demo.reward == 1.0 and not demo.infra_failure and demo.metrics["turns"] == 4
    end = tok.convert_tokens_to_ids(IM_END)
    turns, current = [], []
    for t, m in zip(demo.token_ids, demo.loss_mask, strict=True):
        if m:
            current.append(t)
            if t == end:
                turns.append(tok.decode(current[:-1]))
                current = []
    replies = [m for m in demo.messages if m["role"] == "assistant"]
    assert len(turns) == 4 and turns[0].startswith("lookup(") and turns[-1].startswith("submit(")
    assert [r["tool_calls"][0]["function"]["name"] for r in replies] == ["lookup"] * 3 + ["submit"]
    assert set(demo.rollout_logprobs) == {0.0}
