import asyncio

import pytest

import sao_gym
from sao_gym.agents import RandomAgent, ScriptedAgent
from sao_gym.core import ContextExhausted
from sao_gym.evaluation import EpisodeSummary, run_episodes
from sao_gym.types import StopReason
from tests.helpers import CounterEnv, call, calls_msg

sao_gym.register("tests/CounterR-v0", "tests.helpers:CounterEnv", max_episode_steps=3,
                 kwargs={"target": 3})


async def test_successful_episode_record():
    env = sao_gym.make("tests/CounterR-v0")
    agent = ScriptedAgent([calls_msg(call("add", {"n": 3})), calls_msg(call("finish"))])
    r = await sao_gym.run_episode(env, agent, seed=0, options={"start": 0})
    assert (r.reward, r.terminated, r.truncated, r.infra_failure) == (1.0, True, False, False)
    assert r.stop_reason is StopReason.TERMINATED
    assert (r.env_id, r.task_id, r.seed) == ("tests/CounterR-v0", "counter-0", 0)
    assert r.metrics == {"turns": 2.0, "action_tokens": 0.0, "total_tokens": 0.0,
                         "reward/hit": 1.0}
    assert [m["role"] for m in r.messages] == ["user", "assistant", "tool", "assistant", "tool"]
    assert r.messages[-1]["content"] == "done"  # the final observation is kept


async def test_turn_limit_truncates():
    env = sao_gym.make("tests/CounterR-v0")
    r = await sao_gym.run_episode(env, ScriptedAgent(["a", "b", "c", "d"]), seed=1)
    assert (r.truncated, r.terminated, r.stop_reason) == (True, False, StopReason.MAX_TURNS)
    assert r.metrics["turns"] == 3.0


async def test_env_failure_is_data_not_an_exception():
    env = sao_gym.make("tests/CounterR-v0")
    r = await sao_gym.run_episode(env, ScriptedAgent([calls_msg(call("crash"))]), seed=0)
    assert r.infra_failure and r.stop_reason is StopReason.ENV_ERROR
    assert not r.terminated and not r.truncated


async def test_agent_failure_is_data_not_an_exception():
    r = await sao_gym.run_episode(CounterEnv(), ScriptedAgent([]), seed=0)
    assert r.infra_failure and r.stop_reason is StopReason.AGENT_ERROR


async def test_context_exhaustion_truncates():
    def policy(messages):
        if len(messages) > 2:
            raise ContextExhausted("full")
        return "hello"

    r = await sao_gym.run_episode(CounterEnv(), ScriptedAgent(policy), seed=0)
    assert (r.truncated, r.stop_reason, r.infra_failure) == (True, StopReason.MAX_TOKENS, False)


async def test_cancellation_propagates():
    env = sao_gym.make("tests/CounterR-v0")
    agent = ScriptedAgent([calls_msg(call("sleep", {"s": 30}))])
    task = asyncio.ensure_future(sao_gym.run_episode(env, agent))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_run_episodes_concurrently_in_seed_order():
    seen = []
    rollouts = await run_episodes(lambda: sao_gym.make("sao_gym/Arithmetic-v0"),
                                  lambda: RandomAgent(seed=0), 12, concurrency=4, seed=100,
                                  on_done=seen.append)
    assert [r.seed for r in rollouts] == list(range(100, 112)) and len(seen) == 12
    s = EpisodeSummary.of(rollouts)
    assert s.episodes == 12 and s.infra_failures == 0 and 1 <= s.turns_mean <= 8


async def test_env_reported_infra_failure_is_excluded():
    from tests.helpers import EchoEnv

    class Flaky(EchoEnv):
        async def on_step(self, action):
            return ([{"role": "user", "content": "sandbox lost"}], 0.0, True, False,
                    {"infra_failure": True})

    r = await sao_gym.run_episode(Flaky(), ScriptedAgent(["x"]))
    assert r.infra_failure and not r.terminated and r.reward == 0.0
    assert r.messages[-1]["content"] == "sandbox lost"


async def test_sandbox_failure_in_a_tool_marks_an_infra_failure():
    from sao_gym.sandbox import SandboxCrashed
    from sao_gym.tools import ToolEnv, tool

    class Code(ToolEnv):
        async def on_reset(self, options):
            return [{"role": "user", "content": "run it"}], {}

        @tool(description="Run.", parameters={"type": "object", "properties": {}})
        async def run(self):
            raise SandboxCrashed("container died")

    r = await sao_gym.run_episode(Code(), ScriptedAgent([calls_msg(call("run"))]))
    assert r.infra_failure and r.stop_reason is StopReason.ENV_ERROR
