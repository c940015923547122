"""SandboxPool, the pools shared per event loop, and an env's EpisodeSandbox (fakes only)."""

import asyncio

import pytest

from sao_gym.core import AgentEnv
from sao_gym.sandbox import (
    POOL_OPTIONS,
    EpisodeSandbox,
    Limits,
    SandboxError,
    SandboxPool,
    SandboxTimeout,
    SandboxUnavailable,
    aclose_shared_pools,
    make_sandbox,
    shared_pool,
    split_pool_options,
)


class FakeSandbox:
    """Counts live instances; start/close delays and failures on demand."""

    live = 0

    def __init__(self, start_s=0.0, fail=False, close_s=0.0):
        self.start_s, self.fail, self.close_s = start_s, fail, close_s
        self.started = self.closed = False
        self.workdir = "/work"

    async def start(self):
        FakeSandbox.live += 1
        await asyncio.sleep(self.start_s)
        if self.fail:
            raise OSError("cannot start")
        self.started = True

    async def aclose(self):
        if not self.closed:
            await asyncio.sleep(self.close_s)
            self.closed = True
            FakeSandbox.live -= 1


@pytest.fixture(autouse=True)
def _reset():
    FakeSandbox.live = 0
    yield
    assert FakeSandbox.live == 0, "a sandbox leaked"


async def test_warm_pool_serves_and_refills():
    pool = SandboxPool(FakeSandbox, size=2, max_concurrency=4)
    await pool.start()
    assert pool.stats.started == 2
    sb = await pool.acquire()
    assert sb.started and pool.stats.warm_hits == 1
    await asyncio.sleep(0.01)
    assert len(pool._warm) == 2 and pool.stats.started == 3  # refilled in the background
    await pool.release(sb)
    assert sb.closed and pool.stats.in_use == 0
    await pool.aclose()


async def test_concurrency_is_bounded():
    pool = SandboxPool(FakeSandbox, size=0, max_concurrency=2)
    a, b = await pool.acquire(), await pool.acquire()
    third = asyncio.ensure_future(pool.acquire())
    await asyncio.sleep(0.05)
    assert not third.done()
    await pool.release(a)
    c = await asyncio.wait_for(third, 1)
    assert c is not a and pool.stats.in_use == 2
    await pool.release(b)
    await pool.release(c)
    await pool.aclose()


async def test_lease_overlaps_start_with_other_work():
    pool = SandboxPool(lambda: FakeSandbox(start_s=0.2), max_concurrency=4)
    lease = pool.lease()
    await asyncio.sleep(0.25)  # "the model generates its first turn"
    t0 = asyncio.get_running_loop().time()
    sb = await lease.get()
    assert asyncio.get_running_loop().time() - t0 < 0.05 and sb.started
    await lease.release()
    await lease.release()
    assert sb.closed
    with pytest.raises(SandboxError, match="released"):
        await lease.get()
    await pool.aclose()


async def test_released_lease_cancels_provisioning_without_leaks():
    pool = SandboxPool(lambda: FakeSandbox(start_s=0.5), max_concurrency=1)
    lease = pool.lease()
    await asyncio.sleep(0.05)
    await lease.release()
    assert pool.stats.in_use == 0 and pool.stats.failures == 0  # a cancel is no failure
    sb = await asyncio.wait_for(pool.acquire(), 2)  # the slot came back
    await pool.release(sb)
    await pool.aclose()


async def test_setup_timeout_and_start_failure_free_the_slot():
    pool = SandboxPool(lambda: FakeSandbox(start_s=5), max_concurrency=1, setup_timeout_s=0.05)
    with pytest.raises(SandboxTimeout, match="took over"):
        await pool.acquire()
    broken = SandboxPool(lambda: FakeSandbox(fail=True), max_concurrency=1)
    with pytest.raises(OSError):
        await (broken.lease()).get()
    with pytest.raises(OSError):
        await broken.acquire()
    assert pool.stats.failures == 1 and broken.stats.failures == 2
    await pool.aclose()
    await broken.aclose()


async def test_teardown_timeout_is_logged_not_raised(caplog):
    pool = SandboxPool(lambda: FakeSandbox(close_s=5), teardown_timeout_s=0.05)
    sb = await pool.acquire()
    await pool.release(sb)
    assert pool.stats.failures == 1 and "teardown failed" in caplog.text
    FakeSandbox.live = 0  # the fake never finished closing; nothing real leaked
    await pool.aclose()
    with pytest.raises(SandboxError, match="closed"):
        await pool.acquire()


def test_make_sandbox_validates_specs():
    with pytest.raises(ValueError, match="unknown sandbox backend"):
        make_sandbox("vm")
    with pytest.raises(ValueError, match="unknown sandbox limits"):
        make_sandbox({"backend": "local", "limits": {"ram": 1}})
    assert Limits().memory_mb == 1024


# ----- pool options in a sandbox spec -------------------------------------------------------
def test_pool_options_are_split_from_the_spec_and_checked():
    assert split_pool_options("local") == ("local", POOL_OPTIONS)
    spec, options = split_pool_options({"backend": "docker", "pool": {"size": 3}})
    assert spec == {"backend": "docker"} and options == {**POOL_OPTIONS, "size": 3}
    assert POOL_OPTIONS["size"] == 0  # no warm sandboxes unless asked for
    for pool, match in [(3, "must be a mapping"), ({"warm": 1}, "unknown sandbox pool options"),
                        ({"size": -1}, "size must be an int >= 0"),
                        ({"max_concurrency": 0}, "max_concurrency must be an int >= 1"),
                        ({"setup_timeout_s": 0}, "setup_timeout_s must be a number > 0"),
                        ({"teardown_timeout_s": float("inf")}, "teardown_timeout_s")]:
        with pytest.raises(ValueError, match=match):
            split_pool_options({"backend": "local", "pool": pool})
        with pytest.raises(ValueError, match=match):  # what the envs check at construction
            make_sandbox({"backend": "local", "pool": pool})
    assert make_sandbox({"backend": "local", "pool": {"size": 1}}).limits == Limits()
    assert split_pool_options({"pool": {"setup_timeout_s": None}})[1]["setup_timeout_s"] is None


# ----- pools shared per event loop ----------------------------------------------------------
def fake_make(spec):
    """A module-level builder (one identity: the pools it keys are shared)."""
    return FakeSandbox()


def other_make(spec):
    return FakeSandbox()


async def test_shared_pools_are_keyed_by_spec_content_and_builder():
    a = shared_pool({"backend": "local", "limits": {"pids": 8, "memory_mb": 64}}, make=fake_make)
    b = shared_pool({"limits": {"memory_mb": 64, "pids": 8}}, make=fake_make)
    assert a is b
    assert shared_pool("local", make=fake_make) is shared_pool({"backend": "local"},
                                                                make=fake_make)
    assert shared_pool("local", make=fake_make) is not a
    assert shared_pool("local", make=other_make) is not shared_pool("local", make=fake_make)
    sized = shared_pool({"backend": "local", "pool": {"size": 1, "max_concurrency": 3}},
                        make=fake_make)
    assert (sized.size, sized.max_concurrency) == (1, 3) and sized is not a
    sb = await sized.acquire()  # the builder gets the spec without "pool"
    await sized.release(sb)
    await aclose_shared_pools()
    assert sized.closed and shared_pool({"backend": "local", "pool": {"size": 1,
                                         "max_concurrency": 3}}, make=fake_make) is not sized
    await aclose_shared_pools()


async def test_the_default_builder_is_make_sandbox_read_at_each_call(monkeypatch):
    seen = []

    def recording_make(spec):
        seen.append(spec)
        return FakeSandbox()

    monkeypatch.setattr("sao_gym.sandbox.factory.make_sandbox", recording_make)
    pool = shared_pool({"backend": "docker", "image": "x:1", "pool": {"size": 0}})
    sb = await pool.acquire()
    await pool.release(sb)
    assert seen == [{"backend": "docker", "image": "x:1"}]
    await aclose_shared_pools()


def test_shared_pools_belong_to_one_loop_and_close_with_it():
    async def fill():
        pool = shared_pool({"backend": "local", "pool": {"size": 2}}, make=fake_make)
        await pool.start()
        assert FakeSandbox.live == 2
        return pool

    first = asyncio.run(fill())  # asyncio.run shuts the loop down: its pools close
    assert first.closed and FakeSandbox.live == 0
    second = asyncio.run(fill())
    assert second is not first and FakeSandbox.live == 0

    async def with_a_runner():
        return await fill()

    with asyncio.Runner() as runner:
        third = runner.run(with_a_runner())
        assert FakeSandbox.live == 2 and not third.closed
    assert third.closed and FakeSandbox.live == 0


def test_a_sandbox_still_leased_closes_with_its_loop():
    """A script that never closes its env (``asyncio.run(run_episode(make(...), agent))``):
    the episode's sandbox closes while ``asyncio.run`` shuts the loop down, not later on
    a closed loop (where a subprocess transport prints "Event loop is closed")."""
    async def lease_and_forget(spec):
        box = EpisodeSandbox()
        await box.lease(spec, make=fake_make)
        return await box.get()

    for spec in ("local", {"backend": "local", "pool": {"size": 1}}):  # cold and warm pools
        sandbox = asyncio.run(lease_and_forget(spec))
        assert sandbox.closed and FakeSandbox.live == 0
    with asyncio.Runner() as runner:
        sandbox = runner.run(lease_and_forget("local"))
        assert not sandbox.closed  # the loop lives on: the lease may be used again
    assert sandbox.closed and FakeSandbox.live == 0


# ----- an env's episode sandbox -------------------------------------------------------------
async def test_episode_sandbox_leases_in_the_background_and_is_single_use():
    pool = SandboxPool(lambda: FakeSandbox(start_s=0.1))
    box = EpisodeSandbox(pool)
    assert not box.leased and box.sandbox is None
    await box.lease()
    assert box.leased and pool.stats.in_use == 0
    await asyncio.sleep(0.15)  # the model's first turn: the start happens meanwhile
    assert pool.stats.started == 1
    first = await box.get()
    assert first.started and box.sandbox is first and await box.get() is first
    await box.lease()  # the next reset: the old sandbox is closed, a new one leased
    assert first.closed and box.sandbox is None
    second = await box.get()
    assert second is not first
    await box.release()
    await box.release()
    assert second.closed and pool.stats.in_use == 0 and not box.leased
    with pytest.raises(SandboxError, match="no sandbox is leased"):
        await box.get()
    await pool.aclose()


async def test_episode_sandbox_start_failure_raises_at_get_and_frees_the_slot():
    class Unavailable(FakeSandbox):
        async def start(self):
            FakeSandbox.live += 1
            raise SandboxUnavailable("no bubblewrap")

    pool = SandboxPool(Unavailable, max_concurrency=1)
    box = EpisodeSandbox(pool)
    await box.lease()
    with pytest.raises(SandboxUnavailable):
        await box.get()
    await box.release()
    assert pool.stats.in_use == 0 and pool.stats.failures == 1
    await pool.aclose()


async def test_episode_sandbox_uses_the_shared_pool_of_its_spec():
    box = EpisodeSandbox()
    await box.lease({"backend": "local", "pool": {"size": 1}}, make=fake_make)
    sb = await box.get()
    pool = shared_pool({"backend": "local", "pool": {"size": 1}}, make=fake_make)
    assert pool.stats.in_use == 1
    await box.release()
    assert sb.closed and pool.stats.in_use == 0
    await aclose_shared_pools()


class PooledEnv(AgentEnv):
    """A toy env holding an EpisodeSandbox, like MathTIR: sandbox used by a step."""

    def __init__(self, pool):
        super().__init__()
        self.box = EpisodeSandbox(pool, owner=self)

    async def on_reset(self, options):
        await self.box.lease()
        return [{"role": "user", "content": "go"}], {}

    async def on_step(self, action):
        sb = await self.box.get()
        return [{"role": "user", "content": sb.workdir}], 0.0, False, False, {}

    async def on_close(self):
        await self.box.release()


def test_under_the_sync_api_provisioning_waits_for_first_use():
    """The sync API's loop stops between calls: nothing is left starting in between."""
    made = []

    def factory():
        made.append(FakeSandbox())
        return made[-1]

    env = PooledEnv(SandboxPool(factory))
    env.reset(seed=0)
    assert made == []  # deferred, not started on a loop that is about to stop
    assert env.step("x")[0][0]["content"] == "/work" and len(made) == 1
    env.reset(seed=1)
    assert made[0].closed and len(made) == 1
    env.close()
    assert FakeSandbox.live == 0


async def test_under_the_async_api_provisioning_starts_at_reset():
    made = []

    def factory():
        made.append(FakeSandbox())
        return made[-1]

    pool = SandboxPool(factory)
    env = PooledEnv(pool)
    await env.areset(seed=0)
    await asyncio.sleep(0.05)  # the model's first turn
    assert len(made) == 1 and pool.stats.started == 1  # before any step
    await env.aclose()
    assert made[0].closed and pool.stats.in_use == 0
    await pool.aclose()
