"""Process memory helpers."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from pathlib import Path


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def release_free_memory() -> bool:
    """Return the C heap's free pages to the OS (glibc ``malloc_trim``).

    A long run allocates and frees tensors of changing sizes on several
    threads (the inference worker, the learner thread); glibc keeps each
    thread's arena at its high-water mark, so the resident size creeps up
    although nothing leaks. Trimming after each learner step keeps it flat.
    Returns whether anything was released; a no-op off glibc.
    """
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


def rss_mb() -> float:
    """Resident set size of this process in MiB (NaN where /proc is missing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")
