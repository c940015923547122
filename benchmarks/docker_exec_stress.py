"""DockerSandbox under load: do short commands ever lose their output?

Many sandboxes run `sh -c "echo N"` at once while a thread calls
`gc.collect()` every half millisecond; the collector's pauses stall the
readers, so a command's first output often arrives together with the exec's
HTTP response headers. Counts commands whose stdout is not exactly `N\\n`
(exit status and output of every command are checked; a command that
raises counts as wrong). Needs a Docker daemon
with the sandbox image (`sao-gym sandbox build-image`).

Run: .venv/bin/python benchmarks/docker_exec_stress.py --sandboxes 48 --runs 5 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import threading
import time

from sao_gym.sandbox.base import SandboxError
from sao_gym.sandbox.docker import DockerSandbox


async def one(i: int, runs: int) -> int:
    async with DockerSandbox() as sandbox:
        wrong = 0
        for _ in range(runs):
            try:
                r = await sandbox.run(["sh", "-c", f"echo {i}"], timeout_s=60)
            except SandboxError as e:  # counted, and the next command still runs
                print(f"sandbox {i}: {type(e).__name__}: {e}", flush=True)
                wrong += 1
                continue
            wrong += r.exit_code != 0 or r.stdout != f"{i}\n"
        return wrong


async def trial(sandboxes: int, runs: int, gc_pressure: bool) -> int:
    stop = threading.Event()

    def collect() -> None:
        while not stop.is_set():
            gc.collect()
            time.sleep(0.0005)

    thread = threading.Thread(target=collect, daemon=True)
    if gc_pressure:
        thread.start()
    try:
        return sum(await asyncio.gather(*(one(i, runs) for i in range(sandboxes))))
    finally:
        stop.set()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sandboxes", type=int, default=48)
    ap.add_argument("--runs", type=int, default=5, help="commands per sandbox")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-gc-pressure", action="store_true")
    args = ap.parse_args()
    if not asyncio.run(DockerSandbox.available()):
        raise SystemExit("no Docker daemon with the sandbox image; see docs/sandbox.md")
    wrong = []
    for k in range(args.repeats):
        start = time.perf_counter()
        wrong.append(asyncio.run(trial(args.sandboxes, args.runs, not args.no_gc_pressure)))
        print(f"trial {k + 1}: {wrong[-1]} of {args.sandboxes * args.runs} commands wrong "
              f"({time.perf_counter() - start:.1f} s)", flush=True)
    print(json.dumps({"commands": args.sandboxes * args.runs * args.repeats,
                      "wrong": sum(wrong), "per_trial": wrong}))


if __name__ == "__main__":
    main()
