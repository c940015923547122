"""``runtime: ray`` for real: a 2-node ``ray.cluster_utils.Cluster`` on this machine.

Two rollout workers and the learner as actors train the tiny model; a worker
and the learner are SIGKILLed mid-run. All of Ray's traffic stays on
127.0.0.0/8 (checked with ``ss -tnp`` while training).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sao_gym.logging import read_metrics
from sao_gym.runtime.config.build import build_trainer
from sao_gym.runtime.config.loader import load_config
from tests.processes import alive, command_line, descendants, server_processes, wait_until

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow

SMALL = ["env=sao_gym/Arithmetic-v0", "rollout.batch_size=4", "rollout.max_new_tokens=8",
         "rollout.max_context_tokens=512", "rollout.max_episode_steps=1",
         "rollout.max_staleness=1", "learner.critic_warmup_steps=0", "warm_start=null",
         "eval.episodes=0", "checkpoint.every=0", "inference.max_batch_size=8",
         "runtime=ray", "ray.rollout_workers=2", "ray.episodes_per_worker=3"]


@pytest.fixture(scope="module")
def cluster():
    from sao_gym.runtime.place.ray.cluster import connect, local_cluster

    c = local_cluster(2, num_cpus=2, object_store_memory_mb=150)
    connect(c.address)
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    """The demo's tiny model (0.5M parameters): the tests check mechanics, not learning."""
    from sao_gym.models import tiny_model
    from sao_gym.runtime.config.loader import load_recipe

    return tiny_model(str(tmp_path_factory.mktemp("ray_model")),
                      **load_recipe("demo").model_options)


def config(cluster, *extra):
    return load_config(None, [*SMALL, f"ray.address={cluster.address}", *extra])


class OnStep:
    """A metric sink that runs ``action(step)`` after each logged step."""

    def __init__(self, action):
        self.action, self.steps = action, []

    def log(self, step, metrics):
        self.steps.append(step)
        self.action(step)

    def close(self):
        pass


def ray_connections() -> list[tuple[str, str]]:
    """``(local, peer)`` of every TCP connection of this process tree, from ``ss -tnp``."""
    mine, found = descendants(), []
    for line in subprocess.run(["ss", "-tnpH"], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        fields = line.split()
        pids = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if pids & mine:
            found.append((fields[3], fields[4]))
    return found


def loopback(address: str) -> bool:
    """Whether ``host:port`` from ss (IPv4, ``[v6]`` or ``[::ffff:v4]``) is a loopback host."""
    ip = ipaddress.ip_address(address.rsplit(":", 1)[0].strip("[]"))
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def record_batches(trainer) -> list[list[int]]:
    """Wrap the trainer's source so every batch handed out is recorded (its seeds)."""
    batches, next_batch = [], trainer.source.next_batch

    async def recording():
        batch = await next_batch()
        batches.append([r.group_id for r in batch])
        return batch

    trainer.source.next_batch = recording
    return batches


def test_two_workers_and_a_learner_train_20_steps_on_two_nodes(cluster, model,
                                                                tmp_path):
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    seen: list[tuple[str, str]] = []
    probe = OnStep(lambda step: seen.extend(ray_connections()) if step in (5, 15) else None)
    cfg = config(cluster, "total_steps=20")
    trainer = build_trainer(cfg, tmp_path / "run", policy_path=model, sinks=[probe])
    trainer.run()
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(1, 21))
    assert all(r["async/staleness_max"] <= cfg.max_staleness for r in rows)
    assert max(r["async/staleness_max"] for r in rows) == 1  # asynchronous, at the bound
    stats = trainer.backend.stats()
    assert [s["restarts"] for s in stats] == [0, 0]
    assert trainer.learner.threads == 1  # floor(ray.learner_num_cpus=0), at least 1
    for s in stats:  # each worker sampled with many versions: the weights reached it
        assert s["episodes"] > 10 and len(s["versions"]) >= 5 and max(s["versions"]) >= 15, s
    # every connection of the cluster, driver and workers is on the loopback range
    assert len(seen) > 10
    assert all(loopback(a) and loopback(b) for a, b in seen), seen


def test_a_killed_rollout_worker_is_restarted_and_nothing_counts_twice(cluster, model,
                                                                       tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="sao_gym.runtime.place.ray.pool")
    run = tmp_path / "run"
    killed: dict[str, int] = {}

    def kill_then_stop(step):
        worker = trainer.backend.stats()[0]
        if step == 3:
            os.kill(worker["pid"], signal.SIGKILL)
            killed.update(pid=worker["pid"], episodes=worker["episodes"])
        elif killed and worker["alive"] and worker["episodes"] >= killed["episodes"] + 4:
            trainer.request_stop()  # the replacement has played: end the run here

    trainer = build_trainer(config(cluster, "total_steps=80"), run, policy_path=model,
                            sinks=[OnStep(kill_then_stop)])
    batches = record_batches(trainer)
    trainer.run()
    rows = read_metrics(run)
    steps = len(rows)
    assert 4 < steps < 80 and [r["step"] for r in rows] == list(range(1, steps + 1))
    seeds = [s for b in batches for s in b]
    assert len(seeds) == steps * 4 and len(set(seeds)) == len(seeds)  # no episode twice
    assert all(r["async/staleness_max"] <= 1 for r in rows)
    stats = trainer.backend.stats()
    assert stats[0]["restarts"] == 1 and stats[0]["pid"] != killed["pid"]
    assert f"rollout worker 0 (pid {killed['pid']}) died" in caplog.text
    assert f"rollout worker 0 restarted: pid {killed['pid']} -> {stats[0]['pid']}" in caplog.text


def test_workers_with_their_own_servers_replace_a_killed_server(cluster, model, tmp_path):
    """inference.launch on Ray: each worker starts its share of `sao-gym serve` servers (on
    a leash); one server SIGKILLed mid-run is started again by its worker's backend, loads
    the newest weights and serves on, with no episode failing; a killed worker's server
    does not outlive it."""
    run = tmp_path / "run"
    state: dict[str, object] = {}

    def kill_then_stop(step):
        worker = trainer.backend.stats()[0]
        if step == 3:
            (server,) = server_processes(worker["pid"])
            os.kill(server, signal.SIGKILL)
            state.update(server=server, episodes=worker["episodes"], step=step)
        elif state and worker["episodes"] >= state["episodes"] + 6 and step >= 8:
            state["servers"] = server_processes(worker["pid"])
            other = trainer.backend.stats()[1]["pid"]
            (state["orphan"],) = server_processes(other)
            os.kill(other, signal.SIGKILL)  # its server must not outlive it
            trainer.request_stop()

    cfg = config(cluster, "total_steps=60", "inference.backend=vllm_server",
                 "inference.launch=2", "inference.server=sao", "inference.max_model_len=512")
    trainer = build_trainer(cfg, run, policy_path=model, sinks=[OnStep(kill_then_stop)])
    trainer.run()
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) < 60
    assert rows[-1]["rollout/infra_failures"] == 0  # the episodes waited, none failed
    assert all(r["async/staleness_max"] <= cfg.max_staleness for r in rows)
    (new_server,) = state["servers"]
    assert new_server != state["server"]
    log = (run / "workers" / "worker0" / "servers" / "server-0.log").read_text()
    assert "--- restart 1 ---" in log
    assert "--- restart" not in (run / "workers" / "worker1" / "servers" /
                                 "server-0.log").read_text()
    stats = trainer.backend.stats()
    # worker 0 sampled with weights published after the restart: the new server took them
    assert max(stats[0]["versions"]) > state["step"] + 1
    assert stats[0]["restarts"] == 0  # the server was replaced inside its worker
    assert wait_until(lambda: not alive(state["orphan"]))  # on its leash
    assert wait_until(lambda: not alive(new_server))  # stopped with the run


def test_server_actors_come_back_after_their_process_or_their_actor_dies(cluster, model,
                                                                       tmp_path):
    """ray.server_actors: each worker owns its server as an actor (on the node's address);
    a killed server process is started again inside its actor, a killed actor is replaced
    by a new one (its server goes with it, on its leash); no episode fails."""
    run = tmp_path / "run"
    me = os.getpid()
    state: dict[str, object] = {}

    def actors() -> list[int]:
        return sorted(ray_processes(me, "ray::ServerActor"))

    def chaos(step):
        if step == 3:
            state["actors"] = actors()
            assert len(state["actors"]) == 2
            (server,) = server_processes(state["actors"][0])
            os.kill(server, signal.SIGKILL)
            state["server"] = server
        elif step == 7:
            victim = state["actors"][1]
            (state["victim_server"],) = server_processes(victim)
            os.kill(victim, signal.SIGKILL)
            state["victim"] = victim
        elif "victim" in state and step >= 12 and len(actors()) == 2 and \
                len(server_processes()) == 2 and state["victim"] not in actors():
            state["end"] = (actors(), server_processes())
            trainer.request_stop()

    cfg = config(cluster, "total_steps=80", "inference.backend=vllm_server",
                 "inference.launch=2", "inference.server=sao", "inference.max_model_len=512",
                 "ray.server_actors=true")
    trainer = build_trainer(cfg, run, policy_path=model, sinks=[OnStep(chaos)])
    trainer.run()
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) < 80
    assert rows[-1]["rollout/infra_failures"] == 0
    assert all(r["async/staleness_max"] <= cfg.max_staleness for r in rows)
    end_actors, end_servers = state["end"]
    assert state["actors"][0] in end_actors  # the first actor restarted its server itself
    assert state["server"] not in end_servers and state["victim_server"] not in end_servers
    assert not alive(state["victim_server"])  # ended with its actor
    logs = sorted(run.glob("workers/worker*/servers/actor-0/server-0.log"))
    assert len(logs) == 2 and sum("--- restart 1 ---" in p.read_text() for p in logs) == 1
    assert [s["restarts"] for s in trainer.backend.stats()] == [0, 0]  # workers lived on
    assert wait_until(lambda: not any(alive(p) for p in end_servers))  # stopped with the run


def test_an_example_yaml_trains_locally_and_on_ray_with_only_runtime_changed(cluster, model,
                                                                           tmp_path):
    """examples/configs/grpo_arithmetic.yaml (GRPO: groups of 4, a recomputed old policy),
    shortened the same way for both runs."""
    path = Path(__file__).parents[3] / "examples" / "configs" / "grpo_arithmetic.yaml"
    short = ["total_steps=3", "rollout.batch_size=8", "rollout.concurrency=8",
             "rollout.max_new_tokens=8", "warm_start=null", "eval.episodes=0",
             "checkpoint.every=0"]
    keys = {}
    for runtime in ("local", "ray"):
        cfg = load_config(path, [*short, f"runtime={runtime}", f"ray.address={cluster.address}"])
        build_trainer(cfg, tmp_path / runtime, policy_path=model).run()
        rows = read_metrics(tmp_path / runtime)
        assert [r["step"] for r in rows] == [1, 2, 3], runtime
        assert all(r["async/staleness_max"] <= 1 for r in rows)
        keys[runtime] = set(rows[-1])
    # the same algorithm, the same diagnostics, and the learner actor's memory on Ray
    assert keys["local"] < keys["ray"]
    assert keys["ray"] - keys["local"] == {"perf/learner_rss_mb"}


def ray_processes(root: int, title: str) -> list[int]:
    """Pids under ``root`` whose command line (Ray's process title) starts with ``title``."""
    return [pid for pid in descendants(root)
            if command_line(pid).replace(b"\0", b" ").decode().startswith(title)]


def wait_for_steps(run, n, proc, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"training exited early: {proc.stderr.read()[-3000:]}")
        if (run / "metrics.jsonl").exists() and len(read_metrics(run)) >= n:
            return
        time.sleep(0.2)
    raise AssertionError(f"no {n} steps within {timeout} s")


def _learner_pids(proc, n, old=(), timeout=300):
    """The ``n`` learner actor pids under ``proc`` that are not in ``old``, once all are up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"training exited early: {proc.stderr.read()[-3000:]}")
        pids = [p for p in ray_processes(proc.pid, "ray::LearnerService") if p not in old]
        if len(pids) == n:
            return pids
        time.sleep(0.2)
    raise AssertionError(f"no {n} new learner actors within {timeout} s")


def test_cli_on_local_ray_a_killed_learner_rank_restarts_the_group_then_resume(model,
                                                                               tmp_path):
    """`sao-gym train --set runtime=ray` without ray.address starts its own Ray, with the
    learner as 2 FSDP actors. A rank SIGKILLed mid-run: the run rebuilds itself from its
    last checkpoint and goes on. Killed again with no restart left: the run ends naming
    the rank; `--resume` (on one rank) completes it, every step logged once."""
    run = tmp_path / "run"
    args = [f"--set={s}" for s in SMALL] + [
        "--set=total_steps=10", "--set=checkpoint.every=2", f"--set=model={model}",
        "--set=ray.num_cpus=4", "--set=learner.engine=fsdp", "--set=learner.ranks=2",
        "--set=ray.max_learner_restarts=1", "--out", str(run)]
    cli = [sys.executable, "-m", "sao_gym.cli", "train"]
    proc = subprocess.Popen([*cli, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        first = _learner_pids(proc, 2)
        wait_for_steps(run, 3, proc)
        os.kill(first[1], signal.SIGKILL)
        second = _learner_pids(proc, 2, old=first)  # the group, started again
        wait_for_steps(run, 5, proc)
        os.kill(second[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "restarting from the last checkpoint (0 restart(s) left)" in out + err, err[-3000:]
    assert proc.returncode == 1, err[-3000:]
    assert re.search(r"learner rank \d \(pid \d+\) died", err), err[-3000:]
    assert f"--resume {run}" in err
    steps_before = [r["step"] for r in read_metrics(run)]
    assert steps_before == list(range(1, len(steps_before) + 1))  # each step once so far
    done = subprocess.run([*cli, "--resume", str(run), "--set=learner.engine=local",
                           "--set=learner.ranks=1"], capture_output=True, text=True,
                          timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["step"] for r in read_metrics(run)] == list(range(1, 11))
    assert (run / "checkpoints" / "step_0000010" / "policy").is_dir()


def test_loopback_reads_ss_addresses():
    assert loopback("127.0.0.1:6379") and loopback("[::ffff:127.0.0.1]:41197")
    assert loopback("[::1]:80") and not loopback("192.0.2.2:6379")
    assert not loopback("[::ffff:192.0.2.2]:6379")
