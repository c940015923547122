"""The processes that train one model together, and what the learner asks of them.

Every rank of a group runs the same learner code on the same batch; a
:class:`RankGroup` says which micro-batches this rank runs (:meth:`share`)
and combines what the ranks computed (:meth:`sum`, :meth:`max`,
:meth:`union`). :data:`SINGLE` is one process alone (everything is its share,
combining is the identity); :class:`TorchRankGroup` is a
``torch.distributed`` process group (gloo on the CPU, NCCL on GPUs).

Micro-batches are dealt out by token count: longest first, each to the rank
with the fewest tokens so far. FSDP runs collectives in every forward and
backward pass, so every rank must run as many passes as the others: a rank
with fewer micro-batches repeats one with weight 0 (its loss and statistics
count nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def deal(sizes: Sequence[int], ranks: int) -> list[list[tuple[int, float]]]:
    """Each rank's ``(index, weight)`` list: indices dealt by size, padded to one length.

    Longest first, each index to the rank with the smallest total so far (the
    lowest rank on ties); then each rank's list is in index order, and a
    shorter list is padded with its own first index (or index 0) at weight 0.
    """
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    loads = [0] * ranks
    shares: list[list[int]] = [[] for _ in range(ranks)]
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(ranks), key=lambda r: (loads[r], r))
        shares[r].append(i)
        loads[r] += sizes[i]
    longest = max(len(s) for s in shares)
    out = []
    for s in shares:
        s.sort()
        filler = s[0] if s else 0
        out.append([(i, 1.0) for i in s] + [(filler, 0.0)] * (longest - len(s)))
    return out


class RankGroup:
    """One process alone: all work is its own; combining returns its input."""

    size = 1
    rank = 0

    def share(self, sizes: Sequence[int]) -> list[tuple[int, float]]:
        """The ``(index, weight)`` list of this rank, items of ``sizes`` tokens (:func:`deal`)."""
        return deal(sizes, self.size)[self.rank]

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sums over the ranks."""
        return [float(v) for v in values]

    def max(self, values: Sequence[float]) -> list[float]:
        """Element-wise maxima over the ranks."""
        return [float(v) for v in values]

    def union(self, items: dict[int, Any]) -> dict[int, Any]:
        """The union of every rank's ``items`` (keys are disjoint between ranks)."""
        return dict(items)


SINGLE = RankGroup()


def _to(value: Any, device: Any) -> Any:
    """``value`` with its tensors (itself, or in a tuple) on ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(_to(v, device) for v in value)
    return value
"""The group of this process alone."""


class TorchRankGroup(RankGroup):
    """The ranks of a ``torch.distributed`` process group (the default one: ``group=None``).

    Sums and maxima travel as one float64 tensor on ``device`` (the
    backend's: CPU for gloo, the rank's GPU for NCCL); unions as pickled
    objects (tensors in them travel on the CPU and come back on ``device``).
    """

    def __init__(self, group: Any = None, device: str | torch.device = "cpu"):
        import torch.distributed as dist

        self.group, self.device = group, torch.device(device)
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def _reduce(self, values: Sequence[float], op: Any) -> list[float]:
        import torch.distributed as dist

        if not values:
            return []
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=op, group=self.group)
        return t.tolist()

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sums over the ranks."""
        import torch.distributed as dist

        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values: Sequence[float]) -> list[float]:
        """Element-wise maxima over the ranks."""
        import torch.distributed as dist

        return self._reduce(values, dist.ReduceOp.MAX)

    def union(self, items: dict[int, Any]) -> dict[int, Any]:
        """The union of every rank's ``items`` (keys are disjoint between ranks)."""
        import torch.distributed as dist

        mine = {k: _to(v, "cpu") for k, v in items.items()}
        gathered: list[Any] = [None] * self.size
        dist.all_gather_object(gathered, mine, group=self.group)
        out: dict[int, Any] = {}
        for part in gathered:
            out.update(part)
        return {k: _to(v, self.device) for k, v in out.items()}


__all__ = ["SINGLE", "RankGroup", "TorchRankGroup", "deal"]
