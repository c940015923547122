"""The exec plumbing of :class:`~sao_gym.sandbox.docker.DockerSandbox`.

What runs inside the container (the init, the per-command wrapper, the file
scripts) and the host-side reader of Docker's multiplexed exec stream. Why
the init and the wrapper look like this: the docstring of
:mod:`sao_gym.sandbox.docker` and docs/sandbox.md.
"""

from __future__ import annotations

import errno
import io
import os
import select
import socket
import ssl
import tarfile
from dataclasses import dataclass
from typing import Any

from sao_gym.sandbox.base import SandboxUnavailable

# PID 1 of every container (run by ``python3 -I -S -c``): reap orphans; on
# SIGUSR1 SIGKILL everything else (kill(-1) skips the caller and PID 1).
# USR1 is its only handled signal: from inside the container, signals without
# a handler cannot reach a PID namespace's init (Python's SIGINT handler
# would let `kill -INT 1` end the container, hence SIG_DFL).
INIT = """
import os, signal
def kill_all(*_):
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass
signal.signal(signal.SIGUSR1, kill_all)
signal.signal(signal.SIGINT, signal.SIG_DFL)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
while True:
    signal.sigtimedwait({signal.SIGCHLD}, 5.0)
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
"""
# Runs one command: "$1" is the cwd, the rest the argv. Makes the command the
# OOM killer's preferred victim (over PID 1), then kills whatever it left behind.
WRAPPER = ('cd -- "$1" || exit 126; shift; '
            '{ echo 1000 >/proc/self/oom_score_adj; } 2>/dev/null; '
            '"$@"; rc=$?; kill -9 -1 2>/dev/null; exit $rc')
# File scripts: "$1" is the workdir, the rest the path's components. Each
# component is checked (no symlinks, directories where expected); exit codes
# map to errno values in FILE_ERRORS.
_WALK = ('d=$1; shift; while [ $# -gt {keep} ]; do d=$d/$1; shift; [ -L "$d" ] && exit 5; '
         '{make}[ -d "$d" ] || exit 6; done; ')
WRITE = (_WALK.format(keep=1, make='[ -e "$d" ] || mkdir -- "$d" || exit 1; ')
          + 'f=$d/$1; [ -L "$f" ] && exit 5; [ -d "$f" ] && exit 4; '
            '[ ! -e "$f" ] || [ -f "$f" ] || exit 7; exec cat > "$f"')
READ = (_WALK.format(keep=1, make='[ -e "$d" ] || exit 3; ')
         + 'f=$d/$1; [ -L "$f" ] && exit 5; [ -e "$f" ] || exit 3; [ -d "$f" ] && exit 4; '
           '[ -f "$f" ] || exit 7; exec cat -- "$f"')
UNTAR = (_WALK.format(keep=0, make='[ -e "$d" ] || mkdir -- "$d" || exit 1; ')
          + 'exec tar -x --no-same-owner -f - -C "$d"')
FILE_ERRORS = {
    3: (errno.ENOENT, "no such file in the sandbox"),
    4: (errno.EISDIR, "is a directory"),
    5: (errno.ELOOP, "refusing to follow a symlink inside the sandbox"),
    6: (errno.ENOTDIR, "not a directory"),
    7: (errno.EINVAL, "not a regular file"),
    128 + 25: (errno.EFBIG, "larger than the sandbox's file_size_mb limit"),  # SIGXFSZ
}
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
OOM_COUNTER = ("cat /sys/fs/cgroup/memory.events 2>/dev/null "
                "|| cat /sys/fs/cgroup/memory/memory.oom_control")


@dataclass
class RawResult:
    """What one exec did, before decoding."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    truncated: bool
    timed_out: bool
    duration_s: float



class StreamPump:
    """Reads Docker's multiplexed exec stream (8-byte frame headers), writes stdin.

    ``early`` is the start of the stream already read off the socket (see :func:`hijacked`).
    """

    def __init__(self, sock: socket.socket, stdin: bytes | None, cap: int | None,
                 early: bytes = b""):
        self.sock = sock
        self.cap = cap
        self.out = {1: bytearray(), 2: bytearray()}
        self.truncated = False
        self.eof = False
        self._buf = bytearray()
        self._stdin = memoryview(stdin) if stdin else None
        sock.setblocking(False)
        self._poller = select.poll()
        self._poller.register(sock, select.POLLIN)
        if stdin is not None and not stdin:
            self._close_stdin()
        if early:  # stream bytes the HTTP client read along with the headers
            self._feed(early)

    def _close_stdin(self) -> None:
        self._stdin = None
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def step(self, wait_s: float) -> None:
        """Wait up to ``wait_s`` for the socket, then move what is ready."""
        readable = isinstance(self.sock, ssl.SSLSocket) and self.sock.pending()
        if not readable:
            # poll, not select: file descriptors may exceed FD_SETSIZE in a big process
            self._poller.modify(self.sock, select.POLLIN | (
                select.POLLOUT if self._stdin is not None else 0))
            events = self._poller.poll(wait_s * 1000)
            mask = events[0][1] if events else 0
            readable = bool(mask & (select.POLLIN | select.POLLHUP | select.POLLERR))
            if mask & (select.POLLOUT | select.POLLERR) and self._stdin is not None:
                try:
                    sent = self.sock.send(self._stdin[:1 << 16])
                    self._stdin = self._stdin[sent:]
                    if not self._stdin:
                        self._close_stdin()
                except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                    pass
                except OSError:  # the command closed its stdin: drop the rest
                    self._close_stdin()
        if readable:
            try:
                data = self.sock.recv(1 << 18)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except ConnectionResetError:
                data = b""
            if not data:
                self.eof = True
                return
            self._feed(data)

    def _feed(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        while len(buf) >= 8:
            size = int.from_bytes(buf[4:8], "big")
            if len(buf) < 8 + size:
                break
            target = self.out.get(buf[0])
            if target is not None:
                room = size if self.cap is None else max(0, self.cap - len(target))
                if room:
                    target += buf[8:8 + min(size, room)]
                if room < size:
                    self.truncated = True
            del buf[:8 + size]


def raw_socket(sock: Any) -> socket.socket:
    """The ``socket.socket`` under what ``exec_start(socket=True)`` returned."""
    if isinstance(sock, socket.socket):
        return sock
    inner = getattr(sock, "_sock", None)
    if isinstance(inner, socket.socket):
        return inner
    raise SandboxUnavailable(f"unsupported Docker transport ({type(sock).__name__}); use a "
                             "unix:// or tcp:// DOCKER_HOST")


def hijacked(stream: Any) -> tuple[socket.socket, bytes]:
    """The socket of an ``exec_start(socket=True)`` stream, and the bytes already read from it.

    The HTTP client reads the ``101 UPGRADED`` headers through a buffered
    reader, which takes whatever else had arrived in the same read: when the
    command's first output lands with the headers (a fast command, a stalled
    reader), those bytes sit in that buffer, not in the socket. They are the
    start of the stream. Leaves the socket non-blocking.
    """
    sock = raw_socket(stream)
    sock.setblocking(False)
    response = getattr(stream, "_response", None)
    reader = getattr(getattr(getattr(response, "raw", None), "_fp", None), "fp", None)
    early = b""
    if reader is not None:
        try:  # at most one non-blocking read of the socket when nothing is buffered
            early = reader.read1(1 << 20) or b""
        except (OSError, ValueError):  # a closed reader, or an SSL want-read
            early = b""
    return sock, early


def tar_dir(local_dir: str) -> bytes:
    """A tar (in memory) of the contents of ``local_dir``; symlinks stay links."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in sorted(os.listdir(local_dir)):
            tar.add(os.path.join(local_dir, name), arcname=name)
    return buf.getvalue()


def parse_oom_kills(text: str) -> int | None:
    """The ``oom_kill`` counter in a cgroup's ``memory.events``/``memory.oom_control``."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None
