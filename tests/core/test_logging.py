"""Metric loggers: JSONL durability and resume repair, TensorBoard, W&B offline, fan-out."""

import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from sao_gym import logging as metric_logging
from sao_gym.logging import (
    FanoutLogger,
    JsonlLogger,
    MetricLogger,
    make_loggers,
    read_metrics,
)


def _strict_json(line: str):
    """json.loads that rejects NaN/Infinity (what any strict JSON reader does)."""
    def reject(name):
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(line, parse_constant=reject)


def _write_lines(path: Path, steps, tail: bytes = b"") -> None:
    body = b"".join(json.dumps({"step": s, "x": float(s)}).encode() + b"\n" for s in steps)
    path.write_bytes(body + tail)


# -- JSONL ---------------------------------------------------------------------------------


def test_jsonl_round_trip(tmp_path):
    with JsonlLogger(tmp_path) as logger:
        assert isinstance(logger, MetricLogger)
        logger.log(1, {"loss/policy": 0.25, "learner/tokens": 12, "learner/policy_updated": True,
                       "sao/clip_ratio": np.float32(0.5), "async/in_flight": np.int64(3)})
        logger.log(2, {"loss/policy": -1.5e-7, "note": "text"})
    assert read_metrics(tmp_path) == [
        {"step": 1, "loss/policy": 0.25, "learner/tokens": 12, "learner/policy_updated": True,
         "sao/clip_ratio": 0.5, "async/in_flight": 3},
        {"step": 2, "loss/policy": -1.5e-7, "note": "text"},
    ]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert list(_strict_json(lines[0]))[0] == "step"


def test_each_line_is_flushed_and_fsynced_before_log_returns(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(metric_logging.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    logger = JsonlLogger(tmp_path)
    for step in range(1, 4):
        logger.log(step, {"x": step / 2})
        # another reader sees the line while the logger is still open
        assert [r["step"] for r in read_metrics(tmp_path)] == list(range(1, step + 1))
    assert len(synced) == 3
    logger.close()


def test_steps_must_strictly_increase(tmp_path):
    with JsonlLogger(tmp_path) as logger:
        logger.log(3, {"x": 1.0})
        with pytest.raises(ValueError, match="strictly increase"):
            logger.log(3, {"x": 1.0})
        with pytest.raises(ValueError, match="carry step"):
            logger.log(4, {"step": 5})
        logger.log(4, {"step": 4, "x": 2.0})  # a matching "step" key is accepted
        with pytest.raises(TypeError, match="'bad'"):
            logger.log(5, {"bad": object()})
    assert read_metrics(tmp_path) == [{"step": 3, "x": 1.0}, {"step": 4, "x": 2.0}]


def test_non_finite_values_are_null_and_counted(tmp_path):
    with JsonlLogger(tmp_path) as logger:
        logger.log(1, {"a": math.nan, "b": math.inf, "c": -math.inf, "d": 1.0})
        assert logger.last_nonfinite == ("a", "b", "c")
        logger.log(2, {"a": np.float64("nan"), "d": 2.0})
        assert logger.last_nonfinite == ("a",)
        logger.log(3, {"a": 0.0})
        assert logger.last_nonfinite == ()
        assert logger.nonfinite_counts == {"a": 2, "b": 1, "c": 1}
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
        _strict_json(line)  # valid JSON, no NaN/Infinity literals
    assert read_metrics(tmp_path)[0] == {"step": 1, "a": None, "b": None, "c": None, "d": 1.0}


def test_resume_keeps_exactly_the_steps_up_to_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _write_lines(path, [1, 2, 3, 4, 5], tail=b'{"step": 6, "x": 6.')  # torn by a kill -9
    with JsonlLogger(tmp_path, resume_step=3) as logger:
        assert logger.last_step == 3
        logger.log(4, {"x": 40.0})
        logger.log(5, {"x": 50.0})
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert [r["x"] for r in records] == [1.0, 2.0, 3.0, 40.0, 50.0]
    assert not (tmp_path / "metrics.jsonl.tmp").exists()


def test_resume_drops_a_torn_line_and_deduplicates(tmp_path):
    path = tmp_path / "metrics.jsonl"
    # a complete JSON object without its newline is still a torn write
    _write_lines(path, [1, 2, 2, 3], tail=b'{"step": 4, "x": 4.0}')
    logger = JsonlLogger(tmp_path, resume_step=10)
    logger.close()
    data = path.read_bytes()
    assert data.endswith(b"\n")
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]


def test_resume_warns_when_steps_are_missing(tmp_path, caplog):
    _write_lines(tmp_path / "metrics.jsonl", [1, 2])
    with caplog.at_level(logging.WARNING, logger="sao_gym.logging"):
        JsonlLogger(tmp_path, resume_step=4).close()
    assert "ends at step 2" in caplog.text


def test_resume_without_changes_leaves_the_file_alone(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _write_lines(path, [1, 2])
    before = path.stat().st_ino
    JsonlLogger(tmp_path, resume_step=2).close()
    assert path.stat().st_ino == before


def test_fresh_logger_refuses_an_existing_run_but_repairs_a_torn_only_file(tmp_path):
    _write_lines(tmp_path / "metrics.jsonl", [1])
    with pytest.raises(FileExistsError, match="resume_step"):
        JsonlLogger(tmp_path)
    JsonlLogger(tmp_path, resume_step=0).close()  # a restart from scratch empties it
    assert read_metrics(tmp_path) == []
    other = tmp_path / "other"
    other.mkdir()
    (other / "metrics.jsonl").write_bytes(b'{"step": 1, "x"')  # killed during the first write
    with JsonlLogger(other) as logger:
        logger.log(1, {"x": 1.0})
    assert read_metrics(other) == [{"step": 1, "x": 1.0}]


def test_read_metrics_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        read_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{oops\n{"step": 3}\n')
    with pytest.raises(ValueError, match=":2:"):
        read_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"x": 1}\n')
    with pytest.raises(ValueError, match="integer 'step'"):
        read_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "x": [')
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1}]


_WRITER = textwrap.dedent("""
    import sys
    from sao_gym.logging import JsonlLogger

    logger = JsonlLogger(sys.argv[1])
    payload = {f"metric/{i}": i * 0.5 for i in range(3000)}  # ~70 kB lines: writes can tear
    step = 0
    while True:
        step += 1
        logger.log(step, {"step_x2": 2.0 * step, **payload})
        print(step, flush=True)
""")


@pytest.mark.timeout(120)
def test_sigkill_mid_run_leaves_a_readable_resumable_file(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if int(line) >= 30:
                break
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    records = read_metrics(tmp_path)
    steps = [r["step"] for r in records]
    assert len(steps) >= 30 and steps == list(range(1, len(steps) + 1))
    assert all(r["step_x2"] == 2.0 * r["step"] for r in records)
    with JsonlLogger(tmp_path, resume_step=20) as logger:
        logger.log(21, {"step_x2": 42.0})
    data = (tmp_path / "metrics.jsonl").read_bytes()
    assert data.endswith(b"\n")
    assert [r["step"] for r in read_metrics(tmp_path)] == list(range(1, 22))


# -- TensorBoard ---------------------------------------------------------------------------


def test_tensorboard_scalars_read_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with make_loggers("tensorboard", tmp_path) as logger:
        for step in (1, 2, 3):
            logger.log(step, {"loss/policy": 0.5 * step, "rollout/success_rate": step / 4,
                              "note": "skipped", "missing": None})
    with make_loggers(["jsonl", "tensorboard"], tmp_path, resume_step=2) as logger:
        logger.log(3, {"loss/policy": 30.0})  # the resumed run redoes step 3
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"loss/policy", "rollout/success_rate"}
    assert [(e.step, e.value) for e in acc.Scalars("loss/policy")] == [
        (1, 0.5), (2, 1.0), (3, 30.0)]
    assert [(e.step, e.value) for e in acc.Scalars("rollout/success_rate")] == [
        (1, 0.25), (2, 0.5)]
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]


# -- W&B offline ---------------------------------------------------------------------------


class _Tripwire:
    """A TCP listener that counts connections: any network attempt lands here."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        self.sock.settimeout(0.2)
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self):
        self._stop = True
        self._thread.join()
        self.sock.close()


_WANDB_SCRIPT = textwrap.dedent("""
    import sys
    from sao_gym.logging import make_loggers

    logger = make_loggers("jsonl,wandb", sys.argv[1], config={"lr": 1e-6})
    for step in (1, 2, 3):
        logger.log(step, {"rollout/return_mean": step * 0.125, "loss/policy": float("nan")})
    logger.close()
    print("wandb run dir:", logger.others[0].run_dir)
""")


@pytest.mark.timeout(180)
def test_wandb_offline_stays_in_run_dir_and_off_the_network(tmp_path):
    pytest.importorskip("wandb")
    run_dir, home, cwd = tmp_path / "run", tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    tripwire = _Tripwire()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("WANDB_") and k.lower() not in ("http_proxy", "https_proxy",
                                                                "all_proxy", "no_proxy")}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"),
               XDG_CACHE_HOME=str(home / ".cache"), WANDB_BASE_URL=tripwire.url,
               HTTP_PROXY=tripwire.url, HTTPS_PROXY=tripwire.url, ALL_PROXY=tripwire.url,
               http_proxy=tripwire.url, https_proxy=tripwire.url)
    try:
        out = subprocess.run([sys.executable, "-c", _WANDB_SCRIPT, str(run_dir)], env=env,
                             cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=150)
    finally:
        tripwire.close()
    assert out.returncode == 0, out.stderr
    assert tripwire.connections == 0
    assert list(home.iterdir()) == [] and list(cwd.iterdir()) == []
    wandb_run = Path(out.stdout.split("wandb run dir:")[1].strip())
    assert wandb_run.parent == (run_dir / "wandb").resolve()
    assert wandb_run.name.startswith("offline-run-")
    data = b"".join(p.read_bytes() for p in wandb_run.glob("*.wandb"))
    assert b"rollout/return_mean" in data and b"0.375" in data
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3]


# -- make_loggers and the fan-out ----------------------------------------------------------


def test_make_loggers_validates_names(tmp_path):
    with pytest.raises(ValueError, match="'tensorbord'.*valid: jsonl, tensorboard, wandb"):
        make_loggers("jsonl,tensorbord", tmp_path)
    assert not (tmp_path / "metrics.jsonl").exists()
    for names in ("jsonl", [], "", ["JSONL", " jsonl "]):
        logger = make_loggers(names, tmp_path / repr(names))
        assert isinstance(logger, FanoutLogger) and logger.others == []
        logger.close()


def test_missing_extra_names_the_pip_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(ImportError, match=r"sao-gym\[wandb\]"):
        make_loggers("wandb", tmp_path)
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(ImportError, match=r"sao-gym\[tensorboard\]"):
        metric_logging.TensorBoardLogger(tmp_path)


class _Broken:
    def __init__(self):
        self.closed = False

    def log(self, step, metrics):
        raise RuntimeError("disk full")

    def close(self):
        self.closed = True


def test_fanout_drops_a_failing_mirror_but_keeps_jsonl(tmp_path, caplog):
    broken = _Broken()
    logger = FanoutLogger(JsonlLogger(tmp_path), [broken])
    with caplog.at_level(logging.ERROR, logger="sao_gym.logging"):
        logger.log(1, {"x": 1.0})
        logger.log(2, {"x": 2.0})
    assert "_Broken failed at step 1" in caplog.text and logger.others == []
    logger.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    with pytest.raises(ValueError, match="closed"):
        logger.jsonl.log(3, {})
