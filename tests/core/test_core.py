import asyncio

import gymnasium
import pytest

import sao_gym
from sao_gym.core import AgentEnv, ResetNeeded, clean_text, coerce_action
from tests.helpers import CounterEnv, EchoEnv, call, calls_msg


def test_abstract_env_cannot_be_instantiated():
    class Incomplete(AgentEnv):
        async def on_reset(self, options):
            return [], {}

    with pytest.raises(TypeError, match="on_step"):
        Incomplete()


def test_step_before_reset_and_after_end_raise_reset_needed():
    env = EchoEnv()
    with pytest.raises(ResetNeeded):
        env.step("hi")
    env.reset(seed=0)
    obs, reward, terminated, truncated, _ = env.step("bye")
    assert (reward, terminated, truncated) == (1.0, True, False)
    with pytest.raises(ResetNeeded, match="reset"):
        env.step("again")
    assert issubclass(ResetNeeded, gymnasium.error.ResetNeeded)
    env.reset()
    assert env.step("x")[0] == [{"role": "user", "content": "you said 1 chars"}]
    env.close()


def test_string_action_becomes_assistant_message():
    msg, problem = coerce_action("hello")
    assert msg == {"role": "assistant", "content": "hello"} and problem is None
    original = {"role": "assistant", "content": "x"}
    msg, _ = coerce_action(original)
    assert msg == original and msg is not original


@pytest.mark.parametrize("action", [42, None, [], {"role": "user", "content": "x"}, object()])
def test_invalid_actions_get_error_observations(action):
    env = EchoEnv()
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs[0]["role"] == "user" and obs[0]["content"].startswith("Error: invalid action")
    assert (reward, terminated, truncated, info) == (0.0, False, False, {"invalid_action": True})


def test_clean_text_removes_surrogates_and_truncates():
    assert clean_text("a\ud800b") == "a?b"
    out = clean_text("x" * 5000, limit=10)
    assert out.startswith("x" * 10) and "4990 more characters" in out


def test_non_finite_reward_is_a_bug_not_data():
    class Bad(EchoEnv):
        async def on_step(self, action):
            return [{"role": "user", "content": "x"}], float("nan"), False, False, {}

    env = Bad()
    env.reset()
    with pytest.raises(ValueError, match="non-finite reward"):
        env.step("a")


async def test_sync_api_inside_event_loop_explains_async_api():
    env = EchoEnv()
    with pytest.raises(RuntimeError, match="await env.areset"):
        env.reset()
    obs, _ = await env.areset(seed=1)
    assert obs[0]["content"] == "say something"
    await env.aclose()
    await env.aclose()


def test_seed_controls_np_random_and_tasks():
    env = CounterEnv()
    env.reset(seed=5)
    a = env.task
    env.reset(seed=5)
    assert env.task == a
    starts = set()
    for s in range(20):
        env.reset(seed=s)
        starts.add(env.total)
    assert len(starts) > 1


def test_close_is_idempotent_and_env_can_reset_after_close():
    env = CounterEnv()
    env.reset(seed=0)
    env.close()
    env.close()
    with pytest.raises(ResetNeeded):
        env.step(calls_msg(call("finish")))
    env.reset(seed=0)
    assert env.step(calls_msg(call("finish")))[2] is True
    env.close()


def test_gymnasium_make_drives_the_async_env():
    env = gymnasium.make("sao_gym/Arithmetic-v0")
    obs, info = env.reset(seed=3)
    answer = env.unwrapped.task["answer"]
    obs, reward, terminated, truncated, _ = env.step(calls_msg(call("submit", {"answer": answer})))
    assert (reward, terminated, obs[0]["content"]) == (1.0, True, "Correct.")
    env.close()


async def test_many_envs_step_concurrently_on_one_loop():
    envs = [sao_gym.make("sao_gym/Arithmetic-v0") for _ in range(32)]
    results = await asyncio.gather(*(e.areset(seed=i) for i, e in enumerate(envs)))
    assert len({r[0][-1]["content"] for r in results}) > 5
    steps = await asyncio.gather(*(
        e.astep(calls_msg(call("submit", {"answer": e.unwrapped.task["answer"]}))) for e in envs))
    assert all(s[1] == 1.0 for s in steps)
    await asyncio.gather(*(e.aclose() for e in envs))
