"""The learner: SAO and its baselines over a batch of rollouts.

``build_learner(algorithm, policy_path, config)`` picks, once, how advantages
are estimated and which policy loss is used: the algorithm's record in
:data:`sao_gym.learner.algorithms.ALGORITHMS` (sao, vapo, grpo, grpo_dis,
running_mean; the table is there).

One :meth:`Learner.update` is one learner step (``Learner.steps_done`` counts
them: the unit of ``total_steps``, the lr schedule and the critic warm-up).
It sets both learning rates for the step first, then, with a critic: values of
the batch under the current critic -> GAE advantages (length-adaptive policy
lambda) and returns (critic lambda, 1 by default) -> ``critic_updates`` critic
optimizer steps on the whole batch -> the policy steps (none during the first
``critic_warmup_steps`` steps). Advantages use the critic's values *before*
this step's critic updates. With ``bootstrap_truncated`` a truncated rollout
bootstraps from the critic's value *after* its last action token; by default
it ends with its reward, like a terminated one.

The policy steps: the batch's rollouts are cut into ``policy_minibatches``
contiguous parts, one policy optimizer step each (so one update adds at most
``Learner.max_versions_per_step`` policy versions). Each part is
micro-batched under the token budget on its own and gradients accumulate over
its micro-batches; the loss denominators are the part's, so the result does
not depend on the budget. PPO's old logprobs are those of the policy at the
start of the step. A non-finite loss or gradient skips that optimizer step and
leaves the weights untouched (``learner/skipped_steps``).

The GRPO algorithms normalise rewards within groups: rollouts sharing
``Rollout.group_id`` (or ``task_id`` where ``group_id`` is None), each group
exactly ``group_size`` rollouts of one task.

Logprobs (and the entropy metric) are those of ``softmax(logits / temperature)``
with the sampler's ``temperature``, the distribution the tokens were drawn from.
"""

from __future__ import annotations

import inspect
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
import torch.nn.functional as F

from sao_gym.learner import advantages as adv_lib
from sao_gym.learner import losses
from sao_gym.learner.algorithms import ALGORITHMS as ALGORITHM_RECORDS
from sao_gym.learner.algorithms import Algorithm
from sao_gym.learner.batching import (
    MicroBatch,
    first_scored_position,
    mean_entropy,
    micro_batches,
    split_minibatches,
    token_logprobs,
)
from sao_gym.learner.config import LearnerConfig
from sao_gym.learner.critic import ValueModel, values_before
from sao_gym.learner.schedule import lr_scale, warmup_scale
from sao_gym.types import Rollout

logger = logging.getLogger(__name__)

ALGORITHMS = tuple(ALGORITHM_RECORDS)
"""Algorithm names; each is an :class:`~sao_gym.learner.algorithms.Algorithm` record."""


def _algorithm(name: str) -> Algorithm:
    if name not in ALGORITHM_RECORDS:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {ALGORITHMS}")
    return ALGORITHM_RECORDS[name]


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


def _group_key(rollout: Rollout) -> tuple[str, Any]:
    """The GRPO group of a rollout: its ``group_id``, else its ``task_id``."""
    if rollout.group_id is not None:
        return ("group", rollout.group_id)
    return ("task", rollout.task_id)


def _describe_group(key: tuple[str, Any]) -> str:
    kind, value = key
    return f"group_id {value}" if kind == "group" else f"task_id {value!r}"


def _per_rollout(tensors_BT: Sequence[torch.Tensor], mbs: Sequence[MicroBatch],
                 rollouts: Sequence[Rollout]) -> list[torch.Tensor]:
    """Un-pad micro-batch rows: ``out[i]`` is rollout ``i``'s row, ``[len(token_ids)]``."""
    out: list[torch.Tensor] = [torch.empty(0)] * len(rollouts)
    for x_BT, mb in zip(tensors_BT, mbs, strict=True):
        for row, i in enumerate(mb.indices):
            out[i] = x_BT[row, :len(rollouts[i].token_ids)]
    return out


def _pad_rows(rows: Sequence[torch.Tensor], T: int) -> torch.Tensor:
    """Right-pad 1-d rows with 0 into ``[len(rows), T]``."""
    return torch.stack([F.pad(r, (0, T - r.numel())) for r in rows])


def _check_temperature(temperature: float) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not (
            math.isfinite(temperature) and temperature > 0):
        raise ValueError(
            f"temperature must be a finite number > 0 (the sampler's temperature, which the "
            f"learner divides the logits by); got {temperature!r}. Greedy sampling "
            f"(temperature 0) has no distribution to train on.")


def native_bf16(device: str | torch.device = "cpu") -> bool:
    """Whether ``device`` computes bf16 natively.

    CUDA with bf16 support, or a CPU with AVX512-BF16 or AMX (as oneDNN reports it).
    """
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


class Learner:
    """Trains a policy (and a critic, if the algorithm has one) from rollouts.

    ``temperature`` is the sampler's temperature (> 0): the learner's
    logprobs are those of ``softmax(logits / temperature)``, the distribution
    the rollouts' tokens were sampled from (top-p < 1 is refused at config
    time; the learner assumes none).
    """

    def __init__(self, algorithm: str, policy: torch.nn.Module, critic: ValueModel | None,
                 config: LearnerConfig, pad_id: int = 0, tokenizer: Any = None,
                 total_steps: int | None = None, temperature: float = 1.0):
        lr_scale(0, total_steps, config.lr_schedule, config.lr_final_ratio)  # checks
        spec = _algorithm(algorithm)
        if spec.critic != (critic is not None):
            raise ValueError(f"algorithm {algorithm!r} "
                             + ("needs a critic" if spec.critic else "takes no critic"))
        _check_temperature(temperature)
        if config.autocast is not None and not native_bf16(config.device):
            logger.warning(
                "learner autocast %s on %s, which has no native bf16 (no AVX512-BF16/AMX): "
                "expect training to be many times slower than float32", config.autocast,
                config.device)
        self.total_steps = total_steps
        """Length of the run in learner steps, for a decaying ``lr_schedule``."""
        self.algorithm = algorithm
        self.tokenizer = tokenizer
        self.config = config
        self.policy = policy
        self._keeps_logits = "logits_to_keep" in inspect.signature(policy.forward).parameters
        self.critic = critic
        self.pad_id = pad_id
        self.temperature = float(temperature)
        """Sampling temperature the logprobs and the entropy metric are computed at."""
        self.steps_done = 0
        """Learner steps completed (:meth:`update` calls): the unit of ``total_steps``,
        the lr schedule and the critic warm-up."""
        self.policy_version = 0
        """Policy optimizer steps that changed the weights (up to
        :attr:`max_versions_per_step` per learner step)."""
        self.skipped_steps = 0
        """Optimizer steps (policy or critic) skipped for a non-finite loss or gradient."""
        dis = spec.dis
        self._grouped = spec.grouped
        eps_low = config.eps_low if config.eps_low is not None else (0.3 if dis else 0.2)
        eps_high = config.eps_high if config.eps_high is not None else (5.0 if dis else 0.28)
        loss_fn = losses.dis_policy_loss if dis else losses.ppo_clip_policy_loss
        self._policy_loss: Callable[..., tuple[torch.Tensor, dict[str, Any]]] = partial(
            loss_fn, eps_low=eps_low, eps_high=eps_high, aggregation=config.aggregation)
        self._needs_old_logprobs = not dis
        self.baseline = (adv_lib.RunningMeanBaseline(
            config.running_mean_window, per_prompt=config.running_mean_per_prompt)
            if spec.running_mean else None)
        critic_lr = config.critic_lr or 5 * config.lr
        self.policy_opt = self._optimizer(policy, config.lr)
        self.critic_opt = self._optimizer(critic, critic_lr) if critic is not None else None
        # what lr_schedule scales, and the learner step each model's warm-up starts at
        policy_start = config.critic_warmup_steps if critic is not None else 0
        self._base_lrs = [(self.policy_opt, config.lr, policy_start)]
        if self.critic_opt is not None:
            self._base_lrs.append((self.critic_opt, critic_lr, 0))

    @property
    def max_versions_per_step(self) -> int:
        """The most policy versions one :meth:`update` can add (``policy_minibatches``)."""
        return self.config.policy_minibatches

    def weights(self) -> dict[str, torch.Tensor]:
        """The policy's state dict, as an inference backend loads it (``update_weights``).

        Tensors are live references to the parameters: copy or send them
        before the next :meth:`update`.
        """
        return self.policy.state_dict()

    def _set_lr(self) -> float:
        """Apply this step's schedule (and warm-up) to both optimizers; returns the policy lr."""
        c = self.config
        scale = lr_scale(self.steps_done, self.total_steps, c.lr_schedule, c.lr_final_ratio)
        rates = []
        for opt, base, start in self._base_lrs:
            rate = base * scale * warmup_scale(self.steps_done - start, c.lr_warmup_steps)
            for group in opt.param_groups:
                group["lr"] = rate
            rates.append(rate)
        return rates[0]

    def _optimizer(self, model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
        params = [p for p in model.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=lr, weight_decay=self.config.weight_decay)

    # ----- the step -----
    def update(self, rollouts: Sequence[Rollout]) -> dict[str, float]:
        """One learner step on ``rollouts``; returns its metrics."""
        start = time.perf_counter()
        self._check(rollouts)
        # Both schedules move together: this step's rates are set before either model trains.
        metrics: dict[str, float] = {"learner/lr": self._set_lr()}
        mbs = micro_batches(rollouts, self.config.max_tokens_per_microbatch, self.pad_id)
        critic_start = time.perf_counter()
        if self.critic is not None:
            advantages, returns, values, critic_metrics = self._critic_step(rollouts, mbs)
            ev = _explained_variance(values, returns, mbs)
            if math.isfinite(ev):  # undefined (omitted) when the returns have no variance
                metrics["critic/explained_variance"] = ev
            metrics.update(critic_metrics)
        else:
            advantages = self._outcome_advantages(rollouts, mbs)
        policy_start = time.perf_counter()
        train_policy = self.critic is None or self.steps_done >= self.config.critic_warmup_steps
        if train_policy:
            metrics.update(self._train_policy(rollouts, _per_rollout(advantages, mbs, rollouts)))
        self.steps_done += 1
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
            "learner/steps_done": float(self.steps_done),
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
        if self._grouped:
            sizes: dict[tuple[str, Any], int] = {}
            tasks: dict[tuple[str, Any], set[str]] = {}
            for r in rollouts:
                key = _group_key(r)
                sizes[key] = sizes.get(key, 0) + 1
                tasks.setdefault(key, set()).add(r.task_id)
            mixed = {_describe_group(k): sorted(t) for k, t in tasks.items() if len(t) > 1}
            if mixed:
                raise ValueError(f"{self.algorithm}: a group must hold rollouts of one task; "
                                 f"got {mixed}")
            wrong = {_describe_group(k): n for k, n in sizes.items()
                     if n != self.config.group_size}
            if wrong:
                raise ValueError(
                    f"{self.algorithm} needs groups of {self.config.group_size} rollouts "
                    f"(grouped by Rollout.group_id, or task_id where group_id is None); "
                    f"got sizes {wrong}")

    # ----- advantages -----
    def _outcome_advantages(self, rollouts, mbs) -> list[torch.Tensor]:
        rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float32)
        if self.baseline is not None:
            per_rollout = torch.tensor(self.baseline.advantages(
                [r.task_id for r in rollouts], rewards.tolist()), dtype=torch.float32)
        else:
            ids = {k: i for i, k in enumerate(dict.fromkeys(_group_key(r) for r in rollouts))}
            group = torch.tensor([ids[_group_key(r)] for r in rollouts])
            per_rollout = adv_lib.group_normalized_advantages(rewards, group)
        return [per_rollout[mb.indices][:, None] * mb.action_mask_BT for mb in mbs]

    def _gae(self, rollouts, mb: MicroBatch, after_BT: torch.Tensor):
        """``(advantages, returns, values)`` of one micro-batch from ``values_after`` (detached).

        Policy lambda for the advantages, critic lambda for the returns; with
        ``bootstrap_truncated`` a truncated rollout bootstraps from the value
        after its last action token (else from 0, like a terminated one).
        """
        cfg = self.config
        mask = mb.action_mask_BT
        v = values_before(after_BT) * mask
        truncated = torch.tensor([cfg.bootstrap_truncated and rollouts[i].truncated
                                  for i in mb.indices])
        last_B = mask.shape[1] - 1 - mask.flip(-1).argmax(-1)
        # V after the last action token (the full prefix through it), not V before it.
        after_last_B = after_BT.gather(1, last_B[:, None]).squeeze(1)
        bootstrap = torch.where(truncated, after_last_B, 0.0)
        lam = adv_lib.length_adaptive_lambda(_action_counts(mb), cfg.lambda_alpha)
        a, _ = adv_lib.skip_observation_gae(mb.rewards_BT, v, mask, gamma=cfg.gamma,
                                            lam=lam, bootstrap_B=bootstrap)
        _, ret = adv_lib.skip_observation_gae(mb.rewards_BT, v, mask, gamma=cfg.gamma,
                                              lam=cfg.critic_lambda, bootstrap_B=bootstrap)
        return a, ret, v

    def _values_after(self, mb: MicroBatch) -> torch.Tensor:
        """The critic's ``values_after_BT`` of a micro-batch (:mod:`~sao_gym.learner.critic`)."""
        assert self.critic is not None
        dev = self.config.device
        with self._autocast():
            return self.critic.values_after(mb.input_ids_BT.to(dev),
                                            mb.attention_mask_BT.to(dev)).float().cpu()

    def _critic_step(self, rollouts, mbs):
        """Pre-update values -> GAE, then ``critic_updates`` critic optimizer steps.

        Returns ``(advantages, returns, values, metrics)`` per micro-batch. The
        first update's forward pass is the one the advantages are read from (no
        weight changes until every micro-batch has been through it), so the
        pre-update values cost no pass of their own. Metrics are means over the
        updates.
        """
        assert self.critic is not None and self.critic_opt is not None
        updates = self.config.critic_updates
        advantages, returns, values = [], [], []
        n_tok = float(sum(mb.action_mask_BT.sum() for mb in mbs))
        n_seq = float(sum(len(mb.indices) for mb in mbs))
        self.critic.train()
        m = _Metrics()  # identical weights in every update: a mean of the updates' means
        totals, norms = [], []
        for epoch in range(max(updates, 1)):
            total = 0.0
            for j, mb in enumerate(mbs):
                with torch.set_grad_enabled(updates > 0):
                    after_BT = self._values_after(mb)
                if epoch == 0:
                    for out, x in zip((advantages, returns, values),
                                      self._gae(rollouts, mb, after_BT.detach()), strict=True):
                        out.append(x)
                if updates == 0:
                    continue
                loss, stats = losses.value_loss(
                    values_before(after_BT), returns[j], mb.action_mask_BT,
                    old_values_BT=values[j], clip=self.config.value_clip,
                    aggregation=self.config.aggregation, num_tokens=n_tok, num_seqs=n_seq)
                value = float(loss.detach())
                total += value
                if math.isfinite(value):
                    loss.backward()
                m.add(stats, float(mb.action_mask_BT.sum()), "critic/")
            if updates:
                norms.append(self._optimizer_step(self.critic, self.critic_opt,
                                                  finite=math.isfinite(total)))
                totals.append(total)
        metrics = ({"loss/value": sum(totals) / len(totals),
                    "critic/grad_norm": sum(norms) / len(norms), **m.means()} if updates else {})
        return advantages, returns, values, metrics

    def _logits(self, mb: MicroBatch) -> tuple[torch.Tensor, int]:
        """``(logits, start)``: the policy's logits at positions ``start .. T-1``.

        Only the positions that score action tokens are kept (``logits_to_keep``,
        where the model has it): the LM head and the softmax skip the prompt.
        """
        dev, start, keep = self.config.device, 0, {}
        if self._keeps_logits:
            start = first_scored_position(mb)
            keep = {"logits_to_keep": mb.input_ids_BT.shape[1] - start}
        with self._autocast():
            logits = self.policy(input_ids=mb.input_ids_BT.to(dev),
                                 attention_mask=mb.attention_mask_BT.to(dev), **keep).logits
        return logits, start

    def _autocast(self):
        """``torch.autocast`` to ``config.autocast`` (a no-op when it is None)."""
        dtype = self.config.autocast
        return torch.autocast(device_type=torch.device(self.config.device).type,
                              dtype=getattr(torch, dtype or "bfloat16"),
                              enabled=dtype is not None)

    def _logprobs(self, mb: MicroBatch, scored: tuple[torch.Tensor, int]) -> torch.Tensor:
        """``[B, T]`` logprobs of a micro-batch's tokens from :meth:`_logits` (0 before start)."""
        logits, start = scored
        return token_logprobs(logits, mb.input_ids_BT.to(logits.device), self.temperature,
                              start).cpu()

    def _train_policy(self, rollouts: Sequence[Rollout],
                      advantages: Sequence[torch.Tensor]) -> dict[str, float]:
        """One policy optimizer step per minibatch of rollouts; ``advantages[i]`` is ``[T_i]``.

        ``loss/policy`` and ``policy/grad_norm`` are means over the minibatches;
        the other statistics are token-weighted over the whole batch.
        """
        cfg = self.config
        self.policy.train()
        parts = [micro_batches(rollouts, cfg.max_tokens_per_microbatch, self.pad_id, subset=p)
                 for p in split_minibatches(len(rollouts), cfg.policy_minibatches)]
        reference: list[list[torch.Tensor | None]] = [
            [mb.rollout_logprobs_BT for mb in part] for part in parts]
        if self._needs_old_logprobs:
            # PPO's old policy is the one at the start of the step. The first part is
            # trained before any weight changes, so its own forward (detached) is that
            # policy (None below); later parts need a pass before the first step.
            with torch.no_grad():
                reference = [[None] * len(parts[0])] + [
                    [self._logprobs(mb, self._logits(mb)) for mb in part]
                    for part in parts[1:]]
        m = _Metrics()
        part_losses, norms = [], []
        for part, part_reference in zip(parts, reference, strict=True):
            n_tok = float(sum(mb.action_mask_BT.sum() for mb in part))
            n_seq = float(sum(len(mb.indices) for mb in part))
            part_loss = 0.0
            for mb, ref in zip(part, part_reference, strict=True):
                adv_BT = _pad_rows([advantages[i] for i in mb.indices], mb.input_ids_BT.shape[1])
                logits, start = scored = self._logits(mb)
                logprobs = self._logprobs(mb, scored)
                ref = logprobs.detach() if ref is None else ref
                loss, stats = self._policy_loss(logprobs, ref, adv_BT,
                                                mb.action_mask_BT, num_tokens=n_tok,
                                                num_seqs=n_seq)
                value = float(loss.detach())
                part_loss += value
                if math.isfinite(value):
                    loss.backward()
                weight = float(mb.action_mask_BT.sum())
                m.add(stats, weight, "sao/")
                m.add(losses.sampler_mismatch(logprobs, mb.rollout_logprobs_BT,
                                              mb.action_mask_BT), weight, "mismatch/")
                entropy = mean_entropy(logits, mb.action_mask_BT.to(logits.device),
                                       self.temperature, start)
                m.add({"entropy": entropy}, weight, "policy/")
            norms.append(self._optimizer_step(self.policy, self.policy_opt,
                                              finite=math.isfinite(part_loss)))
            part_losses.append(part_loss)
        return {"loss/policy": sum(part_losses) / len(part_losses),
                "policy/grad_norm": sum(norms) / len(norms), **m.means()}

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
        self._set_lr()
        mbs = micro_batches(rollouts, self.config.max_tokens_per_microbatch, self.pad_id)
        history = []
        for _ in range(steps):
            _, returns, values, _ = self._critic_step(rollouts, mbs)
            history.append(_explained_variance(values, returns, mbs))
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
            "steps_done": self.steps_done,
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
        # "step": the name of steps_done in checkpoints written before the rename
        self.steps_done = state["steps_done"] if "steps_done" in state else state["step"]
        self.policy_version = state["policy_version"]
        self.skipped_steps = state["skipped_steps"]
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])


def _explained_variance(values, returns, mbs) -> float:
    mask = torch.cat([mb.action_mask_BT.flatten() for mb in mbs])
    v = torch.cat([x.flatten() for x in values])
    r = torch.cat([x.flatten() for x in returns])
    return float(adv_lib.explained_variance(v[None], r[None], mask[None]))


def build_learner(algorithm: str, policy_path: str, config: LearnerConfig | None = None,
                  *, critic_path: str | None = None, total_steps: int | None = None,
                  temperature: float = 1.0) -> Learner:
    """Load the policy (and critic, for ``sao``/``vapo``) from ``policy_path``.

    The critic starts from the policy checkpoint with a fresh head, or from a
    critic saved by :meth:`Learner.save_models` (``critic_path``).
    ``total_steps`` (the run's length in learner steps) is needed by a decaying
    ``lr_schedule``. ``temperature`` is the sampler's temperature (> 0): the
    learner scores tokens under ``softmax(logits / temperature)``.
    """
    from sao_gym.models import load_policy

    spec = _algorithm(algorithm)
    _check_temperature(temperature)  # before loading any model
    config = config or LearnerConfig()
    torch.manual_seed(config.seed)
    policy, tokenizer = load_policy(policy_path, device=config.device, dtype=config.dtype)
    critic = None
    if spec.critic:
        critic = ValueModel.from_pretrained(critic_path or policy_path,
                                            freeze=config.critic_freeze,
                                            dtype=getattr(torch, config.dtype),
                                            device=config.device, seed=config.seed,
                                            num_layers=config.critic_layers)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return Learner(algorithm, policy, critic, config, pad_id=pad, tokenizer=tokenizer,
                   total_steps=total_steps, temperature=temperature)
