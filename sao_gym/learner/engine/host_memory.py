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
the free memory at the top of the heap and the free pages inside it. The
CPU engines call it before and after every backward pass, as a training
pass enters each decoder layer forwards and backwards
(:func:`release_in_backward`: under gradient checkpointing each layer is
recomputed and freed there), and after every optimizer step. Returned
pages fault in again when reused: on SmolLM2-135M with 1,024-token
micro-batches a step takes ~7% longer, for a peak a quarter lower with
gradient checkpointing at 4,096 tokens (docs/benchmarks.md, "The learner at
scale"). Elsewhere (another C library; a GPU, whose caching allocator is
torch's own) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable
from typing import Any

import torch


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


def _release_on_gradient(grad: torch.Tensor) -> None:
    release_freed_memory()


def release_in_backward(layers: list[torch.nn.Module]) -> list[Any]:
    """Release freed memory as a training pass enters each of ``layers``, both ways.

    A forward pre-hook releases before each layer's forward pass (when
    gradients are on: a pass that trains), and a forward hook puts a
    gradient hook on the layer's output, which releases when that output's
    gradient is ready: just before the layer's own backward (and, under
    gradient checkpointing, its recomputation). Returns the hooks' handles.
    """
    def before(module: torch.nn.Module, args: Any) -> None:
        if torch.is_grad_enabled():
            release_freed_memory()

    def after(module: torch.nn.Module, args: Any, output: Any) -> None:
        out = output[0] if isinstance(output, (tuple, list)) else output
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(_release_on_gradient)

    return [h for layer in layers for h in (layer.register_forward_pre_hook(before),
                                            layer.register_forward_hook(after))]


__all__ = ["release_freed_memory", "release_in_backward"]
