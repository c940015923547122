"""A `sao-gym train` killed with SIGKILL while it writes rollouts: the viewer and the ATIF
exporter still read every rollout it had indexed, and a resumed run writes on."""

import json
import signal
import subprocess
import sys
import time

import pytest

from sao_gym.adapters.atif import export_run
from sao_gym.logging import read_metrics
from sao_gym.rollout_store import RolloutReader
from tests.viewer.helpers import ROOT, TINY_RUN, Viewer

pytestmark = pytest.mark.slow

SETTINGS = [*TINY_RUN, "--set", "total_steps=200", "--set", "rollout.batch_size=4",
            "--set", "rollout.concurrency=8", "--set", "eval.episodes=0",
            "--set", "checkpoint.every=2", "--set", "logging.rollouts_per_step=4",
            "--set", "logging.rollouts_segment_mb=0.05"]


def test_a_run_killed_mid_write_stays_readable(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "sao_gym.cli", "train", *SETTINGS, "--out",
                             str(run)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    try:
        while True:  # a few steps in, then kill it whatever it is doing
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            # a step's metrics are logged before its rollouts are written: 6 logged steps
            # mean 5 steps of rollouts written
            if (run / "metrics.jsonl").exists() and len(read_metrics(run)) >= 6:
                break
            assert time.monotonic() < deadline, "no 6 steps within 300 s"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    reader = RolloutReader(run)
    entries = reader.episodes("train")
    assert len(entries) >= 5 * 4
    assert len(list((run / "rollouts" / "train").glob("*.jsonl"))) >= 4  # rotated segments
    assert all(reader.record("train", e["id"]) is not None for e in entries)
    counts = export_run(run, tmp_path / "atif")
    assert counts == {"train": len(entries)}
    with Viewer(run) as v:
        page = v.json("/api/runs/0/splits/train/episodes?size=500")
        assert page["total"] == len(entries)
        for e in page["episodes"]:
            status, _, body = v.get(f"/api/runs/0/splits/train/episodes/{e['id']}")
            assert status == 200 and json.loads(body)["id"] == e["id"]
    # resumed, the run writes on after what it had, in a new segment
    resumed = subprocess.run([sys.executable, "-m", "sao_gym.cli", "train", "--resume", str(run),
                              "--set", "total_steps=12"], cwd=ROOT, capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = RolloutReader(run).episodes("train")
    assert [e["id"] for e in after] == list(range(len(after))) and len(after) > len(entries)
