"""LocalServers: replacing a dead server, and the leash that ends servers with their launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request

import pytest

from sao_gym.inference.launch import LaunchError, LocalServers, sao_serve_command, shared_threads
from tests.processes import alive, command_line, descendants, wait_until


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


LAUNCHER = """
import subprocess, sys
p = subprocess.Popen([sys.executable, "-m", "sao_gym.inference.leash", "--poll-s", "0.1",
                      "--", "sleep", "1000"], start_new_session=True)
print(p.pid, flush=True)
p.wait()
"""


def test_the_leash_ends_the_command_when_its_launcher_is_killed():
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE,
                                text=True)
    leash = int(launcher.stdout.readline())
    assert wait_until(lambda: any(command_line(p).startswith(b"sleep")
                                  for p in descendants(leash) - {leash}))
    (sleeper,) = descendants(leash) - {leash}
    os.kill(launcher.pid, signal.SIGKILL)  # no chance to clean up
    launcher.wait()
    assert wait_until(lambda: not alive(sleeper) and not alive(leash), 10)


STUBBORN = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7) if sys.argv[1] == 'polite'"
            " else None)\n"
            "print('up', flush=True)\ntime.sleep(100)")


@pytest.mark.parametrize("how", ["group", "leash"])
def test_a_signalled_leash_ends_with_its_command(how):
    """SIGTERM to the group reaches the command once (it exits 7); SIGTERM to the leash alone
    gives a command that ignores it --grace-s, then SIGKILL."""
    mode = "polite" if how == "group" else "stubborn"
    leash = subprocess.Popen([sys.executable, "-m", "sao_gym.inference.leash", "--poll-s", "0.1",
                              "--grace-s", "1", "--", sys.executable, "-c", STUBBORN, mode],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert leash.stdout.readline().strip() == "up"
    if how == "group":
        os.killpg(leash.pid, signal.SIGTERM)
        assert leash.wait(10) == 7
    else:
        leash.send_signal(signal.SIGTERM)
        assert leash.wait(10) == 128 + signal.SIGKILL


def test_the_leash_needs_a_command():
    done = subprocess.run([sys.executable, "-m", "sao_gym.inference.leash", "--"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "no command" in done.stderr


@pytest.mark.slow
def test_replace_starts_a_dead_server_again_until_max_restarts(tiny_model_path, tmp_path):
    servers = LocalServers(tiny_model_path, 2, kind="sao", log_dir=tmp_path, max_model_len=256,
                           max_restarts=1, startup_timeout_s=120)
    try:
        first, other = servers.start()
        servers.kill(0)
        assert not answers(first)
        new = servers.replace(first)
        assert new != first and answers(new) and answers(other)
        assert servers.urls == [new, other] and servers.restarts == [1, 0]
        assert "--- restart 1 ---" in (tmp_path / "server-0.log").read_text()
        with pytest.raises(LaunchError, match="replaced 1 times already"):
            servers.replace(new)
        with pytest.raises(ValueError, match="not one of these servers"):
            servers.replace(first)
        leash = servers.procs[0].pid
    finally:
        servers.stop()
    assert not answers(new) and not answers(other) and not alive(leash)
    with pytest.raises(LaunchError, match="stopped"):
        servers.replace(other)


def test_servers_share_the_cores_with_their_launcher():
    assert [shared_threads(n, cores) for n, cores in
            [(1, 2), (2, 2), (1, 16), (3, 16), (5, 16), (1, 1)]] == [1, 1, 8, 4, 2, 1]
    assert shared_threads(1) == max(1, (os.cpu_count() or 1) // 2)
    cmd = sao_serve_command("py", "m", 9, max_model_len=64, threads=3)
    assert cmd[cmd.index("--threads") + 1] == "3"
    assert "--threads" not in sao_serve_command("py", "m", 9, max_model_len=64)
    assert LocalServers("m", 3, kind="sao", log_dir=".", max_model_len=64).threads == \
        shared_threads(3)
    assert LocalServers("m", 3, kind="sao", log_dir=".", max_model_len=64, threads=5).threads == 5


def test_serve_rejects_a_bad_thread_count():
    done = subprocess.run([sys.executable, "-m", "sao_gym.cli", "serve", "tiny", "--threads", "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--threads must be >= 1, got 0" in done.stderr


def test_server_actors_take_rays_thread_rule():
    from sao_gym.runtime.place.ray.servers import RayServers

    threads = [RayServers("m", 1, log_dir=".", **cpus).server_kwargs["threads"]
               for cpus in ({}, {"num_cpus": 2.5}, {"num_cpus": 4, "threads": 2})]
    assert threads == [1, 2, 2]
