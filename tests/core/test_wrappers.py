import time

import pytest

from sao_gym.core import ResetNeeded
from sao_gym.types import StopReason
from sao_gym.wrappers import (
    EpisodeStatistics,
    TokenBudget,
    TurnLimit,
    WallClockLimit,
    approx_token_count,
)
from tests.helpers import CounterEnv, EchoEnv, call, calls_msg


def test_turn_limit_truncates_and_reports():
    env = TurnLimit(EchoEnv(), 3)
    env.reset(seed=0)
    assert env.step("a")[3] is False
    assert env.step("b")[3] is False
    obs, r, term, trunc, info = env.step("c")
    assert (term, trunc, info["stop_reason"]) == (False, True, StopReason.MAX_TURNS)
    with pytest.raises(ResetNeeded):
        env.step("d")
    env.reset()
    assert env.step("bye")[2:4] == (True, False)  # termination wins over the limit
    with pytest.raises(ValueError):
        TurnLimit(EchoEnv(), 0)


def test_token_budget_counts_actions_and_observations():
    env = TokenBudget(EchoEnv(), max_tokens=10, count_tokens=lambda s: len(s.split()))
    env.reset()
    assert env.tokens_used == 2  # "say something"
    out = env.step("one two")  # +2, obs "you said 7 chars" +4 -> 8
    assert env.tokens_used == 8 and out[3] is False
    out = env.step("three")  # +1 +4 -> 13 > 10
    assert out[3] is True and out[4]["stop_reason"] == StopReason.MAX_TOKENS
    assert approx_token_count("abcdefgh") == 2


def test_wall_clock_limit_cancels_a_hanging_step():
    env = WallClockLimit(CounterEnv(), max_seconds=0.3)
    env.reset()
    start = time.monotonic()
    obs, r, term, trunc, info = env.step(calls_msg(call("sleep", {"s": 30})))
    assert time.monotonic() - start < 2.0
    assert trunc and info["stop_reason"] == StopReason.TIME_LIMIT
    assert "Time limit" in obs[0]["content"]
    with pytest.raises(ResetNeeded):
        env.step("x")
    env.reset()
    assert env.step(calls_msg(call("add", {"n": 1})))[3] is False


def test_episode_statistics():
    env = EpisodeStatistics(TurnLimit(EchoEnv(), 5))
    env.reset()
    assert "episode" not in env.step("a")[4]
    info = env.step("bye")[4]
    assert info["episode"]["r"] == 1.0 and info["episode"]["l"] == 2
    assert 0.0 <= info["episode"]["t"] < 5.0
