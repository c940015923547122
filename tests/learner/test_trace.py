"""``Learner.update(trace=...)``: the per-token quantities of a step, against slow references."""

import dataclasses
import math

import pytest

from sao_gym.learner.learner import LearnerConfig, build_learner
from tests.learner.helpers import random_batch, sampler_logprobs
from tests.learner.test_sao import ref_gae


def _ref_values(learner, ro):
    """(values, returns) at the action tokens of ``ro`` (critic lambda 1, gamma 1), slowly."""
    import torch

    with torch.no_grad():
        ids = torch.tensor([ro.token_ids])
        after = learner.critic.values_after(ids, torch.ones_like(ids))[0].tolist()
    v = [x if m else 0.0 for x, m in zip([0.0] + after[:-1], ro.loss_mask, strict=True)]
    last = max(t for t, m in enumerate(ro.loss_mask) if m)
    rewards = [ro.reward if t == last else 0.0 for t in range(len(v))]
    _, ret = ref_gae(rewards, v, ro.loss_mask, 1.0, 1.0, 0.0)
    return v, ret


def _close(got, want, mask, tol=1e-4):
    return all(abs(g - w) <= tol for g, w, m in zip(got, want, mask, strict=True) if m)


def test_sao_trace_matches_slow_references(tiny_model_path):
    cfg = LearnerConfig(lr=1e-4, critic_warmup_steps=0, critic_updates=1,
                        max_tokens_per_microbatch=64)  # several micro-batches
    learner = build_learner("sao", tiny_model_path, cfg)
    rollouts = random_batch(learner.policy, 8, seed=3)
    # rollout 5's sampler claims a much likelier first action token: ratio e^-3, masked
    r5 = rollouts[5]
    first = r5.loss_mask.index(1)
    lps = list(r5.rollout_logprobs)
    lps[first] += 3.0
    rollouts[5] = dataclasses.replace(r5, rollout_logprobs=lps)
    traced = [0, 5, 7]
    want_lp = {i: sampler_logprobs(learner.policy, rollouts[i].token_ids) for i in traced}
    want_v = {i: _ref_values(learner, rollouts[i]) for i in traced}
    metrics = learner.update(rollouts, trace=[7, 0, 5, 0])
    assert sorted(learner.trace) == traced
    for i in traced:
        ro, row = rollouts[i], learner.trace[i]
        mask = ro.loss_mask
        assert set(row) == {"advantage", "value", "return", "logprob", "ratio", "dis_mask"}
        assert all(len(x) == len(ro.token_ids) for x in row.values())
        assert _close(row["logprob"], want_lp[i], mask)
        ratio = [math.exp(a - b) for a, b in zip(want_lp[i], ro.rollout_logprobs, strict=True)]
        assert _close(row["ratio"], ratio, mask, 1e-3)
        assert row["dis_mask"] == [int(bool(m) and 0.7 < r < 6.0)
                                   for r, m in zip(ratio, mask, strict=True)]
        v, ret = want_v[i]
        assert _close(row["value"], v, mask)
        assert _close(row["return"], ret, mask)
        last = max(t for t, m in enumerate(mask) if m)
        rewards = [ro.reward if t == last else 0.0 for t in range(len(mask))]
        adv, _ = ref_gae(rewards, v, mask, 1.0, 1 - 1 / (1.5 * sum(mask)), 0.0)  # policy lambda
        assert _close(row["advantage"], adv, mask)
        assert all(x == 0 for x, m in zip(row["advantage"], mask, strict=True) if not m)
    assert learner.trace[5]["dis_mask"][first] == 0
    assert sum(learner.trace[0]["dis_mask"]) == sum(rollouts[0].loss_mask)  # exact sampler
    assert metrics["learner/action_tokens"] == sum(sum(r.loss_mask) for r in rollouts)
    # every rollout traced: the trace's advantages are the ones the step's metrics report
    metrics = learner.update(rollouts, trace=range(len(rollouts)))
    adv = [a for i, ro in enumerate(rollouts)
           for a, m in zip(learner.trace[i]["advantage"], ro.loss_mask, strict=True) if m]
    assert sum(adv) / len(adv) == pytest.approx(metrics["advantage/mean"], abs=1e-6)


def test_critic_free_and_warmup_steps_trace_what_they_computed(tiny_model_path):
    learner = build_learner("running_mean", tiny_model_path, LearnerConfig(lr=1e-4))
    rollouts = random_batch(learner.policy, 4, seed=1)
    learner.update(rollouts, trace=[1])
    row = learner.trace[1]
    assert set(row) == {"advantage", "logprob", "ratio", "dis_mask"}  # no critic
    ro = rollouts[1]
    assert row["advantage"] == [ro.reward * m for m in ro.loss_mask]  # no history yet
    learner.update(rollouts)
    assert learner.trace == {}  # a step traces only what it was asked

    warm = build_learner("sao", tiny_model_path, LearnerConfig(lr=1e-4, critic_warmup_steps=2))
    warm.update(rollouts, trace=[0])
    assert set(warm.trace[0]) == {"advantage", "value", "return"}  # no policy pass yet


def test_bad_trace_positions_are_refused(tiny_model_path):
    learner = build_learner("running_mean", tiny_model_path, LearnerConfig(lr=1e-4))
    rollouts = random_batch(learner.policy, 2, seed=1)
    with pytest.raises(ValueError, match=r"trace positions must be in \[0, 2\)"):
        learner.update(rollouts, trace=[2])
    assert learner.steps_done == 0
