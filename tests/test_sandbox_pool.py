import asyncio

import pytest

from sao_gym.sandbox import Limits, SandboxError, SandboxPool, SandboxTimeout, make_sandbox


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
    assert pool.stats.in_use == 0
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
