"""Process plumbing shared by the benchmarks that train (vs_trl*.py, own_envs.py and
keychain_curriculum.py).

Each side trains in a worker process of its own (so it has the whole CPU and its
peak RSS is its own): :func:`child_env` is that process's environment (thread
count, offline, ``benchmarks/`` importable), :func:`run_logged` runs it with its
output in a log file; the rest are small I/O helpers.
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def say(text: str) -> None:
    """Print a time-stamped progress line."""
    print(time.strftime("%H:%M:%S ") + text, flush=True)


def read_json(path: Path) -> Any:
    """Load a JSON file."""
    return json.loads(path.read_text())


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON atomically (a temp file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


def peak_rss_mb() -> float:
    """Peak resident size of this process (and of its waited-for children), in MB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return round(max(own, children) / 1024, 1)


def torch_threads() -> int:
    """torch's intra-op thread count in this process."""
    import torch

    return torch.get_num_threads()


def child_env(threads: int | None) -> dict[str, str]:
    """The environment of a training process: thread count, offline, benchmarks/ importable."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONUNBUFFERED": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    if threads is not None:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
    return env


def run_logged(cmd: list[str], log: Path, env: dict[str, str], what: str) -> None:
    """Run ``cmd`` with its output appended to ``log``; fail with a message naming the log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, check=False)
    if done.returncode:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-15:])
        raise SystemExit(f"{what} failed (exit code {done.returncode}); full log: {log}\n"
                         f"--- last lines ---\n{tail}")


def loop_seconds(records: list[dict[str, Any]]) -> float:
    """A run's training-loop wall time from its metric records: ``time/elapsed_s``,
    summed over resumed segments (a resume restarts that clock)."""
    total = last = 0.0
    for row in records:
        if row.get("time/elapsed_s") is None:
            continue
        t = float(row["time/elapsed_s"])
        if t < last:
            total += last
        last = t
    return total + last


KEPT = ("config.yaml", "eval_before.json", "eval_after.json")
"""A finished ``sao-gym train`` run's files that :func:`keep_run` copies as they are."""


def keep_run(run: Path, kept: Path, log: Path, wall_s: float, command: str) -> None:
    """Keep a finished ``sao-gym train`` run's small files in ``kept``: its config, both
    evaluations, the warm start's record, gzipped metrics, the command's output (``log``,
    as ``train.log``) and ``wall.json`` (the wall time and ``command``)."""
    kept.mkdir(parents=True, exist_ok=True)
    for name in KEPT:
        shutil.copy(run / name, kept / name)
    warm = run / "model" / "warm_start" / "warm_start.json"
    if warm.exists():
        shutil.copy(warm, kept / "warm_start.json")
    shutil.copy(log, kept / "train.log")
    with (run / "metrics.jsonl").open("rb") as f, (kept / "metrics.jsonl.gz").open("wb") as raw, \
            gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as g:
        shutil.copyfileobj(f, g)
    (kept / "wall.json").write_text(json.dumps({"wall_s": round(wall_s, 1), "command": command},
                                               indent=1) + "\n")
