"""Handing freed host memory back to the operating system between learner phases.

On the CPU, a forward/backward pass allocates and frees gigabytes of
activations in blocks of every size. glibc's allocator keeps much of what
is freed in its heaps and arenas instead of returning it, so the process's
resident memory stays gigabytes above its live tensors after a backward
pass, and the next phase (the optimizer step, the next micro-batch, the
critic) piles its own allocations on top: the peak grows with what was
freed, not only with what is alive. Measured on SmolLM2-135M with
2,048-token micro-batches: 4.5 GB resident between two steps without
trimming, 1.7 GB (the model state) with it.

:func:`release_freed_memory` calls glibc's ``malloc_trim(0)``, which returns
the free memory at the top of the heap and the free pages inside it (a few
milliseconds against a step of seconds). The CPU engines call it after
every backward pass and optimizer step. Elsewhere (another C library, a
GPU, whose caching allocator is torch's own) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows)
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_freed_memory() -> bool:
    """Return freed heap memory to the OS (glibc's ``malloc_trim(0)``).

    Returns whether memory was released; False where the C library has no
    ``malloc_trim`` or nothing could be released.
    """
    trim = _malloc_trim()
    return bool(trim is not None and trim(0))


__all__ = ["release_freed_memory"]
