"""MathTIR takes its sandboxes from a pool: leased at reset, shared by per-episode envs."""

from __future__ import annotations

import asyncio

import sao_gym
from sao_gym.sandbox import aclose_shared_pools, shared_pool
from tests.helpers import EXIT_WARNINGS, call, calls_msg, play_in_a_script
from tests.sandbox.conftest import backend_class

ENV_ID = "sao_gym/MathTIR-v0"


def _py(code: str) -> dict:
    return calls_msg(call("python", {"code": code}))


async def test_per_episode_envs_share_a_warm_pool_and_each_episode_gets_a_fresh_sandbox():
    await backend_class("local")  # skips without bubblewrap (unless SAO_SANDBOX_REQUIRE=local)
    spec = {"backend": "local", "pool": {"size": 1}}
    env = sao_gym.make(ENV_ID, sandbox=spec)
    await env.areset(seed=0)
    pool = shared_pool(env.unwrapped._sandbox_spec)  # the one the env leased from
    await asyncio.sleep(0.5)  # "the model writes its first turn": the sandbox starts meanwhile
    assert pool.stats.in_use == 1 and pool.stats.started >= 1
    obs, *_ = await env.astep(_py("open('mark', 'w').write('x'); print('written')"))
    assert obs[0]["content"].strip() == "written"
    await env.aclose()
    assert pool.stats.in_use == 0
    await pool.start()  # the warm sandbox is ready
    again = sao_gym.make(ENV_ID, sandbox=spec)  # as the trainer does: a new env per episode
    await again.areset(seed=1)
    assert shared_pool(again.unwrapped._sandbox_spec) is pool
    obs, *_ = await again.astep(_py("import os; print(os.path.exists('mark'))"))
    assert obs[0]["content"].strip() == "False"  # single use: nothing of episode 1 is left
    assert pool.stats.warm_hits == 1
    await again.aclose()
    assert pool.stats.in_use == 0
    await aclose_shared_pools()
    assert pool.closed



async def test_a_script_that_never_closes_its_env_exits_cleanly():
    """The README's one-liner: no "Event loop is closed" / "Loop ... is closed" at exit."""
    await backend_class("local")  # skips without bubblewrap (unless SAO_SANDBOX_REQUIRE=local)
    done = await asyncio.to_thread(play_in_a_script, ENV_ID, _py("print(6 * 7)"))
    assert done.returncode == 0 and done.stdout.strip() == "42", done.stderr[-3000:]
    assert not [w for w in EXIT_WARNINGS if w in done.stderr], done.stderr[-3000:]
