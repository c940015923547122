"""Looking at processes from tests: process trees, liveness, launched servers."""

from __future__ import annotations

import os
import time
from collections.abc import Callable


def parent_of(pid: int) -> int | None:
    """``pid``'s parent pid, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def descendants(root: int | None = None) -> set[int]:
    """``root`` (default: this process) and every process under it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ppid = parent_of(int(entry))
            if ppid is not None:
                children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [root or os.getpid()]
    while todo:
        pid = todo.pop()
        out.add(pid)
        todo.extend(children.get(pid, []))
    return out


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` s pass; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.1)
    return predicate()


def command_line(pid: int) -> bytes:
    """``pid``'s arguments, NUL-separated (empty when it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


SERVER_COMMANDS = (b"sao_gym.cli\0serve", b"vllm.entrypoints.openai.api_server")


def server_processes(root: int | None = None) -> list[int]:
    """Pids of the inference servers (``sao-gym serve``, ``vllm``) under ``root``, not the
    leashes they run on."""
    return sorted(pid for pid in descendants(root) if pid != (root or os.getpid())
                  and any(c in command_line(pid) for c in SERVER_COMMANDS)
                  and b"sao_gym.inference.leash" not in command_line(pid))
