"""The run's starting checkpoint, from a :class:`~sao_gym.runtime.plans.PreparePlan`.

:func:`prepare` fits a new run to its environment:

1. demonstrations: the env's registered oracle plays them
   (``sao_gym.register(..., oracle=...)``), or a file of conversations is
   replayed (:class:`~sao_gym.runtime.prepare.demonstrations.Demonstrations`);
   without either the run starts from the raw model and says so;
2. the model (:mod:`sao_gym.runtime.prepare.model`): ``tiny`` is built with a
   tokenizer that also learned the env's text, ``smollm2`` converted once, or
   a path taken as it is;
3. null token budgets and label smoothing are fitted to the demonstrations
   (:mod:`sao_gym.runtime.prepare.fit`): a :class:`~sao_gym.runtime.plans.Budgets`
   record, handed to ``save`` before anything long starts;
4. the supervised warm start (:func:`warm_start`, :func:`~sao_gym.learner.sft.sft`
   with the plan's settings), resumable: its inputs and its training state are
   kept under ``RUN_DIR/model/`` until it finishes.

:func:`resume` is the same for ``--resume``: the finished warm start's
checkpoint, an interrupted one continued, or one that never began prepared again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pickle
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sao_gym.learner.config import SFTSettings
from sao_gym.runtime.plans import Budgets, PreparePlan
from sao_gym.runtime.prepare.demonstrations import Demonstrations
from sao_gym.runtime.prepare.model import COLLECT_NEW_TOKENS, base_policy, env_corpus, needs_corpus

logger = logging.getLogger(__name__)

WARM_STATE = "warm_start.partial"
"""``RUN_DIR/model/<this>``: an unfinished warm start, what ``--resume`` continues: its
demonstrations (:data:`DEMONSTRATIONS`) and :func:`~sao_gym.learner.sft.sft`'s state."""

DEMONSTRATIONS = "demonstrations.pkl"

WARM_START = "warm_start"
"""``RUN_DIR/model/<this>``: the finished warm start's checkpoint."""

WARM_RECORD = "warm_start.json"
"""``RUN_DIR/model/warm_start/<this>``: how the warm start ended (:func:`warm_start`)."""

PROGRESS = "progress.json"
"""``RUN_DIR/model/<WARM_STATE>/<this>``: the last held-out check of an unfinished warm start."""


@dataclass(frozen=True)
class Start:
    """Where a run starts: its checkpoint and its (fitted) budgets."""

    policy: str
    """The starting checkpoint (after any warm start)."""
    budgets: Budgets
    """Every budget set (:attr:`Budgets.complete`)."""


def prepare(plan: PreparePlan, run_dir: str | Path, *,
            save: Callable[[Budgets], None] = lambda budgets: None,
            say: Callable[[str], None] = logger.info) -> Start:
    """Fit a new run to its env and warm-start it (module docs); its :class:`Start`.

    ``save(budgets)`` is called once the budgets are fitted, before the warm
    start (the job writes the run's config there, so ``--resume`` finds it).
    """
    from transformers import AutoConfig, AutoTokenizer

    from sao_gym.runtime.prepare.fit import fit_budgets, fit_label_smoothing

    run_dir = Path(run_dir)
    demos = Demonstrations(plan.demonstrations) if plan.demonstrations is not None else None
    say(f"demonstrations: {demos.what}" if demos is not None else plan.no_warm_start)
    corpus = (env_corpus(plan.model, plan.env, plan.seed, demos)
              if needs_corpus(plan.model, run_dir) else [])
    policy = base_policy(plan.model, run_dir, corpus)
    tokenizer = AutoTokenizer.from_pretrained(policy)
    positions = getattr(AutoConfig.from_pretrained(policy), "max_position_embeddings", None)
    budgets = plan.budgets
    train_demos: list[Any] = []
    holdout: list[Any] = []
    if demos is not None:
        started = time.monotonic()
        train_demos, holdout = demos.collect(tokenizer, budgets={
            "max_new_tokens": budgets.max_new_tokens or COLLECT_NEW_TOKENS,
            "max_context_tokens": budgets.max_context_tokens or positions})
        rewards = [d.reward for d in train_demos]
        say(f"collected {len(train_demos)} demonstrations (+{len(holdout)} held out), mean "
            f"reward {sum(rewards) / len(rewards):.2f} ({time.monotonic() - started:.0f} s)")
    budgets, lines = fit_budgets(budgets, train_demos + holdout, turn_limit=plan.turn_limit,
                                 model_positions=positions)
    budgets, more = fit_label_smoothing(budgets, train_demos)
    for line in lines + more:
        say(line)
    save(budgets)
    if demos is not None and plan.sft is not None:
        rewarded = [d for d in holdout if d.reward > 0]
        _keep_demonstrations(run_dir, train_demos, rewarded)
        settings = dataclasses.replace(plan.sft, label_smoothing=budgets.label_smoothing)
        policy = warm_start(settings, policy, run_dir, train_demos, rewarded, say=say)
    return Start(policy, budgets)


def resume(plan: PreparePlan, run_dir: str | Path, *, has_checkpoint: bool,
           save: Callable[[Budgets], None] = lambda budgets: None,
           say: Callable[[str], None] = logger.info) -> Start:
    """A resumed run's :class:`Start` (its plan is the saved config's: budgets fitted).

    The finished warm start's checkpoint; an interrupted warm start is
    continued first (from its saved state, on its kept demonstrations), and
    one that never began (no checkpoint of RL either: ``has_checkpoint``) is
    prepared again. Without a warm start, the base model.
    """
    run_dir = Path(run_dir)
    warm = run_dir / "model" / WARM_START
    if (warm / "config.json").exists():
        return Start(str(warm), plan.budgets)
    kept = run_dir / "model" / WARM_STATE / DEMONSTRATIONS
    if kept.exists() and plan.sft is not None:
        inputs = pickle.loads(kept.read_bytes())
        say("the warm start was interrupted: continuing it")
        return Start(warm_start(plan.sft, base_policy(plan.model, run_dir), run_dir,
                                inputs["demos"], inputs["holdout"], say=say), plan.budgets)
    if plan.demonstrations is not None and plan.sft is not None and not has_checkpoint:
        say("the run stopped before its warm start began: preparing it again")
        return prepare(plan, run_dir, save=save, say=say)
    return Start(base_policy(plan.model, run_dir), plan.budgets)


def _keep_demonstrations(run_dir: Path, demos: list[Any], holdout: list[Any]) -> None:
    """The warm start's inputs, so that an interrupted one continues on the same data."""
    state = run_dir / "model" / WARM_STATE
    state.mkdir(parents=True, exist_ok=True)
    tmp = state / (DEMONSTRATIONS + ".tmp")
    tmp.write_bytes(pickle.dumps({"demos": demos, "holdout": holdout}))
    tmp.replace(state / DEMONSTRATIONS)


def warm_start(settings: SFTSettings, base: str, run_dir: str | Path, demos: list[Any],
               holdout: list[Any], *, say: Callable[[str], None] = logger.info) -> str:
    """Supervised warm start of ``base`` on ``demos``; returns the new checkpoint.

    With ``settings.target_success`` it stops once the held-out estimate
    (``holdout``: rewarded demonstrations of other tasks; without any, every
    step runs) reaches it. Its state is kept in ``RUN_DIR/model/`` (:data:`WARM_STATE`)
    until it finishes, so an interrupted one continues. Progress (loss, token
    accuracy) goes to ``say`` every tenth of the steps.
    """
    from sao_gym.learner.sft import SFTStep, sft

    out = Path(run_dir) / "model" / WARM_START
    state = Path(run_dir) / "model" / WARM_STATE
    if (out / "config.json").exists():
        shutil.rmtree(state, ignore_errors=True)
        return str(out)
    if not holdout:
        settings = dataclasses.replace(settings, target_success=None)
    steps, target = settings.steps, settings.target_success
    every = max(1, steps // 10)
    say(f"warm start: at most {steps} supervised steps on {len(demos)} demonstrations")
    progress = state / PROGRESS  # the record's inputs, for a warm start resumed at its end
    seen: dict[str, Any] = ({k: SFTStep(**v) for k, v in json.loads(progress.read_text()).items()}
                            if progress.exists() else {})

    def report(s: SFTStep) -> None:
        seen["last"] = s
        if s.holdout_success is not None:
            seen["checked"] = s
            state.mkdir(parents=True, exist_ok=True)
            tmp = progress.with_name(progress.name + ".tmp")
            tmp.write_text(json.dumps({k: dataclasses.asdict(v) for k, v in seen.items()}))
            tmp.replace(progress)
        if s.step % every == 0 or s.step == steps or s.reached:
            held = ("" if s.holdout_success is None
                    else f", held-out success {s.holdout_sampled:.3f} sampled / "
                         f"{s.holdout_greedy:.3f} greedy")
            say(f"warm start step {s.step}/{steps}: loss {s.loss:.3f}, "
                f"token accuracy {s.token_accuracy:.3f}{held} ({s.elapsed_s:.0f} s)")
        if s.reached:
            floor = ("" if settings.min_sampled is None
                     else f" and sampled success the floor {settings.min_sampled}")
            say(f"warm start stopped: held-out {settings.target_metric} success reached the "
                f"target {target}{floor}")
        elif s.step == steps and s.holdout_success is not None:
            say(f"warm start: the held-out target was not reached in {steps} steps; "
                "RL starts from this checkpoint (raise warm_start.steps, or lower "
                "warm_start.target_success)")

    path = sft(base, demos, settings, out_dir=out, holdout=holdout or None, callback=report,
               state_dir=state)
    _write_record(out, settings, seen, len(demos), len(holdout))
    shutil.rmtree(state, ignore_errors=True)
    return path


def _write_record(out: Path, settings: SFTSettings, seen: dict[str, Any], demos: int,
                  holdout: int) -> None:
    """:data:`WARM_RECORD`: where the warm start stopped and why, what made it.

    Nothing in it depends on the clock, so two warm starts of the same recipe,
    env and seed on the same machine have the same record (and weights).
    """
    from importlib.metadata import version

    last, checked = seen.get("last"), seen.get("checked")
    record = {
        "stopped_at_step": None if last is None else last.step,
        "max_steps": settings.steps,
        "reached_target": bool(last is not None and last.reached),
        "target": {"metric": settings.target_metric, "success": settings.target_success,
                   "min_sampled": settings.min_sampled},
        "last_check": None if checked is None else {
            "step": checked.step, "sampled": checked.holdout_sampled,
            "greedy": checked.holdout_greedy},
        "demonstrations": demos, "holdout_demonstrations": holdout,
        "settings": dataclasses.asdict(settings),
        "versions": {name: version(name) for name in ("sao-gym", "torch", "transformers",
                                                      "tokenizers")},
    }
    tmp = out / (WARM_RECORD + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(out / WARM_RECORD)


__all__ = ["DEMONSTRATIONS", "WARM_RECORD", "WARM_STATE", "WARM_START", "Start", "prepare",
           "resume", "warm_start"]
