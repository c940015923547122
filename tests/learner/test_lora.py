"""LoRA through PEFT in the learner: what trains, what is published, what is saved.

References: PEFT's own ``get_peft_model(...).merge_and_unload()`` for the
merged weights, and the LoRA model's own forward for the adapter a backend
merges.
"""

from __future__ import annotations

import copy

import pytest
import torch

from sao_gym.learner.config import LearnerConfig, LoraSettings
from sao_gym.learner.learner import build_learner
from sao_gym.models import load_policy
from tests.learner.helpers import random_batch

peft = pytest.importorskip("peft")

LORA = LoraSettings(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "down_proj"))


def _randomise_adapters(model: torch.nn.Module, seed: int = 0) -> None:
    """B starts at 0 (the adapter is a no-op): give every adapter weight a value."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def test_merged_weights_equal_peft_merge_and_adapters_fold_the_scaling(tiny_model_path):
    from sao_gym.inference.weights import merge_adapter
    from sao_gym.learner.lora import adapter_weights, add_lora, merged_weights

    model = add_lora(load_policy(tiny_model_path)[0], LORA)
    _randomise_adapters(model)
    state = model.state_dict()
    ours = merged_weights(state, LORA.scaling)
    # reference: PEFT's own merge of the same adapter values
    base = load_policy(tiny_model_path)[0]
    ref_model = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(
        r=4, lora_alpha=8.0, target_modules=list(LORA.target_modules)))
    ref_state = ref_model.state_dict()
    with torch.no_grad():
        for name, tensor in state.items():
            if ".lora_" in name:
                ref_state["base_model.model." + name].copy_(tensor)
    ref = ref_model.merge_and_unload().state_dict()
    assert ours.keys() == ref.keys()
    assert max(float((ours[k] - ref[k]).abs().max()) for k in ref) < 1e-6
    assert any(not torch.equal(ours[k], base.state_dict()[k]) for k in ref)  # it changed some
    # the adapters alone, scaling folded into B; a receiver's merge gives the same weights
    adapter = adapter_weights(state, LORA.scaling)
    assert all(k.endswith((".lora_A.weight", ".lora_B.weight")) for k in adapter)
    assert len(adapter) == base.config.num_hidden_layers * 3 * 2  # layers x targets x (A, B)
    merged = merge_adapter(base.state_dict(), adapter)
    assert max(float((merged[k] - ours[k]).abs().max()) for k in merged) < 1e-6
    # and the LoRA model computes what the merged plain model computes
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    base.load_state_dict(ours)
    with torch.no_grad():
        diff = (model(input_ids=ids).logits - base(input_ids=ids).logits).abs().max()
    assert float(diff) < 1e-5


def test_only_adapters_train_and_the_saved_policy_is_the_merged_model(tiny_model_path, tmp_path):
    config = LearnerConfig(lr=1e-2, critic_warmup_steps=0, lora=LORA)
    learner = build_learner("sao", tiny_model_path, config)
    policy_params = {n for n, p in learner.policy.named_parameters() if p.requires_grad}
    assert policy_params and all(".lora_" in n for n in policy_params)
    in_optimizer = sum(p.numel() for g in learner.policy_opt.param_groups for p in g["params"])
    assert in_optimizer == sum(p.numel() for p in learner.policy.parameters() if p.requires_grad)
    assert in_optimizer * 20 < sum(p.numel() for p in learner.policy.parameters())
    assert not any(".lora_" in n for n, _ in learner.critic.named_parameters())  # critic: full
    before = {n: p.clone() for n, p in learner.policy.named_parameters()}
    rollouts = random_batch(learner.policy, 4, seed=3)
    for _ in range(2):
        learner.update(rollouts)
    moved = {n for n, p in learner.policy.named_parameters() if not torch.equal(before[n], p)}
    assert moved and all(".lora_B." in n or ".lora_A." in n for n in moved)
    published = learner.weights()
    assert set(published) == {n.replace(".default", "") for n in policy_params}
    learner.save_policy(tmp_path / "policy")
    plain = load_policy(str(tmp_path / "policy"))[0]
    assert not any("lora" in n or "base_layer" in n for n in plain.state_dict())
    ids = torch.tensor([rollouts[0].token_ids[:24]])
    with torch.no_grad():
        diff = (plain(input_ids=ids).logits - learner.policy(input_ids=ids).logits).abs().max()
    assert float(diff) < 1e-5


def test_a_critic_with_adapters_trains_its_head_and_norms_and_resumes(tiny_model_path, tmp_path):
    config = LearnerConfig(lr=1e-3, critic_warmup_steps=0, lora=LoraSettings(rank=4, critic=True))
    learner = build_learner("sao", tiny_model_path, config)
    trainable = {n for n, p in learner.critic.named_parameters() if p.requires_grad}
    assert any(n.startswith("head.") for n in trainable)
    assert any("norm" in n for n in trainable) and any(".lora_" in n for n in trainable)
    frozen = {n for n, _ in learner.critic.named_parameters()} - trainable
    assert frozen and all("norm" not in n and not n.startswith("head.") for n in frozen)
    rollouts = random_batch(learner.policy, 4, seed=4)
    learner.update(rollouts)
    learner.save_state(tmp_path / "ckpt")
    again = build_learner("sao", tiny_model_path, config)
    again.load_state(tmp_path / "ckpt")
    a, b = learner.update(rollouts), again.update(rollouts)
    assert a["loss/value"] == b["loss/value"] and a["loss/policy"] == b["loss/policy"]


def test_bad_lora_settings_are_refused_clearly(tiny_model_path):
    with pytest.raises(ValueError, match="rank >= 1"):
        LoraSettings(rank=0)
    with pytest.raises(ValueError, match="non-empty"):
        LoraSettings(target_modules=())
    config = LearnerConfig(lora=LoraSettings(target_modules=("no_such_layer",)))
    with pytest.raises(ValueError, match="match no layer"):
        build_learner("grpo", tiny_model_path, config, group_size=2)
