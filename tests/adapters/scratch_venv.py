"""Scratch venvs for adapter tests whose package pins or Python differ from the test venv.

:func:`scratch_venv` makes (once) and returns a cached venv under
``${XDG_CACHE_HOME:-~/.cache}/sao-gym/venvs/NAME-HASH`` with ``packages``
installed, the hash covering the Python, the package list and (with ``install_self``)
this repository's pyproject.toml, so a changed spec builds a fresh one. A lock file
serialises builders; a half-built venv (no ``.ready`` marker) is rebuilt. The build runs
pip with a time limit and raises :class:`ScratchVenvError` with the tail of pip's log when
it fails.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sao-gym" / "venvs"


class ScratchVenvError(RuntimeError):
    """The scratch venv could not be built."""


def find_python(minimum: tuple[int, int]) -> str | None:
    """A Python interpreter of at least ``minimum`` on PATH or in pyenv, or None."""
    if sys.version_info[:2] >= minimum:
        return sys.executable
    candidates = [shutil.which(f"python3.{m}") for m in range(minimum[1], 16)]
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    if pyenv.is_dir():
        candidates += [str(p / "bin" / "python") for p in sorted(pyenv.iterdir(), reverse=True)]
    for exe in candidates:
        if not exe or not Path(exe).exists():
            continue
        try:
            out = subprocess.run([exe, "-c", "import sys; print(*sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=30, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        if tuple(int(x) for x in out.split()) >= minimum:
            return exe
    return None


def scratch_venv(name: str, packages: Sequence[str], *, python: str | None = None,
                 install_self: bool = False, timeout_s: float = 900) -> Path:
    """The ``bin/python`` of a cached venv with ``packages`` (see module docs).

    ``install_self`` also installs this repository (``pip install -e ROOT``, no deps).
    """
    python = python or sys.executable
    version = subprocess.run([python, "-c", "import sys; print(sys.version)"], capture_output=True,
                             text=True, check=True).stdout.strip()
    own = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest() if install_self else ""
    spec = "\n".join([version, *packages, f"self={install_self} {own}"])
    venv = CACHE / f"{name}-{hashlib.sha256(spec.encode()).hexdigest()[:12]}"
    exe = venv / "bin" / "python"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / ".ready").exists() and exe.exists():
            return exe
        shutil.rmtree(venv, ignore_errors=True)
        log = venv.with_suffix(".log")
        steps = [[python, "-m", "venv", str(venv)],
                 [str(exe), "-m", "pip", "install", "-q", "--upgrade", "pip"],
                 [str(exe), "-m", "pip", "install", "-q", *packages]]
        if install_self:
            steps.append([str(exe), "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)])
        with open(log, "w") as out:
            for cmd in steps:
                try:
                    subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=True,
                                   timeout=timeout_s)
                except (subprocess.SubprocessError, OSError) as e:
                    out.flush()
                    tail = log.read_text(errors="replace")[-3000:]
                    raise ScratchVenvError(f"building {venv} failed at {cmd[2:5]}: {e}\n"
                                           f"{tail}") from None
        (venv / ".ready").write_text(spec)
        return exe
