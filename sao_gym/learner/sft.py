"""Supervised fine-tuning on demonstrations (the warm start before RL), with the learner's engine.

:func:`sft` trains a checkpoint on rollouts whose ``loss_mask`` 1 tokens are
the demonstrated actions: cross-entropy on those tokens only (optionally
label-smoothed), the model in a :class:`~sao_gym.learner.engine.LocalEngine`
(its AdamW, gradient clipping and non-finite guard), the learner's linear
warm-up schedule (:func:`~sao_gym.learner.schedule.warmup_scale`), and an
early stop on held-out demonstrations (:func:`holdout_success`, estimated
without playing). Demonstrations themselves are collected by
:mod:`sao_gym.runtime.prepare.demonstrations`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from sao_gym.learner.batching import micro_batches, token_logprobs
from sao_gym.learner.config import SFTSettings
from sao_gym.learner.engine import LocalEngine
from sao_gym.learner.schedule import warmup_scale
from sao_gym.types import Rollout

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SFTStep:
    """Metrics of one supervised step (passed to ``sft``'s callback)."""

    step: int
    """1-based step number."""
    loss: float
    """Mean cross-entropy per action token of the step's batch (before the update)."""
    token_accuracy: float
    """Share of the batch's action tokens that are the model's argmax (before the update)."""
    grad_norm: float
    """Gradient norm before clipping."""
    lr: float
    """Learning rate used for the step."""
    tokens: int
    """Tokens (prompt and observations included) in the batch."""
    elapsed_s: float
    """Seconds since ``sft`` started training."""
    holdout_success: float | None = None
    """The stopping estimate (``target_metric`` of :func:`holdout_success`) on the
    held-out demonstrations after this step (on check steps)."""
    holdout_greedy: float | None = None
    """:func:`holdout_success`'s greedy estimate after this step (on check steps)."""
    holdout_sampled: float | None = None
    """:func:`holdout_success`'s sampled estimate after this step (on check steps)."""
    reached: bool = False
    """The early stop's condition held after this step: training ends here."""


def _check_demonstrations(demonstrations: Sequence[Rollout]) -> list[Rollout]:
    demos = list(demonstrations)
    if not demos:
        raise ValueError("no demonstrations: sft needs at least one rollout")
    for i, r in enumerate(demos):
        if not isinstance(r, Rollout):
            raise TypeError(f"demonstration {i} is a {type(r).__name__}, not a Rollout")
        if not any(r.loss_mask):
            raise ValueError(f"demonstration {i} has no action tokens (loss_mask is all 0)")
    return demos


def _batch_loss(
    engine: Any, mbs: Sequence[Any], *, backward: bool, label_smoothing: float = 0.0
) -> tuple[float, float]:
    """Sum of action-token NLL and of argmax hits over micro-batches; backward optional.

    The loss of each micro-batch is divided by the action tokens of all of
    them, so accumulated gradients are those of the batch's token mean. With
    ``label_smoothing`` = e the gradient is that of ``(1 - e) * NLL + e *
    (mean over the vocabulary of -log p)``; the returned loss is the NLL.
    """
    n_tok = float(sum(mb.action_mask_BT.sum() for mb in mbs))
    total, hits = 0.0, 0.0
    for mb in map(engine.to_device, mbs):
        ids, mask = mb.input_ids_BT, mb.action_mask_BT
        with torch.set_grad_enabled(backward):
            logits = engine.forward(input_ids=ids, attention_mask=mb.attention_mask_BT).logits
            logp = token_logprobs(logits, ids)
            loss = -(logp * mask).sum() / n_tok
            if backward:
                objective = loss
                if label_smoothing:
                    uniform = -torch.log_softmax(logits[:, :-1].float(), -1).mean(-1)
                    smooth = (uniform * mask[:, 1:]).sum() / n_tok
                    objective = (1 - label_smoothing) * loss + label_smoothing * smooth
                engine.backward(objective)
        total += float(loss.detach())
        with torch.no_grad():
            pred = logits[:, :-1].argmax(-1)
            hits += float(((pred == ids[:, 1:]).float() * mask[:, 1:]).sum())
    return total, hits / n_tok


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """``model.eval()`` for the block, then back to the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def demonstration_loss(
    model: torch.nn.Module,
    demonstrations: Sequence[Rollout],
    *,
    pad_id: int = 0,
    max_tokens_per_microbatch: int = 8192,
) -> float:
    """Mean cross-entropy per action token of ``model`` on ``demonstrations``."""
    demos = _check_demonstrations(demonstrations)
    with _eval_mode(model):
        engine = LocalEngine(model, lr=1.0, device=next(model.parameters()).device)  # no step
        loss, _ = _batch_loss(engine, micro_batches(demos, max_tokens_per_microbatch, pad_id),
                              backward=False)
    return loss




def holdout_success(
    model: torch.nn.Module,
    demonstrations: Sequence[Rollout],
    *,
    pad_id: int = 0,
    max_tokens_per_microbatch: int = 8192,
) -> dict[str, float]:
    """Two success estimates over demonstrations, from one teacher-forced pass.

    - ``"sampled"``: the mean of ``exp(-sum of action-token NLL)`` per
      rollout, the chance that the policy, fed the same observations, samples
      exactly the demonstrated action tokens at temperature 1 (:func:`sequence_success`);
    - ``"greedy"``: the share of rollouts whose every action token is the
      policy's argmax, i.e. that greedy decoding reproduces.

    Over rewarded demonstrations of held-out tasks both estimate (from below:
    other token paths may also succeed) the success rate of played episodes,
    sampled and greedy, without playing any.
    """
    demos = _check_demonstrations(demonstrations)
    probs: list[float] = []
    greedy: list[float] = []
    device = next(model.parameters()).device
    with _eval_mode(model), torch.no_grad():
        for mb in micro_batches(demos, max_tokens_per_microbatch, pad_id):
            ids = mb.input_ids_BT.to(device)
            mask = mb.action_mask_BT.to(device)
            logits = model(input_ids=ids, attention_mask=mb.attention_mask_BT.to(device)).logits
            # float64: a long rollout's probability underflows float32 (exp(-88) = 0)
            probs += (token_logprobs(logits, ids) * mask).sum(-1).double().exp().tolist()
            hit = F.pad(logits[:, :-1].argmax(-1) == ids[:, 1:], (1, 0), value=True)
            greedy += (hit | (mask == 0)).all(-1).float().tolist()
    return {"sampled": sum(probs) / len(probs), "greedy": sum(greedy) / len(greedy)}


def sequence_success(
    model: torch.nn.Module,
    demonstrations: Sequence[Rollout],
    *,
    pad_id: int = 0,
    max_tokens_per_microbatch: int = 8192,
) -> float:
    """Mean probability that sampling at temperature 1 reproduces each demonstration.

    For each rollout, ``exp(-sum of action-token NLL)``: the chance that the
    policy, fed the same observations, samples exactly the demonstrated
    action tokens. Over rewarded demonstrations of held-out tasks this
    estimates (from below: other token paths may also succeed) the success
    rate of sampled episodes, without playing any. (``holdout_success(...)["sampled"]``.)
    """
    return holdout_success(model, demonstrations, pad_id=pad_id,
                           max_tokens_per_microbatch=max_tokens_per_microbatch)["sampled"]


SFT_STATE = "sft_state.pt"
"""The file of :func:`sft`'s training state in its ``state_dir``."""


def _save_state(path: Path, run: dict[str, Any], engine: LocalEngine, step: int,
                order: list[int], order_rng: random.Random, elapsed_s: float,
                stopped: bool) -> None:
    """Everything :func:`sft` needs to continue after ``step``, written atomically.

    ``stopped``: the early stop came at ``step``; nothing is left but saving.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"run": run, "step": step, "engine": engine.state_dict(), "order": list(order),
                "order_rng": order_rng.getstate(), "torch_rng": torch.get_rng_state(),
                "elapsed_s": elapsed_s, "stopped": stopped}, tmp)
    tmp.replace(path)


def _load_state(path: Path, run: dict[str, Any], engine: LocalEngine,
                order_rng: random.Random) -> tuple[int, float, list[int], bool]:
    """Restore :func:`_save_state`'s state; ``(its step, elapsed seconds, data order, stopped)``."""
    state = torch.load(path, map_location=engine.device, weights_only=False)
    if state["run"] != run:
        raise ValueError(f"{path} is the state of another fine-tuning run ({state['run']}, "
                         f"not {run}): delete it to start this one afresh")
    engine.load_state_dict(state["engine"])
    order_rng.setstate(state["order_rng"])
    torch.set_rng_state(state["torch_rng"])
    return state["step"], state["elapsed_s"], list(state["order"]), state["stopped"]


def sft(
    policy_path: str | Path,
    demonstrations: Sequence[Rollout],
    settings: SFTSettings,
    *,
    out_dir: str | Path,
    holdout: Sequence[Rollout] | None = None,
    callback: Callable[[SFTStep], None] | None = None,
    state_dir: str | Path | None = None,
) -> str:
    """Fine-tune ``policy_path`` on ``demonstrations`` as ``settings`` say; write ``out_dir``.

    Each of the ``settings.steps`` AdamW steps trains on ``batch_size``
    demonstrations (drawn without replacement, reshuffled every pass over the
    data) with the mean cross-entropy of their ``loss_mask`` 1 tokens; prompt
    and observation tokens are context only. Micro-batches of at most
    ``max_tokens_per_microbatch`` padded tokens accumulate gradients. The
    learning rate rises linearly over ``warmup_steps`` and then stays at
    ``lr``; gradients are clipped to ``max_grad_norm``
    (:class:`~sao_gym.learner.config.SFTSettings` has every field).

    Deterministic for a ``seed`` (data order and the torch RNG, which is
    restored afterwards) on a given machine and thread count. Progress goes
    to ``logging`` every ``log_every`` steps and, every step, to
    ``callback(SFTStep)``. The model and tokenizer are saved to ``out_dir``
    (an HF checkpoint any backend or :func:`~sao_gym.learner.learner.build_learner`
    loads); returns ``out_dir`` as a string. Raises ``ValueError`` for empty
    demonstrations, or a ``target_success`` without ``holdout``.

    Early stop: with ``holdout`` (demonstrations of tasks not trained on) and
    ``target_success``, every ``check_every`` steps :func:`holdout_success`
    of the holdout is measured (``SFTStep.holdout_sampled``/``holdout_greedy``)
    and training stops once its ``target_metric`` estimate (``"sampled"``: at
    temperature 1, ``"greedy"``) reaches the target, so ``steps`` is then a
    maximum. A greedy target stops once the skill is there for most tasks
    while sampling still errs: the headroom RL at temperature 1 can win;
    ``min_sampled`` also holds it until the sampled estimate reaches that
    floor, so that RL at temperature 1 sees enough successes to learn from. A warm
    start that should leave room for RL stops at a chosen level of skill
    rather than after a step count, which small models reach at very
    different times depending on their initialization.

    Resumable: with ``state_dir``, the whole training state (weights, AdamW
    moments, data order, RNG, step) is written there, atomically, every
    ``save_every_s`` seconds (0: after every step), and a call that finds one
    there continues from its step: the result equals an uninterrupted run's.
    The state stays when the call returns; the caller deletes it.
    """
    from sao_gym.models import load_policy

    if not isinstance(settings, SFTSettings):
        raise TypeError(f"settings must be an SFTSettings, got {type(settings).__name__}")
    s = settings
    demos = _check_demonstrations(demonstrations)
    target_success = s.target_success
    if target_success is not None:
        if not holdout:
            raise ValueError("target_success needs holdout demonstrations")
        holdout = _check_demonstrations(holdout)
    steps, batch_size, seed, lr = s.steps, s.batch_size, s.seed, s.lr
    max_tokens_per_microbatch, label_smoothing = s.max_tokens_per_microbatch, s.label_smoothing
    model, tokenizer = load_policy(policy_path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    order_rng = random.Random(seed)
    order: list[int] = []
    run = {"demonstrations": len(demos), "tokens": sum(len(d.token_ids) for d in demos),
           "seed": seed, "batch_size": batch_size, "lr": lr}
    """What a saved state must match to be continued."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model.train()
        engine = LocalEngine(model, lr=lr, weight_decay=s.weight_decay,
                             max_grad_norm=s.max_grad_norm,
                             device=next(model.parameters()).device)
        done, elapsed, last = 0, 0.0, steps
        if state_dir is not None and (Path(state_dir) / SFT_STATE).exists():
            done, elapsed, order, stopped = _load_state(Path(state_dir) / SFT_STATE, run,
                                                        engine, order_rng)
            last = done if stopped else steps
            logger.info("sft: resuming after step %d of %d from %s", done, steps, state_dir)
        start = time.perf_counter() - elapsed
        saved = time.monotonic()
        step = done
        for step in range(done + 1, last + 1):
            batch: list[Rollout] = []
            while len(batch) < min(batch_size, len(demos)):
                if not order:
                    order = list(range(len(demos)))
                    order_rng.shuffle(order)
                batch.append(demos[order.pop()])
            step_lr = lr * warmup_scale(step - 1, s.warmup_steps)
            engine.set_lr(step_lr)
            mbs = micro_batches(batch, max_tokens_per_microbatch, pad_id)
            loss, accuracy = _batch_loss(engine, mbs, backward=True,
                                         label_smoothing=label_smoothing)
            norm, _ = engine.step(finite=math.isfinite(loss))
            held, estimates = None, {}
            if target_success is not None and (step % s.check_every == 0 or step == steps):
                estimates = holdout_success(model, holdout, pad_id=pad_id,
                                            max_tokens_per_microbatch=max_tokens_per_microbatch)
                held = estimates[s.target_metric]
            reached = held is not None and held >= target_success and (
                s.min_sampled is None or estimates["sampled"] >= s.min_sampled)
            if state_dir is not None and (reached or time.monotonic() - saved >= s.save_every_s):
                _save_state(Path(state_dir) / SFT_STATE, run, engine, step, order, order_rng,
                            time.perf_counter() - start, reached)
                saved = time.monotonic()
            record = SFTStep(step, loss, accuracy, norm, step_lr,
                             sum(mb.num_tokens for mb in mbs), time.perf_counter() - start, held,
                             estimates.get("greedy"), estimates.get("sampled"), reached)
            if callback is not None:
                callback(record)
            if s.log_every and (step % s.log_every == 0 or step == steps):
                logger.info("sft step %d/%d: loss %.4f, token accuracy %.3f, grad norm %.2f "
                            "(%.1f s)", step, steps, loss, accuracy, norm, record.elapsed_s)
            if reached:
                logger.info("sft: held-out %s success %.3f reached the target %.3f at step %d",
                            s.target_metric, held, target_success, step)
                break
    model.eval()
    out = Path(out_dir)
    saving = out.with_name(out.name + ".saving")  # whole or absent: a crash leaves no half
    shutil.rmtree(saving, ignore_errors=True)
    model.save_pretrained(str(saving))
    tokenizer.save_pretrained(str(saving))
    shutil.rmtree(out, ignore_errors=True)
    saving.rename(out)
    logger.info("sft: %d steps on %d demonstrations -> %s", step, len(demos), out)
    return str(out)


__all__ = ["SFTSettings", "SFTStep", "demonstration_loss", "holdout_success",
           "sequence_success", "sft"]
