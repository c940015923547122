"""Policy and value losses as pure tensor functions.

Every function takes ``[B, T]`` tensors over right-padded packed rollouts and
explicit scalars, and returns ``(loss, stats)``: a 0-dim loss tensor that
carries the graph, and a dict of diagnostics. Conventions shared by all:

- ``mask_BT`` marks action tokens (nonzero = sampled by the policy; bool or
  float). Only those tokens enter a loss or a statistic. Values at the other
  positions (prompt, observations, padding) are never read arithmetically:
  they are replaced with :func:`torch.where` first, so garbage there (``-inf``
  logprobs, NaN advantages) cannot leak NaN into the loss or its gradient.
- ``logprobs_BT[b, t]`` is ``log p(token t | tokens < t)``.
- ``stats`` values are **0-dim detached tensors** (no device sync per call;
  ``float(v)`` them when logging). They are means/maxima over *this call's*
  action tokens, not over the global batch; all are 0 when the call has no
  action token.
- Aggregation (:func:`aggregate`) is a free choice (the paper does not state
  one, PAPER.md 1.4); ``num_tokens``/``num_seqs`` let a learner that
  accumulates gradients over micro-batches reproduce the full-batch loss
  exactly by summing micro-batch losses.

Losses: :func:`dis_policy_loss` (SAO's direct double-sided importance
sampling, PAPER.md Eq. 1-3), :func:`ppo_clip_policy_loss` (PPO clip-higher,
for the baselines), :func:`value_loss` (critic MSE, optionally PPO-clipped).
"""

from __future__ import annotations

import torch
from torch import Tensor

from sao_gym.learner.config import AGGREGATIONS

__all__ = [
    "AGGREGATIONS",
    "aggregate",
    "dis_policy_loss",
    "entropy_from_logits",
    "ppo_clip_policy_loss",
    "value_loss",
]

Denominator = float | int | Tensor | None


def aggregate(
    values_BT: Tensor,
    mask_BT: Tensor,
    mode: str,
    *,
    num_tokens: Denominator = None,
    num_seqs: Denominator = None,
) -> Tensor:
    """Reduce per-token values over action tokens to a scalar.

    Modes:

    - ``"token_mean"``: ``sum(v * mask) / num_tokens``; ``num_tokens`` defaults
      to the number of action tokens in this batch.
    - ``"seq_mean_token_mean"``: each sequence's mean over its own action
      tokens, summed and divided by ``num_seqs`` (default ``B``). A sequence
      without action tokens contributes 0 **and still counts** in ``num_seqs``:
      the denominator is the number of rollouts, known before any token is
      looked at, so micro-batches need no extra bookkeeping.
    - ``"seq_mean_token_sum"``: per-sequence sums over action tokens, divided
      by ``num_seqs`` (default ``B``).

    ``num_tokens`` (used by ``token_mean`` only) and ``num_seqs`` (used by the
    two ``seq_mean`` modes) replace the denominators computed from this batch.
    Pass the full batch's counts when accumulating micro-batches: the sum of
    the micro-batch results then equals the full-batch result. Denominators
    computed from the batch are clamped to at least 1, so an empty batch gives
    a zero loss instead of NaN; given ones are used as they are.

    >>> v = torch.tensor([[1.0, 2.0, 9.0], [4.0, 9.0, 9.0]])
    >>> m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    >>> [round(float(aggregate(v, m, mode)), 4) for mode in AGGREGATIONS]
    [2.3333, 2.75, 3.5]
    """
    mask = mask_BT.bool()
    masked_BT = torch.where(mask, values_BT, torch.zeros_like(values_BT))
    if mode == "token_mean":
        if num_tokens is None:
            num_tokens = mask.sum().clamp(min=1)
        return masked_BT.sum() / num_tokens
    if num_seqs is None:
        num_seqs = max(values_BT.shape[0], 1)
    if mode == "seq_mean_token_mean":
        per_seq_B = masked_BT.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
        return per_seq_B.sum() / num_seqs
    if mode == "seq_mean_token_sum":
        return masked_BT.sum() / num_seqs
    raise ValueError(f"unknown aggregation mode {mode!r}; valid modes: {', '.join(AGGREGATIONS)}")


def _masked_mean(x_BT: Tensor, mask: Tensor, count: Tensor) -> Tensor:
    return torch.where(mask, x_BT, torch.zeros_like(x_BT)).sum() / count


def _ratio_stats(log_ratio_BT: Tensor, ratio_BT: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """``ratio_mean``, ``ratio_max``, ``approx_kl`` over action tokens (detached)."""
    count = mask.sum().clamp(min=1)
    k3_BT = (ratio_BT - 1) - log_ratio_BT
    # Ratios are positive, so a 0 fill gives the max over action tokens, or 0 if none.
    ratios_BT = torch.where(mask, ratio_BT, torch.zeros_like(ratio_BT))
    return {
        "ratio_mean": _masked_mean(ratio_BT, mask, count),
        "ratio_max": ratios_BT.max() if ratios_BT.numel() else ratios_BT.new_zeros(()),
        "approx_kl": _masked_mean(k3_BT, mask, count),
    }


def dis_policy_loss(
    logprobs_BT: Tensor,
    rollout_logprobs_BT: Tensor,
    advantages_BT: Tensor,
    mask_BT: Tensor,
    *,
    eps_low: float = 0.3,
    eps_high: float = 5.0,
    aggregation: str = "token_mean",
    num_tokens: Denominator = None,
    num_seqs: Denominator = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """SAO's direct double-sided importance-sampling policy loss (PAPER.md Eq. 1-3).

    ``r = exp(logprobs - rollout_logprobs)`` against the sampler's recorded
    logprobs (no old-policy pass). The weight is ``w = stopgrad(r)`` when
    ``1 - eps_low < r < 1 + eps_high`` (strict: a ratio exactly on an edge is
    masked) and 0 otherwise, whatever the sign of the advantage. The per-token
    loss ``-(w * A * logprobs)`` is aggregated over action tokens, and masked
    tokens still count in the denominator (they are action tokens with weight
    0). Hence inside the band ``d loss / d logprob = -r * A / N`` and outside
    it the gradient is exactly 0.

    Stats (0-dim detached tensors, over action tokens): ``clip_ratio`` (share
    of action tokens masked by the band), ``ratio_mean``, ``ratio_max``,
    ``approx_kl`` (k3 estimate of KL(sampler || policy), mean of
    ``(r - 1) - log r``).
    """
    mask = mask_BT.bool()
    zeros = torch.zeros_like(logprobs_BT)
    logprobs = torch.where(mask, logprobs_BT, zeros)
    log_ratio_BT = torch.where(mask, logprobs_BT.detach() - rollout_logprobs_BT, zeros)
    ratio_BT = torch.exp(log_ratio_BT)
    in_band = (ratio_BT > 1.0 - eps_low) & (ratio_BT < 1.0 + eps_high)
    weight_BT = torch.where(in_band, ratio_BT, torch.zeros_like(ratio_BT))
    advantages = torch.where(mask, advantages_BT, torch.zeros_like(advantages_BT))
    loss_BT = -(weight_BT * advantages * logprobs)
    loss = aggregate(loss_BT, mask, aggregation, num_tokens=num_tokens, num_seqs=num_seqs)
    with torch.no_grad():
        count = mask.sum().clamp(min=1)
        stats = {"clip_ratio": _masked_mean((~in_band).to(ratio_BT.dtype), mask, count)}
        stats.update(_ratio_stats(log_ratio_BT, ratio_BT, mask))
    return loss, stats


def sampler_mismatch(
    logprobs_BT: Tensor,
    rollout_logprobs_BT: Tensor,
    mask_BT: Tensor,
    *,
    eps_low: float = 0.3,
    eps_high: float = 5.0,
) -> dict[str, Tensor]:
    """How far the learner's policy is from the sampler's, on action tokens (detached).

    Whatever the loss, ``r = exp(logprobs - rollout_logprobs)``: ``approx_kl``
    (k3 estimate of KL(sampler || policy)) and ``masked_share``, the share of
    action tokens outside DIS's band ``(1 - eps_low, 1 + eps_high)`` (strict),
    i.e. what SAO's mask would drop. For a PPO loss, whose ratio is against a
    recomputed old policy, this is the off-policy drift it does not see.
    """
    with torch.no_grad():
        mask = mask_BT.bool()
        zeros = torch.zeros_like(logprobs_BT)
        log_ratio_BT = torch.where(mask, logprobs_BT.detach() - rollout_logprobs_BT, zeros)
        ratio_BT = torch.exp(log_ratio_BT)
        count = mask.sum().clamp(min=1)
        outside = ~((ratio_BT > 1.0 - eps_low) & (ratio_BT < 1.0 + eps_high))
        return {"approx_kl": _ratio_stats(log_ratio_BT, ratio_BT, mask)["approx_kl"],
                "masked_share": _masked_mean(outside.to(ratio_BT.dtype), mask, count)}


def ppo_clip_policy_loss(
    logprobs_BT: Tensor,
    old_logprobs_BT: Tensor,
    advantages_BT: Tensor,
    mask_BT: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    aggregation: str = "token_mean",
    num_tokens: Denominator = None,
    num_seqs: Denominator = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's pessimistic clipped surrogate with clip-higher (DAPO's asymmetric eps).

    ``r = exp(logprobs - old_logprobs)``; per-token loss
    ``-min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)``, aggregated over
    action tokens like :func:`dis_policy_loss`. A token is clipped (zero
    gradient) only when the clipped term is strictly the active one: A > 0
    with r > 1 + eps_high, or A < 0 with r < 1 - eps_low. A < 0 with a large
    r is *not* clipped (the pessimistic min keeps the unclipped term).

    Stats as in :func:`dis_policy_loss`, with ``clip_ratio`` the share of
    action tokens where the clipped term is active, and ratio and
    ``approx_kl`` taken against the old policy.
    """
    mask = mask_BT.bool()
    zeros = torch.zeros_like(logprobs_BT)
    log_ratio_BT = torch.where(mask, logprobs_BT - old_logprobs_BT, zeros)
    ratio_BT = torch.exp(log_ratio_BT)
    advantages = torch.where(mask, advantages_BT, torch.zeros_like(advantages_BT))
    pg_loss1_BT = -advantages * ratio_BT
    pg_loss2_BT = -advantages * torch.clamp(ratio_BT, 1.0 - eps_low, 1.0 + eps_high)
    clipped = pg_loss2_BT > pg_loss1_BT
    loss_BT = torch.where(clipped, pg_loss2_BT, pg_loss1_BT)
    loss = aggregate(loss_BT, mask, aggregation, num_tokens=num_tokens, num_seqs=num_seqs)
    with torch.no_grad():
        count = mask.sum().clamp(min=1)
        stats = {"clip_ratio": _masked_mean(clipped.to(ratio_BT.dtype), mask, count)}
        stats.update(_ratio_stats(log_ratio_BT.detach(), ratio_BT.detach(), mask))
    return loss, stats


def value_loss(
    values_BT: Tensor,
    returns_BT: Tensor,
    mask_BT: Tensor,
    *,
    old_values_BT: Tensor | None = None,
    clip: float | None = None,
    aggregation: str = "token_mean",
    num_tokens: Denominator = None,
    num_seqs: Denominator = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Critic regression loss ``0.5 * (V - R)^2`` over action tokens.

    The 0.5 makes the gradient ``V - R`` (cleanrl's convention); it applies to
    the clipped form too. With ``clip`` set, ``old_values_BT`` is required and
    the PPO value clip is used: ``0.5 * max((V - R)^2, (V_clip - R)^2)`` with
    ``V_clip = clamp(V, old - clip, old + clip)``. ``old_values_BT`` without
    ``clip`` is ignored.

    Stats (0-dim detached tensors, over action tokens): ``value_mean``, and
    ``value_clip_ratio``, the share of action tokens where the clipped error
    is strictly the larger one (0 when ``clip`` is None).
    """
    if clip is not None and old_values_BT is None:
        raise ValueError("value_loss: clip is set but old_values_BT is None")
    mask = mask_BT.bool()
    zeros = torch.zeros_like(values_BT)
    values = torch.where(mask, values_BT, zeros)
    returns = torch.where(mask, returns_BT, zeros)
    sq_err_BT = (values - returns) ** 2
    if clip is None:
        clipped = torch.zeros_like(mask)
        loss_BT = 0.5 * sq_err_BT
    else:
        old = torch.where(mask, old_values_BT, zeros)
        clipped_values = old + torch.clamp(values - old, -clip, clip)
        sq_err_clipped_BT = (clipped_values - returns) ** 2
        clipped = sq_err_clipped_BT > sq_err_BT
        loss_BT = 0.5 * torch.where(clipped, sq_err_clipped_BT, sq_err_BT)
    loss = aggregate(loss_BT, mask, aggregation, num_tokens=num_tokens, num_seqs=num_seqs)
    with torch.no_grad():
        count = mask.sum().clamp(min=1)
        stats = {
            "value_mean": _masked_mean(values.detach(), mask, count),
            "value_clip_ratio": _masked_mean(clipped.to(values.dtype), mask, count),
        }
    return loss, stats


def entropy_from_logits(logits_BTV: Tensor) -> Tensor:
    """Entropy of the softmax over the last dim, ``[B, T, V] -> [B, T]``.

    Computed from :func:`torch.log_softmax`; entries with probability 0 (e.g.
    ``-inf`` logits for banned tokens) contribute 0 rather than NaN.
    """
    logp_BTV = torch.log_softmax(logits_BTV, dim=-1)
    p_BTV = torch.exp(logp_BTV)
    plogp_BTV = torch.where(p_BTV > 0, p_BTV * logp_BTV, torch.zeros_like(p_BTV))
    return -plogp_BTV.sum(dim=-1)
