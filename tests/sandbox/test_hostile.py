"""Hostile programs, run against every backend: each is contained and reported as data.

Every program is Python (``python3 -c CODE MARKER``): the marker in its command
line lets the fixture (and some tests) find any process that survived. The
programs bound themselves (process counts, bytes, seconds) so that a broken
sandbox cannot take the machine down.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from sao_gym.sandbox.base import Limits
from tests.sandbox.conftest import marked_processes, wait_no_marked_processes

pytestmark = pytest.mark.timeout(120)  # a broken sandbox must fail, not hang

CHECKOUT = Path(__file__).resolve().parents[2]


def py(code: str, marker: str) -> list[str]:
    """The argv running ``code`` with ``marker`` in its command line."""
    return ["python3", "-c", code, marker]


async def test_fork_bomb_is_bounded(make_sandbox, marker):
    sandbox = await make_sandbox(limits=Limits(pids=48))
    code = """
import os, sys, time
made = failed = 0
for _ in range(400):  # hard cap: a broken sandbox gets 400 sleepers, not a dead machine
    try:
        pid = os.fork()
    except OSError:
        failed += 1
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    made += 1
print(made, failed)
"""
    result = await sandbox.run(py(code, marker), timeout_s=30)
    made, failed = map(int, result.stdout.split())
    assert failed == 1 and made < 48, result
    assert result.duration_s < 20  # the sleepers die with the command, they do not hold it
    assert not wait_no_marked_processes(marker)
    assert (await sandbox.run(["echo", "ok"])).stdout == "ok\n"


async def test_memory_bomb_is_reported(make_sandbox, marker):
    sandbox = await make_sandbox(limits=Limits(memory_mb=256))
    code = """
chunks = []
for _ in range(128):  # at most 2 GiB even if nothing stops it
    chunks.append(b"x" * (16 << 20))
print("survived", len(chunks))
"""
    result = await sandbox.run(py(code, marker), timeout_s=60)
    assert not result.ok and result.oom_killed and "survived" not in result.stdout, result
    assert (await sandbox.run(["echo", "ok"])).stdout == "ok\n"


async def test_cpu_spin_times_out(sandbox, marker):
    result = await sandbox.run(py("while True: pass", marker), timeout_s=1)
    assert result.timed_out and not result.ok and result.duration_s < 6
    assert not marked_processes(marker)


async def test_cpu_seconds_limit(make_sandbox, marker):
    sandbox = await make_sandbox(limits=Limits(cpu_seconds=1))
    result = await sandbox.run(py("while True: pass", marker), timeout_s=30)
    assert not result.timed_out and result.exit_code in (128 + signal.SIGXCPU, 137), result
    assert result.duration_s < 15


async def test_sleep_forever_times_out(sandbox, marker):
    result = await sandbox.run(py("import time; time.sleep(10**6)", marker), timeout_s=0.5)
    assert result.timed_out and result.exit_code == 137 and result.duration_s < 5
    assert not marked_processes(marker)


async def test_huge_output_is_capped(sandbox, marker):
    code = """
import os
chunk = b"o" * (1 << 20)
for _ in range(50):  # 100 MB in all, half on each stream
    os.write(1, chunk)
    os.write(2, chunk)
"""
    result = await sandbox.run(py(code, marker), timeout_s=60)
    assert result.exit_code == 0 and result.output_truncated, result.exit_code
    assert len(result.stdout.encode()) == 1 << 20 and len(result.stderr.encode()) == 1 << 20
    assert result.duration_s < 30


async def test_binary_output_is_decoded_not_raised(sandbox, marker):
    code = "import os; os.write(1, bytes(range(256)) * 4 + b'\\xff\\xfe tail')"
    result = await sandbox.run(py(code, marker))
    assert result.ok and "\ufffd" in result.stdout and result.stdout.endswith(" tail")


async def test_writing_outside_the_workdir(make_sandbox, marker):
    sandbox = await make_sandbox()
    name = f"sao-escape-{marker}"
    targets = [f"/{name}", f"/etc/{name}", f"/usr/{name}", f"/usr/bin/{name}",
               f"{Path.home()}/{name}", f"{CHECKOUT}/{name}", f"/proc/sys/kernel/{name}"]
    code = f"""
import json
out = {{}}
for path in {targets!r}:
    try:
        with open(path, "w") as f:
            f.write("pwned")
        out[path] = "written"
    except OSError as e:
        out[path] = e.strerror
print(json.dumps(out))
"""
    result = await sandbox.run(py(code, marker))
    report = json.loads(result.stdout)
    assert set(report) == set(targets)
    for path in targets:
        assert not os.path.exists(path), f"{path} written on the host"
    must_fail = [f"/etc/{name}", f"/usr/bin/{name}", f"/proc/sys/kernel/{name}"]
    assert all(report[p] != "written" for p in must_fail), report
    if make_sandbox.backend == "local":
        assert "written" not in report.values(), report


async def test_host_files_are_unreadable(sandbox, marker, tmp_path):
    secret = "sao-host-secret-" + marker
    home_secret = tempfile.NamedTemporaryFile("w", dir=Path.home(), prefix=".sao-secret-",
                                              delete=False)
    try:
        home_secret.write(secret)
        home_secret.close()
        (tmp_path / "secret.txt").write_text(secret)
        paths = [home_secret.name, str(tmp_path / "secret.txt"), str(CHECKOUT / "pyproject.toml"),
                 str(CHECKOUT / "sao_gym" / "sandbox" / "base.py")]
        code = f"""
import os
for path in {paths!r}:
    try:
        print(path, open(path).read()[:200])
    except OSError as e:
        print(path, "ERR", e.strerror)
for d in {[str(Path.home()), str(CHECKOUT)]!r}:
    try:
        print(d, sorted(os.listdir(d)))
    except OSError as e:
        print(d, "ERR", e.strerror)
"""
        result = await sandbox.run(py(code, marker))
        assert result.ok, result
        assert secret not in result.stdout
        assert "[build-system]" not in result.stdout and "resolve_in_workdir" not in result.stdout
        assert "pyproject.toml" not in result.stdout.split(str(CHECKOUT) + " ", 2)[-1]
    finally:
        os.unlink(home_secret.name)


async def test_loopback_of_the_host_is_unreachable(sandbox, marker):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    code = f"""
import socket
for host in ("127.0.0.1", "localhost"):
    try:
        socket.create_connection((host, {port}), timeout=3).sendall(b"leak")
        print("connected")
    except OSError as e:
        print("refused", e.errno)
"""
    try:
        result = await sandbox.run(py(code, marker), timeout_s=20)
        assert "connected" not in result.stdout and result.stdout.count("refused") == 2, result
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()


async def test_daemon_does_not_outlive_the_command(sandbox, marker):
    code = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.closerange(0, 3)
        for _ in range(600):  # bounded: 30 s at most
            with open("heartbeat", "a") as f:
                f.write(".")
            time.sleep(0.05)
        os._exit(0)
    os._exit(0)
time.sleep(0.3)
print("parent done")
"""
    result = await sandbox.run(py(code, marker), timeout_s=20)
    assert result.stdout == "parent done\n" and result.duration_s < 10
    assert not wait_no_marked_processes(marker, timeout_s=1.0)
    size = len(await sandbox.read_file("heartbeat"))
    time.sleep(0.5)
    assert len(await sandbox.read_file("heartbeat")) == size


async def test_cannot_kill_host_processes(sandbox, marker):
    helper = subprocess.Popen(["sleep", "60"])
    try:
        code = f"""
import os, signal
try:
    os.kill({helper.pid}, signal.SIGKILL)
    print("sent")
except OSError as e:
    print("denied", e.errno)
os.system("kill -9 -1")  # every process this user can reach
"""
        result = await sandbox.run(py(code, marker), timeout_s=20)
        assert "denied" in result.stdout or result.exit_code != 0
        time.sleep(0.2)
        assert helper.poll() is None, "the sandbox killed a host process"
        assert (await sandbox.run(["echo", "ok"])).stdout == "ok\n"
    finally:
        helper.kill()
        helper.wait()


async def test_filling_the_disk(make_sandbox, marker):
    sandbox = await make_sandbox(limits=Limits(disk_mb=32))
    code = """
import os
chunk = b"d" * (1 << 20)
for i in range(512):  # 512 MB at most
    try:
        with open(f"fill{i}", "wb") as f:
            f.write(chunk)
    except OSError as e:
        print("stopped", i, e.errno)
        break
else:
    print("wrote everything")
"""
    result = await sandbox.run(py(code, marker), timeout_s=60)
    words = result.stdout.split()
    assert words[0] == "stopped" and int(words[1]) <= 40, result
    assert int(words[2]) in (errno.ENOSPC, errno.EDQUOT)
    assert (await sandbox.run("rm -f fill*; echo ok")).stdout == "ok\n"
    await sandbox.write_file("after.txt", "fits again")


async def test_file_size_limit(make_sandbox, marker):
    sandbox = await make_sandbox(limits=Limits(file_size_mb=2))
    code = """
try:
    with open("big", "wb") as f:
        f.write(b"b" * (4 << 20))
    print("wrote")
except OSError as e:
    print("refused", e.errno)
"""
    result = await sandbox.run(py(code, marker))
    assert f"refused {errno.EFBIG}" in result.stdout or result.exit_code == 128 + signal.SIGXFSZ


async def test_symlink_escapes(sandbox, marker, tmp_path):
    secret = "sao-link-secret-" + marker
    host_file = tmp_path / "secret.txt"
    host_file.write_text(secret)
    target_dir = tmp_path / "target"
    target_dir.mkdir()
    links = f"ln -s {host_file} file_link; ln -s / root_link; ln -s {target_dir} dir_link"
    await sandbox.run(["sh", "-c", links + "; ln -s /etc/passwd pw"])
    for path in ["file_link", f"root_link{host_file}", "pw"]:
        try:
            data = await sandbox.read_file(path)
        except (OSError, ValueError):
            continue
        assert secret.encode() not in data
    for path in ["dir_link/planted", f"root_link{target_dir}/planted", "file_link"]:
        try:
            await sandbox.write_file(path, "planted")
        except (OSError, ValueError):
            pass
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "planted").write_text("planted")
    try:
        await sandbox.upload(str(tmp_path / "up"), "dir_link")
    except (OSError, ValueError):
        pass
    assert host_file.read_text() == secret
    assert list(target_dir.iterdir()) == []
    inside = await sandbox.run(py(f"print(open('root_link{host_file}').read())", marker))
    assert secret not in inside.stdout


async def test_huge_argv_is_a_result(sandbox, marker):
    one_big = await sandbox.run(["echo", "x" * (1 << 20), marker])  # > MAX_ARG_STRLEN
    assert not one_big.ok and one_big.exit_code != 0
    many = await sandbox.run(["echo", *(["y" * 1000] * 5000), marker])  # 5 MB in all
    assert not many.ok
    fits = await sandbox.run(["python3", "-c", "import sys; print(len(sys.argv))",
                              *(["z" * 100] * 1000)])
    assert fits.stdout == "1001\n"


async def test_open_files_limit(make_sandbox, marker):
    sandbox = await make_sandbox(limits=Limits(open_files=64))
    code = """
import os
fds = []
try:
    for _ in range(10000):
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError as e:
    print(len(fds), e.errno)
"""
    result = await sandbox.run(py(code, marker))
    count, err = map(int, result.stdout.split())
    assert count < 64 and err == errno.EMFILE


async def test_stdin_flood_to_a_command_that_does_not_read(sandbox, marker):
    result = await sandbox.run(py("print('ignored stdin')", marker), stdin=b"s" * (64 << 20),
                               timeout_s=30)
    assert result.ok and result.stdout == "ignored stdin\n" and result.duration_s < 20


async def test_host_processes_are_invisible(sandbox, marker):
    code = """
import os
pids = [p for p in os.listdir("/proc") if p.isdigit()]
cmdlines = [open(f"/proc/{p}/cmdline", "rb").read() for p in pids]
print(len(pids), any(b"py" + b"test" in c for c in cmdlines))
"""
    result = await sandbox.run(py(code, marker))
    count, sees_pytest = result.stdout.split()
    assert int(count) < 20 and sees_pytest == "False", result


async def test_sabotaged_workdir(make_sandbox, marker):
    """FIFOs, unreadable deep trees: transfers fail fast, and close still cleans up."""
    sandbox = await make_sandbox()
    code = """
import os

os.mkfifo("pipe")
path = "deep"
for i in range(100):
    path = os.path.join(path, f"d{i}")
os.makedirs(path)
open(os.path.join(path, "f"), "w").write("x")
for root, dirs, files in os.walk("deep", topdown=False):
    for name in dirs + files:
        os.chmod(os.path.join(root, name), 0)
os.chmod("deep", 0)
print("sabotaged")
"""
    result = await sandbox.run(py(code, marker))
    assert result.stdout == "sabotaged\n", result
    with pytest.raises(OSError):
        await asyncio.wait_for(sandbox.read_file("pipe"), 10)  # never blocks on the FIFO
    with pytest.raises(OSError):
        await asyncio.wait_for(sandbox.write_file("pipe", "x"), 10)
