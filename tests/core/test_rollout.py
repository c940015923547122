"""run_episode and play_episode: token-exact records, and failures as data (never raised)."""

import asyncio
import logging

import pytest

import sao_gym
from sao_gym.agents import RandomAgent, ScriptedAgent
from sao_gym.core import ContextExhausted
from sao_gym.evaluation import EpisodeSummary, run_episodes
from sao_gym.rollout import play_episode
from sao_gym.types import StopReason
from tests.helpers import CounterEnv, EchoEnv, call, calls_msg

sao_gym.register("tests/CounterR-v0", "tests.helpers:CounterEnv", max_episode_steps=3,
                 kwargs={"target": 3})
sao_gym.register("tests/ResetFails-v0", "tests.core.test_rollout:ResetFails", max_episode_steps=3)


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


# ----- failures before the first turn ------------------------------------------------------
class ResetFails(CounterEnv):
    """Fails in reset (a sandbox that does not start), counts its closes."""

    closes = 0

    async def on_reset(self, options):
        raise OSError("the sandbox did not start")

    async def on_close(self):
        ResetFails.closes += 1


class BadAgent(ScriptedAgent):
    """A ScriptedAgent whose ``reset`` raises (a prompt its tokenizer cannot render)."""

    def reset(self, observation, info):
        raise ValueError("cannot render the prompt")


def _no_tokens(r):
    return r.token_ids == [] and r.loss_mask == [] and r.num_action_tokens == 0


async def test_reset_failure_is_an_env_error_rollout(caplog):
    with caplog.at_level(logging.ERROR, logger="sao_gym.rollout"):
        r = await sao_gym.run_episode(sao_gym.make("tests/ResetFails-v0"), ScriptedAgent(["x"]),
                                      seed=7)
    assert r.infra_failure and r.stop_reason is StopReason.ENV_ERROR and _no_tokens(r)
    assert (r.env_id, r.seed, r.task_id, r.reward) == ("tests/ResetFails-v0", 7, "", 0.0)
    assert not r.terminated and not r.truncated and r.metrics["turns"] == 0.0
    logged = [rec for rec in caplog.records if rec.exc_info]
    assert len(logged) == 1 and "did not start" in str(logged[0].exc_info[1])


async def test_agent_reset_failure_is_an_agent_error_rollout():
    env = sao_gym.make("tests/CounterR-v0")
    r = await sao_gym.run_episode(env, BadAgent(["x"]), seed=2, options={"start": 1})
    assert r.infra_failure and r.stop_reason is StopReason.AGENT_ERROR and _no_tokens(r)
    assert (r.env_id, r.seed, r.task_id) == ("tests/CounterR-v0", 2, "counter-1")
    assert r.messages == [{"role": "user", "content": "start at 1"}]  # what the env said


async def test_failing_observe_and_trajectory_are_agent_errors():
    class ObserveFails(ScriptedAgent):
        def observe(self, observation):
            raise RuntimeError("tokenizer broke")

    class NoTrajectory(ScriptedAgent):
        def trajectory(self):
            raise RuntimeError("lost the record")

    r = await sao_gym.run_episode(CounterEnv(), ObserveFails(["a", "b"]), seed=0)
    assert r.infra_failure and r.stop_reason is StopReason.AGENT_ERROR and r.metrics["turns"] == 1
    env = sao_gym.make("tests/CounterR-v0")
    done = [calls_msg(call("add", {"n": 3})), calls_msg(call("finish"))]
    r = await sao_gym.run_episode(env, NoTrajectory(done), seed=0, options={"start": 0})
    assert r.infra_failure and r.stop_reason is StopReason.AGENT_ERROR and not r.terminated


async def test_bad_step_info_is_an_env_error():
    class BadInfo(EchoEnv):
        async def on_step(self, action):
            return [], 0.0, True, False, {"stop_reason": "no-such-reason"}

    r = await sao_gym.run_episode(BadInfo(), ScriptedAgent(["x"]))
    assert r.infra_failure and r.stop_reason is StopReason.ENV_ERROR


# ----- play_episode: build, run, always close ----------------------------------------------
class Closing(CounterEnv):
    """Records whether it was closed; optionally fails to close."""

    made: list["Closing"] = []

    def __init__(self, fail_close=False):
        super().__init__(target=3)
        self.fail_close, self.closed = fail_close, 0
        Closing.made.append(self)

    async def on_close(self):
        self.closed += 1
        if self.fail_close:
            raise OSError("teardown failed")


@pytest.fixture(autouse=True)
def _fresh():
    Closing.made, ResetFails.closes = [], 0


def _solve():
    return ScriptedAgent([calls_msg(call("add", {"n": 3})), calls_msg(call("finish"))])


async def test_play_episode_runs_and_closes():
    r = await play_episode(Closing, _solve, seed=0, options={"start": 0})
    assert (r.reward, r.terminated, r.infra_failure, r.seed) == (1.0, True, False, 0)
    assert [e.closed for e in Closing.made] == [1]


async def test_make_env_failure_is_an_env_error_rollout(caplog):
    def make_env():
        raise RuntimeError("no such image")

    with caplog.at_level(logging.ERROR, logger="sao_gym.rollout"):
        r = await play_episode(make_env, _solve, seed=11)
    assert r.infra_failure and r.stop_reason is StopReason.ENV_ERROR and _no_tokens(r)
    assert (r.env_id, r.seed, r.task_id, r.messages) == ("", 11, "", [])
    assert sum(1 for rec in caplog.records if rec.exc_info) == 1


async def test_make_agent_failure_is_an_agent_error_and_closes_the_env():
    def make_agent():
        raise ValueError("LLMAgent needs a tokenizer with a chat template")

    r = await play_episode(lambda: sao_gym.make("tests/CounterR-v0"), make_agent, seed=4)
    assert r.infra_failure and r.stop_reason is StopReason.AGENT_ERROR and _no_tokens(r)
    assert (r.env_id, r.seed) == ("tests/CounterR-v0", 4)
    r = await play_episode(Closing, make_agent)
    assert r.stop_reason is StopReason.AGENT_ERROR and Closing.made[0].closed == 1


async def test_reset_failure_in_play_episode_closes_the_env():
    r = await play_episode(lambda: sao_gym.make("tests/ResetFails-v0"), _solve, seed=3)
    assert r.stop_reason is StopReason.ENV_ERROR and r.env_id == "tests/ResetFails-v0"
    assert ResetFails.closes == 1


async def test_close_failure_is_logged_and_keeps_the_rollout(caplog):
    with caplog.at_level(logging.ERROR, logger="sao_gym.rollout"):
        r = await play_episode(lambda: Closing(fail_close=True), _solve, seed=0,
                               options={"start": 0})
    assert (r.reward, r.terminated, r.infra_failure) == (1.0, True, False)
    assert Closing.made[0].closed == 1 and "closing the environment failed" in caplog.text


async def test_cancellation_closes_the_env_and_propagates():
    agent = ScriptedAgent([calls_msg(call("sleep", {"s": 30}))])
    task = asyncio.ensure_future(play_episode(Closing, lambda: agent, seed=0))
    await asyncio.sleep(0.05)
    assert Closing.made and Closing.made[0].closed == 0  # mid-episode
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert Closing.made[0].closed == 1


async def test_cancellation_during_reset_closes_the_env():
    class SlowReset(Closing):
        async def on_reset(self, options):
            await asyncio.sleep(30)

    task = asyncio.ensure_future(play_episode(SlowReset, _solve))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert Closing.made[0].closed == 1
