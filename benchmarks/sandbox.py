"""Sandbox latencies: LocalSandbox (bubblewrap) and, when available, DockerSandbox.

Usage:
    .venv/bin/python benchmarks/sandbox.py --repeats 200

Measured, as medians over ``--repeats`` samples taken round-robin (so that
machine noise hits every case alike):

* ``local true``: ``LocalSandbox.run(["true"])`` on a started sandbox (target < 15 ms);
* ``local python``: ``run(["python3", "-c", "print(1)"])`` (target < 60 ms);
* ``local start+close``: ``start()`` then ``aclose()`` of a fresh sandbox;
* ``docker true`` / ``docker python``: the same on a warm DockerSandbox
  (target < 100 ms), when a Docker daemon and the sandbox image are available;
* ``floor: spawn true``: ``asyncio.create_subprocess_exec("true")`` with no
  sandbox at all, the cost every backend pays to start a process from asyncio.

``--json PATH`` also writes every sample (ms), each case's median, p10 and p90
and how the script ran (``_record.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time
from collections.abc import Awaitable, Callable

from _record import write_record

from sao_gym.sandbox.local import LocalSandbox

TARGETS_MS = {"local true": 15, "local python": 60, "docker true": 100, "docker python": 100}


async def timed(fn: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await fn()
    return (time.perf_counter() - start) * 1000


async def spawn_true() -> None:
    proc = await asyncio.create_subprocess_exec("true")
    await proc.wait()


async def start_close() -> None:
    sandbox = LocalSandbox()
    await sandbox.start()
    await sandbox.aclose()


async def checked(sandbox, argv: list[str]) -> None:
    result = await sandbox.run(argv)
    assert result.ok, result


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeats", type=int, default=200, help="samples per case")
    ap.add_argument("--no-docker", action="store_true", help="skip DockerSandbox")
    ap.add_argument("--json", help="also write every sample and the summary here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    local = LocalSandbox()
    await local.start()
    cases: dict[str, Callable[[], Awaitable[object]]] = {
        "floor: spawn true": spawn_true,
        "local true": lambda: checked(local, ["true"]),
        "local python": lambda: checked(local, ["python3", "-c", "print(1)"]),
        "local start+close": start_close,
    }
    docker = None
    if not args.no_docker:
        try:
            from sao_gym.sandbox.docker import DockerSandbox

            if await DockerSandbox.available():
                docker = DockerSandbox()
                await docker.start()
                cases["docker true"] = lambda: checked(docker, ["true"])
                cases["docker python"] = lambda: checked(docker, ["python3", "-c", "print(1)"])
        except ImportError:
            pass
    if docker is None:
        print("DockerSandbox: not available here (no daemon or image); skipped")
    try:
        for fn in cases.values():  # warm-up
            await fn()
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.repeats):
            for name, fn in cases.items():
                samples[name].append(await timed(fn))
    finally:
        await local.aclose()
        if docker is not None:
            await docker.aclose()

    print(f"{'case':<20} {'median ms':>10} {'p10':>8} {'p90':>8}  target")
    summary = {}
    for name, values in samples.items():
        q, median = statistics.quantiles(values, n=10), statistics.median(values)
        summary[name] = {"median_ms": median, "p10_ms": q[0], "p90_ms": q[-1]}
        target = TARGETS_MS.get(name)
        verdict = "" if target is None else f"< {target} ms: {'ok' if median < target else 'MISS'}"
        print(f"{name:<20} {median:>10.2f} {q[0]:>8.2f} {q[-1]:>8.2f}  {verdict}")
    if args.json:
        write_record(args.json, {"repeats": args.repeats, "docker": docker is not None,
                                 "summary": summary, "samples_ms": samples})


if __name__ == "__main__":
    asyncio.run(main())
