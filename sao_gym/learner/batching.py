"""Turning rollouts into padded micro-batches under a token budget.

Rollouts of very different lengths are grouped by length (longest first) so
that each micro-batch's padded size ``rows * longest_row`` stays within
``max_tokens``; the learner accumulates gradients over micro-batches instead
of padding a whole batch to its longest rollout. A rollout longer than the
budget gets a micro-batch of its own.

:func:`split_minibatches` cuts a batch's rollouts into the policy minibatches
(one optimizer step each); each minibatch is then micro-batched on its own.

Tensors follow the token layout of :class:`~sao_gym.types.Rollout`: position
``t`` holds token ``t``, its action mask, its sampler logprob and the reward
placed on it (the episode's reward sits on its last action token).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from sao_gym.types import Rollout


@dataclass(frozen=True)
class MicroBatch:
    """Right-padded tensors of some rollouts of a batch, a row per segment."""

    indices: list[int]
    """The rollout (its position in the batch) of each row. A rollout of several
    segments (:attr:`~sao_gym.types.Rollout.segment_starts`) has a row per
    segment, in order, all in one micro-batch."""
    input_ids_BT: torch.Tensor
    attention_mask_BT: torch.Tensor
    action_mask_BT: torch.Tensor
    """1.0 on action tokens (``Rollout.loss_mask``), else 0.0."""
    rollout_logprobs_BT: torch.Tensor
    rewards_BT: torch.Tensor
    """The episode's reward on its last action token (of its last segment), 0 elsewhere."""
    spans: list[tuple[int, int]] = field(default_factory=list)
    """Each row's ``(start, stop)`` in its rollout's tokens (empty: whole rollouts)."""

    @property
    def num_tokens(self) -> int:
        """Real (unpadded) tokens in the micro-batch."""
        return int(self.attention_mask_BT.sum())

    def row_spans(self) -> list[tuple[int, int]]:
        """Each row's ``(start, stop)`` in its rollout's tokens."""
        if self.spans:
            return self.spans
        lengths = self.attention_mask_BT.sum(-1).tolist()
        return [(0, int(n)) for n in lengths]


def plan_micro_batches(lengths: Sequence[int], max_tokens: int,
                       rows: Sequence[int] | None = None) -> list[list[int]]:
    """Group indices so that each group's padded size stays within ``max_tokens``.

    Item ``i`` is ``rows[i]`` rows (1 by default) of at most ``lengths[i]``
    tokens; a group's padded size is its rows times its longest row. Longest
    first, so groups hold items of similar lengths; every index appears
    exactly once; an item over the budget forms its own group.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    rows = [1] * len(lengths) if rows is None else list(rows)
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    used = 0
    for i in order:
        if groups and (used + rows[i]) * lengths[groups[-1][0]] <= max_tokens:
            groups[-1].append(i)
            used += rows[i]
        else:
            groups.append([i])
            used = rows[i]
    return groups


def collate(rollouts: Sequence[Rollout], indices: list[int], pad_id: int = 0) -> MicroBatch:
    """Right-pad ``rollouts[i] for i in indices`` into a :class:`MicroBatch`, a row a segment."""
    rows = [(i, a, b) for i in indices for a, b in rollouts[i].segment_spans]
    T = max(b - a for _, a, b in rows)
    B = len(rows)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    action = torch.zeros((B, T))
    logp = torch.zeros((B, T))
    rewards = torch.zeros((B, T))
    for b, (i, start, stop) in enumerate(rows):
        r, n = rollouts[i], stop - start
        mask = r.loss_mask[start:stop]
        if n == 0 or not any(mask):
            where = "" if (start, stop) == (0, len(r.token_ids)) else f" (segment {start}:{stop})"
            raise ValueError(f"rollout {i}{where} has no action tokens to train on")
        ids[b, :n] = torch.tensor(r.token_ids[start:stop])
        attn[b, :n] = 1
        action[b, :n] = torch.tensor(mask, dtype=torch.float32)
        logp[b, :n] = torch.tensor(r.rollout_logprobs[start:stop], dtype=torch.float32)
        if stop == len(r.token_ids):
            rewards[b, n - 1 - mask[::-1].index(1)] = r.reward
    segmented = any(rollouts[i].segment_starts for i in indices)
    return MicroBatch([i for i, _, _ in rows], ids, attn, action, logp, rewards,
                      [(a, b) for _, a, b in rows] if segmented else [])


def micro_batches(
    rollouts: Sequence[Rollout], max_tokens: int, pad_id: int = 0,
    subset: Sequence[int] | None = None,
) -> list[MicroBatch]:
    """Plan and collate micro-batches of ``rollouts`` under ``max_tokens``.

    With ``subset`` only those rollouts are micro-batched (planned on their
    own); ``MicroBatch.indices`` are positions in ``rollouts`` either way. The
    segments of a rollout stay in one micro-batch (its GAE links them).
    """
    subset = list(range(len(rollouts))) if subset is None else list(subset)
    spans = [rollouts[i].segment_spans for i in subset]
    plan = plan_micro_batches([max(b - a for a, b in s) for s in spans], max_tokens,
                              [len(s) for s in spans])
    return [collate(rollouts, [subset[j] for j in group], pad_id) for group in plan]


def split_minibatches(num_rollouts: int, parts: int) -> list[list[int]]:
    """Cut ``range(num_rollouts)`` into ``min(parts, num_rollouts)`` contiguous parts.

    Sizes differ by at most one (the first parts are the larger), in batch order.

    >>> split_minibatches(5, 2), split_minibatches(2, 4)
    ([[0, 1, 2], [3, 4]], [[0], [1]])
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    parts = max(1, min(parts, num_rollouts))
    size, extra = divmod(num_rollouts, parts)
    out, start = [], 0
    for p in range(parts):
        stop = start + size + (p < extra)
        out.append(list(range(start, stop)))
        start = stop
    return out


ENTROPY_CHUNK = 512
"""Positions whose entropy is computed together (bounds its temporaries)."""


def per_rollout_rows(tensors_BT: Sequence[torch.Tensor], mbs: Sequence[MicroBatch],
                     rollouts: Sequence[Rollout]) -> list[torch.Tensor]:
    """Un-pad micro-batch rows: ``out[i]`` is rollout ``i``'s, ``[len(token_ids)]``.

    A rollout of several segments gets its rows laid end to end.
    """
    out: list[torch.Tensor] = [torch.empty(0)] * len(rollouts)
    for x_BT, mb in zip(tensors_BT, mbs, strict=True):
        for i, x in unpad(x_BT, mb).items():
            out[i] = x
    return out


def unpad(x_BT: torch.Tensor, mb: MicroBatch) -> dict[int, torch.Tensor]:
    """``{rollout: its tokens' values}`` of a micro-batch's ``[B, T]`` tensor (segments joined)."""
    rows: dict[int, list[torch.Tensor]] = {}
    for b, (i, (start, stop)) in enumerate(zip(mb.indices, mb.row_spans(), strict=True)):
        rows.setdefault(i, []).append(x_BT[b, :stop - start])
    return {i: x[0] if len(x) == 1 else torch.cat(x) for i, x in rows.items()}


def rows_of(per_rollout: Sequence[torch.Tensor] | Mapping[int, torch.Tensor],
            mb: MicroBatch) -> torch.Tensor:
    """``[B, T]`` of ``mb``'s rows cut from per-rollout 1-d tensors (right-padded with 0).

    ``per_rollout[i]``: rollout ``i``'s values, one a token (segments end to end).
    """
    T = mb.input_ids_BT.shape[1]
    return pad_rows([per_rollout[i][a:b] for i, (a, b) in zip(mb.indices, mb.row_spans(),
                                                             strict=True)], T)


def pad_rows(rows: Sequence[torch.Tensor], T: int) -> torch.Tensor:
    """Right-pad 1-d rows with 0 into ``[len(rows), T]``."""
    return torch.stack([F.pad(r, (0, T - r.numel())) for r in rows])


def _tempered(logits_NV: torch.Tensor, temperature: float) -> torch.Tensor:
    # As sao_gym.inference.sampling.sample_next: log_softmax(logits / T).
    logits_NV = logits_NV.float()
    return logits_NV if temperature == 1.0 else logits_NV / temperature


def token_logprobs(logits_BKV: torch.Tensor, input_ids_BT: torch.Tensor,
                   temperature: float = 1.0, start: int = 0) -> torch.Tensor:
    """``out[b, t] = log p_T(token t | tokens < t)``, differentiable; ``[B, T]``.

    ``logits_BKV`` holds the model's logits at positions ``start .. T-1`` (all
    of them by default; a model called with ``logits_to_keep=T - start`` returns
    just those), so ``out[:, :start + 1]`` is 0: those tokens are not scored.
    ``p_T = softmax(logits / temperature)``: the distribution the sampler drew
    from at that temperature (no top-p), so the result is comparable with the
    sampler's recorded logprobs.

    Computed as ``logit[token] - logsumexp(logits)``: the backward pass keeps
    the logits it already has, no log-softmax copy of them (a ``[K, vocab]``
    tensor per micro-batch row).
    """
    B, K, V = logits_BKV.shape
    T = input_ids_BT.shape[1]
    if start + K != T:
        raise ValueError(f"logits cover positions {start}..{start + K - 1}, "
                         f"the tokens 0..{T - 1}")
    x = _tempered(logits_BKV[:, :-1], temperature)
    picked = x.gather(-1, input_ids_BT[:, start + 1:, None]).squeeze(-1)
    return F.pad(picked - torch.logsumexp(x, dim=-1), (start + 1, 0))


@torch.no_grad()
def token_entropy(logits_BKV: torch.Tensor, mask_BT: torch.Tensor,
                  temperature: float = 1.0, start: int = 0) -> torch.Tensor:
    """Entropy of the (tempered) next-token distribution that produced each masked token.

    ``out[b, t]`` for ``mask_BT[b, t] > 0`` (0 elsewhere), ``[B, T]`` fp32;
    ``logits_BKV`` as in :func:`token_logprobs` (positions ``start .. T-1``).
    """
    out = torch.zeros(mask_BT.shape, dtype=torch.float32, device=logits_BKV.device)
    rows = (mask_BT[:, start + 1:] > 0).nonzero()
    for chunk in rows.split(ENTROPY_CHUNK):  # a few [chunk, vocab] temporaries at a time
        logp_NV = torch.log_softmax(_tempered(logits_BKV[chunk[:, 0], chunk[:, 1]],
                                              temperature), dim=-1)
        out[chunk[:, 0], chunk[:, 1] + start + 1] = -(logp_NV.exp() * logp_NV).sum(-1)
    return out


def masked_mean(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Mean of ``x_BT`` over ``mask_BT > 0`` (0 when nothing is masked in)."""
    sel = mask_BT > 0
    return x_BT[sel].mean() if bool(sel.any()) else x_BT.new_zeros(())


def mean_entropy(logits_BKV: torch.Tensor, mask_BT: torch.Tensor,
                 temperature: float = 1.0, start: int = 0) -> torch.Tensor:
    """Mean of :func:`token_entropy` over the masked tokens."""
    return masked_mean(token_entropy(logits_BKV, mask_BT, temperature, start), mask_BT)


def first_scored_position(mb: MicroBatch) -> int:
    """The first position whose logits a micro-batch's loss reads.

    An action token at ``t`` is scored from the logits at ``t - 1``, so the
    loss needs logits from one before the earliest action token of any row on:
    ``logits_to_keep = T - first_scored_position(mb)``.
    """
    first = mb.action_mask_BT.argmax(dim=1)  # each row has an action token (collate)
    return max(0, int(first.min()) - 1)
