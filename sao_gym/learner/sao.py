"""The learner: SAO and its baselines over a batch of rollouts.

``build_learner(algorithm, policy_path, config)`` picks, once, how advantages
are estimated and which policy loss is used:

=================  =========================================  ==================
algorithm          advantages                                 policy loss
=================  =========================================  ==================
``sao``            critic + skip-observation GAE              DIS (sampler logprobs)
``vapo``           critic + skip-observation GAE              PPO clip (old policy)
``grpo``           group-normalised rewards (G per task)      PPO clip (old policy)
``grpo_dis``       group-normalised rewards (G per task)      DIS (sampler logprobs)
``running_mean``   reward minus a running-mean baseline       DIS (sampler logprobs)
=================  =========================================  ==================

One :meth:`Learner.update` is one learner step. With a critic: values of the
batch under the current critic -> GAE advantages (length-adaptive policy
lambda) and returns (critic lambda, 1 by default) -> ``critic_updates`` critic
optimizer steps -> one policy optimizer step per policy minibatch (none during
the first ``critic_warmup_steps`` steps). Advantages use the critic's values
*before* this step's critic updates.

Rollouts are micro-batched under a token budget and gradients accumulated;
the loss denominators are those of the whole (mini)batch, so the result does
not depend on the budget. A non-finite loss or gradient skips that optimizer
step and leaves the weights untouched (``learner/skipped_steps``).
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sao_gym.learner import advantages as adv_lib
from sao_gym.learner import losses
from sao_gym.learner.batching import MicroBatch, mean_entropy, micro_batches, token_logprobs
from sao_gym.learner.critic import ValueModel
from sao_gym.learner.schedule import LR_SCHEDULES, lr_scale
from sao_gym.types import Rollout

logger = logging.getLogger(__name__)

ALGORITHMS = ("sao", "vapo", "grpo", "grpo_dis", "running_mean")
_CRITIC = {"sao", "vapo"}
_DIS = {"sao", "grpo_dis", "running_mean"}


@dataclass(frozen=True)
class LearnerConfig:
    """Hyperparameters of the learner (paper defaults where it states them)."""

    lr: float = 1e-6
    """Policy learning rate (AdamW)."""
    critic_lr: float | None = None
    """Critic learning rate; ``None`` means 5x ``lr``."""
    eps_low: float | None = None
    """Lower band/clip width; ``None``: 0.3 for DIS, 0.2 for PPO clip."""
    eps_high: float | None = None
    """Upper band/clip width; ``None``: 5.0 for DIS, 0.28 for PPO clip (clip-higher)."""
    aggregation: str = "token_mean"
    """Loss aggregation: token_mean, seq_mean_token_mean or seq_mean_token_sum."""
    gamma: float = 1.0
    """Discount."""
    lambda_alpha: float = 1.5
    """Length-adaptive policy lambda: 1 - 1/(alpha * action tokens)."""
    critic_lambda: float = 1.0
    """GAE lambda of the critic's targets (1: Monte-Carlo returns)."""
    critic_updates: int = 2
    """Critic optimizer steps per learner step (K)."""
    critic_warmup_steps: int = 10
    """First learner steps that train only the critic."""
    critic_freeze: str | None = "attention"
    """``"attention"`` freezes the critic's attention projections; ``None`` trains all."""
    value_clip: float | None = None
    """PPO-style value clipping around the pre-update values; ``None``: plain MSE."""
    group_size: int = 8
    """Rollouts per task for the GRPO algorithms."""
    running_mean_window: int = 8
    """Rewards in the running-mean baseline's window."""
    running_mean_per_prompt: bool = True
    """One window per task (True) or one global window (False)."""
    policy_minibatches: int = 1
    """Policy optimizer steps per learner step (the batch is split)."""
    max_tokens_per_microbatch: int = 16384
    """Padded tokens per forward/backward pass (gradient accumulation beyond)."""
    lr_schedule: str = "constant"
    """``constant``, ``linear`` or ``cosine``: both learning rates fall from their
    base value to ``lr_final_ratio`` times it over the run's total steps."""
    lr_final_ratio: float = 0.1
    """Share of the base learning rates left at the end of a decaying schedule."""
    max_grad_norm: float | None = 1.0
    """Gradient-norm clipping for both models; ``None`` disables clipping."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    dtype: str = "float32"
    """Parameter dtype of both models."""
    device: str = "cpu"
    """Device of both models."""
    seed: int = 0
    """Seeds the critic head and the torch RNG."""

    def __post_init__(self) -> None:
        if self.aggregation not in losses.AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {losses.AGGREGATIONS}")
        for name in ("lr", "lambda_alpha", "max_tokens_per_microbatch", "group_size",
                     "running_mean_window", "policy_minibatches"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.critic_updates < 0 or self.critic_warmup_steps < 0:
            raise ValueError("critic_updates and critic_warmup_steps must be >= 0")
        if not 0.0 < self.gamma <= 1.0 or not 0.0 <= self.critic_lambda <= 1.0:
            raise ValueError("gamma must be in (0, 1] and critic_lambda in [0, 1]")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        if not 0.0 <= self.lr_final_ratio <= 1.0:
            raise ValueError(f"lr_final_ratio must be in [0, 1], got {self.lr_final_ratio}")


@dataclass
class _Metrics:
    """Token-weighted means (maxima for ``*_max`` keys) of per-micro-batch statistics."""

    sums: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)

    maxima: dict[str, float] = field(default_factory=dict)

    def add(self, stats: dict[str, Any], weight: float, prefix: str = "") -> None:
        for k, v in stats.items():
            key = prefix + k
            if k.endswith("_max"):
                self.maxima[key] = max(self.maxima.get(key, -math.inf), float(v))
                continue
            self.sums[key] = self.sums.get(key, 0.0) + float(v) * weight
            self.weights[key] = self.weights.get(key, 0.0) + weight

    def means(self) -> dict[str, float]:
        out = {k: self.sums[k] / max(self.weights[k], 1e-12) for k in self.sums}
        return {**out, **self.maxima}


def _action_counts(mb: MicroBatch) -> torch.Tensor:
    return mb.action_mask_BT.sum(-1)


class Learner:
    """Trains a policy (and a critic, if the algorithm has one) from rollouts."""

    def __init__(self, algorithm: str, policy: torch.nn.Module, critic: ValueModel | None,
                 config: LearnerConfig, pad_id: int = 0, tokenizer: Any = None,
                 total_steps: int | None = None):
        lr_scale(0, total_steps, config.lr_schedule, config.lr_final_ratio)  # checks
        self.total_steps = total_steps
        """Length of the run, for a decaying ``lr_schedule``."""
        self.algorithm = algorithm
        self.tokenizer = tokenizer
        self.config = config
        self.policy = policy
        self.critic = critic
        self.pad_id = pad_id
        self.step = 0
        self.policy_version = 0
        self.skipped_steps = 0
        dis = algorithm in _DIS
        eps_low = config.eps_low if config.eps_low is not None else (0.3 if dis else 0.2)
        eps_high = config.eps_high if config.eps_high is not None else (5.0 if dis else 0.28)
        loss_fn = losses.dis_policy_loss if dis else losses.ppo_clip_policy_loss
        self._policy_loss: Callable[..., tuple[torch.Tensor, dict[str, Any]]] = partial(
            loss_fn, eps_low=eps_low, eps_high=eps_high, aggregation=config.aggregation)
        self._needs_old_logprobs = not dis
        self.baseline = (adv_lib.RunningMeanBaseline(
            config.running_mean_window, per_prompt=config.running_mean_per_prompt)
            if algorithm == "running_mean" else None)
        critic_lr = config.critic_lr or 5 * config.lr
        self.policy_opt = self._optimizer(policy, config.lr)
        self.critic_opt = self._optimizer(critic, critic_lr) if critic is not None else None
        self._base_lrs = [(self.policy_opt, config.lr)]  # what lr_schedule scales
        if self.critic_opt is not None:
            self._base_lrs.append((self.critic_opt, critic_lr))

    def _set_lr(self) -> float:
        """Apply this step's ``lr_schedule`` factor to both optimizers; returns the policy lr."""
        c = self.config
        scale = lr_scale(self.step, self.total_steps, c.lr_schedule, c.lr_final_ratio)
        for opt, base in self._base_lrs:
            for group in opt.param_groups:
                group["lr"] = base * scale
        return c.lr * scale

    def _optimizer(self, model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
        params = [p for p in model.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=lr, weight_decay=self.config.weight_decay)

    # ----- the step -----
    def update(self, rollouts: Sequence[Rollout]) -> dict[str, float]:
        """One learner step on ``rollouts``; returns its metrics."""
        start = time.perf_counter()
        self._check(rollouts)
        mbs = micro_batches(rollouts, self.config.max_tokens_per_microbatch, self.pad_id)
        metrics: dict[str, float] = {}
        critic_start = time.perf_counter()
        if self.critic is not None:
            advantages, returns, values = self._critic_advantages(rollouts, mbs)
            ev = _explained_variance(values, returns, mbs)
            if math.isfinite(ev):  # undefined (omitted) when the returns have no variance
                metrics["critic/explained_variance"] = ev
            metrics.update(self._train_critic(mbs, returns, values))
        else:
            advantages = self._outcome_advantages(rollouts, mbs)
        policy_start = time.perf_counter()
        train_policy = self.critic is None or self.step >= self.config.critic_warmup_steps
        metrics["learner/lr"] = self._set_lr()
        if train_policy:
            metrics.update(self._train_policy(mbs, advantages))
        self.step += 1
        metrics["learner/critic_time_s"] = policy_start - critic_start
        metrics["learner/policy_time_s"] = time.perf_counter() - policy_start
        adv_all = torch.cat([a[mb.action_mask_BT > 0] for a, mb in zip(advantages, mbs,
                                                                           strict=True)])
        metrics.update({
            "advantage/mean": float(adv_all.mean()),
            "advantage/std": float(adv_all.std()) if adv_all.numel() > 1 else 0.0,
            "learner/tokens": float(sum(mb.num_tokens for mb in mbs)),
            "learner/action_tokens": float(adv_all.numel()),
            "learner/skipped_steps": float(self.skipped_steps),
            "learner/policy_updated": float(train_policy),
            "learner/step": float(self.step),
            "learner/policy_version": float(self.policy_version),
            "learner/step_time_s": time.perf_counter() - start,
        })
        return metrics

    def _check(self, rollouts: Sequence[Rollout]) -> None:
        if not rollouts:
            raise ValueError("update needs at least one rollout")
        bad = [i for i, r in enumerate(rollouts) if r.infra_failure]
        if bad:
            raise ValueError(f"rollouts {bad} are infra failures: exclude them from training")
        if self.algorithm in ("grpo", "grpo_dis"):
            sizes: dict[str, int] = {}
            for r in rollouts:
                sizes[r.task_id] = sizes.get(r.task_id, 0) + 1
            wrong = {t: n for t, n in sizes.items() if n != self.config.group_size}
            if wrong:
                raise ValueError(f"{self.algorithm} needs groups of {self.config.group_size} "
                                 f"rollouts per task; got {wrong}")

    # ----- advantages -----
    def _outcome_advantages(self, rollouts, mbs) -> list[torch.Tensor]:
        rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float32)
        if self.baseline is not None:
            per_rollout = torch.tensor(self.baseline.advantages(
                [r.task_id for r in rollouts], rewards.tolist()), dtype=torch.float32)
        else:
            ids = {t: i for i, t in enumerate(dict.fromkeys(r.task_id for r in rollouts))}
            group = torch.tensor([ids[r.task_id] for r in rollouts])
            per_rollout = adv_lib.group_normalized_advantages(rewards, group)
        return [per_rollout[mb.indices][:, None] * mb.action_mask_BT for mb in mbs]

    @torch.no_grad()
    def _critic_advantages(self, rollouts, mbs):
        cfg = self.config
        advantages, returns, values = [], [], []
        for mb in mbs:
            mask = mb.action_mask_BT
            v = self._values(mb) * mask
            truncated = torch.tensor([rollouts[i].truncated for i in mb.indices])
            last = mask.shape[1] - 1 - mask.flip(-1).argmax(-1)
            bootstrap = torch.where(truncated, v.gather(1, last[:, None]).squeeze(1), 0.0)
            lam = adv_lib.length_adaptive_lambda(_action_counts(mb), cfg.lambda_alpha)
            a, _ = adv_lib.skip_observation_gae(mb.rewards_BT, v, mask, gamma=cfg.gamma,
                                                lam=lam, bootstrap_B=bootstrap)
            _, ret = adv_lib.skip_observation_gae(mb.rewards_BT, v, mask, gamma=cfg.gamma,
                                                  lam=cfg.critic_lambda, bootstrap_B=bootstrap)
            advantages.append(a)
            returns.append(ret)
            values.append(v)
        return advantages, returns, values

    def _values(self, mb: MicroBatch) -> torch.Tensor:
        assert self.critic is not None
        dev = self.config.device
        return self.critic(mb.input_ids_BT.to(dev), mb.attention_mask_BT.to(dev)).cpu()

    # ----- optimisation -----
    def _train_critic(self, mbs, returns, old_values) -> dict[str, float]:
        assert self.critic is not None and self.critic_opt is not None
        cfg = self.config
        n_tok = float(sum(mb.action_mask_BT.sum() for mb in mbs))
        n_seq = float(sum(len(mb.indices) for mb in mbs))
        out: dict[str, float] = {}
        self.critic.train()
        for _ in range(cfg.critic_updates):
            m = _Metrics()
            total = 0.0
            for mb, ret, old in zip(mbs, returns, old_values, strict=True):
                v = self._values(mb)
                loss, stats = losses.value_loss(
                    v, ret, mb.action_mask_BT, old_values_BT=old, clip=cfg.value_clip,
                    aggregation=cfg.aggregation, num_tokens=n_tok, num_seqs=n_seq)
                value = float(loss.detach())
                total += value
                if math.isfinite(value):
                    loss.backward()
                m.add(stats, float(mb.action_mask_BT.sum()), "critic/")
            norm = self._optimizer_step(self.critic, self.critic_opt, finite=math.isfinite(total))
            out = {"loss/value": total, "critic/grad_norm": norm, **m.means()}
        return out

    def _logits(self, mb: MicroBatch) -> torch.Tensor:
        dev = self.config.device
        return self.policy(input_ids=mb.input_ids_BT.to(dev),
                           attention_mask=mb.attention_mask_BT.to(dev)).logits

    def _train_policy(self, mbs, advantages) -> dict[str, float]:
        self.policy.train()
        reference = [mb.rollout_logprobs_BT for mb in mbs]
        if self._needs_old_logprobs:
            with torch.no_grad():
                reference = [token_logprobs(self._logits(mb), mb.input_ids_BT.to(
                    self.config.device)).cpu() for mb in mbs]
        m = _Metrics()
        total_loss, norms = 0.0, []
        for part in _split(list(range(len(mbs))), self.config.policy_minibatches):
            n_tok = float(sum(mbs[i].action_mask_BT.sum() for i in part))
            n_seq = float(sum(len(mbs[i].indices) for i in part))
            part_loss = 0.0
            for i in part:
                mb = mbs[i]
                logits = self._logits(mb)
                logp = token_logprobs(logits, mb.input_ids_BT.to(logits.device)).cpu()
                loss, stats = self._policy_loss(logp, reference[i], advantages[i],
                                                mb.action_mask_BT, num_tokens=n_tok,
                                                num_seqs=n_seq)
                value = float(loss.detach())
                part_loss += value
                if math.isfinite(value):
                    loss.backward()
                weight = float(mb.action_mask_BT.sum())
                m.add(stats, weight, "sao/")
                m.add({"entropy": mean_entropy(logits, mb.action_mask_BT.to(logits.device))},
                      weight, "policy/")
            norms.append(self._optimizer_step(self.policy, self.policy_opt,
                                              finite=math.isfinite(part_loss)))
            total_loss += part_loss
        return {"loss/policy": total_loss, "policy/grad_norm": max(norms), **m.means()}

    def _optimizer_step(self, model: torch.nn.Module, opt: torch.optim.Optimizer,
                        *, finite: bool) -> float:
        params = [p for p in model.parameters() if p.requires_grad and p.grad is not None]
        max_norm = self.config.max_grad_norm or float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm)) if params else 0.0
        if finite and math.isfinite(norm):
            opt.step()
            if model is self.policy:
                self.policy_version += 1
        else:
            self.skipped_steps += 1
            logger.warning("non-finite %s; optimizer step skipped",
                           "loss" if not finite else f"gradient norm ({norm})")
        opt.zero_grad(set_to_none=True)
        return norm

    # ----- critic pre-training -----
    def pretrain_critic(self, rollouts: Sequence[Rollout], steps: int) -> list[float]:
        """Fit the critic alone on ``rollouts`` for ``steps`` steps; returns EV per step."""
        if self.critic is None:
            raise ValueError(f"algorithm {self.algorithm!r} has no critic to pre-train")
        self._check(rollouts)
        mbs = micro_batches(rollouts, self.config.max_tokens_per_microbatch, self.pad_id)
        history = []
        for _ in range(steps):
            _, returns, values = self._critic_advantages(rollouts, mbs)
            history.append(_explained_variance(values, returns, mbs))
            self._train_critic(mbs, returns, values)
        return history

    # ----- checkpoints -----
    def save_models(self, path: str | os.PathLike[str]) -> None:
        """Write ``path/policy`` (HF format, with the tokenizer) and ``path/critic``.

        ``path/policy`` can be served (``HFBackend``) or trained on; pass
        ``critic_path=path/"critic"`` to :func:`build_learner` to reuse the critic.
        """
        path = Path(path)
        self.policy.save_pretrained(str(path / "policy"))
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(str(path / "policy"))
        if self.critic is not None:
            self.critic.save_pretrained(path / "critic")

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: models, optimizers, counters, baseline, RNG.

        Like ``nn.Module.state_dict``, tensors are references to live state:
        serialise (``torch.save``) before training on.
        """
        return {
            "algorithm": self.algorithm,
            "policy": self.policy.state_dict(),
            "policy_opt": self.policy_opt.state_dict(),
            "critic": self.critic.state_dict() if self.critic is not None else None,
            "critic_opt": self.critic_opt.state_dict() if self.critic_opt else None,
            "step": self.step,
            "policy_version": self.policy_version,
            "skipped_steps": self.skipped_steps,
            "baseline": self.baseline.state_dict() if self.baseline else None,
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                    "numpy": np.random.get_state()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        if state["algorithm"] != self.algorithm:
            raise ValueError(f"checkpoint is for {state['algorithm']!r}, not {self.algorithm!r}")
        self.policy.load_state_dict(state["policy"])
        self.policy_opt.load_state_dict(state["policy_opt"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
            self.critic_opt.load_state_dict(state["critic_opt"])
        if self.baseline is not None:
            self.baseline.load_state_dict(state["baseline"])
        self.step, self.policy_version = state["step"], state["policy_version"]
        self.skipped_steps = state["skipped_steps"]
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])


def _split(items: list[int], parts: int) -> list[list[int]]:
    parts = max(1, min(parts, len(items)))
    return [items[i::parts] for i in range(parts)]


def _explained_variance(values, returns, mbs) -> float:
    mask = torch.cat([mb.action_mask_BT.flatten() for mb in mbs])
    v = torch.cat([x.flatten() for x in values])
    r = torch.cat([x.flatten() for x in returns])
    return float(adv_lib.explained_variance(v[None], r[None], mask[None]))


def build_learner(algorithm: str, policy_path: str, config: LearnerConfig | None = None,
                  *, critic_path: str | None = None, total_steps: int | None = None) -> Learner:
    """Load the policy (and critic, for ``sao``/``vapo``) from ``policy_path``.

    The critic starts from the policy checkpoint with a fresh head, or from a
    critic saved by :meth:`Learner.save_models` (``critic_path``).
    ``total_steps`` (the run's length) is needed by a decaying ``lr_schedule``.
    """
    from sao_gym.models import load_policy

    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {ALGORITHMS}")
    config = config or LearnerConfig()
    torch.manual_seed(config.seed)
    policy, tokenizer = load_policy(policy_path, device=config.device, dtype=config.dtype)
    critic = None
    if algorithm in _CRITIC:
        critic = ValueModel.from_pretrained(critic_path or policy_path,
                                            freeze=config.critic_freeze,
                                            dtype=getattr(torch, config.dtype),
                                            device=config.device, seed=config.seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return Learner(algorithm, policy, critic, config, pad_id=pad, tokenizer=tokenizer,
                   total_steps=total_steps)
