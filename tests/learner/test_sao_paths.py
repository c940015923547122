"""The learner's scoring paths on the tiny model: temperature, counters and the
weights it serves, autocast, a shallow critic, and the three ways to score the policy."""

import pytest
import torch

from sao_gym.learner.batching import micro_batches
from sao_gym.learner.engine import local_engine
from sao_gym.learner.learner import Learner, LearnerConfig, build_learner
from sao_gym.models import load_policy
from tests.learner.helpers import random_batch, table_critic

# ---------- temperature ----------

async def test_learner_scores_tokens_at_the_sampling_temperature(tiny_model_path):
    """Fresh on-policy rollouts at T = 0.7: the learner at T = 0.7 sees ratio 1, at T = 1 not."""
    import sao_gym
    from sao_gym.agents import LLMAgent
    from sao_gym.evaluation import run_episodes
    from sao_gym.inference.hf.backend import HFBackend

    backend = HFBackend(tiny_model_path, seed=0)
    try:
        rollouts = await run_episodes(
            lambda: sao_gym.make("sao_gym/Arithmetic-v0", max_episode_steps=2),
            lambda: LLMAgent(backend, backend.tokenizer, max_new_tokens=12, temperature=0.7,
                             seed=1), 4, concurrency=4)
    finally:
        await backend.aclose()
    assert not any(r.infra_failure for r in rollouts)
    assert sum(r.num_action_tokens for r in rollouts) >= 60
    cfg = LearnerConfig(critic_warmup_steps=0, critic_updates=1)
    right = build_learner("sao", tiny_model_path, cfg, temperature=0.7)
    assert right.temperature == 0.7
    m = right.update(rollouts)
    assert m["sao/clip_ratio"] == 0
    assert abs(m["sao/ratio_mean"] - 1) < 1e-4 and m["sao/approx_kl"] < 1e-6
    # the old behaviour: untempered logprobs against a tempered sampler
    wrong = build_learner("sao", tiny_model_path, cfg).update(rollouts)
    assert wrong["sao/clip_ratio"] > 0.01 and abs(wrong["sao/ratio_mean"] - 1) > 1e-2
    assert wrong["policy/entropy"] > m["policy/entropy"]  # T = 0.7 is the sharper one


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan"), float("inf")])
def test_temperature_must_be_positive(tiny_model_path, temperature):
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        build_learner("sao", tiny_model_path, temperature=temperature)
    policy, _ = load_policy(tiny_model_path)
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        Learner("grpo", local_engine(policy, LearnerConfig(), 1e-6), None, LearnerConfig(),
                temperature=temperature)


def test_ppo_old_logprobs_use_the_temperature(tiny_model_path):
    learner = build_learner("grpo", tiny_model_path, LearnerConfig(), group_size=2,
                            temperature=0.5)
    m = learner.update(random_batch(learner.policy, 4, group_size=2))
    assert m["sao/ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # old == current, both at T


# ---------- counters, weights ----------

async def test_counters_weights_and_the_old_checkpoint_key(tiny_model_path):
    from sao_gym.inference.hf.backend import HFBackend

    cfg = LearnerConfig(lr=1e-3, critic_warmup_steps=1, policy_minibatches=2)
    a = build_learner("sao", tiny_model_path, cfg)
    rollouts = random_batch(a.policy, 2, seed=8)
    metrics = [a.update(rollouts) for _ in range(3)]
    # learner steps vs policy versions: warm-up step (0 versions), then 2 per step
    assert (a.steps_done, a.policy_version, a.max_versions_per_step) == (3, 4, 2)
    assert [m["learner/steps_done"] for m in metrics] == [1, 2, 3]
    assert [m["learner/policy_version"] for m in metrics] == [0, 2, 4]
    state = a.state_dict()
    assert state["steps_done"] == 3 and "step" not in state
    old = {k: v for k, v in state.items() if k != "steps_done"} | {"step": 3}
    b = build_learner("sao", tiny_model_path, cfg)
    b.load_state_dict(old)  # a checkpoint written before the rename
    assert (b.steps_done, b.policy_version) == (3, 4)
    # weights(): the policy state dict, which the inference backend loads as it is
    backend = HFBackend(tiny_model_path)
    try:
        await backend.update_weights(a.weights(), a.policy_version)
        assert backend.policy_version == 4
        served = backend.model.state_dict()
        assert all(torch.equal(served[n], p) for n, p in a.policy.state_dict().items())
    finally:
        await backend.aclose()


def test_learner_refuses_a_missing_or_unexpected_critic(tiny_model_path):
    config = LearnerConfig()
    policy = local_engine(load_policy(tiny_model_path)[0], config, config.lr)
    with pytest.raises(ValueError, match="needs a critic"):
        Learner("sao", policy, None, config)
    with pytest.raises(ValueError, match="takes no critic"):
        Learner("grpo", policy, local_engine(table_critic({}), config, config.lr), config)
    with pytest.raises(ValueError, match="unknown algorithm"):
        Learner("ppo", policy, None, config)



def test_autocast_is_validated_and_runs_the_forwards_in_bf16(tiny_model_path, caplog,
                                                               monkeypatch):
    with pytest.raises(ValueError, match="autocast must be one of"):
        LearnerConfig(autocast="float16")
    import sao_gym.learner.learner as sao_mod

    monkeypatch.setattr(sao_mod, "native_bf16", lambda device="cpu": False)
    with caplog.at_level("WARNING", logger="sao_gym.learner.learner"):
        bf16 = build_learner("sao", tiny_model_path, LearnerConfig(autocast="bfloat16"))
    assert "no native bf16" in caplog.text
    fp32 = build_learner("sao", tiny_model_path, LearnerConfig())
    rollouts = random_batch(fp32.policy, 2, seed=9)
    mb = micro_batches(rollouts, 4096)[0]
    logprobs, _ = bf16.score(mb)
    after = bf16.critic_engine.forward(mb.input_ids_BT, mb.attention_mask_BT,
                                       method="values_after")
    assert logprobs.dtype == after.dtype == torch.float32
    mask = mb.action_mask_BT > 0
    err = (logprobs - fp32.score(mb)[0])[mask].abs().detach()
    assert 0 < float(err.max()) < 0.1  # rounded, but the same distribution
    assert all(p.dtype == torch.float32 for p in bf16.policy.parameters())


def test_shallow_critic_trains_saves_and_resumes(tiny_model_path, tmp_path):
    cfg = LearnerConfig(lr=1e-3, critic_warmup_steps=0, critic_layers=1)
    a = build_learner("sao", tiny_model_path, cfg)
    assert len(a.critic.backbone.layers) == 1
    assert len(a.policy.model.layers) == a.policy.config.num_hidden_layers > 1
    rollouts = random_batch(a.policy, 4, seed=2)
    before = {n: p.detach().clone() for n, p in a.critic.named_parameters()}
    m = a.update(rollouts)
    assert m["critic/grad_norm"] > 0
    assert not torch.equal(a.critic.head.weight, before["head.weight"])
    a.save_models(tmp_path / "ckpt")
    b = build_learner("sao", str(tmp_path / "ckpt" / "policy"), cfg,
                      critic_path=str(tmp_path / "ckpt" / "critic"))
    ids = torch.tensor([rollouts[0].token_ids])
    assert len(b.critic.backbone.layers) == 1
    assert torch.allclose(a.critic(ids, torch.ones_like(ids)), b.critic(ids, torch.ones_like(ids)))
    with pytest.raises(ValueError, match="critic_layers"):
        LearnerConfig(critic_layers=0)


def test_policy_scoring_paths_give_the_same_update(tiny_model_path):
    """The chunked LM head, ``logits_to_keep`` and full logits: same scores, same step."""
    cfg = LearnerConfig(lr=1e-3, critic_warmup_steps=0)
    head, kept, full = (build_learner("sao", tiny_model_path, cfg) for _ in range(3))
    assert head.policy_engine.scores_tokens  # Qwen2 passes the head check
    kept.policy_engine.scores_tokens = full.policy_engine.scores_tokens = False
    full.policy_engine.keeps_logits = False
    assert kept.policy_engine.keeps_logits  # Qwen2 has logits_to_keep
    rollouts = random_batch(kept.policy, 6, seed=4)
    (mb,) = micro_batches(rollouts, 1 << 16, kept.pad_id)
    with torch.no_grad():
        scores = [learner.score(mb) for learner in (head, kept, full)]
    off_action = mb.action_mask_BT == 0
    for logprobs, entropy in scores:
        assert logprobs.shape == entropy.shape == mb.input_ids_BT.shape
        assert not entropy[off_action].any() and (entropy[~off_action] > 0).all()
        torch.testing.assert_close(logprobs * mb.action_mask_BT,
                                   scores[2][0] * mb.action_mask_BT, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(entropy, scores[2][1], rtol=1e-5, atol=1e-5)
    grads = []
    for learner in (head, kept, full):  # the policy's gradients as its optimizer sees them
        opt, seen = learner.policy_engine.optimizer, {}
        grads.append(seen)
        step = opt.step
        opt.step = lambda *a, _s=step, _seen=seen, _m=learner.policy, **k: (
            _seen.update((n, p.grad.clone()) for n, p in _m.named_parameters()), _s(*a, **k))[1]
    metrics = [learner.update(rollouts) for learner in (head, kept, full)]
    for key in ("loss/policy", "policy/entropy", "mismatch/approx_kl", "loss/value",
                "policy/grad_norm"):
        for m in metrics[:2]:
            assert m[key] == pytest.approx(metrics[2][key], rel=1e-5, abs=1e-7), key
    assert grads[2] and grads[0].keys() == grads[2].keys()
    for seen in grads[:2]:
        for name, g in grads[2].items():
            torch.testing.assert_close(seen[name], g, rtol=1e-4, atol=1e-7, msg=name)
