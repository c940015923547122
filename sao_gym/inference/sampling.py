"""Per-row temperature / top-p sampling with exact sampler logprobs.

One pure function, :func:`sample_next`, used by :class:`~sao_gym.inference.hf.backend.HFBackend`
on every decode step. Each row has its own temperature and top-p and brings
its own uniform random number, drawn from that request's generator: a row's
sample therefore depends only on its logits and its own random stream, never
on which other rows share the batch.

The logprob returned for a sampled token is its log-probability under the
distribution it was actually drawn from: ``log_softmax(logits / T)``
restricted to the top-p nucleus and renormalised. For greedy rows
(``T == 0``) the token is the argmax and the logprob is the untempered
``log_softmax``. This is the denominator of SAO's importance ratio, so it must
match what the learner would compute for the same distribution.
"""

from __future__ import annotations

import torch


def sample_next(
    logits_BV: torch.Tensor,
    temperature_B: torch.Tensor,
    top_p_B: torch.Tensor,
    uniform_B: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row by inverse-CDF over the sorted, top-p-filtered distribution.

    Args:
        logits_BV: next-token logits, one row per sequence.
        temperature_B: per-row temperature; 0 means greedy.
        top_p_B: per-row nucleus mass in (0, 1]. The nucleus is the smallest
            set of most likely tokens whose mass reaches ``top_p`` (the most
            likely token is always in it); ``top_p == 1`` keeps every token.
        uniform_B: per-row uniform numbers in [0, 1) (ignored for greedy rows).

    Returns:
        ``(tokens_B, logprobs_B)``: sampled ids (int64) and their sampler
        logprobs (float64).

    Tokens are ordered by descending probability with a stable sort (ties by
    lower id), so a row's result is a deterministic function of its inputs.

    """
    greedy_B = temperature_B <= 0
    temp_B = torch.where(greedy_B, torch.ones_like(temperature_B), temperature_B)
    logp_BV = torch.log_softmax(logits_BV.double() / temp_B.double()[:, None], dim=-1)
    sorted_logp_BV, order_BV = torch.sort(logp_BV, dim=-1, descending=True, stable=True)
    probs_BV = sorted_logp_BV.exp()
    cum_BV = probs_BV.cumsum(dim=-1)
    # A token is in the nucleus when the mass strictly before it is < top_p.
    # top_p == 1 keeps everything (cumulative rounding must not drop the tail).
    keep_BV = ((cum_BV - probs_BV) < top_p_B.double()[:, None]) | (top_p_B >= 1.0)[:, None]
    n_keep_B = keep_BV.sum(dim=-1)
    log_mass_B = torch.logsumexp(sorted_logp_BV.masked_fill(~keep_BV, float("-inf")), dim=-1)
    log_mass_B = torch.where(top_p_B >= 1.0, torch.zeros_like(log_mass_B), log_mass_B)

    cdf_BV = (probs_BV * keep_BV).cumsum(dim=-1)
    target_B1 = (uniform_B.double() * cdf_BV[:, -1])[:, None]
    idx_B1 = torch.searchsorted(cdf_BV, target_B1, right=True)
    idx_B1 = torch.minimum(idx_B1, (n_keep_B - 1)[:, None])
    idx_B1 = torch.where(greedy_B[:, None], torch.zeros_like(idx_B1), idx_B1)

    tokens_B = order_BV.gather(1, idx_B1).squeeze(1)
    logprobs_B = sorted_logp_BV.gather(1, idx_B1).squeeze(1)
    logprobs_B = torch.where(greedy_B, logprobs_B, logprobs_B - log_mass_B)
    return tokens_B, logprobs_B
