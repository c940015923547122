import gymnasium
import pytest

import sao_gym
from sao_gym.wrappers import EpisodeStatistics, TurnLimit, WallClockLimit


def test_builtin_ids_and_gymnasium_registry():
    assert "sao_gym/Arithmetic-v0" in sao_gym.env_ids()
    assert gymnasium.spec("sao_gym/Arithmetic-v0").max_episode_steps == 8


def test_register_requires_a_version():
    with pytest.raises(ValueError, match="versioned"):
        sao_gym.register("tests/Echo", "tests.helpers:EchoEnv")


def test_make_builds_the_wrapper_stack_and_passes_kwargs():
    sao_gym.register("tests/Counter-v0", "tests.helpers:CounterEnv", max_episode_steps=4,
                     kwargs={"target": 2})
    env = sao_gym.make("tests/Counter-v0", target=9, max_seconds=60)
    assert isinstance(env, EpisodeStatistics) and isinstance(env.env, WallClockLimit)
    assert isinstance(env.env.env, TurnLimit) and env.env.env.max_turns == 4
    assert env.unwrapped.target == 9
    assert env.unwrapped.spec.id == "tests/Counter-v0"
    assert env.unwrapped.spec.kwargs == {"target": 9}
    bare = sao_gym.make("tests/Counter-v0", max_episode_steps=None, record_statistics=False)
    assert isinstance(bare, TurnLimit)  # the registered limit still applies


def test_make_unknown_id_names_the_known_ones():
    with pytest.raises(gymnasium.error.UnregisteredEnv, match="sao_gym/Arithmetic-v0"):
        sao_gym.make("sao_gym/Nope-v0")


def test_make_refuses_plain_gymnasium_envs():
    sao_gym.register("tests/NotAgent-v0", "gymnasium.envs.classic_control:CartPoleEnv")
    with pytest.raises(TypeError, match="not an AgentEnv"):
        sao_gym.make("tests/NotAgent-v0")
