import json

import pytest

import sao_gym
from sao_gym.utils.env_checker import (
    CHECKS,
    EnvCheckError,
    check_agent_env,
    hostile_actions,
)
from tests.helpers import CounterEnv, EchoEnv

FAST_KWARGS = {"sao_gym/HeavyTail-v0": {"latency_median_s": 0.001}}
# Adapter envs over something outside (an OpenEnv server, a Harbor task directory on Docker):
# tests/adapters checks them with check_agent_env against real ones.
NEEDS_OUTSIDE = {"sao_gym/OpenEnv-v0", "sao_gym/HarborTask-v0"}


@pytest.mark.parametrize("env_id", [i for i in sao_gym.env_ids() if i not in NEEDS_OUTSIDE])
def test_registered_envs_pass(env_id):
    env = sao_gym.make(env_id, **FAST_KWARGS.get(env_id, {}))
    assert check_agent_env(env) == list(CHECKS)


class CheckedEchoEnv(EchoEnv):
    """EchoEnv with a task (the checker wants an id)."""

    async def on_reset(self, options):
        self.task = {"id": "echo", "prompt": "say something"}
        return await super().on_reset(options)


def test_helper_envs_pass():
    assert check_agent_env(CounterEnv()) == list(CHECKS)
    assert check_agent_env(CheckedEchoEnv()) == list(CHECKS)


def test_hostile_action_catalogue_is_broad():
    actions = hostile_actions(CounterEnv().tool_schemas())
    assert len(actions) >= 10
    assert len(actions["1 MB of text"]) == 1 << 20
    kinds = {type(a).__name__ for a in actions.values()}
    assert {"str", "dict", "int", "NoneType", "list"} <= kinds


class FragileEnv(EchoEnv):
    """Parses tool arguments without guarding: crashes on malformed JSON."""

    async def on_step(self, action):
        for c in action.get("tool_calls") or []:
            json.loads(c["function"]["arguments"])
        return await super().on_step(action)


class UnseededEnv(EchoEnv):
    """Draws its task from a global RNG instead of np_random."""

    counter = 0

    async def on_reset(self, options):
        UnseededEnv.counter += 1
        return [{"role": "user", "content": f"task {UnseededEnv.counter}"}], {}


class SharedInfoEnv(EchoEnv):
    """Returns the same info dict on every call."""

    INFO: dict = {"tools": []}

    async def on_reset(self, options):
        return [{"role": "user", "content": "x"}], self.INFO


class BadObservationEnv(EchoEnv):
    async def on_step(self, action):
        return [{"role": "robot", "content": 1}], 0.0, False, False, {}


@pytest.mark.parametrize("env_cls, failing", [
    (FragileEnv, "hostile actions"),
    (UnseededEnv, "seed determinism"),
    (SharedInfoEnv, "gymnasium check_env"),
    (BadObservationEnv, "hostile actions"),
])
def test_broken_envs_fail_the_right_check(env_cls, failing):
    with pytest.raises(EnvCheckError) as exc:
        check_agent_env(env_cls())
    assert failing in exc.value.failures
    assert failing in str(exc.value)


def test_non_agent_env_is_rejected():
    import gymnasium

    with pytest.raises(EnvCheckError, match="not an AgentEnv"):
        check_agent_env(gymnasium.make("CartPole-v1"))
