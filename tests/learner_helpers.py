"""Synthetic rollouts for learner tests, with exact sampler logprobs."""

from __future__ import annotations

import random

import torch

from sao_gym.types import Rollout, StopReason


def segments_rollout(segments, reward, *, task_id="t", truncated=False, logprobs=None):
    """A rollout from ``[(token_ids, is_action), ...]`` segments."""
    ids, mask = [], []
    for toks, is_action in segments:
        ids += list(toks)
        mask += [int(is_action)] * len(toks)
    lp = logprobs if logprobs is not None else [0.0] * len(ids)
    return Rollout(
        token_ids=ids, loss_mask=mask, rollout_logprobs=[x if m else 0.0 for x, m in
                                                         zip(lp, mask, strict=True)],
        policy_versions=[0 if m else -1 for m in mask], reward=float(reward),
        terminated=not truncated, truncated=truncated,
        stop_reason=StopReason.MAX_TURNS if truncated else StopReason.TERMINATED,
        infra_failure=False, messages=[], env_id="test/Synthetic-v0", task_id=task_id,
        seed=None, metrics={})


@torch.no_grad()
def sampler_logprobs(model, token_ids):
    """log p(token t | < t) under ``model`` (what an exact sampler would record)."""
    logits = model(torch.tensor([token_ids])).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    return [0.0] + [logp[t - 1, token_ids[t]].item() for t in range(1, len(token_ids))]


def random_multiturn(model, rng: random.Random, reward, *, task_id="t", vocab=1000,
                     truncated=False):
    """prompt, then 1-3 turns of (action, observation), with exact logprobs."""
    segs = [([rng.randrange(vocab) for _ in range(rng.randint(3, 8))], False)]
    for turn in range(rng.randint(1, 3)):
        segs.append(([rng.randrange(vocab) for _ in range(rng.randint(2, 6))], True))
        if turn < 2:
            segs.append(([rng.randrange(vocab) for _ in range(rng.randint(1, 4))], False))
    ids = [t for s, _ in segs for t in s]
    return segments_rollout(segs, reward, task_id=task_id, truncated=truncated,
                            logprobs=sampler_logprobs(model, ids))
