"""Per-token quantities of a learner step, for the rollouts a run keeps (``Learner.trace``).

Pure functions over tensors the step already computed: nothing here runs a model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from sao_gym.types import Rollout


def check_trace(trace: Sequence[int], n: int) -> list[int]:
    """``trace`` sorted without repeats, each a position in a batch of ``n``."""
    want = sorted(set(trace))
    bad = [i for i in want if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n]
    if bad:
        raise ValueError(f"trace positions must be in [0, {n}); got {bad}")
    return want


def token_trace(rollouts: Sequence[Rollout], want: Sequence[int],
                advantages: Sequence[torch.Tensor], *,
                values: Sequence[torch.Tensor] | None, returns: Sequence[torch.Tensor] | None,
                scored: Mapping[int, torch.Tensor], band: tuple[float, float]
                ) -> dict[int, dict[str, list[float]]]:
    """The quantities of the rollouts at ``want``, each a list as long as the rollout.

    ``advantages``, ``values``, ``returns``: per rollout ``[T_i]`` (``values`` and
    ``returns`` None without a critic); ``scored``: the policy's logprobs of the
    rollouts it scored this step; ``band``: DIS's ``(eps_low, eps_high)``. Keys:
    ``advantage``, ``value``, ``return``, ``logprob``, ``ratio`` (policy over
    sampler) and ``dis_mask`` (1: inside the band), those the step computed; 0 off
    action tokens.
    """
    out: dict[int, dict[str, list[float]]] = {}
    lo, hi = 1.0 - band[0], 1.0 + band[1]
    for i in want:
        r = rollouts[i]
        mask = torch.tensor(r.loss_mask, dtype=torch.bool)
        row: dict[str, list[float]] = {
            "advantage": torch.where(mask, advantages[i].detach().float().cpu(), 0.0).tolist()}
        if values is not None and returns is not None:
            row["value"] = torch.where(mask, values[i].float().cpu(), 0.0).tolist()
            row["return"] = torch.where(mask, returns[i].float().cpu(), 0.0).tolist()
        if i in scored:
            lp = scored[i].float().cpu()
            ratio = torch.exp(torch.where(
                mask, lp - torch.tensor(r.rollout_logprobs, dtype=torch.float32), 0.0))
            row["logprob"] = torch.where(mask, lp, 0.0).tolist()
            row["ratio"] = torch.where(mask, ratio, 0.0).tolist()
            row["dis_mask"] = (mask & (ratio > lo) & (ratio < hi)).int().tolist()
        out[i] = row
    return out
