"""Rollouts of several segments (a harness that rewrote its history) in the learner."""

import dataclasses

import pytest
import torch

from sao_gym.learner.batching import collate, micro_batches, plan_micro_batches, unpad
from sao_gym.learner.learner import LearnerConfig, build_learner
from tests.learner.helpers import sampler_logprobs, segments_rollout, table_learner


def two_segments(reward=1.0, *, truncated=False, logprobs=None, group_id=None):
    """Segment 1: prompt 10, action 11 12, observation 13, action 14;
    segment 2 (its own prompt): 15 16, action 17 18."""
    ro = segments_rollout([([10], False), ([11, 12], True), ([13], False), ([14], True),
                           ([15, 16], False), ([17, 18], True)], reward, truncated=truncated,
                          logprobs=logprobs, group_id=group_id)
    return dataclasses.replace(ro, segment_starts=[5])


def test_a_rollout_checks_and_spans_its_segments():
    ro = two_segments()
    assert ro.segment_spans == [(0, 5), (5, 9)]
    assert segments_rollout([([1], False), ([2], True)], 0.0).segment_spans == [(0, 2)]
    for bad in ([0], [9], [5, 5], [6, 3]):
        with pytest.raises(ValueError, match="segment_starts"):
            dataclasses.replace(ro, segment_starts=bad)
    assert type(ro).from_dict(ro.to_dict()) == ro


def test_collate_gives_each_segment_a_row_and_the_reward_to_the_last():
    one = segments_rollout([([20, 21], False), ([22], True)], 0.5)
    mb = collate([two_segments(reward=2.0), one], [0, 1], pad_id=0)
    assert mb.indices == [0, 0, 1]
    assert mb.spans == [(0, 5), (5, 9), (0, 3)]
    assert mb.input_ids_BT.tolist() == [[10, 11, 12, 13, 14], [15, 16, 17, 18, 0],
                                        [20, 21, 22, 0, 0]]
    assert mb.attention_mask_BT.tolist() == [[1] * 5, [1] * 4 + [0], [1] * 3 + [0] * 2]
    assert mb.action_mask_BT.tolist() == [[0, 1, 1, 0, 1], [0, 0, 1, 1, 0], [0, 0, 1, 0, 0]]
    assert mb.rewards_BT.tolist() == [[0] * 5, [0, 0, 0, 2.0, 0], [0, 0, 0.5, 0, 0]]
    joined = unpad(mb.input_ids_BT, mb)
    assert joined[0].tolist() == list(range(10, 19)) and joined[1].tolist() == [20, 21, 22]
    # without segmented rollouts nothing changes: no spans, one row a rollout
    plain = collate([one, one], [0, 1])
    assert plain.indices == [0, 1] and plain.spans == []
    assert plain.row_spans() == [(0, 3), (0, 3)]


def test_a_segment_without_action_tokens_is_refused():
    ro = dataclasses.replace(segments_rollout([([1], False), ([2], True), ([3, 4], False)], 0.0),
                             segment_starts=[2])
    with pytest.raises(ValueError, match=r"rollout 0 \(segment 2:4\) has no action tokens"):
        collate([ro], [0])


def test_the_planner_counts_every_row_and_keeps_segments_together():
    # items: (rows, longest row); budget 12 tokens of padded [rows, longest]
    assert plan_micro_batches([4, 3, 3], 12, rows=[2, 1, 1]) == [[0, 1], [2]]
    assert plan_micro_batches([4, 3, 3], 12) == [[0, 1, 2]]
    mbs = micro_batches([two_segments(), segments_rollout([([1], False), ([2], True)], 0.0)],
                        max_tokens=10)
    assert [mb.indices for mb in mbs] == [[0, 0], [1]]


@pytest.mark.parametrize("truncated", [False, True])
def test_gae_links_the_last_action_of_a_segment_to_the_first_of_the_next(tiny_model_path,
                                                                          truncated):
    # the critic's value after each token; the value before an action token is the value
    # after the token before it: V(11) = 0.1, V(12) = 0.2, V(14) = 0.3, V(17) = 0.4,
    # V(18) = 0.5. 14 -> 9.0 is the value after segment 1's last action in segment 1's
    # context: a state the episode never continues from, so never read.
    table = {10: 0.1, 11: 0.2, 12: 6.0, 13: 0.3, 14: 9.0, 15: 3.0, 16: 0.4, 17: 0.5, 18: 7.0}
    learner = table_learner(tiny_model_path, table, critic_updates=1)
    m = learner.update([two_segments(reward=1.0, truncated=truncated)], trace=[0])
    # one chain of 5 action tokens, lambda = 1 - 1 / (1.5 * 5) = 13/15, gamma = 1; the
    # episode ends on an action token, so a truncated one has nothing to bootstrap from
    lam = 13 / 15
    d4 = 1.0 + 0.0 - 0.5   # the reward on the last action token of the last segment
    d3 = 0.5 - 0.4
    d2 = 0.4 - 0.3         # across the boundary: V(first action of segment 2) - V(14)
    d1 = 0.3 - 0.2
    d0 = 0.2 - 0.1
    a4 = d4
    a3 = d3 + lam * a4
    a2 = d2 + lam * a3
    a1 = d1 + lam * a2
    a0 = d0 + lam * a1
    trace = learner.trace[0]
    assert trace["advantage"] == pytest.approx([0, a0, a1, 0, a2, 0, 0, a3, a4], abs=1e-6)
    # critic lambda 1: every return is the episode's reward
    assert trace["return"] == pytest.approx([0, 1, 1, 0, 1, 0, 0, 1, 1], abs=1e-6)
    assert trace["value"] == pytest.approx([0, .1, .2, 0, .3, 0, 0, .4, .5], abs=1e-6)
    expected_loss = 0.5 * sum((v - 1.0) ** 2 for v in (.1, .2, .3, .4, .5)) / 5
    assert m["loss/value"] == pytest.approx(expected_loss, abs=1e-6)
    assert m["learner/action_tokens"] == 5 and m["learner/tokens"] == 9


def test_each_segment_is_scored_in_its_own_context(tiny_model_path):
    learner = build_learner("sao", tiny_model_path, LearnerConfig(critic_warmup_steps=0))
    first, second = list(range(10, 15)), list(range(15, 19))
    lp = sampler_logprobs(learner.policy, first) + sampler_logprobs(learner.policy, second)
    learner.update([two_segments(logprobs=lp)], trace=[0])
    scored = learner.trace[0]["logprob"]
    mask = two_segments().loss_mask
    assert scored == pytest.approx([x if m else 0.0 for x, m in zip(lp, mask, strict=True)],
                                   abs=1e-4)
    # scored as one sequence the second segment's tokens would read the first's
    joined = sampler_logprobs(learner.policy, first + second)
    assert abs(joined[7] - lp[7]) > 1e-3
    assert learner.trace[0]["ratio"][7] == pytest.approx(1.0, abs=1e-3)


def test_grpo_counts_a_segmented_episode_once_in_its_group(tiny_model_path):
    learner = build_learner("grpo", tiny_model_path, LearnerConfig(), group_size=2)
    one = segments_rollout([([20, 21], False), ([22, 23], True)], 0.0, group_id=7)
    m = learner.update([two_segments(reward=1.0, group_id=7), one], trace=[0, 1])
    # rewards 1 and 0: advantages +-1/sqrt(2) * ... (unbiased std of {1, 0} is 1/sqrt(2))
    adv = (1.0 - 0.5) / (2 ** -0.5 + 1e-6)
    got = torch.tensor(learner.trace[0]["advantage"])
    assert got[got != 0].tolist() == pytest.approx([adv] * 5, abs=1e-5)
    assert torch.tensor(learner.trace[1]["advantage"]).min().item() == pytest.approx(-adv,
                                                                                   abs=1e-5)
    assert m["learner/action_tokens"] == 7
