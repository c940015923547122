"""64 sandboxes running Python snippets at once on a 2-core machine all answer correctly."""

from __future__ import annotations

import asyncio
import time

import pytest

pytestmark = pytest.mark.timeout(600)  # a broken sandbox must fail, not hang

N = 64


@pytest.mark.slow
async def test_64_concurrent_sandboxes(make_sandbox):
    async def one(i: int) -> str:
        sandbox = await make_sandbox()
        await sandbox.write_file("snippet.py", f"import sys\nprint({i} * {i}, sys.argv[1])\n")
        result = await sandbox.run(["python3", "snippet.py", str(i)], timeout_s=120)
        assert result.ok, result
        await sandbox.aclose()
        return result.stdout

    start = time.perf_counter()
    # return_exceptions: every task ends before the fixture checks for leftovers
    outputs = await asyncio.gather(*(one(i) for i in range(N)), return_exceptions=True)
    errors = [o for o in outputs if isinstance(o, BaseException)]
    if errors:
        raise errors[0]
    assert outputs == [f"{i * i} {i}\n" for i in range(N)]
    print(f"{N} sandboxes in {time.perf_counter() - start:.1f} s")


async def test_pool_over_a_real_backend_overlaps_start_and_cleans_up(make_sandbox):
    from sao_gym.sandbox import SandboxPool

    made = []

    def factory():
        sb = make_sandbox.cls()
        made.append(sb)
        return sb

    async with SandboxPool(factory, size=2, max_concurrency=4) as pool:
        assert pool.stats.started == 2
        leases = [pool.lease() for _ in range(4)]
        sandboxes = [await lease.get() for lease in leases]
        results = await asyncio.gather(*(sb.run(["python3", "-c", f"print({i} + 1)"])
                                         for i, sb in enumerate(sandboxes)))
        assert [r.stdout for r in results] == [f"{i + 1}\n" for i in range(4)]
        assert pool.stats.warm_hits == 2
        await asyncio.gather(*(lease.release() for lease in leases))
        assert pool.stats.in_use == 0
    assert len(made) >= 4
    for sb in made:  # every sandbox the pool made is closed: runs now fail
        with pytest.raises(Exception, match="closed|not started"):
            await sb.run(["true"])
