"""The learner end to end on the tiny model, against slow per-rollout references."""

import io
import math
import random

import pytest
import torch

from sao_gym.learner.critic import is_attention_parameter
from sao_gym.learner.sao import ALGORITHMS, LearnerConfig, build_learner
from tests.learner_helpers import random_multiturn, sampler_logprobs, segments_rollout

METRICS = ["loss/policy", "sao/clip_ratio", "sao/ratio_mean", "sao/approx_kl",
           "policy/grad_norm", "policy/entropy", "learner/tokens", "learner/skipped_steps",
           "learner/step_time_s"]
CRITIC_METRICS = ["loss/value", "critic/explained_variance", "critic/grad_norm"]


def _batch(policy, n, *, seed=0, group_size=None, truncated_every=0):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        task = f"task{i // group_size}" if group_size else f"task{i}"
        out.append(random_multiturn(policy, rng, reward=float(rng.random() < 0.5),
                                    task_id=task,
                                    truncated=bool(truncated_every and i % truncated_every == 0)))
    return out


# ---------- slow references, one rollout at a time ----------

def ref_gae(rewards, values, mask, gamma, lam, bootstrap):
    idx = [t for t, m in enumerate(mask) if m]
    adv = [0.0] * len(mask)
    nxt_v, nxt_a = bootstrap, 0.0
    for t in reversed(idx):
        delta = rewards[t] + gamma * nxt_v - values[t]
        nxt_a = delta + gamma * lam * nxt_a
        adv[t], nxt_v = nxt_a, values[t]
    return adv, [a + v if m else 0.0 for a, v, m in zip(adv, values, mask, strict=True)]


def ref_token_terms(kind, logp, ref, adv, eps_low, eps_high):
    r = math.exp(logp - ref)
    if kind == "dis":
        w = r if 1 - eps_low < r < 1 + eps_high else 0.0
        return -w * adv * logp
    clipped = min(max(r, 1 - eps_low), 1 + eps_high)
    return -min(r * adv, clipped * adv)


def ref_policy_loss(learner, rollouts, advs, kind, eps_low, eps_high, use_sampler):
    total, n = 0.0, 0
    for ro, adv in zip(rollouts, advs, strict=True):
        logp = sampler_logprobs(learner.policy, ro.token_ids)
        ref = ro.rollout_logprobs if use_sampler else logp
        for t, m in enumerate(ro.loss_mask):
            if m:
                total += ref_token_terms(kind, logp[t], ref[t], adv[t], eps_low, eps_high)
                n += 1
    return total / n


@torch.no_grad()
def ref_critic(learner, rollouts, lam_fn):
    advs, value_loss, n = [], 0.0, 0
    for ro in rollouts:
        ids = torch.tensor([ro.token_ids])
        v = learner.critic(ids, torch.ones_like(ids))[0].tolist()
        v = [x if m else 0.0 for x, m in zip(v, ro.loss_mask, strict=True)]
        last = max(t for t, m in enumerate(ro.loss_mask) if m)
        boot = v[last] if ro.truncated else 0.0
        rewards = [ro.reward if t == last else 0.0 for t in range(len(v))]
        a, _ = ref_gae(rewards, v, ro.loss_mask, 1.0, lam_fn(sum(ro.loss_mask)), boot)
        _, ret = ref_gae(rewards, v, ro.loss_mask, 1.0, 1.0, boot)
        advs.append(a)
        for t, m in enumerate(ro.loss_mask):
            if m:
                value_loss += 0.5 * (v[t] - ret[t]) ** 2
                n += 1
    return advs, value_loss / n


def _outcome_advs(rollouts, per_rollout):
    return [[a * m for m in ro.loss_mask] for ro, a in zip(rollouts, per_rollout, strict=True)]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_update_matches_reference_on_one_batch(tiny_model_path, algorithm):
    group = 4 if algorithm.startswith("grpo") else None
    cfg = LearnerConfig(lr=1e-4, critic_warmup_steps=0, critic_updates=1, group_size=4,
                        max_tokens_per_microbatch=64)  # forces gradient accumulation
    learner = build_learner(algorithm, tiny_model_path, cfg)
    rollouts = _batch(learner.policy, 8, seed=1, group_size=group, truncated_every=3)
    if algorithm in ("sao", "vapo"):
        advs, vloss = ref_critic(learner, rollouts, lambda n: 1 - 1 / (1.5 * n))
    elif algorithm == "running_mean":
        advs = _outcome_advs(rollouts, [ro.reward - 0.0 for ro in rollouts])  # no history yet
    else:
        rewards = [ro.reward for ro in rollouts]
        per = []
        for i, r in enumerate(rewards):
            g = rewards[i // 4 * 4: i // 4 * 4 + 4]
            mean = sum(g) / 4
            std = (sum((x - mean) ** 2 for x in g) / 3) ** 0.5
            per.append((r - mean) / (std + 1e-6))
        advs = _outcome_advs(rollouts, per)
    dis = algorithm in ("sao", "grpo_dis", "running_mean")
    expected = ref_policy_loss(learner, rollouts, advs, "dis" if dis else "ppo",
                               0.3 if dis else 0.2, 5.0 if dis else 0.28, use_sampler=dis)
    metrics = learner.update(rollouts)
    for key in METRICS + (CRITIC_METRICS if algorithm in ("sao", "vapo") else []):
        assert key in metrics and math.isfinite(metrics[key]), key
    assert metrics["loss/policy"] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    if algorithm in ("sao", "vapo"):
        assert metrics["loss/value"] == pytest.approx(vloss, rel=1e-4, abs=1e-7)
    assert metrics["learner/tokens"] == sum(len(r.token_ids) for r in rollouts)
    assert learner.policy_version == 1 and metrics["learner/skipped_steps"] == 0
    if not dis:
        assert metrics["sao/ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # old == current


def test_sao_learns_from_fixed_rollouts(tiny_model_path):
    """30 SAO updates raise rewarded completions' logprobs, lower the rest; EV > 0.5."""
    cfg = LearnerConfig(lr=3e-4, critic_lr=3e-3)
    learner = build_learner("sao", tiny_model_path, cfg)
    rng = random.Random(7)
    prompts = [[rng.randrange(1000) for _ in range(6)] for _ in range(2)]
    rollouts = []
    for i in range(8):  # same prompts, different completions: the critic cannot know the
        prompt = prompts[i % 2]  # outcome before the first action token
        action = [rng.randrange(1000) for _ in range(5)]
        ids = prompt + action
        rollouts.append(segments_rollout([(prompt, False), (action, True)],
                                         reward=1.0 if i % 4 < 2 else -1.0, task_id=f"p{i}",
                                         logprobs=sampler_logprobs(learner.policy, ids)))

    def completion_logprob(ro):
        lp = sampler_logprobs(learner.policy, ro.token_ids)
        return sum(x for x, m in zip(lp, ro.loss_mask, strict=True) if m)

    before = [completion_logprob(r) for r in rollouts]
    history = [learner.update(rollouts) for _ in range(30)]
    after = [completion_logprob(r) for r in rollouts]
    for ro, b, a in zip(rollouts, before, after, strict=True):
        assert (a > b) if ro.reward > 0 else (a < b), (ro.task_id, b, a)
    assert history[-1]["critic/explained_variance"] > 0.5
    assert [h["learner/policy_updated"] for h in history[:11]] == [0.0] * 10 + [1.0]
    assert learner.policy_version == 20


def test_warmup_trains_only_the_critic(tiny_model_path):
    learner = build_learner("sao", tiny_model_path, LearnerConfig(lr=1e-3, critic_warmup_steps=2))
    rollouts = _batch(learner.policy, 4)
    p0 = {n: p.clone() for n, p in learner.policy.state_dict().items()}
    c0 = {n: p.clone() for n, p in learner.critic.state_dict().items()}
    learner.update(rollouts)
    learner.update(rollouts)
    assert all(torch.equal(p0[n], p) for n, p in learner.policy.state_dict().items())
    changed = [n for n, p in learner.critic.state_dict().items() if not torch.equal(c0[n], p)]
    assert changed and not any(is_attention_parameter(n) for n in changed)
    learner.update(rollouts)
    assert not all(torch.equal(p0[n], p) for n, p in learner.policy.state_dict().items())


def test_micro_batch_budget_does_not_change_the_update(tiny_model_path):
    results = []
    for budget in (32, 100_000):
        cfg = LearnerConfig(lr=1e-3, critic_warmup_steps=0, max_tokens_per_microbatch=budget)
        learner = build_learner("sao", tiny_model_path, cfg)
        rollouts = _batch(learner.policy, 6, seed=3)
        m = learner.update(rollouts)
        results.append((m, learner.policy.state_dict()))
    (m1, s1), (m2, s2) = results
    for key in ("loss/policy", "loss/value", "sao/clip_ratio", "policy/entropy",
                "policy/grad_norm", "critic/grad_norm", "critic/explained_variance"):
        assert m1[key] == pytest.approx(m2[key], rel=1e-5, abs=1e-7), key
    # Adam's first step is ~lr * sign(grad): near-zero gradients may flip sign with the
    # summation order, so weights agree to 2 * lr, not to float precision
    assert all(torch.allclose(s1[n], s2[n], atol=2.5e-3) for n in s1)


def test_non_finite_loss_skips_the_step_and_keeps_weights(tiny_model_path):
    learner = build_learner("running_mean", tiny_model_path, LearnerConfig(lr=1e-3))
    good = _batch(learner.policy, 3)
    bad = good[:2] + [segments_rollout([([1, 2], False), ([3], True)], float("inf"))]
    before = {n: p.clone() for n, p in learner.policy.state_dict().items()}
    m = learner.update(bad)
    assert m["learner/skipped_steps"] == 1 and learner.policy_version == 0
    assert all(torch.equal(before[n], p) for n, p in learner.policy.state_dict().items())
    m = learner.update(good)
    assert m["learner/skipped_steps"] == 1 and learner.policy_version == 1


def test_state_dict_resume_is_exact(tiny_model_path):
    cfg = LearnerConfig(lr=1e-3, critic_warmup_steps=1)
    a = build_learner("sao", tiny_model_path, cfg)
    rollouts = _batch(a.policy, 4, seed=5)
    a.update(rollouts)
    a.update(rollouts)
    buf = io.BytesIO()  # through bytes, as a checkpoint on disk would be
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=False)
    b = build_learner("sao", tiny_model_path, cfg)
    b.load_state_dict(state)
    assert (b.step, b.policy_version) == (2, 1)
    ma, mb = a.update(rollouts), b.update(rollouts)
    assert ma["loss/policy"] == mb["loss/policy"]
    assert all(torch.equal(p, b.policy.state_dict()[n]) for n, p in a.policy.state_dict().items())
    with pytest.raises(ValueError, match="checkpoint is for"):
        build_learner("vapo", tiny_model_path, cfg).load_state_dict(state)


def test_bad_batches_are_refused_clearly(tiny_model_path):
    import dataclasses

    learner = build_learner("grpo", tiny_model_path, LearnerConfig(group_size=4))
    rollouts = _batch(learner.policy, 4, group_size=2)
    with pytest.raises(ValueError, match="groups of 4"):
        learner.update(rollouts)
    with pytest.raises(ValueError, match="infra failures"):
        learner.update([dataclasses.replace(rollouts[0], infra_failure=True)])
    with pytest.raises(ValueError, match="at least one"):
        learner.update([])
    with pytest.raises(ValueError, match="unknown algorithm"):
        build_learner("ppo", tiny_model_path)
    with pytest.raises(ValueError, match="aggregation"):
        LearnerConfig(aggregation="sum")
    with pytest.raises(ValueError, match="no critic"):
        build_learner("grpo", tiny_model_path).pretrain_critic(rollouts, 1)


def test_pretrain_critic_raises_explained_variance(tiny_model_path):
    learner = build_learner("sao", tiny_model_path, LearnerConfig(lr=1e-4, critic_lr=3e-3))
    rollouts = _batch(learner.policy, 8, seed=11)
    ev = learner.pretrain_critic(rollouts, 25)
    assert ev[-1] > max(ev[0], 0.3)
    assert learner.policy_version == 0


def test_saved_models_reload_for_serving_and_training(tiny_model_path, tmp_path):
    from sao_gym.models import load_policy

    a = build_learner("sao", tiny_model_path, LearnerConfig(lr=1e-3, critic_warmup_steps=0))
    rollouts = _batch(a.policy, 4, seed=2)
    a.update(rollouts)
    a.save_models(tmp_path / "ckpt")
    policy, tok = load_policy(str(tmp_path / "ckpt" / "policy"))
    assert all(torch.equal(p, policy.state_dict()[n]) for n, p in a.policy.state_dict().items())
    assert tok.chat_template is not None
    b = build_learner("sao", str(tmp_path / "ckpt" / "policy"),
                      critic_path=str(tmp_path / "ckpt" / "critic"))
    ids = torch.tensor([rollouts[0].token_ids])
    assert torch.allclose(a.critic(ids, torch.ones_like(ids)), b.critic(ids, torch.ones_like(ids)))
