"""Synthetic rollouts and a controllable critic for learner tests."""

from __future__ import annotations

import random
from types import SimpleNamespace

import torch
from torch import nn

from sao_gym.learner.critic import ValueModel
from sao_gym.types import Rollout, StopReason


def segments_rollout(segments, reward, *, task_id="t", truncated=False, logprobs=None,
                     group_id=None):
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
        seed=None, metrics={}, group_id=group_id)


@torch.no_grad()
def sampler_logprobs(model, token_ids, temperature=1.0):
    """log p_T(token t | < t) under ``model`` (what an exact sampler would record)."""
    logits = model(torch.tensor([token_ids])).logits[0].double() / temperature
    logp = torch.log_softmax(logits, -1)
    return [0.0] + [logp[t - 1, token_ids[t]].item() for t in range(1, len(token_ids))]


def random_multiturn(model, rng: random.Random, reward, *, task_id="t", vocab=1000,
                     truncated=False, group_id=None):
    """prompt, then 1-3 turns of (action, observation), with exact logprobs."""
    segs = [([rng.randrange(vocab) for _ in range(rng.randint(3, 8))], False)]
    for turn in range(rng.randint(1, 3)):
        segs.append(([rng.randrange(vocab) for _ in range(rng.randint(2, 6))], True))
        if turn < 2:
            segs.append(([rng.randrange(vocab) for _ in range(rng.randint(1, 4))], False))
    ids = [t for s, _ in segs for t in s]
    return segments_rollout(segs, reward, task_id=task_id, truncated=truncated,
                            logprobs=sampler_logprobs(model, ids), group_id=group_id)


def random_batch(policy, n, *, seed=0, group_size=None, truncated_every=0):
    """``n`` :func:`random_multiturn` rollouts, rewards 0/1 at random; with
    ``group_size``, consecutive groups of that size share a task id."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        task = f"task{i // group_size}" if group_size else f"task{i}"
        out.append(random_multiturn(policy, rng, reward=float(rng.random() < 0.5),
                                    task_id=task,
                                    truncated=bool(truncated_every and i % truncated_every == 0)))
    return out


class TableBackbone(nn.Module):
    """A fake backbone whose hidden state at ``t`` is ``table[token t]`` (hidden size 1).

    With the head set to the identity (:func:`table_critic`), the critic's value
    after token ``t`` is exactly ``table[token t]``: values chosen by hand.
    """

    def __init__(self, table: dict[int, float], vocab: int = 1024):
        super().__init__()
        self.config = SimpleNamespace(hidden_size=1, model_type="table")
        weight = torch.zeros(vocab, 1)
        for token, value in table.items():
            weight[token, 0] = value
        self.embed = nn.Embedding(vocab, 1, _weight=weight)

    def forward(self, input_ids, attention_mask):
        return SimpleNamespace(last_hidden_state=self.embed(input_ids))


def table_critic(table: dict[int, float]) -> ValueModel:
    """A :class:`ValueModel` whose value after token ``t`` is ``table[token t]``.

    The head is the identity and frozen, so only the table entries train.
    """
    critic = ValueModel(TableBackbone(table), freeze=None)
    with torch.no_grad():
        critic.head.weight.fill_(1.0)
        critic.head.bias.zero_()
    critic.head.requires_grad_(False)
    return critic


def table_learner(policy_path, table, **cfg):
    """An SAO learner on the tiny policy with :func:`table_critic` ``table`` as its critic
    (no warm-up left: ``critic_warmup_steps`` 10, gradients unclipped)."""
    from sao_gym.learner.engine import local_engine
    from sao_gym.learner.learner import Learner, LearnerConfig
    from sao_gym.models import load_policy

    policy, tok = load_policy(policy_path)
    config = LearnerConfig(critic_warmup_steps=10, max_grad_norm=None, **cfg)
    return Learner("sao", local_engine(policy, config, config.lr),
                   local_engine(table_critic(table), config, 5 * config.lr), config,
                   pad_id=tok.pad_token_id)

