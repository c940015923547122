"""``python -m sao_gym.inference.leash -- CMD ...``: run CMD, and end it when the launcher dies.

A server launched as a child of the training process (or of a Ray rollout
worker) would outlive a launcher killed with SIGKILL, holding its port, its
memory and its GPU. The leash sits between them: it starts CMD as its own
child, in the leash's process group, checks once per ``--poll-s`` that its
parent is still the launcher (a dead launcher's children are handed to
another process), and when it is not, stops CMD (SIGTERM, then SIGKILL after
``--grace-s``). It exits with CMD's status (128 + N when signal N killed it).

Stop the pair by signalling the process group (``os.killpg``): CMD gets the
signal once, directly. A SIGTERM or SIGINT to the leash alone gives CMD
``--grace-s`` to end by itself, then SIGKILL.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time


def _stop(child: subprocess.Popen, grace_s: float) -> None:
    if child.poll() is None:
        child.terminate()
    try:
        child.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def main(argv: list[str] | None = None) -> int:
    """Run the command after ``--``; its exit status (or 1 if it had to be stopped)."""
    parser = argparse.ArgumentParser(prog="python -m sao_gym.inference.leash",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--poll-s", type=float, default=0.5)
    parser.add_argument("--grace-s", type=float, default=10.0)
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no command after --")
    launcher = os.getppid()
    child = subprocess.Popen(cmd)
    signalled: list[float] = []

    def note(_signum: int, _frame: object) -> None:
        signalled.append(time.monotonic())

    signal.signal(signal.SIGTERM, note)
    signal.signal(signal.SIGINT, note)
    while child.poll() is None:
        if os.getppid() != launcher:
            print(f"leash: launcher {launcher} is gone; stopping {cmd[0]} (pid {child.pid})",
                  file=sys.stderr, flush=True)
            _stop(child, args.grace_s)
            return 1
        if signalled and time.monotonic() - signalled[0] > args.grace_s:
            child.kill()  # asked to stop, and the command did not
        time.sleep(args.poll_s)
    code = child.returncode
    return 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell says


if __name__ == "__main__":
    sys.exit(main())
