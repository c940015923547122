"""DockerSandbox: one locked-down Docker container per episode (the ``docker`` extra).

Each :class:`DockerSandbox` owns one container: no network (``network_mode
"none"``: only ``lo``), cgroup memory/pids/CPU limits, all capabilities
dropped, ``no-new-privileges``, a read-only root filesystem with size-bounded
tmpfs mounts for the working directory and ``/tmp``, rlimits, a non-root
user, and labels (``sao_gym.sandbox=1``) by which leftovers are found and
reaped. Commands run through the Docker exec API; every blocking SDK call
runs on a dedicated thread pool, never on the event loop.

How a command is contained:

* The container's PID 1 is a tiny Python init (:data:`INIT`) running as the
  sandbox user: it reaps orphans and, on ``SIGUSR1``, kills every other
  process in the container (``kill(-1, SIGKILL)``). Processes inside cannot
  kill it (a PID namespace's init ignores signals it has no handler for), and
  the host reaches it with ``docker kill --signal USR1``, which needs no new
  process: it works even when a fork bomb holds every PID of the cgroup.
* Each command runs under a ``/bin/sh`` wrapper (:data:`WRAPPER`) that kills
  every other process of the sandbox user once the command exits, so a
  daemonized child never outlives its command (and never holds the output
  stream open). Commands of one sandbox are therefore serialized.
* The host reads the exec's output stream with a deadline, keeping at most
  ``max_output_bytes`` of each stream; at the deadline (or when the command
  task is cancelled) it signals the init, which ends the whole tree.
* OOM: when a command ends with 137 (SIGKILL) before its deadline, the
  container's cgroup ``oom_kill`` counter is read (one extra exec); an
  increase since the last reading means the memory limit killed it.

See docs/sandbox.md for what this isolates and what it does not.
"""

from __future__ import annotations

import asyncio
import atexit
import errno
import logging
import os
import posixpath
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sao_gym.sandbox._docker_exec import (
    FILE_ERRORS,
    INIT,
    OOM_COUNTER,
    PATH,
    READ,
    UNTAR,
    WRAPPER,
    WRITE,
    RawResult,
    StreamPump,
    hijacked,
    parse_oom_kills,
    tar_dir,
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
from sao_gym.sandbox.image import DEFAULT_IMAGE

logger = logging.getLogger(__name__)
T = TypeVar("T")

LABEL = "sao_gym.sandbox"
"""Every sandbox container carries ``LABEL=1``; ``LABEL.id``/``LABEL.owner`` say whose."""
FILE_TIMEOUT_S = 120.0
"""Limit on one ``write_file``/``read_file``/``upload``."""
KILL_GRACE_S = 10.0
"""How long output may keep flowing after the kill signal before the sandbox counts as broken."""

# A command holds a thread for its whole duration, so the default executor
# (min(32, cpus + 4) threads) would serialize a pool of sandboxes.
_EXECUTOR = ThreadPoolExecutor(max_workers=256, thread_name_prefix="sao-gym-docker")
_CLIENTS: dict[tuple, Any] = {}
_LIVE: dict[str, Any] = {}  # container id -> client, removed at interpreter exit


def _env_key() -> tuple:
    return tuple(os.environ.get(k)
                 for k in ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"))


def _default_client():
    """One client per Docker endpoint (per ``DOCKER_HOST``), shared by all sandboxes."""
    key = _env_key()
    if key not in _CLIENTS:
        try:
            import docker
        except ImportError:
            raise SandboxUnavailable(
                "DockerSandbox needs the docker SDK: pip install 'sao-gym[docker]'") from None
        try:
            _CLIENTS[key] = docker.from_env(max_pool_size=64)
        except docker.errors.DockerException as e:
            raise _unavailable(e) from e
    return _CLIENTS[key]


def _unavailable(e: BaseException) -> SandboxUnavailable:
    return SandboxUnavailable(f"cannot reach the Docker daemon ({type(e).__name__}: {e}); "
                              "see docs/sandbox.md (DockerSandbox) for how to start it")


@atexit.register
def _remove_live_containers() -> None:
    """Safety net: force-remove the containers of sandboxes never closed."""
    for cid, client in list(_LIVE.items()):
        try:
            client.api.remove_container(cid, force=True, v=True)
        except Exception:  # noqa: BLE001, S110 - best effort at exit
            pass


class DockerSandbox:
    """A sandbox in its own Docker container; see the module docstring and docs/sandbox.md.

    Args:
        image: the image to run; needs ``/bin/sh`` and ``python3`` (the
            default one is built by ``sao-gym sandbox build-image``).
        limits: memory/swap (``memory_mb``), ``pids``, ``cpus`` are cgroup
            limits; ``cpu_seconds``, ``open_files``, ``file_size_mb`` are
            rlimits; ``disk_mb`` bounds the tmpfs working directory.
        workdir: the writable working directory (a tmpfs owned by ``user``).
        user: ``uid:gid`` that PID 1 and every command run as.
        client: a ``docker.DockerClient``; default: one from the environment
            (``DOCKER_HOST``), shared by all sandboxes.

    Example:
        >>> async def main():  # doctest: +SKIP
        ...     async with DockerSandbox() as sb:
        ...         return (await sb.run("echo hi")).stdout

    """

    def __init__(self, *, image: str = DEFAULT_IMAGE, limits: Limits = Limits(),
                 workdir: str = "/work", user: str = "65534:65534", client: Any = None):
        if not workdir.startswith("/") or workdir.rstrip("/") in ("", "/tmp"):
            raise ValueError(f"workdir must be an absolute path other than / and /tmp: {workdir!r}")
        self.image = image
        self.limits = limits
        self.workdir = workdir.rstrip("/")
        self.user = user
        self.id = uuid.uuid4().hex[:16]
        """Per-sandbox id (also the container's ``sao_gym.sandbox.id`` label)."""
        self.container_id: str | None = None
        """The container's id once started; ``None`` before and after."""
        self._client = client
        self._start_lock = asyncio.Lock()
        self._lock = asyncio.Lock()  # one command (exec) at a time, see the module docstring
        self._closed = False
        self._oom_kills: int | None = 0  # a fresh cgroup starts at 0; None: counter unreadable

    # ----- discovery -----
    @classmethod
    async def available(cls, image: str = DEFAULT_IMAGE) -> bool:
        """Whether a Docker daemon answers and has ``image``. Never raises."""
        def check() -> bool:
            import docker

            client = docker.from_env(timeout=10)
            try:
                client.ping()
                client.images.get(image)
                return True
            finally:
                client.close()
        try:
            return await _in_thread(check)
        except Exception as e:  # noqa: BLE001 - any failure means "not available"
            logger.debug("DockerSandbox unavailable: %s: %s", type(e).__name__, e)
            return False

    @classmethod
    async def leftovers(cls, client: Any = None) -> list[str]:
        """Ids of all sandbox containers on the daemon (running or not, any owner)."""
        def find() -> list[str]:
            c = client or _default_client()
            return [x["Id"] for x in c.api.containers(all=True, filters={"label": f"{LABEL}=1"})]
        return await _in_thread(find)

    @classmethod
    async def reap(cls, *, all_owners: bool = False, client: Any = None) -> int:
        """Force-remove leftover sandbox containers; return how many were removed.

        By default only orphans: stopped containers, and those whose owner
        process (label ``sao_gym.sandbox.owner``, ``host:pid``) on this host
        is gone, or is this process but no longer holds them. ``all_owners``
        removes every sandbox container on the daemon.
        """
        def reap_sync() -> int:
            c = client or _default_client()
            removed = 0
            for info in c.api.containers(all=True, filters={"label": f"{LABEL}=1"}):
                if not all_owners and not _is_orphan(info):
                    continue
                try:
                    c.api.remove_container(info["Id"], force=True, v=True)
                    removed += 1
                except Exception as e:  # noqa: BLE001 - keep reaping the others
                    logger.warning("could not remove container %s: %s", info["Id"][:12], e)
            return removed
        return await _in_thread(reap_sync)

    # ----- lifecycle -----
    async def start(self) -> None:
        """Create and start the container (idempotent).

        Cancelling it waits for the container being made, so that
        :meth:`aclose` finds and removes it.
        """
        async with self._start_lock:
            if self._closed:
                raise SandboxError("this DockerSandbox is closed; make a new one")
            if self.container_id is None:
                making = asyncio.ensure_future(_in_thread(self._start_sync))
                try:
                    await asyncio.shield(making)
                except asyncio.CancelledError:
                    await asyncio.wait([making])
                    if not making.cancelled():
                        making.exception()  # retrieved: the cancellation is what propagates
                    raise
                finally:
                    if self._closed:  # closed while the container was made: remove it
                        await self.aclose()

    async def aclose(self) -> None:
        """Force-remove the container and everything in it. Idempotent."""
        self._closed = True
        cid = self.container_id
        if cid is None:
            return
        await _in_thread(self._remove_sync, cid)
        self.container_id = None

    async def __aenter__(self) -> DockerSandbox:
        try:
            await self.start()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ----- commands and files -----
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
        """Run ``cmd`` in the container as the sandbox user; see :meth:`Sandbox.run`."""
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else [str(a) for a in cmd]
        if not argv:
            raise ValueError("empty command")
        environment = {str(k): str(v) for k, v in (env or {}).items()}
        if any("=" in k or not k for k in environment):
            raise ValueError(f"bad environment variable names: {sorted(environment)}")
        cwd = posixpath.normpath(posixpath.join(self.workdir, cwd or "."))
        data = stdin.encode() if isinstance(stdin, str) else stdin
        await self.start()
        async with self._lock:
            raw = await self._exec(["/bin/sh", "-c", WRAPPER, "sh", cwd, *argv], data,
                                   environment, timeout_s, max_output_bytes)
            oom = raw.exit_code == 137 and not raw.timed_out and await _in_thread(self._oom_check)
        return ExecResult(
            exit_code=raw.exit_code,
            stdout=raw.stdout.decode("utf-8", errors="replace"),
            stderr=raw.stderr.decode("utf-8", errors="replace"),
            timed_out=raw.timed_out, oom_killed=oom, output_truncated=raw.truncated,
            duration_s=raw.duration_s,
        )

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Write a file inside ``workdir`` (parents created); never follows a symlink."""
        payload = data.encode() if isinstance(data, str) else bytes(data)
        parts = self._parts(path)
        if not parts:
            raise IsADirectoryError(errno.EISDIR, "cannot write the workdir itself", path)
        await self._file_op(WRITE, parts, payload, path)

    async def read_file(self, path: str) -> bytes:
        """Read a regular file inside ``workdir``; a symlink anywhere on the path is refused."""
        parts = self._parts(path)
        if not parts:
            raise IsADirectoryError(errno.EISDIR, "the workdir is a directory", path)
        return await self._file_op(READ, parts, None, path)

    async def upload(self, local_dir: str, path: str = ".") -> None:
        """Copy ``local_dir``'s contents (files, dirs, symlinks as links) under ``path``.

        A tar of the directory is streamed to ``tar -x`` run as the sandbox
        user; symlinks are copied as links (their targets are not read).
        """
        parts = self._parts(path)
        if not os.path.isdir(local_dir):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", local_dir)
        archive = await _in_thread(tar_dir, local_dir)
        await self._file_op(UNTAR, parts, archive, path)

    # ----- internals (async) -----
    def _parts(self, path: str) -> list[str]:
        full = resolve_in_workdir(self.workdir, path)
        rel = full[len(self.workdir):].strip("/")
        return rel.split("/") if rel else []

    async def _file_op(self, script: str, parts: list[str], data: bytes | None,
                       path: str) -> bytes:
        """Run a file script (as the sandbox user) on ``workdir`` + ``parts``; map its errors.

        No user process runs between commands (each one's leftovers are
        killed and commands are serialized), so nothing can swap a path
        component between the scripts' symlink checks and their use.
        """
        await self.start()
        async with self._lock:
            raw = await self._exec(["/bin/sh", "-c", script, "sh", self.workdir, *parts], data,
                                   {}, FILE_TIMEOUT_S, None)
        if raw.timed_out:
            raise SandboxTimeout(f"file transfer of {path!r} ran past {FILE_TIMEOUT_S:.0f} s")
        if raw.exit_code in FILE_ERRORS:
            code, message = FILE_ERRORS[raw.exit_code]
            raise OSError(code, message, path)
        if raw.exit_code != 0:
            detail = raw.stderr.decode(errors="replace").strip()[-2000:]
            code = errno.ENOSPC if "No space left" in detail else errno.EIO
            raise OSError(code, f"{detail} (exit {raw.exit_code})", path)
        return raw.stdout

    async def _exec(self, argv: list[str], stdin: bytes | None, env: Mapping[str, str],
                    timeout_s: float, cap: int | None) -> RawResult:
        """Run one exec on the thread pool; on cancellation kill it before returning."""
        cancel = threading.Event()
        fut = asyncio.wrap_future(_EXECUTOR.submit(
            self._exec_sync, argv, stdin, env, timeout_s, cap, cancel))
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            cancel.set()  # the thread kills the command tree and returns promptly
            await asyncio.wait([fut], timeout=KILL_GRACE_S + 5)
            raise

    # ----- internals (blocking, on the thread pool) -----
    @property
    def _docker(self) -> Any:
        if self._client is None:
            self._client = _default_client()
        return self._client

    def _start_sync(self) -> None:
        import docker.errors
        from docker.types import Ulimit

        lim = self.limits
        uid, _, gid = self.user.partition(":")
        owner = f",uid={uid},gid={gid or uid}" if uid.isdigit() and (gid or uid).isdigit() else ""
        mode = "0755" if owner else "1777"
        api = self._docker.api
        try:
            host_config = api.create_host_config(
                network_mode="none",
                mem_limit=f"{lim.memory_mb}m", memswap_limit=f"{lim.memory_mb}m",
                pids_limit=lim.pids, nano_cpus=int(lim.cpus * 1e9),
                read_only=True,
                tmpfs={
                    self.workdir: f"rw,exec,nosuid,nodev,size={lim.disk_mb}m,mode={mode}{owner}",
                    "/tmp": f"rw,exec,nosuid,nodev,size={max(16, lim.disk_mb // 4)}m,mode=1777",
                },
                cap_drop=["ALL"], security_opt=["no-new-privileges"],
                ulimits=[
                    Ulimit(name="nofile", soft=lim.open_files, hard=lim.open_files),
                    Ulimit(name="fsize", soft=lim.file_size_mb << 20, hard=lim.file_size_mb << 20),
                    Ulimit(name="cpu", soft=lim.cpu_seconds, hard=lim.cpu_seconds + 5),
                    Ulimit(name="core", soft=0, hard=0),
                ],
                ipc_mode="private", init=False,
            )
            created = api.create_container(
                self.image, ["python3", "-I", "-S", "-c", INIT], user=self.user,
                working_dir=self.workdir, hostname="sandbox", name=f"sao-gym-{self.id}",
                environment={"HOME": self.workdir, "LANG": "C.UTF-8", "PATH": PATH,
                             "TMPDIR": "/tmp"},
                labels={LABEL: "1", f"{LABEL}.id": self.id,
                        f"{LABEL}.owner": f"{socket.gethostname()}:{os.getpid()}"},
                host_config=host_config, use_config_proxy=False,
            )
        except docker.errors.ImageNotFound:
            raise SandboxUnavailable(
                f"Docker image {self.image!r} not found; build it with "
                "`sao-gym sandbox build-image`") from None
        except docker.errors.APIError as e:
            raise SandboxUnavailable(f"cannot create the sandbox container: {e}") from e
        except Exception as e:  # noqa: BLE001 - connection failures of any kind
            raise _unavailable(e) from e
        cid = created["Id"]
        _LIVE[cid] = self._docker
        try:
            api.start(cid)
        except Exception as e:
            self._remove_sync(cid)
            raise SandboxUnavailable(f"cannot start the sandbox container: {e}") from e
        self.container_id = cid
        logger.debug("started sandbox %s (container %s)", self.id, cid[:12])

    def _remove_sync(self, cid: str) -> None:
        import docker.errors

        try:
            self._docker.api.remove_container(cid, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            if "already in progress" not in str(e):
                raise SandboxError(f"cannot remove container {cid[:12]}: {e}") from e
        except Exception as e:  # noqa: BLE001
            raise _unavailable(e) from e
        _LIVE.pop(cid, None)

    def _kill_all(self) -> None:
        """Ask PID 1 to SIGKILL every other process (needs no new process)."""
        try:
            self._docker.api.kill(self.container_id, signal="SIGUSR1")
        except Exception as e:  # noqa: BLE001 - a dead container has nothing left to kill
            logger.debug("kill signal to %s failed: %s", self.container_id, e)

    def _crashed(self, what: str) -> SandboxCrashed:
        try:
            state = self._docker.api.inspect_container(self.container_id)["State"]
            detail = (f"container {state.get('Status')}, exit {state.get('ExitCode')}, "
                      f"OOMKilled={state.get('OOMKilled')}")
        except Exception as e:  # noqa: BLE001
            detail = f"container gone ({type(e).__name__})"
        return SandboxCrashed(f"{what}: {detail}")

    def _exec_sync(self, argv: list[str], stdin: bytes | None, env: Mapping[str, str],
                   timeout_s: float, cap: int | None, cancel: threading.Event) -> RawResult:
        import docker.errors

        if self.container_id is None:
            raise SandboxCrashed("the sandbox was closed")
        api = self._docker.api
        t0 = time.monotonic()
        try:
            exec_id = api.exec_create(self.container_id, argv, stdin=stdin is not None,
                                      user=self.user, environment=dict(env) or None)["Id"]
            # keep what exec_start returned until the end: it holds the HTTP response,
            # and collecting that response closes the socket under the pump
            stream = api.exec_start(exec_id, socket=True)
            sock, early = hijacked(stream)
        except docker.errors.APIError as e:
            if e.status_code in (404, 409):
                raise self._crashed("the container is gone or not running") from e
            raise SandboxError(f"docker exec failed: {e}") from e
        except Exception as e:  # noqa: BLE001
            raise _unavailable(e) from e
        pump = StreamPump(sock, stdin, cap, early)
        try:
            timed_out = self._drive(pump, exec_id, t0 + timeout_s, cancel)
            exit_code = self._exit_code(exec_id)
        except SandboxError:
            raise
        except docker.errors.APIError as e:
            raise self._crashed(f"docker exec failed: {e}") from e
        except Exception as e:  # noqa: BLE001
            raise _unavailable(e) from e
        finally:
            sock.close()
            stream.close()
        if self._closed:
            raise SandboxError("the sandbox was closed while the command ran")
        return RawResult(exit_code, bytes(pump.out[1]), bytes(pump.out[2]), pump.truncated,
                         timed_out, time.monotonic() - t0)

    def _drive(self, pump: StreamPump, exec_id: str, deadline: float,
               cancel: threading.Event) -> bool:
        """Pump the stream until it closes; kill the tree at the deadline. Returns timed_out."""
        timed_out = False
        killed_at: float | None = None
        next_poll = time.monotonic() + 1.0
        while not pump.eof:
            now = time.monotonic()
            if killed_at is None and (now >= deadline or cancel.is_set()):
                timed_out = now >= deadline
                self._kill_all()
                killed_at = now
            elif killed_at is None and now >= next_poll:
                # The wrapper died of a signal (e.g. the command killed it), so
                # nothing killed what it left, which may hold the stream open:
                # end it. A wrapper that exited on its own killed the rest
                # itself, and a needless kill signal could land on the next
                # command.
                next_poll = now + 1.0
                code = self._exec_exit(exec_id)
                if code is not None and code >= 128:
                    self._kill_all()
                    killed_at = now
            if killed_at is not None and now - killed_at > KILL_GRACE_S:
                raise self._crashed("the command's processes did not die after SIGKILL")
            until = min(deadline, next_poll) if killed_at is None else killed_at + KILL_GRACE_S
            pump.step(max(0.0, min(until - now, 1.0)))
        return timed_out

    def _exec_exit(self, exec_id: str) -> int | None:
        """The exec's exit code, ``None`` while it runs (or has not started)."""
        info = self._docker.api.exec_inspect(exec_id)
        code = info.get("ExitCode")
        return None if info.get("Running", True) or code is None else int(code)

    def _exit_code(self, exec_id: str) -> int:
        """The exec's exit code; the stream can close a moment before it is recorded."""
        for _ in range(200):
            code = self._exec_exit(exec_id)
            if code is not None:
                return code
            time.sleep(0.01)
        raise self._crashed("the command's exit status never arrived")

    def _oom_check(self) -> bool:
        """Whether the cgroup's OOM-kill counter rose since the last check."""
        if self._oom_kills is not None:
            raw = self._exec_sync(["/bin/sh", "-c", OOM_COUNTER], None, {}, 10.0, 1 << 16,
                                  threading.Event())
            count = parse_oom_kills(raw.stdout.decode(errors="replace"))
            if count is not None:
                rose, self._oom_kills = count > self._oom_kills, count
                return rose
            logger.warning("no oom_kill counter in the container's cgroup; falling back to "
                           "the container's OOMKilled flag")
            self._oom_kills = None
        return bool(self._docker.api.inspect_container(self.container_id)["State"]["OOMKilled"])


def _is_orphan(info: Mapping[str, Any]) -> bool:
    """A sandbox container nobody will close: stopped, or its owner process is gone."""
    if info.get("State") != "running":
        return True
    host, _, pid = info.get("Labels", {}).get(f"{LABEL}.owner", "").rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another machine's, or unlabeled: not ours to judge
    if int(pid) == os.getpid():
        return info["Id"] not in _LIVE
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


async def _in_thread(fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(_EXECUTOR, fn, *args)
