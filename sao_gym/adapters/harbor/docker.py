"""Docker images and file transfer for running Harbor tasks in :class:`DockerSandbox` containers.

How a task's container is made (offline: nothing is pulled):

1. **The task image**: ``environment/Dockerfile`` is built by the local Docker
   engine with ``network_mode="none"`` (``RUN`` steps get no network) and no
   pull; every ``FROM`` image must already be in the engine (for exported
   tasks: sao-gym's sandbox images, such as ``sao-gym-sandbox:latest``, built by
   ``sao-gym sandbox build-image``). ``[environment].docker_image`` names a
   prebuilt local image instead. The tag is ``sao-gym-harbor/NAME:HASH``, the
   hash covering the build context and the ``FROM`` images' ids, so an
   unchanged task is built once.
2. **The runner image**: one layer on top, because a ``DockerSandbox`` has a
   read-only root filesystem with tmpfs mounts at its working directory and
   ``/tmp`` only. The layer saves the task's working directory (and any
   ``/tests``, ``/solution``, ``/logs`` the image has) under
   ``/.sao-harbor/seed/`` and turns ``/logs``, ``/tests`` and ``/solution``
   into symlinks to ``/tmp/.sao-harbor/...``, so the paths Harbor's scripts
   use are writable.
3. **At reset** a ``DockerSandbox`` of the runner image starts (no network,
   capabilities dropped, limits) with its working directory (the image's
   ``WORKDIR``, or ``[environment].workdir``) as a tmpfs, and
   :data:`SETUP` copies the saved files back. Files written elsewhere by the
   Dockerfile stay readable but not writable.

Files travel into a container as a tar on a command's stdin and out as
base64 on its stdout (:data:`BOX_HELPER`, run by the container's ``python3``).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import tarfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sao_gym.sandbox.base import ExecResult, Sandbox, SandboxError, SandboxUnavailable

IMAGE_LABEL = "sao_gym.harbor"
"""Images built here carry ``IMAGE_LABEL=1`` (``docker image prune --filter label=...``)."""
STATE = "/tmp/.sao-harbor"
"""Where ``/logs``, ``/tests`` and ``/solution`` point in a runner container."""
SEED = "/.sao-harbor/seed"
RUNNER_VERSION = "1"
_LINKED = ("logs", "tests", "solution")
_BUILD_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()

BOX_HELPER = r"""
import base64, fnmatch, json, os, shutil, sys, tarfile
op, path = sys.argv[1], sys.argv[2]
def clear(d):
    for name in os.listdir(d):
        p = os.path.join(d, name)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.unlink(p)
def safe(m, dest):
    if m.name.startswith("/") or ".." in m.name.split("/"):
        return False
    if m.issym() or m.islnk():
        base = os.path.dirname(os.path.join(dest, m.name)) if m.issym() else dest
        target = os.path.normpath(os.path.join(base, m.linkname))
        return target == dest or target.startswith(dest.rstrip("/") + "/")
    return m.isfile() or m.isdir()
if op == "unpack":
    os.makedirs(path, exist_ok=True)
    if "--clear" in sys.argv[3:]:
        clear(path)
    dest = os.path.realpath(path)
    with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as t:
        for m in t:
            if safe(m, dest):
                t.extract(m, dest, set_attrs=not m.isdir())
elif op == "pack":
    excludes = sys.argv[3:]
    if not os.path.lexists(path):
        print(json.dumps({"kind": "missing"}))
        sys.exit(0)
    kind = "dir" if os.path.isdir(path) and not os.path.islink(path) else "file"
    def keep(info):
        parts = info.name.split("/")
        return None if any(fnmatch.fnmatch(p, x) or fnmatch.fnmatch(info.name, x)
                           for x in excludes for p in parts) else info
    buf = __import__("io").BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        if kind == "dir":
            for name in sorted(os.listdir(path)):
                t.add(os.path.join(path, name), arcname=name, filter=keep)
        else:
            t.add(path, arcname=os.path.basename(path), filter=keep)
    print(json.dumps({"kind": kind, "data": base64.b64encode(buf.getvalue()).decode()}))
"""
"""In-container file helper: ``unpack DIR [--clear]`` (tar on stdin), ``pack PATH [EXCL...]``."""

SETUP = (
    f"set -e; mkdir -p {STATE}/logs/verifier {STATE}/logs/agent {STATE}/logs/artifacts "
    f"{STATE}/tests {STATE}/solution; "
    f"for d in work {' '.join(_LINKED)}; do [ -d {SEED}/$d ] || continue; "
    f"if [ $d = work ]; then t=\"$1\"; else t={STATE}/$d; fi; "
    f"cp -R -p {SEED}/$d/. \"$t\"/; done"
)
"""Run as ``sh -c SETUP sh WORKDIR`` at reset: make the state dirs, copy the saved files back."""


@dataclass(frozen=True)
class RunnerImage:
    """A task's runner image (see the module docs) and the working directory to mount."""

    tag: str
    workdir: str


def docker_client() -> Any:
    """A Docker client, or :class:`SandboxUnavailable` saying how to start a daemon."""
    from sao_gym.sandbox.image import _docker_client

    return _docker_client()


def _lock(tag: str) -> threading.Lock:
    with _LOCKS_GUARD:
        return _BUILD_LOCKS.setdefault(tag, threading.Lock())


def _slug(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")  # a valid image name
    return (slug or "task")[:60]


def from_images(dockerfile: str) -> list[str]:
    """The images a Dockerfile's ``FROM`` lines name (build stages and ``scratch`` left out)."""
    images, stages = [], set()
    for line in dockerfile.splitlines():
        m = re.match(r"\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", line, re.IGNORECASE)
        if m is None:
            continue
        if m.group(1).lower() not in stages and m.group(1) != "scratch":
            images.append(m.group(1))
        if m.group(2):
            stages.add(m.group(2).lower())
    return images


def _local_image(client: Any, name: str, what: str) -> Any:
    import docker.errors

    try:
        return client.images.get(name)
    except docker.errors.ImageNotFound:
        hint = (" (build it with `sao-gym sandbox build-image`)" if name.startswith("sao-gym-")
                else "")
        raise SandboxUnavailable(f"{what}: image {name!r} is not in the local Docker engine and "
                                 f"cannot be pulled here{hint}") from None
    except docker.errors.APIError as e:  # e.g. FROM $ARG: not a name this can look up
        raise SandboxUnavailable(f"{what}: cannot use the image {name!r}: {e}") from None


def context_hash(context: Path, dockerfile: str, base_ids: list[str]) -> str:
    """A hash of a build context's files (paths, modes, bytes) and its base images."""
    h = hashlib.sha256(dockerfile.encode())
    h.update(json.dumps(base_ids).encode())
    for path in sorted(p for p in context.rglob("*") if p.is_file() or p.is_symlink()):
        rel = path.relative_to(context).as_posix()
        h.update(f"\0{rel}\0{os.lstat(path).st_mode & 0o111}\0".encode())
        h.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
    return h.hexdigest()[:16]


def _build(client: Any, tag: str, what: str, timeout_s: float, **kwargs: Any) -> None:
    import docker.errors

    with _lock(tag):
        try:
            client.images.get(tag)
            return
        except docker.errors.ImageNotFound:
            pass
        try:
            client.images.build(tag=tag, network_mode="none", pull=False, rm=True, forcerm=True,
                                labels={IMAGE_LABEL: "1"}, timeout=int(timeout_s), **kwargs)
        except docker.errors.BuildError as e:
            log = "".join(str(chunk.get("stream") or chunk.get("error") or "")
                          for chunk in e.build_log if isinstance(chunk, dict))
            raise SandboxUnavailable(f"{what}: the offline docker build failed: {e.msg}\n"
                                     f"{log[-2000:]}") from None
        except docker.errors.APIError as e:
            raise SandboxUnavailable(f"{what}: the docker build failed: {e}") from None
        except Exception as e:  # noqa: BLE001 - connection errors, HTTP timeouts
            raise SandboxUnavailable(f"{what}: the docker build failed "
                                     f"({type(e).__name__}: {e})") from None


def build_task_image(name: str, context: Path | None, image: str | None, *,
                     timeout_s: float = 600.0, client: Any = None) -> str:
    """Build ``context``'s Dockerfile offline (or check the prebuilt ``image``); its tag."""
    client = client or docker_client()
    what = f"task {name}"
    if context is None:
        assert image is not None
        _local_image(client, image, what)
        return image
    dockerfile = (context / "Dockerfile").read_text(encoding="utf-8")
    bases = [_local_image(client, base, what).id for base in from_images(dockerfile)]
    tag = f"sao-gym-harbor/{_slug(name)}:{context_hash(context, dockerfile, bases)}"
    _build(client, tag, what, timeout_s, path=str(context), dockerfile="Dockerfile")
    return tag


def build_runner_image(name: str, task_image: str, workdir: str | None, *,
                       timeout_s: float = 600.0, client: Any = None) -> RunnerImage:
    """The runner layer on ``task_image`` (see the module docs), built once per image."""
    client = client or docker_client()
    image = _local_image(client, task_image, f"task {name}")
    workdir = (workdir or image.attrs.get("Config", {}).get("WorkingDir") or "/app").rstrip("/")
    if workdir in ("", "/tmp") or not workdir.startswith("/") or workdir.split("/")[1] in (
            *_LINKED, "proc", "sys", "dev", "etc", "usr", "bin", "lib", "sbin"):
        workdir = "/app"  # a WORKDIR of / (or a system path) cannot be a tmpfs
    q = json.dumps
    steps = [f"mkdir -p {SEED}",
             f"if [ -d {q(workdir)} ]; then cp -a {q(workdir)} {SEED}/work; fi"]
    for d in _LINKED:
        steps.append(f"if [ -d /{d} ] && [ ! -L /{d} ]; then cp -a /{d} {SEED}/{d}; fi; "
                     f"rm -rf /{d}; ln -s {STATE}/{d} /{d}")
    steps.append(f"chmod -R a+rX {SEED}")
    dockerfile = f"FROM {image.id}\nUSER 0\nRUN " + " && ".join(f"{{ {s}; }}" for s in steps)
    digest = hashlib.sha256(f"{RUNNER_VERSION}\0{image.id}\0{workdir}".encode()).hexdigest()
    tag = f"sao-gym-harbor/{_slug(name)}:run-{digest[:16]}"
    _build(client, tag, f"task {name} (runner layer)", timeout_s,
           fileobj=io.BytesIO(dockerfile.encode()))
    return RunnerImage(tag, workdir)


# ----- moving files in and out of a running sandbox -----------------------------------------
def tar_of(local: Path) -> bytes:
    """A tar (in memory) of a directory's contents; symlinks stay links."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for child in sorted(local.iterdir()):
            tar.add(child, arcname=child.name)
    return buf.getvalue()


async def unpack(sb: Sandbox, data: bytes, dest: str, *, clear: bool = False) -> None:
    """Extract a tar into ``dest`` inside ``sb`` (emptied first with ``clear``)."""
    argv = ["python3", "-I", "-c", BOX_HELPER, "unpack", dest, *(["--clear"] if clear else [])]
    result = await sb.run(argv, stdin=data, timeout_s=300)
    if not result.ok:
        raise SandboxError(f"cannot copy files to {dest} in the sandbox: exit "
                           f"{result.exit_code}: {result.stderr.strip()[-800:]}")


async def pack(sb: Sandbox, path: str, exclude: tuple[str, ...] = (),
               max_bytes: int = 64 << 20) -> tuple[str, bytes]:
    """``(kind, tar)`` of ``path`` inside ``sb``: kind ``dir``, ``file`` or ``missing``.

    Raises ``ValueError`` when it is larger than ``max_bytes`` (the agent's doing).
    """
    result: ExecResult = await sb.run(["python3", "-I", "-c", BOX_HELPER, "pack", path,
                                       *exclude], timeout_s=300, max_output_bytes=max_bytes)
    if result.output_truncated:
        raise ValueError(f"{path} is larger than {max_bytes >> 20} MiB")
    if not result.ok:
        raise SandboxError(f"cannot read {path} in the sandbox: exit {result.exit_code}: "
                           f"{result.stderr.strip()[-800:]}")
    try:
        record = json.loads(result.stdout)
        return record["kind"], base64.b64decode(record.get("data", ""))
    except (ValueError, KeyError, TypeError) as e:
        raise SandboxError(f"garbled copy of {path} from the sandbox: {e}") from None
