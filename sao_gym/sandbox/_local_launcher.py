"""The helper process behind :class:`sao_gym.sandbox.local.LocalSandbox`.

One launcher runs per sandbox, started by the host as ``python -I -S
_local_launcher.py FD CONFIG_JSON`` (standard library only). It:

* gives itself a private mount namespace (plus a user namespace when not
  root) and builds the sandbox's root filesystem there once: read-only binds
  of /usr, chosen /etc entries and the Python prefix (which the sandbox uid
  could not reach itself under a 0700 home), a minimal /dev, and a
  size-bounded data tmpfs holding the workdir, /tmp and /dev/shm. None of it
  is visible to the host, and all of it disappears with the namespace when
  the launcher exits, even after a host crash.
* as root, creates per-sandbox memory and pids cgroups, joins them itself
  (so commands are born inside; moving each one in would cost ~5 ms) and
  removes them on exit;
* for every command, forks a child that sets rlimits, drops to the sandbox's
  unprivileged uid and execs ``bwrap``, which binds that root on ``/`` with
  fresh user/pid/net/ipc/uts/cgroup/mount namespaces and a fresh /proc. The
  command is killed with its whole pid namespace on timeout, and reported
  only after the sandbox's pid 1 has exited, which the kernel allows only
  once every process of that pid namespace is gone (daemons included).

Protocol, over an ``AF_UNIX``/``SOCK_SEQPACKET`` pair, one JSON object per
message: host -> launcher ``{"op": "run", "id": N}`` with file descriptors
``[stdin, stdout, stderr, spec]`` (``spec`` is a memfd holding the JSON
``{"argv", "env", "cwd", "timeout"}``) and ``{"op": "kill", "id": N}``; EOF
means close. Launcher -> host: ``{"op": "ready"}`` or ``{"op": "fatal",
"error": ...}`` once, then ``{"op": "done", "id", "exit", "timed_out",
"oom"}`` per run.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import resource
import selectors
import signal
import socket
import sys
import time

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE, MS_STRICTATIME = 4096, 16384, 1 << 18, 1 << 24
PR_SET_CHILD_SUBREAPER = 36
O_SRC = os.O_PATH | os.O_CLOEXEC

STAGE = "/tmp"
"""A small tmpfs over /tmp, in the launcher's mount namespace only."""
ROOT = STAGE + "/root"
"""The sandbox's root, built once; bwrap binds it on / for every command."""
DATA = STAGE + "/data"
WORK = DATA + "/work"
"""The workdir as seen in the launcher's mount namespace (the host uses /proc/PID/root)."""
SANDBOX_UID = 1000
EXEC_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ETC_FILES = (
    "alternatives", "ca-certificates", "ca-certificates.conf", "debian_version", "gai.conf",
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "locale.alias", "localtime", "magic",
    "mime.types", "nsswitch.conf", "os-release", "pki", "protocols", "services", "shells",
    "ssl", "terminfo",
)
"""Host ``/etc`` entries bound read-only; passwd, group, hosts and hostname are generated."""

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(
        _libc.mount(
            src.encode(), target.encode(), fstype.encode() if fstype else None, flags,
            data.encode() if data else None,
        ),
        f"mount {src} on {target}",
    )


_ST_TO_MS = {1: 1, 2: 2, 4: 4, 8: 8, 1024: 1024, 2048: 2048, 4096: 1 << 21}
"""statvfs f_flag bits -> mount(2) flags: ro, nosuid, nodev, noexec, (no|rel|nodir)atime."""


def _bind_ro(fd: int, target: str) -> None:
    """Bind the open path ``fd`` on ``target`` (created), read-only, nosuid, nodev, recursive.

    The source's other flags are kept: inside a user namespace they are locked.
    """
    if os.path.isdir(f"/proc/self/fd/{fd}"):
        os.mkdir(target)
    else:
        open(target, "w").close()
    _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
    os.close(fd)
    f_flag = os.statvfs(target).f_flag
    flags = sum(ms for st, ms in _ST_TO_MS.items() if f_flag & st)
    if not f_flag & (1024 | 4096):
        flags |= MS_STRICTATIME
    _mount("none", target, None, flags | MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _help(program: str) -> str:
    """``program --help`` (stdout and stderr)."""
    r, w = os.pipe()
    pid = os.posix_spawn(program, [program, "--help"], {},
                         file_actions=[(os.POSIX_SPAWN_DUP2, w, 1), (os.POSIX_SPAWN_DUP2, w, 2)])
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read()
    os.waitpid(pid, 0)
    return out.decode(errors="replace")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


class Cgroups:
    """The sandbox's memory and pids cgroups (v1, or v2 where delegated); empty if unavailable."""

    def __init__(self, name: str, memory_bytes: int, pids: int) -> None:
        self.dirs: list[str] = []
        self.oom_file: str | None = None
        v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
        for line in open("/proc/self/cgroup").read().splitlines():
            _, controllers, path = line.split(":", 2)
            if v2 and controllers == "":
                self._make(f"/sys/fs/cgroup{path}/{name}", {"memory.max": memory_bytes,
                           "memory.swap.max": 0, "pids.max": pids}, "memory.events")
            for ctl in ("memory", "pids"):
                if not v2 and ctl in controllers.split(","):
                    limits = {"pids.max": pids} if ctl == "pids" else {
                        "memory.limit_in_bytes": memory_bytes,
                        "memory.memsw.limit_in_bytes": memory_bytes,
                    }
                    oom = "memory.oom_control" if ctl == "memory" else None
                    self._make(f"/sys/fs/cgroup/{ctl}{path.rstrip('/')}/{name}", limits, oom)

    def _make(self, path: str, limits: dict[str, int], oom: str | None) -> None:
        try:
            os.mkdir(path, 0o755)
        except OSError:
            return
        self.dirs.append(path)
        for key, value in limits.items():
            try:
                _write(f"{path}/{key}", str(value))
            except OSError:
                if key.startswith("pids") or key in ("memory.max", "memory.limit_in_bytes"):
                    self.dirs.remove(path)
                    os.rmdir(path)
                    return
        if oom:
            self.oom_file = f"{path}/{oom}"

    def oom_kills(self) -> int:
        """The cgroup's OOM-kill counter (0 without a memory cgroup)."""
        if self.oom_file is None:
            return 0
        match = re.search(r"^oom_kill (\d+)", open(self.oom_file).read(), re.M)
        return int(match.group(1)) if match else 0

    def join(self) -> None:
        """Move the calling process into every cgroup."""
        for path in self.dirs:
            _write(f"{path}/cgroup.procs", str(os.getpid()))

    def remove(self) -> None:
        """Leave and remove the cgroups, waiting briefly for dying processes."""
        for path in self.dirs:
            with contextlib.suppress(OSError):
                _write(f"{os.path.dirname(path)}/cgroup.procs", str(os.getpid()))
            for _ in range(100):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)


class Run:
    """One command in flight."""

    def __init__(self, rid: int, pid: int, deadline: float, status_fd: int | None, oom0: int):
        self.rid, self.pid, self.deadline, self.status_fd, self.oom0 = (
            rid, pid, deadline, status_fd, oom0)
        self.status_buf = b""
        self.init_fd: int | None = None
        """pidfd of the sandbox's pid 1 (bwrap's reaper), once known and verified."""
        self.init_seen = False
        self.exit: int | None = None
        self.timed_out = False


class Launcher:
    """Holds the namespace; spawns, times out and reaps commands."""

    def __init__(self, sock: socket.socket, cfg: dict) -> None:
        self.sock, self.cfg = sock, cfg
        self.mode: str = cfg["mode"]
        self.limits: dict = cfg["limits"]
        self.runs: dict[int, Run] = {}
        self.by_pid: dict[int, Run] = {}
        self.cgroups: Cgroups | None = None
        self.bwrap_opts = b""

    # -- setup -------------------------------------------------------------
    def setup(self) -> None:
        """Build the sandbox's root once, in a private mount namespace; then the cgroups.

        ``ROOT`` holds read-only binds of /usr, chosen /etc entries, the Python
        prefix and extra binds, the writable workdir and /tmp (on the data
        tmpfs) and is itself read-only; ``STAGE/dev`` is a minimal /dev. Each
        command's bwrap then needs three mounts (root, /dev, a fresh /proc)
        instead of ~20, all flags already as bwrap wants them.
        """
        if self.mode == "unsafe":
            return
        uid, gid = os.getuid(), os.getgid()
        if self.mode == "user":
            _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWUSER), "unshare(user+mount)")
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"0 {uid} 1")
            _write("/proc/self/gid_map", f"0 {gid} 1")
        else:
            _check(_libc.unshare(CLONE_NEWNS), "unshare(mount)")
        _mount("none", "/", None, MS_REC | MS_PRIVATE)
        # Open every bind source before the staging tmpfs shadows /tmp (they may live there).
        names = [n for n in ETC_FILES if os.path.lexists(f"/etc/{n}")]
        names += sorted(n for n in os.listdir("/etc") if n.startswith("python3"))
        sources = [("/usr", os.open("/usr", O_SRC))]
        sources += [(f"/etc/{n}", os.open(f"/etc/{n}", O_SRC)) for n in names
                    if os.path.isdir(f"/etc/{n}") and not os.path.islink(f"/etc/{n}")]
        copies = {n: open(f"/etc/{n}", "rb").read() for n in names  # small files: no mount
                  if os.path.isfile(f"/etc/{n}") and not os.path.islink(f"/etc/{n}")}
        sources += [(dest, os.open(src, O_SRC)) for src, dest in self.cfg["binds"]]
        _mount("sao-stage", STAGE, "tmpfs", MS_NOSUID | MS_NODEV, "size=8m,mode=0755")
        for sub in ("", "/etc", "/proc", "/dev", "/tmp"):
            os.mkdir(ROOT + sub, 0o755)
        for d in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            if os.path.islink("/" + d):
                os.symlink(os.readlink("/" + d), f"{ROOT}/{d}")
            elif os.path.isdir("/" + d):
                sources.append(("/" + d, os.open("/" + d, O_SRC)))
        for name in names:
            if os.path.islink(f"/etc/{name}"):
                os.symlink(os.readlink(f"/etc/{name}"), f"{ROOT}/etc/{name}")
        for name, data in copies.items():
            with open(f"{ROOT}/etc/{name}", "wb") as f:
                f.write(data)
        for name, text in self._etc_files().items():
            _write(f"{ROOT}/etc/{name}", text)
        self._make_data()  # before the read-only binds: some may live under /tmp
        for dest, fd in sources:
            os.makedirs(ROOT + os.path.dirname(dest), exist_ok=True)
            _bind_ro(fd, ROOT + dest)
        for path in self.cfg["hide"]:  # an empty read-only tmpfs over site-packages
            _mount("sao-empty", ROOT + path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k")
        if self.cfg["python"]:
            os.makedirs(ROOT + "/opt/sao/bin")
            for name in ("python3", "python"):
                os.symlink(self.cfg["python"], f"{ROOT}/opt/sao/bin/{name}")
        self._make_dev()
        _mount(ROOT, ROOT, None, MS_BIND | MS_REC)  # its own mount, so it can be read-only
        _mount("none", ROOT, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        if self.mode == "root":
            self._make_cgroups()
        opts = ["--unshare-all", "--unshare-user", "--die-with-parent", "--new-session"]
        if "--disable-userns" in _help(self.cfg["bwrap"]):  # bubblewrap >= 0.8
            opts.append("--disable-userns")
        opts += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox",
                 "--bind", ROOT, "/", "--dev-bind", STAGE + "/dev", "/dev", "--proc", "/proc"]
        self.bwrap_opts = b"".join(o.encode() + b"\0" for o in opts)

    def _make_cgroups(self) -> None:
        """Memory and pids cgroups (root only; none where the hierarchy is not writable)."""
        try:
            self.cgroups = Cgroups(
                f"sao-sbx-{os.getppid()}-{os.getpid()}",  # named after the host process
                self.limits["memory_mb"] << 20, self.limits["pids"] + 1,
            )
        except OSError:
            return
        if self.cgroups.dirs:  # join once: moving each command in costs ~5 ms (RCU sync)
            with contextlib.suppress(OSError):  # needs CAP_SYS_RESOURCE
                _write("/proc/self/oom_score_adj", "-1000")
            self.cgroups.join()

    def _make_data(self) -> None:
        """The data tmpfs (``disk_mb``): the workdir, /tmp and /dev/shm, bound into ROOT."""
        os.mkdir(DATA)
        _mount("sao-data", DATA, "tmpfs", MS_NOSUID | MS_NODEV,
               f"size={self.limits['disk_mb'] << 20},mode=0755")
        os.mkdir(WORK, 0o755)
        if self.mode == "root":
            os.chown(WORK, self.cfg["uid"], self.cfg["uid"])
        for sub in ("tmp", "shm"):
            os.mkdir(f"{DATA}/{sub}")
            os.chmod(f"{DATA}/{sub}", 0o1777)
        workdir = ROOT + self.cfg["workdir"]
        os.makedirs(workdir, exist_ok=True)
        for src, target in ((WORK, workdir), (DATA + "/tmp", ROOT + "/tmp")):
            _mount(src, target, None, MS_BIND)

    @staticmethod
    def _make_dev() -> None:
        """A minimal /dev: null, zero, full, random, urandom, tty, a private devpts, shm."""
        dev = STAGE + "/dev"
        os.mkdir(dev)
        for name in ("null", "zero", "full", "random", "urandom", "tty"):
            open(f"{dev}/{name}", "w").close()
            _mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND)
        for sub in ("pts", "shm"):
            os.mkdir(f"{dev}/{sub}")
        _mount("devpts", dev + "/pts", "devpts", MS_NOSUID | MS_NOEXEC,
               "newinstance,ptmxmode=0666,mode=620")
        _mount(DATA + "/shm", dev + "/shm", None, MS_BIND)
        links = {"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
                 "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"}
        for name, target in links.items():
            os.symlink(target, f"{dev}/{name}")
        _mount(dev, dev, None, MS_BIND | MS_REC)  # its own mount, so it can be read-only
        _mount("none", dev, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC)

    def _etc_files(self) -> dict[str, str]:
        u = SANDBOX_UID
        return {
            "passwd": f"root:x:0:0:root:/root:/bin/sh\nsandbox:x:{u}:{u}:sandbox:"
            f"{self.cfg['workdir']}:/bin/sh\nnobody:x:65534:65534::/nonexistent:/bin/false\n",
            "group": f"root:x:0:\nsandbox:x:{u}:\nnogroup:x:65534:\n",
            "hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n",
            "hostname": "sandbox\n",
        }

    # -- commands ----------------------------------------------------------
    def spawn(self, rid: int, fds: list[int]) -> None:
        """Start one command; ``fds`` are stdin, stdout, stderr and the spec memfd."""
        stdin, stdout, stderr, spec_fd = fds
        spec = json.loads(os.pread(spec_fd, os.fstat(spec_fd).st_size, 0))
        os.close(spec_fd)
        status_r = status_w = args_fd = None
        if self.mode != "unsafe":
            status_r, status_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            args_fd = os.memfd_create("bwrap-args", os.MFD_CLOEXEC)
            dyn = ["--chdir", spec["cwd"], "--clearenv"]
            for key, value in spec["env"].items():
                dyn += ["--setenv", key, value]
            dyn += ["--json-status-fd", "3"]
            os.write(args_fd, self.bwrap_opts + b"".join(a.encode() + b"\0" for a in dyn))
            os.lseek(args_fd, 0, os.SEEK_SET)
        oom0 = self.cgroups.oom_kills() if self.cgroups else 0
        try:
            pid = os.fork()
        except OSError as exc:  # e.g. the pids limit, filled by a concurrent fork bomb
            os.write(stderr, f"sandbox: cannot start the command: {exc.strerror}\n".encode())
            pid = None
        if pid == 0:  # child: never returns
            self._exec_child(spec, (stdin, stdout, stderr), status_w, args_fd)
        for fd in (stdin, stdout, stderr, status_w, args_fd, status_r if pid is None else None):
            if fd is not None:
                os.close(fd)
        if pid is None:
            self.send({"op": "done", "id": rid, "exit": 126, "timed_out": False, "oom": False})
            return
        run = Run(rid, pid, time.monotonic() + max(0.0, spec["timeout"]), status_r, oom0)
        self.runs[rid] = self.by_pid[pid] = run
        if status_r is not None:
            self.sel.register(status_r, selectors.EVENT_READ, ("status", run))

    def _exec_child(self, spec: dict, stdio: tuple, status_w: int | None, args_fd: int | None):
        code = 127
        try:
            for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            signal.set_wakeup_fd(-1)
            if self.mode != "unsafe":  # the OOM killer takes sandboxed code, not the launcher
                _write("/proc/self/oom_score_adj", "1000")
            lim = self.limits
            mib = 1 << 20
            rlimits = [(resource.RLIMIT_CPU, lim["cpu_seconds"]),
                       (resource.RLIMIT_AS, lim["memory_mb"] * mib),
                       (resource.RLIMIT_FSIZE, lim["file_size_mb"] * mib),
                       (resource.RLIMIT_NOFILE, lim["open_files"]), (resource.RLIMIT_CORE, 0)]
            if self.mode != "unsafe":  # counts every process of the (real) uid
                rlimits.append((resource.RLIMIT_NPROC, lim["pids"]))
            for which, value in rlimits:
                resource.setrlimit(which, (value, value))
            if self.mode == "root":
                uid = self.cfg["uid"]
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
            for target, fd in enumerate(stdio):
                os.dup2(fd, target)
            if self.mode == "unsafe":
                os.setsid()
                os.chdir(spec["cwd"])
                os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
            os.dup2(status_w, 3)
            os.dup2(args_fd, 4)
            bwrap = self.cfg["bwrap"]
            os.execve(bwrap, [bwrap, "--args", "4", "--", *spec["argv"]], {"PATH": EXEC_PATH})
        except OSError as exc:
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            msg = f"sandbox: cannot execute {spec['argv'][0][:200]!r}: {exc.strerror}\n"
            os.write(2, msg.encode(errors="replace"))
        finally:
            os._exit(code)

    def kill(self, run: Run) -> None:
        """SIGKILL a command's bwrap and its pid-namespace init (which takes the rest down)."""
        try:
            if self.mode == "unsafe":
                os.killpg(run.pid, signal.SIGKILL)
            elif run.exit is None:  # not reaped yet, so the pid cannot have been reused
                os.kill(run.pid, signal.SIGKILL)
            if run.init_fd is not None:
                signal.pidfd_send_signal(run.init_fd, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _read_status(self, run: Run) -> None:
        while run.status_fd is not None:
            try:
                chunk = os.read(run.status_fd, 4096)
            except BlockingIOError:
                return
            if not chunk:
                self._forget(run, "status_fd")
                return
            run.status_buf += chunk
            match = re.search(rb'"child-pid":\s*(\d+)', run.status_buf)
            if match and not run.init_seen:
                run.init_seen = True
                self._watch_init(run, int(match.group(1)))

    def _watch_init(self, run: Run, pid: int) -> None:
        try:
            fd = os.pidfd_open(pid)
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:  # already gone
            return
        if ppid not in (run.pid, os.getpid()):  # not bwrap's child: never signal it
            os.close(fd)
            return
        run.init_fd = fd
        self.sel.register(fd, selectors.EVENT_READ, ("init", run))

    def _forget(self, run: Run, attr: str) -> None:
        fd = getattr(run, attr)
        if fd is not None:
            self.sel.unregister(fd)
            os.close(fd)
            setattr(run, attr, None)

    def reap(self) -> None:
        """Collect every exited child (the launcher is a subreaper) and finish runs."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            run = self.by_pid.pop(pid, None)
            if run is not None:
                run.exit = os.waitstatus_to_exitcode(status)
                if self.mode == "unsafe":  # best effort: the rest of its process group
                    self.kill(run)
        for run in list(self.runs.values()):
            if run.exit is not None:
                self._maybe_finish(run)

    def _maybe_finish(self, run: Run) -> None:
        self._read_status(run)
        if run.init_fd is not None:  # bwrap exited; wait until its pid 1 has too
            return
        self._forget(run, "status_fd")
        del self.runs[run.rid]
        exit_code = run.exit if run.exit >= 0 else 128 - run.exit
        if run.timed_out:
            exit_code = 128 + signal.SIGKILL
        oom = bool(self.cgroups and self.cgroups.oom_kills() > run.oom0)
        self.send({"op": "done", "id": run.rid, "exit": exit_code, "timed_out": run.timed_out,
                   "oom": oom})

    def send(self, msg: dict) -> None:
        """Send one message to the host (blocking; messages are small)."""
        try:
            self.sock.send(json.dumps(msg).encode())
        except OSError:
            pass

    # -- main loop -----------------------------------------------------------
    def serve(self) -> None:
        """Serve requests until the host closes the socket, then kill everything."""
        self.sel = selectors.DefaultSelector()
        wake_r, wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake_w)
        self.sel.register(wake_r, selectors.EVENT_READ, ("wake", None))
        self.sel.register(self.sock, selectors.EVENT_READ, ("sock", None))
        closing = False
        while not closing or self.runs:
            deadline = min((r.deadline for r in self.runs.values()), default=None)
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            if closing:
                timeout = 0.05
            for key, _ in self.sel.select(timeout):
                kind, run = key.data
                if kind == "wake":
                    while True:
                        try:
                            if not os.read(wake_r, 512):
                                break
                        except BlockingIOError:
                            break
                elif kind == "status":
                    self._read_status(run)
                elif kind == "init":
                    self._forget(run, "init_fd")
                elif not closing:
                    closing = self._handle_request()
            now = time.monotonic()
            for run in list(self.runs.values()):
                if closing or (now >= run.deadline and run.exit is None):
                    run.timed_out = run.timed_out or not closing
                    run.deadline = now + 0.05  # re-kill until reaped, without spinning
                    self.kill(run)
            self.reap()
        if self.cgroups:
            self.cgroups.remove()

    def _handle_request(self) -> bool:
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, 65536, 8, socket.MSG_CMSG_CLOEXEC)
        except OSError:
            return True
        if not data:
            return True
        msg = json.loads(data)
        if msg["op"] == "run":
            try:
                self.spawn(msg["id"], fds)
            except Exception as exc:  # noqa: BLE001 - reported to the host as a crash
                self.send({"op": "done", "id": msg["id"], "error": repr(exc)})
        elif msg["op"] == "kill" and msg["id"] in self.runs:
            self.kill(self.runs[msg["id"]])
        return False


def main() -> None:
    """Entry point: ``python -I -S _local_launcher.py FD CONFIG_JSON``."""
    sock = socket.socket(fileno=int(sys.argv[1]))
    sock.setblocking(True)
    launcher = Launcher(sock, json.loads(sys.argv[2]))
    try:
        _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(CHILD_SUBREAPER)")
        launcher.setup()
    except Exception as exc:  # noqa: BLE001 - reported to the host
        launcher.send({"op": "fatal", "error": f"{type(exc).__name__}: {exc}"})
        if launcher.cgroups:
            launcher.cgroups.remove()
        sys.exit(1)
    launcher.send({"op": "ready", "cgroups": bool(launcher.cgroups and launcher.cgroups.dirs)})
    launcher.serve()


if __name__ == "__main__":
    main()
