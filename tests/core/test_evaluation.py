"""run_episodes / EpisodeSummary: an evaluation survives failing episodes and counts them.

Acceptance: an environment that fails in reset on 20% of the seeds (as a
sandbox that does not start would) no longer ends the evaluation; every
episode comes back, the failures exactly where the seeds say, each env closed.
"""

from __future__ import annotations

import asyncio

import pytest

import sao_gym
from sao_gym.agents import ScriptedAgent
from sao_gym.core import AgentEnv
from sao_gym.evaluation import EpisodeSummary, run_episodes
from sao_gym.sandbox import SandboxUnavailable
from sao_gym.types import StopReason

ENV_ID = "tests/FlakyReset-v0"


class FlakyResetEnv(AgentEnv):
    """Echo env whose reset fails on every seed divisible by 5 (20% of seeds)."""

    built = 0
    closed = 0

    def __init__(self):
        super().__init__()
        FlakyResetEnv.built += 1

    async def areset(self, *, seed=None, options=None):
        self._seed = seed
        return await super().areset(seed=seed, options=options)

    async def on_reset(self, options):
        if self._seed is not None and self._seed % 5 == 0:
            raise SandboxUnavailable(f"sandbox for seed {self._seed} did not start")
        await asyncio.sleep(0)
        self.task = {"id": f"echo-{self._seed}", "prompt": "say bye"}
        return [{"role": "user", "content": "say bye"}], {}

    async def on_step(self, action):
        text = action.get("content") or ""
        return ([{"role": "user", "content": "ok"}], float(text == "bye"), text == "bye",
                False, {})

    async def on_close(self):
        FlakyResetEnv.closed += 1


sao_gym.register(ENV_ID, "tests.core.test_evaluation:FlakyResetEnv", max_episode_steps=2)


@pytest.fixture(autouse=True)
def _counts():
    FlakyResetEnv.built = FlakyResetEnv.closed = 0


def failing(seeds):
    return {s for s in seeds if s % 5 == 0}


async def test_an_evaluation_with_failing_resets_completes_and_counts_them():
    done = []
    rollouts = await run_episodes(lambda: sao_gym.make(ENV_ID), lambda: ScriptedAgent(["bye"]),
                                  20, concurrency=4, seed=0, on_done=done.append)
    assert [r.seed for r in rollouts] == list(range(20)) and len(done) == 20
    assert {r.seed for r in rollouts if r.infra_failure} == failing(range(20)) == {0, 5, 10, 15}
    for r in rollouts:
        if r.infra_failure:
            assert (r.stop_reason, r.env_id, r.token_ids, r.reward) == (
                StopReason.ENV_ERROR, ENV_ID, [], 0.0)
        else:
            assert (r.stop_reason, r.reward, r.task_id) == (StopReason.TERMINATED, 1.0,
                                                            f"echo-{r.seed}")
    summary = EpisodeSummary.of(rollouts)
    assert (summary.episodes, summary.infra_failures, summary.failure_reasons) == (
        20, 4, {"env_error": 4})
    assert (summary.success_rate, summary.return_mean, summary.turns_mean) == (1.0, 1.0, 1.0)
    assert FlakyResetEnv.built == FlakyResetEnv.closed == 20  # failed episodes closed too


async def test_failing_factories_are_counted_too():
    calls = {"env": 0}

    def make_env():
        calls["env"] += 1
        if calls["env"] % 4 == 0:
            raise RuntimeError("cannot build the env")
        return sao_gym.make(ENV_ID)

    def make_agent():
        raise ValueError("bad agent settings")

    rollouts = await run_episodes(make_env, make_agent, 8, concurrency=1, seed=1)
    summary = EpisodeSummary.of(rollouts)
    assert summary.infra_failures == 8
    assert summary.failure_reasons == {"agent_error": 6, "env_error": 2}
    assert FlakyResetEnv.built == FlakyResetEnv.closed == 6


async def test_a_failing_callback_propagates_after_every_episode_is_closed():
    def on_done(rollout):
        if rollout.seed == 3:
            raise KeyError("progress bar broke")

    with pytest.raises(KeyError, match="progress bar"):
        await run_episodes(lambda: sao_gym.make(ENV_ID), lambda: ScriptedAgent(["bye"]), 12,
                           concurrency=3, seed=1, on_done=on_done)
    assert FlakyResetEnv.built == FlakyResetEnv.closed  # nothing left running


async def test_cancelling_an_evaluation_closes_every_env():
    async def slow(messages):
        await asyncio.sleep(30)

    task = asyncio.ensure_future(run_episodes(lambda: sao_gym.make(ENV_ID),
                                              lambda: ScriptedAgent(slow), 6, concurrency=3,
                                              seed=1))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert FlakyResetEnv.built == FlakyResetEnv.closed == 3


@pytest.mark.slow
def test_evaluate_policy_reports_the_infra_failures(tiny_model_path):
    """The `sao-gym eval` path: a real (tiny) policy, 20% of the seeds failing in reset."""
    from sao_gym.runtime.config.build import eval_plan
    from sao_gym.runtime.config.loader import load_config
    from sao_gym.runtime.job import evaluate

    config = load_config(None, [f"env={ENV_ID}", "rollout.max_new_tokens=4",
                                "rollout.max_context_tokens=512", "rollout.max_episode_steps=2",
                                "rollout.concurrency=4"])
    result = evaluate(eval_plan(config, episodes=10, seed=1_000_000), tiny_model_path)
    assert result["episodes"] == 10
    assert result["infra_failures"] == len(failing(range(1_000_000, 1_000_010))) == 2
    assert result["failure_reasons"] == {"env_error": 2}
    assert FlakyResetEnv.built == FlakyResetEnv.closed == 10


def test_wilson_interval_against_hand_values_and_edges():
    from sao_gym.evaluation import wilson_interval

    # p = 0.5, n = 100: centre 0.5, half-width z * sqrt(0.0025 + z^2/40000) / (1 + z^2/100)
    lo, hi = wilson_interval(50, 100)
    assert (lo, hi) == pytest.approx((0.4038, 0.5962), abs=1e-4)
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(20, 20)[1] == 1.0
    # exactly, at every n (at 128 of 128 the formula alone gives 0.9999999999999999)
    assert all(wilson_interval(n, n)[1] == 1.0 and wilson_interval(0, n)[0] == 0.0
               for n in range(1, 1000))
    assert wilson_interval(0, 20)[1] == pytest.approx(0.1611, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(5, 4)


def test_gain_interval_is_the_normal_difference_interval():
    from sao_gym.evaluation import gain_interval

    lo, hi = gain_interval(0.4, 256, 0.6, 256)
    se = ((0.24 + 0.24) / 256) ** 0.5
    assert (lo, hi) == pytest.approx((0.2 - 1.959964 * se, 0.2 + 1.959964 * se))
    with pytest.raises(ValueError):
        gain_interval(0.4, 0, 0.5, 10)


def test_summary_carries_the_success_interval():
    from sao_gym.evaluation import EpisodeSummary, wilson_interval
    from sao_gym.types import Rollout, StopReason

    def ro(reward, failed=False):
        return Rollout([1, 2], [0, 1], [0.0, -1.0], [-1, 0], reward, True, False,
                       StopReason.TERMINATED, failed, [], "e", "t", None, {})

    s = EpisodeSummary.of([ro(1.0), ro(0.0), ro(1.0), ro(0.0, failed=True)])
    assert s.success_rate == pytest.approx(2 / 3)
    assert s.success_interval == wilson_interval(2, 3)
