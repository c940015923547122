"""CoqProof leases its sandbox at reset (it starts while the model thinks), frees it at submit."""

from __future__ import annotations

import asyncio
import shutil

import pytest

import sao_gym
from sao_gym.sandbox import aclose_shared_pools, shared_pool
from tests.helpers import EXIT_WARNINGS, call, calls_msg, play_in_a_script
from tests.sandbox.conftest import backend_class

ENV_ID = "sao_gym/CoqProof-v0"


@pytest.mark.skipif(shutil.which("coqc") is None, reason="coqc is not installed")
async def test_sandbox_is_leased_at_reset_and_released_at_submission():
    await backend_class("local")
    env = sao_gym.make(ENV_ID)
    await env.areset(options={"task": "and_swap"})
    pool = shared_pool("local")
    await asyncio.sleep(0.5)  # the model's first turn: the sandbox starts meanwhile
    assert pool.stats.in_use == 1 and pool.stats.started == 1
    proof = env.unwrapped.task["reference_proof"]
    _, reward, terminated, *_ = await env.astep(
        calls_msg(call("submit_proof", {"script": proof})))
    assert (reward, terminated) == (1.0, True)
    assert pool.stats.in_use == 0  # released (closed) with the episode's end
    await env.areset(options={"task": "and_swap"})
    await env.aclose()
    assert pool.stats.in_use == 0 and pool.stats.failures == 0
    await aclose_shared_pools()


@pytest.mark.skipif(shutil.which("coqc") is None, reason="coqc is not installed")
async def test_a_script_that_never_closes_its_env_exits_cleanly():
    await backend_class("local")
    done = await asyncio.to_thread(
        play_in_a_script, ENV_ID, calls_msg(call("check_proof", {"script": "Proof. Qed."})))
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-3000:]
    assert not [w for w in EXIT_WARNINGS if w in done.stderr], done.stderr[-3000:]
