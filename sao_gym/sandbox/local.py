r"""LocalSandbox: model-written code in bubblewrap namespaces on this machine.

The default backend. Each sandbox owns one helper process (the *launcher*,
:mod:`sao_gym.sandbox._local_launcher`) holding a private mount namespace
with a size-bounded tmpfs workdir; every command runs in a fresh
``bwrap`` with new user, pid, net, ipc, uts and mount namespaces, as an
unprivileged uid, under rlimits and (as root) memory/pids cgroups. When a
command returns, or times out, its whole pid namespace is gone, daemons
included. File transfers are done by the host with ``openat``-style walks
that never follow a symlink. What this isolates and what not:
docs/sandbox.md.

Example (needs bubblewrap)::

    async with LocalSandbox(limits=Limits(memory_mb=512)) as sb:
        await sb.write_file("a.py", "print(6 * 7)")
        result = await sb.run(["python3", "a.py"], timeout_s=10)
        assert result.stdout == "42\\n"
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import json
import logging
import os
import random
import re
import shutil
import socket
import sys
import sysconfig
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from sao_gym.sandbox._local_io import (
    Capture,
    Feeder,
    read_at,
    rmtree,
    upload_at,
    write_all,
    write_at,
)
from sao_gym.sandbox.base import (
    DEFAULT_MAX_OUTPUT_BYTES,
    ExecResult,
    Limits,
    SandboxCrashed,
    SandboxError,
    SandboxTimeout,
    SandboxUnavailable,
    resolve_in_workdir,
)

logger = logging.getLogger(__name__)

_LAUNCHER = Path(__file__).with_name("_local_launcher.py")
_LAUNCHER_WORKDIR = "/tmp/data/work"  # the workdir inside the launcher's mount namespace
_START_TIMEOUT_S = 30.0
_GRACE_S = 10.0
"""How long past a command's timeout the host waits before declaring the launcher dead."""
_EOF_WAIT_S = 2.0
_UID_BASE, _UID_SPAN = 1_000_000_000, 1 << 24
_uids_in_use: set[int] = set()
_RESERVED = ("/usr", "/etc", "/proc", "/dev", "/tmp", "/bin", "/sbin", "/lib", "/lib32",
             "/lib64", "/libx32", "/opt/sao")
_OOM_RE = re.compile(rb"MemoryError|Cannot allocate memory|std::bad_alloc|[Oo]ut of memory")
_EXECVP_RE = re.compile(rb"^bwrap: execvp [^\n]*: ([^\n]*)\n?$")


def _bwrap() -> str | None:
    return shutil.which("bwrap") or next(
        (p for p in ("/usr/bin/bwrap", "/usr/local/bin/bwrap") if os.access(p, os.X_OK)), None
    )


def _python_layout(python: str | None) -> tuple[str, str | None, list[str]]:
    """The interpreter to expose: (path, prefix to bind or None, site dirs to hide)."""
    if python is None:
        interp = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
        prefix = os.path.realpath(sys.base_prefix)
        scheme = sysconfig.get_paths(vars={"base": prefix, "platbase": prefix})
        hide = sorted({os.path.realpath(scheme[k]) for k in ("purelib", "platlib")})
    else:
        interp = os.path.realpath(python)
        prefix, hide = os.path.dirname(os.path.dirname(interp)), []
    if prefix == "/usr" or prefix.startswith("/usr/"):
        return interp, None, []
    return interp, prefix, [h for h in hide if h.startswith(prefix + "/") and os.path.isdir(h)]


class LocalSandbox:
    """A sandbox made of bubblewrap namespaces on this machine. Use ``async with``.

    Args:
        limits: resource limits (memory -> RLIMIT_AS and, as root, a memory
            cgroup; pids -> RLIMIT_NPROC and a pids cgroup; disk -> the size
            of the tmpfs holding ``workdir`` and ``/tmp``; ``cpus`` unused).
        workdir: where the private writable directory appears inside.
        python: interpreter exposed as ``python3``/``python``. Default: the
            one running this library (its installation prefix, read-only,
            with its site-packages hidden: standard library only). A path
            exposes that interpreter's whole prefix as it is.
        extra_ro_binds: host paths bound read-only at the same path inside.
        unsafe_subprocess: run commands as plain subprocesses of this user in
            a host temp dir, under rlimits only, instead of bubblewrap (for
            machines without it). This is NOT a security boundary; ``workdir``
            is then that temp dir (known after ``start``).

    """

    def __init__(
        self,
        *,
        limits: Limits = Limits(),
        workdir: str = "/work",
        python: str | None = None,
        extra_ro_binds: Sequence[str] = (),
        unsafe_subprocess: bool = False,
    ) -> None:
        norm = os.path.normpath(workdir)
        if not workdir.startswith("/") or norm == "/" or any(
            norm == r or norm.startswith(r + "/") for r in _RESERVED
        ):
            raise ValueError(f"workdir must be an absolute path outside {_RESERVED}: {workdir!r}")
        for path in extra_ro_binds:
            if not os.path.isabs(path) or not os.path.lexists(path):
                raise ValueError(f"extra_ro_binds: {path!r} is not an existing absolute path")
        self.limits = limits
        self.workdir = norm
        self.python = python
        self.extra_ro_binds = tuple(extra_ro_binds)
        self.unsafe_subprocess = unsafe_subprocess
        self._lock = asyncio.Lock()
        self._conn: _Launcher | None = None
        self._root_fd: int | None = None
        self._tmpdir: str | None = None
        self._uid: int | None = None
        self._owner: int | None = None
        self._closed = False
        self._ids = itertools.count(1)

    @classmethod
    async def available(cls) -> bool:
        """Whether bubblewrap is installed (a sandbox can still fail to start; see ``start``)."""
        return _bwrap() is not None

    # -- lifecycle -----------------------------------------------------------
    async def start(self) -> None:
        """Start the launcher and check that a sandbox can be created (idempotent).

        Raises :class:`SandboxUnavailable` without bubblewrap (unless
        ``unsafe_subprocess``) or when this machine forbids the namespaces.
        """
        async with self._lock:
            if self._closed:
                raise SandboxError("sandbox is closed")
            if self._conn is not None:
                return
            try:
                await self._start()
            except BaseException:
                await self._teardown()
                raise

    async def _start(self) -> None:
        bwrap = _bwrap()
        interp, prefix, hide = _python_layout(self.python)
        limits = {k: getattr(self.limits, k) for k in Limits.__dataclass_fields__}
        cfg: dict = {"limits": limits, "workdir": self.workdir, "python": interp, "hide": hide}
        if bwrap is None and not self.unsafe_subprocess:
            raise SandboxUnavailable(
                "bubblewrap (bwrap) is not installed: install it (`apt-get install bubblewrap`), "
                "or pass unsafe_subprocess=True for plain subprocesses (no security boundary)"
            )
        if self.unsafe_subprocess:
            logger.warning("LocalSandbox(unsafe_subprocess=True): commands run as plain "
                           "subprocesses of this user; this is NOT a security boundary")
            self._tmpdir = tempfile.mkdtemp(prefix="sao-sbx-")
            self.workdir = self._tmpdir
            path = f"{os.path.dirname(interp)}:/usr/local/bin:/usr/bin:/bin"
            cfg.update(mode="unsafe", python=None, workdir=self._tmpdir, path=path)
        else:
            binds = [(p, p) for p in ([prefix] if prefix else []) + list(self.extra_ro_binds)]
            cfg.update(mode="user", bwrap=bwrap, binds=binds, path="/opt/sao/bin:/usr/local/bin"
                       ":/usr/bin:/bin")
            if os.geteuid() == 0:
                self._uid = self._owner = _allocate_uid()
                cfg.update(mode="root", uid=self._uid)
        self._env = {"PATH": cfg.pop("path"), "HOME": self.workdir, "LANG": "C.UTF-8",
                     "TMPDIR": "/tmp"}
        self._conn = conn = await _Launcher.spawn(cfg)
        root = self._tmpdir or f"/proc/{conn.proc.pid}/root{_LAUNCHER_WORKDIR}"
        self._root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        probe = await self._run(["true"], timeout_s=_START_TIMEOUT_S)
        if probe.exit_code != 0:
            raise SandboxUnavailable(
                f"bubblewrap cannot create a sandbox here (exit {probe.exit_code}): "
                f"{probe.stderr.strip()[:2000]}"
            )

    async def aclose(self) -> None:
        """Kill every process, drop the namespaces, cgroups and temp dirs. Idempotent."""
        self._closed = True
        async with self._lock:
            await self._teardown()

    async def _teardown(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()
        if self._root_fd is not None:
            os.close(self._root_fd)
            self._root_fd = None
        if self._tmpdir is not None:
            await asyncio.to_thread(rmtree, self._tmpdir)
            self._tmpdir = None
        if self._uid is not None:
            _uids_in_use.discard(self._uid)
            self._uid = None

    async def __aenter__(self) -> LocalSandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _ready(self) -> _Launcher:
        if self._conn is None:
            await self.start()
        if self._closed or self._conn is None:
            raise SandboxError("sandbox is closed")
        return self._conn

    # -- commands ------------------------------------------------------------
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

        Starts the sandbox if needed. See :meth:`sao_gym.sandbox.base.Sandbox.run`.
        """
        await self._ready()
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else [str(a) for a in cmd]
        if not argv:
            raise ValueError("empty command")
        cwd_in = os.path.normpath(os.path.join(self.workdir, cwd or "."))
        full_env = {**self._env, **{str(k): str(v) for k, v in (env or {}).items()}}
        for text in [cwd_in, *full_env, *full_env.values()]:
            if "\0" in text:  # bwrap reads its options NUL-separated
                raise ValueError(f"NUL byte in cwd or env: {text!r}")
        if any(not k or "=" in k for k in full_env):
            raise ValueError(f"bad environment variable name in {sorted(full_env)}")
        data = stdin.encode() if isinstance(stdin, str) else stdin
        return await self._run(argv, timeout_s=timeout_s, stdin=data, env=full_env, cwd=cwd_in,
                               cap=max_output_bytes)

    async def _run(self, argv: list[str], *, timeout_s: float, stdin: bytes | None = None,
                   env: Mapping[str, str] | None = None, cwd: str | None = None,
                   cap: int = DEFAULT_MAX_OUTPUT_BYTES) -> ExecResult:
        conn = self._conn
        if conn is None:
            raise SandboxError("sandbox is closed")
        spec = {"argv": argv, "env": dict(env or self._env), "cwd": cwd or self.workdir,
                "timeout": timeout_s}
        rid = next(self._ids)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        in_r, in_w = os.pipe2(os.O_CLOEXEC) if stdin else (os.open(os.devnull, os.O_RDONLY), None)
        spec_fd = os.memfd_create("sao-spec", os.MFD_CLOEXEC)
        pipes = [Capture(out_r, cap), Capture(err_r, cap)]
        if in_w is not None:
            pipes.append(Feeder(in_w, stdin or b""))
        tasks = [asyncio.ensure_future(p.pump()) for p in pipes]
        start = time.perf_counter()
        done = conn.expect(rid)
        try:
            try:
                write_all(spec_fd, json.dumps(spec).encode())
                await conn.send({"op": "run", "id": rid}, [in_r, out_w, err_w, spec_fd])
            finally:
                for fd in (in_r, out_w, err_w, spec_fd):
                    os.close(fd)
            try:
                msg = await asyncio.wait_for(asyncio.shield(done), max(timeout_s, 0) + _GRACE_S)
            except asyncio.TimeoutError:
                await conn.kill()
                raise SandboxCrashed("the sandbox launcher stopped responding") from None
            if "error" in msg:
                raise SandboxCrashed(f"could not start the command: {msg['error']}")
            if self._closed:
                raise SandboxError("sandbox was closed while the command ran")
            await asyncio.wait(tasks[:2], timeout=_EOF_WAIT_S)
        except BaseException:
            if not done.done():
                with contextlib.suppress(SandboxError, OSError):
                    await conn.send({"op": "kill", "id": rid})
            raise
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for pipe in pipes:
                pipe.close()
        (out, out_cut), (err, err_cut) = ((bytes(p.buf), p.cut or not p.eof) for p in pipes[:2])
        code = msg["exit"]
        if code == 1 and (m := _EXECVP_RE.match(err)):  # bwrap could not exec the command
            code = 127 if b"No such file" in m.group(1) else 126
        oom = msg["oom"] or (code != 0 and not msg["timed_out"] and bool(_OOM_RE.search(err)))
        return ExecResult(
            exit_code=code, stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"), timed_out=msg["timed_out"], oom_killed=oom,
            output_truncated=out_cut or err_cut, duration_s=time.perf_counter() - start,
        )

    # -- files -----------------------------------------------------------------
    def _parts(self, path: str) -> list[str]:
        full = resolve_in_workdir(self.workdir, path)
        rel = full[len(self.workdir) :].strip("/")
        return rel.split("/") if rel else []

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Write a file inside ``workdir`` (parents created); never follows a symlink."""
        await self._ready()
        parts = self._parts(path)
        if not parts:
            raise IsADirectoryError(errno.EISDIR, "cannot write the workdir itself", path)
        raw = data.encode() if isinstance(data, str) else bytes(data)
        await asyncio.to_thread(write_at, self._root_fd, parts, raw, self._owner, 0o644)

    async def read_file(self, path: str) -> bytes:
        """Read a regular file inside ``workdir``; a symlink anywhere on the path is refused."""
        await self._ready()
        return await asyncio.to_thread(read_at, self._root_fd, self._parts(path))

    async def upload(self, local_dir: str, path: str = ".") -> None:
        """Copy ``local_dir``'s contents (files, dirs, symlinks as links) under ``path``."""
        await self._ready()
        if not os.path.isdir(local_dir):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", local_dir)
        parts = self._parts(path)
        await asyncio.to_thread(upload_at, self._root_fd, parts, local_dir, self._owner)


def _allocate_uid() -> int:
    """An unused uid for one sandbox: RLIMIT_NPROC then counts only its processes."""
    while True:
        uid = _UID_BASE + random.randrange(_UID_SPAN)
        if uid not in _uids_in_use:
            _uids_in_use.add(uid)
            return uid


class _Launcher:
    """The host end of one launcher process: spawn, requests, replies, shutdown."""

    def __init__(self, proc: asyncio.subprocess.Process, sock: socket.socket) -> None:
        self.proc, self.sock = proc, sock
        self.pending: dict[int, asyncio.Future] = {}
        self.ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self.stderr = bytearray()
        self.reader = asyncio.ensure_future(self._read_replies())
        self.drain = asyncio.ensure_future(self._drain_stderr())

    @classmethod
    async def spawn(cls, cfg: dict) -> _Launcher:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-S", str(_LAUNCHER), str(theirs.fileno()), json.dumps(cfg),
                pass_fds=(theirs.fileno(),), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            )
        finally:
            theirs.close()
        ours.setblocking(False)
        conn = cls(proc, ours)
        try:
            msg = await asyncio.wait_for(asyncio.shield(conn.ready), _START_TIMEOUT_S)
        except asyncio.TimeoutError:
            await conn.close()
            raise SandboxTimeout("the sandbox launcher did not start in time") from None
        except BaseException:  # a SandboxError, or cancelled (a warm start when its pool closes)
            await conn.close()
            raise
        if msg["op"] == "fatal":
            await conn.close()
            hint = (" (in a container? the launcher needs CAP_SYS_ADMIN as root)"
                    if cfg["mode"] == "root" else
                    " (unprivileged user namespaces may be disabled: see the sysctls kernel."
                    "unprivileged_userns_clone, kernel.apparmor_restrict_unprivileged_userns)")
            raise SandboxUnavailable(f"cannot set up the sandbox: {msg['error']}{hint}")
        return conn

    def expect(self, rid: int) -> asyncio.Future:
        """A future for the ``done`` reply of run ``rid``."""
        fut = asyncio.get_running_loop().create_future()
        if self.reader.done():
            fut.set_exception(self._crashed())
        else:
            self.pending[rid] = fut
        return fut

    async def send(self, msg: dict, fds: Sequence[int] = ()) -> None:
        """Send one request (with file descriptors) without blocking the event loop."""
        payload = json.dumps(msg).encode()
        loop = asyncio.get_running_loop()
        while True:
            try:
                socket.send_fds(self.sock, [payload], list(fds))
                return
            except BlockingIOError:
                writable = loop.create_future()
                loop.add_writer(self.sock.fileno(), writable.set_result, None)
                try:
                    await writable
                finally:
                    loop.remove_writer(self.sock.fileno())
            except OSError as exc:
                raise self._crashed() from exc

    def _crashed(self) -> SandboxCrashed:
        tail = bytes(self.stderr[-2000:]).decode("utf-8", "replace").strip()
        return SandboxCrashed(f"the sandbox launcher exited{': ' + tail if tail else ''}")

    async def _read_replies(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await loop.sock_recv(self.sock, 65536)
                if not data:
                    break
                msg = json.loads(data)
                if msg["op"] in ("ready", "fatal") and not self.ready.done():
                    self.ready.set_result(msg)
                elif msg["op"] == "done" and (fut := self.pending.pop(msg["id"], None)):
                    if not fut.done():
                        fut.set_result(msg)
        except OSError:
            pass
        finally:
            # wait, not await: a cancelled drain (all tasks are, at asyncio.run's end)
            # would raise here and leave the pending futures unanswered
            await asyncio.wait([self.drain], timeout=_EOF_WAIT_S)
            self.drain.cancel()
            for fut in [self.ready, *self.pending.values()]:
                if not fut.done():
                    fut.set_exception(self._crashed())
                    fut.exception()  # mark retrieved: nobody may be waiting any more
            self.pending.clear()

    async def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        while chunk := await self.proc.stderr.read(65536):
            self.stderr += chunk
            del self.stderr[:-8192]

    async def kill(self) -> None:
        """SIGKILL the launcher (its sandboxes die with it: bwrap --die-with-parent)."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        await self.proc.wait()

    async def close(self) -> None:
        """Ask the launcher to kill everything and exit; SIGKILL it if it does not.

        When this returns the launcher has exited, the reply and stderr tasks
        are done and the socket is closed, even when the reader was cancelled
        already (``asyncio.run`` cancels every task before its loop's shutdown
        closes the sandboxes still open).
        """
        try:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_WR)
            try:
                await asyncio.wait_for(self.proc.wait(), _GRACE_S)
            except asyncio.TimeoutError:
                logger.warning("sandbox launcher %d ignored close; killing it", self.proc.pid)
                await self.kill()
            await asyncio.wait([self.reader], timeout=_EOF_WAIT_S)  # never raises
        finally:
            self.reader.cancel()
            self.drain.cancel()
            await asyncio.gather(self.reader, self.drain, return_exceptions=True)
            self.sock.close()
