"""CodeRepo takes its sandboxes from a pool; a sandbox that fails to start is one infra failure."""

from __future__ import annotations

import asyncio

import sao_gym
from sao_gym.agents import ScriptedAgent
from sao_gym.evaluation import EpisodeSummary, run_episodes
from sao_gym.rollout import play_episode
from sao_gym.sandbox import SandboxPool, SandboxUnavailable, aclose_shared_pools, shared_pool
from sao_gym.types import StopReason
from tests.helpers import EXIT_WARNINGS, call, calls_msg, play_in_a_script
from tests.sandbox.conftest import backend_class

ENV_ID = "sao_gym/CodeRepo-v0"


def _submit() -> ScriptedAgent:
    return ScriptedAgent([calls_msg(call("submit"))])


class _WontStart:
    workdir = "/work"

    def __init__(self):
        self.closed = False

    async def start(self):
        raise SandboxUnavailable("the container could not start")

    async def aclose(self):
        self.closed = True


async def test_a_failed_sandbox_start_is_one_infra_failure_not_the_end_of_an_eval():
    local = await backend_class("local")
    made = []

    def factory():  # every 5th sandbox fails to start
        made.append(_WontStart() if len(made) % 5 == 4 else local())
        return made[-1]

    pool = SandboxPool(factory, max_concurrency=2)
    rollouts = await run_episodes(
        lambda: sao_gym.make(ENV_ID, tasks="humaneval", sandbox_pool=pool,
                             max_context_tokens=None),
        _submit, 5, concurrency=2, seed=0)
    summary = EpisodeSummary.of(rollouts)
    assert (summary.episodes, summary.infra_failures, summary.failure_reasons) == (
        5, 1, {"env_error": 1})
    assert all(r.stop_reason is StopReason.TERMINATED for r in rollouts if not r.infra_failure)
    assert len(made) == 5 and pool.stats.in_use == 0 and pool.stats.failures == 1
    await pool.aclose()


async def test_envs_built_per_episode_lease_from_the_shared_pool_and_release_it():
    await backend_class("local")
    spec = {"backend": "local", "pool": {"max_concurrency": 4}}
    rollout = await play_episode(
        lambda: sao_gym.make(ENV_ID, tasks="humaneval", sandbox=spec, max_context_tokens=None),
        _submit, seed=0)
    assert not rollout.infra_failure and rollout.stop_reason is StopReason.TERMINATED
    pool = shared_pool(spec)
    assert (pool.max_concurrency, pool.stats.started, pool.stats.in_use) == (4, 1, 0)
    await aclose_shared_pools()


async def test_a_script_that_never_closes_its_env_exits_cleanly():
    await backend_class("local")
    done = await asyncio.to_thread(
        play_in_a_script, ENV_ID, calls_msg(call("bash", {"command": "echo sandboxed"})),
        tasks="humaneval", max_context_tokens=None)
    assert done.returncode == 0 and "sandboxed" in done.stdout, done.stderr[-3000:]
    assert not [w for w in EXIT_WARNINGS if w in done.stderr], done.stderr[-3000:]
