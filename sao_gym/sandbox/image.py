"""Build the default :class:`~sao_gym.sandbox.docker.DockerSandbox` image offline.

No container registry is reachable from our machines, so the image is not
pulled: :func:`build_image` bootstraps a minimal Debian root filesystem with
``debootstrap`` (which needs only the Debian package mirror), trims it, and
imports it into the local Docker engine (``docker import``). The result has
``/bin/sh``, Python 3 with pytest, git and procps, a ``/work`` directory owned
by the sandbox user (``nobody``, uid 65534) and no package caches.

Command line: ``sao-gym sandbox build-image [--tag T] [--extra-packages P,Q]
[--rebuild]`` (as root: debootstrap creates device nodes and chroots).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from sao_gym.sandbox.base import SandboxUnavailable

logger = logging.getLogger(__name__)

DEFAULT_IMAGE = "sao-gym-sandbox:latest"
"""The image :class:`~sao_gym.sandbox.docker.DockerSandbox` uses by default."""
DEFAULT_PACKAGES = ("python3", "python3-pytest", "git", "procps")
"""Debian packages installed on top of debootstrap's ``minbase`` variant."""
DEFAULT_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
SANDBOX_UID = 65534
"""Owner of ``/work`` in the image (``nobody``; the sandbox's default user)."""
IMAGE_LABEL = "sao_gym.image"

_PACKAGE_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+")
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Paths inside the root filesystem that only matter to package management or
# humans: removed to shrink the image (about 40 MB).
_PRUNE = (
    "var/lib/apt/lists", "var/cache/apt", "var/cache/debconf/templates.dat-old",
    "var/log", "usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale",
    "usr/share/lintian",
)


def _docker_client(client=None):
    """``client`` or a client from the environment; SandboxUnavailable when unreachable."""
    try:
        import docker
    except ImportError:
        raise SandboxUnavailable(
            "the docker SDK is missing: pip install 'sao-gym[docker]'") from None
    try:
        client = client or docker.from_env()
        client.ping()
    except Exception as e:  # noqa: BLE001 - any failure means "no daemon here"
        raise SandboxUnavailable(
            f"cannot reach the Docker daemon ({type(e).__name__}: {e}); start it, e.g. "
            "`dockerd --bridge=none --iptables=false --ip-forward=false --ip-masq=false &` "
            "as root (or `bash .ci/dockerd.sh start`)") from e
    return client


def image_exists(tag: str = DEFAULT_IMAGE, client=None) -> bool:
    """Whether the Docker engine has image ``tag`` (raises SandboxUnavailable without one)."""
    import docker.errors

    client = _docker_client(client)
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def build_image(
    tag: str = DEFAULT_IMAGE,
    *,
    extra_packages: Sequence[str] = (),
    rebuild: bool = False,
    suite: str = DEFAULT_SUITE,
    mirror: str = DEFAULT_MIRROR,
    client=None,
) -> str:
    """Build the sandbox image ``tag`` offline and return its id.

    Idempotent: when the engine already has ``tag`` it is returned untouched
    unless ``rebuild``. Takes about a minute (debootstrap downloads ~60 MB of
    packages from ``mirror``). Needs root, ``debootstrap`` and a running
    Docker daemon; raises :class:`SandboxUnavailable` naming what is missing.
    """
    bad = [p for p in extra_packages if not _PACKAGE_NAME.fullmatch(p)]
    if bad:
        raise ValueError(f"not Debian package names: {bad}")
    client = _docker_client(client)
    if not rebuild and image_exists(tag, client):
        image_id = client.images.get(tag).id
        logger.info("image %s exists (%s); pass rebuild=True to rebuild it", tag, image_id)
        return image_id
    if shutil.which("debootstrap") is None:
        raise SandboxUnavailable(
            "debootstrap is missing: `apt-get install debootstrap` (it builds the image's "
            "root filesystem from the Debian mirror)")
    if os.geteuid() != 0:
        raise SandboxUnavailable("building the sandbox image needs root (debootstrap chroots)")
    packages = list(dict.fromkeys([*DEFAULT_PACKAGES, *extra_packages]))
    with tempfile.TemporaryDirectory(prefix="sao-gym-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        _debootstrap(rootfs, packages, suite, mirror)
        _finish_rootfs(rootfs)
        image_id = _import(rootfs, tag, packages, client)
    logger.info("built %s (%s) with %s", tag, image_id, ", ".join(packages))
    return image_id


def _debootstrap(rootfs: Path, packages: Sequence[str], suite: str, mirror: str) -> None:
    cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}",
           suite, str(rootfs), mirror]
    logger.info("running %s", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        log = rootfs / "debootstrap" / "debootstrap.log"
        detail = log.read_text(errors="replace")[-2000:] if log.exists() else proc.stderr[-2000:]
        raise RuntimeError(f"debootstrap failed (exit {proc.returncode}); is {mirror} "
                           f"reachable?\n{detail}")


def _finish_rootfs(rootfs: Path) -> None:
    """Trim caches and docs; give the sandbox user its working directory."""
    for rel in _PRUNE:
        target = rootfs / rel
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
            target.mkdir(mode=0o755)
    # apt expects these to exist if someone ever derives an image from ours.
    (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
    (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
    work = rootfs / "work"
    work.mkdir(exist_ok=True)
    os.chown(work, SANDBOX_UID, SANDBOX_UID)
    work.chmod(0o755)


def _tar_stream(rootfs: Path, chunk: int = 1 << 20) -> Iterator[bytes]:
    proc = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        while data := proc.stdout.read(chunk):
            yield data
    finally:
        proc.stdout.close()
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.wait() != 0:
            raise RuntimeError(f"tar of {rootfs} failed: {err[-2000:]}")


def _import(rootfs: Path, tag: str, packages: Sequence[str], client) -> str:
    repository, _, version = tag.rpartition(":")
    if not repository or "/" in version:
        repository, version = tag, "latest"
    changes = [
        f"ENV PATH={_PATH}",
        "ENV LANG=C.UTF-8",
        "WORKDIR /work",
        f"USER {SANDBOX_UID}:{SANDBOX_UID}",
        'CMD ["/bin/sh"]',
        f'LABEL {IMAGE_LABEL}=1 {IMAGE_LABEL}.packages="{" ".join(packages)}"',
    ]
    client.api.import_image(src=_tar_stream(rootfs), repository=repository, tag=version,
                            changes=changes, stream_src=True)
    return client.images.get(tag).id
