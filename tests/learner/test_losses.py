"""Losses vs hand-computed values and slow plain-Python references."""

from __future__ import annotations

import doctest
import math

import pytest
import torch

from sao_gym.learner import losses
from sao_gym.learner.losses import (
    AGGREGATIONS,
    aggregate,
    dis_policy_loss,
    entropy_from_logits,
    ppo_clip_policy_loss,
    value_loss,
)

F64 = torch.float64


def t64(rows):
    return torch.tensor(rows, dtype=F64)


def random_batch(seed, B=5, T=9, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, T, generator=g) < 0.6
    mask[0] = False  # one row without action tokens
    logprobs = -torch.rand(B, T, generator=g, dtype=dtype) * 3
    rollout = logprobs + torch.randn(B, T, generator=g, dtype=dtype) * 0.8
    adv = torch.randn(B, T, generator=g, dtype=dtype)
    return logprobs, rollout, adv, mask


# ---------------------------------------------------------------- references


def ref_aggregate(v, m, mode):
    """Plain loops; a sequence without action tokens contributes 0 and counts."""
    sums = [
        sum(x for x, keep in zip(vr, mr, strict=True) if keep) for vr, mr in zip(v, m, strict=True)
    ]
    counts = [sum(1 for keep in mr if keep) for mr in m]
    if mode == "token_mean":
        return sum(sums) / max(sum(counts), 1)
    if mode == "seq_mean_token_mean":
        return sum(s / c if c else 0.0 for s, c in zip(sums, counts, strict=True)) / len(v)
    return sum(sums) / len(v)


def ref_dis(lp, rlp, adv, m, eps_low, eps_high):
    """Loss (token mean), d loss / d logprob, clip ratio, by loops."""
    n = sum(1 for mr in m for keep in mr if keep)
    loss, grad, masked = 0.0, [[0.0] * len(r) for r in lp], 0
    for b in range(len(lp)):
        for t in range(len(lp[b])):
            if not m[b][t]:
                continue
            r = math.exp(lp[b][t] - rlp[b][t])
            w = r if 1 - eps_low < r < 1 + eps_high else 0.0
            masked += w == 0.0
            loss += -w * adv[b][t] * lp[b][t] / n
            grad[b][t] = -w * adv[b][t] / n
    return loss, grad, masked / n


def ref_ppo(lp, old, adv, m, eps_low, eps_high):
    n = sum(1 for mr in m for keep in mr if keep)
    loss, clipped = 0.0, 0
    for b in range(len(lp)):
        for t in range(len(lp[b])):
            if m[b][t]:
                r = math.exp(lp[b][t] - old[b][t])
                a = adv[b][t]
                unclipped, clip = r * a, min(max(r, 1 - eps_low), 1 + eps_high) * a
                clipped += clip < unclipped
                loss += -min(unclipped, clip) / n
    return loss, clipped / n


# ---------------------------------------------------------------- aggregate


V = [[1.0, 2.0, 9.0], [4.0, 9.0, 9.0], [7.0, 7.0, 7.0]]
M = [[1, 1, 0], [1, 0, 0], [0, 0, 0]]


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("token_mean", 7 / 3),
        ("seq_mean_token_mean", (1.5 + 4 + 0) / 3),
        ("seq_mean_token_sum", 7 / 3),
    ],
)
def test_aggregate_hand_values(mode, expected):
    assert aggregate(t64(V), torch.tensor(M), mode).item() == pytest.approx(expected)
    assert ref_aggregate(V, M, mode) == pytest.approx(expected)


def test_aggregate_float_and_bool_masks_agree_and_garbage_is_ignored():
    v = t64(V)
    v[2] = float("nan")
    v[0, 2] = float("inf")
    for mode in AGGREGATIONS:
        a = aggregate(v, torch.tensor(M, dtype=torch.bool), mode)
        b = aggregate(v, torch.tensor(M, dtype=torch.float32), mode)
        assert torch.isfinite(a) and a.item() == b.item()


def test_aggregate_explicit_denominators():
    v, m = t64(V), torch.tensor(M)
    assert aggregate(v, m, "token_mean", num_tokens=7).item() == pytest.approx(1.0)
    assert aggregate(v, m, "token_mean", num_tokens=torch.tensor(14.0)).item() == pytest.approx(0.5)
    assert aggregate(v, m, "seq_mean_token_mean", num_seqs=11).item() == pytest.approx(0.5)
    assert aggregate(v, m, "seq_mean_token_sum", num_seqs=14).item() == pytest.approx(0.5)
    # Each mode ignores the other mode's denominator.
    assert aggregate(v, m, "token_mean", num_seqs=100).item() == pytest.approx(7 / 3)
    assert aggregate(v, m, "seq_mean_token_sum", num_tokens=100).item() == pytest.approx(7 / 3)


def test_aggregate_empty_batch_is_zero_not_nan():
    for mode in AGGREGATIONS:
        assert aggregate(torch.ones(2, 3), torch.zeros(2, 3), mode).item() == 0.0


def test_aggregate_unknown_mode_lists_valid_modes():
    with pytest.raises(ValueError, match="token_mean, seq_mean_token_mean, seq_mean_token_sum"):
        aggregate(t64(V), torch.tensor(M), "sum")


@pytest.mark.parametrize("mode", AGGREGATIONS)
@pytest.mark.parametrize("seed", range(5))
def test_aggregate_matches_reference(mode, seed):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(6, 7, generator=g, dtype=F64)
    m = torch.rand(6, 7, generator=g) < 0.4
    assert aggregate(v, m, mode).item() == pytest.approx(
        ref_aggregate(v.tolist(), m.tolist(), mode)
    )


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_micro_batches_with_global_denominators_sum_to_full_batch_loss(mode):
    lp, rlp, adv, m = random_batch(3, B=7, T=11)
    full_lp = lp.clone().requires_grad_()
    full, _ = dis_policy_loss(full_lp, rlp, adv, m, aggregation=mode)
    full.backward()
    num_tokens, num_seqs = m.sum(), m.shape[0]
    micro_lp = lp.clone().requires_grad_()
    total = 0.0
    for rows in (slice(0, 2), slice(2, 5), slice(5, 7)):
        part, _ = dis_policy_loss(
            micro_lp[rows],
            rlp[rows],
            adv[rows],
            m[rows],
            aggregation=mode,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
        )
        part.backward()
        total += part.item()
    assert total == pytest.approx(full.item(), rel=1e-12, abs=1e-12)
    torch.testing.assert_close(micro_lp.grad, full_lp.grad, rtol=1e-12, atol=1e-12)
    parts = [
        aggregate(adv[r], m[r], mode, num_tokens=num_tokens, num_seqs=num_seqs)
        for r in (slice(0, 3), slice(3, 7))
    ]
    assert sum(parts).item() == pytest.approx(aggregate(adv, m, mode).item(), rel=1e-12)


# ---------------------------------------------------------------- DIS


def dis_hand_case():
    """eps_low=0.5, eps_high=1.0: the kept band is the open interval (0.5, 2.0)."""
    lp = t64([[-1.0, math.log(0.5), math.log(2.0), -0.5, 0.0, -float("inf")]])
    rlp = t64([[-1.0, 0.0, 0.0, -1.0, -3.0, 0.0]])
    adv = t64([[2.0, 1.0, -1.0, -1.0, -1.0, float("nan")]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    return lp, rlp, adv, mask


def test_dis_hand_values_edges_and_gradient():
    lp, rlp, adv, mask = dis_hand_case()
    ratio = torch.exp(lp - rlp)[0]
    # Precondition: the exp/log round trip lands exactly on both edges.
    assert ratio[1].item() == 0.5 and ratio[2].item() == 2.0
    lp.requires_grad_()
    loss, stats = dis_policy_loss(lp, rlp, adv, mask, eps_low=0.5, eps_high=1.0)
    # token 0: r=1, w=1, -(1*2*-1) = 2; tokens 1, 2: r on an edge, masked;
    # token 3: r=e^0.5, -(e^0.5 * -1 * -0.5) = -0.5 e^0.5; token 4: r=e^3 with A<0, masked.
    assert loss.item() == pytest.approx((2.0 - 0.5 * math.exp(0.5)) / 5, rel=1e-14)
    loss.backward()
    expected_grad = [-1 * 2.0 / 5, 0.0, 0.0, -math.exp(0.5) * -1.0 / 5, 0.0, 0.0]
    assert lp.grad[0].tolist() == pytest.approx(expected_grad, rel=1e-14)
    outside = torch.tensor([False, True, True, False, True, True])
    assert (lp.grad[0][outside] == 0).all()  # exactly 0, padding included
    assert stats["clip_ratio"].item() == pytest.approx(3 / 5)
    r_act = [1.0, 0.5, 2.0, math.exp(0.5), math.exp(3.0)]
    assert stats["ratio_mean"].item() == pytest.approx(sum(r_act) / 5)
    assert stats["ratio_max"].item() == pytest.approx(math.exp(3.0))
    k3 = [(r - 1) - math.log(r) for r in r_act]
    assert stats["approx_kl"].item() == pytest.approx(sum(k3) / 5)
    assert all(v.dim() == 0 and not v.requires_grad for v in stats.values())


def test_dis_weight_is_stop_gradient():
    lp, rlp, adv, mask = random_batch(0)
    lp.requires_grad_()
    loss, _ = dis_policy_loss(lp, rlp, adv, mask)
    loss.backward()
    n = mask.sum()
    r = torch.exp(lp.detach() - rlp)
    in_band = mask & (r > 0.7) & (r < 6.0)
    assert in_band.any() and (mask & ~in_band).any()
    torch.testing.assert_close(lp.grad, torch.where(in_band, -r * adv / n, 0.0))
    # Without stop-gradient the gradient would have an extra r * A * logp term.
    no_sg = torch.where(in_band, -(r * adv * lp.detach() + r * adv) / n, 0.0)
    assert not torch.allclose(lp.grad, no_sg)


def test_dis_float32_edges_are_strict():
    x = torch.tensor([-0.25, 0.375], dtype=torch.float32)
    r = torch.exp(x)
    eps_low, eps_high = 1.0 - r[0].item(), r[1].item() - 1.0  # edges exactly at r in float32
    lp = x[None].clone().requires_grad_()
    loss, stats = dis_policy_loss(
        lp,
        torch.zeros(1, 2),
        torch.ones(1, 2),
        torch.ones(1, 2),
        eps_low=eps_low,
        eps_high=eps_high,
    )
    loss.backward()
    assert stats["clip_ratio"].item() == 1.0 and loss.item() == 0.0
    assert (lp.grad == 0).all()


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("eps", [(0.3, 5.0), (0.8, 3.0), (0.2, 0.2)])
def test_dis_matches_reference(seed, eps):
    lp, rlp, adv, m = random_batch(seed)
    lp.requires_grad_()
    loss, stats = dis_policy_loss(lp, rlp, adv, m, eps_low=eps[0], eps_high=eps[1])
    loss.backward()
    ref_loss, ref_grad, ref_clip = ref_dis(
        lp.tolist(), rlp.tolist(), adv.tolist(), m.tolist(), *eps
    )
    assert loss.item() == pytest.approx(ref_loss, rel=1e-12, abs=1e-14)
    torch.testing.assert_close(lp.grad, t64(ref_grad), rtol=1e-12, atol=1e-14)
    assert stats["clip_ratio"].item() == pytest.approx(ref_clip)


def test_dis_garbage_outside_mask_never_produces_nan():
    lp, rlp, adv, m = random_batch(1, dtype=torch.float32)
    lp[~m] = -float("inf")
    rlp[~m] = torch.tensor([float("-inf"), float("nan"), 1e30]).repeat(100)[: int((~m).sum())]
    adv[~m] = float("nan")
    lp.requires_grad_()
    for mode in AGGREGATIONS:
        loss, stats = dis_policy_loss(lp, rlp, adv, m, aggregation=mode)
        (grad,) = torch.autograd.grad(loss, lp)
        assert torch.isfinite(loss) and torch.isfinite(grad).all()
        assert (grad[~m] == 0).all()
        assert all(torch.isfinite(v) for v in stats.values())


def test_dis_no_action_tokens():
    loss, stats = dis_policy_loss(
        torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 3)
    )
    assert loss.item() == 0.0 and all(v.item() == 0.0 for v in stats.values())


# ---------------------------------------------------------------- PPO


def test_ppo_hand_cases():
    r = [1.5, 0.5, 3.0, 1.1, 0.5]
    adv = t64([[1.0, -1.0, -1.0, 2.0, 1.0]])
    lp = t64([[math.log(x) for x in r]]).requires_grad_()
    loss, stats = ppo_clip_policy_loss(lp, torch.zeros(1, 5, dtype=F64), adv, torch.ones(1, 5))
    # 0: A>0, r>1.28 -> clipped, -1.28;  1: A<0, r<0.8 -> clipped, +0.8
    # 2: A<0, r=3 -> NOT clipped (pessimistic min), +3;  3: in range, -2.2;  4: A>0, r<0.8, -0.5
    assert loss.item() == pytest.approx((-1.28 + 0.8 + 3.0 - 2.2 - 0.5) / 5)
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([0.0, 0.0, 3.0 / 5, -2.2 / 5, -0.5 / 5])
    assert lp.grad[0, 0] == 0 and lp.grad[0, 1] == 0
    assert stats["clip_ratio"].item() == pytest.approx(2 / 5)
    assert stats["ratio_max"].item() == pytest.approx(3.0)


@pytest.mark.parametrize("seed", range(10))
def test_ppo_matches_reference(seed):
    lp, old, adv, m = random_batch(seed)
    lp[m & (torch.rand(lp.shape) < 0.3)] = 0.0  # some ratios exactly inside
    loss, stats = ppo_clip_policy_loss(lp, old, adv, m)
    ref_loss, ref_clip = ref_ppo(lp.tolist(), old.tolist(), adv.tolist(), m.tolist(), 0.2, 0.28)
    assert loss.item() == pytest.approx(ref_loss, rel=1e-12, abs=1e-14)
    assert stats["clip_ratio"].item() == pytest.approx(ref_clip)


def test_ppo_garbage_outside_mask_never_produces_nan():
    lp, old, adv, m = random_batch(2)
    lp[~m], old[~m], adv[~m] = -float("inf"), -float("inf"), float("nan")
    lp.requires_grad_()
    loss, stats = ppo_clip_policy_loss(lp, old, adv, m)
    (grad,) = torch.autograd.grad(loss, lp)
    assert torch.isfinite(loss) and torch.isfinite(grad).all() and (grad[~m] == 0).all()
    assert all(torch.isfinite(v) for v in stats.values())


# ---------------------------------------------------------------- value loss


def value_case():
    v = t64([[1.0, 2.0, 3.0, 0.0, float("nan")]]).requires_grad_()
    returns = t64([[0.0, 2.0, 5.0, 3.0, float("inf")]])
    old = t64([[1.5, 1.0, 2.9, 1.0, float("nan")]])
    return v, returns, old, torch.tensor([[1, 1, 1, 1, 0]])


def test_value_loss_unclipped_hand_values():
    v, returns, old, m = value_case()
    loss, stats = value_loss(v, returns, m, old_values_BT=old)  # old ignored without clip
    assert loss.item() == pytest.approx(0.5 * (1 + 0 + 4 + 9) / 4)
    loss.backward()
    assert v.grad[0].tolist() == pytest.approx([1 / 4, 0.0, -2 / 4, -3 / 4, 0.0])
    assert stats["value_mean"].item() == pytest.approx(1.5)
    assert stats["value_clip_ratio"].item() == 0.0


def test_value_loss_clipped_hand_values():
    v, returns, old, m = value_case()
    loss, stats = value_loss(v, returns, m, old_values_BT=old, clip=0.2)
    # 0: V_clip=1.3, 1.69 > 1 clipped; 1: V_clip=1.2, 0.64 > 0 clipped;
    # 2: V_clip=3 (inside), 4; 3: V_clip=0.8, 4.84 < 9 -> unclipped 9.
    assert loss.item() == pytest.approx(0.5 * (1.69 + 0.64 + 4 + 9) / 4)
    loss.backward()
    assert v.grad[0].tolist() == pytest.approx([0.0, 0.0, -2 / 4, -3 / 4, 0.0])
    assert stats["value_clip_ratio"].item() == pytest.approx(2 / 4)


def test_value_loss_clip_needs_old_values():
    v, returns, _, m = value_case()
    with pytest.raises(ValueError, match="old_values_BT"):
        value_loss(v, returns, m, clip=0.2)


# ---------------------------------------------------------------- entropy, doctests


def test_entropy_from_logits():
    logits = torch.randn(2, 3, 11, dtype=F64)
    expected = torch.distributions.Categorical(logits=logits).entropy()
    torch.testing.assert_close(entropy_from_logits(logits), expected)
    assert entropy_from_logits(torch.zeros(1, 1, 8)).item() == pytest.approx(math.log(8))
    banned = torch.tensor([[[0.0, -float("inf"), -float("inf")]]])
    assert entropy_from_logits(banned).item() == 0.0
    assert torch.isfinite(entropy_from_logits(torch.tensor([[[1e4, -1e4, 0.0]]]))).all()


def test_docstring_examples():
    result = doctest.testmod(losses, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_sampler_mismatch_hand_values():
    lp = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    sampler = torch.tensor([[-1.0, -1.0, -0.5 - math.log(10.0), 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    stats = losses.sampler_mismatch(lp.requires_grad_(), sampler, mask)
    r = [1.0, math.exp(-1.0), 10.0]
    k3 = [(x - 1) - math.log(x) for x in r]
    assert stats["approx_kl"].item() == pytest.approx(sum(k3) / 3, rel=1e-5)
    assert stats["masked_share"].item() == pytest.approx(2 / 3)  # 0.37 < 0.7 and 10 > 6
    assert not stats["approx_kl"].requires_grad
    wide = losses.sampler_mismatch(lp, sampler, mask, eps_low=0.7, eps_high=9.0)
    assert wide["masked_share"].item() == pytest.approx(1 / 3)  # 10 is on the edge: masked
