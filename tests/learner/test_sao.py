"""The learner end to end on the tiny model, against slow per-rollout references."""

import dataclasses
import io
import math
import random

import pytest
import torch

from sao_gym.learner import losses
from sao_gym.learner.batching import micro_batches
from sao_gym.learner.critic import attention_parameter_names
from sao_gym.learner.learner import ALGORITHMS, LearnerConfig, build_learner
from sao_gym.models import load_policy
from tests.learner.helpers import (
    random_batch,
    random_multiturn,
    sampler_logprobs,
    segments_rollout,
    table_learner,
)

METRICS = ["loss/policy", "sao/clip_ratio", "sao/ratio_mean", "sao/approx_kl",
           "policy/grad_norm", "policy/entropy", "learner/tokens", "learner/skipped_steps",
           "learner/step_time_s"]
CRITIC_METRICS = ["loss/value", "critic/explained_variance", "critic/grad_norm"]


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
        after = learner.critic.values_after(ids, torch.ones_like(ids))[0].tolist()
        v = [0.0] + after[:-1]  # the value before token t is the value after token t - 1
        v = [x if m else 0.0 for x, m in zip(v, ro.loss_mask, strict=True)]
        last = max(t for t, m in enumerate(ro.loss_mask) if m)
        # the value after the final observation, when truncated rollouts bootstrap
        ends_on_obs = last < len(ro.token_ids) - 1
        boot = (after[-1] if ro.truncated and learner.config.bootstrap_truncated and ends_on_obs
                else 0.0)
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
    cfg = LearnerConfig(lr=1e-4, critic_warmup_steps=0, critic_updates=1,
                        max_tokens_per_microbatch=64,  # forces gradient accumulation
                        bootstrap_truncated=algorithm == "sao")  # both ways: sao, vapo
    learner = build_learner(algorithm, tiny_model_path, cfg, group_size=group or 1)
    rollouts = random_batch(learner.policy, 8, seed=1, group_size=group, truncated_every=3)
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
    with torch.no_grad():  # the sampler mismatch the step reports, from its starting policy
        (mb,) = micro_batches(rollouts, 1 << 16, learner.pad_id)
        mismatch = losses.sampler_mismatch(learner.score(mb)[0],
                                           mb.rollout_logprobs_BT, mb.action_mask_BT,
                                           eps_low=learner.band[0], eps_high=learner.band[1])
    metrics = learner.update(rollouts)
    assert metrics["mismatch/approx_kl"] == pytest.approx(float(mismatch["approx_kl"]),
                                                          rel=1e-4, abs=1e-8)
    assert metrics["mismatch/masked_share"] == pytest.approx(float(mismatch["masked_share"]))
    if dis:
        assert metrics["mismatch/approx_kl"] == pytest.approx(metrics["sao/approx_kl"], rel=1e-6)
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
    rollouts = random_batch(learner.policy, 4)
    p0 = {n: p.clone() for n, p in learner.policy.state_dict().items()}
    c0 = {n: p.clone() for n, p in learner.critic.state_dict().items()}
    learner.update(rollouts)
    learner.update(rollouts)
    assert all(torch.equal(p0[n], p) for n, p in learner.policy.state_dict().items())
    changed = {n for n, p in learner.critic.state_dict().items() if not torch.equal(c0[n], p)}
    frozen = {"backbone." + n for n in attention_parameter_names(learner.critic.backbone)}
    assert changed and frozen and not changed & frozen
    learner.update(rollouts)
    assert not all(torch.equal(p0[n], p) for n, p in learner.policy.state_dict().items())


def test_micro_batch_budget_does_not_change_the_update(tiny_model_path):
    results = []
    for budget in (32, 100_000):
        cfg = LearnerConfig(lr=1e-3, critic_warmup_steps=0, max_tokens_per_microbatch=budget)
        learner = build_learner("sao", tiny_model_path, cfg)
        rollouts = random_batch(learner.policy, 6, seed=3)
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
    good = random_batch(learner.policy, 3)
    bad = good[:2] + [segments_rollout([([1, 2], False), ([3], True)], float("inf"))]
    before = {n: p.clone() for n, p in learner.policy.state_dict().items()}
    m = learner.update(bad)
    assert m["learner/skipped_steps"] == 1 and learner.policy_version == 0
    assert all(torch.equal(before[n], p) for n, p in learner.policy.state_dict().items())
    m = learner.update(good)
    assert m["learner/skipped_steps"] == 1 and learner.policy_version == 1


def test_the_running_mean_learner_reports_its_baseline(tiny_model_path):
    learner = build_learner("running_mean", tiny_model_path, LearnerConfig(lr=1e-3))
    fresh = [segments_rollout([([1, 2], False), ([3, 4], True)], r, task_id=f"t{i}")
             for i, r in enumerate([1.0, 0.0, 1.0])]
    m = learner.update(fresh)
    assert m["baseline/with_history"] == 0.0 and m["baseline/mean"] == 0.0
    assert m["advantage/mean"] == pytest.approx(2 / 3)  # no baseline: the raw rewards
    m = learner.update(fresh)  # the same tasks again: each window holds its reward
    assert m["baseline/with_history"] == 1.0 and m["baseline/mean"] == pytest.approx(2 / 3)
    assert m["advantage/mean"] == pytest.approx(0.0)
    assert "baseline/mean" not in build_learner("sao", tiny_model_path,
                                                LearnerConfig(lr=1e-3)).update(fresh)


def test_state_dict_resume_is_exact(tiny_model_path):
    cfg = LearnerConfig(lr=1e-3, critic_warmup_steps=1)
    a = build_learner("sao", tiny_model_path, cfg)
    rollouts = random_batch(a.policy, 4, seed=5)
    a.update(rollouts)
    a.update(rollouts)
    buf = io.BytesIO()  # through bytes, as a checkpoint on disk would be
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=False)
    b = build_learner("sao", tiny_model_path, cfg)
    b.load_state_dict(state)
    assert (b.steps_done, b.policy_version) == (2, 1)
    ma, mb = a.update(rollouts), b.update(rollouts)
    assert ma["loss/policy"] == mb["loss/policy"]
    assert all(torch.equal(p, b.policy.state_dict()[n]) for n, p in a.policy.state_dict().items())
    with pytest.raises(ValueError, match="checkpoint is for"):
        build_learner("vapo", tiny_model_path, cfg).load_state_dict(state)


def test_state_on_disk_resumes_exactly_and_single_file_states_still_load(tiny_model_path,
                                                                          tmp_path):
    """``save_state`` (a DCP checkpoint) and an older ``learner.pt`` both resume exactly.

    Saved after the critic-only warm-up step: the policy optimizer has not
    stepped, and must not start from a saved-and-restored state either.
    """
    from sao_gym.learner.state import read_state

    cfg = LearnerConfig(lr=1e-3, critic_warmup_steps=1)
    a = build_learner("sao", tiny_model_path, cfg)
    rollouts = random_batch(a.policy, 4, seed=5)
    a.update(rollouts)
    a.save_state(tmp_path / "sharded")
    (tmp_path / "single").mkdir()
    torch.save(a.state_dict(), tmp_path / "single" / "learner.pt")
    assert read_state(tmp_path / "sharded")["policy_opt"]["state"] == {}
    resumed = []
    for kind in ("sharded", "single"):
        b = build_learner("sao", tiny_model_path, cfg)
        b.load_state(tmp_path / kind)
        assert (b.steps_done, b.policy_version) == (1, 0) and not b.policy_opt.state
        resumed.append(([b.update(rollouts)["loss/policy"] for _ in range(2)], b))
    losses = [a.update(rollouts)["loss/policy"] for _ in range(2)]
    for b_losses, b in resumed:
        assert b_losses == losses
        assert all(torch.equal(p, b.policy.state_dict()[n])
                   for n, p in a.policy.state_dict().items())
        assert all(torch.equal(p, b.critic.state_dict()[n])
                   for n, p in a.critic.state_dict().items())
    with pytest.raises(ValueError, match="checkpoint is for 'sao'"):
        build_learner("grpo", tiny_model_path, cfg, group_size=2).load_state(tmp_path / "sharded")
    with pytest.raises(FileNotFoundError, match="holds no learner state"):
        a.load_state(tmp_path)


def test_bad_batches_are_refused_clearly(tiny_model_path):
    import dataclasses

    learner = build_learner("grpo", tiny_model_path, LearnerConfig(), group_size=4)
    rollouts = random_batch(learner.policy, 4, group_size=2)
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
        learner.pretrain_critic(rollouts, 1)
    with pytest.raises(ValueError, match="grpo trains groups: group_size must be >= 2"):
        build_learner("grpo", tiny_model_path)  # the source's group size is needed


def test_pretrain_critic_raises_explained_variance(tiny_model_path):
    learner = build_learner("sao", tiny_model_path, LearnerConfig(lr=1e-4, critic_lr=3e-3))
    rollouts = random_batch(learner.policy, 8, seed=11)
    ev = learner.pretrain_critic(rollouts, 25)
    assert ev[-1] > max(ev[0], 0.3)
    assert learner.policy_version == 0


def test_saved_models_reload_for_serving_and_training(tiny_model_path, tmp_path):

    a = build_learner("sao", tiny_model_path, LearnerConfig(lr=1e-3, critic_warmup_steps=0))
    rollouts = random_batch(a.policy, 4, seed=2)
    a.update(rollouts)
    a.save_models(tmp_path / "ckpt")
    policy, tok = load_policy(str(tmp_path / "ckpt" / "policy"))
    assert all(torch.equal(p, policy.state_dict()[n]) for n, p in a.policy.state_dict().items())
    assert tok.chat_template is not None
    b = build_learner("sao", str(tmp_path / "ckpt" / "policy"),
                      critic_path=str(tmp_path / "ckpt" / "critic"))
    ids = torch.tensor([rollouts[0].token_ids])
    assert torch.allclose(a.critic(ids, torch.ones_like(ids)), b.critic(ids, torch.ones_like(ids)))


# ---------- policy minibatches ----------

def test_policy_minibatches_split_the_rollouts_each_its_own_step(tiny_model_path):
    """k minibatches = k optimizer steps, even when the batch fits one micro-batch."""
    a = build_learner("running_mean", tiny_model_path, LearnerConfig(lr=1e-3,
                                                                     policy_minibatches=2))
    rollouts = random_batch(a.policy, 6, seed=4)
    assert a.max_versions_per_step == 2
    # the first step trains on rollouts 0-2 alone: its loss has their denominators
    part0 = ref_policy_loss(a, rollouts[:3], _outcome_advs(rollouts[:3], [
        ro.reward for ro in rollouts[:3]]), "dis", 0.3, 5.0, use_sampler=True)
    m = a.update(rollouts)
    assert a.policy_version == 2 and a.steps_done == 1
    assert m["learner/policy_version"] == 2
    # ... and equals two learner steps of one minibatch each (distinct tasks: the
    # running-mean advantages are the rewards either way)
    b = build_learner("running_mean", tiny_model_path, LearnerConfig(lr=1e-3))
    m0, m1 = b.update(rollouts[:3]), b.update(rollouts[3:])
    assert m0["loss/policy"] == pytest.approx(part0, rel=1e-4, abs=1e-6)
    assert m["loss/policy"] == pytest.approx((m0["loss/policy"] + m1["loss/policy"]) / 2,
                                             rel=1e-6)
    assert m["policy/grad_norm"] == pytest.approx(
        (m0["policy/grad_norm"] + m1["policy/grad_norm"]) / 2, rel=1e-6)
    assert all(torch.equal(p, b.policy.state_dict()[n]) for n, p in a.weights().items())
    # each part is micro-batched on its own; the budget does not change the update
    c = build_learner("running_mean", tiny_model_path, LearnerConfig(
        lr=1e-3, policy_minibatches=2, max_tokens_per_microbatch=24))
    mc = c.update(rollouts)
    assert mc["loss/policy"] == pytest.approx(m["loss/policy"], rel=1e-5, abs=1e-7)
    assert c.policy_version == 2


def test_more_minibatches_than_rollouts_gives_one_step_per_rollout(tiny_model_path):
    learner = build_learner("running_mean", tiny_model_path,
                            LearnerConfig(lr=1e-3, policy_minibatches=4))
    learner.update(random_batch(learner.policy, 3, seed=6))
    assert learner.policy_version == 3 <= learner.max_versions_per_step


# ---------- the critic: bootstrap and metrics, with hand values ----------

@pytest.mark.parametrize("truncated, bootstrap, final_obs",
                         [(True, True, True), (False, True, True), (True, False, True),
                          (True, True, False)])
def test_truncated_rollouts_bootstrap_from_the_end_of_the_final_observation(
        tiny_model_path, truncated, bootstrap, final_obs):
    # value after each token: 10 -> 0.2, 11 -> 0.5, 12 -> 1.2, 13 (an observation) -> 5.0
    learner = table_learner(tiny_model_path, {10: 0.2, 11: 0.5, 12: 1.2, 13: 5.0},
                             critic_updates=1, bootstrap_truncated=bootstrap)
    segments = [([10], False), ([11, 12], True)] + ([([13], False)] if final_obs else [])
    ro = segments_rollout(segments, reward=0.5, truncated=truncated)
    m = learner.update([ro])
    # V_0 = V(before 11) = 0.2, V_1 = V(before 12) = 0.5; bootstrap V(after 13) = 5.0, the
    # state after the final observation (not V(after 12) = 1.2, after the last action);
    # 0 when terminated, without bootstrap_truncated, or without a final observation.
    # lambda = 1 - 1/(1.5 * 2) = 2/3
    boot = 5.0 if truncated and bootstrap and final_obs else 0.0
    delta1 = 0.5 + boot - 0.5
    delta0 = 0.5 - 0.2
    a1, a0 = delta1, delta0 + 2 / 3 * delta1
    assert m["advantage/mean"] == pytest.approx((a0 + a1) / 2, abs=1e-6)
    assert m["advantage/std"] == pytest.approx(abs(a0 - a1) / 2 ** 0.5, abs=1e-6)
    ret = 0.5 + boot  # lambda 1: both returns are reward + bootstrap
    assert m["loss/value"] == pytest.approx(0.5 * ((0.2 - ret) ** 2 + (0.5 - ret) ** 2) / 2,
                                            abs=1e-6)


def test_critic_metrics_are_means_over_the_k_updates(tiny_model_path):
    learner = table_learner(tiny_model_path, {10: 0.2, 11: 0.5}, critic_updates=2,
                             critic_lr=0.1)
    ro = segments_rollout([([10], False), ([11, 12], True)], reward=1.0)
    m = learner.update([ro])
    # values (0.2, 0.5), returns (1, 1); grads (V - R) / 2 = (-0.4, -0.25); Adam's first
    # step moves each value by lr * sign(grad) = +0.1 -> values (0.3, 0.6), grads (-0.35, -0.2)
    losses_k = [0.5 * (0.8 ** 2 + 0.5 ** 2) / 2, 0.5 * (0.7 ** 2 + 0.4 ** 2) / 2]
    norms_k = [math.hypot(0.4, 0.25), math.hypot(0.35, 0.2)]
    assert m["loss/value"] == pytest.approx(sum(losses_k) / 2, abs=1e-6)
    assert m["critic/grad_norm"] == pytest.approx(sum(norms_k) / 2, abs=1e-6)
    assert m["critic/value_mean"] == pytest.approx((0.35 + 0.45) / 2, abs=1e-6)
    after = learner.critic(torch.tensor([ro.token_ids]), torch.ones(1, 3, dtype=torch.long))
    # two steps taken (Adam's second step is ~0.0994, no longer exactly lr)
    assert after[0, 1:].tolist() == pytest.approx([0.3994, 0.6988], abs=1e-4)


# ---------- GRPO groups ----------

def test_grpo_groups_by_group_id_even_for_the_same_task(tiny_model_path):
    learner = build_learner("grpo", tiny_model_path, LearnerConfig(lr=1e-4), group_size=4)
    rng = random.Random(3)
    rewards = [1, 1, 0, 1, 0, 1, 0, 0]
    groups = [0, 1, 0, 1, 0, 1, 0, 1]  # interleaved: two groups that drew one task
    rollouts = [random_multiturn(learner.policy, rng, r, task_id="arithmetic:3+4", group_id=g)
                for r, g in zip(rewards, groups, strict=True)]
    # group 0 rewards (1, 0, 0, 0): mean 1/4, sample std 1/2; group 1 (1, 1, 1, 0): 3/4, 1/2
    per = [(r - (0.25 if g == 0 else 0.75)) / (0.5 + 1e-6)
           for r, g in zip(rewards, groups, strict=True)]
    assert [round(a, 4) for a in per] == [1.5, 0.5, -0.5, 0.5, -0.5, 0.5, -0.5, -1.5]
    expected = ref_policy_loss(learner, rollouts, _outcome_advs(rollouts, per), "ppo", 0.2,
                               0.28, use_sampler=False)
    m = learner.update(rollouts)
    assert m["loss/policy"] == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_grpo_groups_must_be_whole_and_of_one_task(tiny_model_path):
    import dataclasses

    learner = build_learner("grpo_dis", tiny_model_path, LearnerConfig(), group_size=2)
    base = random_batch(learner.policy, 4, group_size=2)  # tasks task0, task0, task1, task1
    regroup = [dataclasses.replace(r, group_id=g) for r, g in zip(base, [7, 7, 7, 8],
                                                                 strict=True)]
    with pytest.raises(ValueError, match="a group must hold rollouts of one task"):
        learner.update(regroup)
    three = [dataclasses.replace(r, group_id=7, task_id="x") for r in base[:3]]
    with pytest.raises(ValueError, match=r"groups of 2 .*group_id 7': 3"):
        learner.update(three)
    learner.update(base)  # group_id None: grouped by task_id


# ---------- cost per sample ----------

def _count_forwards(module: torch.nn.Module) -> list[int]:
    calls = [0]
    module.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("updates", [0, 1, 2])
def test_pre_update_values_come_from_the_first_critic_pass(tiny_model_path, updates):
    """K critic updates cost K critic passes (one when K = 0), not K + 1."""
    cfg = LearnerConfig(lr=1e-3, critic_lr=1e-2, critic_updates=updates, critic_warmup_steps=0,
                        max_tokens_per_microbatch=64)
    learner = build_learner("sao", tiny_model_path, cfg)
    rollouts = random_batch(learner.policy, 6, seed=8)
    ref_advs, ref_loss = ref_critic(learner, rollouts, lambda n: 1 - 1 / (cfg.lambda_alpha * n))
    n_mbs = len(micro_batches(rollouts, 64))
    assert n_mbs > 1
    calls = _count_forwards(learner.critic.backbone)
    m = learner.update(rollouts)
    assert calls[0] == max(updates, 1) * n_mbs
    # the advantages still use the values before this step's critic updates (the
    # reference reads the critic before any update)
    action_advs = [a for ro, adv in zip(rollouts, ref_advs, strict=True)
                   for a, mask in zip(adv, ro.loss_mask, strict=True) if mask]
    assert m["advantage/mean"] == pytest.approx(sum(action_advs) / len(action_advs), abs=1e-5)
    if updates == 1:  # the one update's loss is the pre-update values' loss
        assert m["loss/value"] == pytest.approx(ref_loss, rel=1e-5)
    assert ("loss/value" in m) == (updates > 0)


@pytest.mark.parametrize("parts, extra", [(1, 0), (2, 1)])
def test_ppo_old_logprobs_cost_a_pass_only_after_the_first_step(tiny_model_path, parts, extra):
    """The first minibatch's own forward is the start-of-step policy; later ones need one."""
    learner = build_learner("grpo", tiny_model_path, LearnerConfig(
        lr=1e-2, policy_minibatches=parts), group_size=2)
    rollouts = [dataclasses.replace(r, reward=float(i % 2))  # every group has a signal
                for i, r in enumerate(random_batch(learner.policy, 4, group_size=2))]
    calls = _count_forwards(learner.policy.get_decoder())
    m = learner.update(rollouts)
    assert calls[0] == parts + extra  # every part fits one micro-batch
    if parts == 1:
        assert m["sao/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    else:  # the second part is scored against the policy before the first step
        assert abs(m["sao/ratio_mean"] - 1.0) > 1e-3
