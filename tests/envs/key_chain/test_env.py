"""sao_gym/KeyChain-v0: the chain, its errors and turn budget, the oracle at every horizon."""

from __future__ import annotations

import statistics
import warnings

import pytest

import sao_gym
from sao_gym.agents.tool_parser import parse_tool_calls
from sao_gym.envs.key_chain.env import KeyChainEnv
from sao_gym.envs.key_chain.oracle import key_chain_oracle
from sao_gym.types import StopReason
from sao_gym.utils.env_checker import check_agent_env
from tests.helpers import call, calls_msg


def _lookup(env, key):
    return env.step(calls_msg(call("lookup", {"key": key})))


def _submit(env, key):
    return env.step(calls_msg(call("submit", {"key": key})))


def play_oracle(env, seed, slip_rate=0.0):
    """One episode of the oracle through the env's own tool parsing: (reward, turns, info)."""
    obs, info = env.reset(seed=seed)
    messages, turns = list(obs), 0
    while True:
        text = key_chain_oracle(messages, env.unwrapped.task, slip_rate=slip_rate, seed=3)
        _, calls = parse_tool_calls(text, info["tools"])
        obs, reward, terminated, truncated, step_info = env.step(
            {"role": "assistant", "content": None, "tool_calls": calls})
        messages += [{"role": "assistant", "content": text}, *obs]
        turns += 1
        if terminated or truncated:
            return reward, turns, step_info


@pytest.mark.parametrize("hops", [1, 8, 32, 64])
def test_the_oracle_solves_every_horizon_in_hops_plus_one_turns(hops):
    env = sao_gym.make("sao_gym/KeyChain-v0", hops=hops)
    results = [play_oracle(env, seed) for seed in range(20)]
    assert all(r == 1.0 for r, _, _ in results)
    assert {t for _, t, _ in results} == {hops + 1}
    assert all(i["mistakes"] == 0 for _, _, i in results)


def test_slips_cost_turns_and_fail_more_often_on_longer_chains_at_a_fixed_slack():
    short = sao_gym.make("sao_gym/KeyChain-v0", hops=8, slack=2)
    long = sao_gym.make("sao_gym/KeyChain-v0", hops=32, slack=2)
    s = [play_oracle(short, seed, 0.1) for seed in range(60)]
    lg = [play_oracle(long, seed, 0.1) for seed in range(60)]
    assert statistics.mean(t for _, t, _ in s) > 9  # recoveries took extra turns
    assert statistics.mean(r for r, _, _ in lg) < statistics.mean(r for r, _, _ in s)
    failed = [i for r, _, i in lg if r == 0]
    assert failed and all(i["mistakes"] > 0 for i in failed)


def test_a_miscopied_key_is_an_error_that_names_the_current_key_and_costs_a_turn():
    env = KeyChainEnv(hops=3)
    env.reset(options={"task": {"keys": [111, 222, 333, 444]}})
    obs = _lookup(env, 111)[0]
    assert obs[0]["content"] == "Hop 1/3: the next key is 222."
    obs, reward, terminated, truncated, info = _lookup(env, 228)
    assert obs[0]["content"] == "Error: no key 228. Hop 1/3; the current key is 222."
    assert (reward, terminated, truncated, info["hop"], info["mistakes"]) == (0.0, False, False,
                                                                               1, 1)
    assert _lookup(env, "222")[0][0]["content"] == "Hop 2/3: the next key is 333."
    assert _lookup(env, 333)[0][0]["content"] == "Hop 3/3: the last key is 444. Submit it."
    assert "Submit the last key, 444" in _lookup(env, 444)[0][0]["content"]
    obs, reward, terminated, _, info = _submit(env, 444)
    assert (reward, terminated, info["reward_components"]["correct"]) == (1.0, True, 1.0)


@pytest.mark.parametrize("moves, why", [
    ([("submit", 444)], "early"),
    ([("lookup", 111), ("lookup", 222), ("lookup", 333), ("submit", 443)], "wrong last key"),
])
def test_early_or_wrong_submissions_end_with_reward_zero(moves, why):
    env = KeyChainEnv()
    env.reset(options={"task": {"keys": [111, 222, 333, 444]}})
    for name, key in moves:
        obs, reward, terminated, truncated, _ = env.step(calls_msg(call(name, {"key": key})))
    assert (reward, terminated, truncated) == (0.0, True, False), why
    assert obs[0]["content"].startswith("Incorrect")


def test_the_turn_budget_truncates_whatever_the_actions():
    env = KeyChainEnv(hops=4, slack=1)
    _, info = env.reset(seed=0)
    assert info["turn_budget"] == env.unwrapped.turn_budget == 6
    actions = ["no call", 12345, calls_msg(call("nope", {})), calls_msg(call("lookup", {})),
               calls_msg(call("lookup", {"key": "x"}))]
    for action in actions:
        assert env.step(action)[2:4] == (False, False)
    obs, reward, terminated, truncated, info = env.step("still no call")
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert info["stop_reason"] == StopReason.MAX_TURNS and obs[-1]["content"] == "Out of turns."
    with pytest.raises(sao_gym.ResetNeeded):
        env.step("more")


def test_the_horizon_is_an_option_and_the_task_id_does_not_hold_the_answer():
    env = KeyChainEnv(hops=8)
    obs, info = env.reset(seed=5, options={"hops": 40})
    task = env.task
    assert info["hops"] == task["hops"] == 40 and len(task["keys"]) == 41
    assert info["turn_budget"] == 41 + 10 and "for 40 hops" in obs[-1]["content"]
    assert len(set(task["keys"])) == 41 and all(1000 <= k < 10000 for k in task["keys"])
    assert task["answer"] not in task["id"]
    env.reset(seed=5, options={"hops": 40})
    assert env.task == task  # the seed picks the chain


@pytest.mark.parametrize("kwargs", [{"hops": 0}, {"hops": 257}, {"slack": -1}, {"digits": 2}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        env = KeyChainEnv(**kwargs)
        env.reset(seed=0)


@pytest.mark.parametrize("task", [{"keys": [1]}, {"keys": [5, 5]}, {"keys": "1 2"}, [1, 2],
                                  {"keys": [1, -2]}])
def test_bad_fixed_tasks_are_refused(task):
    with pytest.raises(ValueError, match="keys"):
        KeyChainEnv().reset(options={"task": task})


def test_the_checker_passes_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        passed = check_agent_env(sao_gym.make("sao_gym/KeyChain-v0", hops=4))
    assert "gymnasium check_env" in passed and "hostile actions" in passed


def test_the_oracle_slips_reproducibly_and_never_solves_at_slip_one():
    env = KeyChainEnv(hops=6)
    env.reset(seed=1)
    messages = [{"role": "user", "content": "start"}]
    a = key_chain_oracle(messages, env.task, slip_rate=0.5, seed=7)
    assert a == key_chain_oracle(messages, env.task, slip_rate=0.5, seed=7)
    assert key_chain_oracle(messages, env.task, slip_rate=1.0) != f"lookup({env.task['keys'][0]})"
    results = [play_oracle(env, seed, slip_rate=1.0) for seed in range(5)]
    assert all(r == 0.0 for r, _, _ in results)
    assert all(i["stop_reason"] == StopReason.MAX_TURNS for _, _, i in results)
    with pytest.raises(ValueError, match="slip_rate"):
        key_chain_oracle(messages, env.task, slip_rate=1.5)
