"""DockerSandbox specifics: container configuration, init, reaping, image build.

The backend-independent contract and hostile cases live in tests/sandbox/.
Everything that needs a daemon skips without one (as root, `make test`
starts one and builds the image).
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import time

import pytest

from sao_gym.cli import main
from sao_gym.sandbox import image as image_mod
from sao_gym.sandbox.base import Limits, SandboxError, SandboxUnavailable
from sao_gym.sandbox.docker import _LIVE, LABEL, DockerSandbox
from sao_gym.sandbox.image import DEFAULT_IMAGE, build_image

docker = pytest.importorskip("docker")
BOGUS_HOST = "unix:///nonexistent/sao-gym-no-docker.sock"


@pytest.fixture(scope="module")
def docker_ready():
    if not asyncio.run(DockerSandbox.available()):
        pytest.skip("no Docker daemon with the sao-gym-sandbox image "
                    "(as root, `make test` starts one and builds it)")
    yield docker.from_env()
    client = docker.from_env()
    ours = [c for c in client.api.containers(all=True, filters={"label": f"{LABEL}=1"})
            if c["Labels"].get(f"{LABEL}.owner") == f"{socket.gethostname()}:{os.getpid()}"]
    assert not ours, f"sandbox containers left behind: {[c['Names'] for c in ours]}"


@pytest.fixture
async def sb(docker_ready):
    async with DockerSandbox() as sandbox:
        yield sandbox


def _inspect(client, sandbox: DockerSandbox) -> dict:
    return client.api.inspect_container(sandbox.container_id)


# ----- without a daemon -----
async def test_available_is_false_without_a_daemon(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", BOGUS_HOST)
    assert await DockerSandbox.available() is False


async def test_start_without_a_daemon_is_unavailable(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", BOGUS_HOST)
    sandbox = DockerSandbox()
    with pytest.raises(SandboxUnavailable, match="Docker daemon"):
        await sandbox.start()
    await sandbox.aclose()


def test_build_image_without_a_daemon_says_how_to_start_one(monkeypatch, capsys):
    monkeypatch.setenv("DOCKER_HOST", BOGUS_HOST)
    with pytest.raises(SandboxUnavailable, match="dockerd --bridge=none"):
        build_image("sao-gym-test:never")
    assert main(["sandbox", "build-image", "--tag", "sao-gym-test:never"]) == 1
    assert "FAIL: cannot reach the Docker daemon" in capsys.readouterr().err


def test_build_image_checks_package_names():
    with pytest.raises(ValueError, match="package names"):
        build_image("sao-gym-test:never", extra_packages=["ok-pkg", "bad,name"])


def test_workdir_must_be_a_private_directory():
    with pytest.raises(ValueError):
        DockerSandbox(workdir="/")
    with pytest.raises(ValueError):
        DockerSandbox(workdir="relative")


# ----- image -----
def test_build_image_is_idempotent(docker_ready, capsys):
    t0 = time.monotonic()
    assert build_image() == docker_ready.images.get(DEFAULT_IMAGE).id
    assert main(["sandbox", "build-image"]) == 0
    assert time.monotonic() - t0 < 10  # no debootstrap: the image exists
    assert DEFAULT_IMAGE in capsys.readouterr().out


def test_build_image_names_the_missing_debootstrap(docker_ready, monkeypatch):
    monkeypatch.setattr(image_mod.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailable, match="apt-get install debootstrap"):
        build_image("sao-gym-test:missing-tag")


def test_image_has_the_tools_and_the_user(docker_ready):
    out = docker_ready.containers.run(
        DEFAULT_IMAGE, ["sh", "-c", "id -u; stat -c %u /work; python3 -c 'import pytest'; "
                        "git --version; ls /var/lib/apt/lists | wc -l"],
        network_mode="none", remove=True).decode()
    uid, owner, git, lists = out.split("\n")[:4]
    assert (uid, owner, lists) == ("65534", "65534", "1") and git.startswith("git version")


async def test_missing_image_is_unavailable_and_leaves_nothing(docker_ready):
    assert await DockerSandbox.available(image="sao-gym-missing:0") is False
    sandbox = DockerSandbox(image="sao-gym-missing:0")
    with pytest.raises(SandboxUnavailable, match="build-image"):
        await sandbox.start()
    assert sandbox.container_id is None


# ----- the container -----
async def test_container_config_applies_limits(docker_ready):
    limits = Limits(memory_mb=300, pids=50, cpus=0.5, disk_mb=64, open_files=100,
                    file_size_mb=8, cpu_seconds=7)
    async with DockerSandbox(limits=limits) as sandbox:
        info = _inspect(docker_ready, sandbox)
        hc, cfg = info["HostConfig"], info["Config"]
        assert hc["NetworkMode"] == "none"
        assert hc["Memory"] == hc["MemorySwap"] == 300 << 20
        assert hc["PidsLimit"] == 50 and hc["NanoCpus"] == 500_000_000
        assert hc["ReadonlyRootfs"] is True and hc["CapDrop"] == ["ALL"]
        assert hc["SecurityOpt"] == ["no-new-privileges"] and hc["Privileged"] is False
        assert "size=64m" in hc["Tmpfs"]["/work"] and "/tmp" in hc["Tmpfs"]
        ulimits = {u["Name"]: u["Soft"] for u in hc["Ulimits"]}
        assert ulimits == {"nofile": 100, "fsize": 8 << 20, "cpu": 7, "core": 0}
        assert cfg["User"] == "65534:65534" and cfg["Labels"][LABEL] == "1"
        assert cfg["Labels"][f"{LABEL}.id"] == sandbox.id
        assert cfg["Labels"][f"{LABEL}.owner"] == f"{socket.gethostname()}:{os.getpid()}"
        r = await sandbox.run("ulimit -n; ulimit -f; cat /sys/fs/cgroup/pids/pids.max "
                              "2>/dev/null || cat /sys/fs/cgroup/pids.max; df -m /work | tail -1")
        nofile, fsize, pids, df = r.stdout.splitlines()
        assert (nofile, fsize, pids) == ("100", str((8 << 20) // 512), "50")
        assert df.split()[1] == "64"


async def test_inside_view(sb):
    r = await sb.run("id -u; ls /sys/class/net; grep CapEff /proc/self/status; "
                     "touch /etc/x 2>&1; touch /usr/x 2>&1; echo $HOME; pwd")
    lines = r.stdout.splitlines()
    assert lines[0] == "65534" and lines[1] == "lo" and lines[2].endswith("0000000000000000")
    assert "Read-only file system" in lines[3] and "Read-only file system" in lines[4]
    assert lines[5:] == ["/work", "/work"]


async def test_init_survives_signals_from_inside(sb):
    r = await sb.run("kill -9 1; kill -TERM 1; kill -INT 1; kill -HUP 1; kill -STOP 1; "
                     "kill -9 -1")
    assert r.exit_code == 137  # kill -9 -1 also killed the command's own shell
    assert (await sb.run("echo alive")).stdout == "alive\n"


async def test_daemon_that_kills_its_wrapper_is_still_reaped(sb):
    r = await sb.run("sleep 300 & kill -9 $PPID", timeout_s=20)
    assert r.duration_s < 5 and not r.timed_out
    assert "sleep" not in (await sb.run("ps -eo comm")).stdout


async def test_fork_bomb_at_the_pids_limit_is_killed(docker_ready):
    async with DockerSandbox(limits=Limits(pids=32)) as sandbox:
        bomb = ("import os, time\nwhile True:\n  try: os.fork()\n"
                "  except OSError: time.sleep(0.01)")
        r = await sandbox.run(["python3", "-c", bomb], timeout_s=3)
        assert r.timed_out  # no process could start; PID 1 killed them all on a signal
        ps = await sandbox.run("ps -e --no-headers | wc -l")
        assert ps.stdout.strip() == "5"  # init, wrapper, sh, ps, wc


async def test_cancelled_command_is_killed(sb):
    task = asyncio.create_task(sb.run("sleep 300"))
    await asyncio.sleep(1.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert "sleep" not in (await sb.run("ps -eo comm")).stdout


async def test_commands_of_one_sandbox_are_serialized(sb):
    slow, fast = await asyncio.gather(sb.run("sleep 0.5; echo slow"), sb.run("echo fast"))
    assert (slow.stdout, fast.stdout) == ("slow\n", "fast\n")


async def test_oom_is_reported_and_only_once(docker_ready):
    async with DockerSandbox(limits=Limits(memory_mb=128)) as sandbox:
        hog = await sandbox.run(["python3", "-c", "a = []\nwhile True: a.append(b'x' * 2**20)"],
                                timeout_s=30)
        assert hog.oom_killed and hog.exit_code == 137 and not hog.timed_out
        plain = await sandbox.run("kill -9 $$")
        assert plain.exit_code == 137 and not plain.oom_killed


async def test_file_limits(docker_ready):
    async with DockerSandbox(limits=Limits(file_size_mb=1, disk_mb=4)) as sandbox:
        with pytest.raises(OSError) as big:
            await sandbox.write_file("big", b"x" * (2 << 20))
        assert big.value.errno == errno.EFBIG
        for i in range(4):
            await sandbox.write_file(f"f{i}", b"x" * (1 << 20) if i < 3 else b"")
        with pytest.raises(OSError) as full:
            await sandbox.write_file("g", b"x" * (1 << 20))
        assert full.value.errno == errno.ENOSPC


async def test_file_transfer_never_follows_symlinks(sb, tmp_path):
    (tmp_path / "secret").write_text("host secret")
    (tmp_path / "link").symlink_to(tmp_path / "secret")
    await sb.upload(str(tmp_path), "up")
    r = await sb.run("cat up/link; readlink up/link; cat up/secret")
    assert r.stdout.endswith("host secret") and "No such file" in r.stderr
    await sb.run("ln -s /etc/hostname h; mkdir d; ln -s /tmp d/t; mkfifo p")
    for path in ("h", "d/t/x"):
        with pytest.raises(OSError, match="symlink"):
            await sb.read_file(path)
        with pytest.raises(OSError, match="symlink"):
            await sb.write_file(path, "x")
    with pytest.raises(OSError, match="symlink"):
        await sb.upload(str(tmp_path), "d/t")
    with pytest.raises(FileNotFoundError):
        await sb.read_file("missing/x")
    with pytest.raises(NotADirectoryError):
        await sb.read_file("up/secret/x")
    with pytest.raises(IsADirectoryError):
        await sb.read_file("up")
    with pytest.raises(OSError, match="regular"):
        await sb.read_file("p")
    with pytest.raises(OSError, match="regular"):
        await sb.write_file("p", "x")
    assert (await sb.run("ls /tmp; cat /etc/hostname")).stdout == "sandbox\n"


# ----- lifecycle and leftovers -----
async def test_aclose_removes_the_container_and_is_idempotent(docker_ready):
    sandbox = DockerSandbox()
    await sandbox.start()
    await sandbox.start()
    cid = sandbox.container_id
    assert cid in await DockerSandbox.leftovers()
    await sandbox.aclose()
    await sandbox.aclose()
    assert cid not in await DockerSandbox.leftovers() and cid not in _LIVE
    with pytest.raises(SandboxError):
        await sandbox.run("true")


async def test_cancelled_start_leaves_no_container(docker_ready):
    sandbox = DockerSandbox()
    task = asyncio.create_task(sandbox.start())
    await asyncio.sleep(0.05)  # the container is being made on a thread
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await sandbox.aclose()
    await asyncio.sleep(2.0)  # long enough for a start that went on unseen to finish
    assert docker_ready.api.containers(
        all=True, filters={"label": f"{LABEL}.id={sandbox.id}"}) == []


async def test_dead_container_is_a_crash(docker_ready):
    from sao_gym.sandbox.base import SandboxCrashed

    async with DockerSandbox() as sandbox:
        docker_ready.api.kill(sandbox.container_id)
        with pytest.raises(SandboxCrashed):
            await sandbox.run("true")


async def test_reap_removes_orphans_only(docker_ready):
    live, leaked = DockerSandbox(), DockerSandbox()
    await asyncio.gather(live.start(), leaked.start())
    try:
        _LIVE.pop(leaked.container_id)  # as if its owner forgot it
        assert await DockerSandbox.reap() >= 1
        left = await DockerSandbox.leftovers()
        assert live.container_id in left and leaked.container_id not in left
    finally:
        await asyncio.gather(live.aclose(), leaked.aclose())
