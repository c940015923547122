"""The Sandbox contract, run against every backend (see conftest.make_sandbox)."""

from __future__ import annotations

import asyncio
import os
import stat

import pytest

from sao_gym.sandbox.base import Limits, Sandbox, SandboxError

pytestmark = pytest.mark.timeout(120)  # a broken sandbox must fail, not hang


async def test_is_a_sandbox(sandbox):
    assert isinstance(sandbox, Sandbox)
    assert sandbox.workdir.startswith("/")


async def test_argv_exit_codes(sandbox):
    ok = await sandbox.run(["true"])
    assert ok.ok and ok.exit_code == 0 and not ok.timed_out and not ok.output_truncated
    assert (await sandbox.run(["false"])).exit_code == 1
    assert (await sandbox.run(["sh", "-c", "exit 7"])).exit_code == 7
    assert (await sandbox.run(["python3", "-c", "import sys; sys.exit(3)"])).exit_code == 3


async def test_argv_is_not_shell_parsed(sandbox):
    result = await sandbox.run(["echo", "$HOME", "a;b", "*", "'q'"])
    assert result.stdout == "$HOME a;b * 'q'\n"


async def test_shell_string(sandbox):
    result = await sandbox.run("echo $((6 * 7)) | tr 4 x; echo err >&2; exit 5")
    assert (result.exit_code, result.stdout, result.stderr) == (5, "x2\n", "err\n")


async def test_killed_by_signal_reports_128_plus_signal(sandbox):
    result = await sandbox.run(["sh", "-c", "kill -9 $$"])
    assert result.exit_code == 137 and not result.timed_out


async def test_missing_command_is_a_result(sandbox):
    result = await sandbox.run(["no-such-command-sao"])
    assert not result.ok and result.exit_code in (126, 127)


async def test_stdin(sandbox):
    assert (await sandbox.run(["cat"], stdin="héllo")).stdout == "héllo"
    data = os.urandom(3 << 20)
    result = await sandbox.run(["python3", "-c", "import sys, hashlib; "
                                "print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())"],
                               stdin=data)
    import hashlib

    assert result.stdout.strip() == hashlib.sha256(data).hexdigest()
    assert (await sandbox.run(["cat"])).stdout == ""  # no stdin: EOF, never a hang


async def test_env_is_added_to_a_scrubbed_environment(sandbox, monkeypatch):
    monkeypatch.setenv("SAO_HOST_SECRET", "hunter2")
    result = await sandbox.run(["sh", "-c", "echo $FOO; env"], env={"FOO": "bar baz"})
    assert result.stdout.startswith("bar baz\n")
    assert "hunter2" not in result.stdout and "PATH=" in result.stdout


async def test_cwd(sandbox):
    assert (await sandbox.run(["pwd"])).stdout.strip() == sandbox.workdir
    await sandbox.run(["mkdir", "-p", "sub/dir"])
    nested = await sandbox.run(["pwd"], cwd="sub/dir")
    assert nested.stdout.strip() == sandbox.workdir + "/sub/dir"
    absolute = await sandbox.run(["pwd"], cwd=sandbox.workdir + "/sub")
    assert absolute.stdout.strip() == sandbox.workdir + "/sub"


async def test_timeout(sandbox):
    result = await sandbox.run(["sleep", "30"], timeout_s=0.5)
    assert result.timed_out and not result.ok and result.duration_s < 5
    assert (await sandbox.run(["echo", "alive"])).stdout == "alive\n"


async def test_output_cap(sandbox):
    result = await sandbox.run(["python3", "-c", "print('x' * 100000)"], max_output_bytes=1000)
    assert result.output_truncated and result.stdout == "x" * 1000
    whole = await sandbox.run(["python3", "-c", "print('y' * 999)"], max_output_bytes=1000)
    assert not whole.output_truncated and whole.stdout == "y" * 999 + "\n"


async def test_files_persist_between_commands(sandbox):
    await sandbox.run("echo one > a.txt")
    assert (await sandbox.run(["cat", "a.txt"])).stdout == "one\n"


async def test_write_read_round_trip(sandbox):
    blob = bytes(range(256)) * 1000
    await sandbox.write_file("bin.dat", blob)
    await sandbox.write_file("deep/er/text.txt", "héllo\n")
    assert await sandbox.read_file("bin.dat") == blob
    assert await sandbox.read_file(sandbox.workdir + "/deep/er/text.txt") == "héllo\n".encode()
    assert (await sandbox.run(["cat", "deep/er/text.txt"])).stdout == "héllo\n"
    await sandbox.write_file("deep/er/text.txt", "short")  # overwrite truncates
    assert await sandbox.read_file("deep/er/text.txt") == b"short"
    await sandbox.run(["sh", "-c", "printf made-inside > inside.txt; chmod 600 inside.txt"])
    assert await sandbox.read_file("inside.txt") == b"made-inside"
    await sandbox.write_file("inside.txt", "host")  # files made inside can be replaced
    assert (await sandbox.run(["cat", "inside.txt"])).stdout == "host"


async def test_files_written_by_the_host_are_writable_inside(sandbox):
    await sandbox.write_file("d/f.txt", "1")
    result = await sandbox.run("echo 2 >> d/f.txt && touch d/new && rm d/f.txt && echo ok")
    assert result.stdout == "ok\n", result.stderr


async def test_read_errors(sandbox):
    with pytest.raises(FileNotFoundError):
        await sandbox.read_file("missing.txt")
    await sandbox.run(["mkdir", "adir"])
    with pytest.raises(OSError):
        await sandbox.read_file("adir")


async def test_upload(sandbox, tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "sub" / "data.bin").write_bytes(b"\x00\xff" * 100)
    (tmp_path / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (tmp_path / "run.sh").chmod(0o755)
    (tmp_path / "top.txt").write_text("top")
    await sandbox.upload(str(tmp_path))
    assert await sandbox.read_file("pkg/sub/data.bin") == b"\x00\xff" * 100
    assert (await sandbox.run(["./run.sh"])).stdout == "ran\n"
    await sandbox.upload(str(tmp_path / "pkg"), "nested/here")
    assert (await sandbox.run(["ls", "nested/here/sub"])).stdout == "data.bin\n"
    assert stat.S_IMODE((tmp_path / "run.sh").stat().st_mode) == 0o755


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../../x", "/tmp/x", "/"])
async def test_paths_outside_the_workdir_are_refused(sandbox, path):
    with pytest.raises(ValueError):
        await sandbox.write_file(path, "x")
    with pytest.raises(ValueError):
        await sandbox.read_file(path)
    with pytest.raises(ValueError):
        await sandbox.write_file(sandbox.workdir + "/../" + path.lstrip("/"), "x")


async def test_concurrent_commands_in_one_sandbox(sandbox):
    results = await asyncio.gather(*(sandbox.run(["sh", "-c", f"sleep 0.2; echo {i}"])
                                     for i in range(4)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(4)]


async def test_limits_are_accepted(make_sandbox):
    sandbox = await make_sandbox(limits=Limits(memory_mb=512, pids=64, disk_mb=64))
    assert (await sandbox.run(["echo", "ok"])).stdout == "ok\n"


async def test_async_with_and_idempotent_close(make_sandbox):
    async with make_sandbox.cls() as sandbox:
        assert (await sandbox.run(["echo", "in"])).stdout == "in\n"
    await sandbox.aclose()
    await sandbox.aclose()
    with pytest.raises(SandboxError):
        await sandbox.run(["true"])
    with pytest.raises(SandboxError):
        await sandbox.write_file("a", "b")
    with pytest.raises(SandboxError):
        await sandbox.read_file("a")
    with pytest.raises(SandboxError):
        await sandbox.start()


async def test_close_while_a_command_runs(make_sandbox, marker):
    sandbox = await make_sandbox()
    task = asyncio.ensure_future(sandbox.run(["python3", "-c", "import time; time.sleep(60)",
                                              marker]))
    await asyncio.sleep(0.5)
    await sandbox.aclose()
    with pytest.raises(SandboxError):
        await asyncio.wait_for(task, 15)


async def test_cancelled_run_kills_the_command(sandbox, marker):
    from tests.sandbox.conftest import wait_no_marked_processes

    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(sandbox.run(["python3", "-c", "import time; time.sleep(60)",
                                            marker]), 0.5)
    assert not wait_no_marked_processes(marker)
    assert (await sandbox.run(["echo", "still usable"])).ok
