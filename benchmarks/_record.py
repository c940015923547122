"""How a benchmark ran, kept beside its raw numbers (the scripts' ``--json PATH``).

A benchmark's JSON holds its raw measurements (every repeat, not only the
medians), the summary the docs quote, and :func:`provenance`: the command line,
the date, the commit of the ``sao_gym`` that ran, the machine's cores and CPU,
torch's thread count and the load average when the script started and when it
wrote the file (a busy machine shows there). ``benchmarks/report.py`` renders the
docs' tables from such files in docs/data.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOAD_AT_START = os.getloadavg()
"""The load average when the benchmark imported this module (about when it started)."""


def _cpu_model() -> str | None:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or None
    return next((line.split(":", 1)[1].strip() for line in lines
                 if line.startswith("model name")), None)


def _commit() -> str | None:
    """The commit of the ``sao_gym`` this process imported (``PYTHONPATH`` may name another)."""
    pkg = sys.modules.get("sao_gym")
    where = Path(pkg.__file__).parent if pkg and pkg.__file__ else ROOT
    done = subprocess.run(["git", "-C", str(where), "describe", "--always", "--dirty",
                           "--abbrev=12"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or None


def _relative(path: str) -> str:
    try:
        return str(Path(path).relative_to(ROOT))
    except ValueError:
        return path


def provenance() -> dict[str, Any]:
    """The command line, date, commit, machine and thread counts of this process."""
    import torch

    env = {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONPATH")
           if k in os.environ}
    return {
        "command": shlex.join([_relative(sys.executable), *sys.argv]),
        "env": env,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": _commit(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_start": [round(x, 2) for x in LOAD_AT_START],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }


def write_record(path: str | Path, data: dict[str, Any]) -> None:
    """Write ``data`` and this process's :func:`provenance` to ``path`` as JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({**data, "provenance": provenance()}, indent=1) + "\n")
    tmp.replace(path)
    print(f"wrote {path}", flush=True)
