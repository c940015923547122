"""Micro-batching, minibatch splits, and token logprobs/entropy at a temperature."""

import random

import pytest
import torch

from sao_gym.inference.sampling import sample_next
from sao_gym.learner.batching import (
    collate,
    first_scored_position,
    mean_entropy,
    micro_batches,
    pad_rows,
    per_rollout_rows,
    plan_micro_batches,
    split_minibatches,
    token_logprobs,
)
from sao_gym.learner.step_metrics import StepMetrics, explained_variance_of
from tests.learner.helpers import segments_rollout


def test_plan_respects_budget_and_covers_every_index_once():
    rng = random.Random(0)
    for _ in range(50):
        lengths = [rng.randint(1, 300) for _ in range(rng.randint(1, 40))]
        budget = rng.randint(50, 1200)
        plan = plan_micro_batches(lengths, budget)
        assert sorted(i for g in plan for i in g) == list(range(len(lengths)))
        for g in plan:
            longest = max(lengths[i] for i in g)
            assert len(g) * longest <= budget or len(g) == 1
    assert plan_micro_batches([10, 500, 12, 11], 40) == [[1], [2, 3, 0]]
    with pytest.raises(ValueError):
        plan_micro_batches([1], 0)


def test_collate_layout_and_reward_on_last_action_token():
    r1 = segments_rollout([([1, 2], False), ([3, 4], True), ([5], False), ([6], True),
                           ([7], False)], reward=2.5)
    r2 = segments_rollout([([8], False), ([9], True)], reward=-1.0)
    mb = collate([r1, r2], [0, 1], pad_id=0)
    assert mb.input_ids_BT.tolist() == [[1, 2, 3, 4, 5, 6, 7], [8, 9, 0, 0, 0, 0, 0]]
    assert mb.action_mask_BT.tolist() == [[0, 0, 1, 1, 0, 1, 0], [0, 1, 0, 0, 0, 0, 0]]
    assert mb.rewards_BT.tolist() == [[0, 0, 0, 0, 0, 2.5, 0], [0, -1.0, 0, 0, 0, 0, 0]]
    assert mb.num_tokens == 9
    with pytest.raises(ValueError, match="no action tokens"):
        collate([segments_rollout([([1, 2], False)], 0.0)], [0])
    assert [m.indices for m in micro_batches([r1, r2, r2], 14)] == [[0, 1], [2]]


def test_micro_batches_of_a_subset_keep_batch_indices():
    short = segments_rollout([([1], False), ([2], True)], 0.0)
    long = segments_rollout([([1, 2, 3], False), ([4, 5, 6], True)], 0.0)
    batch = [long, short, short, long, short]
    # planned on the subset alone: longest first, indices are positions in the batch
    assert [m.indices for m in micro_batches(batch, 6, subset=[1, 3, 4])] == [[3], [1, 4]]
    assert [m.indices for m in micro_batches(batch, 100, subset=[4, 2])] == [[4, 2]]


def test_split_minibatches_contiguous_and_balanced():
    assert split_minibatches(8, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert split_minibatches(5, 3) == [[0, 1], [2, 3], [4]]
    assert split_minibatches(3, 1) == [[0, 1, 2]]
    assert split_minibatches(2, 4) == [[0], [1]]  # no empty parts
    for n in range(1, 12):
        for k in range(1, 6):
            parts = split_minibatches(n, k)
            assert [i for p in parts for i in p] == list(range(n))
            assert max(map(len, parts)) - min(map(len, parts)) <= 1
    with pytest.raises(ValueError):
        split_minibatches(3, 0)


def test_token_logprobs_and_entropy_match_a_manual_computation():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, requires_grad=True)
    ids = torch.randint(0, 11, (2, 5))
    out = token_logprobs(logits, ids)
    logp = torch.log_softmax(logits.detach(), -1)
    for b in range(2):
        assert out[b, 0] == 0
        for t in range(1, 5):
            assert torch.isclose(out[b, t], logp[b, t - 1, ids[b, t]], atol=1e-6)
    out.sum().backward()
    assert logits.grad is not None and logits.grad[:, -1].abs().sum() == 0
    mask = torch.tensor([[0, 1, 0, 0, 1], [0, 0, 0, 1, 0]])
    ent = [-(logp[b, t - 1].exp() * logp[b, t - 1]).sum() for b, t in [(0, 1), (0, 4), (1, 3)]]
    assert torch.isclose(mean_entropy(logits, mask), torch.stack(ent).mean(), atol=1e-6)


def test_tempered_logprobs_and_entropy_are_the_samplers_distribution():
    torch.manual_seed(1)
    logits = torch.randn(1, 4, 7) * 3
    ids = torch.tensor([[0, 3, 5, 2]])
    T = 0.7
    out = token_logprobs(logits, ids, temperature=T)
    for t in range(1, 4):
        # by hand: log softmax(z / T)[token]
        z = logits[0, t - 1].double() / T
        by_hand = z[ids[0, t]] - torch.logsumexp(z, 0)
        assert out[0, t].item() == pytest.approx(by_hand.item(), abs=1e-5)
        # and exactly what the sampler records for that token (top-p 1)
        u = torch.tensor([0.5])
        tok, lp = sample_next(logits[0, t - 1][None], torch.tensor([T]), torch.tensor([1.0]), u)
        assert token_logprobs(logits[:, [t - 1, t - 1]], torch.stack(
            [tok, tok], 1), temperature=T)[0, 1].item() == pytest.approx(lp.item(), abs=1e-5)
    assert not torch.allclose(out, token_logprobs(logits, ids))  # T matters
    logp = torch.log_softmax(logits[0].double() / T, -1)
    ent = -(logp.exp() * logp).sum(-1)
    mask = torch.tensor([[0, 1, 1, 0]])
    assert mean_entropy(logits, mask, temperature=T).item() == pytest.approx(
        ent[:2].mean().item(), abs=1e-5)


def test_docstring_examples():
    import doctest

    from sao_gym.learner import batching

    result = doctest.testmod(batching)
    assert result.attempted > 0 and result.failed == 0


def test_logits_of_the_scored_positions_only_give_the_same_logprobs_and_entropy():
    torch.manual_seed(2)
    logits = torch.randn(2, 7, 11)
    ids = torch.randint(0, 11, (2, 7))
    mask = torch.tensor([[0, 0, 0, 1, 1, 0, 1], [0, 0, 0, 0, 1, 1, 0]])
    full = token_logprobs(logits, ids, temperature=0.8)
    for start in (0, 1, 2):
        part = token_logprobs(logits[:, start:], ids, temperature=0.8, start=start)
        assert (part[:, :start + 1] == 0).all()
        torch.testing.assert_close(part[:, start + 1:], full[:, start + 1:])
        assert mean_entropy(logits[:, start:], mask, 0.8, start).item() == pytest.approx(
            mean_entropy(logits, mask, 0.8).item(), abs=1e-6)
    with pytest.raises(ValueError, match="positions"):
        token_logprobs(logits[:, 2:], ids, start=1)


def test_first_scored_position_is_one_before_the_earliest_action_token():
    rows = [segments_rollout([([5, 6, 7, 8], False), ([9, 10], True)], 1.0),
            segments_rollout([([5, 6, 7], False), ([9], True), ([4], False), ([3], True)], 0.0)]
    (mb,) = micro_batches(rows, 1 << 10)
    assert first_scored_position(mb) == 2  # row 2's first action token sits at 3
    (mb,) = micro_batches([segments_rollout([([9], True)], 1.0)], 1 << 10)
    assert first_scored_position(mb) == 0


def test_per_rollout_rows_unpad_and_pad_rows_restores_them():
    lengths = [5, 2, 9, 3]
    rollouts = [segments_rollout([(list(range(1, n)), False), ([n], True)], reward=0.0)
                for n in lengths]
    mbs = micro_batches(rollouts, max_tokens=12)
    assert len(mbs) > 1  # rows come back from several micro-batches
    # each padded row holds 10 * (rollout index) + position
    tensors = [torch.stack([torch.arange(mb.input_ids_BT.shape[1]) + 10.0 * i
                            for i in mb.indices]) for mb in mbs]
    rows = per_rollout_rows(tensors, mbs, rollouts)
    for i, n in enumerate(lengths):
        assert rows[i].tolist() == [10.0 * i + t for t in range(n)]
    padded = pad_rows([rows[1], rows[3]], 4)
    assert padded.tolist() == [[10, 11, 0, 0], [30, 31, 32, 0]]


def test_step_metrics_weight_by_tokens_and_keep_maxima():
    m = StepMetrics()
    m.add({"loss": 1.0, "ratio_max": 1.5}, weight=3, prefix="p/")
    m.add({"loss": 3.0, "ratio_max": 1.2}, weight=1, prefix="p/")
    assert m.means() == pytest.approx({"p/loss": (3 * 1.0 + 1 * 3.0) / 4, "p/ratio_max": 1.5})


def test_explained_variance_counts_action_positions_only():
    r = segments_rollout([([1, 2], False), ([3, 4, 5], True)], reward=0.0)
    mbs = micro_batches([r], max_tokens=64)
    returns = [torch.tensor([[9.0, -9.0, 1.0, 2.0, 3.0]])]
    # exact on the action positions, far off on the observation ones: 1
    values = [torch.tensor([[-50.0, 70.0, 1.0, 2.0, 3.0]])]
    assert explained_variance_of(values, returns, mbs) == pytest.approx(1.0)
    # predicting the mean of the action returns (2.0): explained variance 0
    values = [torch.tensor([[0.0, 0.0, 2.0, 2.0, 2.0]])]
    assert explained_variance_of(values, returns, mbs) == pytest.approx(0.0, abs=1e-6)
