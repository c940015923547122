import random

import pytest
import torch

from sao_gym.learner.batching import (
    collate,
    mean_entropy,
    micro_batches,
    plan_micro_batches,
    token_logprobs,
)
from sao_gym.learner.critic import ValueModel, is_attention_parameter
from tests.learner_helpers import segments_rollout


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


def test_attention_parameter_names():
    assert is_attention_parameter("layers.0.self_attn.q_proj.weight")
    assert is_attention_parameter("h.3.attention.dense.bias")
    assert not is_attention_parameter("layers.0.mlp.up_proj.weight")
    assert not is_attention_parameter("layers.0.input_layernorm.weight")


def _critic_step(critic, lr=1e-2):
    opt = torch.optim.AdamW([p for p in critic.parameters() if p.requires_grad], lr=lr)
    ids = torch.randint(0, 1000, (2, 12))
    v = critic(ids, torch.ones_like(ids))
    ((v - 1.0) ** 2).mean().backward()
    opt.step()


@pytest.mark.parametrize("freeze", ["attention", None])
def test_frozen_attention_stays_bit_identical(tiny_model_path, freeze):
    critic = ValueModel.from_pretrained(tiny_model_path, freeze=freeze)
    before = {n: p.detach().clone() for n, p in critic.named_parameters()}
    _critic_step(critic)
    attn = [n for n in before if is_attention_parameter(n)]
    rest = [n for n in before if not is_attention_parameter(n)]
    assert attn and rest
    changed = {n for n, p in critic.named_parameters() if not torch.equal(p, before[n])}
    if freeze == "attention":
        assert not changed & set(attn)
        assert {n for n in rest if "embed" not in n} <= changed
    else:
        assert set(attn) <= changed
    assert "head.weight" in changed and "head.bias" in changed


def test_critic_values_are_aligned_and_save_load_roundtrips(tiny_model_path, tmp_path):
    critic = ValueModel.from_pretrained(tiny_model_path, seed=3)
    assert torch.all(critic.head.bias == 0)
    assert 0.01 < critic.head.weight.std().item() < 0.03
    _critic_step(critic)
    ids = torch.randint(0, 1000, (3, 9))
    attn = torch.ones_like(ids)
    v = critic(ids, attn)
    assert v.shape == (3, 9) and torch.all(v[:, 0] == 0)
    # value at t depends only on tokens < t
    ids2 = ids.clone()
    ids2[:, 5] = (ids2[:, 5] + 1) % 1000
    v2 = critic(ids2, attn)
    assert torch.allclose(v[:, :6], v2[:, :6], atol=1e-6)
    assert not torch.allclose(v[:, 6:], v2[:, 6:])
    critic.save_pretrained(tmp_path / "critic")
    again = ValueModel.from_pretrained(tmp_path / "critic")
    assert torch.allclose(again(ids, attn), v, atol=1e-6)
    with pytest.raises(ValueError):
        ValueModel(critic.backbone, freeze="mlp")
    with pytest.raises(FileNotFoundError):
        ValueModel.from_pretrained(tmp_path / "nowhere")
