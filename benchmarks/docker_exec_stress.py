"""DockerSandbox under load: do short commands ever lose their output?

Many sandboxes run `sh -c "echo N"` at once while a thread calls
`gc.collect()` every half millisecond; the collector's pauses stall the
readers, so a command's first output often arrives together with the exec's
HTTP response headers. Counts commands whose stdout is not exactly `N\\n`
(exit status and output of every command are checked; a command that
raises counts as wrong). Needs a Docker daemon
with the sandbox image (`sao-gym sandbox build-image`).

Run: .venv/bin/python benchmarks/docker_exec_stress.py --sandboxes 48 --runs 5 --repeats 3 \
        --json docs/data/docker_exec_stress/after.json

``--json`` also writes each trial's wrong commands (what each one got), its
time and how the script ran (``_record.py``; its ``commit`` is that of the
``sao_gym`` imported, so that a run with ``PYTHONPATH`` on an older worktree
names the older code).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import threading
import time

from _record import write_record

from sao_gym.sandbox.base import SandboxError
from sao_gym.sandbox.docker import DockerSandbox


async def one(i: int, runs: int) -> list[str]:
    """What each wrong command of sandbox ``i`` got (empty when all were right)."""
    async with DockerSandbox() as sandbox:
        wrong = []
        for _ in range(runs):
            try:
                r = await sandbox.run(["sh", "-c", f"echo {i}"], timeout_s=60)
            except SandboxError as e:  # counted, and the next command still runs
                print(f"sandbox {i}: {type(e).__name__}: {e}", flush=True)
                wrong.append(f"{type(e).__name__}: {e}")
                continue
            if r.exit_code != 0 or r.stdout != f"{i}\n":
                wrong.append(f"exit {r.exit_code}, stdout {r.stdout!r}")
        return wrong


async def trial(sandboxes: int, runs: int, gc_pressure: bool) -> list[str]:
    stop = threading.Event()

    def collect() -> None:
        while not stop.is_set():
            gc.collect()
            time.sleep(0.0005)

    thread = threading.Thread(target=collect, daemon=True)
    if gc_pressure:
        thread.start()
    try:
        per_sandbox = await asyncio.gather(*(one(i, runs) for i in range(sandboxes)))
        return [w for ws in per_sandbox for w in ws]
    finally:
        stop.set()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sandboxes", type=int, default=48)
    ap.add_argument("--runs", type=int, default=5, help="commands per sandbox")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-gc-pressure", action="store_true")
    ap.add_argument("--json", help="also write every trial's wrong commands here")
    args = ap.parse_args()
    if not asyncio.run(DockerSandbox.available()):
        raise SystemExit("no Docker daemon with the sandbox image; see docs/sandbox.md")
    trials = []
    for k in range(args.repeats):
        start = time.perf_counter()
        got = asyncio.run(trial(args.sandboxes, args.runs, not args.no_gc_pressure))
        trials.append({"wrong": got, "seconds": round(time.perf_counter() - start, 2)})
        print(f"trial {k + 1}: {len(got)} of {args.sandboxes * args.runs} commands wrong "
              f"({trials[-1]['seconds']:.1f} s)", flush=True)
    wrong = [len(t["wrong"]) for t in trials]
    summary = {"commands": args.sandboxes * args.runs * args.repeats,
               "wrong": sum(wrong), "per_trial": wrong}
    print(json.dumps(summary))
    if args.json:
        write_record(args.json, {**summary, "sandboxes": args.sandboxes, "runs": args.runs,
                                 "gc_pressure": not args.no_gc_pressure, "trials": trials})


if __name__ == "__main__":
    main()
