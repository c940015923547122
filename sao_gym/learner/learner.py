"""The learner: one algorithm record, two model engines, one step over a batch of rollouts.

``build_learner(algorithm, policy_path, config)`` loads the models and
wraps each in a :class:`~sao_gym.learner.engine.LocalEngine`; the
:class:`Learner` reads its :class:`~sao_gym.learner.algorithms.Algorithm`
record (a built-in name, ``module:NAME``, or the record) and never checks a
name: the record's estimator gives the advantages, its policy loss (with
its band widths, unless ``learner.eps_low/eps_high`` set them) trains.

One :meth:`Learner.update` is one learner step (``Learner.steps_done`` counts
them: the unit of ``total_steps``, the lr schedule and the critic warm-up):

1. both learning rates are set for the step;
2. with a critic: ``critic_updates`` critic optimizer steps on the whole batch
   towards skip-observation GAE returns (critic lambda, 1 by default); the
   first update's forward pass gives the values the advantages are read
   from (before any of this step's critic updates);
3. the algorithm's advantages;
4. the policy steps (none during the first ``critic_warmup_steps`` steps):
   the rollouts are cut into ``policy_minibatches`` contiguous parts, one
   optimizer step each (so one update adds at most
   ``Learner.max_versions_per_step`` policy versions); each part is
   micro-batched under the token budget on its own and gradients accumulate
   over its micro-batches, the loss denominators being the part's. A ratio
   against the old policy (``reference: old_policy``) uses the policy at the
   start of the step.

A non-finite loss or gradient skips that optimizer step and leaves the
weights untouched (``learner/skipped_steps``). With ``bootstrap_truncated``
a truncated rollout bootstraps from the critic's value at the end of its final
observation (where its next action would start); by default it ends with its
reward, like a terminated one. Grouped
algorithms train groups of exactly ``group_size`` rollouts of one task
(``Rollout.group_id``, or ``task_id`` where it is None).

Every tensor of the step lives on the engines' device: micro-batches are
moved once, and losses, advantages and statistics are computed there.
Logprobs (and the entropy metric) are those of ``softmax(logits / temperature)``
with the sampler's ``temperature``, the distribution the tokens were drawn from.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch

from sao_gym.learner import losses
from sao_gym.learner import state as learner_state
from sao_gym.learner.algorithms import ALGORITHMS as ALGORITHM_RECORDS
from sao_gym.learner.algorithms import Algorithm, find_algorithm
from sao_gym.learner.batching import (
    MicroBatch,
    first_scored_position,
    masked_mean,
    micro_batches,
    per_rollout_rows,
    rows_of,
    split_minibatches,
    token_entropy,
    token_logprobs,
    unpad,
)
from sao_gym.learner.config import LearnerConfig, engine_builder
from sao_gym.learner.critic import ValueModel, values_before
from sao_gym.learner.engine import (
    Engine,
    RankGroup,
    rank_device,
)
from sao_gym.learner.estimators import AdvantageBatch, group_key, skip_observation_targets
from sao_gym.learner.schedule import lr_scale, warmup_scale
from sao_gym.learner.step_metrics import StepMetrics, explained_variance_of
from sao_gym.learner.trace import check_trace, token_trace
from sao_gym.types import Rollout

logger = logging.getLogger(__name__)

ALGORITHMS = tuple(ALGORITHM_RECORDS)
"""Built-in algorithm names; each is an :class:`~sao_gym.learner.algorithms.Algorithm`."""


def _describe_group(key: tuple[str, Any]) -> str:
    kind, value = key
    return f"group_id {value}" if kind == "group" else f"task_id {value!r}"


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

    ``algorithm``: a name, ``module:NAME`` or an
    :class:`~sao_gym.learner.algorithms.Algorithm`. ``policy`` and ``critic``
    are :class:`~sao_gym.learner.engine.Engine` s (``critic`` None unless the
    algorithm has one). ``temperature`` is the sampler's temperature (> 0):
    the learner's logprobs are those of ``softmax(logits / temperature)``, the
    distribution the rollouts' tokens were sampled from.
    """

    def __init__(self, algorithm: str | Algorithm, policy: Engine, critic: Engine | None,
                 config: LearnerConfig, pad_id: int = 0, tokenizer: Any = None,
                 total_steps: int | None = None, temperature: float = 1.0,
                 group_size: int = 1):
        lr_scale(0, total_steps, config.lr_schedule, config.lr_final_ratio)  # checks
        spec = find_algorithm(algorithm)
        if spec.critic != (critic is not None):
            raise ValueError(f"algorithm {spec.name!r} "
                             + ("needs a critic" if spec.critic else "takes no critic"))
        _check_temperature(temperature)
        if config.autocast is not None and not native_bf16(config.device):
            logger.warning(
                "learner autocast %s on %s, which has no native bf16 (no AVX512-BF16/AMX): "
                "expect training to be many times slower than float32", config.autocast,
                config.device)
        if spec.grouped and group_size < 2:
            raise ValueError(f"{spec.name} trains groups: group_size must be >= 2, got "
                             f"{group_size}")
        self.spec = spec
        """The algorithm's record."""
        self.group_size = group_size
        """Rollouts per group of a grouped algorithm (the rollout source's ``group_size``)."""
        self.algorithm = spec.name
        self.total_steps = total_steps
        """Length of the run in learner steps, for a decaying ``lr_schedule``."""
        self.tokenizer, self.config, self.pad_id = tokenizer, config, pad_id
        self.policy_engine, self.critic_engine = policy, critic
        self.group: RankGroup = policy.group
        """The ranks training together (each runs this learner on its share of the
        micro-batches; one process: :data:`~sao_gym.learner.engine.SINGLE`)."""
        if critic is not None and (critic.group.size, critic.group.rank) != (
                self.group.size, self.group.rank):
            raise ValueError("the policy and critic engines must train on the same ranks")
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
        self.trace: dict[int, dict[str, list[float]]] = {}
        """Per-token quantities of the rollouts the last :meth:`update` was asked to trace:
        ``trace[i]`` (``i`` a position in its batch) maps ``advantage``, and where the step
        computed them ``value`` and ``return`` (the critic's, before its update) and
        ``logprob``, ``ratio`` (policy over sampler) and ``dis_mask`` (1: the token is
        inside DIS's band), each a list as long as the rollout (0 off action tokens)."""
        self.band = (spec.eps[0] if config.eps_low is None else config.eps_low,
                     spec.eps[1] if config.eps_high is None else config.eps_high)
        """``(eps_low, eps_high)`` of the policy loss and of the ``mismatch/`` metrics."""
        self._policy_loss = partial(spec.policy_loss, eps_low=self.band[0],
                                    eps_high=self.band[1], aggregation=config.aggregation)
        self.state = spec.state(config) if spec.state is not None else None
        """The algorithm's own state (``Algorithm.state``), saved in checkpoints."""
        # what lr_schedule scales, and the learner step each model's warm-up starts at
        self._base_lrs = [(policy, config.lr, config.critic_warmup_steps if critic else 0)]
        if critic is not None:
            self._base_lrs.append((critic, config.critic_lr or 5 * config.lr, 0))

    # ----- the models, for callers that need them whole (tests, saving) -----
    @property
    def policy(self) -> Any:
        """The policy model (the policy engine's module)."""
        return self.policy_engine.module

    @property
    def critic(self) -> Any:
        """The critic model, or None."""
        return self.critic_engine.module if self.critic_engine is not None else None

    @property
    def policy_opt(self) -> Any:
        """The policy engine's optimizer."""
        return self.policy_engine.optimizer

    @property
    def critic_opt(self) -> Any:
        """The critic engine's optimizer, or None."""
        return self.critic_engine.optimizer if self.critic_engine is not None else None

    @property
    def max_versions_per_step(self) -> int:
        """The most policy versions one :meth:`update` can add (``policy_minibatches``)."""
        return self.config.policy_minibatches

    def weights(self) -> dict[str, torch.Tensor]:
        """The policy's state dict, as an inference backend loads it (``update_weights``).

        Tensors are live references to the parameters: copy or send them
        before the next :meth:`update`.
        """
        return self.policy_engine.weights()

    @torch.no_grad()
    def logprobs_of(self, prompt: Sequence[int], tokens: Sequence[int]) -> list[float]:
        """The policy's logprobs of ``tokens`` after ``prompt``, at the sampling temperature."""
        ids = torch.tensor([[*prompt, *tokens]], device=self.policy_engine.device)
        logits = self.policy_engine.forward(input_ids=ids).logits.float()
        lp = token_logprobs(logits, ids, self.temperature)[0, len(prompt):]
        return [float(x) for x in lp]

    # ----- the step -----
    def update(self, rollouts: Sequence[Rollout], trace: Sequence[int] = ()
               ) -> dict[str, float]:
        """One learner step on ``rollouts``; returns its metrics (module docs).

        ``trace``: positions in ``rollouts`` whose per-token quantities the step
        keeps in :attr:`trace` (every rank gets them all).
        """
        start = time.perf_counter()
        self._check(rollouts)
        want = check_trace(trace, len(rollouts))
        metrics: dict[str, float] = {"learner/lr": self._set_lr()}
        mbs = self._micro_batches(rollouts)
        critic_start, values_after, targets = time.perf_counter(), None, None
        if self.critic_engine is not None:
            values_after, critic_metrics, targets = self._train_critic(rollouts, mbs)
            metrics.update(critic_metrics)
        advantages = self.spec.advantages(AdvantageBatch(rollouts, mbs, self.config,
                                                         values_after, self.state))
        if hasattr(self.state, "metrics"):  # an algorithm's state may report on itself
            metrics.update(self.state.metrics())
        policy_start = time.perf_counter()
        train_policy = self.steps_done >= self._base_lrs[0][2]
        per_rollout = per_rollout_rows(advantages, mbs, rollouts)
        scored: dict[int, torch.Tensor] = {}
        if train_policy:
            metrics.update(self._train_policy(rollouts, per_rollout, scored if want else None))
        self.trace = {}
        if want:
            per_target = [None, None] if targets is None else [
                per_rollout_rows([t[k] for t in targets], mbs, rollouts) for k in (0, 1)]
            self.trace = token_trace(rollouts, want, per_rollout, values=per_target[1],
                                     returns=per_target[0], scored=self.group.union(scored),
                                     band=self.band)
        self.steps_done += 1
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
            "learner/critic_time_s": policy_start - critic_start,
            "learner/policy_time_s": time.perf_counter() - policy_start,
            "learner/step_time_s": time.perf_counter() - start,
        })
        return metrics

    def _micro_batches(self, rollouts: Sequence[Rollout], subset: Sequence[int] | None = None
                       ) -> list[MicroBatch]:
        """The rollouts micro-batched under the token budget, on the policy's device."""
        return [self.policy_engine.to_device(mb) for mb in micro_batches(
            rollouts, self.config.max_tokens_per_microbatch, self.pad_id, subset=subset)]

    def _set_lr(self) -> float:
        """Apply this step's schedule (and warm-up) to both engines; returns the policy lr."""
        c = self.config
        scale = lr_scale(self.steps_done, self.total_steps, c.lr_schedule, c.lr_final_ratio)
        rates = []
        for engine, base, start in self._base_lrs:
            rates.append(base * scale * warmup_scale(self.steps_done - start, c.lr_warmup_steps))
            engine.set_lr(rates[-1])
        return rates[0]

    def _check(self, rollouts: Sequence[Rollout]) -> None:
        if not rollouts:
            raise ValueError("update needs at least one rollout")
        bad = [i for i, r in enumerate(rollouts) if r.infra_failure]
        if bad:
            raise ValueError(f"rollouts {bad} are infra failures: exclude them from training")
        if not self.spec.grouped:
            return
        sizes: dict[tuple[str, Any], int] = {}
        tasks: dict[tuple[str, Any], set[str]] = {}
        for r in rollouts:
            key = group_key(r)
            sizes[key] = sizes.get(key, 0) + 1
            tasks.setdefault(key, set()).add(r.task_id)
        mixed = {_describe_group(k): sorted(t) for k, t in tasks.items() if len(t) > 1}
        if mixed:
            raise ValueError(f"{self.algorithm}: a group must hold rollouts of one task; "
                             f"got {mixed}")
        wrong = {_describe_group(k): n for k, n in sizes.items() if n != self.group_size}
        if wrong:
            raise ValueError(
                f"{self.algorithm} needs groups of {self.group_size} rollouts "
                f"(grouped by Rollout.group_id, or task_id where group_id is None); "
                f"got sizes {wrong}")

    # ----- the critic -----
    def _train_critic(self, rollouts: Sequence[Rollout], mbs: Sequence[MicroBatch]
                      ) -> tuple[list[torch.Tensor], dict[str, float],
                                 list[tuple[torch.Tensor, torch.Tensor]]]:
        """``critic_updates`` critic optimizer steps.

        ``(values_after per mb, metrics, (returns, values) per mb)``.

        The values are those of the first update's forward pass (no weight
        changes until every micro-batch has been through it), so the
        pre-update values cost no pass of their own. Metrics are means over
        the updates.
        """
        engine, c, group = self.critic_engine, self.config, self.group
        assert engine is not None
        updates = c.critic_updates
        mine = group.share([mb.num_tokens for mb in mbs])
        after: dict[int, torch.Tensor] = {}
        targets: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # (returns, values)
        n_tok = float(sum(mb.action_mask_BT.sum() for mb in mbs))
        n_seq = float(sum(len(mb.indices) for mb in mbs))
        engine.train()
        m = StepMetrics()  # identical weights in every update: a mean of the updates' means
        totals, norms = [], []
        for _ in range(max(updates, 1)):
            total = 0.0
            for j, w in mine:
                mb = mbs[j]
                with torch.set_grad_enabled(updates > 0):
                    after_BT = engine.forward(mb.input_ids_BT, mb.attention_mask_BT,
                                              method="values_after").float()
                if j not in targets:  # the first update's values
                    _, ret, v = skip_observation_targets(
                        rollouts, mb, after_BT.detach(), gamma=c.gamma, lam=c.critic_lambda,
                        bootstrap_truncated=c.bootstrap_truncated)
                    targets[j] = ret, v
                    if w:
                        after[j] = after_BT.detach()
                if updates == 0:
                    continue
                ret, v = targets[j]
                loss, stats = losses.value_loss(
                    values_before(after_BT), ret, mb.action_mask_BT, old_values_BT=v,
                    clip=c.value_clip, aggregation=c.aggregation, num_tokens=n_tok,
                    num_seqs=n_seq)
                loss = loss * w
                total += float(loss.detach())
                engine.backward(loss)  # a non-finite total skips the step (and clears it)
                m.add(stats, float(mb.action_mask_BT.sum()) * w, "critic/")
            if updates:
                total = group.sum([total])[0]
                norms.append(self._step(engine, finite=math.isfinite(total)))
                totals.append(total)
        metrics = ({"loss/value": sum(totals) / len(totals),
                    "critic/grad_norm": sum(norms) / len(norms), **m.means(group)}
                   if updates else {})
        after = group.union(after)
        targets = group.union({j: targets[j] for j, w in mine if w})
        ev = explained_variance_of([targets[j][1] for j in range(len(mbs))],
                                 [targets[j][0] for j in range(len(mbs))], mbs)
        if math.isfinite(ev):  # undefined (omitted) when the returns have no variance
            metrics["critic/explained_variance"] = ev
        return ([after[j] for j in range(len(mbs))], metrics,
                [targets[j] for j in range(len(mbs))])

    # ----- the policy -----
    def score(self, mb: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logprobs [B, T], entropy [B, T])``: the policy's scores of a micro-batch's actions.

        On the policy's device (``mb`` is moved there), at the sampler's
        temperature; the logprobs are differentiable, the entropies (of the
        distributions the action tokens were drawn from) are not. Both are 0
        off the action tokens. Through the model's ``score_tokens``
        (:mod:`sao_gym.learner.head`: the LM head a chunk of action tokens at
        a time) where it has one; else from its logits, of only the positions
        that score action tokens where it takes ``logits_to_keep``.
        """
        mb, engine = self.policy_engine.to_device(mb), self.policy_engine
        if engine.scores_tokens:
            return engine.forward(mb.input_ids_BT, mb.attention_mask_BT, mb.action_mask_BT,
                                  self.temperature, method="score_tokens")
        start, keep = 0, {}
        if engine.keeps_logits:
            start = first_scored_position(mb)
            keep = {"logits_to_keep": mb.input_ids_BT.shape[1] - start}
        logits = engine.forward(input_ids=mb.input_ids_BT, attention_mask=mb.attention_mask_BT,
                                **keep).logits
        return (token_logprobs(logits, mb.input_ids_BT, self.temperature, start),
                token_entropy(logits, mb.action_mask_BT, self.temperature, start))

    def _train_policy(self, rollouts: Sequence[Rollout],
                      advantages: Sequence[torch.Tensor],
                      scored: dict[int, torch.Tensor] | None = None) -> dict[str, float]:
        """One policy optimizer step per minibatch of rollouts; ``advantages[i]`` is ``[T_i]``.

        ``loss/policy`` and ``policy/grad_norm`` are means over the minibatches;
        the other statistics are token-weighted over the whole batch. ``scored``
        collects the (detached) logprobs of every rollout this rank scored.
        """
        self.policy_engine.train()
        group = self.group
        parts = [self._micro_batches(rollouts, p)
                 for p in split_minibatches(len(rollouts), self.config.policy_minibatches)]
        shares = [group.share([mb.num_tokens for mb in part]) for part in parts]
        reference: list[dict[int, torch.Tensor | None]] = [
            {j: part[j].rollout_logprobs_BT for j, _ in mine} for part, mine in zip(
                parts, shares, strict=True)]
        if self.spec.reference == "old_policy":
            # The old policy is the one at the start of the step. The first part is
            # trained before any weight changes, so its own forward (detached) is that
            # policy (None below); later parts need a pass before the first step.
            with torch.no_grad():
                reference = [dict.fromkeys(reference[0])] + [
                    {j: self.score(part[j])[0] for j, _ in mine}
                    for part, mine in zip(parts[1:], shares[1:], strict=True)]
        m = StepMetrics()
        part_losses, norms = [], []
        for part, mine, part_reference in zip(parts, shares, reference, strict=True):
            n_tok = float(sum(mb.action_mask_BT.sum() for mb in part))
            n_seq = float(sum(len(mb.indices) for mb in part))
            part_loss = 0.0
            for j, w in mine:
                mb, ref = part[j], part_reference[j]
                adv_BT = rows_of(advantages, mb)
                logprobs, entropy_BT = self.score(mb)
                if scored is not None:
                    scored.update(unpad(logprobs.detach(), mb))
                ref = logprobs.detach() if ref is None else ref
                loss, stats = self._policy_loss(logprobs, ref, adv_BT, mb.action_mask_BT,
                                                num_tokens=n_tok, num_seqs=n_seq)
                loss = loss * w
                part_loss += float(loss.detach())
                self.policy_engine.backward(loss)  # a non-finite part skips the step
                weight = float(mb.action_mask_BT.sum()) * w
                m.add(stats, weight, "sao/")
                m.add(losses.sampler_mismatch(logprobs, mb.rollout_logprobs_BT, mb.action_mask_BT,
                                              eps_low=self.band[0], eps_high=self.band[1]),
                      weight, "mismatch/")
                m.add({"entropy": masked_mean(entropy_BT, mb.action_mask_BT)}, weight, "policy/")
            part_loss = group.sum([part_loss])[0]
            norms.append(self._step(self.policy_engine, finite=math.isfinite(part_loss)))
            part_losses.append(part_loss)
        return {"loss/policy": sum(part_losses) / len(part_losses),
                "policy/grad_norm": sum(norms) / len(norms), **m.means(group)}

    def _step(self, engine: Engine, *, finite: bool) -> float:
        """One optimizer step of ``engine``, counted; its gradient norm."""
        norm, stepped = engine.step(finite=finite)
        if not stepped:
            self.skipped_steps += 1
        elif engine is self.policy_engine:
            self.policy_version += 1
        return norm

    # ----- critic pre-training -----
    def pretrain_critic(self, rollouts: Sequence[Rollout], steps: int) -> list[float]:
        """Fit the critic alone on ``rollouts`` for ``steps`` steps; returns EV per step."""
        if self.critic_engine is None:
            raise ValueError(f"algorithm {self.algorithm!r} has no critic to pre-train")
        self._check(rollouts)
        self._set_lr()
        mbs = self._micro_batches(rollouts)
        return [self._train_critic(rollouts, mbs)[1].get("critic/explained_variance", math.nan)
                for _ in range(steps)]

    # ----- checkpoints -----
    def save_policy(self, path: str | Path) -> None:
        """Write the policy (HF format) with its tokenizer to ``path``: servable, trainable."""
        self.policy_engine.save(path)
        if self.tokenizer is not None and self.group.rank == 0:
            self.tokenizer.save_pretrained(str(path))

    def save_models(self, path: str | Path) -> None:
        """Write ``path/policy`` (:meth:`save_policy`) and ``path/critic``.

        Pass ``critic_path=path/"critic"`` to :func:`build_learner` to reuse the critic.
        """
        path = Path(path)
        self.save_policy(path / "policy")
        if self.critic_engine is not None:
            self.critic_engine.save(path / "critic")

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume, whole, in memory: models, optimizers, counters, RNG.

        Like ``nn.Module.state_dict``, tensors are references to live state:
        serialise (``torch.save``) before training on. Checkpoints use
        :meth:`save_state` (sharded, every rank writing its own part).
        """
        policy = self.policy_engine.state_dict()
        critic = self.critic_engine.state_dict() if self.critic_engine is not None else {}
        return {**learner_state.counters(self),
                "policy": policy["model"], "policy_opt": policy["optimizer"],
                "critic": critic.get("model"), "critic_opt": critic.get("optimizer")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        learner_state.check_algorithm(self, state)
        self.policy_engine.load_state_dict({"model": state["policy"],
                                            "optimizer": state["policy_opt"]})
        if self.critic_engine is not None:
            self.critic_engine.load_state_dict({"model": state["critic"],
                                                "optimizer": state["critic_opt"]})
        learner_state.restore_counters(self, state)

    def save_state(self, path: str | Path) -> None:
        """Write the learner's state into checkpoint directory ``path``, sharded.

        :func:`sao_gym.learner.state.save_state`; every rank calls it.
        """
        learner_state.save_state(self, path)

    def load_state(self, path: str | Path) -> None:
        """Restore :meth:`save_state`'s state, written with any number of ranks.

        :func:`sao_gym.learner.state.load_state`; every rank calls it.
        """
        learner_state.load_state(self, path)


def build_learner(algorithm: str | Algorithm, policy_path: str,
                  config: LearnerConfig | None = None, *, critic_path: str | None = None,
                  total_steps: int | None = None, temperature: float = 1.0,
                  group_size: int = 1) -> Learner:
    """Load the policy (and the critic, for an algorithm with one) from ``policy_path``.

    Each model goes into the engine ``config.engine`` names
    (:data:`~sao_gym.learner.config.ENGINES`: a
    :class:`~sao_gym.learner.engine.LocalEngine` on ``config.device``, or FSDP2
    over the ranks of the process group, built on every rank). The critic
    starts from the policy checkpoint with a fresh head, or from a critic saved
    by :meth:`Learner.save_models` (``critic_path``). ``total_steps`` (the
    run's length in learner steps) is needed by a decaying ``lr_schedule``.
    ``temperature`` is the sampler's temperature (> 0): the learner scores
    tokens under ``softmax(logits / temperature)``.
    ``group_size``: rollouts per group of a grouped algorithm (GRPO).
    """
    from sao_gym.models import load_policy

    spec = find_algorithm(algorithm)
    _check_temperature(temperature)  # before loading any model
    config = config or LearnerConfig()
    torch.manual_seed(config.seed)
    engine, device = engine_builder(config.engine), rank_device(config.device)
    policy, tokenizer = load_policy(policy_path, device=device, dtype=config.dtype)
    critic = None
    if spec.critic:
        critic = engine(ValueModel.from_pretrained(
            critic_path or policy_path, freeze=config.critic_freeze,
            dtype=getattr(torch, config.dtype), device=device, seed=config.seed,
            num_layers=config.critic_layers), config, config.critic_lr or 5 * config.lr,
            lora=config.lora if config.lora is not None and config.lora.critic else None)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return Learner(spec, engine(policy, config, config.lr, lora=config.lora), critic, config,
                   pad_id=pad,
                   tokenizer=tokenizer, total_steps=total_steps, temperature=temperature,
                   group_size=group_size)
