"""The sandbox interface: run untrusted, model-written code and report as data.

A :class:`Sandbox` is an async context manager around one isolated machine
image (a bubblewrap namespace, a Docker container) with a private writable
working directory. Everything a command does is reported in an
:class:`ExecResult` (exit code, output, timeouts, OOM kills, truncation);
exceptions (:class:`SandboxError` and subclasses) are reserved for failures
of the sandbox itself, which mark an episode as an infrastructure failure.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

DEFAULT_MAX_OUTPUT_BYTES = 1 << 20
"""Default cap on each of stdout and stderr kept by ``run``."""


@dataclass(frozen=True)
class ExecResult:
    """What one command did.

    ``stdout``/``stderr`` are decoded as UTF-8 with invalid bytes replaced
    (binary output is reported, never raised), each cut to the command's
    ``max_output_bytes``.
    """

    exit_code: int
    """The command's exit status; ``128 + signal`` when a signal killed it."""
    stdout: str
    """Standard output (truncated to ``max_output_bytes``)."""
    stderr: str
    """Standard error (truncated to ``max_output_bytes``)."""
    timed_out: bool
    """The command ran past ``timeout_s`` and its whole process tree was killed."""
    oom_killed: bool
    """The command hit the sandbox's memory limit."""
    output_truncated: bool
    """Output beyond ``max_output_bytes`` was dropped."""
    duration_s: float
    """Wall-clock time of the command."""

    @property
    def ok(self) -> bool:
        """Exit code 0 within the time limit."""
        return self.exit_code == 0 and not self.timed_out


class SandboxError(Exception):
    """The sandbox itself failed (not the code inside it)."""


class SandboxTimeout(SandboxError):
    """A sandbox phase (setup, teardown, a file transfer) ran past its limit."""


class SandboxUnavailable(SandboxError):
    """The backend cannot start here (no bubblewrap, no Docker daemon, no image)."""


class SandboxCrashed(SandboxError):
    """The sandbox died or became unusable; the episode is an infra failure."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandbox (each backend enforces what it can; see docs)."""

    memory_mb: int = 1024
    """Memory (address space / cgroup memory) in MiB."""
    cpu_seconds: int = 60
    """CPU time per command (rlimit)."""
    pids: int = 256
    """Processes/threads at once."""
    file_size_mb: int = 256
    """Largest file a command may write."""
    open_files: int = 256
    """Open file descriptors per process."""
    disk_mb: int = 512
    """Size of the writable working directory, where the backend can bound it."""
    cpus: float = 1.0
    """CPU share (Docker)."""


@runtime_checkable
class Sandbox(Protocol):
    """One isolated environment with a writable ``workdir``. Use ``async with``.

    Backends also offer ``await Backend.available()``: whether they can start
    here (never raises).
    """

    workdir: str
    """Absolute path of the writable working directory inside the sandbox."""

    async def start(self) -> None:
        """Create the sandbox (idempotent). ``__aenter__`` calls it."""
        ...

    async def run(
        self,
        cmd: str | Sequence[str],
        *,
        timeout_s: float = 30.0,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> ExecResult:
        """Run ``cmd`` (a string goes through ``/bin/sh -c``; a list is an argv).

        ``cwd`` defaults to ``workdir``; relative paths are under it. ``env``
        is added to a scrubbed environment. A command that runs past
        ``timeout_s`` is killed with its whole process tree and reported with
        ``timed_out=True``.
        """
        ...

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Write a file inside ``workdir`` (parents created).

        Paths outside ``workdir`` raise ``ValueError``; a symlink planted
        inside the sandbox is never followed (``OSError``).
        """
        ...

    async def read_file(self, path: str) -> bytes:
        """Read a file inside ``workdir``."""
        ...

    async def upload(self, local_dir: str, path: str = ".") -> None:
        """Copy a local directory's contents to ``path`` inside ``workdir``."""
        ...

    async def aclose(self) -> None:
        """Kill everything and remove all traces. Idempotent.

        A command still running raises :class:`SandboxError` in its caller;
        so does any call after ``aclose``.
        """
        ...

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(self, *exc: object) -> None: ...


def resolve_in_workdir(workdir: str, path: str) -> str:
    """The absolute in-sandbox path of ``path``; refuses paths outside ``workdir``.

    Example:
        >>> resolve_in_workdir("/work", "src/a.py")
        '/work/src/a.py'
        >>> resolve_in_workdir("/work", "/work/../etc/passwd")
        Traceback (most recent call last):
        ...
        ValueError: path '/work/../etc/passwd' is outside the sandbox workdir /work

    """
    if "\x00" in path:
        raise ValueError("path contains a NUL byte")
    full = posixpath.normpath(posixpath.join(workdir, path))
    if full != workdir and not full.startswith(workdir.rstrip("/") + "/"):
        raise ValueError(f"path {path!r} is outside the sandbox workdir {workdir}")
    return full
