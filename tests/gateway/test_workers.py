"""Harness episodes in worker processes: the same episodes, off the sampler's process.

:class:`~sao_gym.gateway.workers.HarnessWorkers` runs a program harness's episodes
in real worker processes (tests/gateway/harnesses.py), against the gateway over
HTTP; the rollouts they give are the ones the in-process harness gives.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from sao_gym.gateway.harness import Harness, HarnessFailed
from sao_gym.gateway.workers import HarnessWorkers
from tests.gateway.test_harness import H, agent_backend, tasks, tok  # noqa: F401 (fixtures)

URL = "http://127.0.0.1:9/episodes/x/v1"  # nothing listens: these harnesses call no model


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_episodes_run_in_other_processes_and_their_prints_are_not_the_protocol():
    workers = HarnessWorkers(Harness(f"{H}:reports_pid"), 2)
    try:
        pids = await asyncio.gather(*(workers.run(URL, {"id": i}) for i in range(4)))
        assert all(p not in (None, -1.0, float(os.getpid())) for p in pids)
        assert {int(p) for p in pids} == {p for p in workers.pids if p is not None}
        assert len(set(pids)) == 2  # the least loaded worker takes the next episode
    finally:
        await workers.aclose()
    assert workers.pids == [None, None]
    deadline = time.monotonic() + 10
    while not all(_gone(int(p)) for p in set(pids)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert all(_gone(int(p)) for p in set(pids))


async def test_a_harness_that_raises_or_cannot_be_imported_fails_its_episode():
    crashing = HarnessWorkers(Harness(f"{H}:crashes"), 1)
    missing = HarnessWorkers(Harness("tests.gateway.no_such_module:run"), 1)
    try:
        with pytest.raises(HarnessFailed, match="raised APIConnectionError"):
            await crashing.run(URL, {"key": "1"})
        with pytest.raises(HarnessFailed, match="no_such_module"):
            await missing.run(URL, {})
        with pytest.raises(HarnessFailed, match="takes JSON tasks"):
            await missing.run(URL, {"when": object()})
    finally:
        await crashing.aclose()
        await missing.aclose()


async def test_a_worker_that_dies_fails_its_episodes_and_is_started_again():
    workers = HarnessWorkers(Harness(f"{H}:reports_pid"), 1)
    try:
        first = await workers.run(URL, {})
        waiting, dying = await asyncio.gather(workers.run(URL, {"wait": 5}),
                                              workers.run(URL, {"die": True}),
                                              return_exceptions=True)
        for failed in (waiting, dying):  # both episodes of the dead worker
            assert isinstance(failed, HarnessFailed) and "exited with 7" in str(failed)
        second = await asyncio.wait_for(workers.run(URL, {}), 30)  # a new worker
        assert second != first and workers.pids == [int(second)] and _gone(int(first))
    finally:
        await workers.aclose()


async def test_a_cancelled_episode_is_cancelled_in_its_worker_and_the_worker_goes_on(tmp_path):
    waits = HarnessWorkers(Harness(f"{H}:waits_for_cancel"), 1)
    marker = tmp_path / "cancelled"
    try:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(waits.run(URL, {"marker": str(marker)}), 3)
        deadline = time.monotonic() + 10
        while not marker.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert marker.read_text() == str(waits.pids[0])  # cancelled there, worker alive
        with pytest.raises(TimeoutError):  # and it takes the next episode
            await asyncio.wait_for(waits.run(URL, {"marker": str(tmp_path / "2")}), 1)
    finally:
        await waits.aclose()


def test_workers_run_programs_only():
    with pytest.raises(ValueError, match="a command harness runs as a process of its own"):
        HarnessWorkers(Harness(command=("my-agent",)), 1)
    with pytest.raises(ValueError, match="processes >= 1"):
        HarnessWorkers(Harness(f"{H}:lookup_loop"), 0)


async def test_harness_rollouts_from_workers_equal_the_in_process_ones(tok, tasks):  # noqa: F811
    from sao_gym.gateway.rollouts import HarnessRollouts

    def runs(workers):
        return HarnessRollouts(Harness(f"{H}:lookup_loop", timeout_s=60), tasks,
                               agent_backend(tok), tok, max_new_tokens=64,
                               max_context_tokens=2048, workers=workers)

    here, there = runs(0), runs(2)
    try:
        a = [await here.play(s, sample_seed=100 + s) for s in range(3)]
        b = await asyncio.gather(*(there.play(s, sample_seed=100 + s) for s in range(3)))
    finally:
        await here.aclose()
        await there.aclose()
    for x, y in zip(a, b, strict=True):
        assert not y.infra_failure and y.reward == x.reward == 1.0
        assert (y.token_ids, y.loss_mask, y.rollout_logprobs) == \
            (x.token_ids, x.loss_mask, x.rollout_logprobs)
        assert y.messages == x.messages and y.task_id == x.task_id
