"""Advantage estimators vs hand-computed values and slow plain-Python references."""

from __future__ import annotations

import doctest
import json
import math
import random
import statistics

import pytest
import torch

from sao_gym.learner import advantages
from sao_gym.learner.advantages import (
    RunningMeanBaseline,
    explained_variance,
    group_normalized_advantages,
    length_adaptive_lambda,
    skip_observation_gae,
)

F64 = torch.float64

# ---------------------------------------------------------------- references


def ref_gae(rewards, values, mask, gamma, lams, bootstrap):
    """Loop over action tokens of each row, last to first, skipping everything else."""
    adv = [[0.0] * len(row) for row in rewards]
    ret = [[0.0] * len(row) for row in rewards]
    for b in range(len(rewards)):
        next_value, next_adv = bootstrap[b], 0.0
        for t in reversed(range(len(rewards[b]))):
            if not mask[b][t]:
                continue
            delta = rewards[b][t] + gamma * next_value - values[b][t]
            adv[b][t] = delta + gamma * lams[b] * next_adv
            ret[b][t] = adv[b][t] + values[b][t]
            next_value, next_adv = values[b][t], adv[b][t]
    return adv, ret


def ragged_batch(rng, B=4):
    """Rows: prompt, then turns of (action, observation), then right padding."""
    rows = []
    for _ in range(B):
        row = [0] * rng.randint(0, 4)
        for _ in range(rng.randint(0, 4)):
            row += [1] * rng.randint(1, 6) + [0] * rng.randint(0, 5)
        rows.append(row)
    T = max(len(r) for r in rows) + rng.randint(0, 3)
    mask = [r + [0] * (T - len(r)) for r in rows]
    values = [[rng.gauss(0, 1) for _ in range(T)] for _ in range(B)]
    rewards = [[rng.gauss(0, 1) if m and rng.random() < 0.3 else 0.0 for m in row] for row in mask]
    for b in range(B):  # outcome reward on the last action token
        acts = [t for t in range(T) if mask[b][t]]
        if acts:
            rewards[b][acts[-1]] = float(rng.choice([0, 1]))
    return rewards, values, mask


# ---------------------------------------------------------------- skip-observation GAE


def test_gae_hand_example():
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 0]])
    values = torch.tensor([[9.0, 0.5, 0.6, 9.0, 9.0, 0.8, 9.0]], dtype=F64)
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]], dtype=F64)
    adv, ret = skip_observation_gae(rewards, values, mask, gamma=1.0, lam=0.5)
    # k=2: 1 - 0.8 = 0.2; k=1: (0.8 - 0.6) + 0.5*0.2 = 0.3; k=0: (0.6 - 0.5) + 0.5*0.3 = 0.25
    assert adv[0].tolist() == pytest.approx([0, 0.25, 0.3, 0, 0, 0.2, 0])
    assert ret[0].tolist() == pytest.approx([0, 0.75, 0.9, 0, 0, 1.0, 0])


CONFIGS = [
    # gamma, per-sequence lam, truncated (bootstrap given)
    (1.0, False, False),
    (0.9, False, True),
    (1.0, True, True),
    (0.97, True, False),
]


@pytest.mark.parametrize("gamma,per_seq_lam,truncated", CONFIGS)
def test_gae_matches_loop_reference_on_random_ragged_masks(gamma, per_seq_lam, truncated):
    rng = random.Random(f"{gamma}-{per_seq_lam}-{truncated}")
    for _ in range(30):  # 4 configs x 30 batches x 4 rows
        rewards, values, mask = ragged_batch(rng)
        B = len(mask)
        lams = [rng.random() for _ in range(B)] if per_seq_lam else [0.95] * B
        bootstrap = [rng.gauss(0, 1) for _ in range(B)] if truncated else [0.0] * B
        adv, ret = skip_observation_gae(
            torch.tensor(rewards, dtype=F64),
            torch.tensor(values, dtype=F64),
            torch.tensor(mask),
            gamma=gamma,
            lam=torch.tensor(lams, dtype=F64) if per_seq_lam else 0.95,
            bootstrap_B=torch.tensor(bootstrap, dtype=F64) if truncated else None,
        )
        ref_adv, ref_ret = ref_gae(rewards, values, mask, gamma, lams, bootstrap)
        torch.testing.assert_close(adv, torch.tensor(ref_adv, dtype=F64), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ret, torch.tensor(ref_ret, dtype=F64), rtol=1e-12, atol=1e-12)


def test_gae_monte_carlo_returns_and_zero_on_observations():
    rng = random.Random(7)
    for _ in range(20):
        _, values, mask = ragged_batch(rng)
        m = torch.tensor(mask, dtype=torch.bool)
        final_B = torch.tensor([rng.choice([0.0, 1.0, -0.5]) for _ in mask], dtype=F64)
        rewards = torch.zeros(m.shape, dtype=F64)
        for b in range(len(mask)):
            acts = m[b].nonzero()
            if len(acts):
                rewards[b, acts[-1]] = final_B[b]
        adv, ret = skip_observation_gae(rewards, torch.tensor(values, dtype=F64), m, lam=1.0)
        expected = torch.where(m, final_B[:, None].expand_as(rewards), 0.0)
        torch.testing.assert_close(ret, expected, rtol=0, atol=1e-12)
        assert (adv[~m] == 0).all() and (ret[~m] == 0).all()


def test_gae_ignores_values_off_action_tokens_and_keeps_dtype():
    mask = torch.tensor([[0, 1, 0, 1, 0]])
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[float("nan"), 0.5, float("inf"), 0.25, float("nan")]])
    values.requires_grad_()
    adv, ret = skip_observation_gae(rewards, values, mask.float(), lam=0.9)
    assert adv.dtype == ret.dtype == torch.float32 and not adv.requires_grad
    assert adv[0].tolist() == pytest.approx([0, (0.25 - 0.5) + 0.9 * 0.75, 0, 0.75, 0])
    assert ret[0].tolist() == pytest.approx([0, 0.25 - 0.5 + 0.9 * 0.75 + 0.5, 0, 1.0, 0])


def test_gae_row_without_action_tokens_is_all_zero():
    adv, ret = skip_observation_gae(
        torch.zeros(2, 5), torch.randn(2, 5), torch.zeros(2, 5), lam=1.0
    )
    assert (adv == 0).all() and (ret == 0).all()


@pytest.mark.parametrize("position", [0, 2, 4])
def test_gae_rejects_reward_off_action_tokens(position):
    mask = torch.tensor([[0, 1, 0, 1, 0]])  # prompt, action, observation, action, padding
    rewards = torch.zeros(1, 5)
    rewards[0, position] = 1.0
    with pytest.raises(ValueError, match="non-action position"):
        skip_observation_gae(rewards, torch.zeros(1, 5), mask, lam=1.0)


def test_gae_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        skip_observation_gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), lam=1.0)
    with pytest.raises(ValueError, match="lam"):
        skip_observation_gae(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), lam=[0.5] * 3)


# ---------------------------------------------------------------- length-adaptive lambda


def test_length_adaptive_lambda():
    lam = length_adaptive_lambda(torch.tensor([-3, 0, 1, 2, 3, 10_000]), alpha=1.5)
    assert lam.dtype == F64
    expected = [0.0, 0.0, 1 - 1 / 1.5, 1 - 1 / 3, 1 - 1 / 4.5, 1 - 1 / 15_000]
    assert lam.tolist() == pytest.approx(expected, rel=1e-15, abs=0)
    assert length_adaptive_lambda([1, 2], alpha=1.0).tolist() == [0.0, 0.5]
    assert length_adaptive_lambda([1], alpha=0.5).tolist() == [0.0]  # alpha * l < 1
    with pytest.raises(ValueError, match="alpha"):
        length_adaptive_lambda([3], alpha=0.0)


# ---------------------------------------------------------------- GRPO


def ref_group_norm(rewards, groups, eps, normalize_std):
    out = []
    for r, g in zip(rewards, groups, strict=True):
        members = [x for x, h in zip(rewards, groups, strict=True) if h == g]
        std = statistics.stdev(members) if len(members) > 1 else 0.0
        centered = r - statistics.fmean(members)
        out.append(centered / (std + eps) if normalize_std else centered)
    return out


@pytest.mark.parametrize("normalize_std", [True, False])
@pytest.mark.parametrize("seed", range(10))
def test_group_normalized_matches_reference(seed, normalize_std):
    rng = random.Random(seed)
    B = rng.randint(1, 20)
    groups = [rng.choice([7, -2, 100, 3]) for _ in range(B)]
    rewards = [rng.choice([0.0, 1.0, rng.random()]) for _ in range(B)]
    out = group_normalized_advantages(
        torch.tensor(rewards, dtype=F64), torch.tensor(groups), normalize_std=normalize_std
    )
    ref = ref_group_norm(rewards, groups, 1e-6, normalize_std)
    assert out.tolist() == pytest.approx(ref, rel=1e-9, abs=1e-12)


def test_group_normalized_hand_values():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 5.0, 2.0, 2.0])
    out = group_normalized_advantages(rewards, torch.arange(7) // 2, eps=0.0)
    # groups {1, 0}, {0, 0}, {5, 2}, {2}; the first has unbiased std sqrt(0.5)
    s = math.sqrt(0.5)
    assert out[:2].tolist() == pytest.approx([0.5 / s, -0.5 / s])
    assert out[4:6].tolist() == pytest.approx([1.5 / math.sqrt(4.5), -1.5 / math.sqrt(4.5)])
    assert torch.isnan(out[2:4]).all()  # 0 / 0: a constant group needs eps > 0
    out = group_normalized_advantages(rewards, torch.arange(7) // 2)
    assert out[2:4].tolist() == [0.0, 0.0] and out[6].item() == 0.0  # constant group, singleton
    assert out.dtype == torch.float32
    assert group_normalized_advantages(
        torch.tensor([1, 0]), torch.tensor([0, 0])
    ).is_floating_point()
    with pytest.raises(ValueError, match=r"\[B\]"):
        group_normalized_advantages(rewards, torch.zeros(3))


# ---------------------------------------------------------------- running-mean baseline


def ref_running_mean(prompt_ids, rewards, window, per_prompt, initial=0.0):
    seen, out = [], []
    for p, r in zip(prompt_ids, rewards, strict=True):
        recent = [x for q, x in seen if q == p or not per_prompt][-window:]
        out.append(r - (sum(recent) / len(recent) if recent else initial))
        seen.append((p, r))
    return out


@pytest.mark.parametrize("window,per_prompt", [(8, True), (128, False), (3, True), (1, False)])
def test_running_mean_matches_reference(window, per_prompt):
    rng = random.Random(window)
    ids = [rng.choice(["a", "b", 3, (1, 2)]) for _ in range(400)]
    rewards = [rng.choice([0.0, 1.0, rng.random()]) for _ in ids]
    base = RunningMeanBaseline(window, per_prompt=per_prompt, initial=0.25)
    got = base.advantages(ids[:150], rewards[:150])
    got += [base.advantage(p, r) for p, r in zip(ids[150:], rewards[150:], strict=True)]
    assert got == pytest.approx(ref_running_mean(ids, rewards, window, per_prompt, 0.25))
    assert all(len(h) <= window for h in base._history.values())


def test_running_mean_order_semantics():
    base = RunningMeanBaseline(window=2)
    assert base.baseline("p") == 0.0
    assert base.advantages(["p", "p", "q", "p"], [1.0, 0.0, 1.0, 1.0]) == [1.0, -1.0, 1.0, 0.5]
    assert base.baseline("p") == 0.5  # last two rewards of p: 0, 1
    assert base.baseline("q") == 1.0
    glob = RunningMeanBaseline(window=2, per_prompt=False, initial=0.5)
    assert glob.advantages(["p", "q", "r"], [1.0, 0.0, 0.0]) == [0.5, -1.0, -0.5]
    with pytest.raises(ValueError, match="prompt ids"):
        base.advantages(["p"], [1.0, 2.0])
    with pytest.raises(ValueError, match="window"):
        RunningMeanBaseline(window=0)


def test_running_mean_reports_whether_its_windows_had_history():
    base = RunningMeanBaseline(window=4, initial=0.25)
    assert base.metrics() == {}
    base.advantages(["a", "b", "a"], [1.0, 0.0, 0.0])  # "a" repeats within the batch
    assert base.metrics() == {"baseline/mean": pytest.approx((0.25 + 0.25 + 1.0) / 3),
                              "baseline/with_history": pytest.approx(1 / 3)}
    base.advantages([f"fresh{i}" for i in range(5)], [1.0] * 5)  # a stream of new tasks
    assert base.metrics() == {"baseline/mean": 0.25, "baseline/with_history": 0.0}
    glob = RunningMeanBaseline(window=4, per_prompt=False)
    glob.advantages(["x", "y", "z"], [1.0, 0.0, 1.0])
    assert glob.metrics()["baseline/with_history"] == pytest.approx(2 / 3)
    assert glob.metrics()["baseline/mean"] == pytest.approx((0 + 1.0 + 0.5) / 3)


def test_running_mean_forgets_the_least_recently_seen_prompt_first():
    base = RunningMeanBaseline(window=2, max_prompts=2)
    base.advantages(["a", "b"], [1.0, 1.0])
    base.advantage("a", 0.0)  # "a" seen again: "b" is now the oldest
    base.advantage("c", 1.0)  # over the bound: "b" goes
    assert base.baseline("a") == 0.5 and base.baseline("c") == 1.0
    assert base.baseline("b") == 0.0 and len(base._history) == 2
    restored = RunningMeanBaseline(window=2, max_prompts=1)
    restored.load_state_dict(json.loads(json.dumps(base.state_dict())))
    assert list(restored._history) == ["c"]  # the most recent survive a smaller bound
    with pytest.raises(ValueError, match="max_prompts"):
        RunningMeanBaseline(max_prompts=0)


@pytest.mark.parametrize("per_prompt", [True, False])
def test_running_mean_state_dict_round_trip(per_prompt):
    rng = random.Random(1)
    ids = [rng.choice(["a", 5, (1, "x")]) for _ in range(60)]
    rewards = [rng.random() for _ in ids]
    base = RunningMeanBaseline(4, per_prompt=per_prompt)
    base.advantages(ids[:30], rewards[:30])
    restored = RunningMeanBaseline(4, per_prompt=per_prompt)
    restored.load_state_dict(json.loads(json.dumps(base.state_dict())))
    assert restored.advantages(ids[30:], rewards[30:]) == base.advantages(ids[30:], rewards[30:])
    smaller = RunningMeanBaseline(2, per_prompt=per_prompt)
    smaller.load_state_dict(base.state_dict())
    assert all(len(h) <= 2 for h in smaller._history.values())
    with pytest.raises(ValueError, match="per_prompt"):
        RunningMeanBaseline(4, per_prompt=not per_prompt).load_state_dict(base.state_dict())


# ---------------------------------------------------------------- explained variance


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 9.0], [3.0, 4.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    garbage = torch.tensor([[0.0, 0.0, float("nan")], [0.0, 0.0, 1e9]])
    assert explained_variance(returns, returns, mask) == 1.0
    assert explained_variance(torch.full_like(returns, 2.5), returns, mask) == pytest.approx(0.0)
    values = torch.tensor([[1.0, 2.0, 0.0], [3.0, 3.0, 0.0]]) + garbage
    # R - V = [0, 0, 0, 1]: var 0.1875; Var(R) = 1.25 -> 1 - 0.15
    assert explained_variance(values, returns, mask.float()) == pytest.approx(0.85)
    assert math.isnan(explained_variance(values, torch.ones(2, 3), mask))
    assert math.isnan(explained_variance(values, returns, torch.zeros(2, 3)))


def test_docstring_examples():
    result = doctest.testmod(advantages, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
