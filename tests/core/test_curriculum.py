"""The difficulty curriculum: declared knobs, ladders, promotion and its state."""

import dataclasses

import pytest

import sao_gym
from sao_gym.curriculum import LEVEL_METRIC, Curriculum, Difficulty, knob_value, ladder
from sao_gym.registration import env_difficulty, unregister
from sao_gym.types import Rollout, StopReason


def _rollout(level: int, reward: float) -> Rollout:
    return Rollout(token_ids=[1, 2], loss_mask=[0, 1], rollout_logprobs=[0.0, -0.1],
                   policy_versions=[-1, 0], reward=reward, terminated=True, truncated=False,
                   stop_reason=StopReason.TERMINATED, infra_failure=False, messages=[],
                   env_id="x", task_id="t", seed=0, metrics={LEVEL_METRIC: float(level)})


def test_the_ladder_ends_at_the_runs_value():
    hops = Difficulty("hops", (4, 8, 16, 32, 64))
    assert ladder(hops, 32) == (4, 8, 16, 32)
    assert ladder(hops, 4) == (4,)
    assert ladder(hops, 20) == (4, 8, 16, 20)  # a value between levels is the top
    assert ladder(hops, 2) == (2,)
    named = Difficulty("size", ("small", "medium", "large"))
    assert ladder(named, "medium") == ("small", "medium")
    with pytest.raises(ValueError, match="not one of the declared levels"):
        ladder(named, "huge")


def test_a_declaration_is_checked():
    assert Difficulty.parse({"hops": [1, 2]}) == Difficulty("hops", (1, 2))
    for bad in ({"hops": [1, 2], "n": [1]}, {"hops": 3}, {"hops": "abc"}, {"hops": []},
                {"hops": [1, 1]}, {"not a name": [1]}, [("hops", [1])]):
        with pytest.raises(ValueError):
            Difficulty.parse(bad)


def test_the_knobs_value_comes_from_kwargs_or_the_constructor_default():
    class Env:
        def __init__(self, *, hops: int = 8, other: int | None = None, needed=None): ...

    assert knob_value(Env, {}, "hops") == 8
    assert knob_value(Env, {"hops": 32}, "hops") == 32
    with pytest.raises(ValueError, match="give it in env_kwargs"):
        knob_value(Env, {}, "missing")


def test_promotion_needs_a_full_window_at_the_current_level():
    c = Curriculum("hops", (4, 8, 16), promote_at=0.5, window=4)
    assert c.current() == (0, {"hops": 4})
    assert c.observe([_rollout(0, 1.0)] * 3) == 0  # 3 of a window of 4
    assert c.metrics() == {"curriculum/level": 0.0, "curriculum/success": 1.0}
    assert not c.observe([_rollout(1, 1.0)] * 8)  # another level's episodes do not count
    assert c.observe([_rollout(0, 0.0)]) == 1  # 3 of 4 succeed >= 0.5
    assert c.current() == (1, {"hops": 8}) and c.success is None
    # below the bar it stays; the window slides
    assert not c.observe([_rollout(1, 0.0)] * 3 + [_rollout(1, 1.0)])
    assert c.success == 0.25
    assert c.observe([_rollout(1, 1.0)]) == 1  # window now 0, 0, 1, 1
    assert c.top and c.level == 16
    assert not c.observe([_rollout(2, 1.0)] * 10)  # the top is the end
    assert c.index == 2


def test_a_failing_window_moves_back_down_but_not_below_the_first_level():
    c = Curriculum("hops", (4, 8, 16), promote_at=0.5, window=4, demote_below=0.3, index=2)
    assert c.observe([_rollout(2, 0.0)] * 3) == 0  # a window not yet full
    assert c.observe([_rollout(2, 1.0)]) == -1  # full: 1 of 4 = 0.25 < 0.3
    assert c.index == 1 and c.success is None  # back to 8 hops, the window forgotten
    c = Curriculum("hops", (4, 8, 16), promote_at=0.5, window=4, demote_below=0.3, index=2)
    assert c.observe([_rollout(2, 0.0)] * 2 + [_rollout(2, 1.0)] * 2) == 0  # 0.5 at the top
    assert c.observe([_rollout(2, 0.0)] * 3) == -1 and c.level == 8  # the last 4: 1 of 4
    assert c.observe([_rollout(1, 1.0)] * 4) == 1 and c.level == 16  # and up again
    first = Curriculum("hops", (4, 8), window=2, demote_below=0.3)
    assert first.observe([_rollout(0, 0.0)] * 5) == 0 and first.index == 0  # nowhere to go
    off = Curriculum("hops", (4, 8), window=2, demote_below=0.0, index=1)
    assert off.observe([_rollout(1, 0.0)] * 5) == 0 and off.index == 1  # 0: never


def test_state_round_trips_and_refuses_another_ladder():
    c = Curriculum("hops", (4, 8, 16), window=3)
    c.observe([_rollout(0, 1.0), _rollout(0, 0.0)])
    state = c.state_dict()
    fresh = Curriculum("hops", (4, 8, 16), window=3)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state and fresh.success == 0.5
    assert fresh.observe([_rollout(0, 1.0)])  # the kept window counts: 2 of 3
    with pytest.raises(ValueError, match="not this run's"):
        Curriculum("hops", (4, 8, 32)).load_state_dict(state)
    copy = dataclasses.replace(c)
    assert copy.success is None and copy.index == c.index  # a copy starts an empty window


def test_bad_settings_are_refused():
    for kwargs in ({"promote_at": 0}, {"promote_at": 1.5}, {"window": 0}, {"index": 3},
                   {"demote_below": -0.1}, {"demote_below": 0.5}):
        with pytest.raises(ValueError):
            Curriculum("hops", (4, 8, 16), **kwargs)


def test_register_declares_a_knob():
    assert env_difficulty("sao_gym/KeyChain-v0") == Difficulty(
        "hops", (4, 8, 16, 32, 64, 128, 256))
    assert env_difficulty("sao_gym/Arithmetic-v0") is None
    sao_gym.register("test_ns/Knob-v0", "sao_gym.envs.key_chain:KeyChainEnv",
                     difficulty={"digits": [3, 4, 5]})
    try:
        assert env_difficulty("test_ns/Knob-v0") == Difficulty("digits", (3, 4, 5))
        with pytest.raises(ValueError, match="one constructor keyword"):
            sao_gym.register("test_ns/Knob-v1", "sao_gym.envs.key_chain:KeyChainEnv",
                             difficulty={"digits": [3], "hops": [1]})
        sao_gym.register("test_ns/Knob-v0", "sao_gym.envs.key_chain:KeyChainEnv")
        assert env_difficulty("test_ns/Knob-v0") is None  # registered again without one
    finally:
        unregister("test_ns/Knob-v0")
