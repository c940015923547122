"""The trainer built from a config on the tiny model: in-flight updates, staleness, modes.

The loop's logic is tested on fakes in test_source.py; these runs check the
real parts together (HFBackend, LLMAgent, the SAO learner, Arithmetic). A
stop (SIGINT) is tested on the fakes.
"""

import asyncio
import os
import random
import signal

import pytest

import sao_gym
from sao_gym.envs.arithmetic.env import ArithmeticEnv
from sao_gym.logging import read_metrics
from sao_gym.rollout_store import RolloutReader
from sao_gym.runtime.config.build import build_trainer
from sao_gym.runtime.config.loader import load_config
from tests.runtime.fakes import fake_trainer

_FLAKY_RNG = random.Random(1234)  # shared: each episode gets a fresh env


class FlakyArithmetic(ArithmeticEnv):
    """Raises on 20% of steps, as a crashing sandbox would."""

    async def on_step(self, action):
        if _FLAKY_RNG.random() < 0.2:
            raise RuntimeError("sandbox crashed")
        return await super().on_step(action)



class SlowArithmetic(ArithmeticEnv):
    """Each tool call takes 0.3 s, as a real tool would: an episode outlasts a learner step."""

    async def on_step(self, action):
        await asyncio.sleep(0.3)
        return await super().on_step(action)


@pytest.fixture
def slow_env():
    """``tests/SlowArithmetic-v0``, registered only while the test runs."""
    sao_gym.register("tests/SlowArithmetic-v0", SlowArithmetic, max_episode_steps=6)
    yield "tests/SlowArithmetic-v0"
    sao_gym.registration.unregister("tests/SlowArithmetic-v0")


@pytest.fixture
def flaky_env():
    """``tests/FlakyArithmetic-v0``, registered only while the test runs (the registry-wide
    checks in tests/core must never see it)."""
    sao_gym.register("tests/FlakyArithmetic-v0", FlakyArithmetic, max_episode_steps=4)
    yield "tests/FlakyArithmetic-v0"
    sao_gym.registration.unregister("tests/FlakyArithmetic-v0")


FAST = ["env=sao_gym/Arithmetic-v0", "rollout.max_new_tokens=12",
        "rollout.max_context_tokens=1024",
        "learner.critic_warmup_steps=0", "learner.lr=1e-4", "checkpoint.every=0",
        "rollout.concurrency=16"]


def _train(tmp_path, tiny_model_path, *overrides):
    cfg = load_config(None, [*FAST, *overrides])
    last = build_trainer(cfg, tmp_path / "run", policy_path=tiny_model_path).run()
    return cfg, last, read_metrics(tmp_path / "run")


def test_in_flight_updates_mix_policy_versions_within_a_trajectory(tmp_path, tiny_model_path,
                                                                   slow_env):
    # with the per-episode KV cache a tiny-model turn is quick; slow tools keep episodes
    # running while the learner steps, so updates land between their turns
    cfg, last, rows = _train(tmp_path, tiny_model_path, f"env={slow_env}",
                             "total_steps=6", "rollout.batch_size=1",
                             "rollout.concurrency=4", "rollout.max_episode_steps=6",
                             "rollout.max_staleness=8")
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert max(r["async/versions_per_rollout_max"] for r in rows) >= 2
    assert rows[-1]["policy_version"] == 6
    assert last is not None and last.name == "step_0000006"


def test_staleness_never_exceeds_the_bound(tmp_path, tiny_model_path):
    cfg, _, rows = _train(tmp_path, tiny_model_path, "total_steps=8", "rollout.batch_size=1",
                          "rollout.concurrency=6", "rollout.max_episode_steps=4",
                          "rollout.max_staleness=1")
    assert len(rows) == 8
    assert all(r["async/staleness_max"] <= 1 for r in rows)
    assert max(r["async/staleness_max"] for r in rows) >= 1  # it was asynchronous


def test_failing_env_does_not_stop_training(tmp_path, tiny_model_path, flaky_env):
    # the learner refuses infra-failure rollouts with an exception, so finishing
    # proves none reached it
    cfg, _, rows = _train(tmp_path, tiny_model_path, f"env={flaky_env}",
                          "total_steps=4", "rollout.batch_size=2", "rollout.concurrency=4")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["rollout/infra_failures"] > 0
    # kept: every step's batch (2 <= logging.rollouts_per_step), traced, and every failure
    kept = RolloutReader(tmp_path / "run").episodes("train")
    traced = [e for e in kept if e["traced"]]
    assert [e["step"] for e in traced] == [1, 1, 2, 2, 3, 3, 4, 4]
    failed = [e for e in kept if e["infra_failure"]]
    assert len(failed) == rows[-1]["rollout/infra_failures"]
    assert {e["stop_reason"] for e in failed} == {"env_error"} and not any(
        e["traced"] for e in failed)


def test_sync_mode_trains_on_fresh_rollouts_only(tmp_path, tiny_model_path):
    cfg, _, rows = _train(tmp_path, tiny_model_path, "mode=sync", "total_steps=3",
                          "rollout.batch_size=3", "rollout.concurrency=3",
                          "rollout.max_episode_steps=3")
    assert len(rows) == 3 and all(r["async/staleness_max"] == 0 for r in rows)


@pytest.mark.parametrize("algorithm", ["grpo", "grpo_dis"])
def test_group_mode(tmp_path, tiny_model_path, algorithm):
    cfg, _, rows = _train(tmp_path, tiny_model_path, f"algorithm={algorithm}",
                          "rollout.group_size=2", "total_steps=2", "rollout.batch_size=4",
                          "rollout.concurrency=4", "rollout.max_episode_steps=2")
    assert len(rows) == 2 and all("loss/policy" in r for r in rows)


def test_grpo_groups_by_group_not_by_task(tmp_path, tiny_model_path):
    # three-valued tasks: two groups of one batch often draw the same task
    cfg, _, rows = _train(tmp_path, tiny_model_path, "algorithm=grpo", "rollout.group_size=2",
                          "total_steps=3", "rollout.batch_size=8", "rollout.concurrency=8",
                          "rollout.max_episode_steps=2", "env_kwargs={max_value: 1}")
    assert len(rows) == 3 and all("loss/policy" in r for r in rows)


def test_policy_minibatches_keep_the_bound_in_versions(tmp_path, tiny_model_path):
    cfg, _, rows = _train(tmp_path, tiny_model_path, "total_steps=4", "rollout.batch_size=2",
                          "rollout.concurrency=4", "rollout.max_episode_steps=3",
                          "rollout.max_staleness=2", "learner.policy_minibatches=2")
    assert [r["policy_version"] for r in rows] == [2, 4, 6, 8]
    assert all(r["async/staleness_max"] <= 2 for r in rows)


async def test_sigint_stops_after_the_running_step_and_the_trainer_says_so():
    trainer = fake_trainer(50, stop_at=3, stop=lambda t: os.kill(os.getpid(), signal.SIGINT))
    await asyncio.wait_for(trainer.arun(), timeout=20)
    assert trainer.interrupted
    assert 3 <= trainer.learner.steps_done < 50
    steps = [step for step, _ in trainer.sink.rows]
    assert steps == list(range(1, trainer.learner.steps_done + 1))
    assert trainer.sink.closed
    # a run that reaches its last step is not interrupted, even if asked to stop there
    loop = asyncio.get_running_loop()
    done = fake_trainer(4, stop_at=4, stop=lambda t: loop.call_soon_threadsafe(t.request_stop))
    await asyncio.wait_for(done.arun(), timeout=20)
    assert done.learner.steps_done == 4 and not done.interrupted
