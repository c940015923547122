"""`sao-gym train` with the learner on 2 FSDP ranks: a killed rank, then a resume on one."""

import os
import signal
import subprocess
import time

import pytest

from sao_gym.logging import read_metrics
from sao_gym.runtime.loop.checkpoint import CheckpointManager
from tests.runtime.test_job import SMALL, _train_cmd, _wait_for_steps


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of ``pid``'s child processes."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()
            cmd = open(f"/proc/{entry}/cmdline").read().replace("\0", " ")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append((int(entry), cmd))
    return out


@pytest.mark.slow
def test_a_killed_rank_ends_the_run_naming_it_and_a_resume_on_one_rank_trains_each_step_once(
        tmp_path):
    run = tmp_path / "run"
    fsdp = ["--set", "learner.engine=fsdp", "--set", "learner.ranks=2"]
    proc = subprocess.Popen(_train_cmd(*SMALL, *fsdp, "--set", "total_steps=40", "--set",
                                       "checkpoint.every=2", "--out", str(run)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_steps(run, 3, proc)
        ranks = [p for p, cmd in _children(proc.pid) if "spawn_main" in cmd]
        assert len(ranks) == 1  # rank 1; rank 0 is the trainer's own process
        os.kill(ranks[0], signal.SIGKILL)
        killed = time.monotonic()
        _, err = proc.communicate(timeout=90)
        took = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1 and took < 60, (took, err[-2000:])
    assert "learner rank 1" in err and f"--resume {run}" in err, err[-2000:]
    assert "Traceback" not in err
    done_before = len(read_metrics(run))
    latest = CheckpointManager(run).latest()
    shards = sorted(p.name for p in (latest / "learner").glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]  # each rank wrote its own part
    # the sharded run's checkpoint resumes on one device
    done = subprocess.run(_train_cmd("--resume", str(run), "--set", "learner.engine=local",
                                     "--set", "learner.ranks=1", "--set", "total_steps=8"),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert done_before >= 3
