"""Durable file-system helpers (what survives ``kill -9`` and power loss)."""

from __future__ import annotations

import os


def fsync_path(path: str | os.PathLike[str]) -> None:
    """Fsync a file or a directory (a directory's entries: renames, creations)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: str | os.PathLike[str]) -> None:
    """Fsync every file and directory below ``path``, and ``path`` itself."""
    for root, _dirs, files in os.walk(path):
        for name in files:
            fsync_path(os.path.join(root, name))
        fsync_path(root)
