"""Non-blocking pipe pumps and symlink-safe file transfers for LocalSandbox.

* :class:`Capture` and :class:`Feeder` move a command's output and input
  through pipes on the event loop, keeping at most ``cap`` bytes.
* :func:`write_at`, :func:`read_at` and :func:`upload_at` work beneath an
  open directory (the sandbox's workdir, reached through the launcher's
  mount namespace) one path component at a time with ``O_NOFOLLOW``: a
  symlink planted by sandboxed code is refused, never followed to the host.
  FIFOs and devices are refused too (opened with ``O_NONBLOCK``, checked
  with ``fstat``), so a planted FIFO cannot hang the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import shutil
import stat
from collections.abc import Sequence


class Capture:
    """Reads a pipe to EOF, keeping the first ``cap`` bytes and discarding the rest."""

    def __init__(self, fd: int, cap: int) -> None:
        self.fd: int | None = fd
        self.cap, self.buf, self.cut, self.eof = cap, bytearray(), False, False
        os.set_blocking(fd, False)
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)  # fewer wakeups for floods

    async def pump(self) -> None:
        loop = asyncio.get_running_loop()
        eof = loop.create_future()

        def on_readable() -> None:
            for _ in range(16):
                try:
                    chunk = os.read(self.fd, 1 << 20)
                except BlockingIOError:
                    return
                if not chunk:
                    self.eof = True
                    if not eof.done():
                        eof.set_result(None)
                    return
                room = self.cap - len(self.buf)
                if room > 0:
                    self.buf.extend(chunk[:room])
                self.cut = self.cut or len(chunk) > room

        loop.add_reader(self.fd, on_readable)
        try:
            await eof
        finally:
            loop.remove_reader(self.fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Feeder:
    """Writes ``data`` to a pipe without blocking, then closes it (EPIPE ends it quietly)."""

    def __init__(self, fd: int, data: bytes) -> None:
        self.fd: int | None = fd
        self.data = memoryview(data)
        os.set_blocking(fd, False)

    async def pump(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self.data:
                try:
                    self.data = self.data[os.write(self.fd, self.data[: 1 << 20]) :]
                except BlockingIOError:
                    writable = loop.create_future()
                    loop.add_writer(self.fd, writable.set_result, None)
                    try:
                        await writable
                    finally:
                        loop.remove_writer(self.fd)
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# -- host-side file I/O beneath the workdir, never following symlinks ----------
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def refuse(exc: OSError, dir_fd: int, name: str) -> OSError:
    """Turn ELOOP/ENOTDIR caused by a symlink into a clear error."""
    with contextlib.suppress(OSError):
        if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            return OSError(errno.ELOOP, "refusing to follow a symlink inside the sandbox", name)
    return exc


def open_dir(root_fd: int, parts: Sequence[str], create: bool, owner: int | None) -> int:
    """Open directory ``parts`` beneath ``root_fd`` component by component (O_NOFOLLOW)."""
    fd = os.dup(root_fd)
    try:
        for name in parts:
            try:
                sub = os.open(name, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
                    if owner is not None:
                        os.chown(name, owner, owner, dir_fd=fd, follow_symlinks=False)
                sub = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise refuse(exc, fd, name) from None
            os.close(fd)
            fd = sub
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_file(dir_fd: int, name: str, flags: int, mode: int = 0o644) -> int:
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode,
                     dir_fd=dir_fd)
    except OSError as exc:
        raise refuse(exc, dir_fd, name) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", name)
    return fd


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_at(root_fd: int, parts: list[str], data: bytes, owner: int | None, mode: int) -> None:
    dir_fd = open_dir(root_fd, parts[:-1], True, owner)
    try:
        fd = open_file(dir_fd, parts[-1], os.O_WRONLY | os.O_CREAT, mode)
        try:
            os.ftruncate(fd, 0)
            write_all(fd, data)
            if owner is not None:
                os.fchown(fd, owner, owner)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)


def read_at(root_fd: int, parts: list[str]) -> bytes:
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "the workdir is a directory")
    dir_fd = open_dir(root_fd, parts[:-1], False, None)
    try:
        fd = open_file(dir_fd, parts[-1], os.O_RDONLY)
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def upload_at(root_fd: int, parts: list[str], local_dir: str, owner: int | None) -> None:
    dir_fd = open_dir(root_fd, parts, True, owner)
    try:
        for entry in os.scandir(local_dir):
            if entry.is_symlink():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.name, dir_fd=dir_fd)
                os.symlink(os.readlink(entry.path), entry.name, dir_fd=dir_fd)
                if owner is not None:
                    os.chown(entry.name, owner, owner, dir_fd=dir_fd, follow_symlinks=False)
            elif entry.is_dir(follow_symlinks=False):
                upload_at(dir_fd, [entry.name], entry.path, owner)
            elif entry.is_file(follow_symlinks=False):
                mode = stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode) & 0o777
                with open(entry.path, "rb") as f:
                    write_at(dir_fd, [entry.name], f.read(), owner, mode)
    finally:
        os.close(dir_fd)


def rmtree(path: str) -> None:
    """Remove a tree even where the sandboxed code took away permissions."""

    def fix(func, p, _exc):  # noqa: ANN001 - shutil's onerror signature
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
        with contextlib.suppress(OSError):
            func(p)

    shutil.rmtree(path, onerror=fix)
