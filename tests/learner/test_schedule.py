"""Learning-rate schedules: the pure factor, and the learner applying it step by step."""

import io
import math
import random

import pytest
import torch

from sao_gym.learner.learner import LearnerConfig, build_learner
from sao_gym.learner.schedule import lr_scale
from tests.learner.helpers import random_multiturn


def test_linear_and_cosine_hand_values():
    assert lr_scale(0, 8, "linear", 0.0) == 1.0
    assert lr_scale(2, 8, "linear", 0.0) == pytest.approx(0.75)
    assert lr_scale(2, 8, "linear", 0.2) == pytest.approx(0.2 + 0.8 * 0.75)
    assert lr_scale(8, 8, "linear", 0.2) == pytest.approx(0.2)
    assert lr_scale(50, 8, "linear", 0.2) == pytest.approx(0.2)  # stays at the floor
    assert lr_scale(2, 8, "cosine", 0.0) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert lr_scale(4, 8, "cosine", 0.1) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_scale(8, 8, "cosine", 0.1) == pytest.approx(0.1)
    assert lr_scale(123, None, "constant", 0.0) == 1.0


def test_bad_schedules_are_refused():
    with pytest.raises(ValueError, match="lr_schedule must be one of"):
        lr_scale(0, 10, "step", 0.1)
    with pytest.raises(ValueError, match="needs total_steps"):
        lr_scale(0, None, "linear", 0.1)
    with pytest.raises(ValueError, match="lr_schedule must be one of"):
        LearnerConfig(lr_schedule="exp")
    with pytest.raises(ValueError, match="lr_final_ratio"):
        LearnerConfig(lr_final_ratio=1.5)


def _batch(policy, n, seed=0):
    rng = random.Random(seed)
    return [random_multiturn(policy, rng, reward=float(i % 2), task_id=f"t{i}") for i in range(n)]


def test_learner_needs_the_run_length_for_a_decaying_schedule(tiny_model_path):
    with pytest.raises(ValueError, match="needs total_steps"):
        build_learner("sao", tiny_model_path, LearnerConfig(lr_schedule="linear"))


def test_learner_applies_the_schedule_to_both_optimizers(tiny_model_path):
    cfg = LearnerConfig(lr=1e-3, critic_warmup_steps=0, lr_schedule="linear",
                        lr_final_ratio=0.1)
    learner = build_learner("sao", tiny_model_path, cfg, total_steps=4)
    rollouts = _batch(learner.policy, 4)
    for k in range(6):
        m = learner.update(rollouts)
        scale = 1.0 - 0.9 * min(k, 4) / 4
        assert m["learner/lr"] == pytest.approx(1e-3 * scale)
        assert learner.policy_opt.param_groups[0]["lr"] == pytest.approx(1e-3 * scale)
        assert learner.critic_opt.param_groups[0]["lr"] == pytest.approx(5e-3 * scale)


def test_a_spent_schedule_stops_moving_the_weights(tiny_model_path):
    cfg = LearnerConfig(lr=1e-3, critic_warmup_steps=0, lr_schedule="linear",
                        lr_final_ratio=0.0)
    learner = build_learner("running_mean", tiny_model_path, cfg, total_steps=1)
    rollouts = _batch(learner.policy, 4)
    before = {n: p.clone() for n, p in learner.policy.state_dict().items()}
    learner.update(rollouts)  # step 0: full lr
    moved = {n: p.clone() for n, p in learner.policy.state_dict().items()}
    assert not all(torch.equal(before[n], p) for n, p in moved.items())
    learner.update(rollouts)  # step 1 = total_steps: lr 0
    assert all(torch.equal(moved[n], p) for n, p in learner.policy.state_dict().items())


def test_resume_continues_the_schedule(tiny_model_path):
    cfg = LearnerConfig(lr=1e-3, critic_warmup_steps=0, lr_schedule="cosine")
    a = build_learner("sao", tiny_model_path, cfg, total_steps=5)
    rollouts = _batch(a.policy, 4, seed=2)
    a.update(rollouts)
    a.update(rollouts)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = build_learner("sao", tiny_model_path, cfg, total_steps=5)
    b.load_state_dict(torch.load(buf, weights_only=False))
    ma, mb = a.update(rollouts), b.update(rollouts)
    expected = 1e-3 * lr_scale(2, 5, "cosine", 0.1)
    assert ma["learner/lr"] == mb["learner/lr"] == pytest.approx(expected)
    assert all(torch.equal(p, b.policy.state_dict()[n]) for n, p in a.policy.state_dict().items())


def test_both_schedules_step_together(tiny_model_path):
    """Each optimizer steps at this learner step's rate, the critic's as well as the policy's."""
    cfg = LearnerConfig(lr=1e-3, critic_warmup_steps=0, lr_schedule="linear",
                        lr_final_ratio=0.1)
    learner = build_learner("sao", tiny_model_path, cfg, total_steps=4)
    seen = []
    for name, opt in (("policy", learner.policy_opt), ("critic", learner.critic_opt)):
        opt.register_step_pre_hook(lambda o, args, kwargs, name=name: seen.append(
            (name, learner.steps_done, o.param_groups[0]["lr"])))
    rollouts = _batch(learner.policy, 2)
    for _ in range(3):
        learner.update(rollouts)
    scale = [1.0, 0.775, 0.55]  # 1 - 0.9 * k / 4
    expected = [(name, k, base * scale[k]) for k in range(3)
                for name, base in (("critic", 5e-3), ("critic", 5e-3), ("policy", 1e-3))]
    assert [(n, k) for n, k, _ in seen] == [(n, k) for n, k, _ in expected]
    assert [lr for *_, lr in seen] == pytest.approx([lr for *_, lr in expected])


def test_pretrain_critic_uses_the_current_rate(tiny_model_path):
    cfg = LearnerConfig(lr=1e-3, lr_schedule="linear", lr_final_ratio=0.1)
    learner = build_learner("sao", tiny_model_path, cfg, total_steps=4)
    learner.steps_done = 2  # as after a resume
    learner.pretrain_critic(_batch(learner.policy, 2), 1)
    assert learner.critic_opt.param_groups[0]["lr"] == pytest.approx(5e-3 * 0.55)


def test_docstring_examples():
    import doctest

    from sao_gym.learner import schedule

    result = doctest.testmod(schedule)
    assert result.attempted > 0 and result.failed == 0


def test_warmup_hand_values_and_errors():
    from sao_gym.learner.schedule import warmup_scale

    assert [warmup_scale(s, 5) for s in range(6)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1, 1])
    assert warmup_scale(-3, 5) == pytest.approx(0.2) and warmup_scale(0, 0) == 1.0
    with pytest.raises(ValueError, match="warmup_steps"):
        warmup_scale(0, -1)
    with pytest.raises(ValueError, match="lr_warmup_steps"):
        LearnerConfig(lr_warmup_steps=-1)


def test_each_model_warms_up_from_its_own_first_update(tiny_model_path):
    """The critic from step 0; the policy from its first update, after the critic-only steps."""
    cfg = LearnerConfig(lr=1e-3, critic_warmup_steps=2, lr_warmup_steps=4,
                        lr_schedule="linear", lr_final_ratio=0.1)
    learner = build_learner("sao", tiny_model_path, cfg, total_steps=8)
    rollouts = _batch(learner.policy, 4, seed=3)
    for k in range(7):
        m = learner.update(rollouts)
        decay = 1.0 - 0.9 * k / 8
        critic = 5e-3 * decay * min(1.0, (k + 1) / 4)
        policy = 1e-3 * decay * min(1.0, (max(0, k - 2) + 1) / 4)
        assert learner.critic_opt.param_groups[0]["lr"] == pytest.approx(critic)
        assert learner.policy_opt.param_groups[0]["lr"] == pytest.approx(policy)
        assert m["learner/lr"] == pytest.approx(policy)
        assert m["learner/policy_updated"] == float(k >= 2)
    # without a critic the policy warms up from step 0
    grpo = build_learner("running_mean", tiny_model_path, LearnerConfig(
        lr=1e-3, lr_warmup_steps=4))
    assert grpo.update(rollouts)["learner/lr"] == pytest.approx(2.5e-4)
