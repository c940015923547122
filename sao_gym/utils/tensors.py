"""Comparing nested state dicts (learner checkpoints) tensor by tensor."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def tensors(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every tensor in a nest of dicts, lists and tuples, with its ``/``-joined path."""
    import torch

    if isinstance(tree, torch.Tensor):
        yield prefix, tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            yield from tensors(v, f"{prefix}/{k}")
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from tensors(v, f"{prefix}/{i}")


def differing(a: Any, b: Any) -> list[str]:
    """Sorted paths of the tensors of ``a`` and ``b`` that are not equal bit for bit.

    A path in one tree but not the other counts as differing; so do another
    dtype or shape, ``0.0`` against ``-0.0``; a NaN equals the same NaN.
    """
    ta, tb = dict(tensors(a)), dict(tensors(b))
    return sorted((ta.keys() ^ tb.keys())
                  | {k for k in ta.keys() & tb.keys() if not _same_bits(ta[k], tb[k])})


def _same_bits(x: Any, y: Any) -> bool:
    import torch

    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    as_bytes = lambda t: t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
    return torch.equal(as_bytes(x), as_bytes(y))
