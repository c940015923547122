"""DockerSandbox latency: warm exec, cold start, file round trip, close.

"warm exec" is `run(["true"])` on a started container (what an agent's tool
call pays per command); "cold start" is `start()` of a new container; "file
round trip" is `write_file` + `read_file` of 4 KiB; "close" is `aclose()`.
Needs a Docker daemon with the sandbox image (`sao-gym sandbox build-image`).

Run: .venv/bin/python benchmarks/docker_sandbox.py --repeats 5 --execs 50 \
        --json docs/data/docker_sandbox.json

``--json`` also writes every repeat (each warm exec's time included), the
medians and how the script ran (``_record.py``). Times are in seconds there.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from _record import write_record

from sao_gym.sandbox.docker import DockerSandbox


async def measure(execs: int) -> dict:
    t0 = time.perf_counter()
    sandbox = DockerSandbox()
    await sandbox.start()
    start = time.perf_counter() - t0
    try:
        await sandbox.run(["true"])  # first exec after start: not part of "warm"
        warm = []
        for _ in range(execs):
            t = time.perf_counter()
            r = await sandbox.run(["true"])
            warm.append(time.perf_counter() - t)
            assert r.exit_code == 0
        t = time.perf_counter()
        await sandbox.write_file("f.bin", b"x" * 4096)
        await sandbox.read_file("f.bin")
        files = time.perf_counter() - t
    finally:
        t = time.perf_counter()
        await sandbox.aclose()
        close = time.perf_counter() - t
    return {"warm exec": statistics.median(warm), "cold start": start,
            "file round trip": files, "close": close, "warm execs": warm}


async def main(repeats: int, execs: int, json_path: str | None = None) -> int:
    if not await DockerSandbox.available():
        print("no Docker daemon with the sandbox image; see docs/sandbox.md", file=sys.stderr)
        return 1
    rows = [await measure(execs) for _ in range(repeats)]
    keys = [k for k in rows[0] if k != "warm execs"]
    print("| repeat | " + " | ".join(f"{k} (ms)" for k in keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for i, row in enumerate(rows):
        print(f"| {i} | " + " | ".join(f"{row[k] * 1000:.1f}" for k in keys) + " |")
    print("| median | " + " | ".join(
        f"{statistics.median(r[k] for r in rows) * 1000:.1f}" for k in keys) + " |")
    if json_path:
        write_record(json_path, {"repeats": repeats, "execs": execs, "rows_s": rows,
                                 "median_s": {k: statistics.median(r[k] for r in rows)
                                              for k in keys}})
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--execs", type=int, default=50, help="warm execs per repeat")
    parser.add_argument("--json", help="also write the raw results here")
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.repeats, args.execs, args.json)))
