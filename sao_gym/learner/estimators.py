"""Advantage estimators: the ``advantages`` functions of algorithm records.

Each takes an :class:`AdvantageBatch` and returns one ``[B, T]`` tensor per
micro-batch (``batch.mbs``), 0 off action tokens, on the micro-batches'
device. The math is :mod:`sao_gym.learner.advantages`'; this module only
wires it to a batch:

- :func:`gae_advantages`: skip-observation GAE over the critic's values with
  the length-adaptive policy lambda (SAO, VAPO);
- :func:`group_advantages`: rewards normalised within groups of one task (GRPO);
- :func:`running_mean_advantages`: reward minus a running mean of past
  rewards (the algorithm's state, :func:`running_mean_baseline`).

An estimator of one's own usually scores each rollout and broadcasts the
score over its action tokens with :meth:`AdvantageBatch.per_rollout`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from sao_gym.learner import advantages as adv_lib
from sao_gym.learner.batching import MicroBatch, pad_rows, rows_of, unpad
from sao_gym.learner.critic import values_before
from sao_gym.types import Rollout


@dataclass(frozen=True)
class AdvantageBatch:
    """What an estimator sees of one learner step."""

    rollouts: Sequence[Rollout]
    """The step's rollouts (``MicroBatch.indices`` point into it)."""
    mbs: Sequence[MicroBatch]
    """The whole batch, micro-batched, on the learner's device."""
    config: Any
    """The :class:`~sao_gym.learner.config.LearnerConfig`."""
    values_after: Sequence[Tensor] | None = None
    """With a critic: per micro-batch, its value after each token (detached, before
    this step's critic updates; :mod:`sao_gym.learner.critic`)."""
    state: Any = None
    """The algorithm's own state (``Algorithm.state``), if it has one."""

    def per_rollout(self, scores: Sequence[float] | Tensor) -> list[Tensor]:
        """``scores[i]`` on every action token of rollout ``i``, per micro-batch."""
        device = self.mbs[0].action_mask_BT.device
        per = torch.as_tensor(scores, dtype=torch.float32, device=device)
        if per.shape != (len(self.rollouts),):
            raise ValueError(f"need one score per rollout ({len(self.rollouts)}), got shape "
                             f"{tuple(per.shape)}")
        return [per[mb.indices][:, None] * mb.action_mask_BT for mb in self.mbs]


def skip_observation_targets(rollouts: Sequence[Rollout], mb: MicroBatch, after_BT: Tensor, *,
                             gamma: float, lam: float | Tensor, bootstrap_truncated: bool
                             ) -> tuple[Tensor, Tensor, Tensor]:
    """``(advantages, returns, values)`` of one micro-batch from the critic's ``after_BT``.

    Skip-observation GAE (:func:`~sao_gym.learner.advantages.skip_observation_gae`)
    with ``lam`` (a scalar or one per row). With ``bootstrap_truncated`` a
    truncated rollout that ends on observation tokens (its final observation,
    kept by :func:`~sao_gym.rollout.run_episode`) bootstraps from the critic's
    value after its last token: the state where its next action would start,
    the kind of state the critic is trained on (the one before each turn's
    first action token). Every other rollout, and a truncated one whose final
    observation did not fit its context, ends with its reward (bootstrap 0).

    **Segments.** The rows of a rollout of several segments are laid end to
    end before the GAE, so the Bellman link runs from the last action token of
    a segment to the first action token of the next, as it runs across an
    observation: ``delta = gamma * V(first action of the next segment) - V``
    (each value from its own segment's context), and the advantage flows back
    across the boundary with ``gamma * lam``. Only the last segment carries the
    reward and may bootstrap.
    """
    mask = mb.action_mask_BT
    after_BT = after_BT.to(mask.device)
    v = values_before(after_BT) * mask
    last_action_B = mask.shape[1] - 1 - mask.flip(-1).argmax(-1)
    last_B = mb.attention_mask_BT.to(mask.device).sum(-1).long() - 1
    ends = [stop == len(rollouts[i].token_ids) for i, (_, stop) in zip(mb.indices,
                                                                       mb.row_spans(), strict=True)]
    truncated = torch.tensor([bootstrap_truncated and rollouts[i].truncated and end
                              for i, end in zip(mb.indices, ends, strict=True)],
                             device=mask.device)
    after_last_B = after_BT.gather(1, last_B[:, None]).squeeze(1)
    bootstrap = torch.where(truncated & (last_B > last_action_B), after_last_B,
                            torch.zeros_like(after_last_B))
    if not mb.spans:  # every row a whole rollout
        a, ret = adv_lib.skip_observation_gae(mb.rewards_BT, v, mask, gamma=gamma, lam=lam,
                                              bootstrap_B=bootstrap)
        return a, ret, v
    order = list(dict.fromkeys(mb.indices))  # the rollouts; their segments are laid end to end
    last_row = {i: b for b, (i, end) in enumerate(zip(mb.indices, ends, strict=True)) if end}
    first_row = {i: mb.indices.index(i) for i in order}
    T = max(len(rollouts[i].token_ids) for i in order)

    def joined(x_BT: Tensor) -> Tensor:
        rows = unpad(x_BT, mb)
        return pad_rows([rows[i] for i in order], T)

    lam_E = torch.as_tensor(lam, dtype=torch.float64, device=mask.device).reshape(-1)
    if lam_E.numel() > 1:
        lam_E = lam_E[[first_row[i] for i in order]]
    a_E, ret_E = adv_lib.skip_observation_gae(
        joined(mb.rewards_BT), joined(v), joined(mask), gamma=gamma, lam=lam_E,
        bootstrap_B=bootstrap[[last_row[i] for i in order]])
    by_rollout = dict(zip(order, a_E, strict=True)), dict(zip(order, ret_E, strict=True))
    return rows_of(by_rollout[0], mb), rows_of(by_rollout[1], mb), v


def gae_advantages(batch: AdvantageBatch) -> list[Tensor]:
    """Skip-observation GAE with lambda ``1 - 1/(lambda_alpha * action tokens)`` per rollout.

    A rollout's action tokens are all of its segments'.
    """
    if batch.values_after is None:
        raise ValueError("GAE advantages need the critic's values (an algorithm with critic=True)")
    c = batch.config
    out = []
    for mb, after_BT in zip(batch.mbs, batch.values_after, strict=True):
        lam = adv_lib.length_adaptive_lambda(
            [batch.rollouts[i].num_action_tokens for i in mb.indices], c.lambda_alpha)
        out.append(skip_observation_targets(batch.rollouts, mb, after_BT, gamma=c.gamma,
                                            lam=lam.to(mb.action_mask_BT.device),
                                            bootstrap_truncated=c.bootstrap_truncated)[0])
    return out


def group_key(rollout: Rollout) -> tuple[str, Any]:
    """The group of a rollout: its ``group_id``, else its ``task_id``."""
    if rollout.group_id is not None:
        return ("group", rollout.group_id)
    return ("task", rollout.task_id)


def group_advantages(batch: AdvantageBatch) -> list[Tensor]:
    """GRPO: ``(reward - group mean) / (group std + eps)`` on every action token."""
    rollouts = batch.rollouts
    ids = {k: i for i, k in enumerate(dict.fromkeys(group_key(r) for r in rollouts))}
    rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float32)
    group = torch.tensor([ids[group_key(r)] for r in rollouts])
    return batch.per_rollout(adv_lib.group_normalized_advantages(rewards, group))


def running_mean_baseline(config: Any) -> adv_lib.RunningMeanBaseline:
    """The running-mean algorithm's state: ``running_mean_window`` rewards (per task)."""
    return adv_lib.RunningMeanBaseline(config.running_mean_window,
                                       per_prompt=config.running_mean_per_prompt)


def running_mean_advantages(batch: AdvantageBatch) -> list[Tensor]:
    """Reward minus the mean of the task's (or all) recent rewards, then record the rewards."""
    baseline = batch.state
    return batch.per_rollout(baseline.advantages([r.task_id for r in batch.rollouts],
                                                 [r.reward for r in batch.rollouts]))


__all__ = ["AdvantageBatch", "gae_advantages", "group_advantages", "group_key",
           "running_mean_advantages", "running_mean_baseline", "skip_observation_targets"]
