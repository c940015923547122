"""Fixtures shared by the sandbox suites: one factory parametrized over the backends.

``make_sandbox`` yields an async factory ``await make_sandbox(**kwargs)`` that
builds and starts a sandbox of the parametrized backend (``local`` or
``docker``), closes every sandbox it made at teardown, then checks that
nothing is left behind: no process whose command line carries the test's
``marker``, no new ``sao-*`` host temp dir, no new mount in this namespace (a tmpfs
named ``sao-*`` or anything under the temp dir),
no new ``sao-sbx-<this pid>-*`` cgroup (local), none of its containers (docker: the
``container_id`` of each sandbox, looked up with ``DockerSandbox.leftovers()``).

A backend that cannot run here is skipped with the reason, unless it is
listed in ``SAO_SANDBOX_REQUIRE`` (e.g. ``SAO_SANDBOX_REQUIRE=local,docker``
on CI), which turns the skip into a failure.
"""

from __future__ import annotations

import asyncio
import glob
import os
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

BACKENDS = ("local", "docker")


def _unavailable(backend: str, reason: str) -> None:
    required = {b.strip() for b in os.environ.get("SAO_SANDBOX_REQUIRE", "").split(",")}
    if backend in required:
        pytest.fail(f"{backend} sandbox required (SAO_SANDBOX_REQUIRE) but {reason}")
    pytest.skip(reason)


async def backend_class(backend: str) -> type:
    """The sandbox class of ``backend``, or skip the test when it cannot run here."""
    if backend == "local":
        from sao_gym.sandbox.local import LocalSandbox

        if not await LocalSandbox.available():
            _unavailable(backend, "bubblewrap is not installed (apt-get install bubblewrap)")
        return LocalSandbox
    try:
        from sao_gym.sandbox.docker import DockerSandbox
    except ImportError as e:
        _unavailable(backend, f"sao_gym.sandbox.docker cannot be imported: {e}")
    if not await DockerSandbox.available():
        _unavailable(backend, "no Docker daemon or sandbox image available")
    return DockerSandbox


# -- leftover checks ---------------------------------------------------------------
def marked_processes(marker: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line contains ``marker``."""
    found = []
    needle = marker.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle not in f.read():
                    continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(entry))
    return found


def wait_no_marked_processes(marker: str, timeout_s: float = 3.0) -> list[int]:
    """Poll until no process carries ``marker`` (dying ones get ``timeout_s``); the rest."""
    deadline = time.monotonic() + timeout_s
    while (pids := marked_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids


def _host_state() -> dict[str, set[str]]:
    tmp = tempfile.gettempdir()
    mounts = set()
    with open("/proc/self/mountinfo") as f:  # ours: tmpfs named sao-*, or under the temp dir
        for line in f:
            fields = line.split()
            source = fields[fields.index("-") + 2]
            if source.startswith("sao-") or fields[4].startswith(tmp + "/"):
                mounts.add(f"{source} on {fields[4]}")
    cgroups = set(glob.glob(f"/sys/fs/cgroup/**/sao-sbx-{os.getpid()}-*", recursive=True))
    return {
        "temp dirs": {n for n in os.listdir(tmp) if n.startswith("sao-")},
        "mounts": mounts,
        "cgroups": cgroups,
    }


async def _containers(backend: str, ids: set[str]) -> list[str]:
    """Those of ``ids`` still known to the Docker daemon."""
    if backend != "docker" or not ids:
        return []
    from sao_gym.sandbox.docker import DockerSandbox

    return sorted(ids & set(await DockerSandbox.leftovers()))


@pytest.fixture
def marker() -> str:
    """A unique string for the command lines of a test's programs (found by /proc scans)."""
    return f"saomark{uuid.uuid4().hex[:12]}"


MakeSandbox = Callable[..., Awaitable]


@pytest.fixture(params=BACKENDS)
async def make_sandbox(request: pytest.FixtureRequest, marker: str) -> AsyncIterator[MakeSandbox]:
    """Async factory of started sandboxes of one backend; checks for leftovers afterwards.

    The factory has ``backend`` (its name) and ``cls`` (the sandbox class).
    """
    cls = await backend_class(request.param)
    before = _host_state()
    made = []

    async def make(**kwargs):
        sandbox = cls(**kwargs)
        made.append(sandbox)
        await sandbox.start()
        return sandbox

    make.backend, make.cls = request.param, cls
    yield make
    ids = {cid for s in made if (cid := getattr(s, "container_id", None))}
    await asyncio.gather(*(s.aclose() for s in made))
    left = {"processes": wait_no_marked_processes(marker)}
    after = _host_state()
    for key, old in before.items():
        left[key] = sorted(after[key] - old)
    left["containers"] = await _containers(request.param, ids)
    assert not any(left.values()), f"sandbox left traces behind: {left}"


@pytest.fixture
async def sandbox(make_sandbox: MakeSandbox):
    """A started sandbox with default limits."""
    return await make_sandbox()
