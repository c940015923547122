"""WorkerPool's dispatch, broadcast and replacement logic, on in-process fake workers.

The real thing (Ray actors on a 2-node cluster, SIGKILL) is tests/runtime/place/test_ray.py.
"""

import asyncio

import pytest

from sao_gym.runtime.place.ray.pool import NoWorkersLeft, WorkerPool
from sao_gym.types import Rollout, StopReason


class Dead(Exception):
    """What a call on a dead fake worker raises."""


class Method:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return self.fn(*args)


class FakeWorker:
    """A worker whose episodes take ``delay`` seconds; ``die()`` fails all its calls."""

    pids = iter(range(1000, 2000))

    def __init__(self, index, generation, delay=0.02):
        self.index, self.generation, self.delay = index, generation, delay
        self.pid = next(self.pids)
        self.version = 0
        self.dead = asyncio.Event()
        self.started = []  # seeds begun here
        self.played = 0  # episodes finished here (its counters grow with them)
        self.ready = Method(self._ready)
        self.play = Method(self._play)
        self.update_weights = Method(self._update)
        self.close = Method(self._close)

    def die(self):
        self.dead.set()

    async def _guard(self, coro):
        task = asyncio.ensure_future(coro)
        dead = asyncio.ensure_future(self.dead.wait())
        await asyncio.wait({task, dead}, return_when=asyncio.FIRST_COMPLETED)
        dead.cancel()
        if task.done():
            return task.result()
        task.cancel()
        raise Dead(f"worker pid {self.pid} died")

    async def _ready(self):
        return {"pid": self.pid}

    async def _play(self, seed, version, box, sample_seed=None, env_kwargs=None):
        async def run():
            if version > self.version:
                await self._update(version, box)
            self.started.append(seed)
            await asyncio.sleep(self.delay)
            self.played += 1
            counters = {"prefill_tokens": 10 * self.played, "reused_tokens": self.played}
            return Rollout(token_ids=[1, 2], loss_mask=[0, 1], rollout_logprobs=[0.0, -1.0],
                           policy_versions=[-1, self.version], reward=float(seed),
                           terminated=True, truncated=False, stop_reason=StopReason.TERMINATED,
                           infra_failure=False, messages=[], env_id="fake", task_id=str(seed),
                           seed=seed), counters
        return await self._guard(run())

    async def _update(self, version, box):
        if self.dead.is_set():
            raise Dead("dead")
        self.version = max(self.version, version)
        return self.version

    async def _close(self):
        return None


def make_pool(workers=2, capacity=2, max_restarts=3, delay=0.02):
    spawned = []

    def spawn(index, generation):
        w = FakeWorker(index, generation, delay)
        spawned.append(w)
        return w

    pool = WorkerPool(spawn, workers=workers, capacity=capacity, dead_errors=(Dead,),
                      max_restarts=max_restarts, startup_timeout_s=5)
    return pool, spawned


async def test_episodes_spread_over_workers_within_capacity():
    pool, spawned = make_pool(workers=2, capacity=3)
    await pool.start()
    rollouts = await asyncio.gather(*(pool.play(s) for s in range(12)))
    assert sorted(r.seed for r in rollouts) == list(range(12))
    assert sorted(len(w.started) for w in spawned) == [6, 6]
    assert [s["episodes"] for s in pool.stats()] == [6, 6]
    # each worker reports its running totals; the pool sums the latest of each
    assert pool.counters() == {"prefill_tokens": 120, "reused_tokens": 12}


async def test_a_dead_worker_is_replaced_once_and_its_unfinished_episodes_rerun(caplog):
    pool, spawned = make_pool(workers=2, capacity=4, delay=0.2)
    await pool.start()
    await pool.update_weights(["w3"], 3)
    assert [w.version for w in spawned] == [3, 3]
    plays = [asyncio.ensure_future(pool.play(s)) for s in range(8)]
    await asyncio.sleep(0.05)
    victim = spawned[0]
    assert len(victim.started) == 4  # it dies with four episodes running
    victim.die()
    rollouts = await asyncio.gather(*plays)
    assert sorted(r.seed for r in rollouts) == list(range(8))  # every episode once
    assert pool.restarts == 1 and len(spawned) == 3  # four failed calls, one replacement
    replacement = spawned[2]
    assert (replacement.index, replacement.generation) == (0, 1)
    assert replacement.version == 3  # it fetched the current weights before playing
    stats = pool.stats()
    assert stats[0]["pid"] == replacement.pid != victim.pid and stats[0]["restarts"] == 1
    assert f"rollout worker 0 restarted: pid {victim.pid} -> {replacement.pid}" in caplog.text
    # the victim finished none of its episodes: the totals are the survivor's and the
    # replacement's (a dead worker's last report would be kept)
    assert pool.counters() == {"prefill_tokens": 10 * (4 + len(replacement.started)),
                               "reused_tokens": 4 + len(replacement.started)}


async def test_a_dead_workers_counters_stay_in_the_totals():
    pool, spawned = make_pool(workers=1, capacity=1)
    await pool.start()
    for seed in range(3):
        await pool.play(seed)
    assert pool.counters() == {"prefill_tokens": 30, "reused_tokens": 3}
    spawned[0].die()
    await pool.play(3)  # fails on the dead worker, reruns on its replacement
    assert len(spawned) == 2 and spawned[1].played == 1
    assert pool.counters() == {"prefill_tokens": 40, "reused_tokens": 4}


async def test_a_worker_that_keeps_dying_is_given_up_then_no_workers_left():
    pool, spawned = make_pool(workers=1, capacity=1, max_restarts=1, delay=0.5)
    await pool.start()
    play = asyncio.ensure_future(pool.play(0))
    for _ in range(2):
        await asyncio.sleep(0.1)
        spawned[-1].die()
    with pytest.raises(NoWorkersLeft, match="max_worker_restarts=1"):
        await play
    assert pool.restarts == 1 and len(spawned) == 2


async def test_close_closes_workers_and_calls_on_close():
    closed = []

    async def on_close():
        closed.append(True)

    pool, spawned = make_pool()
    pool._on_close = on_close
    await pool.start()
    await pool.aclose()
    await pool.aclose()
    assert closed == [True]

