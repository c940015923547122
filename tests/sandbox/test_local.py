"""LocalSandbox specifics: environment, interpreter, binds, cgroups, crashes, unsafe mode."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import sao_gym.sandbox.local as local
from sao_gym.sandbox.base import Limits, SandboxCrashed, SandboxError, SandboxUnavailable
from sao_gym.sandbox.local import LocalSandbox
from tests.sandbox.conftest import wait_no_marked_processes

pytestmark = pytest.mark.timeout(120)  # a broken sandbox must fail, not hang

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


@pytest.fixture
async def local_sandbox():
    sandbox = LocalSandbox()
    try:
        if shutil.which("bwrap") is None:
            pytest.skip("bubblewrap not installed")
        await sandbox.start()
        yield sandbox
    finally:
        await sandbox.aclose()


async def test_without_bwrap_it_refuses_to_start(monkeypatch):
    monkeypatch.setattr(local, "_bwrap", lambda: None)
    sandbox = LocalSandbox()
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        await sandbox.start()
    assert not await LocalSandbox.available()
    await sandbox.aclose()


async def test_unsafe_subprocess_mode(monkeypatch, marker):
    monkeypatch.setattr(local, "_bwrap", lambda: None)
    sandbox = LocalSandbox(unsafe_subprocess=True, limits=Limits(file_size_mb=1))
    async with sandbox:
        workdir = sandbox.workdir
        assert os.path.isdir(workdir) and os.path.basename(workdir).startswith("sao-sbx-")
        result = await sandbox.run(["python3", "-c", "import os; print(os.getcwd())"])
        assert result.stdout.strip() == workdir
        await sandbox.write_file("a/b.txt", "hi")
        assert (await sandbox.run("cat a/b.txt")).stdout == "hi"
        timed = await sandbox.run(["python3", "-c", "import time; time.sleep(30)", marker],
                                  timeout_s=0.5)
        assert timed.timed_out and not wait_no_marked_processes(marker)
        big = await sandbox.run(["python3", "-c", "open('f', 'wb').write(b'x' * (2 << 20))"])
        assert not big.ok and "File too large" in big.stderr
        await sandbox.run(["ln", "-s", "/etc/hostname", "link"])
        with pytest.raises(OSError, match="symlink"):
            await sandbox.read_file("link")
        await sandbox.run("mkdir -p x/y && touch x/y/z && chmod 000 x/y x")
    assert not os.path.exists(workdir)


async def test_environment_and_interpreter(local_sandbox):
    result = await local_sandbox.run(["sh", "-c", "echo $HOME $LANG $TMPDIR; id -u; hostname"])
    assert result.stdout.split() == ["/work", "C.UTF-8", "/tmp", "1000", "sandbox"]
    code = "import sys; print(sys.base_prefix); import pytest"
    py = await local_sandbox.run(["python3", "-c", code])
    assert py.stdout.strip() == os.path.realpath(sys.base_prefix)
    assert "ModuleNotFoundError" in py.stderr  # the library's site-packages are hidden
    assert (await local_sandbox.run(["python", "-c", "print(1)"])).stdout == "1\n"


async def test_no_privileges_inside(local_sandbox):
    result = await local_sandbox.run(["sh", "-c", "grep CapEff /proc/self/status; "
                                      "unshare -U true && echo nested-userns"])
    assert "0000000000000000" in result.stdout
    bwrap_help = subprocess.run(["bwrap", "--help"], capture_output=True, text=True).stdout
    if "--disable-userns" in bwrap_help:
        assert "nested-userns" not in result.stdout, result


async def test_read_only_system_and_fresh_tmp(local_sandbox):
    code = "for p in ('/usr/x', '/etc/x', '/x', '/dev/x'):\n    try: open(p, 'w')\n" \
           "    except OSError as e: print(e.errno)"
    result = await local_sandbox.run(["python3", "-c", code])
    assert result.stdout.split() == ["30", "30", "30", "30"]  # EROFS everywhere
    await local_sandbox.run("echo kept > /tmp/t; echo shm > /dev/shm/s")
    assert (await local_sandbox.run("cat /tmp/t /dev/shm/s")).stdout == "kept\nshm\n"
    listing = (await local_sandbox.run(["ls", "-a", "/tmp"])).stdout.split()
    assert listing == [".", "..", "t"]  # not the host's /tmp


@needs_bwrap
async def test_extra_ro_binds_and_explicit_python(tmp_path):
    shared = tempfile.mkdtemp(prefix="saotest-")
    try:
        Path(shared, "data.txt").write_text("shared data")
        os.chmod(shared, 0o755)
        os.chmod(Path(shared, "data.txt"), 0o644)
        async with LocalSandbox(extra_ro_binds=[shared], python="/usr/bin/python3") as sb:
            assert (await sb.run(["cat", f"{shared}/data.txt"])).stdout == "shared data"
            assert not (await sb.run(["touch", f"{shared}/new"])).ok
            prefix = await sb.run(["python3", "-c", "import sys; print(sys.prefix)"])
            assert prefix.stdout.strip() == "/usr"
    finally:
        shutil.rmtree(shared)
    with pytest.raises(ValueError):
        LocalSandbox(extra_ro_binds=["/no/such/path"])
    with pytest.raises(ValueError):
        LocalSandbox(workdir="relative")


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups are used as root only")
async def test_cgroup_memory_limit_and_oom_report(marker):
    if not Path("/sys/fs/cgroup/memory/cgroup.procs").exists():
        pytest.skip("no cgroup v1 memory controller")
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap not installed")
    code = """
import os, time
for _ in range(6):  # six 100 MiB children: each under RLIMIT_AS, together over the cgroup
    if os.fork() == 0:
        data = b"x" * (100 << 20)
        time.sleep(2)
        os._exit(0)
print(sorted(os.waitstatus_to_exitcode(os.wait()[1]) for _ in range(6)))
"""
    async with LocalSandbox(limits=Limits(memory_mb=256)) as sb:
        result = await sb.run(["python3", "-c", code, marker], timeout_s=30)
    assert result.oom_killed and "-9" in result.stdout, result


async def test_launcher_crash_is_reported(local_sandbox):
    os.kill(local_sandbox._conn.proc.pid, signal.SIGKILL)
    with pytest.raises(SandboxCrashed):
        await local_sandbox.run(["true"])
    await local_sandbox.aclose()
    with pytest.raises(SandboxError):
        await local_sandbox.run(["true"])


@needs_bwrap
async def test_no_host_temp_dirs_or_mounts():
    def ours() -> set[str]:
        return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("sao-sbx-")}

    before = ours()
    async with LocalSandbox() as sb:
        await sb.write_file("x", "y")
        assert ours() == before
        assert "sao-data" not in Path("/proc/self/mountinfo").read_text()


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3")
                    or shutil.which("setpriv") is None, reason="needs root, setpriv, python3")
@needs_bwrap
def test_works_for_an_unprivileged_user():
    """An ordinary user: the launcher makes its own user namespace, no cgroups."""
    pkg = tempfile.mkdtemp(prefix="saotest-")
    try:
        os.mkdir(f"{pkg}/sbx")
        Path(pkg, "sbx", "__init__.py").write_text("")
        for name in ("base.py", "local.py", "_local_io.py", "_local_launcher.py"):
            text = (Path(local.__file__).parent / name).read_text()
            Path(pkg, "sbx", name).write_text(text.replace("sao_gym.sandbox.", "sbx."))
        Path(pkg, "main.py").write_text("""
import asyncio
from sbx.base import Limits
from sbx.local import LocalSandbox


async def main():
    async with LocalSandbox(limits=Limits(pids=32)) as sb:
        await sb.write_file("in.txt", "data\\n")
        print((await sb.run("id -u; cat in.txt; python3 -c 'print(6*7)'")).stdout, end="")
        bomb = "import os, time\\nfor i in range(100):\\n    if os.fork() == 0:\\n" \\
               "        time.sleep(5); os._exit(0)\\n"
        print((await sb.run(["python3", "-c", bomb])).ok)
        print((await sb.run(["sleep", "9"], timeout_s=0.3)).timed_out)

asyncio.run(main())
""")
        subprocess.run(["chmod", "-R", "a+rX", pkg], check=True)
        result = subprocess.run(
            ["setpriv", "--reuid=54321", "--regid=54321", "--clear-groups",
             "/usr/bin/python3", "main.py"], cwd=pkg, capture_output=True, text=True,
            timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": pkg},
        )
    finally:
        shutil.rmtree(pkg)
    assert result.stdout.split() == ["1000", "data", "42", "False", "True"], result.stderr


async def test_concurrent_starts_share_one_launcher(local_sandbox):
    await asyncio.gather(*(local_sandbox.start() for _ in range(5)))
    results = await asyncio.gather(*(local_sandbox.run(["echo", str(i)]) for i in range(5)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(5)]


async def test_nul_bytes_cannot_inject_bwrap_options(local_sandbox):
    with pytest.raises(ValueError):
        await local_sandbox.run(["true"], env={"A": "x\0--bind\0/\0/host"})
    with pytest.raises(ValueError):
        await local_sandbox.run(["true"], cwd="sub\0--bind")
    with pytest.raises(ValueError):
        await local_sandbox.run(["true"], env={"A=B": "c"})
