"""What a learner step reports: token-weighted means of per-micro-batch statistics.

:class:`StepMetrics` accumulates the statistics of each micro-batch weighted by
its token count (maxima for ``*_max`` keys) and reduces them over the ranks of
a group; :func:`explained_variance_of` is the critic's diagnostic over a
batch's micro-batches (action positions only).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from sao_gym.learner.advantages import explained_variance
from sao_gym.learner.batching import MicroBatch
from sao_gym.learner.engine import SINGLE, RankGroup


@dataclass
class StepMetrics:
    """Token-weighted means (maxima for ``*_max`` keys) of per-micro-batch statistics."""

    sums: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    maxima: dict[str, float] = field(default_factory=dict)

    def add(self, stats: dict[str, Any], weight: float, prefix: str = "") -> None:
        """Add one micro-batch's ``stats`` (keys prefixed by ``prefix``) at ``weight`` tokens."""
        for k, v in stats.items():
            key = prefix + k
            if k.endswith("_max"):
                self.maxima[key] = max(self.maxima.get(key, -math.inf), float(v))
                continue
            self.sums[key] = self.sums.get(key, 0.0) + float(v) * weight
            self.weights[key] = self.weights.get(key, 0.0) + weight

    def means(self, group: RankGroup = SINGLE) -> dict[str, float]:
        """The means (and maxima) over every rank of ``group``."""
        keys, top = sorted(self.sums), sorted(self.maxima)
        sums = group.sum([self.sums[k] for k in keys] + [self.weights[k] for k in keys])
        n = len(keys)
        out = {k: sums[i] / max(sums[n + i], 1e-12) for i, k in enumerate(keys)}
        return {**out, **dict(zip(top, group.max([self.maxima[k] for k in top]), strict=True))}


def explained_variance_of(values: Sequence[torch.Tensor], returns: Sequence[torch.Tensor],
                          mbs: Sequence[MicroBatch]) -> float:
    """``1 - Var(R - V) / Var(R)`` over the action positions of every micro-batch."""
    mask = torch.cat([mb.action_mask_BT.flatten() for mb in mbs])
    v = torch.cat([x.flatten() for x in values])
    r = torch.cat([x.flatten() for x in returns])
    return float(explained_variance(v[None], r[None], mask[None]))
